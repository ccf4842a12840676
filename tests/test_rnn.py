"""Tests of lnbook.rnn: torch twins in every configuration, the paper's equations in float64,
invariances, padding and packing, autocast, torch.compile / torch.export, bad input."""

from __future__ import annotations

import inspect
import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import randomize_ln
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import lnbook
from lnbook import reference
from lnbook.checks import ShapeError
from lnbook.rnn import GRU, LSTM, RNN, DRAWLSTMCell, LNGRUCell, LNLSTMCell, LNRNNCell

F64 = torch.float64
I, H = 5, 6

CELL_TWINS = [
    (LNRNNCell, nn.RNNCell),
    (LNLSTMCell, nn.LSTMCell),
    (LNGRUCell, nn.GRUCell),
    (DRAWLSTMCell, nn.LSTMCell),
]
LAYER_TWINS = [(RNN, nn.RNN), (LSTM, nn.LSTM), (GRU, nn.GRU)]


def step_cell(cell: nn.Module, xs: torch.Tensor, lstm: bool):
    """Run a cell over (T, B, I) step by step; return stacked h and the last state."""
    state, outs = None, []
    for t in range(xs.shape[0]):
        state = cell(xs[t], state)
        outs.append(state[0] if lstm else state)
    return torch.stack(outs), state


def outputs_and_grads(m: nn.Module, x, hx):
    """Outputs, final states and the gradients of a loss that uses all of them, for the
    parameters (in named order) and for x and the initial states."""
    leaves = [t for t in ([x] if isinstance(x, torch.Tensor) else [x.data]) + (
        list(hx) if isinstance(hx, tuple) else [hx]) if t is not None]
    for t in leaves:
        t.requires_grad_(True)
    res = m(x, hx)
    flat = []  # a layer's (output, state or (h, c)), an LSTM cell's (h, c), another cell's h
    for r in res if isinstance(res, tuple) else (res,):
        r = r.data if isinstance(r, PackedSequence) else r
        flat.extend(r if isinstance(r, tuple) else (r,))
    w = torch.arange(flat[0].numel(), dtype=flat[0].dtype).reshape(flat[0].shape).sin()
    loss = (flat[0] * w).sum() + sum((s**2).sum() for s in flat[1:])
    grads = torch.autograd.grad(loss, [*m.parameters(), *leaves])
    for t in leaves:
        t.requires_grad_(False)
    return (*flat, *grads)


def assert_all_close(a, b, tol=1e-12):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        assert u.shape == v.shape and u.dtype == v.dtype
        assert (u - v).abs().max() <= tol


def paper_np(module: nn.Module) -> dict:
    return {k: v.numpy() for k, v in module.state_dict().items()}


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# ---------------------------------------------------------------------------------------------
# torch's signatures and positional order


TORCH_ORDER = {
    LSTM: ["input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
           "bidirectional", "proj_size", "device", "dtype"],
    GRU: ["input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
          "bidirectional", "device", "dtype"],
    RNN: ["input_size", "hidden_size", "num_layers", "nonlinearity", "bias", "batch_first",
          "dropout", "bidirectional", "device", "dtype"],
    LNLSTMCell: ["input_size", "hidden_size", "bias", "device", "dtype"],
    DRAWLSTMCell: ["input_size", "hidden_size", "bias", "device", "dtype"],
    LNGRUCell: ["input_size", "hidden_size", "bias", "device", "dtype"],
    LNRNNCell: ["input_size", "hidden_size", "bias", "nonlinearity", "device", "dtype"],
}


@pytest.mark.parametrize("cls", list(TORCH_ORDER))
def test_signature_is_torchs_with_lnbook_options_keyword_only(cls):
    params = list(inspect.signature(cls).parameters.values())
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == TORCH_ORDER[cls]
    kw_only = {p.name for p in params if p.kind == p.KEYWORD_ONLY}
    assert {"layer_norm", "eps", "ln_impl"} <= kw_only
    forward = list(inspect.signature(cls.forward).parameters)
    assert forward[:3] == ["self", "input", "hx"]


def test_positional_arguments_mean_what_they_mean_in_torch():
    lstm = LSTM(I, H, 2, False, True, 0.0, True, 3)  # bias=False, batch_first, bidir., proj
    assert lstm.num_layers == 2 and not lstm.bias and lstm.batch_first
    assert lstm.bidirectional and lstm.proj_size == 3 and lstm.layer_norm
    assert lstm.weight_hr_l1_reverse.shape == (3, H) and not hasattr(lstm, "bias_ih_l0")
    rnn = RNN(I, H, 1, "relu")
    assert rnn.nonlinearity == "relu" and rnn.bias
    x = torch.randn(4, 2, I)
    with torch.no_grad():  # relu: no negative output, which tanh would give
        assert (rnn(x)[0] >= 0).all() and (RNN(I, H)(x)[0] < 0).any()
    assert GRU(I, H, 3, False).num_layers == 3 and not GRU(I, H, 3, False).bias
    assert LNRNNCell(I, H, True, "relu").nonlinearity == "relu"
    assert LNLSTMCell(I, H, False).bias_ih is None
    m = LSTM(I, H, dtype=F64)
    assert m.weight_ih_l0.dtype == F64 and m.ln_c_l0.weight.dtype == F64
    with pytest.raises(TypeError):
        LSTM(I, H, 1, True, False, 0.0, False, 0, None, None, False)  # layer_norm is keyword-only


def test_forward_takes_torchs_keyword_names():
    torch.manual_seed(0)
    x, h0 = torch.randn(4, 2, I), torch.randn(1, 2, H)
    lstm, gru = LSTM(I, H), GRU(I, H)
    assert torch.equal(lstm(input=x, hx=(h0, h0))[0], lstm(x, (h0, h0))[0])
    assert torch.equal(gru(input=x, hx=h0)[0], gru(x, h0)[0])
    cell = LNGRUCell(I, H)
    assert torch.equal(cell(input=x[0], hx=h0[0]), cell(x[0], h0[0]))


