"""The one protocol every experiment follows: :func:`sweep`, variants x seeds -> fit -> one
:class:`Results` (here, in worker processes or on an executor: :mod:`.workers`), finished runs
and checkpoints kept in ``out`` (:mod:`.store`: resumable, never overwritten)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from lnbook.checks import check_choice, check_size
from lnbook.device import resolve_device
from lnbook.engine.job import Job, SweepInterrupted, label, saved_step, train_job
from lnbook.engine.results import Results, Run, jsonable
from lnbook.engine.store import (
    OutConflict,
    check_results_file,
    checkpoint_file,
    load_finished,
    results_file,
    run_file,
    save_sweep,
)
from lnbook.engine.train import max_updates, progress_enabled
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


INTERRUPT_ENV = "LNBOOK_TEST_INTERRUPT_AFTER_UPDATES"  # tests: Ctrl-C after this many updates


class _SweepBar(tqdm):
    """The sweep's progress bar, which counts its updates even when it is not drawn (the
    count an interrupted sweep reports is the count its bar shows). With ``estimate`` it
    prints, once a few updates are timed, how long the rest will take; with ``log`` and no
    bar drawn, a plain line at every tenth of the updates (for logs)."""

    done = 0

    def __init__(self, *args: Any, estimate: bool = False, log: bool = False,
                 interrupt_after: int | None = None, **kwargs: Any) -> None:
        self.estimate, self.log, self.interrupt_after = estimate, log, interrupt_after
        self.timed: list[float] = []  # when each of the first single updates ended
        self.started = time.perf_counter()
        self.name = kwargs.get("desc") or ""  # the desc a job's loop sets is not the sweep's
        super().__init__(*args, **kwargs)

    def update(self, n: float | None = 1) -> bool | None:
        n = int(n or 0)
        before, self.done = self.done, self.done + n
        if n == 1 and self.estimate:
            self._estimate()
        if self.log and self.disable and self.total:
            tenth = max(1, self.total // 10)
            if self.done // tenth > before // tenth:
                minutes = (time.perf_counter() - self.started) / 60
                tqdm.write(f"{self.name}: update {self.done:,} of {self.total:,} "
                           f"({100 * self.done // self.total}%), {minutes:.1f} minutes so far",
                           file=sys.stderr)
        if self.interrupt_after is not None and self.done >= self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt  # as Ctrl-C would, after a finished update (tests)
        return super().update(n)

    def _estimate(self) -> None:
        self.timed.append(time.perf_counter())
        spent = self.timed[-1] - self.timed[0]  # the first update warms up: timed after it
        if len(self.timed) < 5:
            return
        self.estimate = False
        per_update = spent / (len(self.timed) - 1)
        left = max(0, (self.total or 0) - self.done)
        minutes = per_update * left / 60
        about = f"about {minutes:,.0f} minutes" if minutes >= 1 else "under a minute"
        tqdm.write(f"{self.name}: {about} on this CPU ({per_update:.3g} s per update, "
                   f"{left:,} updates to go); a GPU is advised", file=sys.stderr)


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
        name: the experiment's name (files are ``out/<name>-<digest>.json`` and, per run,
            ``out/runs/<name>-<digest>/``: :mod:`~lnbook.engine.store`).
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
        out: folder for the results, ``runs/`` and ``checkpoints/``, shared by any number
            of experiments and configs; None keeps all in memory. Finished runs of the same
            config are reused (continued when only :data:`~lnbook.engine.store.CONTINUES`
            fields changed); asking fewer updates than a finished run made raises
            :class:`OutConflict` before anything trains.
        stack: how runs are grouped into jobs: None, one job per (variant, seed); ``"seeds"``,
            one job per variant with all its seeds (trained as one model); ``"all"``, one job
            for every variant and seed. A job's runs are saved together when it finishes.
        checkpoint: give every job a checkpoint file under ``out``.
        steps: updates per run (an int, or ``(variant, params) -> int``), for the bar.
        info: stored as ``Results.info``.
        progress: show the bar; default only in a terminal outside CI.
        threads: torch CPU threads while training (:func:`~.job.cpu_threads`).
        workers: jobs trained at once, one process each, on a CPU (same results;
            ``train_one`` must be picklable). Where it cannot apply (fewer jobs than
            workers, a GPU) one line on stderr says so.
        executor: a :class:`concurrent.futures.Executor` to train on instead (default the
            one of :func:`using_executor`); same numbers as ``workers=1``.

    Under :func:`~lnbook.engine.train.capped` (a smoke run) every loop stops after the cap and the
    config records ``max_updates``, so its files never pass for a full run's. At paper scale
    on a CPU it prints an estimate of its time once a few updates are timed, and, where no
    bar is drawn, a line at every tenth of its updates. ``$LNBOOK_TEST_INTERRUPT_AFTER_UPDATES``
    (tests) raises Ctrl-C after that many updates of the sweep.

    Raises:
        SweepInterrupted: on Ctrl-C, saying what is saved.
        OutConflict: a run asked with fewer updates than one on disk.
        UnreadableFile: a run or checkpoint file that cannot be read.
        CannotWrite: a file that cannot be written (a full disk).
        WorkersLost: an executor without live workers.
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
    cfg = jsonable(config)
    if isinstance(cfg, dict) and "seeds" in cfg:
        cfg = {**cfg, "seeds": list(seeds)}  # the seeds as trained, whatever the config said
    cap = max_updates()
    if cap is not None:  # a smoke run: its own digest, never taken for a full run
        cfg = {**cfg, "max_updates": cap} if isinstance(cfg, dict) else {
            "config": cfg, "max_updates": cap}
    pairs = [(v, p, s) for v, p in variants.items() for s in seeds]
    n_steps = [max_updates(steps(v, p) if callable(steps) else int(steps or 0))
               for v, p, _ in pairs]
    done, jobs = _plan(name, pairs, folder, cfg, dev, checkpoint, stack, cap)
    if (note := _cannot_apply(name, len(jobs), stack, workers, executor, dev)) is not None:
        tqdm.write(f"lnbook: {note}", file=sys.stderr)
    total = sum(n_steps) if steps is not None else None
    paper_on_cpu = isinstance(cfg, dict) and cfg.get("scale") == "paper" and dev.type == "cpu"
    after = os.environ.get(INTERRUPT_ENV, "").strip()
    bar = _SweepBar(total=total, disable=not progress_enabled(progress), desc=name,
                    unit="update", estimate=paper_on_cpu and bool(total) and bool(jobs),
                    log=isinstance(cfg, dict) and cfg.get("scale") == "paper",
                    interrupt_after=int(after) if after else None)
    for i in done:
        tqdm.write(f"{label(*pairs[i][::2])}: finished earlier, read from "
                   f"{run_file(folder, name, pairs[i][0], pairs[i][2], cfg)}", file=sys.stderr)
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
        save_sweep(results, folder)
    return results


def _cannot_apply(name: str, n_jobs: int, stack: str | None, workers: int,
                  executor: Executor | None, dev: torch.device) -> str | None:
    """One line saying why ``workers`` or ``executor`` cannot do what it asks, or None."""
    how = {None: "", "seeds": " trains the seeds of a variant as one model:",
           "all": " trains all its runs as one model:"}[stack]
    jobs = f"{n_jobs} job{'s' if n_jobs != 1 else ''}"
    if n_jobs == 0:
        return None
    if executor is not None:
        return f"{name}{how or ':'} the executor has {jobs} to run" if n_jobs == 1 else None
    if workers > 1 and dev.type != "cpu":
        return (f"workers {workers} spreads jobs over CPU processes; on {dev} the {jobs} of "
                f"{name} train one after another")
    if workers > n_jobs:
        return f"{name}{how or ':'} workers {workers} has {jobs} to spread"
    return None


def _plan(name: str, pairs: list[tuple[str, Any, int]], folder: Path | None, cfg: Any,
          dev: torch.device, checkpoint: bool, stack: str | None, cap: int | None = None
          ) -> tuple[dict[int, Run], dict[int, tuple[Job, list[Path] | None, list[int]]]]:
    """The runs already finished in ``folder`` and the jobs still to train: job index ->
    (job, its run files, the indices in ``pairs`` of its runs); a conflict anywhere raises
    before anything trains."""
    done: dict[int, Run] = {}
    todo: list[int] = []
    conflicts: list[Path] = []
    for i, (variant, _, seed) in enumerate(pairs):
        try:
            found = (load_finished(folder, name, variant, seed, cfg) if folder is not None
                     else None)
        except OutConflict as conflict:
            conflicts += conflict.files
            continue
        if found is not None:
            done[i] = found
        else:
            todo.append(i)
    if folder is not None:
        try:
            check_results_file(results_file(folder, name, cfg), cfg)
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
            ckpt = checkpoint_file(folder, name, cfg, list(variants), seeds)
        paths = ([run_file(folder, name, pairs[i][0], pairs[i][2], cfg) for i in indices]
                 if folder else None)
        jobs[k] = (Job(variants, seeds, dev, ckpt, None, what, cap), paths, indices)
    return done, jobs
