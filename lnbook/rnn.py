r"""Layer-normalized recurrent cells and sequence layers (paper section 3.1; chapters 3.1 and
Supplement): the paper's equations as step functions, then torch's interface for them.

Each class is a drop-in for its ``torch.nn`` twin (signature, parameter names, gate order);
lnbook's options are keyword-only. ``layer_norm=False`` is torch's model; ``layer_norm=True`` adds
norm submodules (``ln``, ``ln_ih_l0``, ...: :class:`lnbook.LayerNorm` or the factory ``norm``'s)
with torch's biases added after the normalization.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from lnbook.bptt import ln_lstm_recurrence
from lnbook.checks import (
    DTypeError,
    ShapeError,
    check_bool,
    check_choice,
    check_floating,
    check_size,
    make_module,
)
from lnbook.norms import LN_IMPL, LN_IMPLS, LayerNorm

__all__ = ["LNRNNCell", "LNLSTMCell", "LNGRUCell", "DRAWLSTMCell", "RNN", "LSTM", "GRU"]

Norm = Callable[[Tensor], Tensor] | None
"""A norm of the last dimension as the step functions take it (None: torch's own cell)."""

_Lengths = Tensor | Sequence[int] | None
_Device = torch.device | str | None
_Impl = Literal["autograd", "torch"]
_NormFactory = Callable[[int], nn.Module] | None
_Packed = tuple[PackedSequence, Tensor] | None  # a PackedSequence input and its lengths
_ACTS: dict[str, Callable[[Tensor], Tensor]] = {"tanh": torch.tanh, "relu": torch.relu}
_B = TypeVar("_B", bound="_Base")
_NORMS = ("ln", "ln_ih", "ln_hh", "ln_c", "ln_in", "ln_hn")  # every kind's norms, by name


# ----------------------------------------------------------------------------------------------
# the paper's equations: the step functions that cells and layers both run
#
# LN(v) = g * (v - mean(v)) / sqrt(var(v) + eps) + b over the units of v, one example at a time
# (eq. 3); here `ln` stands for any norm module the model was built with.
#
#   eq. 4      a_t = W_hh h_{t-1} + W_ih x_t             h_t = f(LN(a_t) + b)
#   eq. 20     (i, f, g, o) = LN(W_hh h_{t-1}) + LN(W_ih x_t) + b     (torch's gate order)
#   eq. 21     c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
#   eq. 22     h_t = sigmoid(o) * tanh(LN(c_t))                       (c_t carried un-normalized)
#   eq. 26     (r, z) = LN(W_hh[r,z] h_{t-1}) + LN(W_ih[r,z] x_t) + b
#   eq. 27     n = tanh(LN(W_ih[n] x_t) + b_in + sigmoid(r) * (LN(W_hh[n] h_{t-1}) + b_hn))
#   eq. 28     h_t = (1 - sigmoid(z)) * n + sigmoid(z) * h_{t-1}       (torch's z: see LNGRUCell)
#   eqs. 29-31 eqs. 20-22 with LN on c_t only (DRAW)
#
# Without LN (ln None) each step is torch's: eqs. 17-19 for the LSTM, 23-25 for the GRU.


def rnn_step(gi: Tensor, h: Tensor, w_hh: Tensor, b: Tensor | None, ln: Norm,
             act: Callable) -> Tensor:
    """Eq. 4: ``act(LN(a_t) + b)`` with ``a_t = gi + W_hh h``, ``gi = W_ih x_t``; without LN
    torch's ``act(a_t)``, ``gi`` then holding both biases."""
    a = torch.addmm(gi, h, w_hh.t())  # (B, H) summed inputs a_t
    if ln is None:
        return act(a)  # (B, H)
    return act(_plus(ln(a), b))  # (B, H)


def lstm_step(gi: Tensor, h: Tensor, c: Tensor, w_hh: Tensor, ln_hh: Norm, ln_c: Norm,
              w_hr: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Eqs. 20-22 (or 17-19, 29-31). ``gi = LN(W_ih x_t) + every bias``, (B, 4H); gates in
    torch's order (i, f, g, o); ``w_hr`` projects h_t as torch's ``proj_size`` does."""
    if ln_hh is None:
        gates = torch.addmm(gi, h, w_hh.t())  # (B, 4H)
    else:
        gates = ln_hh(torch.mm(h, w_hh.t())) + gi  # (B, 4H), eq. 20
    i, f, g, o = gates.chunk(4, 1)  # (B, H) each
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)  # (B, H), eq. 21
    h = torch.sigmoid(o) * torch.tanh(c if ln_c is None else ln_c(c))  # (B, H), eq. 22
    return (h if w_hr is None else torch.mm(h, w_hr.t())), c


def gru_input(x: Tensor, w_ih: Tensor, b_ih: Tensor | None, b_hh: Tensor | None, ln_ih: Norm,
              ln_in: Norm) -> Tensor:
    """Input half of eqs. 26-27 for any leading shape: (*, 3H) = [r, z | n] pre-activations,
    with b_ih and the r, z part of b_hh added (the n part of b_hh sits inside r * (...))."""
    H = w_ih.shape[0] // 3
    gi = F.linear(x, w_ih)  # (*, 3H)
    b_rz = _plus(None if b_ih is None else b_ih[: 2 * H], None if b_hh is None else b_hh[: 2 * H])
    b_n = None if b_ih is None else b_ih[2 * H :]
    if ln_ih is None or ln_in is None:
        b = None if b_rz is None else torch.cat([b_rz, b_n])  # type: ignore[list-item]
        return _plus(gi, b)  # type: ignore[return-value]
    rz = _plus(ln_ih(gi[..., : 2 * H]), b_rz)  # (*, 2H), eq. 26's input term
    n = _plus(ln_in(gi[..., 2 * H :]), b_n)  # (*, H), eq. 27's input term
    return torch.cat([rz, n], dim=-1)  # type: ignore[list-item]


def gru_step(gi: Tensor, h: Tensor, w_hh: Tensor, b_hn: Tensor | None, ln_hh: Norm,
             ln_hn: Norm) -> Tensor:
    """Eqs. 26-28 in torch's form; ``gi`` from :func:`gru_input`, (B, 3H)."""
    H = h.shape[1]
    gh = torch.mm(h, w_hh.t())  # (B, 3H)
    if ln_hh is None or ln_hn is None:
        rz = torch.sigmoid(gi[:, : 2 * H] + gh[:, : 2 * H])  # (B, 2H)
        hn = _plus(gh[:, 2 * H :], b_hn)  # (B, H)
    else:
        rz = torch.sigmoid(gi[:, : 2 * H] + ln_hh(gh[:, : 2 * H]))  # (B, 2H), eq. 26
        hn = _plus(ln_hn(gh[:, 2 * H :]), b_hn)  # (B, H)
    r, z = rz[:, :H], rz[:, H:]
    n = torch.tanh(gi[:, 2 * H :] + r * hn)  # (B, H), eq. 27
    return n + z * (h - n)  # (1 - z) n + z h, eq. 28


def _plus(*ts: Tensor | None) -> Tensor | None:
    """The sum of the tensors that are not None (None if all are)."""
    out = None
    for t in ts:
        if t is not None:
            out = t if out is None else out + t
    return out


# ----------------------------------------------------------------------------------------------
# one time loop per kind of cell, run by a cell (one step) and by a layer (T steps)


def _masked_loop(step: Callable[[int, list[Tensor]], list[Tensor]], T: int, state: list[Tensor],
                 mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
    """``state = step(t, state)`` for t < T, output ``state[0]``; padding keeps state, outputs 0."""
    outs = []
    for t in range(T):
        new = step(t, state)
        if mask is None:
            state = new
            outs.append(new[0])
        else:
            m = mask[t]
            state = [torch.where(m, a, b) for a, b in zip(new, state, strict=True)]
            outs.append(new[0] * m)
    return torch.stack(outs), state


class _RNNKind:
    """Eq. 4 over time. ``p`` holds one layer's weights and norms (``_weights``)."""

    _gates, _lns = 1, (("ln", 1),)
    nonlinearity: str

    def _scan(self, x: Tensor, mask: Tensor | None, state: list[Tensor],
              p: dict) -> tuple[Tensor, list[Tensor]]:
        act = _ACTS[self.nonlinearity]
        b, ln = _plus(p["b_ih"], p["b_hh"]), p["ln"]  # (H,) or None
        gis = F.linear(x, p["w_ih"], b if ln is None else None).unbind(0)  # T x (B, H)

        def step(t: int, s: list[Tensor]) -> list[Tensor]:
            return [rnn_step(gis[t], s[0], p["w_hh"], b, ln, act)]  # [(B, H)]

        return _masked_loop(step, x.shape[0], state, mask)


class _LSTMKind:
    """Eqs. 20-22 (17-19 without LN, 29-31 with LN on c_t only) over time."""

    _gates, _lns = 4, (("ln_ih", 4), ("ln_hh", 4), ("ln_c", 1))
    bptt, forget_bias = "autograd", 0.0
    hidden_size: int

    def _set_forget_bias(self, forget_bias: float, bias: bool) -> None:
        if forget_bias and not bias:
            raise ValueError("forget_bias needs bias=True (it shifts bias_ih)")
        self.forget_bias = float(forget_bias)

    def reset_parameters(self) -> None:
        """As torch, plus ``forget_bias`` on every ``bias_ih[H:2H]``."""
        super().reset_parameters()  # type: ignore[misc]
        H = self.hidden_size
        with torch.no_grad():
            for name, p in self.named_parameters(recurse=False):  # type: ignore[attr-defined]
                if name.startswith("bias_ih") and self.forget_bias:
                    p[H : 2 * H] += self.forget_bias

    def _use_bptt(self, x: Tensor, mask: Tensor | None, p: dict) -> bool:
        """Whether the hand BPTT applies: gained LNs on W_hh h and c_t, no mask, no projection."""
        return (self.bptt == "hand" and all(isinstance(p[n], (LayerNorm, nn.LayerNorm))
                                            and p[n].weight is not None
                                            for n in ("ln_hh", "ln_c"))
                and mask is None and p["w_hr"] is None
                and x.dtype in (torch.float32, torch.float64)
                and not torch.compiler.is_compiling())

    def _scan(self, x: Tensor, mask: Tensor | None, state: list[Tensor],
              p: dict) -> tuple[Tensor, list[Tensor]]:
        b, ln_ih, ln_hh, ln_c = _plus(p["b_ih"], p["b_hh"]), p["ln_ih"], p["ln_hh"], p["ln_c"]
        gi = F.linear(x, p["w_ih"], b if ln_ih is None else None)  # (T, B, 4H), one call
        if self._use_bptt(x, mask, p):
            # the norms' raw weights for lnbook.bptt; every additive bias (LN(W_hh h)'s too)
            # joins LN(W_ih x): one pass over (T, B, 4H), none inside the loop
            gi = _plus(gi if ln_ih is None else ln_ih(gi), b, ln_hh.bias)
            hs, h, c = ln_lstm_recurrence(gi, state[0], state[1], p["w_hh"], ln_hh.weight,
                                          ln_c.weight, ln_c.bias, ln_hh.eps, ln_c.eps)
            return hs, [h, c]
        if ln_ih is not None:
            gi = _plus(ln_ih(gi), b)  # (T, B, 4H), eq. 20's input term
        gis = gi.unbind(0)  # T views; unbind's backward stacks the grads once

        def step(t: int, s: list[Tensor]) -> list[Tensor]:
            return list(lstm_step(gis[t], s[0], s[1], p["w_hh"], ln_hh, ln_c, p["w_hr"]))

        return _masked_loop(step, x.shape[0], state, mask)


class _GRUKind:
    """Eqs. 26-28 (23-25 without LN) over time, in torch's GRU form."""

    _gates, _lns = 3, (("ln_ih", 2), ("ln_hh", 2), ("ln_in", 1), ("ln_hn", 1))
    _autocast_float32_on = frozenset({"cpu"})  # under autocast there: float32
    hidden_size: int

    def _scan(self, x: Tensor, mask: Tensor | None, state: list[Tensor],
              p: dict) -> tuple[Tensor, list[Tensor]]:
        H = self.hidden_size
        gis = gru_input(x, p["w_ih"], p["b_ih"], p["b_hh"], p["ln_ih"],
                        p["ln_in"]).unbind(0)  # T x (B, 3H)
        b_hn = None if p["b_hh"] is None else p["b_hh"][2 * H :]

        def step(t: int, s: list[Tensor]) -> list[Tensor]:
            return [gru_step(gis[t], s[0], p["w_hh"], b_hn, p["ln_hh"], p["ln_hn"])]  # [(B, H)]

        return _masked_loop(step, x.shape[0], state, mask)


# ----------------------------------------------------------------------------------------------
# torch's interface: parameters, dtypes, autocast, states, padding


def _autocast_off(device_type: str, dt: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast off while a module runs in its own compute dtype ``dt`` (nothing if None)."""
    if dt is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def _check_dtype(x: Tensor, want: torch.dtype, what: str) -> None:
    if x.dtype != want:  # a ValueError, as torch's layers raise (a RuntimeError, as its cells)
        raise DTypeError(
            f"{what} dtype ({x.dtype}) does not match the parameters' dtype ({want}): convert "
            f"the input with .to({want}) or the module with .to({x.dtype})"
        )


def _cast(t: Tensor | None, dtype: torch.dtype | None) -> Tensor | None:
    return t if t is None or dtype is None else t.to(dtype)


def _in_dtype(norm: nn.Module | None, dtype: torch.dtype | None) -> Norm:
    """The norm, or under autocast the norm called on its parameters cast to ``dtype``."""
    if norm is None or dtype is None or all(p.dtype == dtype for p in norm.parameters()):
        return norm
    params = {n: p.to(dtype) for n, p in norm.named_parameters()}
    return functools.partial(torch.func.functional_call, norm, params)


def _norm_maker(layer_norm: bool, norm: Callable[[int], nn.Module] | None, eps: float, bias: bool,
                ln_impl: str, kw: dict) -> Callable[[int], nn.Module | None]:
    """The one place a model's norms are made: ``size -> module`` (None without LN)."""
    if norm is not None and not layer_norm:
        raise ValueError("norm= gives the normalization of layer_norm=True; "
                         "with layer_norm=False there is none")
    if not layer_norm:
        return lambda size: None
    if norm is None:
        return functools.partial(LayerNorm, eps=eps, bias=bias, impl=ln_impl, **kw)
    return functools.partial(make_module, norm, what="norm", **kw)


def _pair(hx: object, what: str) -> list:
    """An LSTM's (h, c) state as a list of two (each possibly None)."""
    if hx is None:
        return [None, None]
    if isinstance(hx, (tuple, list)) and len(hx) == 2:
        return list(hx)
    raise ValueError(f"hx must be a tuple {what} or None")


def _suffix(k: int, d: int) -> str:
    """torch's name suffix of layer k, direction d: ``_l0``, ``_l1_reverse``, ..."""
    return f"_l{k}" + ("_reverse" if d == 1 else "")


class _Base(nn.Module):
    """Parameters named, ordered and initialized as torch's, plus the norm submodules."""

    _twin = ""  # the name of the torch.nn class this one is a drop-in for

    _autocast_float32_on: frozenset[str] = frozenset()
    _lns: tuple[tuple[str, int], ...] = ()  # (name, size as a multiple of H)
    # (name, default) of the options extra_repr shows where they differ (None: always)
    _shown: tuple[tuple[str, object], ...] = (
        ("bias", True), ("layer_norm", None), ("ln_impl", LN_IMPL))

    def _options(self, input_size: int, hidden_size: int, bias: bool, layer_norm: bool,
                 ln_impl: str) -> None:
        self.input_size = check_size("input_size", input_size)
        self.hidden_size = check_size("hidden_size", hidden_size)
        self.bias = check_bool("bias", bias)
        self.layer_norm = check_bool("layer_norm", layer_norm)
        self.ln_impl = check_choice("ln_impl", ln_impl, LN_IMPLS)

    @classmethod
    def from_torch(cls: type[_B], module: nn.Module, **options: object) -> _B:
        """This layer made from torch's twin ``module``: the same sizes and options (read from
        ``module``), device and dtype, train or eval mode, and a copy of every weight and bias;
        the norms, which torch's layer does not have, at their initial values (gain 1, bias 0
        for the default LayerNorms). ``options``: lnbook's keyword-only ones (``layer_norm``,
        ``eps``, ``ln_impl``, ``norm``, ``bptt``); with ``layer_norm=False`` the result computes
        torch's function. Raises ``TypeError`` unless ``module`` is the torch twin."""
        twin = getattr(nn, cls._twin)
        if not isinstance(module, twin):
            raise TypeError(f"{cls.__name__}.from_torch needs a torch.nn.{cls._twin}, "
                            f"got {type(module).__name__}")
        if options.get("forget_bias"):
            raise ValueError("from_torch copies torch's biases, so forget_bias would not apply; "
                             "add it to bias_ih[H:2H] of the result instead")
        names = [n for n, q in inspect.signature(cls.__init__).parameters.items()
                 if q.kind is q.POSITIONAL_OR_KEYWORD and n not in ("self", "device", "dtype")]
        w = next(iter(module.parameters()))
        made = cls(**{n: getattr(module, n) for n in names}, device=w.device, dtype=w.dtype,
                   **options)  # type: ignore[arg-type]
        keys = made.load_state_dict(module.state_dict(), strict=False)
        norms = {f"{n}.{k}" for n, m in made.named_children() for k in m.state_dict()}
        if keys.unexpected_keys or set(keys.missing_keys) != norms:  # pragma: no cover
            raise RuntimeError(f"{cls.__name__}.from_torch: the state dict of {module} does not "
                               f"map onto this layer's: {keys}")
        return made.train(module.training)

    def _cast_input(self, x: Tensor, want: torch.dtype) -> tuple[Tensor, torch.dtype | None]:
        """``x`` and its compute dtype under autocast as torch's twin; else ``x`` checked, None."""
        device_type = x.device.type
        if want != torch.float32 or not torch.is_autocast_enabled(device_type):
            _check_dtype(x, want, "input")
            return x, None
        if device_type in self._autocast_float32_on:
            return x.to(torch.float32), torch.float32
        dt = torch.get_autocast_dtype(device_type)
        return x.to(dt), dt

    def _state(self, s: Tensor | None, x: Tensor, batched: bool, size: int, what: str,
               dt: torch.dtype | None, lead: tuple[int, ...] = ()) -> Tensor:
        """An initial state ``(*lead, B, size)`` for ``x`` ``(*, B, I)``, zeros if None."""
        B = x.shape[-2]
        if s is None:
            return x.new_zeros(*lead, B, size)
        check_floating(s, what)
        want = (*lead, B, size) if batched else (*lead, size)
        if tuple(s.shape) != want:
            layout = f"(num_layers * num_directions, B, {size}) = " if lead else ""
            raise ShapeError(f"{what} must have shape {layout}{want}, got {tuple(s.shape)}")
        if dt is None:
            _check_dtype(s, x.dtype, what)
        else:
            s = s.to(dt)
        return s if batched else s.unsqueeze(len(lead))

    def _add_weights(self, sfx: str, n_in: int, n_hid: int, proj_size: int, kw: dict,
                     make_norm: Callable[[int], nn.Module | None]) -> None:
        """One layer and direction: torch's parameters in torch's order, then its norms."""
        H = self.hidden_size
        G = self._gates * H
        self.register_parameter(f"weight_ih{sfx}", nn.Parameter(torch.empty(G, n_in, **kw)))
        self.register_parameter(f"weight_hh{sfx}", nn.Parameter(torch.empty(G, n_hid, **kw)))
        for name in ("bias_ih", "bias_hh"):  # as torch: a cell keeps None, a layer nothing
            if self.bias or not sfx:
                self.register_parameter(
                    f"{name}{sfx}", nn.Parameter(torch.empty(G, **kw)) if self.bias else None)
        if proj_size > 0:
            self.register_parameter(f"weight_hr{sfx}",
                                    nn.Parameter(torch.empty(proj_size, H, **kw)))
        for name, mult in self._lns:
            setattr(self, f"{name}{sfx}", make_norm(mult * H))

    def reset_parameters(self) -> None:
        """As torch: own weights ~ U(-1/sqrt(H), 1/sqrt(H)) in registration order; norms reset."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters(recurse=False):
            nn.init.uniform_(p, -bound, bound)
        for m in self.children():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _weights(self, sfx: str, dt: torch.dtype | None) -> dict:
        """One layer and direction's weights cast to ``dt`` and norms, as ``_scan`` reads them."""
        p: dict = {n: _cast(getattr(self, f"{attr}{sfx}", None), dt) for n, attr in (
            ("w_ih", "weight_ih"), ("w_hh", "weight_hh"), ("b_ih", "bias_ih"),
            ("b_hh", "bias_hh"), ("w_hr", "weight_hr"))}
        for name in _NORMS:  # None where this model has no such norm
            p[name] = _in_dtype(self._modules.get(f"{name}{sfx}"), dt)
        return p

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        for name, default in self._shown:
            if name == "ln_impl" and not self.layer_norm:
                continue  # no layer norm, no implementation of one
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)!r}"
        return s


# ----------------------------------------------------------------------------------------------
# cells


class _CellBase(_Base):
    """A cell: one layer's parameters without suffix (``weight_ih``, ``ln``, ...), one step."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: _Device = None,
                 dtype: torch.dtype | None = None, *, layer_norm: bool = True, eps: float = 1e-5,
                 ln_impl: _Impl = LN_IMPL, norm: _NormFactory = None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self._options(input_size, hidden_size, bias, layer_norm, ln_impl)
        self._add_weights("", input_size, self.hidden_size, 0, kw,
                          _norm_maker(layer_norm, norm, eps, bias, ln_impl, kw))
        self.reset_parameters()

    def _step(self, input: Tensor, hx: list, names: tuple[str, ...]) -> list[Tensor]:
        """One step of the kind's loop: the new state, batched as ``input`` is."""
        check_floating(input, "input")
        if input.dim() not in (1, 2) or input.shape[-1] != self.input_size:
            raise ValueError(
                f"{type(self).__name__} expects input of shape (B, {self.input_size}) or "
                f"({self.input_size},), got {tuple(input.shape)}"
            )
        batched = input.dim() == 2
        x, dt = self._cast_input(input if batched else input.unsqueeze(0), self.weight_ih.dtype)
        s = [self._state(h, x, batched, self.hidden_size, n, dt)
             for h, n in zip(hx, names, strict=True)]  # (B, H) each
        with _autocast_off(x.device.type, dt):
            _, s = self._scan(x.unsqueeze(0), None, s, self._weights("", dt))
        return s if batched else [t.squeeze(0) for t in s]

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """An RNN or GRU cell's step (one state, h); LNLSTMCell's has (h, c)."""
        return self._step(input, [hx], ("hx",))[0]


class LNRNNCell(_RNNKind, _CellBase):
    r"""An Elman RNN cell with layer normalization of its summed inputs (eq. 4; chapter 3.1).

    .. math::
        a_t = W_{ih} x_t + W_{hh} h_{t-1}, \qquad
        h_t = f\big(\mathrm{LN}(a_t; g, b) + b_{ih} + b_{hh}\big)

    Args:
        input_size, hidden_size, bias, nonlinearity, device, dtype: as :class:`torch.nn.RNNCell`;
            with LN, ``bias=False`` removes the LN bias too.
        layer_norm: normalize a_t with the submodule ``ln`` (keyword-only, as below). Default: True.
        eps, ln_impl: ``eps`` and ``impl`` of the default :class:`lnbook.LayerNorm`. Default:
            1e-5, ``LN_IMPL``.
        norm: a factory ``size -> module`` used instead of :class:`lnbook.LayerNorm`.

    Shape: input ``(B, input_size)`` or ``(input_size,)``; hx and output ``(B, H)`` or ``(H,)``.
    """

    _twin = "RNNCell"
    _shown = (*_CellBase._shown, ("nonlinearity", None))

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: Literal["tanh", "relu"] = "tanh", device: _Device = None,
                 dtype: torch.dtype | None = None, *, layer_norm: bool = True, eps: float = 1e-5,
                 ln_impl: _Impl = LN_IMPL, norm: _NormFactory = None) -> None:
        self.nonlinearity = check_choice("nonlinearity", nonlinearity, tuple(_ACTS))
        super().__init__(input_size, hidden_size, bias, device, dtype, layer_norm=layer_norm,
                         eps=eps, ln_impl=ln_impl, norm=norm)


class LNLSTMCell(_LSTMKind, _CellBase):
    r"""An LSTM cell with layer normalization (eqs. 20-22; Supplement chapter).

    .. math::
        [i; f; g; o] = \mathrm{LN}(W_{hh} h_{t-1}) + \mathrm{LN}(W_{ih} x_t) + b_{ih} + b_{hh}

        c_t = \sigma(f) \odot c_{t-1} + \sigma(i) \odot \tanh(g), \qquad
        h_t = \sigma(o) \odot \tanh(\mathrm{LN}(c_t))

    Norms ``ln_ih``, ``ln_hh`` over 4H, ``ln_c`` over H; torch's gate order (i, f, g, o). Arguments
    as :class:`LNRNNCell`, plus ``forget_bias``: added to ``bias_ih[H:2H]`` after initialization.
    Shape: hx and output ``(h, c)``, each ``(B, H)``.
    """

    _twin = "LSTMCell"
    _autocast_float32_on = frozenset({"cpu"})

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: _Device = None,
                 dtype: torch.dtype | None = None, *, layer_norm: bool = True,
                 forget_bias: float = 0.0, eps: float = 1e-5, ln_impl: _Impl = LN_IMPL,
                 norm: _NormFactory = None) -> None:
        self._set_forget_bias(forget_bias, bias)
        super().__init__(input_size, hidden_size, bias, device, dtype, layer_norm=layer_norm,
                         eps=eps, ln_impl=ln_impl, norm=norm)

    def forward(self, input: Tensor,
                hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        h, c = self._step(input, _pair(hx, "(h, c)"), ("h", "c"))
        return h, c


class DRAWLSTMCell(LNLSTMCell):
    r"""The LSTM of the DRAW experiment: LN on the cell state only (eqs. 29-31).

    One norm ``ln_c`` over H; otherwise as :class:`LNLSTMCell`.
    """

    _lns = (("ln_c", 1),)
    ln_ih = ln_hh = None


class LNGRUCell(_GRUKind, _CellBase):
    r"""A GRU cell with layer normalization (eqs. 26-28 in torch's GRUCell form).

    .. math::
        [r; z] = \sigma\big(\mathrm{LN}_{ih}(W_{ih}[r,z]\, x) + \mathrm{LN}_{hh}(W_{hh}[r,z]\, h)
                 + b_{ih}[r,z] + b_{hh}[r,z]\big)

        n = \tanh\big(\mathrm{LN}_{in}(W_{ih}[n]\, x) + b_{in}
            + r \odot (\mathrm{LN}_{hn}(W_{hh}[n]\, h) + b_{hn})\big), \qquad
        h_t = (1 - z) \odot n + z \odot h_{t-1}

    ``ln_ih``, ``ln_hh`` over 2H, ``ln_in``, ``ln_hn`` over H. Torch's z is the paper's 1 - σ(z_p);
    the learned LN gain absorbs the sign. Arguments and shapes as :class:`LNRNNCell`.
    """

    _twin = "GRUCell"


# ----------------------------------------------------------------------------------------------
# sequence layers


def _lengths_tensor(lengths: _Lengths, T: int, B: int) -> Tensor | None:
    """``lengths`` checked as B ints in [1, T]; None when every sequence is T long."""
    if lengths is None:
        return None
    lens = torch.as_tensor(lengths)
    if lens.dim() != 1 or lens.shape[0] != B or lens.is_floating_point() or lens.is_complex():
        raise ValueError(f"lengths must be B={B} integers (a 1-D integer tensor or list), "
                         f"got shape {tuple(lens.shape)} and dtype {lens.dtype}")
    lo, hi = int(lens.min()), int(lens.max())
    if lo < 1 or hi > T:
        raise ValueError(f"lengths must lie in [1, T={T}] for input with T={T} steps, "
                         f"got min {lo} and max {hi}")
    return None if lo == T else lens.to(torch.long)


def _repack(out: Tensor, p: PackedSequence, lens: Tensor) -> PackedSequence:
    """(T, B, F) output in the batch's original order -> a PackedSequence like the input ``p``."""
    if p.sorted_indices is not None:
        out = out.index_select(1, p.sorted_indices)
        lens = lens[p.sorted_indices.cpu()]
    data = pack_padded_sequence(out, lens, enforce_sorted=True).data
    return PackedSequence(data, p.batch_sizes, p.sorted_indices, p.unsorted_indices)


def _step_mask(lens: Tensor | None, x: Tensor) -> Tensor | None:
    """(T, B, 1): True where step t < ``lens[b]`` for ``x`` (T, B, F); None without lengths."""
    if lens is None:
        return None
    t = torch.arange(x.shape[0], device=x.device).unsqueeze(1)  # (T, 1)
    return (t < lens.to(x.device)).unsqueeze(-1)


def _reverse(x: Tensor, lens: Tensor | None) -> Tensor:
    """``x`` (T, B, F) with each sequence reversed in time within its own length."""
    if lens is None:
        return x.flip(0)
    t = torch.arange(x.shape[0], device=x.device).unsqueeze(1)  # (T, 1)
    n = lens.to(x.device).unsqueeze(0)  # (1, B)
    index = torch.where(t < n, n - 1 - t, t)  # (T, B) padding steps stay in place
    return x.gather(0, index.unsqueeze(-1).expand_as(x))


class _RNNBase(_Base):
    """A stack of layers: parameters as torch's ``RNNBase``, norms ``ln_l0``, ..."""

    proj_size = 0  # set by LSTM before this __init__ runs
    _shown = (("proj_size", 0), ("num_layers", 1), ("bias", True), ("batch_first", False),
              ("dropout", 0.0), ("bidirectional", False), ("layer_norm", None),
              ("ln_impl", LN_IMPL))

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: _Device = None, dtype: torch.dtype | None = None, *,
                 layer_norm: bool = True, eps: float = 1e-5, ln_impl: _Impl = LN_IMPL,
                 norm: _NormFactory = None) -> None:
        super().__init__()
        proj_size = self.proj_size
        kw = {"device": device, "dtype": dtype}
        self._options(input_size, hidden_size, bias, layer_norm, ln_impl)
        self.num_layers = check_size("num_layers", num_layers)
        if (isinstance(dropout, bool) or not isinstance(dropout, numbers.Real)
                or not 0 <= dropout <= 1):
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout acts between stacked layers (not after the last one, as in torch), so "
                f"dropout={dropout} with num_layers=1 does nothing",
                stacklevel=2 if type(self).__init__ is _RNNBase.__init__ else 3)
        check_size("proj_size", proj_size, minimum=0)
        if proj_size >= hidden_size:
            raise ValueError(f"proj_size must be smaller than hidden_size={hidden_size}, "
                             f"got {proj_size}")
        self.batch_first = check_bool("batch_first", batch_first)
        self.dropout = float(dropout)
        self.bidirectional = check_bool("bidirectional", bidirectional)
        make_norm = _norm_maker(layer_norm, norm, eps, bias, ln_impl, kw)
        H_out = proj_size or hidden_size  # the size of h_t
        for k in range(num_layers):
            for d in range(self._num_directions):
                n_in = input_size if k == 0 else H_out * self._num_directions
                self._add_weights(_suffix(k, d), n_in, H_out, proj_size, kw, make_norm)
        self.reset_parameters()

    def flatten_parameters(self) -> None:
        """Does nothing (kept so that code written for torch.nn.LSTM runs)."""

    @property
    def _num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _prepare(
        self, input: Tensor | PackedSequence, lengths: _Lengths
    ) -> tuple[Tensor, bool, Tensor | None, _Packed, torch.dtype | None]:
        """``input`` as (T, B, I), whether batched, lengths, packing to restore, autocast dtype."""
        cls, I = type(self).__name__, self.input_size
        packing = None
        if isinstance(input, PackedSequence):
            if lengths is not None:
                raise ValueError(f"{cls}: pass either a PackedSequence or a padded tensor with "
                                 "lengths=, not both")
            x, lens = pad_packed_sequence(input)  # (T, B, I) in the batch's original order
            packing, lengths = (input, lens), lens
        elif isinstance(input, Tensor):
            x = input
        else:
            raise TypeError(
                f"{cls} expects a tensor (T, B, {I}) (or (B, T, {I}) with batch_first) or a "
                "torch.nn.utils.rnn.PackedSequence; for padded sequences pass the padded tensor "
                f"with lengths=, got {type(input).__name__}"
            )
        check_floating(x, "input")
        layout = "(B, T, {I})" if self.batch_first else "(T, B, {I})"
        if x.dim() not in (2, 3) or x.shape[-1] != I:
            raise ShapeError(
                f"{cls} expects input of shape {layout.format(I=I)} or (T, {I}), or a "
                f"PackedSequence (padded batches: pass lengths=), got {tuple(x.shape)}"
            )
        batched = x.dim() == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first and packing is None:
            x = x.transpose(0, 1)
        if x.shape[0] == 0:
            raise ValueError(f"{cls} needs at least one time step, got input {tuple(x.shape)}")
        if lengths is not None and not batched:
            lengths = [lengths] if isinstance(lengths, int) else lengths
        lens = _lengths_tensor(lengths, x.shape[0], x.shape[1])
        x, dt = self._cast_input(x, self.weight_ih_l0.dtype)
        return x, batched, lens, packing, dt

    def _run(self, x: Tensor, lens: Tensor | None, hx: list[Tensor],
             dt: torch.dtype | None) -> tuple[Tensor, list[Tensor]]:
        """All layers and directions: output (T, B, D * H_out), final states (L * D, B, .)."""
        D, mask = self._num_directions, _step_mask(lens, x)
        inp, lasts = x, []
        for k in range(self.num_layers):
            outs = []
            for d in range(D):
                p = self._weights(_suffix(k, d), dt)
                xin = inp if d == 0 else _reverse(inp, lens)
                out, last = self._scan(xin, mask, [s[k * D + d] for s in hx], p)
                outs.append(out if d == 0 else _reverse(out, lens))
                lasts.append(last)
            inp = outs[0] if D == 1 else torch.cat(outs, -1)  # (T, B, D * H_out)
            if self.dropout > 0 and self.training and k < self.num_layers - 1:
                inp = F.dropout(inp, self.dropout, training=True)
        return inp, [torch.stack(f) for f in zip(*lasts, strict=True)]  # [(L * D, B, .)]

    def forward(self, input: Tensor | PackedSequence, hx: Tensor | None = None, *,
                lengths: _Lengths = None) -> tuple[Tensor | PackedSequence, Tensor]:
        """RNN's and GRU's forward (one state, h); LSTM's has (h, c)."""
        out, (h_n,) = self._forward(input, hx, lengths, (self.hidden_size,))
        return out, h_n

    def _forward(self, input: Tensor | PackedSequence, hx: Tensor | tuple | None, lengths: _Lengths,
                 sizes: tuple[int, ...]) -> tuple[Tensor | PackedSequence, list[Tensor]]:
        x, batched, lens, packing, dt = self._prepare(input, lengths)
        states = [hx] if len(sizes) == 1 else _pair(hx, "(h_0, c_0)")
        L = (self.num_layers * self._num_directions,)
        h = [self._state(s, x, batched, n, name, dt, L)
             for s, n, name in zip(states, sizes, ("h_0", "c_0")[: len(sizes)], strict=True)]
        with _autocast_off(x.device.type, dt):
            out, finals = self._run(x, lens, h, dt)
        if not batched:  # the output in the input's layout, final states (L * D, B, .)
            return out.squeeze(1), [s.squeeze(1) for s in finals]
        if packing is not None:
            return _repack(out, *packing), finals
        return (out.transpose(0, 1) if self.batch_first else out), finals