# ---------------------------------------------------------------------------------------------
# layer_norm=False: the torch twins, in every configuration


@pytest.mark.parametrize("ours, theirs", CELL_TWINS)
@pytest.mark.parametrize("bias", [True, False])
def test_cell_equals_torch_twin(ours, theirs, bias):
    torch.manual_seed(0)
    a = ours(I, H, bias, layer_norm=False).to(F64)
    torch.manual_seed(0)
    b = theirs(I, H, bias).to(F64)
    assert list(a.state_dict()) == list(b.state_dict())  # same names, same order
    for u, v in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(u, v)  # and the same initial values for the same seed
    xs = torch.randn(7, 3, I, dtype=F64)
    lstm = theirs is nn.LSTMCell
    oa, sa = step_cell(a, xs, lstm)
    ob, sb = step_cell(b, xs, lstm)
    assert (oa - ob).abs().max() <= 1e-12
    if lstm:
        assert (sa[1] - sb[1]).abs().max() <= 1e-12
    b2 = theirs(I, H, bias).to(F64)  # and the other way round: torch's state dict into ours
    a.load_state_dict(b2.state_dict())
    x = torch.randn(3, I, dtype=F64)
    oa, ob = a(x), b2(x)
    oa, ob = (oa[0], ob[0]) if lstm else (oa, ob)
    assert (oa - ob).abs().max() <= 1e-12


CONFIGS = list(itertools.product([1, 2], [True, False], [False, True], [False, True],
                                 [False, True]))  # layers, bias, batch_first, bidir., packed


@pytest.mark.parametrize("ours, theirs", LAYER_TWINS)
def test_layer_equals_torch_twin_in_every_configuration(ours, theirs):
    """Outputs, final states and all gradients (parameters, input, initial states) in float64,
    for 1 and 2 layers, bias on and off, batch_first, bidirectional and packed input."""
    for L, bias, batch_first, bidirectional, packed in CONFIGS:
        kw = {"bias": bias, "batch_first": batch_first, "bidirectional": bidirectional}
        torch.manual_seed(0)
        a = ours(I, H, L, **kw, layer_norm=False).to(F64)
        torch.manual_seed(0)
        b = theirs(I, H, L, **kw).to(F64)
        assert list(a.state_dict()) == list(b.state_dict())
        b.load_state_dict(a.state_dict())
        D = 2 if bidirectional else 1
        x = torch.randn(4, 7, I, dtype=F64) if batch_first else torch.randn(7, 4, I, dtype=F64)
        if packed:
            x = pack_padded_sequence(x, torch.tensor([7, 3, 5, 1]), batch_first=batch_first,
                                     enforce_sorted=False)
        h0 = torch.randn(L * D, 4, H, dtype=F64)
        hx = (h0, torch.randn(L * D, 4, H, dtype=F64)) if theirs is nn.LSTM else h0
        assert_all_close(outputs_and_grads(a, x, hx), outputs_and_grads(b, x, hx))
        a.load_state_dict(theirs(I, H, L, **kw).to(F64).state_dict())  # and torch's into ours


def test_lstm_projection_equals_torch():
    torch.manual_seed(0)
    a = LSTM(I, H, 2, proj_size=3, bidirectional=True, layer_norm=False).to(F64)
    torch.manual_seed(0)
    b = nn.LSTM(I, H, 2, proj_size=3, bidirectional=True).to(F64)
    assert list(a.state_dict()) == list(b.state_dict())
    x = torch.randn(6, 3, I, dtype=F64)
    hx = (torch.randn(4, 3, 3, dtype=F64), torch.randn(4, 3, H, dtype=F64))
    assert_all_close(outputs_and_grads(a, x, hx), outputs_and_grads(b, x, hx))
    with pytest.raises(ValueError, match="proj_size"):
        LSTM(I, H, proj_size=H)


def test_dropout_between_layers_as_torch():
    torch.manual_seed(0)
    a = LSTM(I, H, 3, dropout=1.0, layer_norm=False).to(F64)
    b = nn.LSTM(I, H, 3, dropout=1.0).to(F64)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 2, I, dtype=F64)
    # p = 1 drops every input of layers 2 and 3 in training, deterministically, not the output
    oa, (ha, _) = a(x)
    ob, (hb, _) = b(x)
    assert (oa - ob).abs().max() <= 1e-12 and (ha - hb).abs().max() <= 1e-12
    assert oa.abs().min() > 0  # no dropout after the last layer
    a.eval()
    b.eval()
    assert (a(x)[0] - b(x)[0]).abs().max() <= 1e-12  # eval: no dropout at all
    ln = LSTM(I, H, 2, dropout=0.5)
    ln.eval()
    assert torch.equal(ln(x.float())[0], ln(x.float())[0])
    ln.train()
    torch.manual_seed(1)
    assert not torch.equal(ln(x.float())[0], ln.eval()(x.float())[0])
    with pytest.warns(UserWarning, match="num_layers=1"):
        GRU(I, H, dropout=0.2)
    with pytest.raises(ValueError, match="dropout"):
        RNN(I, H, 2, dropout=1.5)


@pytest.mark.parametrize("ours, theirs", LAYER_TWINS)
def test_unbatched_input_like_torch(ours, theirs):
    torch.manual_seed(0)
    a = ours(I, H, 2, layer_norm=False, bidirectional=True).to(F64)
    b = theirs(I, H, 2, bidirectional=True).to(F64)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, I, dtype=F64)
    oa, sa = a(x)
    ob, sb = b(x)
    assert oa.shape == ob.shape == (5, 2 * H)
    assert (oa - ob).abs().max() <= 1e-12
    sa, sb = (sa[0], sb[0]) if theirs is nn.LSTM else (sa, sb)
    assert sa.shape == sb.shape == (4, H) and (sa - sb).abs().max() <= 1e-12


# ---------------------------------------------------------------------------------------------
# layer_norm=True: the paper's equations (lnbook.reference, float64 numpy)


