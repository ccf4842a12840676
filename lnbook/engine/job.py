"""One run of a sweep: the :class:`Job` handed to an experiment, how it trains, what Ctrl-C
leaves of it (:class:`SweepInterrupted`), and :func:`cpu_threads`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lnbook.engine.results import Run
from lnbook.engine.store import save_run
from lnbook.engine.train import UnreadableFile, capped, load_checkpoint, max_updates

__all__ = ["Job", "SweepInterrupted", "cpu_threads"]


@dataclass
class Job:
    """One unit of a sweep handed to the experiment's train function: every variant of
    ``variants`` (name -> parameters, in order) with every seed of ``seeds``. A job of one
    variant and one seed is one run (``job.variant``, ``job.params``, ``job.seed``); a stacked
    job trains several as one model and returns one result per ``job.pairs`` entry. Pass
    ``bar``, ``label`` and ``checkpoint`` on to :func:`lnbook.fit` (or the copies' loop).
    ``max_updates`` is the cap of a smoke run, in force while the job trains (a worker process
    gets it with the job): loops read it through :func:`lnbook.engine.train.max_updates`."""

    variants: dict[str, Any]
    seeds: tuple[int, ...]
    device: torch.device
    checkpoint: Path | None
    bar: Any
    label: str
    max_updates: int | None = None  # the smoke run's cap (:func:`~.train.capped`), if any

    @property
    def pairs(self) -> list[tuple[str, int]]:
        """``(variant, seed)`` of each run this job trains, in the order of its results."""
        return [(v, s) for v in self.variants for s in self.seeds]

    def _only(self, what: str, values: Any) -> Any:
        if len(values) != 1:
            raise AttributeError(f"job.{what}: this job trains {len(self.variants)} variants "
                                 f"x {len(self.seeds)} seeds (read job.variants, job.seeds)")
        return next(iter(values))

    @property
    def variant(self) -> str:
        """The variant of a job of one variant."""
        return self._only("variant", self.variants)

    @property
    def params(self) -> Any:
        """The parameters of a job of one variant."""
        return self._only("params", list(self.variants.values()))

    @property
    def seed(self) -> int:
        """The seed of a job of one seed."""
        return self._only("seed", self.seeds)

    @classmethod
    def one(cls, variant: str, params: Any, seed: int, device: torch.device | str = "cpu",
            checkpoint: Path | None = None, bar: Any = None) -> Job:
        """The job of one run (for tests, and for training one run by hand)."""
        return cls({variant: params}, (int(seed),), torch.device(device), checkpoint, bar,
                   label(variant, seed))


def label(variant: str, seed: int) -> str:
    return f"{variant} seed {seed}"


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: ``finished`` run labels, ``saved`` ``(label, step, steps)``
    checkpoints, the ``out`` folder (or None), and the sweep's ``progress`` ``(done, total)``."""

    def __init__(self, finished: list[str], saved: list[tuple[str, int, int]],
                 out: Path | None, progress: tuple[int, int | None] | None = None) -> None:
        self.finished, self.saved, self.out, self.progress = finished, saved, out, progress
        super().__init__(self.describe())

    def describe(self) -> str:
        where = ""
        if self.progress is not None:
            done, total = self.progress
            of = f" of {total:,}" if total else ""
            where = f" at update {done:,}{of} of the sweep (the progress bar's count)"
        if self.out is None:
            return (f"interrupted{where}; nothing was saved (run with an output folder to "
                    "resume)")
        lines = [f"interrupted{where}; saved under {self.out}:"]
        lines += [f"  {name}: finished" for name in self.finished]
        lines += [f"  {name}: checkpoint at update {s:,} of its {n:,} updates"
                  for name, s, n in self.saved]
        if len(lines) == 1:
            lines.append("  nothing yet (no run reached its first checkpoint)")
        return "\n".join(lines)


@contextlib.contextmanager
def cpu_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``n`` torch CPU threads (None: torch's setting), then restore it."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be a positive int or None, got {n!r}")
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_job(train_one: Callable[[Job], Any], job: Job, threads: int | None, cfg: Any,
              run_files: list[Path] | None) -> list[Run]:
    """Train one job (in this process or another) and keep its finished runs in
    ``run_files`` (written where they trained, so that they survive an interrupted parent).

    ``train_one`` returns, for a job of one run, a ``History`` or ``(History, info)``; for a
    stacked job, a list of those, one per ``job.pairs`` entry."""
    same = max_updates() == job.max_updates  # in the sweep's process: keep its measurements
    with cpu_threads(threads), (contextlib.nullcontext() if same else capped(job.max_updates)):
        got = train_one(job)
    many = len(job.pairs) > 1 or isinstance(got, list)
    got = list(got) if many else [got]
    if len(got) != len(job.pairs):
        raise ValueError(f"{getattr(train_one, '__name__', train_one)!r} returned {len(got)} "
                         f"results for a job of {len(job.pairs)} runs ({job.label})")
    runs = []
    for (variant, seed), one in zip(job.pairs, got, strict=True):
        hist, run_info = one if isinstance(one, tuple) else (one, {})
        runs.append(Run(variant, seed, hist, dict(run_info)))
    for run, path in zip(runs, run_files or [], strict=False):
        save_run(run, cfg, path)
    return runs


def saved_step(job: Job) -> list[tuple[str, int, int]]:
    """``[(label, step, steps)]`` of the checkpoint ``job`` left, or ``[]`` if none (or none
    that can be read: this is said after an interrupt, where a new error would hide it)."""
    if job.checkpoint is None or not job.checkpoint.exists():
        return []
    try:
        state = load_checkpoint(job.checkpoint)
    except UnreadableFile:
        return []
    return [(job.label, int(state["step"]), int(state.get("steps", state["step"])))]
