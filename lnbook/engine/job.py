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
from lnbook.engine.train import UnreadableFile, load_checkpoint

__all__ = ["Job", "SweepInterrupted", "cpu_threads"]


@dataclass
class Job:
    """One (variant, seed) pair handed to ``train_one``: pass ``bar``, ``label`` and
    ``checkpoint`` on to :func:`lnbook.fit`."""

    variant: str
    params: Any
    seed: int
    device: torch.device
    checkpoint: Path | None
    bar: Any
    label: str


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
              run_file: Path | None) -> Run:
    """Train one job (in this process or another) and keep the finished run in ``run_file``
    (written where the run trained, so that it survives an interrupted parent)."""
    with cpu_threads(threads):
        got = train_one(job)
    hist, run_info = got if isinstance(got, tuple) else (got, {})
    run = Run(job.variant, job.seed, hist, dict(run_info))
    if run_file is not None:
        save_run(run, cfg, run_file)
    return run


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
