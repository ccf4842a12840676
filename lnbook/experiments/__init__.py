"""The mini-experiments of the book: a registry of modules that share one protocol.

Book chapters 3.1, the lab 3.2, 6.1-6.7, 7 and Part II. Every experiment module
``lnbook.experiments.<name>`` defines

- ``NAME: str`` and ``DESCRIPTION: str``,
- a ``@dataclass Config`` with a field ``scale``,
- ``get_config(scale="quick", **overrides) -> Config`` (``scale`` is ``"quick"`` or ``"paper"``),
- ``run(config, device="auto", out=None, seeds=None) -> Results``, which trains its variants x
  seeds through :func:`lnbook.experiments.protocol.sweep` and returns one
  :class:`~lnbook.experiments.protocol.Results` (also written to ``out/<NAME>.json`` when
  ``out`` is given, with the finished runs and checkpoints from which a sweep resumes).

The command line (``python -m lnbook run NAME``) and the notebooks find them in
:data:`EXPERIMENTS`, a plain mapping from name to module. Experiments never import each other.
"""

from __future__ import annotations

from types import ModuleType

from lnbook.experiments import (
    convnet,
    deep_mlp,
    draw,
    dyt,
    group_norm,
    handwriting,
    mistakes,
    mnist,
    order_embeddings,
    placement,
    qk_norm,
    reader,
    rmsnorm,
    rnn_length,
    skip_thoughts,
)
from lnbook.experiments.protocol import (
    SCALES,
    Job,
    Results,
    Run,
    SweepInterrupted,
    Table,
    best_step,
    check_scale,
    load_results,
    make_config,
    mean_after_start,
    save_results,
    sweep,
    updates_to_reach,
)

__all__ = [
    "EXPERIMENTS",
    "SCALES",
    "Job",
    "Results",
    "Run",
    "SweepInterrupted",
    "Table",
    "best_step",
    "check_scale",
    "load_experiment",
    "load_results",
    "make_config",
    "mean_after_start",
    "save_results",
    "sweep",
    "updates_to_reach",
]

EXPERIMENTS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (rnn_length, deep_mlp, order_embeddings, reader, skip_thoughts, draw, handwriting,
              mnist, convnet, rmsnorm, placement, group_norm, qk_norm, dyt, mistakes)
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
