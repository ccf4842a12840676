"""The one protocol every experiment follows (variants x seeds -> fit -> :class:`Results`)
under its old address: the names of ``presets``, ``results``, ``metrics``, ``store``, ``job``,
``workers`` and ``runner``, so that ``from lnbook.experiments.protocol import ...`` works."""

from __future__ import annotations

from lnbook.experiments.job import Job, SweepInterrupted, cpu_threads
from lnbook.experiments.metrics import (
    best_step,
    classification_metrics,
    mean_after_start,
    updates_to_reach,
)
from lnbook.experiments.presets import SCALES, check_scale, make_config
from lnbook.experiments.results import Results, Run, load_results, save_results
from lnbook.experiments.runner import sweep, using_executor
from lnbook.experiments.store import OutConflict
from lnbook.table import Table
from lnbook.train import UnreadableFile

__all__ = [
    "SCALES", "Job", "OutConflict", "Results", "Run", "SweepInterrupted", "Table",
    "UnreadableFile", "best_step", "check_scale", "classification_metrics", "cpu_threads",
    "load_results", "make_config", "mean_after_start", "save_results", "sweep",
    "updates_to_reach", "using_executor",
]
