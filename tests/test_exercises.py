"""The exercise checkers of chapter 3: right answers pass, each wrong one gets its diagnosis.

Every wrong implementation below is a mistake a reader can make; the test asserts the part the
checker names (``ExerciseError.part``) and a phrase of its advice, so that a checker that
passes everything, or blames the wrong part, fails here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lnbook
from lnbook import exercises as ex
from lnbook.engine.metrics import prior_nll

# --- Exercise 3.1: the forward pass -----------------------------------------------------------


def said(err: Exception) -> str:
    """A checker's message with its line breaks undone (it is wrapped for the page)."""
    return " ".join(str(err).split())


def test_a_checker_message_is_wrapped_for_the_page_with_its_words_unchanged():
    long = "the variance is the unbiased one; " * 8
    err = ex.ExerciseError("check_layer_norm", "variance", long.strip(), "x (4, 8)")
    lines = str(err).splitlines()
    assert len(lines) > 2 and max(map(len, lines)) <= 88, lines
    assert lines[1].startswith("  the")  # continuation lines indented under the first
    assert said(err) == f"check_layer_norm: {long.strip()} (test case: x (4, 8))"


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


def mutates_x(x, shape, g, b, eps=1e-5):  # right values, but the caller's x is centred
    dims = dims_of(x, shape)
    x -= x.mean(dim=dims, keepdim=True)
    return g * x / torch.sqrt((x**2).mean(dim=dims, keepdim=True) + eps) + b


def rewraps_gain(x, shape, g, b, eps=1e-5):  # right values; g and b cut from the graph
    g, b = torch.tensor(g), torch.tensor(b)
    return by_hand(x, shape, g, b, eps)


def keepdim_forgotten(x, shape, g, b, eps=1e-5):
    dims = dims_of(x, shape)
    mu = x.mean(dim=dims)
    return g * (x - mu) / torch.sqrt(((x - mu) ** 2).mean(dim=dims) + eps) + b


def gain_column(x, shape, g, b, eps=1e-5):
    return by_hand(x, shape, g[:, None], b, eps)


def gain_over_dim_1(x, shape, g, b, eps=1e-5):  # as batch norm holds its per-channel gain
    return by_hand(x, shape, g.reshape(1, -1, 1), b, eps)


def gain_flattened(x, shape, g, b, eps=1e-5):  # right for one trailing dimension only
    return by_hand(x, shape, g.reshape(-1), b.reshape(-1), eps)


def gain_flattened_with_x(x, shape, g, b, eps=1e-5):  # right statistics, returned flattened
    y = by_hand(x, shape, torch.ones(shape, dtype=x.dtype), torch.zeros(shape, dtype=x.dtype),
                eps)
    return g.flatten() * y.flatten(-len(shape)) + b.flatten()


def eps_hard_coded(x, shape, g, b, eps=1e-5):
    return by_hand(x, shape, g, b, 1e-6)


def divided_by_d_plus_1(x, shape, g, b, eps=1e-5):  # no catalog entry, not unbiased either
    dims = dims_of(x, shape)
    d = math.prod(shape)
    mu = x.mean(dim=dims, keepdim=True)
    var = ((x - mu) ** 2).sum(dim=dims, keepdim=True) / (d + 1)
    return g * (x - mu) / torch.sqrt(var + eps) + b


@pytest.mark.parametrize("fn", [F.layer_norm, lnbook.layer_norm, by_hand],
                         ids=["torch", "lnbook", "by_hand"])
