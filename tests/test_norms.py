"""lnbook.norms against torch, float64 references and the paper's equations (eqs. 2, 3, 5).

Also: torch.func, torch.compile and torch.export on the hand-derived backward, the shared input
checks, and ChannelLayerNorm (section 6.7).
"""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, grad_and_value, jacrev, jvp, vmap

import lnbook
from lnbook import (
    BatchNorm,
    ChannelLayerNorm,
    LayerNorm,
    WeightNormLinear,
    functional,
    layer_norm,
    norms,
)
from lnbook.reference import layer_norm_numpy

SHAPES = [  # (input shape, normalized_shape): over 1, 2 and 3 trailing dims, odd sizes
    ((7, 13), (13,)),
    ((3, 5, 11), (11,)),
    ((4, 6, 9), (6, 9)),
    ((2, 3, 4, 5), (3, 4, 5)),
    ((1, 17), (17,)),  # batch size 1
]


def _params(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (1 + 0.5 * torch.randn(shape, generator=g)).to(dtype)
    b = (0.3 * torch.randn(shape, generator=g)).to(dtype)
    return w, b


@pytest.mark.parametrize("xshape,nshape", SHAPES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_layer_norm_matches_torch_forward_and_gradients(xshape, nshape, dtype, tol):
    torch.manual_seed(0)
    x = (3 * torch.randn(xshape, dtype=dtype) + 2).requires_grad_()
    w, b = _params(nshape, dtype)
    w.requires_grad_(), b.requires_grad_()
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, b))

    y = layer_norm(x, nshape, w, b)
    y_ref = F.layer_norm(x2, nshape, w2, b2, 1e-5)
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=0)

    gy = torch.randn_like(y)
    y.backward(gy)
    y_ref.backward(gy)
    for ours, theirs in ((x, x2), (w, w2), (b, b2)):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=tol * 10, rtol=tol * 10)


def test_layer_norm_matches_numpy_reference_and_equation_3():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 8)) * 4 + 1
    w, b = rng.normal(size=8), rng.normal(size=8)
    ref = layer_norm_numpy(x, w, b, eps=1e-5)
    ours = layer_norm(torch.from_numpy(x), 8, torch.from_numpy(w), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-12)
    # eq. 3 by hand for one row: mu and sigma over the H = 8 units of that row alone
    a = x[2]
    mu = a.sum() / 8
    sigma = np.sqrt(((a - mu) ** 2).sum() / 8 + 1e-5)
    np.testing.assert_allclose(ours[2], w / sigma * (a - mu) + b, atol=1e-12)


def test_numpy_reference_without_gain_normalizes_last_axis():
    y = layer_norm_numpy(np.array([[1.0, 2.0, 3.0], [10.0, 10.0, 40.0]]), eps=0.0)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1, atol=1e-12)


