"""Runs of a sweep trained at once: in fresh worker processes (``spawn``), or on any
:class:`concurrent.futures.Executor`. Workers take Ctrl-C only while a run trains (it then
saves its checkpoint) and end within a second when the sweep's process dies.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from tqdm import tqdm

from lnbook.engine.job import Job, SweepInterrupted, label, saved_step, train_job
from lnbook.engine.results import Run, read_json
from lnbook.engine.store import save_run

__all__ = ["WorkersLost", "live_workers", "train_concurrently"]

PARENT_POLL_SECONDS = 0.2  # how often a worker checks that its parent is alive
HEARTBEAT_SECONDS = 1.0  # how often a sweep on an executor asks whether it has workers
NO_WORKERS_ENV = "LNBOOK_NO_WORKERS_SECONDS"  # how long a sweep waits with no live worker
NO_WORKERS_SECONDS = 60.0


class WorkersLost(RuntimeError):
    """The processes that were to train the sweep's jobs are gone (an executor without a live
    worker for too long, a worker process killed): one line saying what to do."""


def live_workers(executor: Executor) -> int | None:
    """How many workers ``executor`` has now (a Dask client's executor: the workers its
    scheduler knows, 0 when the scheduler is unreachable), or None where it cannot tell."""
    client = getattr(executor, "_client", None)
    if client is None or not callable(getattr(client, "nthreads", None)):
        return None
    try:
        return len(client.nthreads())
    except Exception:  # the scheduler is gone too: no worker can run a job
        return 0


def _no_workers_seconds() -> float:
    value = os.environ.get(NO_WORKERS_ENV, "").strip()
    try:
        return float(value) if value else NO_WORKERS_SECONDS
    except ValueError:
        raise ValueError(f"{NO_WORKERS_ENV} must be a number of seconds, got {value!r}") from None


def _exit_with_parent(parent: int) -> None:
    """End this process at once, whatever its main thread does, when ``parent`` is gone."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)  # no cleanup to run: a run's files are written atomically


