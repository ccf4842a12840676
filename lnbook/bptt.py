r"""Backpropagation through time for one layer-normalized LSTM layer, derived by hand.

Paper eqs. 20-22; Supplement chapter, section "Speed". :class:`lnbook.LSTM` with
``bptt="hand"`` runs each layer's loop through :func:`ln_lstm_recurrence` (an
``autograd.Function`` with ``generate_vmap_rule``, so ``torch.func`` goes through it).

Forward, per step t, with ``gi_t = LN(W_ih x_t) + b`` (every additive bias folded in) and
torch's gate order (i, f, g, o)::

    a_t = W_hh h_{t-1}                                   (B, 4H)
    z_t = LN(a_t; g_hh) + gi_t = a^_t * g_hh + gi_t      a^ = (a - mean(a)) / sigma(a)
    i, f, o = sigmoid(z_i, z_f, z_o),   g = tanh(z_g)    eq. 20
    c_t = f * c_{t-1} + i * g                            eq. 21
    h_t = o * tanh(LN(c_t; g_c, b_c))                    eq. 22

``tanh(v) = 2 sigmoid(2v) - 1``: one sigmoid over ``s * z_t`` (``s`` = 2 on the g block) gives
all gates, ``g = 2 gg - 1``, ``i' = i (1 - i)`` (f, o alike) and ``g' = 4 gg (1 - gg)``.

Backward, t = T-1 .. 0, carrying ``dh`` and ``dc``, with ``tc = tanh(LN(c_t))`` and chapter 3's
``LNback(dy; x^, g, sigma) = (u - mean(u) - x^ mean(u x^)) / sigma``, ``u = dy * g``::

    dLNc   = dh * o * (1 - tc^2)
    dc    += LNback(dLNc; c^_t, g_c)
    dz     = [dc*g*i', dc*c_{t-1}*f', dc*i*g', dh*tc*o']   (d gi_t = dz)
    da     = LNback(dz; a^_t, g_hh)
    dc     = dc * f
    dh     = da W_hh + dL/dh_{t-1}

then ``dW_hh = sum_t da_t^T h_{t-1}``, ``d g_hh = sum_t dz_t a^_t``, ``d g_c = sum_t dLNc_t c^_t``,
``d b_c = sum_t dLNc_t``. Second derivatives recompute the forward and let autograd
differentiate it; forward-mode AD needs ``bptt="autograd"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lnbook.functional import layer_norm_backward, normalize

__all__ = ["LNLSTMRecurrence", "ln_lstm_recurrence"]


def _normalize(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x^ (B, D) and 1 / sigma (B, 1) of eq. 3 over the last dimension, in ``x``'s dtype."""
    x_hat, rstd = normalize(x, eps)
    if x_hat.dtype != x.dtype:  # float32 statistics of a half-precision x
        x_hat, rstd = x_hat.to(x.dtype), rstd.to(x.dtype)
    return x_hat, rstd


def _forward(gi: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, g_hh: Tensor, g_c: Tensor,
             b_c: Tensor | None, eps_hh: float, eps_c: float, keep: bool) -> tuple[Tensor, ...]:
    """Eqs. 20-22: ``hs (T, B, H)``, ``c_T``; with ``keep`` then T a^_t, ra_t, sg_t, c^_t, rc_t,
    tc_t each and c_1 .. c_{T-1}."""
    T, G = gi.shape[0], gi.shape[-1]
    H = G // 4
    one = torch.ones(H, dtype=gi.dtype, device=gi.device)
    scale = torch.cat([one, one, 2 * one, one])  # (4H,) 2 on g: tanh(v) = 2 sigmoid(2 v) - 1
    gi_s, g_s = gi * scale, g_hh * scale  # (T, B, 4H), (4H,): s * z_t = LN(a; s g) + s gi
    g2, b2 = 2 * g_c, None if b_c is None else 2 * b_c  # tanh(y) = 2 sigmoid(2 y) - 1
    w_t = w_hh.t()  # (H, 4H)
    h, c = h0, c0
    hs: list[Tensor] = []
    kept: list[list[Tensor]] = [[] for _ in range(7)]
    for t in range(T):
        a = torch.mm(h, w_t)  # (B, 4H)
        if keep:
            a_hat, ra = _normalize(a, eps_hh)  # (B, 4H), (B, 1)
            zs = torch.addcmul(gi_s[t], a_hat, g_s)  # (B, 4H) = s z_t
        else:
            zs = F.layer_norm(a, (G,), g_s, None, eps_hh) + gi_s[t]
        sg = torch.sigmoid(zs)  # (B, 4H)
        i, f, gg, o = sg.chunk(4, 1)  # (B, H) each; the g gate is 2 gg - 1
        if keep and t > 0:
            kept[6].append(c)  # c_t for the steps before the last
        c = torch.addcmul(f * c, i, gg, value=2) - i  # (B, H), eq. 21: f c + i (2 gg - 1)
        if keep:
            c_hat, rc = _normalize(c, eps_c)  # (B, H), (B, 1)
            y2 = c_hat * g2 if b2 is None else torch.addcmul(b2, c_hat, g2)  # 2 LN(c_t)
            for buf, v in zip(kept, (a_hat, ra, sg, c_hat, rc), strict=False):
                buf.append(v)
        else:
            y2 = F.layer_norm(c, (H,), g2, b2, eps_c)
        tc = torch.sigmoid(y2) * 2 - 1  # (B, H) tanh(LN(c_t))
        if keep:
            kept[5].append(tc)
        h = o * tc  # (B, H), eq. 22
        hs.append(h)
    return (torch.stack(hs), c, *(v for buf in kept for v in buf))