def test_gradcheck_and_gradgradcheck_float64():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    w, b = _params((4, 5), torch.float64)
    w.requires_grad_(), b.requires_grad_()

    def f(x, w, b):
        return layer_norm(x, (4, 5), w, b)

    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))
    assert torch.autograd.gradcheck(lambda x: layer_norm(x, 5), (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computes_statistics_in_float32(dtype):
    torch.manual_seed(0)
    # values near the float16 maximum: E[x^2] alone would overflow float16
    x32 = torch.randn(16, 64) * 3000 + 20000
    x = x32.to(dtype)
    w, b = _params((64,), torch.float32)
    y = layer_norm(x, 64, w.to(dtype), b.to(dtype))
    assert y.dtype == dtype
    assert torch.isfinite(y).all()
    ref = F.layer_norm(x.double(), (64,), w.to(dtype).double(), b.to(dtype).double())
    # one rounding of the output to the half type, nothing worse
    torch.testing.assert_close(y.double(), ref, atol=0.05 if dtype == torch.bfloat16 else 0.01,
                               rtol=0)
    x.requires_grad_()
    layer_norm(x, 64).sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


def test_large_mean_is_stable_in_float32():
    # E[x^2] - E[x]^2 in float32 loses every digit of a variance of 1 at a mean of 1e4
    torch.manual_seed(0)
    x32 = (torch.randn(64, 256, dtype=torch.float64) + 1e4).float()
    x64 = x32.double()  # the same numbers, exactly
    y = layer_norm(x32, 256)
    ref = F.layer_norm(x64, (256,))
    assert (y.double() - ref).abs().max() < 1e-4
    torch_err = (F.layer_norm(x32, (256,)).double() - ref).abs().max()
    assert (y.double() - ref).abs().max() <= 2 * torch_err + 1e-6  # as good as torch's own
    naive_var = (x64.float() ** 2).mean(-1) - x64.float().mean(-1) ** 2
    assert (naive_var - x64.var(-1, unbiased=False).float()).abs().max() > 0.5  # why it matters


def test_constant_row_gives_bias_not_nan_and_nan_stays_in_its_row():
    w, b = _params((6,), torch.float32)
    x = torch.randn(4, 6)
    x[1] = 7.25  # a constant row
    x[2, 3] = float("nan")
    x.requires_grad_()
    y = layer_norm(x, 6, w, b)
    torch.testing.assert_close(y[1], b, atol=1e-6, rtol=0)
    assert torch.isnan(y[2]).all()
    assert torch.isfinite(y[[0, 1, 3]]).all()
    y[[0, 1, 3]].sum().backward()
    assert torch.isfinite(x.grad[[0, 1, 3]]).all()


def test_zero_size_batch():
    x = torch.randn(0, 5, requires_grad=True)
    y = layer_norm(x, 5, torch.ones(5), torch.zeros(5))
    assert y.shape == (0, 5)
    y.sum().backward()
    assert x.grad.shape == (0, 5)


def test_impl_torch_is_the_same_function():
    x = torch.randn(8, 32)
    w, b = _params((32,), torch.float32)
    torch.testing.assert_close(layer_norm(x, 32, w, b, impl="torch"), layer_norm(x, 32, w, b),
                               atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="impl"):
        layer_norm(x, 32, impl="triton")


def test_bad_inputs_name_what_was_expected():
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match=r"\(8,\).*\(4, 10\)"):
        layer_norm(x, 8)
    with pytest.raises(ValueError, match="normalized_shape"):
        layer_norm(x, (4, 10, 1))
    with pytest.raises(TypeError, match="floating-point.*torch.int64"):
        layer_norm(torch.arange(10).reshape(2, 5), 5)
    with pytest.raises(TypeError, match="torch.bool"):
        layer_norm(torch.ones(2, 5, dtype=torch.bool), 5)
    for eps in (0, -1e-5, float("nan")):
        with pytest.raises(ValueError, match="eps"):
            layer_norm(x, 10, eps=eps)
    with pytest.raises(ValueError, match="weight must have shape"):
        layer_norm(x, 10, torch.ones(9))
    with pytest.raises(ValueError, match="eps"):
        LayerNorm(10, eps=0)
    with pytest.raises(ValueError, match="positive"):
        LayerNorm(0)


def test_layer_norm_module_state_dict_loads_both_ways_and_matches_torch():
    torch.manual_seed(0)
    theirs = nn.LayerNorm((4, 6))
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours = LayerNorm((4, 6))
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 4, 6)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
    back = nn.LayerNorm((4, 6))
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back(x), theirs(x), atol=0, rtol=0)
    assert set(LayerNorm(5, bias=False).state_dict()) == {"weight"}
    assert list(LayerNorm(5, elementwise_affine=False).parameters()) == []
    assert "eps=1e-05" in repr(ours) and "(4, 6)" in repr(ours)


def test_layer_norm_train_equals_eval_and_works_at_batch_size_one():
    torch.manual_seed(0)
    ln = LayerNorm(16)
    batch = torch.randn(5, 16)
    y_train = ln.train()(batch)
    y_eval = ln.eval()(batch)
    assert torch.equal(y_train, y_eval)  # C01: the same computation at training and test time
    alone = ln(batch[2:3])  # C02: one example alone gives its row of the batched result
    torch.testing.assert_close(alone[0], y_train[2], atol=1e-6, rtol=0)


def test_reset_parameters_sets_gain_one_bias_zero():
    ln = LayerNorm(7)
    with torch.no_grad():
        ln.weight.fill_(3)
        ln.bias.fill_(2)
    ln.reset_parameters()
    assert torch.equal(ln.weight, torch.ones(7)) and torch.equal(ln.bias, torch.zeros(7))


# ----------------------------------------------------------------------------- BatchNorm


@pytest.mark.parametrize("shape", [(16, 6), (8, 6, 5)])
def test_batch_norm_matches_torch_including_running_stats(shape):
    torch.manual_seed(0)
    theirs = nn.BatchNorm1d(6, momentum=0.2).double()
    ours = BatchNorm(6, momentum=0.2).double()
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    for _ in range(3):
        x = torch.randn(shape, dtype=torch.float64) * 2 + 1
        x2 = x.clone().requires_grad_()
        x.requires_grad_()
        torch.testing.assert_close(ours(x), theirs(x2), atol=1e-12, rtol=0)
        g = torch.randn(shape, dtype=torch.float64)
        ours(x).backward(g)
        theirs(x2).backward(g)
        torch.testing.assert_close(x.grad, x2.grad, atol=1e-10, rtol=0)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), atol=1e-12, rtol=0)
    x = torch.randn(shape, dtype=torch.float64)
    ours.eval(), theirs.eval()
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-12, rtol=0)
    theirs.load_state_dict(ours.state_dict())


def test_batch_norm_depends_on_batch_mates_and_differs_between_train_and_eval():
    torch.manual_seed(0)
    bn = BatchNorm(4)
    x = torch.randn(8, 4)
    other = torch.cat([x[:1], torch.randn(7, 4) + 3])
    assert not torch.allclose(bn(x)[0], bn(other)[0], atol=1e-3)  # C03: same example, new mates
    y_train = bn(x)
    assert not torch.allclose(bn.eval()(x), y_train, atol=1e-3)