@pytest.mark.parametrize("bias", [True, False])
def test_ln_rnn_cell_equals_eq4_reference(bias):
    torch.manual_seed(0)
    cell = LNRNNCell(I, H, bias).to(F64)
    randomize_ln(cell)
    p = reference.rnn_params_paper(paper_np(cell), H)
    xs, h, hr = torch.randn(6, 3, I, dtype=F64), None, np.zeros((3, H))
    for t in range(6):
        h = cell(xs[t], h)
        hr = reference.rnn_step_paper(p, np_(xs[t]), hr)
        assert np.abs(np_(h) - hr).max() <= 1e-12


@pytest.mark.parametrize("cls", [LNLSTMCell, DRAWLSTMCell])
@pytest.mark.parametrize("bias", [True, False])
def test_ln_lstm_cells_equal_paper_equations(cls, bias):
    torch.manual_seed(0)
    cell = cls(I, H, bias).to(F64)
    randomize_ln(cell)
    draw = cls is DRAWLSTMCell
    assert (cell.ln_ih is None and cell.ln_hh is None) == draw and cell.ln_c is not None
    p = reference.lstm_params_paper(paper_np(cell), H)
    assert ("a1" in p) != draw  # eqs. 20-22, or 29-31 for DRAW
    xs, state = torch.randn(6, 3, I, dtype=F64), None
    hr, cr = np.zeros((3, H)), np.zeros((3, H))
    for t in range(6):
        state = cell(xs[t], state)
        hr, cr = reference.lstm_step_paper(p, np_(xs[t]), hr, cr)
        assert np.abs(np_(state[0]) - hr).max() <= 1e-12
        assert np.abs(np_(state[1]) - cr).max() <= 1e-12  # the un-normalized c_t is carried


@pytest.mark.parametrize("bias", [True, False])
def test_ln_gru_cell_equals_paper_eqs_26_28(bias):
    """Torch's form (gates r, z, n) against eqs. 26-28 literally, the sign of z moved into the
    LN gains: the two forms are the same model."""
    torch.manual_seed(0)
    cell = LNGRUCell(I, H, bias).to(F64)
    randomize_ln(cell)
    p = reference.gru_params_paper(paper_np(cell), H)
    xs, h, hr = torch.randn(6, 3, I, dtype=F64), None, np.zeros((3, H))
    for t in range(6):
        h = cell(xs[t], h)
        hr = reference.gru_step_paper(p, np_(xs[t]), hr)
        assert np.abs(np_(h) - hr).max() <= 1e-12


def test_paper_oracles_are_not_the_plain_cells():
    """The oracle of eqs. 20-22 differs from eqs. 17-19 and 29-31 (so the tests above could
    fail): dropping the gate LNs or the cell LN changes the output."""
    torch.manual_seed(0)
    cell = LNLSTMCell(I, H).to(F64)
    randomize_ln(cell)
    p = reference.lstm_params_paper(paper_np(cell), H)
    rng = np.random.default_rng(0)
    x, h, c = rng.normal(size=(3, I)), rng.normal(size=(3, H)), rng.normal(size=(3, H))
    full = reference.lstm_step_paper(p, x, h, c)[0]
    no_gates = reference.lstm_step_paper({k: v for k, v in p.items() if k[-1] not in "12"},
                                         x, h, c)[0]
    no_cell = reference.lstm_step_paper({k: v for k, v in p.items() if k[-1] != "3"}, x, h, c)[0]
    assert np.abs(full - no_gates).max() > 1e-2 and np.abs(full - no_cell).max() > 1e-2


@pytest.mark.parametrize("cls, cell_cls", [(RNN, LNRNNCell), (LSTM, LNLSTMCell), (GRU, LNGRUCell)])
@pytest.mark.parametrize("bias", [True, False])
def test_ln_layers_equal_stacked_cells(cls, cell_cls, bias):
    torch.manual_seed(0)
    layer = cls(I, H, 2, bias=bias).to(F64)
    randomize_ln(layer)
    cells = [cell_cls(I if k == 0 else H, H, bias).to(F64) for k in range(2)]
    sd = layer.state_dict()
    for k, cell in enumerate(cells):
        cell.load_state_dict({n: sd[n.replace(".", f"_l{k}.", 1) if "." in n else f"{n}_l{k}"]
                              for n in cell.state_dict()})
    x = torch.randn(7, 3, I, dtype=F64)
    out, state = layer(x)
    inp, lstm = x, cls is LSTM
    for k, cell in enumerate(cells):
        inp, last = step_cell(cell, inp, lstm)
        hk = last[0] if lstm else last
        assert ((state[0] if lstm else state)[k] - hk).abs().max() <= 1e-12
    assert (out - inp).abs().max() <= 1e-12


@pytest.mark.parametrize("cls", [RNN, LSTM, GRU])
def test_ln_bidirectional_reverse_direction_reads_the_sequence_backwards(cls):
    torch.manual_seed(0)
    bi = cls(I, H, bidirectional=True).to(F64)
    randomize_ln(bi)
    fwd, rev = cls(I, H).to(F64), cls(I, H).to(F64)
    sd = bi.state_dict()
    fwd.load_state_dict({k: v for k, v in sd.items() if "_reverse" not in k})
    rev.load_state_dict({k.replace("_reverse", ""): v for k, v in sd.items() if "_reverse" in k})
    x = torch.randn(6, 2, I, dtype=F64)
    out, _ = bi(x)
    assert (out[..., :H] - fwd(x)[0]).abs().max() <= 1e-12
    assert (out[..., H:] - rev(x.flip(0))[0].flip(0)).abs().max() <= 1e-12