class LNLSTMRecurrence(torch.autograd.Function):
    """The time loop of one LN-LSTM layer with the backward through time written out.

    ``apply(gi, h0, c0, w_hh, g_hh, g_c, b_c, eps_hh, eps_c)`` -> ``hs``, ``c_T`` and the kept
    tensors of ``_forward``; use :func:`ln_lstm_recurrence`.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(gi, h0, c0, w_hh, g_hh, g_c, b_c, eps_hh, eps_c):  # type: ignore[override]
        """The loop over time steps, keeping what the backward reads."""
        return _forward(gi, h0, c0, w_hh, g_hh, g_c, b_c, eps_hh, eps_c, keep=True)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        """Save the inputs and the kept per-step tensors."""
        gi, h0, c0, w_hh, g_hh, g_c, b_c, eps_hh, eps_c = inputs
        hs, c_T, *kept = output
        ctx.mark_non_differentiable(*kept)
        ctx.set_materialize_grads(False)  # no zero tensors for the kept outputs' gradients
        ctx.save_for_backward(gi, h0, c0, w_hh, g_hh, g_c, b_c, hs, c_T, *kept)
        ctx.eps = (eps_hh, eps_c)

    @staticmethod
    def backward(ctx, d_hs, d_cT, *_):  # type: ignore[override]
        """Backpropagation through time, t = T-1 .. 0 (the module's derivation)."""
        gi, h0, c0, w_hh, g_hh, g_c, b_c, hs, c_T, *kept = ctx.saved_tensors
        inputs = (gi, h0, c0, w_hh, g_hh, g_c, b_c)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
            # create_graph=True: the gradients must be differentiable in the inputs too
            grads = _backward_by_autograd(ctx, inputs, d_hs, d_cT)
            if grads is not None:
                return grads
        T, B, H = hs.shape
        if d_hs is None:
            d_hs = torch.zeros_like(hs)
        if d_cT is None:
            d_cT = torch.zeros_like(c_T)
        a_hat, ra, sg, c_hat, rc, tc = (kept[k * T : (k + 1) * T] for k in range(6))
        c_prev = [c0, *kept[6 * T :]]  # c_{t-1} for t = 0 .. T-1
        need = ctx.needs_input_grad
        dh, dc = d_hs[T - 1], d_cT  # (B, H): what reaches h_t and c_t
        dzs: list[Tensor] = []
        das: list[Tensor] = []
        acc_ghh = acc_gc = acc_bc = None
        for t in range(T - 1, -1, -1):
            i, f, gg, o = sg[t].chunk(4, 1)  # (B, H) each
            x = dh * o
            dln = torch.addcmul(x, x * tc[t], tc[t], value=-1)  # (B, H) dh o (1 - tc^2)
            dc = dc + layer_norm_backward(dln, c_hat[t], rc[t], g_c, params=False)[0]  # LNback
            sd = torch.addcmul(sg[t], sg[t], sg[t], value=-1)  # (B, 4H) sigma (1 - sigma)
            # dz = [dc g i', dc c_{t-1} f', dc i g', dh tc o'] with g' = 4 gg (1 - gg)
            k = torch.cat([2 * gg - 1, c_prev[t], 4 * i, tc[t]], 1) * sd  # (B, 4H)
            dz = torch.cat([dc, dc, dc, dh], 1) * k  # (B, 4H) = d gi_t
            da = layer_norm_backward(dz, a_hat[t], ra[t], g_hh, params=False)[0]  # (B, 4H)
            dc = dc * f  # what reaches c_{t-1}
            dh = torch.mm(da, w_hh) if t == 0 else torch.addmm(d_hs[t - 1], da, w_hh)
            dzs.append(dz)
            if need[3]:
                das.append(da)
            if need[4]:
                acc_ghh = dz * a_hat[t] if acc_ghh is None else torch.addcmul(acc_ghh, dz, a_hat[t])
            if need[5]:
                acc_gc = dln * c_hat[t] if acc_gc is None else torch.addcmul(acc_gc, dln, c_hat[t])
            if need[6] and b_c is not None:
                acc_bc = dln if acc_bc is None else acc_bc + dln
        d_gi = torch.stack(dzs[::-1])  # (T, B, 4H)
        d_w = None
        if need[3]:  # dW_hh = sum_t da_t^T h_{t-1}: one product over all steps
            h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]]).flatten(0, 1)  # (T B, H)
            d_w = torch.stack(das[::-1]).flatten(0, 1).t() @ h_prev  # (4H, H)
        d_ghh, d_gc, d_bc = (None if v is None else v.sum(0) for v in (acc_ghh, acc_gc, acc_bc))
        return d_gi, dh, dc, d_w, d_ghh, d_gc, d_bc, None, None

    @staticmethod
    def jvp(ctx, *tangents):  # type: ignore[override]
        """Not supported: raises ``NotImplementedError`` naming ``bptt="autograd"``."""
        raise NotImplementedError(
            "lnbook's hand-derived BPTT of the LN-LSTM has no forward-mode derivative "
            "(torch.func.jvp, jacfwd, forward AD); build the layer with "
            "lnbook.LSTM(..., bptt='autograd') for those")