def _worker_ignores_ctrl_c(parent: int | None = None) -> None:
    """Pool initializer: ignore Ctrl-C between runs; with ``parent``, end when it dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True,
                         name="lnbook-exit-with-parent").start()


def _train_job_in_worker(*args: Any) -> Run:
    """:func:`train_job` in a worker: Ctrl-C interrupts the run (saving its checkpoint)."""
    ignore = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return train_job(*args)
    finally:
        signal.signal(signal.SIGINT, ignore)


def process_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` fresh processes that ignore Ctrl-C between runs and end with this one."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_ignores_ctrl_c, initargs=(os.getpid(),))


def train_concurrently(jobs: dict[int, tuple[Job, list[Path] | None, list[int]]],
                       done: dict[int, Run],
                       train_one: Callable[[Job], Any], threads: int | None, cfg: Any,
                       bar: tqdm, n_steps: Callable[[int], int], folder: Path | None, *,
                       workers: int = 1, executor: Executor | None = None) -> None:
    """Train ``jobs`` at once, filling ``done`` (run index -> run) as jobs finish; ``jobs``
    maps a job index to (job, its run files, the indices of its runs).

    Without ``executor``: ``workers`` local processes, never more jobs handed out than
    workers; each worker writes its run files. With ``executor``: all jobs submitted at once,
    the runs' files written here.
    """
    own = executor is None
    pool = process_pool(workers) if own else executor
    local = isinstance(pool, ProcessPoolExecutor)  # on this machine: workers write run files
    if local:
        try:
            pickle.dumps(train_one)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(
                f"with workers > 1 every run trains in another process, so train_one must be "
                f"picklable (a module-level function, or a functools.partial of one); "
                f"{train_one!r} is not: {exc}"
            ) from None
    limit = workers if own else len(jobs)  # an executor takes every job at once
    fn = _train_job_in_worker if local else train_job
    quiet = tqdm(disable=True)  # a worker cannot draw on this process's bar
    waiting = list(jobs)  # indices not yet handed out, in order
    running: dict[Future, int] = {}
    patience, alone_since = _no_workers_seconds(), None

    def start_next() -> None:
        i = waiting.pop(0)
        job, run_files, _ = jobs[i]
        running[pool.submit(fn, train_one, dataclasses.replace(job, bar=quiet), threads, cfg,
                            run_files if local else None)] = i

    def finish(i: int, runs: list[Run]) -> None:
        _, run_files, indices = jobs[i]
        if not local and run_files is not None:
            for run, path in zip(runs, run_files, strict=True):
                save_run(run, cfg, path)
        done.update(zip(indices, runs, strict=True))

    try:
        while waiting and len(running) < limit:
            start_next()
        while running:
            finished, _ = wait(running, timeout=None if local else HEARTBEAT_SECONDS,
                               return_when=FIRST_COMPLETED)
            if not finished:  # a heartbeat: does the executor still have a worker?
                if live_workers(pool) != 0:
                    alone_since = None
                elif alone_since is None:
                    alone_since = time.monotonic()
                elif time.monotonic() - alone_since > patience:
                    where = f"; finished runs are kept in {folder}" if folder else ""
                    raise WorkersLost(
                        f"the executor has no live workers (none for {patience:.0f} s) and "
                        f"{len(running) + len(waiting)} of {len(jobs)} jobs are not done: "
                        f"start workers for its scheduler, or run without --executor{where}")
            for future in finished:
                i = running.pop(future)
                if future.cancelled():  # dropped by the executor, not by us: no one to run it
                    where = f"; finished runs are kept in {folder}" if folder else ""
                    raise WorkersLost(
                        f"the executor has no live workers (it cancelled a job) and "
                        f"{len(running) + len(waiting) + 1} of {len(jobs)} jobs are not done: "
                        f"start workers for its scheduler, or run without --executor{where}")
                finish(i, future.result())  # a run's exception is raised here
                bar.set_description(f"{jobs[i][0].label} done")
                bar.update(n_steps(i))
                if waiting:
                    start_next()
    except BaseException as exc:
        if own:
            pool.shutdown(wait=False, cancel_futures=True)
        else:
            for future in running:
                future.cancel()
        if isinstance(exc, BrokenProcessPool):
            raise WorkersLost(
                "a worker process of the sweep stopped before its run finished. Called from a "
                "script, the sweep must run under `if __name__ == \"__main__\":` (each worker "
                "imports the main module); workers=1 trains in this process instead"
                if own else "a worker process of the executor stopped before its job finished "
                "(killed, or out of memory); finished runs are kept: run again to go on"
            ) from exc
        if not isinstance(exc, KeyboardInterrupt):
            raise
        _stop(jobs, done, running, local, folder, bar, finish)
    if own:
        pool.shutdown()


def _stop(jobs: dict[int, tuple[Job, list[Path] | None, list[int]]], done: dict[int, Run],
          running: dict[Future, int], local: bool, folder: Path | None, bar: tqdm,
          finish: Callable[[int, list[Run]], None]) -> None:
    """After Ctrl-C: raise :class:`SweepInterrupted` with what finished or was checkpointed."""
    # workers that got the Ctrl-C too (a terminal sends it to them all) save a checkpoint and
    # stop; runs whose worker did not (Jupyter interrupts the kernel only) go on in the
    # background and save their results when they finish
    wait(running, timeout=10 if local else 0)
    saved = []
    for future, i in running.items():
        job, run_files, indices = jobs[i]
        if future.done() and not future.cancelled() and future.exception() is None:
            finish(i, future.result())
        elif local and run_files and all(f.exists() for f in run_files):  # saved before Ctrl-C
            done.update((k, Run.from_dict(read_json(f, "delete it to train it again")["run"]))
                        for k, f in zip(indices, run_files, strict=True))
        else:
            saved += saved_step(job)
    finished = [label(r.variant, r.seed) for _, r in sorted(done.items())]
    raise SweepInterrupted(finished, saved, folder,
                           (getattr(bar, "done", bar.n), bar.total)) from None
