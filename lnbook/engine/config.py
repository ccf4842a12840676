"""What every experiment's config shares: :class:`RunConfig` (the scale, the seeds, the updates,
the CPU threads and the worker processes, one name each), the two scales (``quick``: a laptop
CPU, what the book shows; ``paper``: the paper's sizes) and :func:`make_config`, which builds a
config from a preset."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lnbook.checks import check_choice

__all__ = ["SCALES", "RunConfig", "check_scale", "make_config"]

SCALES: tuple[str, ...] = ("quick", "paper")


def check_scale(scale: str) -> str:
    """Return ``scale`` if it is ``"quick"`` or ``"paper"``, else raise ``ValueError``."""
    return check_choice("scale", scale, SCALES)


@dataclass
class RunConfig:
    """The base of every experiment's ``Config``: the fields the engine reads.

    Attributes:
        scale: ``"quick"`` or ``"paper"`` (:data:`SCALES`).
        seeds: an int ``n``, the first ``n`` seeds of the seed set in force when the run starts
            (:func:`lnbook.engine.runner.resolve_seeds`), or the seeds themselves.
        steps: parameter updates per run.
        threads: torch CPU threads while training (None: leave them as they are).
        workers: jobs trained at once on a CPU, one process each (the same results).

    An experiment's ``Config`` subclasses it, adds its own fields (``batch_size``,
    ``eval_every``, ``lr``, ... with one name per idea across the experiments), sets its own
    defaults and calls ``super().__post_init__()`` first in its own check.
    """

    scale: str = "quick"
    seeds: int | tuple[int, ...] = 5
    steps: int = 100
    threads: int | None = 1
    workers: int = 1

    def __post_init__(self) -> None:
        check_scale(self.scale)
        bad = {"steps": self.steps, "workers": self.workers}
        if self.threads is not None:
            bad["threads"] = self.threads
        for name, value in bad.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        seeds = self.seeds
        if isinstance(seeds, bool) or not isinstance(seeds, int | Sequence) or isinstance(
                seeds, str | bytes) or (isinstance(seeds, int) and seeds < 1):
            raise ValueError(f"seeds must be an int >= 1 (how many seeds of the seed set) or "
                             f"a tuple of ints, got {seeds!r}")


def make_config(config_cls: type, presets: Mapping[str, Mapping[str, Any]], scale: str,
                overrides: Mapping[str, Any]) -> Any:
    """``config_cls`` from the ``scale`` preset with ``overrides``; ``ValueError`` naming the
    valid scales or fields."""
    check_scale(scale)
    names = {f.name for f in dataclasses.fields(config_cls)} - {"scale"}
    unknown = set(overrides) - names
    if unknown:
        raise ValueError(f"unknown Config fields {sorted(unknown)}; known: {sorted(names)}")
    return config_cls(scale=scale, **{**presets[scale], **overrides})