class RNN(_RNNKind, _RNNBase):
    r"""Layer-normalized Elman RNN layers (eq. 4; chapter 3.1), :class:`torch.nn.RNN`'s interface.

    Each layer runs :class:`LNRNNCell`'s step over time (norms ``ln_l{k}``, ``ln_l{k}_reverse``).

    Args:
        input_size, hidden_size, num_layers, nonlinearity, bias: as :class:`torch.nn.RNN`.
        batch_first, dropout, bidirectional, device, dtype: as :class:`torch.nn.RNN`.
        layer_norm, eps, ln_impl, norm: keyword-only, as :class:`LNRNNCell`.

    Shape:
        - input: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``, unbatched ``(T, I)``) or a
          PackedSequence; hx: ``(num_layers * D, B, H)``, zeros if None.
        - lengths (keyword): B ints in [1, T]; padding steps change no state and output 0.
        - Output: ``(output (T, B, D * H), h_n (num_layers * D, B, H))``.
    """

    _twin = "RNN"
    _shown = (*_RNNBase._shown, ("nonlinearity", "tanh"))

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: Literal["tanh", "relu"] = "tanh", bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: _Device = None, dtype: torch.dtype | None = None, *,
                 layer_norm: bool = True, eps: float = 1e-5, ln_impl: _Impl = LN_IMPL,
                 norm: _NormFactory = None) -> None:
        self.nonlinearity = check_choice("nonlinearity", nonlinearity, tuple(_ACTS))
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype, layer_norm=layer_norm, eps=eps,
                         ln_impl=ln_impl, norm=norm)


