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

from lnbook.checks import check_choice, check_size
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
from lnbook.engine.train import progress_enabled
from lnbook.engine.workers import train_concurrently
from lnbook.seeds import verdict_seeds

__all__ = ["STACKS", "resolve_seeds", "sweep", "using_executor"]

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


STACKS = (None, "seeds", "all")  # how sweep groups its runs into jobs


def resolve_seeds(seeds: int | Sequence[int]) -> tuple[int, ...]:
    """A config's ``seeds`` as the tuple a run trains: an int ``n`` is the first ``n`` seeds
    of the seed set in force now (:func:`lnbook.seeds.verdict_seeds`, ``$LNBOOK_SEED_SET``),
    read when the run starts, not when the config was made; a sequence is taken as it is.
    ``ValueError`` for an empty sequence or a seed given twice, ``TypeError`` for a non-int."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return verdict_seeds(seeds)
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence):
        raise TypeError(f"seeds must be an int (how many seeds of the seed set) or a sequence "
                        f"of ints, got {type(seeds).__name__}")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int)]
    if bad:
        raise TypeError(f"seeds must be ints, got {bad!r}")
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    twice = sorted({s for s in seeds if list(seeds).count(s) > 1})
    if twice:
        raise ValueError(f"seeds must differ: {twice} given more than once")
    return tuple(int(s) for s in seeds)


def sweep(name: str, variants: Mapping[str, Any], seeds: int | Sequence[int],
          train_one: Callable[[Job], Any], *, config: Any,
          device: str | torch.device = "auto", out: str | Path | None = None,
          stack: str | None = None, checkpoint: bool = False,
          steps: int | Callable[[str, Any], int] | None = None,
          info: Mapping[str, Any] | None = None, progress: bool | None = None,
          threads: int | None = None, workers: int = 1,
          executor: Executor | None = None) -> Results:
    """Train every variant with every seed through ``train_one``; return one :class:`Results`.

    Args:
        name: the experiment's name (files are ``out/<name>.json``).
        variants: name -> parameters (anything ``train_one`` understands), in order.
        seeds: each variant is trained once per seed (:func:`resolve_seeds`: an int ``n`` is
            the first ``n`` seeds of the seed set in force when the sweep starts).
        train_one: ``Job -> History`` or ``(History, info)`` for a job of one run; for a
            stacked job a list of those, one per ``job.pairs`` entry. It builds each model
            under ``torch.manual_seed(seed)``; one run passes ``bar=job.bar``,
            ``label=job.label`` and ``checkpoint=job.checkpoint`` on to :func:`lnbook.fit`.
        config: the experiment's config dataclass (stored with the results and each run,
            with its seeds as trained).
        device: ``"auto"`` (cuda, mps, cpu) or a device.
        out: folder for ``<name>.json``, ``runs/`` and ``checkpoints/``; None keeps all in
            memory. Finished runs of the same config are reused (continued when only
            :data:`~lnbook.engine.store.CONTINUES` fields changed); runs of another
            config raise :class:`OutConflict` before anything trains.
        stack: how runs are grouped into jobs: None, one job per (variant, seed); ``"seeds"``,
            one job per variant with all its seeds (trained as one model); ``"all"``, one job
            for every variant and seed. A job's runs are saved together when it finishes.
        checkpoint: give every job a checkpoint file under ``out``.
        steps: updates per run (an int, or ``(variant, params) -> int``), for the bar.
        info: stored as ``Results.info``.
        progress: show the bar; default only in a terminal outside CI.
        threads: torch CPU threads while training (:func:`~.job.cpu_threads`).
        workers: jobs trained at once, one process each, on a CPU (same results;
            ``train_one`` must be picklable).
        executor: a :class:`concurrent.futures.Executor` to train on instead (default the
            one of :func:`using_executor`); same numbers as ``workers=1``.

    Raises:
        SweepInterrupted: on Ctrl-C, saying what is saved. OutConflict, UnreadableFile.
    """
    if not variants:
        raise ValueError("variants is empty: name at least one variant to train")
    seeds = resolve_seeds(seeds)
    check_choice("stack", stack, STACKS)
    check_size("workers", workers)
    executor = executor if executor is not None else _EXECUTOR.get()
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got "
                        f"{type(executor).__name__}")
    dev = resolve_device(device)
    folder = Path(out) if out is not None else None
    cfg = _jsonable(config)
    if isinstance(cfg, dict) and "seeds" in cfg:
        cfg = {**cfg, "seeds": list(seeds)}  # the seeds as trained, whatever the config said
    pairs = [(v, p, s) for v, p in variants.items() for s in seeds]
    n_steps = [steps(v, p) if callable(steps) else int(steps or 0) for v, p, _ in pairs]
    done, jobs = _plan(name, pairs, folder, cfg, dev, checkpoint, stack)
    total = sum(n_steps) if steps is not None else None
    bar = _SweepBar(total=total, disable=not progress_enabled(progress), desc=name,
                    unit="update")
    for i in done:
        tqdm.write(f"{label(*pairs[i][::2])}: finished earlier, read from "
                   f"{run_file(folder, pairs[i][0], pairs[i][2])}", file=sys.stderr)
        bar.update(n_steps[i])
    for job, _, _ in jobs.values():
        job.bar = bar
    try:
        if executor is not None or (workers > 1 and dev.type == "cpu" and len(jobs) > 1):
            train_concurrently(jobs, done, train_one, threads, cfg, bar,
                               lambda k: sum(n_steps[i] for i in jobs[k][2]), folder,
                               workers=min(workers, len(jobs)), executor=executor)
        else:
            for job, paths, indices in jobs.values():
                try:
                    runs = train_job(train_one, job, threads, cfg, paths)
                except KeyboardInterrupt:
                    raise SweepInterrupted([label(r.variant, r.seed) for r in done.values()],
                                           saved_step(job), folder, (bar.done, total)) from None
                done.update(zip(indices, runs, strict=True))
    finally:
        bar.close()
    results = Results(name, cfg, str(dev), [done[i] for i in sorted(done)], dict(info or {}))
    if folder is not None:
        save_results(results, folder / f"{name}.json")
    return results


def _plan(name: str, pairs: list[tuple[str, Any, int]], folder: Path | None, cfg: Any,
          dev: torch.device, checkpoint: bool, stack: str | None
          ) -> tuple[dict[int, Run], dict[int, tuple[Job, list[Path] | None, list[int]]]]:
    """The runs already finished in ``folder`` and the jobs still to train: job index ->
    (job, its run files, the indices in ``pairs`` of its runs); a conflict anywhere raises
    before anything trains."""
    done: dict[int, Run] = {}
    todo: list[int] = []
    conflicts: list[Path] = []
    for i, (variant, _, seed) in enumerate(pairs):
        try:
            found = load_finished(folder, variant, seed, cfg) if folder is not None else None
        except OutConflict as conflict:
            conflicts += conflict.files
            continue
        if found is not None:
            done[i] = found
        else:
            todo.append(i)
    if folder is not None:
        try:
            check_results_file(folder / f"{name}.json", cfg)
        except OutConflict as conflict:
            conflicts += conflict.files
    if conflicts:
        raise OutConflict(conflicts, folder)
    groups: dict[Any, list[int]] = {}
    for i in todo:  # runs of one job, in the order of pairs
        key = i if stack is None else (pairs[i][0] if stack == "seeds" else "all")
        groups.setdefault(key, []).append(i)
    jobs = {}
    for k, indices in enumerate(groups.values()):
        variants = {pairs[i][0]: pairs[i][1] for i in indices}
        seeds = tuple(dict.fromkeys(pairs[i][2] for i in indices))
        if len(variants) * len(seeds) != len(indices):  # a stack left partly finished
            raise ValueError(f"{name}: some runs of a stacked job are finished and others are "
                             f"not; move the run files of {sorted(variants)} away to retrain")
        first_v, first_s = pairs[indices[0]][0], pairs[indices[0]][2]
        what = (label(first_v, first_s) if len(indices) == 1 else
                f"{first_v if len(variants) == 1 else f'{len(variants)} variants'} x "
                f"{len(seeds)} seeds")
        ckpt = None
        if folder is not None and checkpoint:
            ckpt = checkpoint_file(folder, name, first_v if len(variants) == 1 else "all",
                                   first_s if len(seeds) == 1 else len(seeds), cfg)
        paths = [run_file(folder, pairs[i][0], pairs[i][2]) for i in indices] if folder else None
        jobs[k] = (Job(variants, seeds, dev, ckpt, None, what), paths, indices)
    return done, jobs
