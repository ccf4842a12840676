"""The two scales of every experiment (``quick``: a laptop CPU, what the book shows;
``paper``: the paper's sizes) and :func:`make_config`, which builds a config from a preset."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from lnbook.checks import check_choice

__all__ = ["SCALES", "check_scale", "make_config"]

SCALES: tuple[str, ...] = ("quick", "paper")


def check_scale(scale: str) -> str:
    """Return ``scale`` if it is ``"quick"`` or ``"paper"``, else raise ``ValueError``."""
    return check_choice("scale", scale, SCALES)


def make_config(config_cls: type, presets: Mapping[str, Mapping[str, Any]], scale: str,
                overrides: Mapping[str, Any]) -> Any:
    """``config_cls`` from the ``scale`` preset with ``overrides``; ``ValueError`` naming the
    valid scales or fields."""
    check_scale(scale)
    names = {f.name for f in dataclasses.fields(config_cls)} - {"scale"}
    unknown = set(overrides) - names
    if unknown:
        raise ValueError(f"unknown Config fields {sorted(unknown)}; known: {sorted(names)}")
    return config_cls(scale=scale, **{**presets[scale], **overrides})
