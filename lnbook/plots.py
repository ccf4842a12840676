"""Plots for the chapters: learning curves over seeds (:func:`plot_runs`) and which summed
inputs batch (eq. 2) and layer (eq. 3) normalization average over (:func:`statistics_mask`).
"""

from __future__ import annotations

import numbers
from typing import Literal

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from lnbook.checks import check_choice, check_size
from lnbook.engine.results import Results

__all__ = ["plot_runs", "statistics_mask", "plot_normalization_axes"]

_Method = Literal["batch", "layer"]


def statistics_mask(method: _Method, batch: int, units: int, example: int = 0,
                    unit: int = 0) -> np.ndarray:
    """Which summed inputs a_i^n share their mean and sigma with cell (example, unit), a bool
    ``(batch, units)`` array: column ``unit`` for ``"batch"`` (eq. 2), row ``example`` for
    ``"layer"`` (eq. 3).
    """
    check_choice("method", method, ("batch", "layer"))
    batch = check_size("batch", batch)
    units = check_size("units", units)
    if not (isinstance(example, numbers.Integral) and 0 <= example < batch):
        raise ValueError(f"example must be an int in [0, {batch}), got {example!r}")
    if not (isinstance(unit, numbers.Integral) and 0 <= unit < units):
        raise ValueError(f"unit must be an int in [0, {units}), got {unit!r}")
    mask = np.zeros((batch, units), dtype=bool)  # (N, H)
    if method == "batch":
        mask[:, unit] = True
    else:
        mask[example, :] = True
    return mask


def plot_normalization_axes(batch: int = 6, units: int = 8, example: int = 2, unit: int = 3,
                            axes=None):
    """Draw :func:`statistics_mask` of BN and LN side by side (on two ``axes``, or a new
    figure) for the outlined cell (example, unit); returns the figure."""
    masks = {m: statistics_mask(m, batch, units, example, unit) for m in ("batch", "layer")}
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    elif len(axes) != 2:
        raise ValueError(f"axes must hold two matplotlib axes, got {len(axes)}")
    fig = axes[0].figure
    styles = {"batch": ("tab:blue", "Batch normalization (eq. 2):\none unit over the mini-batch"),
              "layer": ("tab:orange", "Layer normalization (eq. 3):\none example over the units")}
    for ax, method in zip(axes, ("batch", "layer"), strict=True):
        mask = masks[method]
        color, title = styles[method]
        for n in range(batch):
            for i in range(units):
                face = color if mask[n, i] else "white"
                ax.add_patch(Rectangle((i, n), 1, 1, facecolor=face, edgecolor="0.6", alpha=0.8))
        ax.add_patch(Rectangle((unit, example), 1, 1, fill=False, edgecolor="black", lw=2.5))
        ax.set(xlim=(0, units), ylim=(batch, 0), aspect="equal", xlabel="hidden unit i (1 to H)",
               ylabel="training case n in the mini-batch")
        ax.set_xticks(np.arange(units) + 0.5, [str(i + 1) for i in range(units)])
        ax.set_yticks(np.arange(batch) + 0.5, [str(n + 1) for n in range(batch)])
        ax.set_title(title, fontsize=10)
        ax.plot([], [], "s", color=color, label="cells that give mu and sigma")
        ax.plot([], [], "s", mfc="none", mec="black", label="the cell being normalized")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8, ncol=1)
    return fig


def plot_runs(results: Results, metric: str, ax,
              variants: list[str] | tuple[str, ...] | None = None,
              labels: dict[str, str] | None = None, band: bool = True) -> None:
    """Draw ``metric`` against updates for each variant: the mean over seeds and a min-max band.

    ``metric`` is a key the evaluation recorded or ``"loss"``; ``variants`` (default: all)
    in order, ``labels`` their legend text; the caller sets the y label.
    """
    labels = labels or {}
    for v in variants or results.variants:
        steps, values = results.curves(v, metric)  # (E,), (seeds, E)
        (line,) = ax.plot(steps, values.mean(0), label=labels.get(v, v))
        if band and len(values) > 1:
            ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(),
                            alpha=0.2)
    ax.set_xlabel("updates")
    ax.grid(alpha=0.3)
