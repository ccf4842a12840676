"""What a sweep keeps in its ``out`` folder, and the rules that never lose a finished run.

    out/<name>.json                         the Results of the whole sweep
    out/runs/<variant>-seed<S>.json         each finished run, with its config and its digest
    out/checkpoints/<name>-<variant>-seed<S>-<digest>.pt   a run in progress (paper scale)

The digest hashes the config without :data:`CONTINUES`. A finished run is reused under the
same config, continued when only those fields changed, and otherwise kept: the sweep refuses
to start (:class:`OutConflict`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from lnbook.engine.results import Run, read_json, save_results
from lnbook.engine.train import UnreadableFile

__all__ = ["CONTINUES", "OutConflict", "config_digest", "load_finished", "save_run"]

# Config fields whose change continues a run from its checkpoint instead of starting another:
# train longer, evaluate or checkpoint at other times, use more processes or threads.
CONTINUES = ("steps", "eval_every", "checkpoint", "threads", "workers")


class OutConflict(FileExistsError):
    """The ``out`` folder holds finished runs of another config: they are kept, and nothing
    trains. The message names the files and says what to do (another folder)."""

    def __init__(self, files: list[Path], folder: Path) -> None:
        self.files, self.folder = files, folder
        shown = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        super().__init__(
            f"{folder} holds finished results of another config ({len(files)} files: {shown}); "
            f"they are kept and nothing was trained: write to another folder (--out), or move "
            f"those files away to train them again")

    def __reduce__(self) -> tuple[type, tuple[list[Path], Path]]:
        return type(self), (self.files, self.folder)


def config_digest(cfg: Any) -> str:
    """8 hex digits naming ``cfg`` (a dict from the config) without :data:`CONTINUES`."""
    kept = {k: v for k, v in cfg.items() if k not in CONTINUES} if isinstance(cfg, dict) else cfg
    return hashlib.sha1(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:8]


def file_stem(variant: str, seed: int) -> str:
    """``variant`` and ``seed`` as a file name (``layer/bs4`` -> ``layer_bs4-seed0``)."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', variant)}-seed{seed}"


def run_file(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / f"{file_stem(variant, seed)}.json"


def checkpoint_file(out: Path, name: str, variant: str, seed: int, cfg: Any) -> Path:
    """The checkpoint of one run, named after the config it was trained under, so that a run
    of another config never resumes it."""
    return out / "checkpoints" / f"{name}-{file_stem(variant, seed)}-{config_digest(cfg)}.pt"


def save_run(run: Run, cfg: Any, path: Path) -> Path:
    """Keep a finished run on disk with its config and the config's digest."""
    return save_results({"config": cfg, "digest": config_digest(cfg), "run": run}, path)


_REMEDY = "move it away (or delete it) to train that run again"


def _saved_config(path: Path, remedy: str) -> tuple[Any, str]:
    saved = read_json(path, remedy)
    if not isinstance(saved, dict) or "config" not in saved:
        raise UnreadableFile(path, "not a file lnbook wrote (no config)", remedy)
    return saved, str(saved.get("digest") or config_digest(saved["config"]))


def load_finished(out: Path, variant: str, seed: int, cfg: Any) -> Run | None:
    """The finished run of (variant, seed) in ``out`` if it was trained under ``cfg``; None
    when there is none, or when only :data:`CONTINUES` fields changed and it is to be trained
    longer.

    Raises:
        OutConflict: the run on disk is of another config (it is never overwritten).
        UnreadableFile: the run file is truncated or not lnbook's.
    """
    path = run_file(out, variant, seed)
    if not path.exists():
        return None
    saved, digest = _saved_config(path, _REMEDY)
    old = saved["config"]
    a, b = (c.get("steps") if isinstance(c, dict) else None for c in (cfg, old))
    shorter = isinstance(a, int | float) and isinstance(b, int | float) and a < b
    if digest != config_digest(cfg) or shorter:  # another config, or fewer steps than done
        raise OutConflict([path], out)

    def what(c: Any) -> Any:  # the results do not depend on workers
        return {k: v for k, v in c.items() if k != "workers"} if isinstance(c, dict) else c

    if what(old) != what(cfg):
        return None  # the same experiment, trained longer (or evaluated otherwise): go on
    try:
        return Run.from_dict(saved["run"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UnreadableFile(path, f"no complete run in it ({exc!r})", _REMEDY) from exc


def check_results_file(path: Path, cfg: Any) -> None:
    """Refuse (:class:`OutConflict`) to overwrite the results of a sweep of another config."""
    if path.exists():
        _, digest = _saved_config(path, "move it away (or delete it): it is written again "
                                        "from the runs")
        if digest != config_digest(cfg):
            raise OutConflict([path], path.parent)
