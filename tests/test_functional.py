"""lnbook.functional: eq. 3 and its variants against float64 references, and the backward of
chapter 3 (with each variant's changes) against autograd through the forward."""

from __future__ import annotations

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


VARIANTS = [lf.normalize, lf.rms_normalize, lf.normalize_unbiased, lf.normalize_eps_outside,
            lf.normalize_one_pass, lf.normalize_in_input_dtype, lf.normalize_detached]
_REFERENCES = {  # the keywords of _paper that give each variant's formula
    lf.normalize: {}, lf.rms_normalize: {"center": False}, lf.normalize_unbiased: {"ddof": 1},
    lf.normalize_eps_outside: {"eps_inside": False}, lf.normalize_one_pass: {},
    lf.normalize_in_input_dtype: {}, lf.normalize_detached: {},
}


@pytest.mark.parametrize("fn", VARIANTS, ids=lambda f: f.__name__)
def test_each_variant_is_its_formula(fn):
    x = _x((5, 8), 7, shift=0.5)
    x_hat, rstd = fn(x, 0.1)
    reference = _REFERENCES[fn]
    torch.testing.assert_close(x_hat, _paper(x, 0.1, **reference), atol=1e-12, rtol=0)
    centred = x - x.mean(1, keepdim=True) if reference.get("center", True) else x
    torch.testing.assert_close(x_hat / rstd, centred, atol=1e-12, rtol=0)  # rstd: 1 / denom


# eq. 3 and each variant on three float32 rows, eps = 0.25, to one float32 ulp: the values of
# the one function with six keywords that these functions replaced (lnbook 0.x). On the last row,
# a mean 4097 with variance 1.297, the one-pass variance cancels to 0 (rstd 2 = 1 / sqrt(eps)).
_ROWS = [[1.0, 2.0, 3.0, 5.0], [10.0, 0.5, -10.0, 4.0], [4096.0, 4097.0, 4099.0, 4096.5]]
_GOLDEN = {  # (x_hat, rstd)
    lf.normalize: (
        [[-1.1208970546722412, -0.4803844392299652, 0.1601281464099884, 1.4411532878875732],
         [1.2185362577438354, -0.08581241965293884, -1.527461051940918, 0.3947371244430542],
         [-0.904534101486206, -0.10050378739833832, 1.5075567960739136, -0.5025189518928528]],
        [0.6405125856399536, 0.13729986548423767, 0.8040302991867065]),
    lf.rms_normalize: (
        [[0.3162277638912201, 0.6324555277824402, 0.9486832618713379, 1.5811388492584229],
         [1.3569070100784302, 0.06784535199403763, -1.3569070100784302, 0.542762815952301],
         [0.9997254014015198, 0.999969482421875, 1.0004576444625854, 0.999847412109375]],
        [0.3162277638912201, 0.13569070398807526, 0.00024407358432654291]),
    lf.normalize_unbiased: (
        [[-0.9834150671958923, -0.42146360874176025, 0.14048786461353302, 1.2643908262252808],
         [1.0559055805206299, -0.07435954362154007, -1.323599934577942, 0.34205392003059387],
         [-0.7996710538864136, -0.08885233849287033, 1.3327851295471191, -0.44426169991493225]],
        [0.5619514584541321, 0.11897527426481247, 0.7108187079429626]),
    lf.normalize_eps_outside: (
        [[-1.0121339559555054, -0.4337717294692993, 0.1445905715227127, 1.301315188407898],
         [1.1807913780212402, -0.08315432071685791, -1.480146884918213, 0.38250985741615295],
         [-0.8100494146347046, -0.09000548720359802, 1.350082278251648, -0.4500274360179901]],
        [0.5783622860908508, 0.13304691016674042, 0.7200438976287842]),
    lf.normalize_one_pass: (
        [[-1.1208971738815308, -0.4803844690322876, 0.1601281613111496, 1.4411534070968628],
         [1.2185362577438354, -0.08581241965293884, -1.527461051940918, 0.3947371244430542],
         [-2.25, -0.25, 3.75, -1.25]],
        [0.6405126452445984, 0.13729986548423767, 2.0]),
}
_GOLDEN[lf.normalize_detached] = _GOLDEN[lf.normalize_in_input_dtype] = _GOLDEN[lf.normalize]


