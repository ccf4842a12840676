"""Layer-normalized recurrent cells and sequence layers (paper section 3.1 and the supplement).

Book chapters 3.1 (`03_1_ln_rnn`) and Supplement (`supplement`). Every cell here follows the
parameter names, shapes and gate order of its ``torch.nn`` twin (``weight_ih``,
``weight_hh``, ``bias_ih``, ``bias_hh``), so that with ``layer_norm=False`` a state dict loads
in both directions and the outputs agree. With ``layer_norm=True`` the summed inputs are
normalized by :class:`lnbook.LayerNorm` submodules (gains start at 1, biases at 0, as in the
authors' code), and the torch biases are added after the normalization:

- :class:`LNRNNCell`: eq. 4, one LN over the H summed inputs a_t = W_ih x_t + W_hh h_{t-1}.
- :class:`LNLSTMCell`: eqs. 20-22, separate LNs for W_hh h and W_ih x (over all 4H gates) and
  one on the cell state inside the output tanh.
- :class:`LNGRUCell`: eqs. 26-28 written in torch's GRUCell form.
- :class:`DRAWLSTMCell`: eqs. 29-31, LN only on the cell state.

The sequence layers :class:`RNN`, :class:`LSTM` and :class:`GRU` stack cells over layers and
time like :class:`torch.nn.RNN` & co. (same parameter names ``weight_ih_l0`` ...). They apply the
input projection W_ih x and its layer normalization to all time steps in one batched call, then
run a lean time loop; ``lengths`` masks padded steps.

:class:`SequenceBatchNorm` and :class:`BatchNormRNN` are the comparison of section 3.1: batch
normalization with separate statistics per time step (Cooijmans et al., 2016).

:class:`LSTM` with layer normalization runs each layer's time loop, by default, as one autograd
Function with the backward pass through time written out (``fused=True``; the same numbers as
the step-by-step loop to rounding, oneDNN's matmul on CPU where torch has it); ``fused=False``
runs the step-by-step loop of the cells. Between two matrix products, the fused loop does a
step's elementwise work either as a dozen torch operations or, for float32 on the CPU, in one
call into the C kernel ``lnbook/csrc/ln_lstm.c``, compiled on first use where the machine has a
C compiler (:func:`native_status`; ``LSTM(native=False)`` or ``LNBOOK_NATIVE=0`` turn it off).

Inside the time loops the LayerNorm submodules are applied through
``torch.nn.functional.layer_norm`` with their own weight, bias and eps (the same numbers as
:func:`lnbook.norms.layer_norm` up to rounding, without the per-call argument checks).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook import _native
from lnbook.norms import LayerNorm

__all__ = [
    "LNRNNCell",
    "LNLSTMCell",
    "LNGRUCell",
    "DRAWLSTMCell",
    "RNN",
    "LSTM",
    "GRU",
    "SequenceBatchNorm",
    "BatchNormRNN",
    "RecurrentDynamics",
    "recurrent_dynamics",
    "native_status",
]

_Lengths = Tensor | Sequence[int] | None


def _graph_is_kept() -> bool:
    """True unless autograd says this backward runs with ``retain_graph=False``.

    Moved here from ``lnbook.norms``, whose layer norm no longer needs it (issue 13).
    """
    ask = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    if ask is None:
        return True
    try:
        return bool(ask())
    except RuntimeError:
        return True


# ----------------------------------------------------------------------------------------------
# small helpers shared by cells and layers


def _ln(x: Tensor, m: LayerNorm | None) -> Tensor:
    """Apply LayerNorm module ``m`` (or nothing) with torch's fused kernel."""
    if m is None:
        return x
    return F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_float(x: object, what: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor, got dtype {x.dtype}")


def _check_cell_input(x: Tensor, input_size: int, cls: str) -> tuple[Tensor, bool]:
    """Return ``x`` as (B, input_size) and whether it had a batch dimension."""
    _check_float(x, "input")
    if x.dim() not in (1, 2) or x.shape[-1] != input_size:
        raise ValueError(
            f"{cls} expects input of shape (B, {input_size}) or ({input_size},), "
            f"got {tuple(x.shape)}"
        )
    return (x, True) if x.dim() == 2 else (x.unsqueeze(0), False)


def _check_cell_state(
    s: Tensor | None, batch: int, hidden: int, like: Tensor, batched: bool, what: str
) -> Tensor:
    if s is None:
        return like.new_zeros(batch, hidden)
    _check_float(s, what)
    want = (batch, hidden) if batched else (hidden,)
    if tuple(s.shape) != want:
        raise ValueError(f"{what} must have shape {want}, got {tuple(s.shape)}")
    return s if batched else s.unsqueeze(0)


def _init_uniform(module: nn.Module, hidden_size: int) -> None:
    """torch's RNN initialization: every weight and bias ~ U(-1/sqrt(H), 1/sqrt(H))."""
    bound = 1.0 / math.sqrt(hidden_size)
    for name, p in module.named_parameters(recurse=False):
        if name.startswith(("weight_", "bias_")):
            nn.init.uniform_(p, -bound, bound)


def _make_ln(size: int, on: bool, eps: float) -> LayerNorm | None:
    return LayerNorm(size, eps=eps, impl="torch") if on else None


# ----------------------------------------------------------------------------------------------
# the step functions (one place for the equations; cells and layers both call them)


def _rnn_step(
    gi: Tensor, h: Tensor, w_hh: Tensor, b: Tensor, ln: LayerNorm | None, act: Callable
) -> Tensor:
    """Eq. 4. ``gi`` = W_ih x (+ both biases when ``ln`` is None)."""
    if ln is None:
        return act(torch.addmm(gi, h, w_hh.t()))  # (B, H)
    a = torch.addmm(gi, h, w_hh.t())  # (B, H) summed inputs a_t
    return act(_ln(a, ln) + b)  # (B, H)


def _lstm_step(
    gi: Tensor,
    h: Tensor,
    c: Tensor,
    w_hh: Tensor,
    ln_hh: LayerNorm | None,
    ln_c: LayerNorm | None,
) -> tuple[Tensor, Tensor]:
    """Eqs. 20-22 (or 17-19, 29-31). ``gi`` = LN(W_ih x) + bias_ih + bias_hh, (B, 4H)."""
    if ln_hh is None:
        gates = torch.addmm(gi, h, w_hh.t())  # (B, 4H)
    else:
        gates = _ln(torch.mm(h, w_hh.t()), ln_hh) + gi  # (B, 4H)
    s = torch.sigmoid(gates)  # (B, 4H); the g quarter is not used
    H = h.shape[1]
    i, f, o = s[:, :H], s[:, H : 2 * H], s[:, 3 * H :]
    g = torch.tanh(gates[:, 2 * H : 3 * H])  # (B, H)
    c = torch.addcmul(f * c, i, g)  # (B, H), eq. 21: the un-normalized c_t is carried on
    h = o * torch.tanh(_ln(c, ln_c))  # (B, H), eq. 22
    return h, c


def _gru_input(
    x: Tensor,
    w_ih: Tensor,
    b_ih: Tensor,
    b_hh: Tensor,
    ln_ih: LayerNorm | None,
    ln_in: LayerNorm | None,
) -> Tensor:
    """Input half of eqs. 26-27 for any leading shape: (*, 3H) = [r, z | n] pre-activations."""
    H = b_hh.shape[0] // 3
    gi = F.linear(x, w_ih)  # (*, 3H)
    if ln_ih is None:
        return gi + torch.cat([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]])
    rz = _ln(gi[..., : 2 * H], ln_ih) + (b_ih[: 2 * H] + b_hh[: 2 * H])  # (*, 2H)
    n = _ln(gi[..., 2 * H :], ln_in) + b_ih[2 * H :]  # (*, H)
    return torch.cat([rz, n], dim=-1)