def test_batch_norm_unbiased_variance_equation_2():
    x = torch.tensor([[1.0], [2.0], [4.0], [9.0]], dtype=torch.float64)
    for unbiased, ddof in ((False, 0), (True, 1)):
        bn = BatchNorm(1, eps=0.0 + 1e-12, unbiased=unbiased).double()
        mu = x.mean()
        sigma = torch.sqrt(((x - mu) ** 2).sum() / (4 - ddof))
        torch.testing.assert_close(bn(x), (x - mu) / sigma, atol=1e-9, rtol=0)


def test_batch_norm_refuses_batch_size_one_in_training_but_not_in_eval():
    bn = BatchNorm(3)
    with pytest.raises(ValueError, match="more than one value"):
        bn(torch.randn(1, 3))
    assert bn.eval()(torch.randn(1, 3)).shape == (1, 3)
    with pytest.raises(ValueError, match=r"\(N, 3\)"):
        bn(torch.randn(4, 5))
    with pytest.raises(TypeError):
        bn(torch.ones(4, 3, dtype=torch.int32))


def test_batch_norm_half_precision_no_overflow():
    bn = BatchNorm(8)
    x = (torch.randn(32, 8) * 3000 + 20000).half()
    y = bn(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()


# ----------------------------------------------------------------------------- WeightNorm


def test_weight_norm_linear_equation_5_and_invariance_to_row_scaling():
    torch.manual_seed(0)
    wn = WeightNormLinear(5, 3).double()
    x = torch.randn(4, 5, dtype=torch.float64)
    w, g, b = wn.weight, wn.gain, wn.bias
    expected = (x @ w.T) * (g / w.norm(dim=1)) + b  # eq. 5 with mu = 0, sigma = ||w_i||
    torch.testing.assert_close(wn(x), expected, atol=1e-12, rtol=0)
    # at initialization the gain equals each row's norm, so the layer equals nn.Linear
    torch.testing.assert_close(wn(x), F.linear(x, w, b), atol=1e-6, rtol=0)  # gain set in fp32
    y = wn(x)
    with torch.no_grad():
        wn.weight[1] *= 7.0
    torch.testing.assert_close(wn(x), y, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"\(\*, 5\)"):
        wn(torch.randn(2, 4, dtype=torch.float64))
    assert "bias" not in dict(WeightNormLinear(5, 3, bias=False).named_parameters())


def test_public_api_is_re_exported():
    for name in ("layer_norm", "LayerNorm", "BatchNorm", "WeightNormLinear", "resolve_device"):
        assert hasattr(lnbook, name) and name in lnbook.__all__
    assert lnbook.resolve_device("cpu").type == "cpu"
    assert lnbook.resolve_device("auto").type in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="device"):
        lnbook.resolve_device("tpu")


def test_backward_works_under_vmap_of_batched_grads():
    # lnbook.analysis computes per-example gradients with is_grads_batched=True (vmap)
    torch.manual_seed(0)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    w, b = (t.requires_grad_() for t in _params((8,), torch.float64))
    gs = torch.randn(3, 5, 8, dtype=torch.float64)
    ours = torch.autograd.grad(layer_norm(x, 8, w, b), (x, w, b), gs, is_grads_batched=True)
    y_ref = F.layer_norm(x, (8,), w, b)
    for k, g in enumerate(gs):
        ref = torch.autograd.grad(y_ref, (x, w, b), g, retain_graph=True)
        for o, r in zip(ours, ref, strict=True):
            torch.testing.assert_close(o[k], r, atol=1e-12, rtol=0)


@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
@pytest.mark.parametrize("retain", [False, True])
def test_backward_with_and_without_affine_and_with_kept_graph(affine, retain):
    # a kept graph (retain_graph=True) must give the same gradients on every pass: the backward
    # writes nothing that autograd saved
    torch.manual_seed(1)
    x = (2 * torch.randn(6, 3, 10, dtype=torch.float64) - 1).requires_grad_()
    w, b = (t.requires_grad_() for t in _params((10,), torch.float64))
    w, b = (w if affine != "none" else None), (b if affine == "weight+bias" else None)
    inputs = tuple(t for t in (x, w, b) if t is not None)
    gy = torch.randn(6, 3, 10, dtype=torch.float64)
    y = layer_norm(x, 10, w, b)
    refs = torch.autograd.grad(F.layer_norm(x, (10,), w, b), inputs, gy)
    for _ in range(2 if retain else 1):  # a kept graph must give the same gradients twice
        ours = torch.autograd.grad(y, inputs, gy, retain_graph=retain)
        for o, r in zip(ours, refs, strict=True):
            torch.testing.assert_close(o, r, atol=1e-12, rtol=0)