def test_right_forward_passes(fn):
    report = ex.check_layer_norm(fn)
    assert len(report.checks) == 10  # nine cases and gradcheck
    assert all("max |yours - torch|" in seen for _, seen in report.checks[:9])
    # the float64 cases compare the gradients with respect to x, g and b too
    assert sum("; gradients (x, g, b)" in seen for _, seen in report.checks) == 6
    assert sum("; gradients x " in seen for _, seen in report.checks) == 1  # g = 1, b = 0
    assert report.checks[9][0].startswith("gradcheck through x, g and b")
    assert report.checks[9][1] == "passes"
    md = report._repr_markdown_()
    assert "| check | result |" in md and "all 10 checks passed" in md


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
    (mutates_x, "in-place", "changed its input x in place"),
    (rewraps_gain, "gradient", "made a new tensor with torch.tensor(g)"),
    (keepdim_forgotten, "shape", "keep the statistics with keepdim=True"),
    (gain_column, "gain/bias", "(a column)"),
    (gain_over_dim_1, "gain/bias", "g has the shape normalized_shape (8,)"),
    (gain_flattened, "gain/bias", "flattened it to (15,)"),
    (gain_flattened_with_x, "shape", "come back flattened"),
    (eps_hard_coded, "eps", "torch's layer norm with eps = 1e-06"),
    (divided_by_d_plus_1, "variance", "not the (D - 1) / D = 7/8 of an unbiased variance"),
])
@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")  # torch.tensor(g)
def test_wrong_forward_gets_its_diagnosis(fn, part, phrase):
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm(fn)
    assert info.value.part == part, str(info.value)
    assert phrase in said(info.value)
    assert isinstance(info.value, AssertionError)  # a wrong solution fails an executed notebook
    lines = str(info.value).splitlines()  # wrapped to fit the book's column when printed
    assert max(map(len, lines)) <= 88 or any(len(w) > 80 for w in str(info.value).split())


@pytest.mark.parametrize("fn", [eps_hard_coded, gain_flattened, gain_flattened_with_x,
                                divided_by_d_plus_1])
def test_fallbacks_blame_only_what_the_evidence_shows(fn):
    # the D - 1 divisor only when the variance is (D - 1) / D; statistics only when they are wrong
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm(fn)
    msg = said(info.value)
    assert "unbiased=False" not in msg and "keepdim=True so that mu" not in msg, msg


def test_in_place_on_a_leaf_that_requires_grad_is_named():
    def mutates_g(x, shape, g, b, eps=1e-5):  # changes g only when it is a leaf requiring grad
        y = by_hand(x, shape, g, b, eps)
        if g.requires_grad:
            g.mul_(1.0)
        return y

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm(mutates_g)
    assert info.value.part == "in-place", str(info.value)
    assert "tensor that requires grad" in said(info.value)


def test_in_place_on_a_saved_intermediate_is_named():
    def divides_in_place(x, shape, g, b, eps=1e-5):
        dims = dims_of(x, shape)
        xc = x - x.mean(dim=dims, keepdim=True)
        sd = torch.sqrt((xc**2).mean(dim=dims, keepdim=True) + eps)
        return g * xc.div_(sd) + b  # xc was saved by xc**2 for the backward pass

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm(divides_in_place)
    assert info.value.part == "in-place", str(info.value)
    assert "saved for the backward pass" in said(info.value)


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


# --- Exercise 3.4: the backward pass ----------------------------------------------------------