@pytest.mark.parametrize("fn", VARIANTS, ids=lambda f: f.__name__)
def test_each_variant_keeps_the_values_of_the_keyword_function_it_replaced(fn):
    x_hat, rstd = fn(torch.tensor(_ROWS), 0.25)
    want_x_hat, want_rstd = _GOLDEN[fn]
    ulp = torch.finfo(torch.float32).eps
    torch.testing.assert_close(x_hat, torch.tensor(want_x_hat), atol=0, rtol=ulp)
    torch.testing.assert_close(rstd, torch.tensor(want_rstd)[:, None], atol=0, rtol=ulp)


def test_unbiased_shrinks_every_output_by_sqrt_h_minus_1_over_h():
    x = _x((3, 16), 8)
    ratio = lf.normalize_unbiased(x, 0.0)[0] / lf.normalize(x, 0.0)[0]
    torch.testing.assert_close(ratio, torch.full_like(ratio, (15 / 16) ** 0.5))


def test_rms_variant_is_torch_rms_norm():
    x = _x((4, 10), 9)
    torch.testing.assert_close(lf.rms_normalize(x, 1e-6)[0],
                               torch.nn.functional.rms_norm(x, (10,), eps=1e-6),
                               atol=1e-14, rtol=0)


def test_one_pass_variance_fails_in_float32_at_a_large_mean_and_two_passes_do_not():
    x = _x((16, 512), 10, shift=1e4, scale=1.0)  # float64, spread 1
    ref = _paper(x, 1e-5)
    two = lf.normalize(x.float(), 1e-5)[0]
    one = lf.normalize_one_pass(x.float(), 1e-5)[0]
    assert (two.double() - ref).abs().max() < 1e-2
    assert not (one.double() - ref).abs().nan_to_num(float("inf")).max() < 0.1


def test_half_inputs_get_float32_statistics_unless_told():
    x = (300 * torch.randn(4, 64, generator=torch.Generator().manual_seed(11))).half()
    x_hat, rstd = lf.normalize(x)
    assert x_hat.dtype == rstd.dtype == torch.float32
    assert (x_hat.double() - _paper(x, 1e-5)).abs().max() < 1e-5
    x_hat16, _ = lf.normalize_in_input_dtype(x)  # x^2 overflows float16
    assert x_hat16.dtype == torch.float16
    assert not (x_hat16.double() - _paper(x, 1e-5)).abs().nan_to_num(float("inf")).max() < 0.1
    assert [lf.statistics_dtype(d) for d in (torch.float16, torch.bfloat16, F64)] == [
        torch.float32, torch.float32, F64]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, F64])
@pytest.mark.parametrize("fn", VARIANTS, ids=lambda f: f.__name__)
def test_every_variant_computes_in_the_statistics_dtype_and_keeps_its_input(fn, dtype):
    x = _x((3, 8), 12, dtype=dtype)
    x[1] = 7.0
    before = x.clone()
    for grad in (False, True):  # in place on its own temporaries only when no graph is kept
        with torch.set_grad_enabled(grad):
            x_hat, rstd = fn(x, 1e-5)
        assert torch.equal(x, before)
    want = dtype if fn is lf.normalize_in_input_dtype else lf.statistics_dtype(dtype)
    assert x_hat.dtype == rstd.dtype == want and rstd.shape == (3, 1)
    assert x_hat.isfinite().all()
    if fn is not lf.rms_normalize:  # a constant row gives exactly 0
        assert torch.equal(x_hat[1], torch.zeros(8, dtype=want))