def test_large_mean_gradients_are_as_good_as_torch():
    # the backward reads the x_hat of the two-pass forward; at a mean of 1e4 a one-pass x_hat
    # would lose digits of dL/dx that torch keeps
    torch.manual_seed(0)
    x32 = (torch.randn(64, 256, dtype=torch.float64) + 1e4).float()
    w, b = _params((256,), torch.float32)
    gy = torch.randn(64, 256)
    x64 = x32.double().requires_grad_()
    y64 = F.layer_norm(x64, (256,), w.double(), b.double())
    ref = torch.autograd.grad(y64, x64, gy.double())[0]
    x = x32.clone().requires_grad_()
    ours = torch.autograd.grad(layer_norm(x, 256, w, b), x, gy)[0]
    xt = x32.clone().requires_grad_()
    theirs = torch.autograd.grad(F.layer_norm(xt, (256,), w, b), xt, gy)[0]
    err, torch_err = ((g.double() - ref).abs().max().item() for g in (ours, theirs))
    assert err < 1e-5 and err <= torch_err, (err, torch_err)  # torch: about 1e-3 here


@pytest.mark.parametrize("affine", ["none", "weight", "bias", "weight+bias"])
def test_forward_without_grad_gives_the_same_numbers_and_never_writes_the_input(affine):
    torch.manual_seed(2)
    x = 3 * torch.randn(5, 12) + 1
    w, b = _params((12,), torch.float32)
    w, b = (w if "weight" in affine else None), (b if "bias" in affine else None)
    x0, ref = x.clone(), F.layer_norm(x, (12,), w, b)
    with torch.no_grad():  # nothing needs a gradient
        y = layer_norm(x, 12, w, b)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=0)
    y2 = layer_norm(x.clone().requires_grad_(), 12, w, b)  # the path that keeps x_hat
    torch.testing.assert_close(y2.detach(), y, atol=1e-6, rtol=0)
    assert x.equal(x0)  # the input is never written


# ----------------------------------------------------------------------------- torch.func


def _f64(shape, seed, scale=2.0, shift=1.0):
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed),
                               dtype=torch.float64) + shift