def _gru_step(
    gi: Tensor,
    h: Tensor,
    w_hh: Tensor,
    b_hn: Tensor,
    ln_hh: LayerNorm | None,
    ln_hn: LayerNorm | None,
) -> Tensor:
    """Eqs. 26-28 in torch's form; ``gi`` from :func:`_gru_input`, (B, 3H)."""
    H = h.shape[1]
    gh = torch.mm(h, w_hh.t())  # (B, 3H)
    if ln_hh is None:
        rz = torch.sigmoid(gi[:, : 2 * H] + gh[:, : 2 * H])  # (B, 2H)
        hn = gh[:, 2 * H :] + b_hn  # (B, H)
    else:
        rz = torch.sigmoid(gi[:, : 2 * H] + _ln(gh[:, : 2 * H], ln_hh))  # (B, 2H)
        hn = _ln(gh[:, 2 * H :], ln_hn) + b_hn  # (B, H)
    r, z = rz[:, :H], rz[:, H:]
    n = torch.tanh(gi[:, 2 * H :] + r * hn)  # (B, H)
    return n + z * (h - n)  # (1 - z) n + z h


# ----------------------------------------------------------------------------------------------
# the fused LN-LSTM recurrence: eqs. 20-22 over a whole sequence, backward through time by hand

_aten = torch.ops.aten
# oneDNN's matmul, which torch.nn.LSTM itself runs on CPU, and its weight packing; None where
# this torch build lacks them
_ONEDNN = getattr(torch.ops, "mkldnn", None)
_ONEDNN_LINEAR = getattr(_ONEDNN, "_linear_pointwise", None)
_ONEDNN_PACK = getattr(_ONEDNN, "_reorder_linear_weight", None)


def _onednn_applies(t: Tensor) -> bool:
    return (_ONEDNN_LINEAR is not None and t.dtype == torch.float32 and t.device.type == "cpu"
            and torch.backends.mkldnn.enabled)


def _pack_t(w: Tensor, rows: int) -> Tensor | None:
    """``w`` in oneDNN's blocked layout for products ``a @ w.T`` with ``rows`` rows, made once
    for a weight used at every time step; None where oneDNN does not apply."""
    if _ONEDNN_PACK is None or not _onednn_applies(w):
        return None
    try:
        return _ONEDNN_PACK(w.contiguous(), rows)
    except (RuntimeError, NotImplementedError):
        return None


def _mm_t(a: Tensor, w: Tensor, packed: Tensor | None = None) -> Tensor:
    """``a @ w.T``. On CPU in float32 this uses oneDNN's matmul when torch has it and
    ``torch.backends.mkldnn.enabled`` is on (with ``packed``, from :func:`_pack_t`, if given):
    ``torch.nn.LSTM`` runs oneDNN, and on some CPUs (AMD's, measured in
    ``benchmarks/bench_lstm.py``) torch.mm's BLAS runs at about half that speed. Anything
    else, or any error from oneDNN, takes :func:`torch.mm`."""
    if _onednn_applies(a):
        try:
            return _ONEDNN_LINEAR(a, w if packed is None else packed, None, "none", [], "")
        except RuntimeError:
            pass
    return torch.mm(a, w.t())


