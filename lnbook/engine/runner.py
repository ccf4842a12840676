"""The one protocol every experiment follows: :func:`sweep`, variants x seeds -> fit -> one
:class:`Results` (here, in worker processes or on an executor: :mod:`.workers`), finished runs
and checkpoints kept in ``out`` (:mod:`.store`: resumable, never overwritten)."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from lnbook.checks import check_size
from lnbook.device import resolve_device
from lnbook.engine.job import Job, SweepInterrupted, label, saved_step, train_job
from lnbook.engine.results import Results, Run, _jsonable, save_results
from lnbook.engine.store import (
    OutConflict,
    check_results_file,
    checkpoint_file,
    load_finished,
    run_file,
)
from lnbook.engine.train import History, progress_enabled
from lnbook.engine.workers import train_concurrently

__all__ = ["sweep", "using_executor"]

_EXECUTOR: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "lnbook_executor", default=None)


@contextlib.contextmanager
def using_executor(executor: Executor | None) -> Iterator[Executor | None]:
    """Every :func:`sweep` in the body trains its runs on ``executor`` unless given one.

    Use processes (a Dask cluster, ``ProcessPoolExecutor``): threads share torch's global
    random state, so seeded experiments would get other numbers.
    """
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got "
                        f"{type(executor).__name__}")
    token = _EXECUTOR.set(executor)
    try:
        yield executor
    finally:
        _EXECUTOR.reset(token)


class _SweepBar(tqdm):
    """The sweep's progress bar, which counts its updates even when it is not drawn (the
    count an interrupted sweep reports is the count its bar shows)."""

    done = 0

    def update(self, n: float | None = 1) -> bool | None:
        self.done += int(n or 0)
        return super().update(n)


def sweep(name: str, variants: Mapping[str, Any], seeds: Sequence[int],
          train_one: Callable[[Job], History | tuple[History, dict[str, Any]]], *, config: Any,
          device: str | torch.device = "auto", out: str | Path | None = None,
          checkpoint: bool = False, steps: int | Callable[[str, Any], int] | None = None,
          info: Mapping[str, Any] | None = None, progress: bool | None = None,
          threads: int | None = None, workers: int = 1,
          executor: Executor | None = None) -> Results:
    """Train every variant with every seed through ``train_one``; return one :class:`Results`.

    Args:
        name: the experiment's name (files are ``out/<name>.json``).
        variants: name -> parameters (anything ``train_one`` understands), in order.
        seeds: each variant is trained once per seed.
        train_one: ``Job -> History`` or ``(History, info)``; builds the model under
            ``torch.manual_seed(job.seed)`` and calls :func:`lnbook.fit` with ``bar=job.bar``,
            ``label=job.label`` and ``checkpoint=job.checkpoint``.
        config: the experiment's config dataclass (stored with the results and each run).
        device: ``"auto"`` (cuda, mps, cpu) or a device.
        out: folder for ``<name>.json``, ``runs/`` and ``checkpoints/``; None keeps all in
            memory. Finished runs of the same config are reused (continued when only
            :data:`~lnbook.engine.store.CONTINUES` fields changed); runs of another
            config raise :class:`OutConflict` before anything trains.
        checkpoint: give every job a checkpoint file under ``out``.
        steps: updates per run (an int, or ``(variant, params) -> int``), for the bar.
        info: stored as ``Results.info``.
        progress: show the bar; default only in a terminal outside CI.
        threads: torch CPU threads while training (:func:`~.job.cpu_threads`).
        workers: runs trained at once, one process each, on a CPU (same results;
            ``train_one`` must be picklable).
        executor: a :class:`concurrent.futures.Executor` to train on instead (default the
            one of :func:`using_executor`); same numbers as ``workers=1``.

    Raises:
        SweepInterrupted: on Ctrl-C, saying what is saved. OutConflict, UnreadableFile.
    """
    if not variants:
        raise ValueError("variants is empty: name at least one variant to train")
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    check_size("workers", workers)
    executor = executor if executor is not None else _EXECUTOR.get()
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got "
                        f"{type(executor).__name__}")
    dev = resolve_device(device)
    folder = Path(out) if out is not None else None
    cfg = _jsonable(config)
    pairs = [(v, p, int(s)) for v, p in variants.items() for s in seeds]
    n_steps = [steps(v, p) if callable(steps) else int(steps or 0) for v, p, _ in pairs]
    done, jobs = _plan(name, pairs, folder, cfg, dev, checkpoint)
    total = sum(n_steps) if steps is not None else None
    bar = _SweepBar(total=total, disable=not progress_enabled(progress), desc=name,
                    unit="update")
    for i in done:
        tqdm.write(f"{label(*pairs[i][::2])}: finished earlier, read from "
                   f"{run_file(folder, pairs[i][0], pairs[i][2])}", file=sys.stderr)
        bar.update(n_steps[i])
    for job, _ in jobs.values():
        job.bar = bar
    try:
        if executor is not None or (workers > 1 and dev.type == "cpu" and len(jobs) > 1):
            train_concurrently(jobs, done, train_one, threads, cfg, bar, n_steps.__getitem__,
                               folder, workers=min(workers, len(jobs)), executor=executor)
        else:
            for i, (job, path) in jobs.items():
                try:
                    done[i] = train_job(train_one, job, threads, cfg, path)
                except KeyboardInterrupt:
                    raise SweepInterrupted([label(r.variant, r.seed) for r in done.values()],
                                           saved_step(job), folder, (bar.done, total)) from None
    finally:
        bar.close()
    results = Results(name, cfg, str(dev), [done[i] for i in sorted(done)], dict(info or {}))
    if folder is not None:
        save_results(results, folder / f"{name}.json")
    return results


def _plan(name: str, pairs: list[tuple[str, Any, int]], folder: Path | None, cfg: Any,
          dev: torch.device, checkpoint: bool
          ) -> tuple[dict[int, Run], dict[int, tuple[Job, Path | None]]]:
    """The runs already finished in ``folder`` and the jobs still to train (with their run
    files), in the order of ``pairs``; a conflict anywhere raises before anything trains."""
    done: dict[int, Run] = {}
    jobs: dict[int, tuple[Job, Path | None]] = {}
    conflicts: list[Path] = []
    for i, (variant, params, seed) in enumerate(pairs):
        path = run_file(folder, variant, seed) if folder is not None else None
        try:
            found = load_finished(folder, variant, seed, cfg) if folder is not None else None
        except OutConflict as conflict:
            conflicts += conflict.files
            continue
        if found is not None:
            done[i] = found
            continue
        ckpt = None
        if folder is not None and checkpoint:
            ckpt = checkpoint_file(folder, name, variant, seed, cfg)
        jobs[i] = (Job(variant, params, seed, dev, ckpt, None, label(variant, seed)), path)
    if folder is not None:
        try:
            check_results_file(folder / f"{name}.json", cfg)
        except OutConflict as conflict:
            conflicts += conflict.files
    if conflicts:
        raise OutConflict(conflicts, folder)
    return done, jobs