@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
def test_vmap_grad_and_jacrev_agree_with_torch(affine):
    x = _f64((5, 7), 0)
    w, b = _params((7,), torch.float64, seed=1)
    w, b = (w if affine != "none" else None), (b if affine == "weight+bias" else None)
    c = _f64((7,), 2)  # a loss that weighs the outputs unequally: sum(c * y^2)

    def ours(v):
        return layer_norm(v, 7, w, b)

    def theirs(v):
        return F.layer_norm(v, (7,), w, b)

    for fn in (ours, theirs):
        assert fn(x).shape == (5, 7)
    torch.testing.assert_close(vmap(ours)(x), theirs(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(vmap(ours, in_dims=1, out_dims=1)(x.T.contiguous()),
                               theirs(x).T, atol=1e-12, rtol=0)

    def loss(fn):
        return lambda v: (c * fn(v) ** 2).sum()

    torch.testing.assert_close(grad(loss(ours))(x), grad(loss(theirs))(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(vmap(grad(loss(ours)))(x), vmap(grad(loss(theirs)))(x),
                               atol=1e-12, rtol=0)
    j_ours, j_theirs = jacrev(ours)(x[0]), jacrev(theirs)(x[0])  # (7, 7)
    torch.testing.assert_close(j_ours, j_theirs, atol=1e-12, rtol=0)
    assert j_ours.abs().max() > 0.1  # a Jacobian, not zeros
    h_ours, h_theirs = jacrev(jacrev(ours))(x[0]), jacrev(jacrev(theirs))(x[0])  # (7, 7, 7)
    torch.testing.assert_close(h_ours, h_theirs, atol=1e-11, rtol=0)
    assert h_theirs.abs().max() > 0.01  # second derivatives, not zeros


def test_torch_func_gradients_for_gain_and_bias_and_vmap_over_an_ensemble():
    x = _f64((6, 5), 3)
    w, b = _params((5,), torch.float64, seed=4)
    c = _f64((5,), 5)

    def loss(fn, w, b):
        return (c * torch.tanh(fn(x, (5,), w, b)) ** 2).sum()

    ours = grad(lambda w, b: loss(layer_norm, w, b), argnums=(0, 1))(w, b)
    theirs = grad(lambda w, b: loss(F.layer_norm, w, b), argnums=(0, 1))(w, b)
    for o, t in zip(ours, theirs, strict=True):
        torch.testing.assert_close(o, t, atol=1e-12, rtol=0)
    # second derivatives in the gain: jacrev of grad
    h = jacrev(grad(lambda w: loss(layer_norm, w, b)))(w)
    h_ref = jacrev(grad(lambda w: loss(F.layer_norm, w, b)))(w)
    torch.testing.assert_close(h, h_ref, atol=1e-11, rtol=0)
    # an ensemble of 3 gains and biases over one shared input: batched weights, unbatched x
    ws, bs = torch.stack([w, w + 0.5, -w]), torch.stack([b, b - 1, 2 * b])  # (3, 5)

    def per_member(fn):
        return vmap(grad(lambda w, b: loss(fn, w, b), argnums=(0, 1)))(ws, bs)

    for o, t in zip(per_member(layer_norm), per_member(F.layer_norm), strict=True):
        torch.testing.assert_close(o, t, atol=1e-12, rtol=0)
    def sum_grad(fn):  # dL/dy = 1: unbatched, while the gains are batched
        return vmap(grad(lambda w: fn(x, (5,), w, b).sum()))(ws)

    torch.testing.assert_close(sum_grad(layer_norm), sum_grad(F.layer_norm), atol=1e-12, rtol=0)


def test_vmap_over_several_trailing_dims_and_module_under_functional_call():
    x = _f64((3, 4, 2, 5), 6)
    ln = LayerNorm((2, 5)).double()
    with torch.no_grad():
        ln.weight.normal_(generator=torch.Generator().manual_seed(7))
    params = dict(ln.named_parameters())
    ref = F.layer_norm(x, (2, 5), ln.weight, ln.bias)
    out = vmap(lambda v: functional_call(ln, params, (v,)))(x)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    g = grad(lambda p: functional_call(ln, p, (x,)).pow(3).sum())(params)
    g_ref = torch.autograd.grad(ref.pow(3).sum(), (ln.weight, ln.bias))
    torch.testing.assert_close(g["weight"], g_ref[0], atol=1e-11, rtol=0)
    torch.testing.assert_close(g["bias"], g_ref[1], atol=1e-11, rtol=0)


# ----------------------------------------------------------------------------- 2nd derivatives


class _ConstantXHat(torch.autograd.Function):
    """The same forward and backward formulas, but the backward always reads the x_hat and
    1/sigma the forward saved, as constants: its double backward drops their terms."""

    @staticmethod
    def forward(x, weight, bias):
        return norms._LayerNormFunction.forward(x, weight, bias, (x.shape[-1],), 1e-5)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.save_for_backward(inputs[1], output[1], output[2])

    @staticmethod
    def backward(ctx, gy, _g1, _g2):
        w, x_hat, rstd = ctx.saved_tensors
        gx, gw, gb = functional.layer_norm_backward(gy, x_hat, rstd, w)
        return gx, gw, gb


def _constant_x_hat_layer_norm(x, shape, w, b):
    return _ConstantXHat.apply(x, w, b)[0]


@pytest.mark.parametrize("affine", [False, True])
def test_hessian_vector_products_match_torch_double_backward(affine):
    # double backward: d/d(x, g, b) of <dL/dx, v>, against torch's own double backward
    x = _f64((4, 9), 8).requires_grad_()
    w, b = (t.requires_grad_() for t in _params((9,), torch.float64, seed=9))
    w, b = (w, b) if affine else (None, None)
    gy, v = _f64((4, 9), 10, shift=0), _f64((4, 9), 11, shift=0)
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def hvp(fn):
        y = fn(x, (9,), w, b)
        gx = torch.autograd.grad(y, x, gy, create_graph=True)[0]
        return torch.autograd.grad((gx * v).sum(), inputs, allow_unused=True)

    ours, theirs = hvp(layer_norm), hvp(F.layer_norm)
    for o, t in zip(ours, theirs, strict=True):
        if t is None:
            assert o is None or o.abs().max() < 1e-12
            continue
        torch.testing.assert_close(o, t, atol=1e-11, rtol=0)
    # the comparison can fail: a backward that takes the saved x_hat and 1/sigma as constants
    # passes every first-order test above but gives another d/dx here
    if affine:
        wrong = hvp(_constant_x_hat_layer_norm)
        torch.testing.assert_close(wrong[1], theirs[1], atol=1e-11, rtol=0)  # the g part is right
        assert wrong[0] is None or wrong[0].abs().max() == 0  # it sees no x in dL/dx
        assert theirs[0].abs().max() > 0.1  # where the exact one does


def test_gradgradcheck_with_a_kept_graph_and_a_loss_of_the_gradient():
    # a gradient penalty: the usual place where second derivatives reach a layer norm
    x = _f64((3, 6), 12).requires_grad_()
    w, b = (t.requires_grad_() for t in _params((6,), torch.float64, seed=13))

    def penalty(fn):
        y = fn(x, (6,), w, b)
        gx = torch.autograd.grad(torch.sin(y).sum(), x, create_graph=True)[0]
        return torch.autograd.grad(gx.pow(2).sum(), (x, w, b))

    for o, t in zip(penalty(layer_norm), penalty(F.layer_norm), strict=True):
        torch.testing.assert_close(o, t, atol=1e-11, rtol=0)
    assert torch.autograd.gradgradcheck(lambda x, w: layer_norm(x, 6, w, None), (x, w))


# ----------------------------------------------------------------------------- compile, export


def _tiny_net(impl="autograd", seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), LayerNorm(8, impl=impl), nn.Tanh(), nn.Linear(8, 1))


def test_compile_fullgraph_training_step_matches_eager():
    # forward, backward (torch.func.grad) and an SGD step, all in one graph
    x, t = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)), torch.ones(5, 1)
    net = _tiny_net()

    def train_step(params):
        def loss_fn(p):
            return (functional_call(net, p, (x,)) - t).pow(2).mean()

        grads, loss = grad_and_value(loss_fn)(params)
        return loss, {k: p - 0.1 * grads[k] for k, p in params.items()}

    compiled = torch.compile(train_step, fullgraph=True)
    p_eager = p_comp = {k: v.detach() for k, v in net.named_parameters()}
    for _ in range(2):
        (l_eager, p_eager), (l_comp, p_comp) = train_step(p_eager), compiled(p_comp)
        torch.testing.assert_close(l_comp, l_eager, atol=1e-6, rtol=1e-6)
        for k in p_eager:
            torch.testing.assert_close(p_comp[k], p_eager[k], atol=1e-6, rtol=1e-6)
    moved = {k: (p_comp[k] - v).abs().max().item() for k, v in net.named_parameters()}
    assert moved["1.weight"] > 1e-4 and moved["1.bias"] > 1e-4  # LN's own gain and bias learn


def test_compile_fullgraph_module_with_backward_and_optimizer_matches_eager():
    x, t = torch.randn(5, 6, generator=torch.Generator().manual_seed(2)), torch.ones(5, 1)
    eager, ours = _tiny_net(seed=3), _tiny_net(seed=3)
    compiled = torch.compile(ours, fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, ours)]
    for _ in range(2):
        for model, opt in zip((eager, compiled), opts, strict=True):
            opt.zero_grad()
            (model(x) - t).pow(2).mean().backward()
            opt.step()
    for (k, p), q in zip(eager.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-6, msg=k)


