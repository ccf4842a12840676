"""What a sweep keeps in its ``out`` folder, and the rules that never lose a finished run::

    out/<name>-<digest>.json                         the Results of the whole sweep
    out/runs/<name>-<digest>/<variant>-seed<S>.json  each finished run, with its config
    out/checkpoints/<name>-<digest>/<job>.pt         a job in progress (``<variant>-seed<S>``
                                                     for one run, ``<variant>-seeds`` or
                                                     ``all`` for a stack)

Every file names its experiment and the digest of its config (the config as trained, seeds
included, without :data:`CONTINUES`), so several experiments, and several configs of one,
share one ``out``. A finished run is reused under the same config and continued when only
:data:`CONTINUES` fields changed; a run asked with fewer updates than one on disk is refused
(:class:`OutConflict`), never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from lnbook.engine.results import Results, Run, read_json, save_results
from lnbook.engine.train import UnreadableFile

__all__ = ["CONTINUES", "OutConflict", "config_digest", "load_finished", "results_file",
           "save_run", "save_sweep"]

# Config fields whose change continues a run from its checkpoint instead of starting another:
# train longer, evaluate or checkpoint at other times, use more processes or threads.
CONTINUES = ("steps", "eval_every", "checkpoint", "threads", "workers")


class OutConflict(FileExistsError):
    """The ``out`` folder holds finished runs that this sweep would overwrite (trained for more
    updates than asked, or of another config under the same name): they are kept, and nothing
    trains. The message names the files and says what to do (another folder)."""

    def __init__(self, files: list[Path], folder: Path) -> None:
        self.files, self.folder = files, folder
        shown = ", ".join(str(f) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        super().__init__(
            f"{folder} holds finished results of another config (more updates, or other "
            f"settings; {len(files)} files: {shown}); they are kept and nothing was trained: "
            f"write to another folder (--out), or move those files away to train them again")

    def __reduce__(self) -> tuple[type, tuple[list[Path], Path]]:
        return type(self), (self.files, self.folder)


def config_digest(cfg: Any) -> str:
    """8 hex digits naming ``cfg`` (a dict from the config) without :data:`CONTINUES`."""
    kept = {k: v for k, v in cfg.items() if k not in CONTINUES} if isinstance(cfg, dict) else cfg
    return hashlib.sha1(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:8]


def file_stem(variant: str, seed: int) -> str:
    """``variant`` and ``seed`` as a file name (``layer/bs4`` -> ``layer_bs4-seed0``)."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', variant)}-seed{seed}"


def sweep_stem(name: str, cfg: Any) -> str:
    """``<name>-<digest>``: what every file of a sweep is named after."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{config_digest(cfg)}"


def results_file(out: str | Path, name: str, cfg: Any) -> Path:
    """Where the results of experiment ``name`` under ``cfg`` (a dict) go in ``out``."""
    return Path(out) / f"{sweep_stem(name, cfg)}.json"


def save_sweep(results: Results, out: str | Path) -> Path:
    """Write ``results`` to its file in ``out`` (:func:`results_file`), atomically; returns
    the path. An experiment that adds to ``results.info`` after :func:`~.runner.sweep` saves
    again through this."""
    return save_results(results, results_file(out, results.name, results.config))


def run_file(out: Path, name: str, variant: str, seed: int, cfg: Any) -> Path:
    return out / "runs" / sweep_stem(name, cfg) / f"{file_stem(variant, seed)}.json"


def checkpoint_file(out: Path, name: str, cfg: Any, variants: list[str],
                    seeds: tuple[int, ...]) -> Path:
    """The checkpoint of one job, named after its experiment and config (a run of another
    config never resumes it) and after what it trains: ``<variant>-seed<S>`` (one run),
    ``<variant>-seeds`` (the seeds of a variant as one model) or ``all``."""
    if len(variants) > 1:
        job = "all"
    elif len(seeds) > 1:
        job = f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', variants[0])}-seeds"
    else:
        job = file_stem(variants[0], seeds[0])
    return out / "checkpoints" / sweep_stem(name, cfg) / f"{job}.pt"


def save_run(run: Run, cfg: Any, path: Path) -> Path:
    """Keep a finished run on disk with its config and the config's digest."""
    return save_results({"config": cfg, "digest": config_digest(cfg), "run": run}, path)


_REMEDY = "move it away (or delete it) to train that run again"


def _saved_config(path: Path, remedy: str) -> tuple[Any, str]:
    saved = read_json(path, remedy)
    if not isinstance(saved, dict) or "config" not in saved:
        raise UnreadableFile(path, "not a file lnbook wrote (no config)", remedy)
    return saved, str(saved.get("digest") or config_digest(saved["config"]))


def load_finished(out: Path, name: str, variant: str, seed: int, cfg: Any) -> Run | None:
    """The finished run of (variant, seed) in ``out`` if it was trained under ``cfg``; None
    when there is none, or when only :data:`CONTINUES` fields changed and it is to be trained
    longer.

    Raises:
        OutConflict: the run on disk is of another config (it is never overwritten).
        UnreadableFile: the run file is truncated or not lnbook's.
    """
    path = run_file(out, name, variant, seed, cfg)
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
