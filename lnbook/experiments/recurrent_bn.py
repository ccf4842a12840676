"""Recurrent batch normalization (Cooijmans et al., 2016), the method section 6.2 compares with.

Book chapter `06_2_attentive_reader`. The LSTM of eqs. 17-19 with batch normalization put where
the layer-normalized LSTM of eqs. 20-22 puts layer normalization:

    (i, f, g, o) = BN_t(W_h h_{t-1}; gamma_h) + BN_t(W_x x_t; gamma_x) + b
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h_t = sigmoid(o) * tanh(BN_t(c_t; gamma_c, beta_c))

``BN_t`` is batch normalization with its own statistics at every time step t
(:class:`lnbook.rnn.SequenceBatchNorm`): in training mode the mean and variance of each unit are
taken over the mini-batch at step t; running averages are kept per step for evaluation mode. A
step beyond the longest one seen in training uses the statistics of the last trained step (the
weakness of claim C04, which the chapter discusses). The gains start at 0.1, the value
Cooijmans et al. recommend to keep ``tanh`` out of saturation; ``gain_init`` changes it.

The gate order and the parameter names ``weight_ih, weight_hh, bias_ih, bias_hh`` are torch's
(``nn.LSTM``), so the plain weights can be copied from a :class:`torch.nn.LSTM`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lnbook.rnn import SequenceBatchNorm

__all__ = ["RecurrentBNLSTM"]


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
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
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
        self, x: Tensor, state: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError("x must be a floating-point tensor of shape (T, B, input_size)")
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise ValueError(
                f"RecurrentBNLSTM expects x of shape (T, B, {self.input_size}), "
                f"got {tuple(x.shape)}"
            )
        T, B, _ = x.shape
        H = self.hidden_size
        if state is None:
            h = x.new_zeros(B, H)  # (B, H)
            c = x.new_zeros(B, H)  # (B, H)
        else:
            h, c = state[0].reshape(B, H), state[1].reshape(B, H)
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
