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

The shared machinery (one job per module, gathered by :mod:`.protocol`) is importable from
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
from lnbook.experiments.protocol import *  # noqa: F403  (the shared machinery)
from lnbook.experiments.protocol import __all__ as _shared

__all__ = ["EXPERIMENTS", "load_experiment", *(n for n in _shared if n != "UnreadableFile")]

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