@pytest.mark.parametrize("cls", [RNN, LSTM, GRU, LNLSTMCell, LNGRUCell, LNRNNCell])
def test_ln_impl_autograd_and_torch_give_the_same_numbers(cls):
    torch.manual_seed(0)
    a = cls(I, H, ln_impl="torch").to(F64)
    b = cls(I, H, ln_impl="autograd").to(F64)
    randomize_ln(a)
    b.load_state_dict(a.state_dict())
    assert all(m.impl == "autograd" for m in b.modules() if isinstance(m, lnbook.LayerNorm))
    x = torch.randn(4, 3, I, dtype=F64) if cls in (RNN, LSTM, GRU) else torch.randn(3, I,
                                                                                   dtype=F64)
    assert_all_close(outputs_and_grads(a, x, None), outputs_and_grads(b, x, None), 1e-11)
    default = lnbook.norms.LN_IMPL
    assert default in ("torch", "autograd") and LSTM(I, H).ln_impl == default
    with pytest.raises(ValueError, match="ln_impl"):
        cls(I, H, ln_impl="fast")


def test_bias_false_with_layer_norm_has_no_additive_parameter():
    for m in (LSTM(I, H, 2, False, bidirectional=True), GRU(I, H, 1, False),
              RNN(I, H, 1, "tanh", False), LNLSTMCell(I, H, False), LNGRUCell(I, H, False)):
        names = [n for n, _ in m.named_parameters()]
        assert not any("bias" in n for n in names), names
        assert any(n.endswith("weight") and n.startswith("ln") for n in names)
    torch.manual_seed(0)
    lstm = LSTM(I, H, 1, False).to(F64)
    ref = LNLSTMCell(I, H, False).to(F64)
    ref.load_state_dict({n: lstm.state_dict()[n.replace(".", "_l0.", 1) if "." in n
                                              else f"{n}_l0"] for n in ref.state_dict()})
    x = torch.randn(5, 2, I, dtype=F64)
    assert (lstm(x)[0] - step_cell(ref, x, True)[0]).abs().max() <= 1e-12


def test_ln_submodules_and_init():
    lstm, gru = LNLSTMCell(I, H), LNGRUCell(I, H)
    assert isinstance(lstm.ln_ih, lnbook.LayerNorm) and lstm.ln_ih.normalized_shape == (4 * H,)
    assert lstm.ln_hh.normalized_shape == (4 * H,) and lstm.ln_c.normalized_shape == (H,)
    assert gru.ln_ih.normalized_shape == (2 * H,) and gru.ln_hh.normalized_shape == (2 * H,)
    assert gru.ln_in.normalized_shape == (H,) and gru.ln_hn.normalized_shape == (H,)
    for m in list(lstm.modules()) + list(gru.modules()) + list(LSTM(I, H, 2).modules()):
        if isinstance(m, lnbook.LayerNorm):  # C20: gains start at 1, biases at 0
            assert torch.equal(m.weight, torch.ones_like(m.weight))
            assert torch.equal(m.bias, torch.zeros_like(m.bias))
    assert LNRNNCell(I, H, layer_norm=False).ln is None
    names = set(dict(LSTM(I, H, 2, bidirectional=True).named_modules()))
    assert {"ln_ih_l1_reverse", "ln_hh_l0", "ln_c_l1_reverse"} <= names


