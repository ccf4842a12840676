"""lnbook.variants: RMSNorm and group norm against torch, their exact identities, and DyT."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing import make_tensor

import lnbook
from lnbook import layer_norm
from lnbook.variants import DyT, GroupNorm, RMSNorm, dyt, group_norm, rms_norm

DTYPES = (torch.float64, torch.float32, torch.bfloat16)
TOL = {  # (atol, rtol) of a comparison with torch's kernels, per dtype
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),  # one bf16 ulp at |y| ~ 2 is 1.6e-2 relative to 1
    torch.float16: (2e-3, 2e-3),
}

# input shape, normalized_shape: the cases of torch's OpInfo sample_inputs_rms_norm (with
# eps > 0), and more shapes and normalized_shape lengths
RMS_CASES = (
    ((1, 2, 3), (1, 2, 3)),
    ((2, 2, 3), (2, 3)),
    ((1,), (1,)),
    ((1, 2), (2,)),
    ((0, 1), (1,)),
    ((4, 5, 5), (5,)),
    ((3, 7), (7,)),
    ((2, 3, 4, 5), (4, 5)),
    ((2, 3, 4, 5), (3, 4, 5)),
    ((8, 128), (128,)),
)
# input shape, num_groups: torch's OpInfo sample_inputs_group_norm and reference inputs
GROUP_CASES = (
    ((1, 6, 3), 2),
    ((2, 6, 3), 2),
    ((1, 3), 1),
    ((0, 2), 1),
    ((5, 5, 5), 1),
    ((1, 2), 1),
    ((4, 6, 5, 5), 3),
    ((4, 6, 5, 5), 6),
    ((4, 6, 5, 5), 1),
    ((2, 8, 3, 2, 2), 4),
)


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=rtol)


def _tensor(shape, dtype, seed, low=-9.0, high=1000.0, requires_grad=False):
    torch.manual_seed(seed)
    return make_tensor(shape, dtype=dtype, device="cpu", low=low, high=high,
                       requires_grad=requires_grad)


# ---------------------------------------------------------------------------------------------
# rms_norm / RMSNorm against torch
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + (torch.float16,))
@pytest.mark.parametrize("case", RMS_CASES, ids=str)
def test_rms_norm_matches_torch_on_sample_inputs(case, dtype):
    shape, norm_shape = case
    for seed, (with_weight, eps) in enumerate(itertools.product((True, False), (None, 0.5, 1e-6))):
        x = _tensor(shape, dtype, seed, high=100.0 if dtype == torch.float16 else 1000.0)
        w = _tensor(norm_shape, dtype, seed + 100, low=-2, high=2) if with_weight else None
        ours = rms_norm(x, norm_shape, w, eps)
        theirs = F.rms_norm(x, list(norm_shape), w, eps)
        _close(ours, theirs, dtype)


def test_rms_norm_eps_none_is_the_machine_epsilon_of_the_computation_dtype():
    # a row of tiny values: the result depends on eps, so the default shows
    for dtype, eps in ((torch.float64, torch.finfo(torch.float64).eps),
                       (torch.float32, torch.finfo(torch.float32).eps),
                       (torch.bfloat16, torch.finfo(torch.float32).eps),
                       (torch.float16, torch.finfo(torch.float32).eps)):
        x = torch.full((2, 4), 2e-4 if dtype != torch.float64 else 1e-8, dtype=dtype)
        default = rms_norm(x, 4)
        _close(default, rms_norm(x, 4, eps=eps), dtype)
        _close(default, F.rms_norm(x, [4]), dtype)
        assert float(default[0, 0]) < 0.9  # eps is not negligible here


def test_rms_norm_gradients_match_torch_float64():
    for seed, (shape, norm_shape) in enumerate(RMS_CASES):
        x = _tensor(shape, torch.float64, seed, low=-3, high=3, requires_grad=True)
        w = _tensor(norm_shape, torch.float64, seed + 1, low=-2, high=2, requires_grad=True)
        gy = _tensor(shape, torch.float64, seed + 2, low=-1, high=1)
        for eps in (None, 1e-3):
            ours = torch.autograd.grad(rms_norm(x, norm_shape, w, eps), (x, w), gy)
            theirs = torch.autograd.grad(F.rms_norm(x, list(norm_shape), w, eps), (x, w), gy)
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_rms_norm_gradcheck_float64():
    x = _tensor((3, 2, 5), torch.float64, 0, low=-2, high=2, requires_grad=True)
    w = _tensor((2, 5), torch.float64, 1, low=-2, high=2, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, (2, 5), w, 1e-3), (x, w))
    assert torch.autograd.gradgradcheck(lambda x, w: rms_norm(x, (2, 5), w), (x, w))


def test_rms_norm_half_inputs_use_float32_statistics():
    x = torch.full((2, 8), 300.0, dtype=torch.float16)  # 300^2 overflows float16 (max 65504)
    assert torch.isinf(x.square()).all()
    y = rms_norm(x, 8)
    assert y.dtype == torch.float16 and torch.equal(y, torch.ones_like(y))
    torch.manual_seed(8)
    xb = torch.randn(16, 64).to(torch.bfloat16) * 50
    expected = (xb.float() * torch.rsqrt(xb.float().square().mean(-1, keepdim=True)
                                          + torch.finfo(torch.float32).eps)).bfloat16()
    ours = rms_norm(xb, 64)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, expected, atol=0, rtol=2**-7)  # at most one bf16 ulp


def test_rms_norm_zero_row_gives_zeros_not_nan():
    y = rms_norm(torch.zeros(3, 5), 5, torch.ones(5))
    assert torch.equal(y, torch.zeros(3, 5))


def test_rms_norm_module_is_interchangeable_with_torch():
    torch.manual_seed(0)
    for shape, eps, affine in (((5,), None, True), ((3, 4), 1e-6, True), ((4,), 1e-3, False)):
        ours = RMSNorm(shape, eps=eps, elementwise_affine=affine, dtype=torch.float64)
        theirs = torch.nn.RMSNorm(shape, eps=eps, elementwise_affine=affine,
                                  dtype=torch.float64)
        assert repr(ours) == repr(theirs)  # same extra_repr
        assert ours.state_dict().keys() == theirs.state_dict().keys()
        if affine:
            with torch.no_grad():
                theirs.weight.copy_(torch.randn(shape, dtype=torch.float64))
        ours.load_state_dict(theirs.state_dict())  # torch -> lnbook
        x = torch.randn(2, 3, *shape, dtype=torch.float64, requires_grad=True)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-12, rtol=1e-12)
        if affine:
            with torch.no_grad():
                ours.weight.mul_(2.0)
            theirs.load_state_dict(ours.state_dict())  # lnbook -> torch
            assert torch.equal(theirs.weight, ours.weight)
            gx_ours, gw_ours = torch.autograd.grad(ours(x).sum(), (x, ours.weight))
            gx_theirs, gw_theirs = torch.autograd.grad(theirs(x).sum(), (x, theirs.weight))
            torch.testing.assert_close(gx_ours, gx_theirs, atol=1e-12, rtol=1e-12)
            torch.testing.assert_close(gw_ours, gw_theirs, atol=1e-12, rtol=1e-12)
        else:
            assert ours.weight is None and list(ours.parameters()) == []


def test_rms_norm_module_reset_parameters_device_and_dtype():
    m = RMSNorm(4, dtype=torch.float64)
    assert m.weight.dtype == torch.float64 and torch.equal(m.weight, torch.ones(4).double())
    with torch.no_grad():
        m.weight.fill_(3.0)
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(4, dtype=torch.float64))
    assert RMSNorm(4, device="meta").weight.device.type == "meta"


def test_rms_norm_bad_arguments_raise_clear_errors():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="trailing dimensions"):
        rms_norm(x, 4)
    with pytest.raises(ValueError, match=r"weight must have shape \(3,\)"):
        rms_norm(x, 3, torch.ones(4))
    with pytest.raises(ValueError, match="eps must be None or a finite number > 0"):
        rms_norm(x, 3, eps=-0.5)  # torch accepts this; lnbook refuses it
    with pytest.raises(TypeError, match="floating-point"):
        rms_norm(torch.ones(2, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="positive sizes"):
        rms_norm(x, ())
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(3, eps=0.0)


# ---------------------------------------------------------------------------------------------
# group_norm / GroupNorm against torch
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GROUP_CASES, ids=str)
def test_group_norm_matches_torch_on_sample_inputs(case, dtype):
    shape, groups = case
    c = shape[1]
    combos = itertools.product((True, False), (True, False), (1e-5, 0.5))
    for seed, (with_w, with_b, eps) in enumerate(combos):
        x = _tensor(shape, dtype, seed, low=-3, high=3)
        w = _tensor((c,), dtype, seed + 100, low=-2, high=2) if with_w else None
        b = _tensor((c,), dtype, seed + 200, low=-2, high=2) if with_b else None
        _close(group_norm(x, groups, w, b, eps), F.group_norm(x, groups, w, b, eps), dtype)


def test_group_norm_gradients_match_torch_float64():
    for seed, (shape, groups) in enumerate(GROUP_CASES):
        c = shape[1]
        x = _tensor(shape, torch.float64, seed, low=-3, high=3, requires_grad=True)
        w = _tensor((c,), torch.float64, seed + 1, low=-2, high=2, requires_grad=True)
        b = _tensor((c,), torch.float64, seed + 2, low=-2, high=2, requires_grad=True)
        gy = _tensor(shape, torch.float64, seed + 3, low=-1, high=1)
        ours = torch.autograd.grad(group_norm(x, groups, w, b), (x, w, b), gy)
        theirs = torch.autograd.grad(F.group_norm(x, groups, w, b), (x, w, b), gy)
        for a, t in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, t, atol=1e-10, rtol=1e-10)


def test_group_norm_gradcheck_float64():
    x = _tensor((2, 6, 3), torch.float64, 0, low=-2, high=2, requires_grad=True)
    w = _tensor((6,), torch.float64, 1, low=-2, high=2, requires_grad=True)
    b = _tensor((6,), torch.float64, 2, low=-2, high=2, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: group_norm(x, 3, w, b), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda x, w, b: group_norm(x, 2, w, b), (x, w, b))


def test_group_norm_module_is_interchangeable_with_torch():
    torch.manual_seed(0)
    for groups, channels, affine, bias in ((2, 6, True, True), (1, 4, True, True),
                                           (4, 4, False, True), (2, 4, True, False)):
        ours = GroupNorm(groups, channels, affine=affine, dtype=torch.float64, bias=bias)
        theirs = torch.nn.GroupNorm(groups, channels, affine=affine, dtype=torch.float64,
                                    bias=bias)
        assert repr(ours) == repr(theirs)
        assert ours.state_dict().keys() == theirs.state_dict().keys()
        with torch.no_grad():
            for p in theirs.parameters():
                p.normal_()
        ours.load_state_dict(theirs.state_dict())  # torch -> lnbook
        x = torch.randn(3, channels, 5, 2, dtype=torch.float64, requires_grad=True)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-12, rtol=1e-12)
        if affine:
            with torch.no_grad():
                ours.weight.add_(1.0)
            theirs.load_state_dict(ours.state_dict())  # lnbook -> torch
            gy = torch.randn_like(x)
            g_ours = torch.autograd.grad(ours(x), (x, *ours.parameters()), gy)
            g_theirs = torch.autograd.grad(theirs(x), (x, *theirs.parameters()), gy)
            for a, t in zip(g_ours, g_theirs, strict=True):
                torch.testing.assert_close(a, t, atol=1e-12, rtol=1e-12)


def test_group_norm_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match=r"num_channels \(7\) must be divisible by num_groups"):
        GroupNorm(2, 7)
    with pytest.raises(ValueError, match=r"expects input of shape \(N, 6, \*\)"):
        GroupNorm(2, 6)(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="C = input.shape.1. = 7 must be divisible"):
        group_norm(torch.randn(2, 7, 4), 2)  # torch's OpInfo error input
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        group_norm(torch.randn(4), 1)
    with pytest.raises(ValueError, match=r"weight must have shape \(6,\)"):
        group_norm(torch.randn(2, 6), 2, torch.ones(3))
    with pytest.raises(ValueError, match="num_groups must be a positive int"):
        group_norm(torch.randn(2, 6), 0)
    with pytest.raises(ValueError, match="eps"):
        group_norm(torch.randn(2, 6), 2, eps=0.0)
    with pytest.raises(ValueError, match="num_groups must be a positive int"):
        GroupNorm(0, 4)


def test_group_norm_module_reset_parameters_device_and_dtype():
    m = GroupNorm(2, 4, dtype=torch.float64)
    with torch.no_grad():
        m.weight.fill_(3.0)
        m.bias.fill_(3.0)
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(4, dtype=torch.float64))
    assert torch.equal(m.bias, torch.zeros(4, dtype=torch.float64))
    assert GroupNorm(2, 4, device="meta").bias.device.type == "meta"


def test_group_norm_constant_group_gives_bias_and_half_inputs_do_not_overflow():
    b = torch.arange(4.0)
    y = group_norm(torch.full((2, 4, 3), 7.0), 2, torch.ones(4), b)
    assert torch.equal(y, b.view(1, 4, 1).expand(2, 4, 3))
    x = torch.full((1, 2, 4), 300.0, dtype=torch.float16)
    x[0, :, 0] = 200.0
    y = group_norm(x, 1)
    assert torch.isfinite(y).all() and y.dtype == torch.float16


# ---------------------------------------------------------------------------------------------
# exact identities
# ---------------------------------------------------------------------------------------------


def test_group_norm_with_one_group_is_layer_norm_over_c_h_w():
    torch.manual_seed(0)
    x = torch.randn(5, 6, 4, 3, dtype=torch.float64) * 3 + 1
    w, b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    ln = layer_norm(x, (6, 4, 3))
    torch.testing.assert_close(group_norm(x, 1), ln, atol=1e-12, rtol=0)
    affine = ln * w.view(6, 1, 1) + b.view(6, 1, 1)  # LN over (C, H, W), then per channel
    torch.testing.assert_close(group_norm(x, 1, w, b), affine, atol=1e-12, rtol=0)


def test_group_norm_with_one_channel_per_group_is_instance_norm():
    torch.manual_seed(1)
    x = torch.randn(5, 6, 4, 3, dtype=torch.float64) * 3 + 1
    w, b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    inst = F.instance_norm(x, weight=w, bias=b, eps=1e-5)
    torch.testing.assert_close(group_norm(x, 6, w, b), inst, atol=1e-12, rtol=0)


def test_group_norm_output_of_a_sample_ignores_its_batch_mates():
    torch.manual_seed(2)
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    other = torch.cat([x[:1], 100 * torch.randn(7, 6, 5, dtype=torch.float64)])
    torch.testing.assert_close(group_norm(x, 3)[0], group_norm(other, 3)[0], atol=0, rtol=0)
    torch.testing.assert_close(group_norm(x, 3)[0], group_norm(x[:1], 3)[0], atol=0, rtol=0)


def test_rms_norm_equals_layer_norm_for_zero_mean_rows():
    torch.manual_seed(3)
    x = torch.randn(8, 3, 16, dtype=torch.float64) * 4
    x = x - x.mean(-1, keepdim=True)
    w = torch.randn(16, dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x, 16, w, eps=1e-5),
                               layer_norm(x, 16, w, None, eps=1e-5), atol=1e-12, rtol=0)
    shifted = x + 0.5  # the same rows, not centred: the two now differ
    gap = (rms_norm(shifted, 16, w, 1e-5) - layer_norm(shifted, 16, w, None, 1e-5)).abs().max()
    assert gap > 0.01


def test_rms_norm_is_invariant_to_rescaling_not_to_recentering():
    torch.manual_seed(4)
    x = torch.randn(6, 32, dtype=torch.float64)
    y = rms_norm(x, 32, eps=1e-30)  # eps negligible, so the invariance is exact to rounding
    for a in (1e-3, 0.5, 7.0, 1e4):
        torch.testing.assert_close(rms_norm(a * x, 32, eps=1e-30), y, atol=1e-13, rtol=0)
    torch.testing.assert_close(rms_norm(-3.0 * x, 32, eps=1e-30), -y, atol=1e-13, rtol=0)
    # weight-matrix re-scaling (Table 1's "weight matrix re-scaling" column): x = h W^T
    h, wm = torch.randn(6, 10, dtype=torch.float64), torch.randn(32, 10, dtype=torch.float64)
    torch.testing.assert_close(rms_norm(h @ (5 * wm).T, 32, eps=1e-30),
                               rms_norm(h @ wm.T, 32, eps=1e-30), atol=1e-13, rtol=0)
    # re-centering: adding the same vector to every row changes the output (LN's does not)
    shift = 2.0 * torch.ones(32, dtype=torch.float64)
    assert (rms_norm(x + shift, 32) - rms_norm(x, 32)).abs().max() > 0.1
    torch.testing.assert_close(layer_norm(x + shift, 32), layer_norm(x, 32), atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------
# DyT
# ---------------------------------------------------------------------------------------------


def test_dyt_parameters_values_and_state_dict():
    m = DyT((3, 4), alpha_init=0.7, dtype=torch.float64)
    assert [n for n, _ in m.named_parameters()] == ["alpha", "weight", "bias"]
    assert m.alpha.shape == (1,) and m.alpha.detach().item() == 0.7
    assert torch.equal(m.weight, torch.ones(3, 4, dtype=torch.float64))
    assert torch.equal(m.bias, torch.zeros(3, 4, dtype=torch.float64))
    torch.manual_seed(5)
    authors = {"alpha": torch.tensor([1.3], dtype=torch.float64),  # the authors' shapes
               "weight": torch.randn(3, 4, dtype=torch.float64),
               "bias": torch.randn(3, 4, dtype=torch.float64)}
    m.load_state_dict(authors)
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    y = m(x)
    expected = authors["weight"] * torch.tanh(1.3 * x) + authors["bias"]
    assert y.shape == x.shape
    torch.testing.assert_close(y, expected, atol=1e-15, rtol=0)
    torch.testing.assert_close(dyt(x, 1.3, authors["weight"], authors["bias"]), expected,
                               atol=1e-15, rtol=0)
    m.reset_parameters()
    assert m.alpha.detach().item() == 0.7 and torch.equal(m.bias, torch.zeros_like(m.bias))
    assert repr(m) == "DyT((3, 4), alpha_init=0.7)"


def test_dyt_saturates_and_learns_alpha():
    m = DyT(8)
    x = torch.linspace(-50, 50, 8).expand(2, 8)
    y = m(x).detach()
    assert y.abs().max() <= 1 and float(y[0, -1]) > 0.999  # bounded, S-shaped
    (m(torch.randn(4, 8)) ** 2).sum().backward()
    assert m.alpha.grad is not None and m.alpha.grad.shape == (1,) and m.alpha.grad.abs() > 0
    x64 = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    a = torch.tensor([0.8], dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(dyt, (x64, a, w, b))


def test_dyt_bad_arguments():
    with pytest.raises(ValueError, match="trailing dimensions"):
        DyT(8)(torch.randn(2, 4))
    with pytest.raises(ValueError, match="alpha_init must be a finite number"):
        DyT(8, alpha_init=float("nan"))
    with pytest.raises(ValueError, match="alpha must be a scalar"):
        dyt(torch.randn(2, 4), torch.ones(4))
    with pytest.raises(TypeError, match="floating-point"):
        DyT(4)(torch.ones(2, 4, dtype=torch.long))
    assert DyT(4, device="meta").alpha.device.type == "meta"


# ---------------------------------------------------------------------------------------------
# function transforms and compilation
# ---------------------------------------------------------------------------------------------


def test_variants_work_under_torch_func_grad_and_vmap():
    torch.manual_seed(6)
    x = torch.randn(5, 6, 4, dtype=torch.float64)
    w = torch.randn(4, dtype=torch.float64)
    gw = torch.randn(6, dtype=torch.float64)
    # vmap over the batch gives the batched call
    torch.testing.assert_close(torch.func.vmap(lambda r: rms_norm(r, 4, w))(x), rms_norm(x, 4, w))
    per_sample = torch.func.vmap(lambda s: group_norm(s.unsqueeze(0), 3, gw).squeeze(0))(x)
    torch.testing.assert_close(per_sample, group_norm(x, 3, gw))
    torch.testing.assert_close(torch.func.vmap(lambda r: dyt(r, 0.5, w))(x), dyt(x, 0.5, w))
    # torch.func.grad equals autograd
    for fn in (lambda t: rms_norm(t, 4, w).pow(3).sum(),
               lambda t: group_norm(t, 2, gw).pow(3).sum(),
               lambda t: dyt(t, 0.5, w).pow(3).sum()):
        xr = x.clone().requires_grad_()
        (expected,) = torch.autograd.grad(fn(xr), xr)
        torch.testing.assert_close(torch.func.grad(fn)(x), expected)


def test_variants_compile_in_one_graph():
    torch.compiler.reset()
    torch.manual_seed(7)
    x = torch.randn(3, 4, 8)
    w, gw = torch.randn(8), torch.randn(4)

    def f(x):
        return rms_norm(x, 8, w) + group_norm(x, 2, gw) + dyt(x, 0.5, w)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), f(x))
    xr = x.clone().requires_grad_()
    (g_compiled,) = torch.autograd.grad(compiled(xr).sum(), xr)
    (g_eager,) = torch.autograd.grad(f(xr).sum(), xr)
    torch.testing.assert_close(g_compiled, g_eager)


def test_part_two_names_are_re_exported():
    names = ("rms_norm", "RMSNorm", "group_norm", "GroupNorm", "dyt", "DyT", "Block",
             "Transformer", "to_pre_rmsnorm", "copy_task", "sort_task", "associative_recall",
             "load_digits_tensor", "variants", "transformer")
    for name in names:
        assert hasattr(lnbook, name) and name in lnbook.__all__, name
    assert lnbook.RMSNorm is RMSNorm and lnbook.group_norm is group_norm


@pytest.mark.parametrize("x_dtype,p_dtype", [(torch.float64, torch.float32),
                                             (torch.float32, torch.float64)])
def test_group_norm_refuses_a_dtype_mismatch_as_torch_does(x_dtype, p_dtype):
    x = torch.randn(2, 4, 3).to(x_dtype)
    with pytest.raises(RuntimeError) as torch_error:  # "mixed dtype (CPU): ..."
        torch.nn.GroupNorm(2, 4, dtype=p_dtype)(x)
    with pytest.raises(type(torch_error.value),
                       match=f"input dtype {x_dtype} does not match the dtype {p_dtype}"):
        GroupNorm(2, 4, dtype=p_dtype)(x)
    with pytest.raises(TypeError, match="does not match"):
        group_norm(x, 2, torch.ones(4, dtype=p_dtype), torch.zeros(4, dtype=p_dtype))
    half = torch.randn(2, 4, 3, dtype=torch.bfloat16)  # float32 parameters: allowed, as torch
    torch.testing.assert_close(GroupNorm(2, 4)(half), torch.nn.GroupNorm(2, 4)(half))


def test_rms_norm_takes_mixed_dtypes_as_torch_does():
    """torch.nn.RMSNorm accepts a float64 input into a float32 module (and warns that it cannot
    use its fused kernel): lnbook's does too, with the input's dtype out."""
    x = torch.randn(3, 4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Mismatch dtype", UserWarning)
        want = torch.nn.RMSNorm(4)(x)
    got = RMSNorm(4)(x)
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want)
