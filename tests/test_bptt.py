"""Tests of lnbook.bptt: the hand-derived BPTT of the LN-LSTM against autograd of the same
equations, second derivatives, torch.func, and where lnbook.LSTM uses it."""

from __future__ import annotations

import pytest
import torch
from helpers import randomize_ln
from torch.func import functional_call, grad, jacrev, vmap

from lnbook import bptt
from lnbook.rnn import LSTM

F64 = torch.float64
I, H = 5, 6


def recurrence_args(seed: int, T: int = 6, B: int = 3, h: int = 4, dtype=F64, bias=True):
    """Random inputs of ln_lstm_recurrence, all requiring grad."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, generator=g, dtype=dtype)).requires_grad_()

    return (r(T, B, 4 * h), r(B, h), r(B, h), r(4 * h, h, scale=0.5), r(4 * h, scale=0.2,
            shift=1.0), r(h, scale=0.2, shift=1.0), r(h, scale=0.3) if bias else None)


def by_autograd(*args):
    """The same recurrence as plain differentiable torch operations (autograd's BPTT)."""
    hs, c = bptt._forward(*args, 1e-5, 1e-5, keep=False)
    return hs, hs[-1], c


def loss_of(outs, weights):
    hs, h, c = outs
    return (hs * weights).sum() + (h**3).sum() + (c**2).sum()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("T", [1, 7])
def test_hand_bptt_equals_autograd_of_the_same_equations(T, bias):
    args = recurrence_args(0, T=T, bias=bias)
    weights = torch.randn(T, 3, 4, dtype=F64)
    ours = bptt.ln_lstm_recurrence(*args)
    ref = by_autograd(*args)
    leaves = [a for a in args if a is not None]
    g1 = torch.autograd.grad(loss_of(ours, weights), leaves)
    g2 = torch.autograd.grad(loss_of(ref, weights), leaves)
    for a, b in zip((*ours, *g1), (*ref, *g2), strict=True):
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-12


@pytest.mark.parametrize("which", ["hs", "h_T", "c_T"])
def test_each_output_alone_gets_its_gradient(which):
    """Gradients that reach only one output (the others' are None inside the Function)."""
    args = recurrence_args(1)
    k = ["hs", "h_T", "c_T"].index(which)
    leaves = [a for a in args if a is not None]
    g1 = torch.autograd.grad(bptt.ln_lstm_recurrence(*args)[k].sin().sum(), leaves)
    g2 = torch.autograd.grad(by_autograd(*args)[k].sin().sum(), leaves)
    for a, b in zip(g1, g2, strict=True):
        assert (a - b).abs().max() <= 1e-12


def test_gradcheck_and_double_backward_are_exact():
    args = recurrence_args(2, T=4, B=2, h=3)
    assert torch.autograd.gradcheck(bptt.ln_lstm_recurrence, args)
    # a second derivative recomputes the forward with differentiable operations: exact, not
    # merely running (a first-order backward reused under create_graph would drop terms)
    assert torch.autograd.gradgradcheck(bptt.ln_lstm_recurrence, args)


def test_kept_graph_can_be_differentiated_twice():
    args = recurrence_args(3)
    hs = bptt.ln_lstm_recurrence(*args)[0]
    g1 = torch.autograd.grad(hs.sum(), args[0], retain_graph=True)[0]
    g2 = torch.autograd.grad(hs.sum(), args[0])[0]
    assert torch.equal(g1, g2)


def test_no_grad_runs_the_plain_loop_with_the_same_numbers(monkeypatch):
    args = [a.detach() for a in recurrence_args(4)]
    calls = []
    real = bptt.LNLSTMRecurrence.apply
    monkeypatch.setattr(bptt.LNLSTMRecurrence, "apply", lambda *a: calls.append(1) or real(*a))
    out = bptt.ln_lstm_recurrence(*args)
    assert not calls  # nothing requires grad: nothing is kept for a backward
    ref = by_autograd(*args)
    for a, b in zip(out, ref, strict=True):
        assert torch.equal(a, b)


def test_float32_is_as_accurate_as_autograd():
    """Against float64, the hand backward in float32 errs no more than autograd in float32."""
    errs: dict[str, list[float]] = {"hand": [], "autograd": []}
    for seed in range(4):
        args = recurrence_args(seed, T=12)
        g = torch.Generator().manual_seed(seed)
        weights = torch.randn(12, 3, 4, generator=g, dtype=F64)
        leaves = [a for a in args if a is not None]
        ref = torch.autograd.grad(loss_of(by_autograd(*args), weights), leaves)
        args32 = [a.detach().float().requires_grad_() for a in leaves]
        for name, f in (("hand", bptt.ln_lstm_recurrence), ("autograd", by_autograd)):
            got = torch.autograd.grad(loss_of(f(*args32), weights.float()), args32)
            errs[name].append(max(((g.double() - r).abs().max() / r.abs().max()).item()
                                  for g, r in zip(got, ref, strict=True)))
    assert max(errs["hand"]) < 1e-5, errs
    assert max(errs["hand"]) <= 3 * max(errs["autograd"]), errs


# ---------------------------------------------------------------------------------------------
# lnbook.LSTM: where the hand BPTT runs, and that it gives the step loop's numbers


def lstm_grads(lstm, x, state, weights):
    x, h0, c0 = (t.detach().clone().requires_grad_() for t in (x, *state))
    out, (h, c) = lstm(x, (h0, c0))
    loss = (out * weights).sum() + (h**2).sum() + (c**3).sum()
    return (out, h, c, *torch.autograd.grad(loss, [x, h0, c0, *lstm.parameters()]))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_hand_bptt_equals_step_loop(bidirectional):
    torch.manual_seed(3)
    lstm = LSTM(I, H, 2, bidirectional=bidirectional, bptt="hand").to(F64)
    randomize_ln(lstm)
    D = 2 if bidirectional else 1
    x = torch.randn(9, 4, I, dtype=F64)
    state = (torch.randn(2 * D, 4, H, dtype=F64), torch.randn(2 * D, 4, H, dtype=F64))
    weights = torch.randn(D * H, dtype=F64)
    assert lstm.bptt == "hand"
    hand = lstm_grads(lstm, x, state, weights)
    lstm.bptt = "autograd"
    loop = lstm_grads(lstm, x, state, weights)
    for a, b in zip(hand, loop, strict=True):  # rounding only, relative to the largest entry
        assert (a - b).abs().max() <= 1e-13 * max(1.0, b.abs().max().item())


def test_lstm_uses_the_hand_bptt_only_where_it_applies(monkeypatch):
    calls = []
    real = bptt.LNLSTMRecurrence.apply
    monkeypatch.setattr(bptt.LNLSTMRecurrence, "apply", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(4, 2, I)

    def run(m, **kw):
        m(x.to(m.weight_ih_l0.dtype), **kw)[0].sum().backward()

    run(LSTM(I, H, bptt="hand"))
    assert len(calls) == 1
    run(LSTM(I, H, bidirectional=True, bptt="hand"))
    assert len(calls) == 3  # one per direction
    run(LSTM(I, H, bptt="hand"), lengths=[4, 3])  # padding: the loop masks each step
    run(LSTM(I, H))  # the default: autograd's step loop
    run(LSTM(I, H, bptt="autograd"))
    run(LSTM(I, H, layer_norm=False, bptt="hand"))
    run(LSTM(I, H, proj_size=2, bptt="hand"))
    run(LSTM(I, H, bptt="hand").to(torch.bfloat16))
    with torch.no_grad():
        LSTM(I, H, bptt="hand")(x)  # nothing to differentiate: the plain loop
    assert len(calls) == 3
    with pytest.raises(ValueError, match="bptt"):
        LSTM(I, H, bptt="fused")


def test_lstm_falls_back_to_the_step_loop_while_compiling(monkeypatch):
    calls = []
    real = bptt.LNLSTMRecurrence.apply
    monkeypatch.setattr(bptt.LNLSTMRecurrence, "apply", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    LSTM(I, H, bptt="hand")(torch.randn(3, 2, I))[0].sum().backward()
    assert not calls


def test_torch_func_through_the_lstm():
    """grad, per-example grads (vmap of grad) and jacrev agree with the step loop's."""
    torch.manual_seed(5)
    lstm = LSTM(3, 4).to(F64)
    randomize_ln(lstm)
    params = {k: v.detach() for k, v in lstm.named_parameters()}
    x = torch.randn(5, 2, 3, dtype=F64)

    def loss(p, x, mode):
        lstm.bptt = mode
        return functional_call(lstm, p, (x,))[0].sin().sum()

    for fn in (grad, jacrev):
        got, want = fn(loss)(params, x, "hand"), fn(loss)(params, x, "autograd")
        assert all((got[k] - want[k]).abs().max() <= 1e-12 for k in params)
    xs = torch.randn(3, 5, 2, 3, dtype=F64)
    per = {m: vmap(grad(loss), in_dims=(None, 0, None))(params, xs, m) for m in ("hand",
                                                                               "autograd")}
    assert all((per["hand"][k] - per["autograd"][k]).abs().max() <= 1e-12 for k in params)
    assert per["hand"]["weight_hh_l0"].shape == (3, 16, 4)
    # second derivative through torch.func (grad of grad) as well
    w = params["weight_hh_l0"]

    def f(w, mode):
        return loss({**params, "weight_hh_l0": w}, x, mode)

    gg = {m: grad(lambda w, m=m: grad(f)(w, m).square().sum())(w) for m in ("hand", "autograd")}
    assert (gg["hand"] - gg["autograd"]).abs().max() <= 1e-10


def test_forward_mode_where_nothing_needs_reverse_gradients():
    torch.manual_seed(6)
    models = {m: LSTM(3, 4, bptt=m).to(F64) for m in ("hand", "autograd")}
    params = {k: v.detach() for k, v in models["hand"].named_parameters()}
    x, t = torch.randn(4, 2, 3, dtype=F64), torch.randn(4, 2, 3, dtype=F64)
    out = {m: torch.func.jvp(lambda x, m=m: functional_call(models[m], params, (x,))[0], (x,),
                             (t,))[1] for m in models}
    assert (out["hand"] - out["autograd"]).abs().max() <= 1e-12
    assert out["hand"].abs().max() > 1e-3