def rms_reference(a: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm written out here, independently of lnbook: a / sqrt(mean(a^2) + eps) * g."""
    return a / torch.sqrt(a.pow(2).mean(-1, keepdim=True) + eps) * g


def test_norm_factory_makes_each_norm_and_the_steps_call_it():
    """norm= chooses the normalization once: RMSNorm gives eq. 4 with RMS in place of LN,
    an identity gives torch's own cell, torch's LayerNorm gives lnbook's numbers."""
    torch.manual_seed(0)
    cell = LNRNNCell(I, H, norm=lambda n: lnbook.RMSNorm(n, eps=1e-6), dtype=F64)
    assert isinstance(cell.ln, lnbook.RMSNorm) and cell.ln.weight.dtype == F64
    with torch.no_grad():
        cell.ln.weight.uniform_(0.5, 1.5)
    x, h = torch.randn(3, I, dtype=F64), torch.randn(3, H, dtype=F64)
    a = x @ cell.weight_ih.T + h @ cell.weight_hh.T  # (B, H) summed inputs
    want = torch.tanh(rms_reference(a, cell.ln.weight, 1e-6) + cell.bias_ih + cell.bias_hh)
    assert (cell(x, h) - want).abs().max() <= 1e-12
    plain = LNRNNCell(I, H, norm=lambda n: nn.Identity(), dtype=F64)
    twin = nn.RNNCell(I, H, dtype=F64)
    twin.load_state_dict(plain.state_dict())
    assert (plain(x, h) - twin(x, h)).abs().max() <= 1e-12
    ours, theirs = LSTM(I, H, 2, dtype=F64), LSTM(I, H, 2, norm=nn.LayerNorm, dtype=F64)
    randomize_ln(ours)
    theirs.load_state_dict(ours.state_dict())  # the same names: loads both ways
    ours.load_state_dict(theirs.state_dict())
    assert isinstance(theirs.ln_c_l1, nn.LayerNorm)
    xs = torch.randn(4, 3, I, dtype=F64)
    assert_all_close(outputs_and_grads(ours, xs, None), outputs_and_grads(theirs, xs, None))


def test_hand_bptt_reads_torch_layer_norms_and_skips_other_norms(monkeypatch):
    calls = []
    real = lnbook.bptt.LNLSTMRecurrence.apply
    monkeypatch.setattr(lnbook.bptt.LNLSTMRecurrence, "apply",
                        lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    m = LSTM(I, H, norm=nn.LayerNorm, bptt="hand", dtype=F64)
    randomize_ln(m)
    x = torch.randn(5, 2, I, dtype=F64)
    hand = outputs_and_grads(m, x, None)
    assert calls == [1]
    m.bptt = "autograd"
    assert_all_close(hand, outputs_and_grads(m, x, None), 1e-13)
    LSTM(I, H, norm=lnbook.RMSNorm, bptt="hand")(x.float())[0].sum().backward()
    assert calls == [1]  # no layer norm to read: the step loop


def test_norm_under_autocast_and_bad_norms():
    m = GRU(8, 16, norm=lnbook.RMSNorm)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = LSTM(8, 16, norm=lnbook.RMSNorm)(torch.randn(3, 2, 8))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert m.ln_hn_l0.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="layer_norm=False"):
        LSTM(I, H, layer_norm=False, norm=nn.LayerNorm)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        LNRNNCell(I, H, norm=lambda n: torch.ones(n))
    with pytest.raises(TypeError, match="callable"):
        GRU(I, H, norm="rms")


def test_forget_bias_shifts_only_the_forget_slice():
    torch.manual_seed(3)
    a = LNLSTMCell(I, H)
    torch.manual_seed(3)
    b = LNLSTMCell(I, H, forget_bias=1.0)
    d = b.bias_ih.detach() - a.bias_ih.detach()
    assert torch.allclose(d[H : 2 * H], torch.ones(H))
    assert torch.equal(d[:H], torch.zeros(H)) and torch.equal(d[2 * H :], torch.zeros(2 * H))
    torch.manual_seed(3)
    la = LSTM(I, H, 2, bidirectional=True)
    torch.manual_seed(3)
    lb = LSTM(I, H, 2, bidirectional=True, forget_bias=1.0)
    d1 = lb.bias_ih_l1_reverse.detach() - la.bias_ih_l1_reverse.detach()
    assert torch.allclose(d1[H : 2 * H], torch.ones(H)) and d1[:H].abs().max() == 0
    assert torch.equal(lb.bias_hh_l1, la.bias_hh_l1)
    with pytest.raises(ValueError, match="bias=True"):
        LSTM(I, H, bias=False, forget_bias=1.0)
    with pytest.raises(ValueError, match="bptt must be one of 'hand', 'autograd'"):
        LSTM(I, H, bptt="manual")


def test_normalized_preactivations_have_mean0_std1_per_example_and_step():
    """LN-RNN with gain 1, bias 0: atanh(h_t) - biases is LN(a_t): mean 0, std 1 per row."""
    torch.manual_seed(0)
    rnn = RNN(I, 32).to(F64)
    with torch.no_grad():
        rnn.weight_hh_l0.mul_(5.0)  # large recurrent weights: a plain RNN would saturate
    x = 3 * torch.randn(20, 4, I, dtype=F64)
    out, _ = rnn(x)
    z = torch.atanh(out) - (rnn.bias_ih_l0 + rnn.bias_hh_l0).detach()  # (T, B, H)
    assert z.mean(-1).abs().max() <= 1e-9
    std_ln = z.std(-1, unbiased=False)
    # sigma in LN includes eps: z = (a - mu) / sqrt(var + eps), so std(z) = sqrt(var/(var+eps)) < 1
    assert (std_ln - 1).abs().max() <= 1e-3 and std_ln.max() <= 1 + 1e-12


@pytest.mark.parametrize("scale", [0.05, 7.0])
def test_ln_rnn_invariant_to_scaling_summed_inputs(scale):
    """C05: scaling W_ih and W_hh together leaves the LN-RNN unchanged; not so without LN."""
    torch.manual_seed(0)
    x = torch.randn(30, 4, I, dtype=F64)
    for layer_norm in (True, False):
        a = RNN(I, H, 2, layer_norm=layer_norm, eps=1e-12).to(F64)
        b = RNN(I, H, 2, layer_norm=layer_norm, eps=1e-12).to(F64)
        b.load_state_dict(a.state_dict())
        with torch.no_grad():
            for k in range(2):
                getattr(b, f"weight_ih_l{k}").mul_(scale)
                getattr(b, f"weight_hh_l{k}").mul_(scale)
        diff = (a(x)[0] - b(x)[0]).abs().max().item()
        if layer_norm:  # eps=1e-12 still weighs ~1e-8 at scale 0.05
            assert diff <= 1e-7
        else:
            assert diff > 1e-2


def test_ln_lstm_invariant_to_scaling_weights():
    torch.manual_seed(0)
    a = LSTM(I, H, eps=1e-12).to(F64)
    b = LSTM(I, H, eps=1e-12).to(F64)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.weight_ih_l0.mul_(4.0)
        b.weight_hh_l0.mul_(0.3)  # separate LNs: each matrix may be scaled on its own
    x = torch.randn(10, 3, I, dtype=F64)
    assert (a(x)[0] - b(x)[0]).abs().max() <= 1e-7  # eps=1e-12 still weighs ~1e-9


# ---------------------------------------------------------------------------------------------
# gradients, padding and packing, determinism


@pytest.mark.parametrize("cls", [LNRNNCell, LNLSTMCell, LNGRUCell, DRAWLSTMCell])
def test_gradcheck_cells(cls):
    torch.manual_seed(0)
    cell = cls(3, 4).to(F64)
    randomize_ln(cell)
    x = torch.randn(2, 3, dtype=F64, requires_grad=True)
    h = torch.randn(2, 4, dtype=F64, requires_grad=True)
    names = [n for n, _ in cell.named_parameters()]

    def f(x, h, *ps):
        out = torch.func.functional_call(cell, dict(zip(names, ps, strict=True)),
                                         (x, (h, h * 0.5) if cls in (LNLSTMCell, DRAWLSTMCell)
                                          else h))
        return out

    ps = tuple(q.detach().clone().requires_grad_(True) for q in cell.parameters())
    assert torch.autograd.gradcheck(f, (x, h, *ps), eps=1e-6, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("cls", [RNN, LSTM, GRU])
@pytest.mark.parametrize("layer_norm", [True, False])
def test_padded_steps_do_not_change_outputs_or_state(cls, layer_norm):
    torch.manual_seed(0)
    m = cls(I, H, 2, batch_first=True, bidirectional=True, layer_norm=layer_norm).to(F64)
    randomize_ln(m)
    lengths = [7, 3, 1, 5]
    x = torch.randn(4, 7, I, dtype=F64)
    x_pad = x.clone()
    for b, n in enumerate(lengths):
        x_pad[b, n:] = 1e3 * torch.randn(7 - n, I, dtype=F64)  # garbage in the padding
    out, state = m(x_pad, lengths=torch.tensor(lengths))
    for b, n in enumerate(lengths):
        o1, s1 = m(x[b : b + 1, :n])
        assert (out[b, :n] - o1[0]).abs().max() <= 1e-12
        assert n == 7 or out[b, n:].abs().max() == 0
        for sa, sb in zip(state if cls is LSTM else (state,), s1 if cls is LSTM else (s1,),
                          strict=True):
            assert (sa[:, b] - sb[:, 0]).abs().max() <= 1e-12


@pytest.mark.parametrize("cls", [RNN, LSTM, GRU])
def test_ln_packed_sequence_in_and_out_equals_lengths(cls):
    torch.manual_seed(0)
    m = cls(I, H, 2, bidirectional=True).to(F64)
    randomize_ln(m)
    x, lengths = torch.randn(6, 4, I, dtype=F64), torch.tensor([6, 2, 4, 4])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    out_p, state_p = m(packed)
    assert isinstance(out_p, PackedSequence)
    assert torch.equal(out_p.batch_sizes, packed.batch_sizes)
    assert torch.equal(out_p.sorted_indices, packed.sorted_indices)
    out, state = m(x, lengths=lengths)
    padded, lens = pad_packed_sequence(out_p, total_length=6)
    assert torch.equal(lens, lengths) and (padded - out).abs().max() <= 1e-12
    for a, b in zip(state_p if cls is LSTM else (state_p,), state if cls is LSTM else (state,),
                    strict=True):
        assert (a - b).abs().max() <= 1e-12


def test_determinism_under_seed():
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        m = LSTM(I, H, 2)
        x = torch.randn(5, 2, I)
        outs.append(m(x)[0])
    assert torch.equal(outs[0], outs[1])
    torch.manual_seed(124)
    assert not torch.equal(LSTM(I, H, 2)(x)[0], outs[0])


# ---------------------------------------------------------------------------------------------
# dtypes: autocast as torch, a clear error on a mismatch


@pytest.mark.parametrize("ours, theirs", LAYER_TWINS + CELL_TWINS[:3])
@pytest.mark.parametrize("layer_norm", [True, False])
def test_autocast_output_dtype_is_torchs(ours, theirs, layer_norm):
    torch.manual_seed(0)
    a, b = ours(8, 16, layer_norm=layer_norm), theirs(8, 16)
    layer = theirs in (nn.RNN, nn.LSTM, nn.GRU)
    x = torch.randn(3, 2, 8) if layer else torch.randn(2, 8)

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = first(a(x))
        try:
            want = first(b(x)).dtype
        except RuntimeError:
            # torch.nn.LSTM runs oneDNN's LSTM under CPU autocast, which returns the autocast
            # dtype where the CPU supports it, and fails on CPUs without bfloat16 support
            assert theirs is nn.LSTM
            want = torch.bfloat16
    assert got.dtype == want
    assert torch.isfinite(got).all()
    assert first(a(x)).dtype == torch.float32  # outside autocast: the parameters' dtype


@pytest.mark.parametrize("cls", [RNN, LSTM, GRU, LNLSTMCell, LNGRUCell, LNRNNCell])
def test_dtype_mismatch_names_both_dtypes(cls):
    m = cls(I, H)
    x = torch.randn(3, 2, I, dtype=F64) if cls in (RNN, LSTM, GRU) else torch.randn(2, I,
                                                                                   dtype=F64)
    with pytest.raises(ValueError, match=r"input dtype \(torch.float64\).*torch.float32"):
        m(x)
    m64 = cls(I, H, dtype=F64)
    h = torch.zeros(1, 2, H) if cls in (RNN, LSTM, GRU) else torch.zeros(2, H)
    hx = (h, h) if cls in (LSTM, LNLSTMCell) else h
    with pytest.raises(ValueError, match=r"torch.float32.*torch.float64"):
        m64(x, hx)


def test_half_precision_model_runs_and_stays_finite():
    torch.manual_seed(0)
    m = LSTM(I, H).to(torch.bfloat16)
    out, _ = m(torch.randn(6, 2, I, dtype=torch.bfloat16) * 100)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


# ---------------------------------------------------------------------------------------------
# torch.compile and torch.export (small sizes: compiling is slow on a busy CPU)


@pytest.mark.parametrize("cls", [LSTM, GRU, RNN])
@pytest.mark.parametrize("layer_norm", [True, False])
def test_compile_fullgraph_training_step_and_export(cls, layer_norm):
    """A training step's loss compiled with ``fullgraph=True`` (Dynamo and AOTAutograd, with
    the ``aot_eager`` backend so that no C++ is compiled here) gives eager's loss and
    gradients; ``torch.export`` traces the layer and gives its outputs."""
    torch.manual_seed(0)
    m = cls(3, 4, layer_norm=layer_norm)
    randomize_ln(m)
    x = torch.randn(3, 2, 3)

    def loss_fn(x):
        out, _ = m(x)
        return out.square().mean()

    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    loss = compiled(x)
    grads = torch.autograd.grad(loss, list(m.parameters()))
    loss_e = loss_fn(x)
    grads_e = torch.autograd.grad(loss_e, list(m.parameters()))
    assert abs(loss.item() - loss_e.item()) <= 1e-6
    for a, b in zip(grads, grads_e, strict=True):
        assert (a - b).abs().max() <= 1e-5
    ep = torch.export.export(m, (x,))
    out_e, out_m = ep.module()(x)[0], m(x)[0]
    assert (out_e - out_m).abs().max() <= 1e-6


@pytest.mark.parametrize("cls", [LSTM, GRU, RNN])
@pytest.mark.parametrize("layer_norm", [True, False])
def test_torch_func_grad_and_per_example_grads_equal_autograd(cls, layer_norm):
    torch.manual_seed(0)
    m = cls(3, 4, 2, bidirectional=True, layer_norm=layer_norm).to(F64)
    randomize_ln(m)
    params = {k: v.detach() for k, v in m.named_parameters()}
    xs = torch.randn(3, 5, 2, 3, dtype=F64)  # 3 examples, each (T, B, I)

    def loss(p, x):
        return torch.func.functional_call(m, p, (x,))[0].sin().sum()

    got = torch.func.grad(loss)(params, xs[0])
    want = dict(zip(params, torch.autograd.grad(loss(dict(m.named_parameters()), xs[0]),
                                                list(m.parameters())), strict=True))
    assert all((got[k] - want[k]).abs().max() <= 1e-12 for k in params)
    per = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, xs)
    for j in range(3):
        g = torch.func.grad(loss)(params, xs[j])
        assert all((per[k][j] - g[k]).abs().max() <= 1e-12 for k in params)


# ---------------------------------------------------------------------------------------------
# no compiler, no ctypes: lnbook runs wherever torch runs


def test_lnbook_runs_with_no_compiler_on_path(tmp_path):
    """A fresh interpreter whose PATH is an empty folder (no cc, gcc or clang to find) imports
    lnbook, runs an LN-LSTM forward and backward, and has loaded no ctypes or subprocess module
    through lnbook."""
    empty = tmp_path / "bin"
    empty.mkdir()
    assert all(shutil.which(cc, path=str(empty)) is None for cc in ("cc", "gcc", "clang"))
    root = Path(lnbook.__file__).resolve().parent.parent
    code = (
        "import sys, torch, lnbook\n"
        "m = lnbook.LSTM(4, 8, 2, bidirectional=True)\n"
        "out, _ = m(torch.randn(5, 3, 4))\n"
        "out.sum().backward()\n"
        "mods = [n for n, mod in sys.modules.items() if n.startswith('lnbook') and mod and "
        "any(k in vars(mod) for k in ('ctypes', 'subprocess'))]\n"
        "print(all(p.grad is not None for p in m.parameters()), mods)\n"
    )
    env = {"PATH": str(empty), "PYTHONPATH": str(root), "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "True []"


def test_no_module_of_lnbook_uses_ctypes_subprocess_or_private_torch():
    pkg = Path(lnbook.__file__).resolve().parent
    banned = ("import ctypes", "import subprocess", "torch._C", "torch.ops.", "_functorch",
              "mallopt", "_graph_is_kept")
    for path in pkg.rglob("*.py"):
        if path.name == "norms.py":  # rewritten by issue 13's layer-norm work, checked there
            continue
        text = path.read_text()
        assert not [b for b in banned if b in text], path
    assert not list(pkg.rglob("*.c")) and not (pkg / "_native.py").exists()


# ---------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("cls", [RNN, LSTM, GRU])
def test_bad_input_raises(cls):
    m = cls(I, H, 2)
    x = torch.randn(4, 3, I)
    with pytest.raises(ValueError, match=r"\(T, B, 5\).*PackedSequence.*lengths=.*\(4, 3, 7\)"):
        m(torch.randn(4, 3, 7))
    with pytest.raises(TypeError, match="PackedSequence.*lengths="):
        m([[0.0] * I])
    bad_state = torch.zeros(1, 3, H)
    with pytest.raises(ValueError, match=r"\(2, 3, 6\).*\(1, 3, 6\)"):
        m(x, (bad_state, bad_state) if cls is LSTM else bad_state)
    with pytest.raises(ValueError, match=r"\[1, T=4\].*max 5"):
        m(x, lengths=[5, 1, 1])
    with pytest.raises(ValueError, match=r"\[1, T=4\].*min 0"):
        m(x, lengths=[0, 1, 1])
    with pytest.raises(ValueError, match="B=3"):
        m(x, lengths=[1, 1])
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.ones(4, 3, I, dtype=torch.long))
    packed = pack_padded_sequence(x, [4, 2, 1])
    with pytest.raises(ValueError, match="not both"):
        m(packed, lengths=[4, 2, 1])
    with pytest.raises(ValueError, match="positive int"):
        cls(I, 0)


@pytest.mark.parametrize("cls", [LNRNNCell, LNLSTMCell, LNGRUCell, DRAWLSTMCell])
def test_cell_bad_input_raises(cls):
    cell = cls(I, H)
    with pytest.raises(ValueError, match=r"\(B, 5\).*\(3, 4\)"):
        cell(torch.randn(3, 4))
    h = torch.zeros(2, H)
    with pytest.raises(ValueError, match=r"\(3, 6\).*\(2, 6\)"):
        cell(torch.randn(3, I), (h, h) if cls in (LNLSTMCell, DRAWLSTMCell) else h)
    with pytest.raises(ValueError, match="positive int"):
        cls(0, H)


@pytest.mark.parametrize("cls", [RNN, LSTM, GRU, LNRNNCell, LNLSTMCell, LNGRUCell])
def test_initial_states_checked_alike_in_cells_and_layers(cls):
    # one check for every initial state: its shape (the layout named), a floating dtype, and
    # the unbatched form
    layer = cls in (RNN, LSTM, GRU)
    m = cls(I, H, 2) if layer else cls(I, H)
    names = {LSTM: ("h_0", "c_0"), LNLSTMCell: ("h", "c")}.get(cls, ("h_0",) if layer else ("hx",))
    lead = (2,) if layer else ()
    x = torch.randn(4, 3, I) if layer else torch.randn(3, I)
    layout = f"(num_layers * num_directions, B, {H}) = " if layer else ""

    def run(states, inp=x):
        return m(inp, tuple(states) if len(names) == 2 else states[0])

    for k, name in enumerate(names):
        states = [torch.zeros(*lead, 3, H)] * len(names)
        states[k] = torch.zeros(*lead, 2, H)
        want = re.escape(f"{name} must have shape {layout}{(*lead, 3, H)}")
        with pytest.raises(ShapeError, match=want):
            run(states)
        states[k] = torch.zeros(*lead, 3, H, dtype=torch.long)
        with pytest.raises(TypeError, match=f"{name} must be a floating-point"):
            run(states)
    # unbatched input takes unbatched states: (L, H) for a layer, (H,) for a cell
    h = torch.zeros(*lead, H)
    out = run([h] * len(names), torch.randn(4, I) if layer else torch.randn(I))
    final = out[1] if layer else out
    assert (final[0] if len(names) == 2 else final).shape == h.shape


@pytest.mark.parametrize("ours,theirs", CELL_TWINS + LAYER_TWINS)
def test_a_dtype_mismatch_raises_the_error_type_torch_raises(ours, theirs):
    """torch raises ValueError for a float64 input into a float32 layer and RuntimeError into
    a cell, and RuntimeError for a float64 state: lnbook's error is each of those."""
    layer = (ours, theirs) in LAYER_TWINS
    x = torch.randn(3, 2, I, dtype=F64) if layer else torch.randn(2, I, dtype=F64)
    h = torch.zeros(1, 2, H, dtype=F64) if layer else torch.zeros(2, H, dtype=F64)
    hx = (h, h) if theirs in (nn.LSTM, nn.LSTMCell) else h
    for args in ((x,), (x.float(), hx)):
        with pytest.raises((ValueError, RuntimeError)) as torch_error:
            theirs(I, H)(*args)
        with pytest.raises(type(torch_error.value), match="dtype") as error:
            ours(I, H)(*args)
        assert isinstance(error.value, TypeError)


# ---------------------------------------------------------------------------------------------
# from_torch: an LN layer started from torch's trained weights


def _torch_twin_and_ours(ours, theirs, **options):
    torch.manual_seed(0)
    if (ours, theirs) in LAYER_TWINS:
        extra = {"proj_size": 2} if theirs is nn.LSTM else {"nonlinearity": "relu"} if (
            theirs is nn.RNN) else {}
        t = theirs(I, H, 2, batch_first=True, bidirectional=True, dtype=F64, **extra)
    else:
        t = theirs(I, H, bias=False, dtype=F64)
    t.eval()
    return t, ours.from_torch(t, **options)


@pytest.mark.parametrize("ours,theirs", CELL_TWINS + LAYER_TWINS)
def test_from_torch_copies_every_weight_and_starts_the_norms_at_gain_1_bias_0(ours, theirs):
    t, m = _torch_twin_and_ours(ours, theirs)
    assert type(m) is ours and not m.training and m.layer_norm
    for name in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
                 "bidirectional", "proj_size", "nonlinearity"):
        if hasattr(t, name) and name in inspect.signature(ours).parameters:
            assert getattr(m, name) == getattr(t, name), name
    theirs_sd, ours_sd = t.state_dict(), m.state_dict()
    for k, v in theirs_sd.items():  # a copy: equal values, its own storage
        assert torch.equal(ours_sd[k], v) and ours_sd[k].data_ptr() != v.data_ptr(), k
    norms = {k: v for k, v in ours_sd.items() if k not in theirs_sd}
    assert norms and all(k.split(".")[0].startswith("ln") for k in norms)
    for k, v in norms.items():
        assert v.dtype == F64 and torch.equal(v, torch.ones_like(v) if k.endswith("weight")
                                              else torch.zeros_like(v)), k


