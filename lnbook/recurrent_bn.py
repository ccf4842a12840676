"""Batch normalization in recurrent networks, the method the paper compares layer norm with.

Paper sections 3.1 and 6.2; chapters 3.1 (`03_1_ln_rnn`) and 6.2 (`06_2_attentive_reader`).
Per-time-step statistics (Cooijmans et al., 2016) in :class:`SequenceBatchNorm`, used by
:class:`BatchNormRNN` (eq. 4 with BN_t in place of LN) and :class:`RecurrentBNLSTM`::

    (i, f, g, o) = BN_t(W_h h_{t-1}; gamma_h) + BN_t(W_x x_t; gamma_x) + b
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h_t = sigmoid(o) * tanh(BN_t(c_t; gamma_c, beta_c))

A step beyond the longest one seen in training uses the last trained step's statistics (claim
C04). Gate order and parameter names are torch's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from lnbook.checks import check_eps, check_floating, check_size
from lnbook.norms import _update_running
from lnbook.rnn import _ACTS, RNN, _masked_loop, _step_mask

__all__ = ["SequenceBatchNorm", "BatchNormRNN", "RecurrentBNLSTM"]


class SequenceBatchNorm(nn.Module):
    r"""Batch normalization with separate statistics per time step (Cooijmans et al., 2016).

    In training, each feature of the (B, F) slice at step t is normalized over the batch and the
    running averages of step t updated; in eval mode those are used (a step beyond the longest seen
    uses the last one's). One gain (``gain_init``) and bias shared by all steps.

    Args:
        num_features: F. max_steps: statistics slots. eps: Default 1e-5.
        momentum: Default 0.1. gain_init: initial gain. Default: 1.0.

    Shape: x ``(B, F)``; t an int (< ``max_steps`` in training); mask optional ``(B,)`` or
    ``(B, 1)`` bool of the real rows (statistics use only them). Output ``(B, F)``.
    """

    def __init__(self, num_features: int, max_steps: int, eps: float = 1e-5, momentum: float = 0.1,
                 gain_init: float = 1.0) -> None:
        super().__init__()
        self.num_features = check_size("num_features", num_features)
        self.max_steps = check_size("max_steps", max_steps)
        self.eps = check_eps(eps)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum!r}")
        self.momentum, self.gain_init = float(momentum), float(gain_init)
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
        check_floating(x, "input")
        if x.dim() != 2 or x.shape[1] != self.num_features:
            raise ValueError(
                f"SequenceBatchNorm expects a (B, {self.num_features}) slice, got {tuple(x.shape)}"
            )
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"t must be an int >= 0, got {t!r}")
        if not self.training:  # step t's statistics, or the last step seen's beyond it
            last = torch.where(self.steps_seen > 0, self.steps_seen, self.max_steps) - 1
            s = last.clamp(max=t)  # a tensor index: no host sync, and vmap (a Stack) runs it
            return F.batch_norm(x, self.running_mean[s], self.running_var[s], self.weight,
                                self.bias, False, 0.0, self.eps)  # (B, F)
        if t >= self.max_steps:
            raise ValueError(
                f"step t={t} is beyond max_steps={self.max_steps} statistics slots; "
                "create the layer with a larger max_steps"
            )
        xs = x if mask is None else x[mask.reshape(-1).bool()]  # (n, F) the real rows
        n = xs.shape[0]
        if n < 2:
            raise ValueError(
                f"SequenceBatchNorm in training mode needs at least 2 real rows at step {t}, "
                f"got {n}"
            )
        # no host sync on a GPU; copy_ of an out-of-place clamp, which vmap batches (a Stack
        # of copies), where clamp_ would fall back to a slow loop
        self.steps_seen.copy_(self.steps_seen.clamp(min=t + 1))
        if mask is None:  # torch's batch norm, updating copies of row t of the running
            # averages, copied back: under vmap (a Stack) its update of a row in place is lost
            mean, var = self.running_mean[t].clone(), self.running_var[t].clone()  # (F,)
            y = F.batch_norm(x, mean, var, self.weight, self.bias, True, self.momentum,
                             self.eps)  # (B, F)
            self.running_mean[t].copy_(mean)
            self.running_var[t].copy_(var)
            return y
        mean = xs.mean(0)  # (F,)
        var = ((xs - mean) ** 2).mean(0)  # (F,) biased
        _update_running(self.running_mean[t], self.running_var[t], mean,
                        var.detach() * (n / (n - 1)), self.momentum)
        y = (x - mean) * torch.rsqrt(var + self.eps)  # (B, F)
        return y * self.weight + self.bias

    def extra_repr(self) -> str:
        return (f"{self.num_features}, max_steps={self.max_steps}, eps={self.eps}, "
                f"momentum={self.momentum}, gain_init={self.gain_init}")


class BatchNormRNN(nn.Module):
    r"""An Elman RNN batch-normalized per time step (section 3.1's comparison model).

    .. math:: h_t = f\big(\mathrm{BN}_t(W_{ih} x_t + W_{hh} h_{t-1}) + b_{ih} + b_{hh}\big)

    Weights in ``self.rnn`` (a one-layer :class:`lnbook.RNN` without LN), statistics in ``self.bn``.

    Args:
        input_size, hidden_size, nonlinearity, batch_first: as :class:`lnbook.RNN`.
        max_steps: statistics slots. gain_init: initial BN gain. Default: 1.0.

    Shape: input ``(T, B, I)``, hx ``(1, B, H)``, ``lengths`` as :class:`lnbook.RNN`; output
    ``(output (T, B, H), h_n (1, B, H))``.
    """

    def __init__(self, input_size: int, hidden_size: int, max_steps: int,
                 nonlinearity: Literal["tanh", "relu"] = "tanh", batch_first: bool = False,
                 gain_init: float = 1.0) -> None:
        super().__init__()
        self.rnn = RNN(input_size, hidden_size, nonlinearity=nonlinearity,
                       batch_first=batch_first, layer_norm=False)
        self.bn = SequenceBatchNorm(hidden_size, max_steps, gain_init=gain_init)

    def forward(self, input: Tensor, hx: Tensor | None = None, *,
                lengths: Tensor | Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        r = self.rnn
        if isinstance(input, PackedSequence):
            raise TypeError("BatchNormRNN takes a padded tensor with lengths=, "
                            "not a PackedSequence")
        x, batched, lens, _, _ = r._prepare(input, lengths)
        if not batched:
            raise ValueError("BatchNormRNN needs a batch: input of shape (T, B, I) with B >= 2")
        h0 = r._state(hx, x, batched, r.hidden_size, "hx", None, (1,))[0]  # (B, H)
        mask, act = _step_mask(lens, x), _ACTS[r.nonlinearity]
        gis = F.linear(x, r.weight_ih_l0).unbind(0)  # T x (B, H)

        def step(t: int, s: list[Tensor]) -> list[Tensor]:
            a = torch.addmm(gis[t], s[0], r.weight_hh_l0.t())  # (B, H)
            bn = self.bn(a, t, None if mask is None else mask[t])  # (B, H)
            return [act(bn + r.bias_ih_l0 + r.bias_hh_l0)]

        out, (h,) = _masked_loop(step, x.shape[0], [h0], mask)  # (T, B, H), (B, H)
        return (out.transpose(0, 1) if r.batch_first else out), h.unsqueeze(0)


class RecurrentBNLSTM(nn.Module):
    """A one-layer LSTM with recurrent batch normalization (Cooijmans et al., 2016).

    BN_t on W_h h, W_x x and c_t (chapter 6.2; layer norm's place in eqs. 20-22).

    Args:
        input_size, hidden_size: as torch. max_steps: statistics slots.
        gain_init: every BN gain's initial value. Default: 0.1. eps, momentum: as BN.

    Shape: input ``(T, B, I)``; output ``(T, B, H)`` and ``(h_n, c_n)``, each ``(1, B, H)``.
    """

    def __init__(self, input_size: int, hidden_size: int, max_steps: int, gain_init: float = 0.1,
                 eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.input_size = check_size("input_size", input_size)
        self.hidden_size = check_size("hidden_size", hidden_size)
        self.max_steps = check_size("max_steps", max_steps)
        self.gain_init = float(gain_init)
        h4 = 4 * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(h4, input_size))
        self.weight_hh = nn.Parameter(torch.empty(h4, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(h4))
        self.bias_hh = nn.Parameter(torch.empty(h4))
        kw = {"eps": eps, "momentum": momentum, "gain_init": gain_init}
        self.bn_ih = SequenceBatchNorm(h4, max_steps, **kw)
        self.bn_hh = SequenceBatchNorm(h4, max_steps, **kw)
        self.bn_c = SequenceBatchNorm(hidden_size, max_steps, **kw)
        # As Cooijmans et al.: no shift inside the gate pre-activations (b does that job), so
        # the biases of bn_ih and bn_hh stay at 0 and are not trained; bn_c keeps its beta_c.
        self.bn_ih.bias.requires_grad_(False)
        self.bn_hh.bias.requires_grad_(False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights and biases as :class:`torch.nn.LSTM`: uniform in +-1/sqrt(H)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):
            nn.init.uniform_(p, -bound, bound)

    def forward(self, input: Tensor,
                hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        x = input
        check_floating(x, "input")
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise ValueError(f"RecurrentBNLSTM expects x of shape (T, B, {self.input_size}), "
                             f"got {tuple(x.shape)}")
        T, B, _ = x.shape
        H = self.hidden_size
        h, c = (x.new_zeros(B, H), x.new_zeros(B, H)) if hx is None else hx  # (B, H) each
        h, c = h.reshape(B, H), c.reshape(B, H)
        wx = x @ self.weight_ih.t()  # (T, B, 4H), all steps at once
        bias = self.bias_ih + self.bias_hh  # (4H,)
        outs = []
        for t, wx_t in enumerate(wx.unbind(0)):  # unbind: one backward for all steps
            z = self.bn_hh(h @ self.weight_hh.t(), t) + self.bn_ih(wx_t, t) + bias  # (B, 4H)
            i, f, g, o = z.chunk(4, dim=1)  # torch gate order, each (B, H)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)  # (B, H)
            h = torch.sigmoid(o) * torch.tanh(self.bn_c(c, t))  # (B, H)
            outs.append(h)
        return torch.stack(outs), (h.unsqueeze(0), c.unsqueeze(0))

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, max_steps={self.max_steps}, "
                f"gain_init={self.gain_init}")
