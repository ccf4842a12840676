"""The exercise checkers of chapter 3: right answers pass, each wrong one gets its diagnosis.

Every wrong implementation below is a mistake a reader can make; the test asserts the part the
checker names (``ExerciseError.part``) and a phrase of its advice, so that a checker that
passes everything, or blames the wrong part, fails here.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lnbook
from lnbook import exercises as ex

# --- Exercise 3.1: the forward pass -----------------------------------------------------------


def dims_of(x, shape):
    return tuple(range(x.dim() - len(shape), x.dim()))


def by_hand(x, shape, g, b, eps=1e-5):
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=dims, keepdim=True)
    return g * (x - mu) / torch.sqrt(var + eps) + b


def unbiased(x, shape, g, b, eps=1e-5):
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True)
    return g * (x - mu) / torch.sqrt(x.var(dim=dims, keepdim=True) + eps) + b


def eps_outside(x, shape, g, b, eps=1e-5):
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True)
    sd = ((x - mu) ** 2).mean(dim=dims, keepdim=True).sqrt()
    return g * (x - mu) / (sd + eps) + b


def no_eps(x, shape, g, b, eps=1e-5):
    return by_hand(x, shape, g, b, eps=0.0)


def eps_fixed(x, shape, g, b, eps=1e-5):
    return by_hand(x, shape, g, b, 1e-5)


def over_batch(x, shape, g, b, eps=1e-5):
    mu = x.mean(dim=0, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=0, keepdim=True)
    return g * (x - mu) / torch.sqrt(var + eps) + b


def last_dim_only(x, shape, g, b, eps=1e-5):
    return by_hand(x, (shape[-1],), g, b, eps)


def swapped(x, shape, g, b, eps=1e-5):
    return by_hand(x, shape, b, g, eps)


def no_bias(x, shape, g, b, eps=1e-5):
    return by_hand(x, shape, g, torch.zeros_like(b), eps)


def by_variance(x, shape, g, b, eps=1e-5):
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True)
    return g * (x - mu) / (((x - mu) ** 2).mean(dim=dims, keepdim=True) + eps) + b


def not_centred(x, shape, g, b, eps=1e-5):
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True)
    return g * x / torch.sqrt(((x - mu) ** 2).mean(dim=dims, keepdim=True) + eps) + b


def no_keepdim(x, shape, g, b, eps=1e-5):
    return x.mean(dim=dims_of(x, shape))


def in_float64(x, shape, g, b, eps=1e-5):
    return by_hand(x.double(), shape, g.double(), b.double(), eps)


def in_float32(x, shape, g, b, eps=1e-5):
    return by_hand(x.float(), shape, g.float(), b.float(), eps).to(x.dtype)


def nan_on_constant_rows(x, shape, g, b, eps=1e-5):
    dims = dims_of(x, shape)
    var = ((x - x.mean(dim=dims, keepdim=True)) ** 2).mean(dim=dims, keepdim=True)
    return by_hand(x, shape, g, b, eps) * (var / var)


def crashes(x, shape, g, b, eps=1e-5):
    return x.mean(dim=-1, keepdim=True) @ g  # a shape error


def one_pass(x, shape, g, b, eps=1e-5):  # E[x^2] - E[x]^2: right in exact arithmetic
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True)
    var = (x * x).mean(dim=dims, keepdim=True) - mu * mu
    return g * (x - mu) / torch.sqrt(var + eps) + b


def one_pass_clamped(x, shape, g, b, eps=1e-5):  # no NaN, still the cancellation
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True)
    var = ((x * x).mean(dim=dims, keepdim=True) - mu * mu).clamp_min(0)
    return g * (x - mu) / torch.sqrt(var + eps) + b


def detached(x, shape, g, b, eps=1e-5):  # the right values, the statistics cut from the graph
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims, keepdim=True).detach()
    var = ((x - mu) ** 2).mean(dim=dims, keepdim=True).detach()
    return g * (x - mu) / torch.sqrt(var + eps) + b


def through_numpy(x, shape, g, b, eps=1e-5):  # the right values, no graph at all
    return torch.from_numpy(by_hand(x.detach(), shape, g, b, eps).numpy())


def unbiased_eps_outside(x, shape, g, b, eps=1e-5):  # two slips at once: no catalog entry
    dims = dims_of(x, shape)
    return g * (x - x.mean(dim=dims, keepdim=True)) / (x.std(dim=dims, keepdim=True) + eps) + b


@pytest.mark.parametrize("fn", [F.layer_norm, lnbook.layer_norm, by_hand],
                         ids=["torch", "lnbook", "by_hand"])
def test_right_forward_passes(fn):
    report = ex.check_layer_norm(fn)
    assert len(report.checks) == 9
    assert all("max |yours - torch|" in seen for _, seen in report.checks)
    # the float64 cases compare the gradient with respect to x too
    assert sum("; gradient" in seen for _, seen in report.checks) == 7
    md = report._repr_markdown_()
    assert "| check | result |" in md and "all 9 checks passed" in md


@pytest.mark.parametrize("fn, part, phrase", [
    (unbiased, "variance", "unbiased=False"),
    (eps_outside, "eps", "outside the square root"),
    (no_eps, "eps", "eps is missing"),
    (eps_fixed, "eps", "passed eps = 0.5"),
    (over_batch, "axes", "batch normalization"),
    (last_dim_only, "axes", "last dimension only"),
    (swapped, "gain/bias", "swapped"),
    (no_bias, "gain/bias", "bias b is never added"),
    (by_variance, "variance", "square root"),
    (not_centred, "mean", "x - mu"),
    (no_keepdim, "shape", "keepdim=True"),
    (in_float64, "dtype", "keep the input's dtype"),
    (in_float32, "other", "lower precision"),
    (nan_on_constant_rows, "eps", "constant row"),
    (crashes, "error", "It was called as fn(x, (8,), g, b, 1e-05)"),
    (unbiased_eps_outside, "variance", "unbiased=False"),
    (one_pass, "variance", "E[x^2] - E[x]^2"),
    (one_pass_clamped, "variance", "E[x^2] - E[x]^2"),
    (detached, "gradient", "the mean and the variance detached"),
    (through_numpy, "gradient", "no gradient reaches x"),
])
def test_wrong_forward_gets_its_diagnosis(fn, part, phrase):
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm(fn)
    assert info.value.part == part, str(info.value)
    assert phrase in str(info.value)
    assert isinstance(info.value, AssertionError)  # a wrong solution fails an executed notebook


def test_unknown_mistakes_are_blamed_on_the_part_their_case_probes():
    def gain_twice(x, shape, g, b, eps=1e-5):  # no catalog entry; right when g = 1
        return by_hand(x, shape, g * g, b, eps)

    def both_dims_as_last(x, shape, g, b, eps=1e-5):  # right for one trailing dimension only
        if len(shape) == 1:
            return by_hand(x, shape, g, b, eps)
        return by_hand(x.flip(-1), shape, g, b, eps).flip(-1) * 1.1

    for fn, part in ((gain_twice, "gain/bias"), (both_dims_as_last, "axes")):
        with pytest.raises(ex.ExerciseError) as info:
            ex.check_layer_norm(fn)
        assert info.value.part == part, str(info.value)


def test_forward_checker_refuses_a_non_function():
    with pytest.raises(TypeError, match="takes your function"):
        ex.check_layer_norm(torch.zeros(3))


# --- Exercise 3.2: the backward pass ----------------------------------------------------------


def backward(dy, x, g, eps=1e-5, *, mean_u=True, proj=1.0, gain=True, dg_x=False,
             db_mean=False, summed=True, sigma_eps=True, eps_outside=False, unbiased=False,
             divide=True, order=(0, 1, 2)):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    if unbiased:
        var = x.var(-1, keepdim=True)  # torch.var's default: divided by H - 1
    sigma = (var + eps).sqrt() if sigma_eps else var.sqrt()
    if eps_outside:
        sigma = var.sqrt() + eps
    x_hat = (x - mu) / sigma
    u = dy * g if gain else dy
    m = u.mean(-1, keepdim=True) if mean_u else 0.0
    dx = u - m - proj * x_hat * (u * x_hat).mean(-1, keepdim=True)
    dx = dx / sigma if divide else dx
    dg = (dy * (x if dg_x else x_hat))
    db = dy.mean(0) if db_mean else dy.sum(0)
    out = (dx, dg.sum(0) if summed else dg, db)
    return tuple(out[k] for k in order)


def by_autograd(forward):
    """A reader's backward that is autograd through their own (wrong) forward."""
    def grads(dy, x, g, eps):
        x, g = x.clone().requires_grad_(), g.clone().requires_grad_()
        b = torch.zeros_like(g, requires_grad=True)
        return torch.autograd.grad((forward(x, (x.shape[-1],), g, b, eps) * dy).sum(), (x, g, b))
    return grads