class _Linear(torch.autograd.Function):
    """``x @ w.T`` over any leading shape with both backward products through :func:`_mm_t`
    too: the input projection W_ih x of the fused LSTM, all time steps at once."""

    @staticmethod
    def forward(ctx, x, w):  # type: ignore[override]
        ctx.save_for_backward(x, w)
        return _mm_t(x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        if torch.is_grad_enabled():
            raise RuntimeError("lnbook.LSTM(fused=True) cannot be differentiated twice; "
                               "build the layer with fused=False")
        x, w = ctx.saved_tensors
        g = grad_y.reshape(-1, w.shape[0])  # (N, out)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = _mm_t(g, w.t().contiguous()).reshape(x.shape)  # (N, in)
        if ctx.needs_input_grad[1]:
            grad_w = _mm_t(x.reshape(-1, w.shape[1]).t(), g.t()).t()  # (out, in) = g^T x
        return grad_x, grad_w


class _LNLSTMBuffers(ctypes.Structure):
    """``lnlstm_t`` of ``csrc/ln_lstm.c``: the sizes and the buffers of one layer's time loop."""

    _fields_ = [(n, ctypes.c_int64) for n in ("B", "H")] + [
        (n, ctypes.c_float) for n in ("eps_hh", "eps_c")] + [
        (n, ctypes.c_void_p) for n in (
            "g_hh", "g_c", "b_c", "gi", "c0", "act", "c", "zc", "tc", "h", "rs_a", "rs_c",
            "d_out", "d_gi", "d_a", "dc", "dg_hh", "dg_c", "db_c", "work")]


@functools.cache
def _lstm_kernel() -> tuple[ctypes.CDLL | None, str]:
    """The C step kernel of the fused LN-LSTM (``lnbook/csrc/ln_lstm.c``) and its status."""
    native = _native.load("ln_lstm")
    lib = native.lib
    if lib is None:
        return None, native.status
    lib.lnlstm_struct_size.restype = ctypes.c_int64
    if lib.lnlstm_struct_size() != ctypes.sizeof(_LNLSTMBuffers):
        return None, f"{native.status}, but its buffer layout differs from lnbook.rnn's: not used"
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    for fn in (lib.lnlstm_forward_step, lib.lnlstm_backward_step):
        fn.restype = None
    lib.lnlstm_forward_step.argtypes = [ctypes.POINTER(_LNLSTMBuffers), i64, ptr]
    lib.lnlstm_backward_step.argtypes = [ctypes.POINTER(_LNLSTMBuffers), i64, ptr, ptr]
    for fn in (lib.lnbook_sigmoid_f32, lib.lnbook_tanh_f32):
        fn.restype, fn.argtypes = None, [i64, ptr, ptr]
    return lib, native.status


def native_status() -> str:
    """Whether :class:`LSTM`'s fused time loop can run its steps in lnbook's C kernel, and why.

    The kernel (``lnbook/csrc/ln_lstm.c``) does the elementwise work of one LN-LSTM step,
    forward or backward, in one pass, for float32 tensors on the CPU. It is compiled on first
    use with the machine's C compiler (see :mod:`lnbook._native`); where there is none, or with
    ``LNBOOK_NATIVE=0``, the same steps run as torch operations. Supplement chapter, "Speed".

    Example::

        >>> native_status()  # doctest: +SKIP
        'C kernel in use: built with /usr/bin/cc -O3 -march=native -fopenmp-simd: ...'
    """
    lib, status = _lstm_kernel()
    return f"C kernel in use: {status}" if lib is not None else f"C kernel not used: {status}"


class _LNLSTMRecurrence(torch.autograd.Function):
    """The time loop of one LN-LSTM layer (eqs. 20-22; Supplement chapter), with the
    backward pass through time written out, so that it runs as a few operations per step.

    Input ``gi`` (T, B, 4H) is LN(W_ih x_t) + bias_ih + bias_hh + the bias of LN(W_hh h),
    computed for all steps beforehand. Per step, forward:
        a = W_hh h_{t-1},  z = LN(a; g_hh) + gi_t,  [i, f, o] = sigmoid(z), g = tanh(z),
        c_t = f c_{t-1} + i g,  h_t = o tanh(LN(c_t; g_c, b_c)).
    Backward, per step from t = T-1 down to 0, with dh and dc carried from step t+1:
        do = dh tanh(LN(c_t)),  dc += LNback(dh o (1 - tanh^2)),
        di = dc g,  df = dc c_{t-1},  dg = dc i,  dc_{t-1} = dc f,
        dz = [di, df, dg, do] times the activations' derivatives (= d gi_t),
        da = LNback(dz),  dh_{t-1} = da W_hh (+ the output's gradient at t-1).
    dW_hh = sum_t da_t^T h_{t-1} is one matrix product after the loop.

    Everything but the products W_hh h and da W_hh runs either as torch operations (any dtype
    and device) or, for float32 on the CPU with ``native=True``, as one call per step into the
    C kernel of ``lnbook/csrc/ln_lstm.c`` (:func:`native_status`); both compute the lines above.
    """

    PACK_FROM_T = 8  # packing W_hh costs about as much as a few products: worth it from here

    @staticmethod
    def forward(ctx, gi, h0, c0, w_hh, g_hh, g_c, b_c, eps_hh, eps_c, native):  # type: ignore[override]
        T, B, G = gi.shape
        lib = _lstm_kernel()[0] if native else None
        # the kernel reads raw float32 memory: every tensor it touches must be float32 on the CPU
        ctx.native = lib is not None and all(
            t.dtype == torch.float32 and t.device.type == "cpu"
            for t in (gi, h0, c0, w_hh, g_hh, g_c, b_c))
        w_packed = _pack_t(w_hh, B) if T >= _LNLSTMRecurrence.PACK_FROM_T else None
        if ctx.native:
            hs, c = _LNLSTMRecurrence._forward_c(ctx, lib, gi, h0, c0, w_hh, w_packed, g_hh,
                                                 g_c, b_c, eps_hh, eps_c)
        else:
            hs, c = _LNLSTMRecurrence._forward_torch(ctx, gi, h0, c0, w_hh, w_packed, g_hh,
                                                     g_c, b_c, eps_hh, eps_c)
        ctx.save_for_backward(h0, c0, w_hh, g_hh, g_c, b_c, hs)
        return hs, hs[T - 1].clone(), c.clone()

    @staticmethod
    def _forward_torch(ctx, gi, h0, c0, w_hh, w_packed, g_hh, g_c, b_c, eps_hh, eps_c):
        T, B, G = gi.shape
        H = G // 4
        hs = gi.new_empty(T, B, H)  # h_1..h_T, the output
        steps = []  # per step: W_hh h_{t-1}, activations, c_t, tanh(LN(c_t)), LN statistics
        h, c = h0, c0
        gis, hs_t = gi.unbind(0), hs.unbind(0)  # T views each, made once
        for t in range(T):
            a = _mm_t(h, w_hh, w_packed)  # (B, 4H)
            z, mu_a, rs_a = torch.native_layer_norm(a, (G,), g_hh, None, eps_hh)  # (B, 4H)
            act = torch.sigmoid(z.add_(gis[t]))  # i, f, (g), o
            i, f, g, o = act.split(H, dim=1)  # views, (B, H) each
            torch.tanh(z[:, 2 * H : 3 * H], out=g)
            c = torch.addcmul(f * c, i, g)  # (B, H)
            cn, mu_c, rs_c = torch.native_layer_norm(c, (H,), g_c, b_c, eps_c)  # (B, H)
            tc = cn.tanh_()
            h = torch.mul(o, tc, out=hs_t[t])  # (B, H)
            steps.append((a, act, c, tc, mu_a, rs_a, mu_c, rs_c))
        ctx.steps = steps  # the per-step tensors never leave this Function: kept on ctx
        return hs, c

    @staticmethod
    def _forward_c(ctx, lib, gi, h0, c0, w_hh, w_packed, g_hh, g_c, b_c, eps_hh, eps_c):
        T, B, G = gi.shape
        H = G // 4
        gi, c0 = gi.contiguous(), c0.contiguous()
        new = gi.new_empty
        bufs = {"gi": gi, "c0": c0, "g_hh": g_hh.contiguous(),
                "g_c": g_c.contiguous(), "b_c": b_c.contiguous(), "act": new(T, B, G),
                "c": new(T, B, H), "zc": new(T, B, H), "tc": new(T, B, H), "h": new(T, B, H),
                "rs_a": new(T, B), "rs_c": new(T, B)}
        s = _LNLSTMBuffers(B=B, H=H, eps_hh=eps_hh, eps_c=eps_c,
                           **{k: v.data_ptr() for k, v in bufs.items()})
        hs, h, za = bufs["h"], h0, []  # za: W_hh h_{t-1} per step, normalized by the kernel
        step, ref = lib.lnlstm_forward_step, ctypes.byref(s)
        hs_t = hs.unbind(0)
        for t in range(T):
            a = _mm_t(h, w_hh, w_packed).contiguous()  # (B, 4H)
            step(ref, t, a.data_ptr())
            za.append(a)
            h = hs_t[t]
        ctx.bufs, ctx.za, ctx.s, ctx.lib = bufs, za, s, lib
        return hs, bufs["c"][T - 1]

    @staticmethod
    def backward(ctx, d_out, d_hn, d_cn):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph=True: this backward is not differentiable
            raise RuntimeError(
                "lnbook.LSTM(fused=True) has a first-order backward only, so it cannot be "
                "differentiated twice (create_graph=True); build the layer with fused=False")
        h0, c0, w_hh, g_hh, g_c, b_c, hs = ctx.saved_tensors
        T, B, H = hs.shape
        w_t = w_hh.t().contiguous()  # (H, 4H): da @ W_hh as a product with a transpose
        w_t_packed = _pack_t(w_t, B) if T >= _LNLSTMRecurrence.PACK_FROM_T else None
        if ctx.native:
            d_gi, d_a, dh, dc, grads = _LNLSTMRecurrence._backward_c(
                ctx, d_out, d_hn, d_cn, w_t, w_t_packed)
        else:
            d_gi, d_a, dh, dc, grads = _LNLSTMRecurrence._backward_torch(
                ctx, d_out, d_hn, d_cn, w_t, w_t_packed, c0, g_hh, g_c, b_c, hs)
        if not _graph_is_kept():  # what autograd does with saved tensors, for ours on ctx
            ctx.steps = ctx.bufs = ctx.za = ctx.s = ctx.lib = None
        # dW_hh = sum_t da_t^T h_{t-1}, as (sum_t h_{t-1}^T da_t)^T: one product for t >= 1
        d_w = _mm_t(h0.t(), d_a[0].t())  # (H, 4H)
        if T > 1:
            d_w += _mm_t(hs[: T - 1].reshape(-1, H).t(), d_a[1:].reshape(-1, 4 * H).t())
        dg_hh, dg_c, db_c = grads
        return d_gi, dh, dc, d_w.t(), dg_hh, dg_c, db_c, None, None, None

    @staticmethod
    def _backward_torch(ctx, d_out, d_hn, d_cn, w_t, w_t_packed, c0, g_hh, g_c, b_c, hs):
        steps = ctx.steps
        T, B, H = hs.shape
        G = 4 * H
        d_gi, d_a = hs.new_empty(T, B, G), []  # d gi, and da_t for dW_hh after the loop
        dg_hh, dg_c, db_c = [], [], []  # the LN gains' and bias's gradients, per step
        dh, dc = d_hn + d_out[T - 1], d_cn.clone()  # (B, H)
        dact = hs.new_empty(B, G)  # gradient w.r.t. the activations i, f, g, o
        d_i, d_f, d_g, d_o = dact.split(H, dim=1)
        d_outs, dzs = d_out.unbind(0), d_gi.unbind(0)  # T views each, made once
        dz_gs = d_gi[:, :, 2 * H : 3 * H].unbind(0)  # the g part of d gi
        for t in range(T - 1, -1, -1):
            a, act, c, tc, mu_a, rs_a, mu_c, rs_c = steps[t]
            c_prev = steps[t - 1][2] if t > 0 else c0
            i, f, g, o = act.split(H, dim=1)
            torch.mul(dh, tc, out=d_o)
            dcn = _aten.tanh_backward(dh * o, tc)  # (B, H)
            dc_ln, dg, db = _aten.native_layer_norm_backward(
                dcn, c, (H,), mu_c, rs_c, g_c, b_c, [True, True, True])
            dg_c.append(dg)
            db_c.append(db)
            dc.add_(dc_ln)
            torch.mul(dc, g, out=d_i)
            torch.mul(dc, c_prev, out=d_f)
            torch.mul(dc, i, out=d_g)
            dc.mul_(f)  # dc_{t-1} = dc f
            dz = dzs[t]
            _aten.sigmoid_backward.grad_input(dact, act, grad_input=dz)
            _aten.tanh_backward.grad_input(d_g, g, grad_input=dz_gs[t])
            da, dg, _ = _aten.native_layer_norm_backward(
                dz, a, (G,), mu_a, rs_a, g_hh, None, [True, True, False])
            dg_hh.append(dg)
            d_a.append(da)
            dh = _mm_t(da, w_t, w_t_packed)  # (B, H) dh_{t-1}
            if t > 0:
                dh.add_(d_outs[t - 1])
        grads = tuple(torch.stack(g).sum(0) for g in (dg_hh, dg_c, db_c))
        return d_gi, torch.stack(d_a[::-1]), dh, dc, grads

    @staticmethod
    def _backward_c(ctx, d_out, d_hn, d_cn, w_t, w_t_packed):
        bufs, s, za = ctx.bufs, ctx.s, ctx.za
        T, B, H = bufs["h"].shape
        G = 4 * H
        f64 = torch.float64
        new = bufs["h"].new_empty
        grads = {"dg_hh": torch.zeros(G, dtype=f64), "dg_c": torch.zeros(H, dtype=f64),
                 "db_c": torch.zeros(H, dtype=f64)}
        back = {"d_out": d_out.contiguous(), "d_gi": new(T, B, G), "d_a": new(T, B, G),
                "dc": d_cn.clone(memory_format=torch.contiguous_format), "work": new(6 * H),
                **grads}
        for k, v in back.items():
            setattr(s, k, v.data_ptr())
        step, ref, d_a = ctx.lib.lnlstm_backward_step, ctypes.byref(s), back["d_a"]
        d_as = d_a.unbind(0)
        dh = d_hn.contiguous()  # dL/dh_T; the kernel adds the output's gradient d_out[t]
        for t in range(T - 1, -1, -1):
            step(ref, t, dh.data_ptr(), za[t].data_ptr())
            dh = _mm_t(d_as[t], w_t, w_t_packed)  # (B, H) dh_{t-1}
        dtype = bufs["g_hh"].dtype
        out = tuple(grads[k].to(dtype) for k in ("dg_hh", "dg_c", "db_c"))
        return back["d_gi"], d_a, dh, back["dc"], out


_ACTS: dict[str, Callable[[Tensor], Tensor]] = {"tanh": torch.tanh, "relu": torch.relu}


# ----------------------------------------------------------------------------------------------
# cells


class LNRNNCell(nn.Module):
    r"""An Elman RNN cell with layer normalization of its summed inputs (paper eq. 4; ch. 3.1).

    .. math::
        a_t = W_{ih} x_t + W_{hh} h_{t-1}, \qquad
        h_t = f\big(\mathrm{LN}(a_t; g, b) + b_{ih} + b_{hh}\big)

    LN uses one mean and standard deviation over the H summed inputs of each example at each
    step, and one gain ``ln.weight`` and bias ``ln.bias`` shared by all steps. With
    ``layer_norm=False`` this is :class:`torch.nn.RNNCell` (same state dict, same outputs).

    Args:
        input_size: features of x_t.
        hidden_size: H, units of the recurrent layer.
        nonlinearity: ``"tanh"`` or ``"relu"``. Default: ``"tanh"``.
        layer_norm: normalize a_t with the submodule ``ln`` (:class:`lnbook.LayerNorm`).
        eps: LN epsilon. Default: 1e-5.

    Shape:
        - x: ``(B, input_size)`` or ``(input_size,)``; h: ``(B, H)`` or ``(H,)`` (zeros if None).
        - Output: h_t, ``(B, H)`` or ``(H,)``.

    Example::

        >>> cell = LNRNNCell(10, 20)
        >>> h = cell(torch.randn(3, 10))
        >>> h.shape
        torch.Size([3, 20])
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        nonlinearity: Literal["tanh", "relu"] = "tanh",
        layer_norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = H = _check_size("hidden_size", hidden_size)
        if nonlinearity not in _ACTS:
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity, self.layer_norm = nonlinearity, bool(layer_norm)
        self.weight_ih = nn.Parameter(torch.empty(H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(H, H))
        self.bias_ih = nn.Parameter(torch.empty(H))
        self.bias_hh = nn.Parameter(torch.empty(H))
        self.ln = _make_ln(H, layer_norm, eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights and biases as torch; LN gain 1 and bias 0."""
        _init_uniform(self, self.hidden_size)
        if self.ln is not None:
            self.ln.reset_parameters()

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        x, batched = _check_cell_input(x, self.input_size, type(self).__name__)
        h = _check_cell_state(h, x.shape[0], self.hidden_size, x, batched, "h")
        b = self.bias_ih + self.bias_hh  # (H,)
        gi = F.linear(x, self.weight_ih, None if self.layer_norm else b)  # (B, H)
        out = _rnn_step(gi, h, self.weight_hh, b, self.ln, _ACTS[self.nonlinearity])
        return out if batched else out.squeeze(0)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, nonlinearity={self.nonlinearity!r}, "
            f"layer_norm={self.layer_norm}"
        )


