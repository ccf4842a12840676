"""The mini-experiments of the book (chapters 3.1, 3.2, 6.1-6.7, 7, Part II): a registry,
:data:`EXPERIMENTS` (name -> module), of modules that share one protocol.

Each module defines ``NAME``, ``DESCRIPTION``, a ``@dataclass Config`` with a ``scale``,
``get_config(scale="quick", **overrides)`` and ``run(config, device="auto", out=None,
seeds=None) -> Results``, which trains its variants x seeds (through
:func:`~lnbook.experiments.runner.sweep`, or every seed as one model via :mod:`.stacked`) and
writes ``out/<NAME>.json``, never over results of another config. The shared machinery
(:mod:`.protocol`) is importable from here too.
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
