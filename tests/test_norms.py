"""lnbook.norms against torch, float64 references and the paper's equations (eqs. 2, 3, 5)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lnbook
from lnbook import BatchNorm, LayerNorm, WeightNormLinear, layer_norm
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
    # retain_graph=False takes the in-place backward, retain_graph=True the one that keeps z_hat
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


def test_backward_writes_the_input_gradient_over_z_hat_when_the_graph_is_freed():
    # the speed of the backward (benchmarks/bench_layernorm.py) rests on making no new tensor
    saved = []

    def pack(t):
        saved.append(t)
        return t

    x = torch.randn(8, 32, requires_grad=True)
    w, b = (t.requires_grad_() for t in _params((32,), torch.float32))
    gy = torch.randn(8, 32)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer_norm(x, 32, w, b)
    z_hat_ptrs = {t.data_ptr() for t in saved if t.shape == (8, 32) and t is not x}
    assert len(z_hat_ptrs) == 1
    gx_kept = torch.autograd.grad(y, x, gy, retain_graph=True)[0]
    assert gx_kept.data_ptr() not in z_hat_ptrs  # the graph is kept: z_hat must survive
    gx = torch.autograd.grad(y, x, gy)[0]
    assert gx.data_ptr() in z_hat_ptrs  # graph freed: dL/dx lives in z_hat's buffer
    torch.testing.assert_close(gx, gx_kept, atol=1e-6, rtol=0)


def test_large_mean_gradients_are_as_good_as_torch():
    # the in-place backward rebuilds z_hat from (x - mu - mu_err) * rstd; at a mean of 1e4 that
    # must keep the second pass's correction, or dL/dx loses digits torch keeps
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
def test_forward_without_grad_writes_y_over_z_hat_and_gives_the_same_numbers(affine):
    torch.manual_seed(2)
    x = 3 * torch.randn(5, 12) + 1
    w, b = _params((12,), torch.float32)
    w, b = (w if "weight" in affine else None), (b if "bias" in affine else None)
    x0, ref = x.clone(), F.layer_norm(x, (12,), w, b)
    with torch.no_grad():  # nothing needs a gradient: no z_hat is kept
        y = layer_norm(x, 12, w, b)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=0)
    y2 = layer_norm(x.clone().requires_grad_(), 12, w, b)  # the path that keeps z_hat
    torch.testing.assert_close(y2.detach(), y, atol=1e-6, rtol=0)
    assert x.equal(x0)  # the input is never written
