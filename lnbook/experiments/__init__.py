"""The mini-experiments of the book: a registry of modules that share one protocol.

Book chapters 3.1, the lab 3.2, 6.1-6.7, 7 and Part II. Every experiment module
``lnbook.experiments.<name>`` defines

- ``NAME: str`` and ``DESCRIPTION: str``,
- a ``@dataclass Config`` with a field ``scale``,
- ``get_config(scale="quick", **overrides) -> Config`` (``scale`` is ``"quick"`` or ``"paper"``),
- ``run(config, device="auto", out=None, seeds=None) -> Results``, which trains its variants x
  seeds through :func:`lnbook.experiments.runner.sweep` and returns one
  :class:`~lnbook.experiments.results.Results` (also written to ``out/<NAME>.json`` when
  ``out`` is given, with the finished runs and checkpoints from which a sweep resumes), or
  trains every seed of a variant as one model (``mnist``'s default engine, and the
  Transformer experiments through :mod:`.stacked`), writing ``out/<NAME>.json`` when done;
  either way the results of another config in ``out`` are never overwritten.

The shared machinery lives one job per module: ``presets``, ``results``, ``metrics``,
``store`` (the ``out`` folder), ``job``, ``workers`` and ``runner`` (the sweep);
:mod:`.protocol` gathers them under their old name, and every public name is importable from
here too.

The command line (``python -m lnbook run NAME``) and the notebooks find them in
:data:`EXPERIMENTS`, a plain mapping from name to module. Experiments never import each other.
"""

from __future__ import annotations

from types import ModuleType

from lnbook.experiments import (
    attention_geometry,
    convnet,
    deep_mlp,
    depth,
    draw,
    dyt,
    dyt_regime,
    group_norm,
    handwriting,
    mistakes,
    mnist,
    order_embeddings,
    peri_ln,
    placement,
    qk_norm,
    reader,
    removal,
    rmsnorm,
    rnn_length,
    skip_thoughts,
)
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

__all__ = [
    "EXPERIMENTS",
    "SCALES",
    "Job",
    "OutConflict",
    "Results",
    "Run",
    "SweepInterrupted",
    "Table",
    "best_step",
    "check_scale",
    "classification_metrics",
    "cpu_threads",
    "load_experiment",
    "load_results",
    "make_config",
    "mean_after_start",
    "save_results",
    "sweep",
    "updates_to_reach",
    "using_executor",
]

EXPERIMENTS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (rnn_length, deep_mlp, order_embeddings, reader, skip_thoughts, draw, handwriting,
              mnist, convnet, rmsnorm, placement, group_norm, qk_norm, dyt, mistakes, peri_ln,
              depth, attention_geometry, removal, dyt_regime)
}


def load_experiment(name: str) -> ModuleType:
    """The module of experiment ``name`` (a key of :data:`EXPERIMENTS`).

    Raises:
        KeyError: for a name that is not registered; the message lists the known names.
    """
    if name not in EXPERIMENTS:
        known = ", ".join(sorted(EXPERIMENTS)) or "(none)"
        raise KeyError(f"unknown experiment {name!r}; known experiments: {known}")
    return EXPERIMENTS[name]