def backward(dy, x, g, eps=1e-5, *, mean_u=True, proj=1.0, gain=True, dg_x=False,
             db_mean=False, summed=True, sigma_eps=True, eps_outside=False, unbiased=False,
             divide=True, order=(0, 1, 2), gain_in=("first", "mean", "proj"), last="a_hat",
             dg_centred=False, sums=(), keepdim=True, mutate_dy=False, rows_only=False):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    if unbiased:
        var = x.var(-1, keepdim=True)  # torch.var's default: divided by H - 1
    sigma = (var + eps).sqrt() if sigma_eps else var.sqrt()
    if eps_outside:
        sigma = var.sqrt() + eps
    x_hat = (x - mu) / sigma
    lead = (0,) if rows_only else tuple(range(x.dim() - 1))  # every dimension but the last
    db = dy.mean(lead) if db_mean else dy.sum(lead)
    dg = (dy * (x if dg_x else (x - mu) if dg_centred else x_hat))
    dg = dg.sum(lead) if summed else dg
    if mutate_dy:  # after dL/db and dL/dg are taken: u written over the caller's dy
        dy.mul_(g)
    u = dy if mutate_dy else dy * g if gain else dy

    def row(t, name):  # the mean over the row, or the sum where the slip says so
        r = t.sum(-1, keepdim=keepdim) if name in sums else t.mean(-1, keepdim=keepdim)
        return r

    first = u if "first" in gain_in else dy
    m = row(u if "mean" in gain_in else dy, "u") if mean_u else 0.0
    centred = x - mu
    outer = centred if last in ("c_first", "c_both") else x_hat
    inner = centred if last in ("c_second", "c_both") else x_hat
    dx = first - m - proj * outer * row((u if "proj" in gain_in else dy) * inner, "ua")
    dx = dx / sigma if divide else dx
    out = (dx, dg, db)
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
    assert len(report.checks) == 9  # three gradients, three cases
    assert [c.split(":")[0] for c, _ in report.checks[:3]] == ["dL/db", "dL/dg", "dL/da"]
    assert "(B, T, H)" in report.checks[-1][0]
    # the autograd of a right forward is a right backward too
    assert len(ex.check_layer_norm_backward(by_autograd(by_hand)).checks) == 9


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
    ({"mutate_dy": True}, "in-place", "changed its input dy in place"),
    ({"keepdim": False}, "shape", "keep the statistics with keepdim=True"),
    ({"gain_in": ("first", "proj")}, "dL/da", "the mean(u) term used dL/dy without g"),
    ({"gain_in": ("first", "mean")}, "dL/da", "mean(u * a_hat) term used dL/dy without g"),
    ({"gain_in": ("first",)}, "dL/da", "only the first term has g"),
    ({"gain_in": ("mean", "proj")}, "dL/da", "the first term is dL/dy without g"),
    ({"last": "c_first"}, "dL/da", "(a - mu) * mean(u * a_hat) or a_hat * mean(u * (a - mu))"),
    ({"last": "c_second"}, "dL/da", "sigma times too large"),
    ({"last": "c_both"}, "dL/da", "yours is (a - mu) * mean(u * (a - mu))"),
    ({"dg_centred": True}, "dL/dg", "you used a - mu"),
    ({"sums": ("u",)}, "dL/da", "sum(u) instead of mean(u)"),
    ({"sums": ("ua",)}, "dL/da", "sum(u * a_hat) instead of mean(u * a_hat)"),
    ({"sums": ("u", "ua")}, "dL/da", "sum(u) and sum(u * a_hat) instead of their means"),
    ({"rows_only": True}, "shape", ".sum((0, 1)) for (B, T, H)"),  # passes (N, H), not 3-D
])
def test_wrong_backward_gets_its_diagnosis(kwargs, part, phrase):
    def wrong(dy, x, g, eps):
        return backward(dy, x, g, eps, **kwargs)

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(wrong)
    assert info.value.part == part, str(info.value)
    assert phrase in said(info.value)


@pytest.mark.parametrize("forward, phrase", [
    (eps_outside, "eps outside the square root"), (unbiased, "unbiased variance")])
def test_backward_of_a_wrong_forward_is_named(forward, phrase):
    # the exact derivative of a wrong forward: what autograd gives through the reader's forward
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(by_autograd(forward))
    assert info.value.part == "dL/dg", str(info.value)
    assert phrase in said(info.value)


def test_row_sum_hint_does_not_pass_a_wrong_answer():
    # rows that sum to 0 and are orthogonal to a_hat, but 1.5 times too large: no catalog entry
    def too_large(dy, x, g, eps):
        dx, dg, db = backward(dy, x, g, eps)
        return 1.5 * dx, dg, db

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(too_large)
    msg = said(info.value)
    assert info.value.part == "dL/da"
    assert "necessary, not sufficient" in msg and "finite difference" in msg
    fd, yours = (float(v) for v in
                 re.search(r"here (\S+) \(h = 1e-06\) against your (\S+)\.", msg).groups())
    assert abs(yours / fd - 1.5) < 1e-4  # the finite difference shows the factor


def test_backward_unknown_mistake_names_the_gradient_and_the_row_sums():
    def off(dy, x, g, eps):
        dx, dg, db = backward(dy, x, g, eps)
        return dx + 0.01, dg, db

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(off)
    assert info.value.part == "dL/da"
    assert "each row of dL/da must sum to 0" in said(info.value)


def test_backward_must_return_three_tensors():
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_backward(lambda dy, x, g, eps: backward(dy, x, g, eps)[:2])
    assert info.value.part == "type"
    assert "three tensors" in said(info.value)


# --- Exercise 3.7: LN as a torch.autograd.Function -------------------------------------------