class LNLSTMCell(nn.Module):
    r"""An LSTM cell with layer normalization (paper eqs. 20-22; Supplement chapter).

    .. math::
        [i; f; g; o] = \mathrm{LN}(W_{hh} h_{t-1}) + \mathrm{LN}(W_{ih} x_t) + b_{ih} + b_{hh}

        c_t = \sigma(f) \odot c_{t-1} + \sigma(i) \odot \tanh(g), \qquad
        h_t = \sigma(o) \odot \tanh(\mathrm{LN}(c_t))

    ``ln_hh`` and ``ln_ih`` normalize over all 4H gate pre-activations together, ``ln_c`` over
    the H cell units. The gate order is torch's (i, f, g, o), not the paper's (f, i, o, g); the
    un-normalized c_t is carried to the next step. With ``layer_norm=False`` this is
    :class:`torch.nn.LSTMCell` (eqs. 17-19).

    Args:
        input_size: features of x_t.
        hidden_size: H.
        layer_norm: use the LN submodules ``ln_ih``, ``ln_hh``, ``ln_c``. Default: True.
        forget_bias: added to the forget-gate slice ``bias_ih[H:2H]`` after the uniform
            initialization (1.0 is a common choice that keeps memories early in training).
            Default: 0.0, torch's initialization exactly.
        eps: LN epsilon. Default: 1e-5.

    Shape:
        - x: ``(B, input_size)``; state: ``(h, c)``, each ``(B, H)`` (zeros if None).
        - Output: ``(h_t, c_t)``, each ``(B, H)``. Unbatched ``(input_size,)`` inputs work too.

    Example::

        >>> cell = LNLSTMCell(10, 20)
        >>> h, c = cell(torch.randn(3, 10))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        layer_norm: bool = True,
        forget_bias: float = 0.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = H = _check_size("hidden_size", hidden_size)
        self.layer_norm, self.forget_bias = bool(layer_norm), float(forget_bias)
        self.weight_ih = nn.Parameter(torch.empty(4 * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * H, H))
        self.bias_ih = nn.Parameter(torch.empty(4 * H))
        self.bias_hh = nn.Parameter(torch.empty(4 * H))
        self._make_norms(layer_norm, eps)
        self.reset_parameters()

    def _make_norms(self, layer_norm: bool, eps: float) -> None:
        H = self.hidden_size
        self.ln_ih = _make_ln(4 * H, layer_norm, eps)
        self.ln_hh = _make_ln(4 * H, layer_norm, eps)
        self.ln_c = _make_ln(H, layer_norm, eps)

    def reset_parameters(self) -> None:
        """Weights and biases as torch (plus ``forget_bias``); LN gains 1, biases 0."""
        _init_uniform(self, self.hidden_size)
        if self.forget_bias:
            with torch.no_grad():
                self.bias_ih[self.hidden_size : 2 * self.hidden_size] += self.forget_bias
        for m in (self.ln_ih, self.ln_hh, self.ln_c):
            if m is not None:
                m.reset_parameters()

    def forward(
        self, x: Tensor, state: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        x, batched = _check_cell_input(x, self.input_size, type(self).__name__)
        if state is None:
            h = c = None
        elif isinstance(state, (tuple, list)) and len(state) == 2:
            h, c = state
        else:
            raise ValueError("state must be a tuple (h, c) or None")
        B, H = x.shape[0], self.hidden_size
        h = _check_cell_state(h, B, H, x, batched, "h")
        c = _check_cell_state(c, B, H, x, batched, "c")
        b = self.bias_ih + self.bias_hh  # (4H,)
        gi = _ln(F.linear(x, self.weight_ih), self.ln_ih) + b  # (B, 4H)
        h, c = _lstm_step(gi, h, c, self.weight_hh, self.ln_hh, self.ln_c)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, layer_norm={self.layer_norm}"


class DRAWLSTMCell(LNLSTMCell):
    r"""The LSTM of the DRAW experiment: LN only on the cell state (paper eqs. 29-31).

    .. math::
        [i; f; g; o] = W_{hh} h_{t-1} + W_{ih} x_t + b_{ih} + b_{hh}, \quad
        c_t = \sigma(f) \odot c_{t-1} + \sigma(i) \odot \tanh(g), \quad
        h_t = \sigma(o) \odot \tanh(\mathrm{LN}(c_t))

    One submodule ``ln_c`` over the H cell units; with ``layer_norm=False`` this is
    :class:`torch.nn.LSTMCell`. Arguments, shapes and torch gate order as :class:`LNLSTMCell`.

    Example::

        >>> h, c = DRAWLSTMCell(10, 20)(torch.randn(3, 10))
    """

    def _make_norms(self, layer_norm: bool, eps: float) -> None:
        self.ln_ih = self.ln_hh = None
        self.ln_c = _make_ln(self.hidden_size, layer_norm, eps)


class LNGRUCell(nn.Module):
    r"""A GRU cell with layer normalization (paper eqs. 26-28 in torch's GRUCell form).

    With torch's gate order (r, z, n) and ``W[r,z]`` the first 2H rows:

    .. math::
        [r; z] = \sigma\big(\mathrm{LN}_{ih}(W_{ih}[r,z]\, x) + \mathrm{LN}_{hh}(W_{hh}[r,z]\, h)
                 + b_{ih}[r,z] + b_{hh}[r,z]\big)

        n = \tanh\big(\mathrm{LN}_{in}(W_{ih}[n]\, x) + b_{in}
            + r \odot (\mathrm{LN}_{hn}(W_{hh}[n]\, h) + b_{hn})\big), \qquad
        h_t = (1 - z) \odot n + z \odot h_{t-1}

    ``ln_ih``, ``ln_hh`` normalize over 2H, ``ln_in``, ``ln_hn`` over H.
    Mapping to the paper: its eq. 28 reads h_t = (1 - σ(z_p)) h_{t-1} + σ(z_p) ĥ_t, so torch's
    update gate is z = 1 - σ(z_p) = σ(-z_p): the paper's pre-activation z_p is minus torch's.
    As LN's gain and bias are learned, the sign is absorbed by them (LN(-v; α, β) =
    LN(v; -α, β)); the paper's W x and U h of eq. 27 are W_ih[n] and W_hh[n].
    With ``layer_norm=False`` this is :class:`torch.nn.GRUCell`.

    Args:
        input_size: features of x_t.
        hidden_size: H.
        layer_norm: use the LN submodules. Default: True.
        eps: LN epsilon. Default: 1e-5.

    Shape:
        - x: ``(B, input_size)``; h: ``(B, H)`` (zeros if None). Output: ``(B, H)``.

    Example::

        >>> h = LNGRUCell(10, 20)(torch.randn(3, 10))
    """

    def __init__(
        self, input_size: int, hidden_size: int, layer_norm: bool = True, eps: float = 1e-5
    ) -> None:
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = H = _check_size("hidden_size", hidden_size)
        self.layer_norm = bool(layer_norm)
        self.weight_ih = nn.Parameter(torch.empty(3 * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(3 * H, H))
        self.bias_ih = nn.Parameter(torch.empty(3 * H))
        self.bias_hh = nn.Parameter(torch.empty(3 * H))
        self.ln_ih = _make_ln(2 * H, layer_norm, eps)
        self.ln_hh = _make_ln(2 * H, layer_norm, eps)
        self.ln_in = _make_ln(H, layer_norm, eps)
        self.ln_hn = _make_ln(H, layer_norm, eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights and biases as torch; LN gains 1, biases 0."""
        _init_uniform(self, self.hidden_size)
        for m in (self.ln_ih, self.ln_hh, self.ln_in, self.ln_hn):
            if m is not None:
                m.reset_parameters()

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        x, batched = _check_cell_input(x, self.input_size, type(self).__name__)
        h = _check_cell_state(h, x.shape[0], self.hidden_size, x, batched, "h")
        gi = _gru_input(x, self.weight_ih, self.bias_ih, self.bias_hh, self.ln_ih, self.ln_in)
        b_hn = self.bias_hh[2 * self.hidden_size :]
        out = _gru_step(gi, h, self.weight_hh, b_hn, self.ln_hh, self.ln_hn)
        return out if batched else out.squeeze(0)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, layer_norm={self.layer_norm}"


