"""The mini-experiments of the book (chapters 3.1, 3.2, 6.1-6.8, 7, Part II): a registry,
:data:`EXPERIMENTS` (name -> module), of modules that share one protocol.

Each module defines ``NAME``, ``DESCRIPTION``, a ``@dataclass Config`` with a ``scale`` and
``seeds``, ``get_config(scale="quick", **overrides)`` and ``run(config, device="auto",
out=None) -> Results``, which trains its variants x seeds through the engine's
:func:`lnbook.engine.runner.sweep` and writes ``out/<NAME>-<digest>.json``, never over results of
another config.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXPERIMENTS", "load_experiment"]

_NAMES = (  # the experiment modules, in the book's order
    "batch_noise", "rnn_length", "deep_mlp", "order_embeddings", "reader", "skip_thoughts", "draw",
    "handwriting", "mnist", "convnet", "why", "first_sign", "rmsnorm", "placement", "group_norm",
    "qk_norm", "dyt", "mistakes", "norm_ablation", "peri_ln", "depth", "attention_geometry",
    "removal", "dyt_regime", "design_map", "outliers", "sphere",
)
EXPERIMENTS: dict[str, ModuleType] = {
    m.NAME: m for m in (importlib.import_module(f"{__name__}.{name}") for name in _NAMES)
}


def load_experiment(name: str) -> ModuleType:
    """The module of experiment ``name`` (a key of :data:`EXPERIMENTS`); ``KeyError`` listing
    the known names for any other name."""
    if name not in EXPERIMENTS:
        known = ", ".join(sorted(EXPERIMENTS)) or "(none)"
        raise KeyError(f"unknown experiment {name!r}; known experiments: {known}")
    return EXPERIMENTS[name]