def test_detach_keeps_the_values_and_drops_the_statistics_from_the_graph():
    x = _x((3, 6), 13).requires_grad_()
    up = _x((3, 6), 14, shift=0.0)
    full, _ = lf.normalize(x, 1e-5)
    cut, _ = lf.normalize_detached(x, 1e-5)
    torch.testing.assert_close(cut, full, atol=1e-15, rtol=0)
    (g_cut,) = torch.autograd.grad((cut * up).sum(), x)
    rstd = lf.normalize(x.detach(), 1e-5)[1]
    torch.testing.assert_close(g_cut, up * rstd)  # u / sigma: no projections


# ----------------------------------------------------------------------------- the backward

def _rms_eps_outside(x, eps):  # two changed steps: no centring, eps outside the root
    var = lf.sum_of_squares(x) / x.shape[1]
    rstd = (var.sqrt() + eps).reciprocal()
    return x * rstd, rstd


def _unbiased_eps_outside(x, eps):  # the Annotated Transformer's layer norm
    xc = lf.centre(x)
    var = lf.sum_of_squares(xc) / (x.shape[1] - 1)
    rstd = (var.sqrt() + eps).reciprocal()
    return xc * rstd, rstd


_BACKWARDS = [  # (the forward, the keywords of its backward)
    (lf.normalize, {}),
    (lf.normalize_unbiased, {"unbiased": True}),
    (lf.normalize_eps_outside, {"eps_inside": False}),
    (lf.rms_normalize, {"center": False}),
    (lf.normalize_detached, {"detach": True}),
    (_rms_eps_outside, {"center": False, "eps_inside": False}),
    (_unbiased_eps_outside, {"unbiased": True, "eps_inside": False}),
]


@pytest.mark.parametrize("forward, variant", _BACKWARDS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("affine", [False, True])
def test_manual_backward_equals_autograd_through_the_forward(forward, variant, affine):
    eps = 0.05  # large enough that eps inside or outside matters
    x = _x((5, 12), 15, shift=0.5, scale=0.4).requires_grad_()
    g = _x((12,), 16, shift=1.0, scale=0.3).requires_grad_() if affine else None
    b = _x((12,), 17, shift=0.0).requires_grad_() if affine else None
    dy = _x((5, 12), 18, shift=0.0)
    x_hat, rstd = forward(x, eps)
    y = lf.affine(x_hat, g, b)
    inputs = [t for t in (x, g, b) if t is not None]
    want = torch.autograd.grad((y * dy).sum(), inputs)
    back = {k: v for k, v in variant.items()}
    if variant.get("eps_inside") is False:
        back["eps"] = eps
    x_hat, rstd = x_hat.detach(), rstd.detach()
    dx, dg, db = lf.layer_norm_backward(dy, x_hat, rstd, None if g is None else g.detach(), **back)
    torch.testing.assert_close(dx, want[0], atol=1e-12, rtol=0)
    dx_only, none_g, none_b = lf.layer_norm_backward(  # the hand BPTT's path: dL/dx alone
        dy, x_hat, rstd, None if g is None else g.detach(), params=False, **back)
    torch.testing.assert_close(dx_only, want[0], atol=1e-12, rtol=0)
    assert none_g is None and none_b is None
    if affine:
        torch.testing.assert_close(dg, want[1], atol=1e-12, rtol=0)
        torch.testing.assert_close(db, want[2], atol=1e-12, rtol=0)


def test_one_pass_has_the_same_backward_in_exact_arithmetic():
    x = _x((4, 7), 19).requires_grad_()
    dy = _x((4, 7), 20, shift=0.0)
    x_hat, rstd = lf.normalize_one_pass(x, 1e-5)
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
        lf.normalize_unbiased(torch.zeros(3, 1))
    for fn in VARIANTS:
        with pytest.raises(ShapeError, match=r"rows \(R, D\)"):
            fn(torch.zeros(4))
    with pytest.raises(ShapeError, match="distinct axes"):
        lf.as_rows(torch.zeros(2, 3), (1, -1))
    with pytest.raises(ShapeError, match="distinct axes"):
        lf.as_rows(torch.zeros(2, 3), 2)