def test_right_backward_passes():
    report = ex.check_layer_norm_backward(backward)
    assert len(report.checks) == 6  # three gradients, two cases
    assert [c.split(":")[0] for c, _ in report.checks[:3]] == ["dL/db", "dL/dg", "dL/da"]


@pytest.mark.parametrize("kwargs, part, phrase", [
    ({"mean_u": False}, "dL/da", "- mean(u) is missing"),
    ({"proj": 0.0}, "dL/da", "a_hat * mean(u * a_hat) is missing"),
    ({"mean_u": False, "proj": 0.0}, "dL/da", "only u / sigma"),
    ({"proj": -1.0}, "dL/da", "wrong sign"),
    ({"gain": False}, "dL/da", "u = dL/dy * g"),
    ({"sigma_eps": False}, "dL/dg", "no eps"),
    ({"dg_x": True}, "dL/dg", "not by a"),
    ({"db_mean": True}, "dL/db", "you averaged"),
    ({"summed": False}, "shape", ".sum(0)"),
    ({"eps_outside": True}, "dL/dg", "eps outside the square root"),
    ({"unbiased": True}, "dL/dg", "unbiased variance"),
    ({"divide": False}, "dL/da", "not divided by sigma"),
    ({"order": (1, 0, 2)}, "order", "returned (dL/dg, dL/da, dL/db)"),
    ({"order": (0, 2, 1)}, "order", "returned (dL/da, dL/db, dL/dg)"),
    ({"order": (2, 1, 0)}, "order", "returned (dL/db, dL/dg, dL/da)"),
    ({"order": (1, 0, 2), "proj": 0.0}, "order", "swapped"),  # wrong and in the wrong order
])
def test_wrong_backward_gets_its_diagnosis(kwargs, part, phrase):
    def wrong(dy, x, g, eps):
        return backward(dy, x, g, eps, **kwargs)

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(wrong)
    assert info.value.part == part, str(info.value)
    assert phrase in str(info.value)


