"""Plotting helpers for the book's chapters.

:func:`plot_runs` draws the learning curves of any experiment's results (chapters 3.1, 6.x,
Part II): the mean over seeds and the band from the lowest to the highest seed.

The picture of which summed inputs share their normalization statistics: batch normalization
(paper eq. 2) averages one unit over the mini-batch, layer normalization (paper eq. 3) averages
one example over the units of its layer. :func:`statistics_mask` says which cells of a
(batch, units) array of summed inputs enter the mean and standard deviation used for a given
cell; :func:`plot_normalization_axes` draws those masks side by side.
"""

from __future__ import annotations

import numbers
from typing import Literal

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from lnbook.checks import check_size
from lnbook.experiments.results import Results

__all__ = ["plot_runs", "statistics_mask", "plot_normalization_axes"]

_Method = Literal["batch", "layer"]


def statistics_mask(
    method: _Method, batch: int, units: int, example: int = 0, unit: int = 0
) -> np.ndarray:
    """Which summed inputs a_i^n share their mean and sigma with cell (example, unit).

    For ``method="batch"`` (eq. 2, estimated on the mini-batch) that is the whole column
    ``unit``: the same hidden unit over all examples of the batch. For ``method="layer"``
    (eq. 3) it is the whole row ``example``: all hidden units of the layer for that one
    example.

    Args:
        method: ``"batch"`` or ``"layer"``.
        batch: number of examples N in the mini-batch (rows).
        units: number of hidden units H in the layer (columns).
        example: the row of the cell, in ``[0, batch)``.
        unit: the column of the cell, in ``[0, units)``.

    Returns:
        A boolean array of shape ``(batch, units)``.

    Example::

        >>> statistics_mask("layer", 3, 4, example=1).sum()
        4
    """
    batch = check_size("batch", batch)
    units = check_size("units", units)
    if not (isinstance(example, numbers.Integral) and 0 <= example < batch):
        raise ValueError(f"example must be an int in [0, {batch}), got {example!r}")
    if not (isinstance(unit, numbers.Integral) and 0 <= unit < units):
        raise ValueError(f"unit must be an int in [0, {units}), got {unit!r}")
    mask = np.zeros((batch, units), dtype=bool)  # (N, H)
    if method == "batch":
        mask[:, unit] = True
    elif method == "layer":
        mask[example, :] = True
    else:
        raise ValueError(f"method must be 'batch' or 'layer', got {method!r}")
    return mask


def plot_normalization_axes(
    batch: int = 6, units: int = 8, example: int = 2, unit: int = 3, axes=None
):
    """Draw which summed inputs BN (eq. 2) and LN (eq. 3) average over, side by side.

    Each panel is a grid of summed inputs, one row per example of the mini-batch and one
    column per hidden unit. The shaded cells are those whose mean and standard deviation
    normalize the outlined cell (example, unit).

    Args:
        batch: number of examples (rows).
        units: number of hidden units (columns).
        example: row of the outlined cell.
        unit: column of the outlined cell.
        axes: two matplotlib axes to draw on, or None to make a new figure.

    Returns:
        The matplotlib figure.

    Example::

        >>> fig = plot_normalization_axes()
    """
    masks = {
        "batch": statistics_mask("batch", batch, units, example, unit),
        "layer": statistics_mask("layer", batch, units, example, unit),
    }
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    else:
        if len(axes) != 2:
            raise ValueError(f"axes must hold two matplotlib axes, got {len(axes)}")
        fig = axes[0].figure
    titles = {
        "batch": "Batch normalization (eq. 2):\none unit over the mini-batch",
        "layer": "Layer normalization (eq. 3):\none example over the units",
    }
    colors = {"batch": "tab:blue", "layer": "tab:orange"}
    for ax, method in zip(axes, ("batch", "layer"), strict=True):
        mask = masks[method]
        for n in range(batch):
            for i in range(units):
                face = colors[method] if mask[n, i] else "white"
                ax.add_patch(Rectangle((i, n), 1, 1, facecolor=face, edgecolor="0.6", alpha=0.8))
        ax.add_patch(Rectangle((unit, example), 1, 1, fill=False, edgecolor="black", lw=2.5))
        ax.set_xlim(0, units)
        ax.set_ylim(batch, 0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(units) + 0.5, [str(i + 1) for i in range(units)])
        ax.set_yticks(np.arange(batch) + 0.5, [str(n + 1) for n in range(batch)])
        ax.set_xlabel("hidden unit i (1 to H)")
        ax.set_ylabel("training case n in the mini-batch")
        ax.set_title(titles[method], fontsize=10)
        ax.plot([], [], "s", color=colors[method], label="cells that give mu and sigma")
        ax.plot([], [], "s", mfc="none", mec="black", label="the cell being normalized")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8, ncol=1)
    return fig


def plot_runs(
    results: Results,
    metric: str,
    ax,
    variants: list[str] | tuple[str, ...] | None = None,
    labels: dict[str, str] | None = None,
    band: bool = True,
) -> None:
    """Draw ``metric`` against updates for each variant: the mean over seeds and a min-max band.

    Args:
        results: what an experiment's ``run`` returned (:class:`lnbook.experiments.Results`).
        metric: a key the evaluation recorded, or ``"loss"`` for the training loss per update.
        ax: the matplotlib axes to draw on (the caller sets the y label, with its unit).
        variants: which variants, in this order (default: all, in training order).
        labels: legend text per variant (default: the variant's name).
        band: shade the range between the lowest and the highest seed.

    Example::

        >>> fig, ax = plt.subplots()  # doctest: +SKIP
        >>> plot_runs(results, "test_error", ax)  # doctest: +SKIP
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
