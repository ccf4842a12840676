"""Batch normalization in recurrent networks, the method the paper compares layer norm with.

Paper sections 3.1 and 6.2; book chapters 3.1 (`03_1_ln_rnn`) and 6.2
(`06_2_attentive_reader`). Batch normalization of a recurrent network needs statistics for every
time step separately (Cooijmans et al., 2016): :class:`SequenceBatchNorm` keeps them, and two
models put it where the layer-normalized models of :mod:`lnbook.rnn` put layer normalization:

- :class:`BatchNormRNN`: eq. 4 with BN_t in place of LN (the comparison of section 3.1).
- :class:`RecurrentBNLSTM`: the LSTM of eqs. 17-19 with recurrent batch normalization (the
  baseline of section 6.2),

      (i, f, g, o) = BN_t(W_h h_{t-1}; gamma_h) + BN_t(W_x x_t; gamma_x) + b
      c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
      h_t = sigmoid(o) * tanh(BN_t(c_t; gamma_c, beta_c))

In training mode the mean and variance of each unit at step t are taken over the mini-batch at
step t, and running averages are kept per step for evaluation mode. A step beyond the longest one
seen in training uses the statistics of the last trained step (the weakness of claim C04, which
chapter 3.1 measures). The gains of :class:`RecurrentBNLSTM` start at 0.1, the value Cooijmans
et al. recommend to keep ``tanh`` out of saturation; ``gain_init`` changes it. Gate order and
parameter names are torch's (``nn.LSTM``), so plain weights copy from a :class:`torch.nn.LSTM`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from lnbook.checks import check_floating, check_size
from lnbook.rnn import RNN

__all__ = ["SequenceBatchNorm", "BatchNormRNN", "RecurrentBNLSTM"]


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
        self.num_features = check_size("num_features", num_features)
        self.max_steps = check_size("max_steps", max_steps)
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
        check_floating(x, "input")
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
            xs = x if mask is None else x[mask.reshape(-1).bool()]  # (n, F) the real rows
            n = xs.shape[0]
            if n < 2:
                raise ValueError(
                    f"SequenceBatchNorm in training mode needs at least 2 real rows at step {t}, "
                    f"got {n}"
                )
            if mask is None:  # torch's batch norm, on row t of the running averages (in place)
                self.steps_seen.clamp_(min=t + 1)
                return F.batch_norm(x, self.running_mean[t], self.running_var[t], self.weight,
                                    self.bias, True, self.momentum, self.eps)  # (B, F)
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
            return F.batch_norm(x, self.running_mean[s], self.running_var[s], self.weight,
                                self.bias, False, 0.0, self.eps)  # (B, F)
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

    The weights live in a one-layer :class:`lnbook.RNN` without layer norm (``self.rnn``,
    torch's parameter names); ``self.bn`` holds the per-step statistics.

    Args:
        input_size: features of x_t.
        hidden_size: H.
        max_steps: per-step statistics slots (the longest training sequence).
        nonlinearity: ``"tanh"`` or ``"relu"``. Default: ``"tanh"``.
        batch_first: ``(B, T, *)`` layout. Default: False.
        gain_init: initial BN gain. Default: 1.0.

    Shape:
        - input: ``(T, B, input_size)``; hx: ``(1, B, H)``; ``lengths`` as in
          :class:`lnbook.RNN` (padded steps are left out of the statistics).
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
        self.rnn = RNN(input_size, hidden_size, nonlinearity=nonlinearity,
                       batch_first=batch_first, layer_norm=False)
        self.bn = SequenceBatchNorm(hidden_size, max_steps, gain_init=gain_init)

    def forward(
        self,
        input: Tensor,
        hx: Tensor | None = None,
        *,
        lengths: Tensor | Sequence[int] | None = None,
    ) -> tuple[Tensor, Tensor]:
        r = self.rnn
        if isinstance(input, PackedSequence):
            raise TypeError("BatchNormRNN takes a padded tensor with lengths=, "
                            "not a PackedSequence")
        x, batched, lens, _, _ = r._prepare(input, lengths)
        if not batched:
            raise ValueError("BatchNormRNN needs a batch: input of shape (T, B, I) with B >= 2")
        T = x.shape[0]
        h = r._state(hx, x, batched, r.hidden_size, "hx", None)[0]  # (B, H)
        mask = None if lens is None else (
            torch.arange(T, device=x.device).unsqueeze(1) < lens.to(x.device)).unsqueeze(-1)
        act = torch.tanh if r.nonlinearity == "tanh" else torch.relu
        gis = F.linear(x, r.weight_ih_l0).unbind(0)  # T x (B, H)
        outs = []
        for t in range(T):
            m = None if mask is None else mask[t]  # (B, 1)
            a = torch.addmm(gis[t], h, r.weight_hh_l0.t())  # (B, H)
            h_new = act(self.bn(a, t, m) + r.bias_ih_l0 + r.bias_hh_l0)  # (B, H)
            h = h_new if m is None else torch.where(m, h_new, h)
            outs.append(h if m is None else h_new * m)
        out = torch.stack(outs)  # (T, B, H)
        return (out.transpose(0, 1) if r.batch_first else out), h.unsqueeze(0)


class RecurrentBNLSTM(nn.Module):
    """A one-layer LSTM with recurrent batch normalization (Cooijmans et al., 2016).

    Normalizes the hidden-to-hidden and the input-to-hidden summed inputs, and the cell state
    before the output ``tanh``, with batch statistics kept separately for every time step
    (chapter 6.2; compare eqs. 20-22 of the paper, where layer normalization takes their place).

    Args:
        input_size: features of the input ``x_t``.
        hidden_size: LSTM units H.
        max_steps: number of time steps with their own statistics (the longest training
            sequence); longer sequences reuse the statistics of the last step in eval mode.
        gain_init: initial value of every batch-norm gain. Default: 0.1 (Cooijmans et al.).
        eps: added to the variance. Default: 1e-5.
        momentum: weight of the newest batch in the running averages. Default: 0.1.

    Shape:
        - Input: ``(T, B, input_size)`` (time first, as :class:`lnbook.LSTM` by default).
        - Output: ``(T, B, H)`` and the final state ``(h_n, c_n)``, each ``(1, B, H)``.

    Example::

        >>> lstm = RecurrentBNLSTM(8, 16, max_steps=20)
        >>> out, (h, c) = lstm(torch.randn(20, 4, 8))
        >>> out.shape, h.shape
        (torch.Size([20, 4, 16]), torch.Size([1, 4, 16]))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        max_steps: int,
        gain_init: float = 0.1,
        eps: float = 1e-5,
        momentum: float = 0.1,
    ) -> None:
        super().__init__()
        for name, v in (("input_size", input_size), ("hidden_size", hidden_size),
                        ("max_steps", max_steps)):
            check_size(name, v)
        self.input_size, self.hidden_size, self.max_steps = input_size, hidden_size, max_steps
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

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        x = input
        check_floating(x, "input")
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise ValueError(
                f"RecurrentBNLSTM expects x of shape (T, B, {self.input_size}), "
                f"got {tuple(x.shape)}"
            )
        T, B, _ = x.shape
        H = self.hidden_size
        if hx is None:
            h = x.new_zeros(B, H)  # (B, H)
            c = x.new_zeros(B, H)  # (B, H)
        else:
            h, c = hx[0].reshape(B, H), hx[1].reshape(B, H)
        wx = x @ self.weight_ih.t()  # (T, B, 4H), all steps at once
        bias = self.bias_ih + self.bias_hh  # (4H,)
        outs = []
        for t in range(T):
            z = self.bn_hh(h @ self.weight_hh.t(), t) + self.bn_ih(wx[t], t) + bias  # (B, 4H)
            i, f, g, o = z.chunk(4, dim=1)  # torch gate order, each (B, H)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)  # (B, H)
            h = torch.sigmoid(o) * torch.tanh(self.bn_c(c, t))  # (B, H)
            outs.append(h)
        return torch.stack(outs), (h.unsqueeze(0), c.unsqueeze(0))

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, max_steps={self.max_steps}, "
            f"gain_init={self.gain_init}"
        )