def make_function(**slips):
    """Layer norm over the last dimension as an autograd.Function, its backward by hand;
    ``slips``: the keywords of :func:`backward`, plus ``n_grads`` (how many it returns)."""
    n_grads = slips.pop("n_grads", 4)

    class LN(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, g, b, eps):
            ctx.save_for_backward(x, g)
            ctx.eps = eps
            return by_hand(x, (x.shape[-1],), g, b, eps)

        @staticmethod
        def backward(ctx, dy):
            x, g = ctx.saved_tensors
            return (*backward(dy, x, g, ctx.eps, **slips), None)[:n_grads]

    return LN


def test_right_function_passes_with_gradcheck():
    report = ex.check_layer_norm_function(make_function())
    names = [c for c, _ in report.checks]
    assert len(names) == 8 + 9 + 2  # forward cases of one trailing dim, backward, gradcheck
    assert all(seen == "passes" for c, seen in report.checks if c.startswith("gradcheck"))
    assert sum(c.startswith("gradcheck") for c in names) == 2


@pytest.mark.parametrize("slips, part, phrase", [
    ({"mean_u": False}, "dL/da", "- mean(u) is missing"),
    ({"sums": ("ua",)}, "dL/da", "sum(u * a_hat) instead of mean(u * a_hat)"),
    ({"gain_in": ("first",)}, "dL/da", "only the first term has g"),
    ({"n_grads": 3}, "backward", "None for eps"),
])
def test_wrong_function_gets_its_diagnosis(slips, part, phrase):
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_layer_norm_function(make_function(**slips))
    assert info.value.part == part, str(info.value)
    assert phrase in said(info.value)
    assert info.value.exercise == "check_layer_norm_function"


def test_function_checker_refuses_a_function_or_an_instance():
    with pytest.raises(TypeError, match="autograd.Function subclass"):
        ex.check_layer_norm_function(by_hand)


# --- Exercise 3.2: LN in an MLP, trained ------------------------------------------------------


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
    trivial = prior_nll(y, yt)
    assert abs(trivial - math.log(10)) < 0.01  # the classes are nearly balanced
    assert prior_nll(torch.tensor([0, 0, 0, 1]), torch.tensor([0]), classes=2) == (
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
    assert phrase in said(info.value)


# --- chapter 3's two sittings -----------------------------------------------------------------

BOOK = Path(__file__).resolve().parents[1] / "book"


def test_chapter_3_sittings_state_the_estimates_their_note_defines():
    # words of text at 200 a minute plus 10 minutes an exercise, to the nearest 5 minutes
    cells = nbformat.read(BOOK / "03_layer_norm.ipynb", as_version=4).cells
    heads = [i for i, c in enumerate(cells) if c.cell_type == "markdown"
             and re.match(r"## Sitting \d", c.source)]
    end = next(i for i, c in enumerate(cells) if c.source.startswith("## You can now"))
    assert len(heads) == 2 and heads[0] < heads[1] < end
    note = next(c.source for c in cells[:heads[0]] if "Two sittings" in c.source)
    assert "200 words a minute" in note and "10 minutes for each" in note
    for k, (a, b) in enumerate([(heads[0], heads[1]), (heads[1], end)], start=1):
        md = [c.source for c in cells[a:b] if c.cell_type == "markdown"]
        words = sum(len(t.split()) for t in md)
        exercises = sum(t.count("{admonition} Exercise") for t in md)
        assert exercises >= 3
        minutes = 5 * round((words / 200 + 10 * exercises) / 5)
        stated = int(re.search(r"about (\d+) minutes", cells[a].source).group(1))
        assert stated == minutes, (k, stated, words, exercises)
        assert f"about {minutes} minutes" in " ".join(note.split())  # as in the heading
    numbers = [m for c in cells for m in re.findall(r"\{admonition\} Exercise (3\.\d+)",
                                                    c.source)]
    assert numbers == [f"3.{i}" for i in range(1, 8)]  # numbered in the order they come


def test_lab_exercises_are_numbered_apart_from_chapter_3():
    lab = nbformat.read(BOOK / "03_2_lab_why_it_helps.ipynb", as_version=4).cells
    text = "\n".join(c.source for c in lab)
    assert not re.search(r"Exercise 3\.2\.\d", text)
    numbers = re.findall(r"\{admonition\} Lab exercise L\.(\d+)", text)
    assert numbers == [str(i) for i in range(1, len(numbers) + 1)] and len(numbers) >= 5
