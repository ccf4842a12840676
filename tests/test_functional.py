"""lnbook.functional: eq. 3 and its variants against float64 references, and the backward of
chapter 3 (with each variant's changes) against autograd through the forward."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lnbook import functional as lf
from lnbook.checks import ShapeError
from lnbook.reference import layer_norm_numpy

F64 = torch.float64


def _x(shape, seed, shift=3.0, scale=2.0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    return (shift + scale * torch.randn(*shape, generator=gen, dtype=F64)).to(dtype)


def _paper(x, eps=0.0, *, center=True, ddof=0, eps_inside=True):
    """Eq. 3 written out in float64 numpy: mu and sigma of each row, then (x - mu) / sigma."""
    a = x.detach().double().numpy()
    h = a.shape[1]
    mu = a.sum(1, keepdims=True) / h if center else np.zeros((a.shape[0], 1))
    sigma2 = ((a - mu) ** 2).sum(1, keepdims=True) / (h - ddof)
    denom = np.sqrt(sigma2 + eps) if eps_inside else np.sqrt(sigma2) + eps
    return torch.from_numpy((a - mu) / denom)


# ------------------------------------------------------------------------------ the forward


@pytest.mark.parametrize("shape", [(1, 2), (5, 7), (3, 64), (2, 1000)])
def test_normalize_is_eq_3_against_the_numpy_references(shape):
    x = _x(shape, 0)
    x_hat, rstd = lf.normalize(x, 1e-5)
    torch.testing.assert_close(x_hat, torch.from_numpy(layer_norm_numpy(x.numpy())),
                               atol=1e-12, rtol=0)
    torch.testing.assert_close(x_hat, _paper(x, 1e-5), atol=1e-12, rtol=0)
    sigma = torch.from_numpy(x.numpy().std(axis=1, keepdims=True))  # numpy: biased, eq. 3
    torch.testing.assert_close(rstd, (sigma**2 + 1e-5).rsqrt(), atol=1e-12, rtol=1e-12)


def test_eq_3_rows_have_mean_0_and_variance_1_and_eq_15_applies_gain_and_bias():
    x = _x((6, 11), 1)
    x_hat, _ = lf.normalize(x, 0.0)  # eps = 0: the paper's sigma exactly
    assert x_hat.mean(1).abs().max() < 1e-14
    torch.testing.assert_close(x_hat.square().mean(1), torch.ones(6, dtype=F64), atol=1e-13,
                               rtol=0)
    g, b = _x((11,), 2, shift=1.0, scale=0.3), _x((11,), 3, shift=0.0)
    y, x_hat2, rstd = lf.layer_norm_forward(x, g, b, 0.0)
    torch.testing.assert_close(y, _paper(x) * g + b, atol=1e-12, rtol=0)  # eq. 15
    assert torch.equal(x_hat2, x_hat) and rstd.shape == (6, 1)
    assert lf.affine(x_hat) is not x_hat  # a new tensor even without gain and bias


def test_layer_norm_is_invariant_to_rescaling_and_recentring_each_row():
    # section 5.1: mu and sigma of eq. 3 move with a per-example scale and shift
    x = _x((4, 9), 4)
    scale, shift = _x((4, 1), 5, shift=3.0, scale=0.5), _x((4, 1), 6, shift=0.0, scale=10.0)
    torch.testing.assert_close(lf.normalize(scale * x + shift, 0.0)[0], lf.normalize(x, 0.0)[0],
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant, reference", [
    ({"unbiased": True}, {"ddof": 1}),
    ({"eps_inside": False}, {"eps_inside": False}),
    ({"center": False}, {"center": False}),
    ({"unbiased": True, "eps_inside": False}, {"ddof": 1, "eps_inside": False}),
    ({"one_pass": True}, {}),
    ({"detach": True}, {}),
])
def test_each_variant_is_its_formula(variant, reference):
    x = _x((5, 8), 7, shift=0.5)
    x_hat, rstd = lf.normalize(x, 0.1, **variant)
    torch.testing.assert_close(x_hat, _paper(x, 0.1, **reference), atol=1e-12, rtol=0)
    centred = x - x.mean(1, keepdim=True) if variant.get("center", True) else x
    torch.testing.assert_close(x_hat / rstd, centred, atol=1e-12, rtol=0)  # rstd: 1 / denom


def test_unbiased_shrinks_every_output_by_sqrt_h_minus_1_over_h():
    x = _x((3, 16), 8)
    ratio = lf.normalize(x, 0.0, unbiased=True)[0] / lf.normalize(x, 0.0)[0]
    torch.testing.assert_close(ratio, torch.full_like(ratio, (15 / 16) ** 0.5))


def test_rms_variant_is_torch_rms_norm():
    x = _x((4, 10), 9)
    torch.testing.assert_close(lf.normalize(x, 1e-6, center=False)[0],
                               torch.nn.functional.rms_norm(x, (10,), eps=1e-6),
                               atol=1e-14, rtol=0)


def test_one_pass_variance_fails_in_float32_at_a_large_mean_and_two_passes_do_not():
    x = _x((16, 512), 10, shift=1e4, scale=1.0)  # float64, spread 1
    ref = _paper(x, 1e-5)
    two = lf.normalize(x.float(), 1e-5)[0]
    one = lf.normalize(x.float(), 1e-5, one_pass=True)[0]
    assert (two.double() - ref).abs().max() < 1e-2
    assert not (one.double() - ref).abs().nan_to_num(float("inf")).max() < 0.1


def test_half_inputs_get_float32_statistics_unless_told():
    x = (300 * torch.randn(4, 64, generator=torch.Generator().manual_seed(11))).half()
    x_hat, rstd = lf.normalize(x)
    assert x_hat.dtype == rstd.dtype == torch.float32
    assert (x_hat.double() - _paper(x, 1e-5)).abs().max() < 1e-5
    x_hat16, _ = lf.normalize(x, stats_dtype=torch.float16)  # x^2 overflows float16
    assert x_hat16.dtype == torch.float16
    assert not (x_hat16.double() - _paper(x, 1e-5)).abs().nan_to_num(float("inf")).max() < 0.1


def test_a_constant_row_gives_exactly_zero_and_the_input_is_never_written_over():
    x = _x((3, 8), 12)
    x[1] = 7.0
    before = x.clone()
    for kw in ({}, {"center": False}, {"one_pass": True}, {"detach": True}):
        with torch.no_grad():
            x_hat, _ = lf.normalize(x, 1e-5, **kw)
        assert torch.equal(x, before), kw
    assert torch.equal(lf.normalize(x, 1e-5)[0][1], torch.zeros(8, dtype=F64))


def test_detach_keeps_the_values_and_drops_the_statistics_from_the_graph():
    x = _x((3, 6), 13).requires_grad_()
    up = _x((3, 6), 14, shift=0.0)
    full, _ = lf.normalize(x, 1e-5)
    cut, _ = lf.normalize(x, 1e-5, detach=True)
    torch.testing.assert_close(cut, full, atol=1e-15, rtol=0)
    (g_cut,) = torch.autograd.grad((cut * up).sum(), x)
    rstd = lf.normalize(x.detach(), 1e-5)[1]
    torch.testing.assert_close(g_cut, up * rstd)  # u / sigma: no projections


# ----------------------------------------------------------------------------- the backward

_VARIANTS = [
    {},
    {"unbiased": True},
    {"eps_inside": False},
    {"center": False},
    {"detach": True},
    {"center": False, "eps_inside": False},
    {"unbiased": True, "eps_inside": False},
]


@pytest.mark.parametrize("variant", _VARIANTS, ids=lambda v: ",".join(v) or "paper")
@pytest.mark.parametrize("affine", [False, True])
def test_manual_backward_equals_autograd_through_the_forward(variant, affine):
    eps = 0.05  # large enough that eps inside or outside matters
    x = _x((5, 12), 15, shift=0.5, scale=0.4).requires_grad_()
    g = _x((12,), 16, shift=1.0, scale=0.3).requires_grad_() if affine else None
    b = _x((12,), 17, shift=0.0).requires_grad_() if affine else None
    dy = _x((5, 12), 18, shift=0.0)
    y, x_hat, rstd = lf.layer_norm_forward(x, g, b, eps, **variant)
    inputs = [t for t in (x, g, b) if t is not None]
    want = torch.autograd.grad((y * dy).sum(), inputs)
    back = {k: v for k, v in variant.items()}
    if variant.get("eps_inside") is False:
        back["eps"] = eps
    dx, dg, db = lf.layer_norm_backward(dy, x_hat.detach(), rstd.detach(),
                                        None if g is None else g.detach(), **back)
    torch.testing.assert_close(dx, want[0], atol=1e-12, rtol=0)
    dx_only, none_g, none_b = lf.layer_norm_backward(  # the hand BPTT's path: dL/dx alone
        dy, x_hat.detach(), rstd.detach(), None if g is None else g.detach(), params=False,
        **back)
    torch.testing.assert_close(dx_only, want[0], atol=1e-12, rtol=0)
    assert none_g is None and none_b is None
    if affine:
        torch.testing.assert_close(dg, want[1], atol=1e-12, rtol=0)
        torch.testing.assert_close(db, want[2], atol=1e-12, rtol=0)


def test_one_pass_has_the_same_backward_in_exact_arithmetic():
    x = _x((4, 7), 19).requires_grad_()
    dy = _x((4, 7), 20, shift=0.0)
    x_hat, rstd = lf.normalize(x, 1e-5, one_pass=True)
    (want,) = torch.autograd.grad((x_hat * dy).sum(), x)
    dx, _, _ = lf.layer_norm_backward(dy, x_hat.detach(), rstd.detach())
    torch.testing.assert_close(dx, want, atol=1e-11, rtol=0)


def test_backward_rows_sum_to_zero_and_are_orthogonal_to_x_hat():
    # chapter 3: the gradient has no component along 1 nor along x_hat (eps = 0)
    x, dy, g = _x((6, 10), 21), _x((6, 10), 22, shift=0.0), _x((10,), 23, shift=1.0)
    x_hat, rstd = lf.normalize(x, 0.0)
    dx, _, _ = lf.layer_norm_backward(dy, x_hat, rstd, g)
    assert dx.sum(1).abs().max() < 1e-12 and (dx * x_hat).sum(1).abs().max() < 1e-12
    dx_params_off, dg, db = lf.layer_norm_backward(dy, x_hat, rstd, g, params=False)
    assert dg is None and db is None
    torch.testing.assert_close(dx_params_off, dx, atol=1e-13, rtol=0)


def test_backward_is_differentiable_again_as_autograd_double_backward():
    # the backward recomputed from x inside a graph: its derivative is torch's second derivative
    x = _x((3, 8), 24).requires_grad_()
    g = _x((8,), 25, shift=1.0, scale=0.3).requires_grad_()
    dy, v = _x((3, 8), 26, shift=0.0), _x((3, 8), 27, shift=0.0)
    x_hat, rstd = lf.normalize(x, 1e-5)
    dx, _, _ = lf.layer_norm_backward(dy, x_hat, rstd, g)
    mine = torch.autograd.grad((dx * v).sum(), (x, g))
    y = torch.nn.functional.layer_norm(x, (8,), g, None, 1e-5)
    (gx,) = torch.autograd.grad((y * dy).sum(), x, create_graph=True)
    want = torch.autograd.grad((gx * v).sum(), (x, g))
    for m, w in zip(mine, want, strict=True):
        torch.testing.assert_close(m, w, atol=1e-11, rtol=0)


# ------------------------------------------------------------------------------------ rows


@pytest.mark.parametrize("shape, dims", [
    ((2, 3, 5), -1), ((2, 3, 5), (1, 2)), ((2, 3, 5), (0,)), ((2, 3, 5), (0, 1, 2)),
    ((2, 3, 5), (0, 2)), ((4,), 0),
])
def test_as_rows_and_from_rows_round_trip_and_put_the_normalized_dims_in_a_row(shape, dims):
    x = torch.arange(int(np.prod(shape)), dtype=F64).reshape(shape)
    rows = lf.as_rows(x, dims)
    axes = [dims] if isinstance(dims, int) else list(dims)
    d = int(np.prod([shape[a] for a in axes]))
    assert rows.shape == (x.numel() // d, d)
    assert torch.equal(lf.from_rows(rows, x.shape, dims), x)
    # one row holds what one set of statistics covers: normalizing rows = normalizing over dims
    ref = (x - x.mean(dim=dims, keepdim=True)) / x.std(dim=dims, unbiased=False, keepdim=True)
    got = lf.from_rows(lf.normalize(rows, 0.0)[0], x.shape, dims)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ShapeError, match=r"rows \(R, D\)"):
        lf.normalize(torch.zeros(2, 3, 4))
    with pytest.raises(TypeError):
        lf.normalize(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ShapeError, match="D >= 2"):
        lf.normalize(torch.zeros(3, 1), unbiased=True)
    with pytest.raises(ShapeError, match="distinct axes"):
        lf.as_rows(torch.zeros(2, 3), (1, -1))
    with pytest.raises(ShapeError, match="distinct axes"):
        lf.as_rows(torch.zeros(2, 3), 2)


def test_every_combination_of_keywords_runs():
    x = _x((3, 5), 28)
    for c, u, e, o, d in itertools.product([False, True], repeat=5):
        x_hat, rstd = lf.normalize(x, 1e-3, center=c, unbiased=u, eps_inside=e, one_pass=o,
                                   detach=d)
        assert x_hat.shape == (3, 5) and rstd.shape == (3, 1) and x_hat.isfinite().all()
