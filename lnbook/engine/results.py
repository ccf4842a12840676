"""What a sweep produced, in one layout for every experiment (:class:`Run`, :class:`Results`);
:func:`save_results` and :func:`load_results` keep it as strict JSON (inf, NaN: null)."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lnbook.engine.metrics import _pick, updates_to_reach
from lnbook.engine.train import History, UnreadableFile, write_atomically
from lnbook.table import Table

__all__ = ["Results", "Run", "jsonable", "load_results", "read_json", "save_results",
           "write_atomically"]



def jsonable(obj: Any) -> Any:
    """Plain JSON types; non-finite floats become None (strict JSON has no NaN)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict())
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "tolist"):  # numpy or torch array / scalar
        return jsonable(obj.tolist())
    raise TypeError(f"cannot save a {type(obj).__name__} as JSON: {obj!r}")


def save_results(results: Any, path: str | os.PathLike) -> Path:
    """Write ``results`` (a :class:`Results` or a dict) as JSON, atomically; returns the path
    (:class:`CannotWrite` if the disk refuses it, with no ``.tmp`` left)."""
    text = json.dumps(jsonable(results), indent=1, allow_nan=False)
    return write_atomically(path, lambda tmp: tmp.write_text(text))


def read_json(path: str | os.PathLike, remedy: str) -> Any:
    """The JSON in ``path``; a file that is not JSON raises
    :class:`~lnbook.engine.train.UnreadableFile` naming it, what is wrong and ``remedy``."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UnreadableFile(path, f"{type(exc).__name__}: {exc}", remedy) from exc


def load_results(path: str | os.PathLike) -> Results:
    """Read a :class:`Results` written by :func:`save_results` (:class:`UnreadableFile` if not).

    ``out/<name>.json`` that does not exist names the results of experiment ``name`` in
    ``out`` (``out/<name>-<digest>.json``, one per config): the one there, or
    :class:`UnreadableFile` listing them when several configs were run."""
    path = Path(path)
    if not path.exists() and path.suffix == ".json":
        found = sorted(path.parent.glob(f"{glob.escape(path.stem)}-" + "[0-9a-f]" * 8 + ".json"))
        if len(found) > 1:
            raise UnreadableFile(path, f"{len(found)} configs of {path.stem} were run into "
                                 f"{path.parent} ({', '.join(f.name for f in found)})",
                                 "name one of those files")
        path = found[0] if found else path
    d = read_json(path, "write the results again (run the sweep into the same folder)")
    try:
        return Results.from_dict(d)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnreadableFile(Path(path), f"not a results file ({exc!r})",
                             "write the results again") from exc


@dataclass
class Run:
    """One trained (variant, seed) pair: its :class:`~lnbook.engine.train.History` and ``info``
    (anything else the experiment measured on it, JSON types)."""

    variant: str
    seed: int
    history: History
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Run:
        return cls(str(d["variant"]), int(d["seed"]), History.from_dict(d["history"]),
                   dict(d.get("info", {})))


@dataclass
class Results:
    """What a sweep produced: ``name``, ``config`` (a dict), ``device``, ``runs`` (one
    :class:`Run` per (variant, seed), in training order) and ``info`` about the sweep."""

    name: str
    config: dict[str, Any]
    device: str
    runs: list[Run]
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Results:
        return cls(d["name"], dict(d["config"]), d["device"],
                   [Run.from_dict(r) for r in d["runs"]], dict(d.get("info", {})))

    # -- selection

    @property
    def variants(self) -> list[str]:
        """Variant names in the order they were trained."""
        return list(dict.fromkeys(r.variant for r in self.runs))

    @property
    def seeds(self) -> list[int]:
        """Seeds in the order they were trained."""
        return list(dict.fromkeys(r.seed for r in self.runs))

    def select(self, variant: str) -> list[Run]:
        """The runs of ``variant``, one per seed, in seed order."""
        runs = [r for r in self.runs if r.variant == variant]
        if not runs:
            raise KeyError(f"no runs of variant {variant!r}; variants: {self.variants}")
        return runs

    def curves(self, variant: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """One metric over training, every seed: ``(steps (E,), values (seeds, E))``; ``metric``
        is a key of the evaluation's dicts (at ``eval_steps``) or ``"loss"`` (every update)."""
        runs = self.select(variant)
        h = runs[0].history
        if metric == "loss":
            steps, rows = np.array(h.steps), [r.history.losses for r in runs]
        else:
            if not h.metrics or metric not in h.metrics[0]:
                known = sorted(h.metrics[0]) if h.metrics else []
                raise KeyError(f"no metric {metric!r} in {variant!r}; recorded: {known}")
            steps, rows = np.array(h.eval_steps), [r.history.metric(metric) for r in runs]
        if len({len(r) for r in rows}) != 1:
            raise ValueError(f"the seeds of {variant!r} recorded {metric!r} a different number "
                             "of times; compare them run by run")
        return steps, np.array(rows, dtype=float)

    def updates_to(self, variant: str, metric: str, target: float | Sequence[float],
                   mode: str = "min") -> np.ndarray:
        """Per seed, the updates at which ``metric`` reached ``target`` (one, or one per seed),
        interpolated between evaluations; ``inf`` where it never did
        (:func:`~lnbook.engine.metrics.updates_to_reach`): ``(seeds,)``."""
        return updates_to_reach(*self.curves(variant, metric), target, mode)

    def final(self, variant: str, metric: str) -> np.ndarray:
        """The last recorded value of ``metric``, per seed: ``(seeds,)``."""
        return np.array([r.history.metric(metric)[-1] for r in self.select(variant)])

    def best(self, variant: str, metric: str, mode: str = "min") -> np.ndarray:
        """The best value of ``metric`` over training, per seed (``mode`` "min" or "max")."""
        pick = _pick(mode)
        return np.array([pick(r.history.metric(metric)) for r in self.select(variant)])

    def info_of(self, variant: str, key: str) -> list[Any]:
        """``run.info[key]`` of every seed of ``variant``."""
        return [r.info[key] for r in self.select(variant)]

    def table(self, metrics: Sequence[str], stat: str = "final", fmt: str = ".3f",
              variants: Sequence[str] | None = None) -> Table:
        """A small table: one row per variant, one column per metric, values per seed;
        ``stat`` is ``"final"``, ``"min"`` or ``"max"`` (the best over training)."""
        rows = []
        for v in variants or self.variants:
            cells = []
            for m in metrics:
                vals = self.final(v, m) if stat == "final" else self.best(v, m, stat)
                cells.append(" / ".join(format(x, fmt) for x in vals))
            rows.append([v, *cells])
        seeds = ", ".join(str(s) for s in self.seeds)
        return Table(["variant", *(f"{m} ({stat})" for m in metrics)], rows,
                     caption=f"one value per seed ({seeds})")