# ----------------------------------------------------------------------------------------------
# sequence layers


def _lengths_mask(lengths: _Lengths, T: int, B: int, device: torch.device) -> Tensor | None:
    """(T, B, 1) bool mask of the real (non-padded) steps, or None when there is no padding."""
    if lengths is None:
        return None
    lens = torch.as_tensor(lengths)
    if lens.dim() != 1 or lens.shape[0] != B or lens.is_floating_point() or lens.is_complex():
        raise ValueError(
            f"lengths must be B={B} integers (a 1-D integer tensor or list), "
            f"got shape {tuple(lens.shape)} and dtype {lens.dtype}"
        )
    lo, hi = int(lens.min()), int(lens.max())
    if lo < 1 or hi > T:
        raise ValueError(f"lengths must lie in [1, T={T}] for input with T={T} steps, "
                         f"got min {lo} and max {hi}")
    if lo == T:
        return None
    steps = torch.arange(T, device=device).unsqueeze(1)  # (T, 1)
    return (steps < lens.to(device).unsqueeze(0)).unsqueeze(-1)  # (T, B, 1)


class _SeqBase(nn.Module):
    """Shared plumbing of :class:`RNN`, :class:`LSTM`, :class:`GRU`: parameters named as torch."""

    _gates = 1
    _lns: tuple[tuple[str, int], ...] = ()  # (name, size multiple of H) per layer

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        layer_norm: bool = True,
        batch_first: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.input_size = _check_size("input_size", input_size)
        self.hidden_size = H = _check_size("hidden_size", hidden_size)
        self.num_layers = _check_size("num_layers", num_layers)
        self.layer_norm, self.batch_first = bool(layer_norm), bool(batch_first)
        G = self._gates * H
        for k in range(num_layers):
            n_in = input_size if k == 0 else H
            setattr(self, f"weight_ih_l{k}", nn.Parameter(torch.empty(G, n_in)))
            setattr(self, f"weight_hh_l{k}", nn.Parameter(torch.empty(G, H)))
            setattr(self, f"bias_ih_l{k}", nn.Parameter(torch.empty(G)))
            setattr(self, f"bias_hh_l{k}", nn.Parameter(torch.empty(G)))
            for name, mult in self._lns:
                setattr(self, f"{name}_l{k}", _make_ln(mult * H, layer_norm, eps))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights and biases as torch; LN gains 1, biases 0."""
        _init_uniform(self, self.hidden_size)
        for m in self.children():
            if isinstance(m, LayerNorm):
                m.reset_parameters()

    def _layer(self, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return (
            getattr(self, f"weight_ih_l{k}"),
            getattr(self, f"weight_hh_l{k}"),
            getattr(self, f"bias_ih_l{k}"),
            getattr(self, f"bias_hh_l{k}"),
        )

    def _norm(self, name: str, k: int) -> LayerNorm | None:
        return getattr(self, f"{name}_l{k}", None)

    def _prepare(self, x: Tensor, lengths: _Lengths) -> tuple[Tensor, bool, Tensor | None]:
        """Return x as (T, B, I), whether it was batched, and the padding mask."""
        _check_float(x, "input")
        cls, I = type(self).__name__, self.input_size
        layout = "(B, T, {I})" if self.batch_first else "(T, B, {I})"
        if x.dim() not in (2, 3) or x.shape[-1] != I:
            raise ValueError(
                f"{cls} expects input of shape {layout.format(I=I)} or (T, {I}), "
                f"got {tuple(x.shape)}"
            )
        batched = x.dim() == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[0] == 0:
            raise ValueError(f"{cls} needs at least one time step, got input {tuple(x.shape)}")
        if lengths is not None and not batched:
            lengths = [lengths] if isinstance(lengths, int) else lengths
        mask = _lengths_mask(lengths, x.shape[0], x.shape[1], x.device)
        return x, batched, mask

    def _state(self, s: Tensor | None, x: Tensor, batched: bool, what: str) -> Tensor:
        L, B, H = self.num_layers, x.shape[1], self.hidden_size
        if s is None:
            return x.new_zeros(L, B, H)
        _check_float(s, what)
        want = (L, B, H) if batched else (L, H)
        if tuple(s.shape) != want:
            raise ValueError(
                f"{what} must have shape (num_layers, B, H) = {want}, got {tuple(s.shape)}"
            )
        return s if batched else s.unsqueeze(1)

    def _finish(self, out: Tensor, batched: bool) -> Tensor:
        if not batched:
            return out.squeeze(1)
        return out.transpose(0, 1) if self.batch_first else out

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
            f"layer_norm={self.layer_norm}, batch_first={self.batch_first}"
        )


def _masked(new: Tensor, old: Tensor, m: Tensor | None) -> Tensor:
    return new if m is None else torch.where(m, new, old)


class RNN(_SeqBase):
    r"""A stack of layer-normalized Elman RNN layers (paper eq. 4; chapter 3.1).

    Each layer runs :class:`LNRNNCell` over time. With ``layer_norm=False`` it is
    :class:`torch.nn.RNN` (same parameter names ``weight_ih_l{k}`` ..., same outputs).
    W_ih x is computed for all time steps in one call before the time loop; LN acts on the full
    sum a_t, so it runs inside the loop (LN submodules ``ln_l{k}``).

    Args:
        input_size: features of x_t.
        hidden_size: H.
        num_layers: stacked layers. Default: 1.
        layer_norm: normalize the summed inputs (eq. 4). Default: True.
        batch_first: input and output are ``(B, T, *)`` instead of ``(T, B, *)``.
        nonlinearity: ``"tanh"`` or ``"relu"``. Default: ``"tanh"``.
        eps: LN epsilon. Default: 1e-5.

    Shape:
        - x: ``(T, B, input_size)`` (or ``(B, T, input_size)``, or unbatched ``(T, input_size)``).
        - state: h_0, ``(num_layers, B, H)``; zeros if None.
        - lengths: B ints in [1, T]; steps at or after a sequence's length are padding: they
          change no state, their outputs are 0, and h_n is the state at each sequence's end.
        - Output: ``(output (T, B, H), h_n (num_layers, B, H))``.

    Example::

        >>> rnn = RNN(8, 16, num_layers=2)
        >>> out, h_n = rnn(torch.randn(5, 3, 8))
        >>> out.shape, h_n.shape
        (torch.Size([5, 3, 16]), torch.Size([2, 3, 16]))
    """

    _lns = (("ln", 1),)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        layer_norm: bool = True,
        batch_first: bool = False,
        nonlinearity: Literal["tanh", "relu"] = "tanh",
        eps: float = 1e-5,
    ) -> None:
        if nonlinearity not in _ACTS:
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, num_layers, layer_norm, batch_first, eps)

    def forward(
        self, x: Tensor, state: Tensor | None = None, lengths: _Lengths = None
    ) -> tuple[Tensor, Tensor]:
        x, batched, mask = self._prepare(x, lengths)
        h0 = self._state(state, x, batched, "state")
        act, T = _ACTS[self.nonlinearity], x.shape[0]
        inp, h_n = x, []
        for k in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer(k)
            ln, b = self._norm("ln", k), b_ih + b_hh
            gi = F.linear(inp, w_ih, None if ln is not None else b)  # (T, B, H)
            gis = gi.unbind(0)  # T views; unbind's backward stacks the grads once
            h, outs = h0[k], []
            for t in range(T):
                m = None if mask is None else mask[t]
                h_new = _rnn_step(gis[t], h, w_hh, b, ln, act)  # (B, H)
                h = _masked(h_new, h, m)
                outs.append(h if m is None else h_new * m)
            inp = torch.stack(outs)  # (T, B, H)
            h_n.append(h)
        return self._finish(inp, batched), self._finish_state(torch.stack(h_n), batched)

    def _finish_state(self, s: Tensor, batched: bool) -> Tensor:
        return s if batched else s.squeeze(1)


class LSTM(_SeqBase):
    r"""A stack of layer-normalized LSTM layers (paper eqs. 20-22; Supplement chapter).

    Each layer runs :class:`LNLSTMCell` over time; LN(W_ih x) + biases is computed for all time
    steps in one batched call before the loop. LN submodules ``ln_ih_l{k}``, ``ln_hh_l{k}``
    (over 4H) and ``ln_c_l{k}`` (over H). With ``layer_norm=False`` it is
    :class:`torch.nn.LSTM` (same parameter names, same outputs).

    With ``fused=True`` (the default) and layer normalization on, each layer's time loop runs
    as one autograd Function whose backward through time is written out (the same numbers as
    the step-by-step loop, to rounding; it is what makes the layer fast, see the Performance
    page). For float32 on the CPU its steps run in a small C kernel compiled on first use
    (``native=True``, where a C compiler is found; :func:`native_status` says whether it is),
    else as torch operations. The step-by-step loop of autograd ops runs instead with
    ``fused=False``, with ``lengths``, for dtypes other than float32/float64, and it is the
    only one that can be differentiated twice.

    Args:
        input_size, hidden_size, num_layers, batch_first, eps: as :class:`RNN`.
        layer_norm: eqs. 20-22 instead of 17-19. Default: True.
        forget_bias: added to every layer's ``bias_ih_l{k}[H:2H]`` after initialization.
            Default: 0.0.
        fused: run the fused time loop where it applies. Default: True.
        native: let the fused loop use lnbook's C step kernel (float32 on the CPU) when one
            could be built; False runs its steps as torch operations. Default: True.

    Shape:
        - x: as :class:`RNN`; state: ``(h_0, c_0)``, each ``(num_layers, B, H)``.
        - Output: ``(output (T, B, H), (h_n, c_n))``; ``lengths`` as in :class:`RNN`.

    Example::

        >>> lstm = LSTM(8, 16)
        >>> out, (h_n, c_n) = lstm(torch.randn(5, 3, 8))
    """

    _gates = 4
    _lns = (("ln_ih", 4), ("ln_hh", 4), ("ln_c", 1))

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        layer_norm: bool = True,
        batch_first: bool = False,
        forget_bias: float = 0.0,
        eps: float = 1e-5,
        fused: bool = True,
        native: bool = True,
    ) -> None:
        self.forget_bias, self.fused, self.native = float(forget_bias), bool(fused), bool(native)
        super().__init__(input_size, hidden_size, num_layers, layer_norm, batch_first, eps)

    def _use_fused(
        self, ln_hh: LayerNorm | None, ln_c: LayerNorm | None, mask: Tensor | None, x: Tensor
    ) -> bool:
        return (self.fused and mask is None and x.dtype in (torch.float32, torch.float64)
                and ln_hh is not None and ln_c is not None and ln_hh.bias is not None
                and ln_c.bias is not None)

    def reset_parameters(self) -> None:
        """Weights and biases as torch, plus ``forget_bias``; LN gains 1, biases 0."""
        super().reset_parameters()
        if self.forget_bias:
            H = self.hidden_size
            with torch.no_grad():
                for k in range(self.num_layers):
                    getattr(self, f"bias_ih_l{k}")[H : 2 * H] += self.forget_bias

    def forward(
        self,
        x: Tensor,
        state: tuple[Tensor, Tensor] | None = None,
        lengths: _Lengths = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        x, batched, mask = self._prepare(x, lengths)
        if state is None:
            h0 = c0 = None
        elif isinstance(state, (tuple, list)) and len(state) == 2:
            h0, c0 = state
        else:
            raise ValueError("state must be a tuple (h_0, c_0) or None")
        h0 = self._state(h0, x, batched, "h_0")
        c0 = self._state(c0, x, batched, "c_0")
        T = x.shape[0]
        inp, h_n, c_n = x, [], []
        for k in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer(k)
            ln_ih, ln_hh, ln_c = (self._norm(n, k) for n in ("ln_ih", "ln_hh", "ln_c"))
            if self._use_fused(ln_hh, ln_c, mask, inp):
                # every bias joins LN(W_ih x)'s own: one pass over (T, B, 4H) instead of two
                b = b_ih + b_hh + ln_hh.bias + (0 if ln_ih.bias is None else ln_ih.bias)
                gi = F.layer_norm(_Linear.apply(inp, w_ih), ln_ih.normalized_shape,
                                  ln_ih.weight, b, ln_ih.eps)  # (T, B, 4H)
                inp, h, c = _LNLSTMRecurrence.apply(
                    gi, h0[k], c0[k], w_hh, ln_hh.weight, ln_c.weight, ln_c.bias, ln_hh.eps,
                    ln_c.eps, self.native)  # (T, B, H), (B, H), (B, H)
                h_n.append(h)
                c_n.append(c)
                continue
            gi = _ln(F.linear(inp, w_ih), ln_ih) + (b_ih + b_hh)  # (T, B, 4H), one call
            gis = gi.unbind(0)  # T views; unbind's backward stacks the grads once
            h, c, outs = h0[k], c0[k], []
            for t in range(T):
                h_new, c_new = _lstm_step(gis[t], h, c, w_hh, ln_hh, ln_c)  # (B, H) each
                if mask is None:
                    h, c = h_new, c_new
                    outs.append(h)
                else:
                    m = mask[t]
                    h, c = torch.where(m, h_new, h), torch.where(m, c_new, c)
                    outs.append(h_new * m)
            inp = torch.stack(outs)  # (T, B, H)
            h_n.append(h)
            c_n.append(c)
        hn, cn = torch.stack(h_n), torch.stack(c_n)  # (L, B, H)
        if not batched:
            hn, cn = hn.squeeze(1), cn.squeeze(1)
        return self._finish(inp, batched), (hn, cn)


class GRU(_SeqBase):
    r"""A stack of layer-normalized GRU layers (paper eqs. 26-28; Supplement chapter).

    Each layer runs :class:`LNGRUCell` over time; the input half of eqs. 26-27 (with its two
    LNs) is computed for all time steps in one call before the loop. LN submodules
    ``ln_ih_l{k}``, ``ln_hh_l{k}`` (over 2H), ``ln_in_l{k}``, ``ln_hn_l{k}`` (over H). With
    ``layer_norm=False`` it is :class:`torch.nn.GRU`.

    Args:
        input_size, hidden_size, num_layers, layer_norm, batch_first, eps: as :class:`RNN`.

    Shape:
        As :class:`RNN`: ``(output (T, B, H), h_n (num_layers, B, H))``.

    Example::

        >>> out, h_n = GRU(8, 16)(torch.randn(5, 3, 8))
    """

    _gates = 3
    _lns = (("ln_ih", 2), ("ln_hh", 2), ("ln_in", 1), ("ln_hn", 1))

    def forward(
        self, x: Tensor, state: Tensor | None = None, lengths: _Lengths = None
    ) -> tuple[Tensor, Tensor]:
        x, batched, mask = self._prepare(x, lengths)
        h0 = self._state(state, x, batched, "state")
        T, H = x.shape[0], self.hidden_size
        inp, h_n = x, []
        for k in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer(k)
            lns = [self._norm(n, k) for n in ("ln_ih", "ln_hh", "ln_in", "ln_hn")]
            gi = _gru_input(inp, w_ih, b_ih, b_hh, lns[0], lns[2])  # (T, B, 3H), one call
            gis = gi.unbind(0)  # T views; unbind's backward stacks the grads once
            b_hn = b_hh[2 * H :]
            h, outs = h0[k], []
            for t in range(T):
                h_new = _gru_step(gis[t], h, w_hh, b_hn, lns[1], lns[3])  # (B, H)
                if mask is None:
                    h = h_new
                    outs.append(h)
                else:
                    h = torch.where(mask[t], h_new, h)
                    outs.append(h_new * mask[t])
            inp = torch.stack(outs)  # (T, B, H)
            h_n.append(h)
        hn = torch.stack(h_n)  # (L, B, H)
        return self._finish(inp, batched), (hn if batched else hn.squeeze(1))


# ----------------------------------------------------------------------------------------------
# batch normalization with per-time-step statistics (the comparison of section 3.1)


class SequenceBatchNorm(nn.Module):
    r"""Batch normalization with separate statistics for each time step (Cooijmans et al., 2016).

    Paper section 3.1, chapter 3.1. At step t in training mode, each of the F features is
    normalized with the mean and (biased) variance over the mini-batch of the (B, F) slice, and
    the running averages of step t are updated; in eval mode the running averages of step t
    are used. One gain ``weight`` (initialized to ``gain_init``; Cooijmans et al. recommend
    0.1) and one bias ``bias`` are shared by all steps. This is what the paper calls applying
    batch normalization to an RNN "in the obvious way": a test sequence longer than any
    training sequence reaches steps with no statistics of their own. In eval mode a step t
    beyond the longest step seen in training uses the statistics of that last step; in training
    mode, t must be < ``max_steps``.

    Args:
        num_features: F.
        max_steps: number of per-step statistics slots.
        eps: added to the variance. Default: 1e-5.
        momentum: weight of the newest batch in the running averages. Default: 0.1.
        gain_init: initial value of the gain. Default: 1.0.

    Shape:
        - x: ``(B, F)``; t: an int in ``[0, max_steps)`` in training, any int >= 0 in eval.
        - mask: optional ``(B,)`` or ``(B, 1)`` bool, the rows that are real (not padding);
          statistics use only them. Output: ``(B, F)``.

    Example::

        >>> bn = SequenceBatchNorm(16, max_steps=10)
        >>> y = bn(torch.randn(4, 16), t=3)
    """

    def __init__(
        self,
        num_features: int,
        max_steps: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        gain_init: float = 1.0,
    ) -> None:
        super().__init__()
        self.num_features = _check_size("num_features", num_features)
        self.max_steps = _check_size("max_steps", max_steps)
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum!r}")
        self.eps, self.momentum, self.gain_init = float(eps), float(momentum), float(gain_init)
        self.weight = nn.Parameter(torch.empty(num_features))
        self.bias = nn.Parameter(torch.empty(num_features))
        self.register_buffer("running_mean", torch.zeros(max_steps, num_features))
        self.register_buffer("running_var", torch.ones(max_steps, num_features))
        # number of leading steps that have statistics (the longest step seen in training + 1)
        self.register_buffer("steps_seen", torch.tensor(0, dtype=torch.long))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gain to ``gain_init``, bias to 0, running statistics to (0, 1), no steps seen."""
        nn.init.constant_(self.weight, self.gain_init)
        nn.init.zeros_(self.bias)
        self.running_mean.zero_()
        self.running_var.fill_(1.0)
        self.steps_seen.zero_()

    def forward(self, x: Tensor, t: int, mask: Tensor | None = None) -> Tensor:
        _check_float(x, "input")
        if x.dim() != 2 or x.shape[1] != self.num_features:
            raise ValueError(
                f"SequenceBatchNorm expects a (B, {self.num_features}) slice, got {tuple(x.shape)}"
            )
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"t must be an int >= 0, got {t!r}")
        if self.training:
            if t >= self.max_steps:
                raise ValueError(
                    f"step t={t} is beyond max_steps={self.max_steps} statistics slots; "
                    "create the layer with a larger max_steps"
                )
            if mask is None:
                xs = x
            else:
                xs = x[mask.reshape(-1).bool()]  # (n, F) the real rows
            n = xs.shape[0]
            if n < 2:
                raise ValueError(
                    f"SequenceBatchNorm in training mode needs at least 2 real rows at step {t}, "
                    f"got {n}"
                )
            mean = xs.mean(0)  # (F,)
            var = ((xs - mean) ** 2).mean(0)  # (F,) biased
            with torch.no_grad():
                m = self.momentum
                unbiased = var.detach() * (n / (n - 1))
                self.running_mean[t].mul_(1 - m).add_(m * mean.detach())
                self.running_var[t].mul_(1 - m).add_(m * unbiased)
                self.steps_seen.clamp_(min=t + 1)  # no host sync on a GPU
        else:
            seen = int(self.steps_seen)
            s = min(t, seen - 1) if seen > 0 else min(t, self.max_steps - 1)
            mean, var = self.running_mean[s], self.running_var[s]
        y = (x - mean) * torch.rsqrt(var + self.eps)  # (B, F)
        return y * self.weight + self.bias

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, max_steps={self.max_steps}, eps={self.eps}, "
            f"momentum={self.momentum}, gain_init={self.gain_init}"
        )