class LSTM(_LSTMKind, _RNNBase):
    r"""A stack of layer-normalized LSTM layers (eqs. 20-22); :class:`torch.nn.LSTM`'s interface.

    Norms ``ln_ih_l{k}``, ``ln_hh_l{k}`` (4H), ``ln_c_l{k}`` (H). ``bptt="hand"`` runs each layer
    through :func:`lnbook.bptt.ln_lstm_recurrence` where it applies (LayerNorms with gains, no
    padding or ``proj_size``, float32/64, not compiling); ``"autograd"`` (default) the step loop.

    Args:
        as :class:`RNN`, plus ``proj_size`` (torch's), and keyword-only ``forget_bias`` (as
        :class:`LNLSTMCell`) and ``bptt``.

    Shape: as :class:`RNN`; hx and the final state ``(h, c)``.
    """

    _twin = "LSTM"
    _shown = (*_RNNBase._shown, ("forget_bias", 0.0), ("bptt", "autograd"))

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device: _Device = None, dtype: torch.dtype | None = None, *,
                 layer_norm: bool = True, forget_bias: float = 0.0, eps: float = 1e-5,
                 ln_impl: _Impl = LN_IMPL, bptt: Literal["hand", "autograd"] = "autograd",
                 norm: _NormFactory = None) -> None:
        self.bptt = check_choice("bptt", bptt, ("hand", "autograd"))
        self._set_forget_bias(forget_bias, bias)
        self.proj_size = proj_size
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype, layer_norm=layer_norm, eps=eps,
                         ln_impl=ln_impl, norm=norm)

    def forward(self, input: Tensor | PackedSequence, hx: tuple[Tensor, Tensor] | None = None, *,
                lengths: _Lengths = None) -> tuple[Tensor | PackedSequence, tuple[Tensor, Tensor]]:
        sizes = (self.proj_size or self.hidden_size, self.hidden_size)  # of h and c
        out, (h_n, c_n) = self._forward(input, hx, lengths, sizes)
        return out, (h_n, c_n)


class GRU(_GRUKind, _RNNBase):
    r"""A stack of layer-normalized GRU layers (eqs. 26-28); :class:`torch.nn.GRU`'s interface.

    Norms ``ln_ih_l{k}``, ``ln_hh_l{k}`` (2H), ``ln_in_l{k}``, ``ln_hn_l{k}`` (H). Arguments and
    shapes as :class:`RNN`.
    """

    _twin = "GRU"