@pytest.mark.parametrize("impl", ["autograd", "torch"])
def test_torch_export_of_a_module_with_layer_norm(impl):
    net = _tiny_net(impl).eval()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(4))
    ep = torch.export.export(net, (x,))
    y = torch.randn(7, 6, generator=torch.Generator().manual_seed(5))[:4]
    torch.testing.assert_close(ep.module()(y), net(y), atol=1e-6, rtol=0)
    with torch.no_grad():
        ref = net[3](torch.tanh(F.layer_norm(net[0](y), (8,), net[1].weight, net[1].bias)))
    torch.testing.assert_close(ep.module()(y), ref, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- forward-mode AD


def test_forward_mode_ad_is_refused_with_a_message_that_names_impl_torch():
    x, t = _f64((3, 5), 14), _f64((3, 5), 15)
    with pytest.raises(NotImplementedError, match=r"forward-mode AD.*impl='torch'"):
        jvp(lambda v: layer_norm(v, 5), (x,), (t,))
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="impl='torch'"):
        layer_norm(fwAD.make_dual(x, t), 5)
    # the path the message points to works, and agrees with a finite difference
    _, tangent = jvp(lambda v: layer_norm(v, 5, impl="torch"), (x,), (t,))
    h = 1e-6
    fd = (layer_norm(x + h * t, 5) - layer_norm(x - h * t, 5)) / (2 * h)
    torch.testing.assert_close(tangent, fd, atol=1e-7, rtol=0)


@pytest.mark.parametrize("module", [norms, functional])
def test_norms_uses_no_private_torch_api(module):
    src = Path(module.__file__).read_text()
    for private in ("torch._C", "_functorch", "torch.ops", "ctypes", "_get_current_graph_task"):
        assert private not in src, private


# ----------------------------------------------------------------------------- ChannelLayerNorm