def _backward_by_autograd(ctx, inputs, d_hs, d_cT) -> tuple[Tensor | None, ...] | None:
    """The gradients as a differentiable graph (None where autograd records none here)."""
    eps_hh, eps_c = ctx.eps
    need = [k for k, t in enumerate(inputs) if t is not None and ctx.needs_input_grad[k]]
    with torch.enable_grad():
        hs, c_T = _forward(*inputs, eps_hh, eps_c, keep=False)
        pairs = [(y, g) for y, g in ((hs, d_hs), (c_T, d_cT)) if g is not None]
        if not pairs or not any(y.requires_grad for y, _ in pairs):
            return None  # no graph to build at this level (torch.func's vjp under vmap)
        got = torch.autograd.grad([y for y, _ in pairs], [inputs[k] for k in need],
                                  [g for _, g in pairs], create_graph=True, allow_unused=True)
    grads = dict(zip(need, got, strict=True))
    return tuple(grads.get(k) for k in range(9))


def ln_lstm_recurrence(gi: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, g_hh: Tensor, g_c: Tensor,
                       b_c: Tensor | None, eps_hh: float = 1e-5,
                       eps_c: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    r"""One LN-LSTM layer over a sequence (eqs. 20-22), backward through time by hand.

    Args:
        gi: ``LN(W_ih x_t) + b`` ``(T, B, 4H)``, every additive bias (LN biases too) in ``b``.
        h0, c0: ``(B, H)``. w_hh: ``(4H, H)``. g_hh: gain of LN(W_hh h), ``(4H,)``.
        g_c, b_c: gain and bias (or None) of LN(c_t), ``(H,)``. eps_hh, eps_c: the LNs' eps.

    Returns: ``hs (T, B, H)``, ``h_T (B, H)``, ``c_T (B, H)``.
    """
    args = (gi, h0, c0, w_hh, g_hh, g_c, b_c)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args):
        hs, c_T = LNLSTMRecurrence.apply(*args, eps_hh, eps_c)[:2]
    else:
        hs, c_T = _forward(*args, eps_hh, eps_c, keep=False)
    return hs, hs[-1], c_T
