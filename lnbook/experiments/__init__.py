"""The mini-experiments of the book (chapters 2, 3, 3.1, 3.2, 6.1-6.8, 7, Parts II to IV): a
registry, :data:`EXPERIMENTS` (name -> module, each imported when first looked up), of modules
that share one protocol.

Each module defines ``NAME``, ``DESCRIPTION``, a ``@dataclass Config`` with a ``scale`` and
``seeds``, ``get_config(scale="quick", **overrides)`` and ``run(config, device="auto",
out=None) -> Results``, which trains its variants x seeds through the engine's
:func:`lnbook.engine.runner.sweep` and writes ``out/<NAME>-<digest>.json``, never over results of
another config.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from types import ModuleType

__all__ = ["EXPERIMENTS", "load_experiment"]

_NAMES = (  # the experiment modules, in the book's order; each module's NAME is its file's
    "batch_noise", "online", "rnn_length", "deep_mlp", "order_embeddings", "reader",
    "skip_thoughts", "draw", "handwriting", "mnist", "convnet", "why", "first_sign", "rmsnorm",
    "placement", "group_norm", "qk_norm", "dyt", "mistakes", "norm_ablation", "peri_ln", "depth",
    "attention_geometry", "removal", "dyt_regime", "design_map", "outliers", "sphere",
)


class _Registry(MutableMapping):
    """name -> module, each module imported when first looked up (a chapter that imports one
    experiment does not pay for importing the others). A module set under a name (as the tests
    register a tiny experiment) is looked up before the files; deleting the name removes it."""

    def __init__(self) -> None:
        self._set: dict[str, ModuleType] = {}

    def __getitem__(self, name: str) -> ModuleType:
        if name in self._set:
            return self._set[name]
        if name not in _NAMES:
            raise KeyError(name)
        return importlib.import_module(f"{__name__}.{name}")

    def __setitem__(self, name: str, module: ModuleType) -> None:
        self._set[name] = module

    def __delitem__(self, name: str) -> None:
        del self._set[name]

    def __iter__(self) -> Iterator[str]:
        return iter((*_NAMES, *(n for n in self._set if n not in _NAMES)))

    def __len__(self) -> int:
        return len(set(_NAMES) | set(self._set))

    def __repr__(self) -> str:
        return f"EXPERIMENTS({', '.join(self)})"


EXPERIMENTS: MutableMapping[str, ModuleType] = _Registry()


def load_experiment(name: str) -> ModuleType:
    """The module of experiment ``name`` (a key of :data:`EXPERIMENTS`); ``KeyError`` listing
    the known names for any other name."""
    if name not in EXPERIMENTS:
        known = ", ".join(sorted(EXPERIMENTS)) or "(none)"
        raise KeyError(f"unknown experiment {name!r}; known experiments: {known}")
    return EXPERIMENTS[name]
