"""Tests for lnbook.plots: the statistics masks match what BatchNorm and layer_norm compute."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from lnbook import BatchNorm, layer_norm  # noqa: E402
from lnbook.plots import plot_normalization_axes, statistics_mask  # noqa: E402


def _normalize_cell(x: np.ndarray, mask: np.ndarray, n: int, i: int, eps: float) -> float:
    vals = x[mask]
    return (x[n, i] - vals.mean()) / np.sqrt(vals.var() + eps)


@pytest.mark.parametrize("n,i", [(0, 0), (2, 3), (4, 6)])
def test_masks_give_the_statistics_bn_and_ln_use(n: int, i: int) -> None:
    gen = torch.Generator().manual_seed(n * 10 + i)
    x = torch.randn(5, 7, generator=gen, dtype=torch.float64) * 3 + 1  # (N, H)
    eps = 1e-5
    bn = BatchNorm(7, eps=eps).double().train()
    y_bn = bn(x).detach().numpy()
    y_ln = layer_norm(x, 7, eps=eps).numpy()
    xn = x.numpy()
    bn_cell = _normalize_cell(xn, statistics_mask("batch", 5, 7, n, i), n, i, eps)
    ln_cell = _normalize_cell(xn, statistics_mask("layer", 5, 7, n, i), n, i, eps)
    assert abs(bn_cell - y_bn[n, i]) < 1e-12
    assert abs(ln_cell - y_ln[n, i]) < 1e-12
    # the two readings differ: BN's column is not LN's row
    assert abs(bn_cell - ln_cell) > 1e-6


def test_mask_shapes_and_counts() -> None:
    m_bn = statistics_mask("batch", 4, 9, example=1, unit=5)
    m_ln = statistics_mask("layer", 4, 9, example=1, unit=5)
    assert m_bn.shape == m_ln.shape == (4, 9)
    assert m_bn.sum() == 4 and m_bn[:, 5].all()
    assert m_ln.sum() == 9 and m_ln[1, :].all()
    assert m_bn[1, 5] and m_ln[1, 5]


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"method": "group", "batch": 2, "units": 2}, ValueError, "method must be"),
        ({"method": "layer", "batch": 0, "units": 2}, ValueError, "batch must be a positive int"),
        ({"method": "layer", "batch": 2, "units": 2.5}, TypeError, "units must be a positive int"),
        ({"method": "layer", "batch": True, "units": 2}, TypeError, "batch must be a positive int"),
        ({"method": "layer", "batch": 2, "units": 2, "example": 2}, ValueError,
         r"example must be .*\[0, 2\)"),
        ({"method": "batch", "batch": 2, "units": 3, "unit": -1}, ValueError,
         r"unit must be .*\[0, 3\)"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        statistics_mask(**kwargs)


def test_plot_shades_the_right_cells() -> None:
    fig = plot_normalization_axes(batch=3, units=5, example=1, unit=2)
    try:
        ax_bn, ax_ln = fig.axes[:2]
        assert "Batch" in ax_bn.get_title() and "Layer" in ax_ln.get_title()

        def shaded(ax) -> int:
            return sum(1 for p in ax.patches if p.get_fill() and p.get_facecolor()[:3] != (1, 1, 1))

        assert shaded(ax_bn) == 3  # one column of 3 examples
        assert shaded(ax_ln) == 5  # one row of 5 units
        assert ax_bn.get_xlabel() and ax_bn.get_ylabel()
    finally:
        plt.close(fig)


def test_plot_rejects_wrong_number_of_axes() -> None:
    fig, ax = plt.subplots()
    try:
        with pytest.raises(ValueError, match="two matplotlib axes"):
            plot_normalization_axes(axes=[ax])
    finally:
        plt.close(fig)