class BatchNormRNN(nn.Module):
    r"""An Elman RNN whose summed inputs are batch-normalized per time step (chapter 3.1).

    The comparison model of section 3.1: eq. 4 with :class:`SequenceBatchNorm` in place of LN,

    .. math:: h_t = f\big(\mathrm{BN}_t(W_{ih} x_t + W_{hh} h_{t-1}) + b_{ih} + b_{hh}\big).

    Args:
        input_size: features of x_t.
        hidden_size: H.
        max_steps: per-step statistics slots (the longest training sequence).
        nonlinearity: ``"tanh"`` or ``"relu"``. Default: ``"tanh"``.
        batch_first: ``(B, T, *)`` layout. Default: False.
        gain_init: initial BN gain. Default: 1.0.

    Shape:
        - x: ``(T, B, input_size)``; h_0: ``(1, B, H)``; lengths as in :class:`RNN`.
        - Output: ``(output (T, B, H), h_n (1, B, H))``.

    Example::

        >>> out, h_n = BatchNormRNN(8, 16, max_steps=5)(torch.randn(5, 3, 8))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        max_steps: int,
        nonlinearity: Literal["tanh", "relu"] = "tanh",
        batch_first: bool = False,
        gain_init: float = 1.0,
    ) -> None:
        super().__init__()
        self.rnn = RNN(input_size, hidden_size, 1, False, batch_first, nonlinearity)
        self.bn = SequenceBatchNorm(hidden_size, max_steps, gain_init=gain_init)

    def forward(
        self, x: Tensor, state: Tensor | None = None, lengths: _Lengths = None
    ) -> tuple[Tensor, Tensor]:
        r = self.rnn
        x, batched, mask = r._prepare(x, lengths)
        if not batched:
            raise ValueError("BatchNormRNN needs a batch: input of shape (T, B, I) with B >= 2")
        h = r._state(state, x, batched, "state")[0]  # (B, H)
        act = _ACTS[r.nonlinearity]
        w_ih, w_hh, b_ih, b_hh = r._layer(0)
        gi = F.linear(x, w_ih)  # (T, B, H)
        gis = gi.unbind(0)  # T views; unbind's backward stacks the grads once
        outs = []
        for t in range(x.shape[0]):
            m = None if mask is None else mask[t]
            a = torch.addmm(gis[t], h, w_hh.t())  # (B, H)
            h_new = act(self.bn(a, t, m) + b_ih + b_hh)  # (B, H)
            h = _masked(h_new, h, m)
            outs.append(h if m is None else h_new * m)
        return r._finish(torch.stack(outs), batched), h.unsqueeze(0)


# ----------------------------------------------------------------------------------------------
# measuring the hidden-to-hidden dynamics (chapter 3.1, claim C05)


class RecurrentDynamics(NamedTuple):
    """Per-step measurements of :func:`recurrent_dynamics`, each a float64 tensor ``(T,)``."""

    summed_input_rms: Tensor  # root mean square of a_t over units and batch
    hidden_rms: Tensor  # root mean square of h_t
    grad_norm: Tensor  # ||dL/dh_t|| averaged over the batch, L = sum of h_T


def recurrent_dynamics(cell: LNRNNCell, x: Tensor, h0: Tensor | None = None) -> RecurrentDynamics:
    """Run ``cell`` over ``x`` and record the size of a_t, h_t and dL/dh_t at every step.

    Chapter 3.1 (claim C05): a_t = W_ih x_t + W_hh h_{t-1} are the summed inputs of eq. 4 before
    any normalization, and the gradient is that of L = sum(h_T) with respect to each h_t, which
    shows how a signal from the last step reaches earlier steps.

    Args:
        cell: an :class:`LNRNNCell` (with or without layer norm).
        x: ``(T, B, input_size)``.
        h0: ``(B, H)`` or None for zeros.

    Returns:
        :class:`RecurrentDynamics` with three ``(T,)`` tensors.
    """
    if not isinstance(cell, LNRNNCell):
        raise TypeError(f"cell must be an LNRNNCell, got {type(cell).__name__}")
    _check_float(x, "x")
    if x.dim() != 3 or x.shape[-1] != cell.input_size:
        raise ValueError(f"x must have shape (T, B, {cell.input_size}), got {tuple(x.shape)}")
    T, B = x.shape[0], x.shape[1]
    h = x.new_zeros(B, cell.hidden_size) if h0 is None else h0
    act = _ACTS[cell.nonlinearity]
    b = cell.bias_ih + cell.bias_hh
    a_rms, h_rms, hs = [], [], []
    with torch.enable_grad():
        for t in range(T):
            a = F.linear(x[t], cell.weight_ih) + F.linear(h, cell.weight_hh)  # (B, H)
            h = act(_ln(a, cell.ln) + b) if cell.ln is not None else act(a + b)  # (B, H)
            h.retain_grad()
            hs.append(h)
            a_rms.append(a.detach().pow(2).mean().sqrt())
            h_rms.append(h.detach().pow(2).mean().sqrt())
        hs[-1].sum().backward()
    grad = torch.stack([hh.grad.norm(dim=1).mean() for hh in hs])  # type: ignore[union-attr]
    cell.zero_grad(set_to_none=True)
    f64 = torch.float64
    return RecurrentDynamics(
        torch.stack(a_rms).to(f64), torch.stack(h_rms).to(f64), grad.to(f64)
    )
