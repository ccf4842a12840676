"""The one experiment engine: every experiment of the book trains through it.

- :mod:`.config`: :class:`~.config.RunConfig`, the base of every experiment's config (scale,
  seeds, steps, threads, workers), the two scales (``quick``, ``paper``) and
  :func:`~.config.make_config`;
- :mod:`.train`: the training loop :func:`~.train.fit` (one model) with checkpoint and resume,
  and the smoke run's cap (:func:`~.train.capped`, read by every loop through
  :func:`~.train.max_updates`);
- :mod:`.stack`: many copies of any model as one (:class:`~.stack.Stack`, ``torch.func``);
- :mod:`.copies`: the loop that trains such copies (:func:`~.copies.train_copies`), with a
  learning-rate warm-up per parameter group (:func:`~.copies.linear_warmup`);
- :mod:`.runner`: :func:`~.runner.sweep`, variants x seeds -> :class:`~.results.Results`,
  here, in worker processes or on any :class:`concurrent.futures.Executor` (:mod:`.workers`);
- :mod:`.store`: the ``out`` folder, shared by experiments and configs (finished runs are
  never lost or overwritten; :func:`~.store.save_sweep` writes results where they belong);
- :mod:`.results`, :mod:`.metrics`: one layout of results, and the measures of learning curves.

The engine knows no experiment: experiments (:mod:`lnbook.experiments`) import it, never the
other way round.
"""

from __future__ import annotations

from lnbook.engine.config import SCALES, RunConfig, check_scale, make_config
from lnbook.engine.copies import linear_warmup, train_copies
from lnbook.engine.job import Job, SweepInterrupted, cpu_threads
from lnbook.engine.metrics import (
    best_step,
    classification_metrics,
    mean_after_start,
    prior_nll,
    speedup,
    updates_to_reach,
)
from lnbook.engine.results import Results, Run, load_results, save_results
from lnbook.engine.runner import STACKS, resolve_seeds, sweep, using_executor
from lnbook.engine.stack import Stack
from lnbook.engine.store import OutConflict, results_file, save_sweep
from lnbook.engine.train import (
    Batches,
    CannotWrite,
    History,
    UnreadableFile,
    capped,
    fit,
    max_updates,
)
from lnbook.engine.workers import WorkersLost

__all__ = [
    "SCALES", "STACKS", "Batches", "CannotWrite", "History", "Job", "OutConflict", "Results",
    "Run", "RunConfig", "Stack", "SweepInterrupted", "UnreadableFile", "WorkersLost",
    "best_step", "capped", "check_scale", "classification_metrics", "cpu_threads", "fit",
    "linear_warmup", "load_results", "make_config", "max_updates", "mean_after_start",
    "prior_nll", "resolve_seeds", "results_file", "save_results", "save_sweep", "speedup", "sweep",
    "train_copies", "updates_to_reach", "using_executor",
]