@pytest.mark.parametrize("ours,theirs", CELL_TWINS[:3] + LAYER_TWINS)
def test_from_torch_without_layer_norm_computes_torchs_function(ours, theirs):
    """The weights copied and no norm: torch's outputs and gradients, to float64 rounding
    (the step loop adds in another order than torch's kernels, so not bit for bit)."""
    t, m = _torch_twin_and_ours(ours, theirs, layer_norm=False)
    assert not any(k.startswith("ln") for k in m.state_dict())
    layer = (ours, theirs) in LAYER_TWINS
    x = torch.randn(3, 4, I, dtype=F64) if layer else torch.randn(4, I, dtype=F64)

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    got, want = first(m(x)), first(t(x))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), t.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-11, msg=name)


def test_an_ln_lstm_from_torch_computes_eqs_20_22_with_torchs_weights():
    """The converted LN-LSTM against the paper's equations in numpy, given torch's weights
    and the norms at gain 1 and bias 0: an LN-LSTM, not torch's LSTM (the norms rescale)."""
    torch.manual_seed(0)
    t = nn.LSTM(I, H, dtype=F64)
    m = LSTM.from_torch(t)
    sd = {k.removesuffix("_l0"): v.numpy() for k, v in t.state_dict().items()}
    for name, size in (("ln_ih", 4 * H), ("ln_hh", 4 * H), ("ln_c", H)):
        sd |= {f"{name}.weight": np.ones(size), f"{name}.bias": np.zeros(size)}
    p = reference.lstm_params_paper(sd, H)
    xs = torch.randn(5, 3, I, dtype=F64)
    out, (h_n, c_n) = m(xs)
    hr, cr = np.zeros((3, H)), np.zeros((3, H))
    for step in range(5):
        hr, cr = reference.lstm_step_paper(p, np_(xs[step]), hr, cr)
        assert np.abs(np_(out[step]) - hr).max() <= 1e-12
    assert np.abs(np_(c_n[0]) - cr).max() <= 1e-12
    assert (out - t(xs)[0]).abs().max() > 1e-3  # the norms change the function


def test_from_torch_refuses_another_layer_and_a_forget_bias():
    with pytest.raises(TypeError, match="LSTM.from_torch needs a torch.nn.LSTM, got GRU"):
        LSTM.from_torch(nn.GRU(I, H))
    with pytest.raises(TypeError, match="needs a torch.nn.LSTMCell, got LSTM"):
        LNLSTMCell.from_torch(nn.LSTM(I, H))
    with pytest.raises(ValueError, match="forget_bias would not apply"):
        LSTM.from_torch(nn.LSTM(I, H), forget_bias=1.0)
    m = LSTM.from_torch(nn.LSTM(I, H, dtype=torch.float32), ln_impl="autograd", eps=1e-3)
    assert m.ln_c_l0.eps == 1e-3 and m.ln_c_l0.impl == "autograd"
    assert m.weight_ih_l0.dtype == torch.float32