@pytest.mark.parametrize("forward, phrase", [
    (eps_outside, "eps outside the square root"), (unbiased, "unbiased variance")])
def test_backward_of_a_wrong_forward_is_named(forward, phrase):
    # the exact derivative of a wrong forward: what autograd gives through the reader's forward
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(by_autograd(forward))
    assert info.value.part == "dL/dg", str(info.value)
    assert phrase in str(info.value)


def test_row_sum_hint_does_not_pass_a_wrong_answer():
    # rows that sum to 0 and are orthogonal to a_hat, but 1.5 times too large: no catalog entry
    def too_large(dy, x, g, eps):
        dx, dg, db = backward(dy, x, g, eps)
        return 1.5 * dx, dg, db

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(too_large)
    msg = str(info.value)
    assert info.value.part == "dL/da"
    assert "necessary, not sufficient" in msg and "finite difference" in msg
    fd, yours = (float(v) for v in
                 re.search(r"here (\S+) \(h = 1e-06\) against your (\S+)\.", msg).groups())
    assert abs(yours / fd - 1.5) < 1e-4  # the finite difference shows the factor


def test_backward_unknown_mistake_names_the_gradient_and_the_row_sums():
    def off(dy, x, g, eps):
        dx, dg, db = backward(dy, x, g, eps)
        return dx + 0.01, dg, db

    with pytest.raises(ex.ExerciseError, match="each row of dL/da must sum to 0") as info:
        ex.check_layer_norm_backward(off)
    assert info.value.part == "dL/da"


def test_backward_must_return_three_tensors():
    with pytest.raises(ex.ExerciseError, match="three tensors") as info:
        ex.check_layer_norm_backward(lambda dy, x, g, eps: backward(dy, x, g, eps)[:2])
    assert info.value.part == "type"


# --- Exercise 3.3: LN in an MLP, trained ------------------------------------------------------


def ln_mlp():
    return nn.Sequential(nn.Linear(64, 64), lnbook.LayerNorm(64), nn.ReLU(),
                         nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 10))


class Silent(nn.Module):
    """LN in the right places, but the logits are multiplied by 0: nothing can be learned."""

    def __init__(self):
        super().__init__()
        self.net = ln_mlp()

    def forward(self, x):
        return 0.0 * self.net(x)


def test_digits_split_and_the_trivial_predictor():
    x, y, xt, yt = ex.digits_split()
    assert x.shape == (1438, 64) and xt.shape == (359, 64) and 0 <= x.min() and x.max() <= 1
    trivial = ex.prior_nll(y, yt)
    assert abs(trivial - math.log(10)) < 0.01  # the classes are nearly balanced
    assert ex.prior_nll(torch.tensor([0, 0, 0, 1]), torch.tensor([0]), classes=2) == (
        pytest.approx(-math.log(4 / 6)))  # add-one smoothing: (3 + 1) / (4 + 2)


def test_right_mlp_passes_and_learns():
    report = ex.check_ln_mlp(ln_mlp)
    f = report.figures
    assert f["nll_after"] < 0.5 * f["trivial_nll"] < f["nll_before"]
    assert f["error_after"] < 0.2
    assert "Linear -> LayerNorm -> ReLU -> Linear -> LayerNorm" in report.checks[0][1]


@pytest.mark.parametrize("model_fn, part, phrase", [
    (lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
     "placement", "no LayerNorm"),
    (lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 10)),
     "placement", "before it (eq. 3)"),
    (lambda: nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10)),
     "placement", "two hidden layers"),
    (lambda: nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10),
                           nn.LayerNorm(10)), "placement", "logits"),
    (lambda: nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(),
                           nn.Linear(32, 10)), "placement", "batch normalization"),
    (lambda: nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 7)),
     "output", "(8, 10)"),
    (lambda: nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 10),
                           nn.Softmax(dim=-1)), "output", "probabilities"),
    (lambda: nn.Linear(64, 10), "placement", "no LayerNorm"),
    (lambda: "not a model", "type", "nn.Module"),
    (Silent, "training", "class frequencies"),
])
def test_wrong_mlp_gets_its_diagnosis(model_fn, part, phrase):
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_ln_mlp(model_fn, steps=60)
    assert info.value.part == part, str(info.value)
    assert phrase in str(info.value)