def test_channel_layer_norm_matches_a_float64_reference():
    # eq. 3 with the channels as the hidden units: one mean and variance per example and position
    x = _f64((2, 5, 3, 4), 16, shift=0)
    ln = ChannelLayerNorm(5).double()
    with torch.no_grad():
        ln.weight.copy_(torch.linspace(0.5, 1.5, 5))
        ln.bias.copy_(torch.linspace(-1, 1, 5))
    mu = x.mean(dim=1, keepdim=True)
    var = x.var(dim=1, unbiased=False, keepdim=True)
    ref = (x - mu) / torch.sqrt(var + 1e-5) * ln.weight.view(1, 5, 1, 1) + ln.bias.view(1, 5, 1, 1)
    torch.testing.assert_close(ln(x), ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(ChannelLayerNorm(5, impl="torch").double()(x),
                               ChannelLayerNorm(5).double()(x), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"\(N, 5, H, W\)"):
        ln(torch.zeros(2, 4, 3, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating-point"):
        ln(torch.zeros(2, 5, 3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="num_channels"):
        ChannelLayerNorm(0)
    assert "ChannelLayerNorm" in lnbook.__all__ and lnbook.ChannelLayerNorm is ChannelLayerNorm
    assert repr(ChannelLayerNorm(3)) == "ChannelLayerNorm(3, eps=1e-05)"


def test_channel_layer_norm_gradients_match_group_norm_per_position():
    # over the channels at one position = GroupNorm(1, C) on that position alone
    x = _f64((2, 4, 3, 3), 17).requires_grad_()
    ln = ChannelLayerNorm(4).double()
    gy = _f64((2, 4, 3, 3), 18, shift=0)
    gx = torch.autograd.grad(ln(x), x, gy)[0]
    xs = x.detach().permute(0, 2, 3, 1).reshape(-1, 4, 1).requires_grad_()  # (N*H*W, C, 1)
    ref = torch.nn.GroupNorm(1, 4).double()(xs)
    gs = torch.autograd.grad(ref, xs, gy.permute(0, 2, 3, 1).reshape(-1, 4, 1))[0]
    torch.testing.assert_close(gx, gs.reshape(2, 3, 3, 4).permute(0, 3, 1, 2), atol=1e-12,
                               rtol=0)


# ----------------------------------------------------------------------------- device, dtype


def test_layers_take_torch_style_device_and_dtype():
    f64 = {"device": "cpu", "dtype": torch.float64}
    for ours, theirs in (
        (LayerNorm(5, **f64), nn.LayerNorm(5, **f64)),
        (BatchNorm(5, **f64), nn.BatchNorm1d(5, **f64)),
    ):
        mine, ref = ours.state_dict(), theirs.state_dict()
        assert list(mine) == list(ref)
        for k in ref:
            assert mine[k].dtype == ref[k].dtype and mine[k].device == ref[k].device, k
    assert LayerNorm(5, 1e-5, True, True, "cpu", torch.float64).weight.dtype == torch.float64
    wn = WeightNormLinear(4, 3, True, "cpu", torch.float64)
    assert {p.dtype for p in wn.parameters()} == {torch.float64}
    x = _f64((2, 4), 19)
    torch.testing.assert_close(wn(x), F.linear(x, wn.weight, wn.bias), atol=1e-12, rtol=0)
    assert ChannelLayerNorm(3, dtype=torch.float64).weight.dtype == torch.float64


def test_batchnorm_takes_torchs_positional_order():
    """BatchNorm(C, eps, momentum, affine) means what torch.nn.BatchNorm1d's does."""
    ours, theirs = BatchNorm(4, 1e-3, 0.2, False), torch.nn.BatchNorm1d(4, 1e-3, 0.2, False)
    assert (ours.eps, ours.momentum, ours.weight, ours.unbiased) == (1e-3, 0.2, None, False)
    x = torch.randn(8, 4, dtype=torch.float64)
    torch.testing.assert_close(ours.double()(x), theirs.double()(x))
    with pytest.raises(TypeError):
        BatchNorm(4, 1e-5, 0.1, True, None, None, True)  # unbiased is keyword-only


_MIXED = [  # (input dtype, parameters' dtype) that torch's normalization layers refuse
    (torch.float64, torch.float32), (torch.float32, torch.float64),
    (torch.float32, torch.float16), (torch.float16, torch.bfloat16)]
_DTYPE_TWINS = {  # lnbook's layer -> (torch's twin, an input shape)
    "LayerNorm": (lambda dt: LayerNorm(6, dtype=dt), lambda dt: nn.LayerNorm(6, dtype=dt),
                  (3, 6)),
    "LayerNorm(impl='torch')": (lambda dt: LayerNorm(6, dtype=dt, impl="torch"),
                                lambda dt: nn.LayerNorm(6, dtype=dt), (3, 6)),
    "BatchNorm": (lambda dt: BatchNorm(6, dtype=dt), lambda dt: nn.BatchNorm1d(6, dtype=dt),
                  (3, 6)),
}


@pytest.mark.parametrize("x_dtype,p_dtype", _MIXED)
@pytest.mark.parametrize("layer", list(_DTYPE_TWINS))
def test_a_dtype_mismatch_raises_the_error_torch_raises_with_a_clear_message(
        layer, x_dtype, p_dtype):
    ours, theirs, shape = _DTYPE_TWINS[layer]
    x = torch.randn(shape).to(x_dtype)
    with pytest.raises(RuntimeError) as torch_error:  # "mixed dtype (CPU): ..."
        theirs(p_dtype)(x)
    want = (rf"input dtype {x_dtype} does not match the dtype {p_dtype} of weight, bias"
            rf".*\.to\({p_dtype}\).*\.to\({x_dtype}\)")
    with pytest.raises(type(torch_error.value), match=want) as error:
        ours(p_dtype)(x)
    assert isinstance(error.value, lnbook.checks.DTypeError) and isinstance(error.value, TypeError)


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer", list(_DTYPE_TWINS))
def test_half_inputs_take_float32_parameters_as_in_torch(layer, x_dtype):
    ours, theirs, shape = _DTYPE_TWINS[layer]
    x = torch.randn(shape).to(x_dtype)
    got, want = ours(torch.float32)(x), theirs(torch.float32)(x)
    assert got.dtype == want.dtype == x_dtype
    torch.testing.assert_close(got, want)


def test_functional_layer_norm_refuses_a_weight_or_bias_of_another_dtype_as_torch():
    x, w, b = torch.randn(4, 5), torch.ones(5), torch.zeros(5)
    for weight, bias in ((w.double(), b.double()), (w, b.double()), (w.double(), None)):
        with pytest.raises(RuntimeError):
            F.layer_norm(x, (5,), weight, bias)
        for impl in ("autograd", "torch"):
            with pytest.raises(RuntimeError, match="dtype") as error:
                layer_norm(x, 5, weight, bias, impl=impl)
            assert isinstance(error.value, TypeError)
    with pytest.raises(RuntimeError, match="must share one dtype, got weight torch.float32, "
                                           "bias torch.float64"):
        layer_norm(x, 5, w, b.double())


def test_channel_layer_norm_refuses_what_layer_norm_over_channels_refuses():
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError):  # torch's layer norm over the channels, moved last
        F.layer_norm(x.movedim(1, -1), (3,), torch.ones(3), torch.zeros(3))
    with pytest.raises(RuntimeError, match="input dtype torch.float64 does not match"):
        ChannelLayerNorm(3)(x)
    assert ChannelLayerNorm(3, dtype=torch.float64)(x).dtype == torch.float64


def test_impl_torch_gives_up_the_large_mean_stability_of_layer_norm():
    """What the README says `impl="torch"` gives up: it returns torch's kernel's numbers
    exactly, and their error against float64 grows with the rows' mean, while the default
    two-pass layer_norm stays at float32 rounding (measured at means 1e4 to 1e7)."""
    torch.manual_seed(0)
    z = torch.randn(64, 256, dtype=torch.float64)
    ours, fast = [], []
    for mean in (1e4, 1e5, 1e6, 1e7):
        x32 = (z + mean).float()
        ref = F.layer_norm(x32.double(), (256,))  # the same stored numbers, in float64
        y_fast = LayerNorm(256, impl="torch")(x32)
        assert torch.equal(y_fast, F.layer_norm(x32, (256,)))
        ours.append((layer_norm(x32, 256).double() - ref).abs().max().item())
        fast.append((y_fast.double() - ref).abs().max().item())
    assert max(ours) < 1e-5, ours
    assert fast == sorted(fast) and fast[-1] > 0.1 and fast[-1] > 1e4 * max(ours), fast


class _GeneratedRule(torch.autograd.Function):
    """lnbook's layer-norm Function with torch's generated vmap rule, the reference for its own."""

    generate_vmap_rule = True
    forward = norms._LayerNormFunction.forward
    setup_context = norms._LayerNormFunction.setup_context
    backward = norms._LayerNormFunction.backward


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, x_dim", [((16,), 0), ((4, 6), 1)])
@pytest.mark.parametrize("gain, bias", [("copy", "copy"), ("copy", "shared"),
                                        ("shared", "copy"), ("shared", None), (None, None)])
def test_vmap_rule_is_the_generated_rule_bit_for_bit(monkeypatch, dtype, shape, x_dim, gain,
                                                     bias):
    """Under vmap the layer norm runs its own rule (the copies' rows as one batch, about twice
    as fast); outputs, gradients and a second derivative equal torch's generated rule's."""
    gen = torch.Generator().manual_seed(0)
    n, lead = 5, (2, 3)
    x_shape = [*lead, *shape]
    x_shape.insert(x_dim, n)

    def param(mode):  # a gain or bias per copy (batched at 0), shared, or None
        if mode is None:
            return None, None
        t = torch.randn(*((n,) if mode == "copy" else ()), *shape, generator=gen, dtype=dtype)
        return 1 + 0.3 * t, 0 if mode == "copy" else None

    x0 = torch.randn(x_shape, generator=gen, dtype=dtype)
    (w0, w_dim), (b0, b_dim) = param(gain), param(bias)
    gy = torch.randn(n, *lead, *shape, generator=gen, dtype=dtype)

    def run(function):
        monkeypatch.setattr(norms, "_LayerNormFunction", function)
        x, w, b = (None if t is None else t.clone().requires_grad_() for t in (x0, w0, b0))
        f = vmap(lambda x, w, b: norms.layer_norm(x, shape, w, b), in_dims=(x_dim, w_dim, b_dim))
        y = f(x, w, b)
        grads = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], gy,
                                    create_graph=True)
        (second,) = torch.autograd.grad(sum((g * g).sum() for g in grads), x)
        return [y.detach(), *(g.detach() for g in grads), second]

    ours, reference = run(norms._LayerNormFunction), run(_GeneratedRule)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference, strict=True))
