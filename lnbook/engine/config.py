"""What every experiment's config shares: :class:`RunConfig` (the scale, the seeds, the updates,
the CPU threads and the worker processes, one name each), the two scales (``quick``: a laptop
CPU, what the book shows; ``paper``: the paper's sizes) and :func:`make_config`, which builds a
config from a preset."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lnbook.checks import check_choice, check_size

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
        check_size("steps", self.steps)
        check_size("workers", self.workers)
        if self.threads is not None:
            check_size("threads", self.threads)
        seeds = self.seeds
        if isinstance(seeds, bool) or not isinstance(seeds, int | Sequence) or isinstance(
                seeds, str | bytes):
            raise TypeError(f"seeds must be an int (how many seeds of the seed set) or a "
                            f"tuple of ints, got {seeds!r} ({type(seeds).__name__})")
        if isinstance(seeds, int):
            check_size("seeds", seeds)

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
