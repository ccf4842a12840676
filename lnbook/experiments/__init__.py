"""The experiments of section 6: a registry of modules, each with configs, a model and `run`.

Book chapters 6.1-6.7. Every experiment module ``lnbook.experiments.<name>`` defines

- ``NAME: str`` and ``DESCRIPTION: str``,
- a ``@dataclass Config`` with a field ``scale``,
- ``get_config(scale="quick", **overrides) -> Config`` (``scale`` is ``"quick"`` or ``"paper"``),
- ``run(config, device="auto", out=None, seeds=None) -> dict``, JSON-serializable results that
  are also written to ``out/<NAME>.json`` when ``out`` is given.

The command line (``python -m lnbook run NAME``) and the notebooks find them through
:data:`EXPERIMENTS`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "EXPERIMENTS",
    "SCALES",
    "check_scale",
    "load_experiment",
    "load_results",
    "make_config",
    "save_results",
]

SCALES: tuple[str, ...] = ("quick", "paper")

EXPERIMENTS: dict[str, str] = {
    # --- recurrent dynamics (3.1) ---
    "rnn_length": "lnbook.experiments.rnn_length",
    # --- end recurrent dynamics ---
    # --- feed-forward (6.6, 6.7) ---
    "mnist": "lnbook.experiments.mnist",
    "convnet": "lnbook.experiments.convnet",
    # --- end feed-forward ---
    # --- reader, handwriting (6.2, 6.5) ---
    "reader": "lnbook.experiments.reader",
    "handwriting": "lnbook.experiments.handwriting",
    # --- end reader, handwriting ---
    # --- order embeddings, skip-thoughts (6.1, 6.3) ---
    "order_embeddings": "lnbook.experiments.order_embeddings",
    "skip_thoughts": "lnbook.experiments.skip_thoughts",
    # --- end order embeddings, skip-thoughts ---
    # --- draw (6.4) ---
    "draw": "lnbook.experiments.draw",
    # --- end draw ---
}


def check_scale(scale: str) -> str:
    """Return ``scale`` if it is ``"quick"`` or ``"paper"``, else raise ``ValueError``."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    return scale


def make_config(config_cls: type, presets: dict[str, dict[str, Any]], scale: str,
                overrides: dict[str, Any]) -> Any:
    """``config_cls`` built from the ``scale`` preset, with fields replaced by ``overrides``.

    Every experiment's ``get_config`` starts here: an unknown scale or field name raises
    ``ValueError`` naming the valid ones.
    """
    check_scale(scale)
    names = {f.name for f in dataclasses.fields(config_cls)} - {"scale"}
    unknown = set(overrides) - names
    if unknown:
        raise ValueError(f"unknown Config fields {sorted(unknown)}; known: {sorted(names)}")
    return config_cls(scale=scale, **{**presets[scale], **overrides})


def load_experiment(name: str) -> ModuleType:
    """Import the module of experiment ``name`` (a key of :data:`EXPERIMENTS`).

    Raises:
        KeyError: for a name that is not registered; the message lists the known names.
    """
    if name not in EXPERIMENTS:
        known = ", ".join(sorted(EXPERIMENTS)) or "(none)"
        raise KeyError(f"unknown experiment {name!r}; known experiments: {known}")
    return importlib.import_module(EXPERIMENTS[name])


def _jsonable(obj: Any) -> Any:
    """Plain JSON types; non-finite floats become None (strict JSON has no NaN)."""
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item"):  # numpy or torch scalar
        return _jsonable(obj.item())
    raise TypeError(f"cannot save a {type(obj).__name__} as JSON: {obj!r}")


def save_results(results: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``results`` as indented JSON (creating parent folders); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(results), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read results written by :func:`save_results`."""
    return json.loads(Path(path).read_text())
