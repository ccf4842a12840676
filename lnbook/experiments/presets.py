"""The two scales of every experiment, and how a config is built from a preset.

Every experiment's ``get_config(scale, **overrides)`` calls :func:`make_config` with its
``Config`` dataclass and its two presets: ``quick`` (small, runs in under a minute on a laptop
CPU: what the book shows and the tests assert) and ``paper`` (the paper's sizes, for a GPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["SCALES", "check_scale", "make_config"]

SCALES: tuple[str, ...] = ("quick", "paper")


def check_scale(scale: str) -> str:
    """Return ``scale`` if it is ``"quick"`` or ``"paper"``, else raise ``ValueError``."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    return scale


def make_config(config_cls: type, presets: Mapping[str, Mapping[str, Any]], scale: str,
                overrides: Mapping[str, Any]) -> Any:
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
