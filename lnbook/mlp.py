"""The small ReLU MLPs that several chapters train, shared by their experiments (which never
import each other): :class:`DeepMLP` (lab 3.2's deep MLP with no norm, batch norm or layer norm;
chapter 6.8), :class:`NormMLP` with :class:`DetachNorm` (Xu et al. 2019's ablation of the
statistics' gradients; chapters 6.8 and 13).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_choice, check_eps, check_size
from lnbook.functional import normalize_detached
from lnbook.norms import LayerNorm

__all__ = ["NORMS", "STATS_NORMS", "DeepMLP", "DetachNorm", "NormMLP"]

NORMS = ("none", "batch", "layer")
"""The norms of :class:`DeepMLP`."""
STATS_NORMS = ("layer", "simple", "detach", "none")
"""The norms of :class:`NormMLP`."""


class DeepMLP(nn.Module):
    """A deep ReLU MLP, ``[Linear -> norm -> ReLU] * depth -> Linear``, with a scaled He init.

    The norm (``"none"``, ``"batch"``, ``"layer"``) acts on each hidden layer's summed inputs and
    brings the bias. Shape: ``(N, sizes[0])`` to logits ``(N, sizes[-1])``, with
    ``return_summed=True`` also every hidden layer's summed inputs.

    Example::

        >>> model = DeepMLP((64, 32, 32, 10), norm="layer", init_scale=0.5)
        >>> logits, summed = model(torch.rand(4, 64), return_summed=True)
        >>> logits.shape, len(summed)
        (torch.Size([4, 10]), 2)
    """

    def __init__(self, sizes: tuple[int, ...], norm: str = "none",
                 init_scale: float = 1.0) -> None:
        super().__init__()
        check_choice("norm", norm, NORMS)
        if len(sizes) < 3:
            raise ValueError(f"sizes needs an input, at least one hidden and an output width, "
                             f"got {sizes}")
        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.norm, self.init_scale, self.in_features = norm, float(init_scale), sizes[0]
        hidden = list(zip(sizes[:-2], sizes[1:-1], strict=True))
        self.linears = nn.ModuleList(
            [nn.Linear(i, o, bias=norm == "none") for i, o in hidden]
            + [nn.Linear(sizes[-2], sizes[-1])])
        makers = {"none": lambda h: nn.Identity(), "batch": nn.BatchNorm1d,
                  "layer": lambda h: LayerNorm(h, impl="torch")}
        self.norms = nn.ModuleList([makers[norm](o) for _, o in hidden])
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He-normal weights times ``init_scale``, zero biases; norms to gain 1, bias 0."""
        for lin in self.linears:
            nn.init.normal_(lin.weight, std=self.init_scale * math.sqrt(2.0 / lin.in_features))
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for n in self.norms:
            if hasattr(n, "reset_parameters"):
                n.reset_parameters()

    def forward(self, x: Tensor, return_summed: bool = False) -> Tensor | tuple[Tensor, list]:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"DeepMLP expects (N, {self.in_features}) inputs, got "
                             f"{tuple(x.shape)}")
        summed = []
        for lin, norm in zip(self.linears[:-1], self.norms, strict=True):
            a = lin(x)  # (N, H) summed inputs of (N, D) inputs, before the norm
            summed.append(a)
            x = torch.relu(norm(a))  # (N, H)
        logits = self.linears[-1](x)  # (N, classes)
        return (logits, summed) if return_summed else logits

    def extra_repr(self) -> str:
        return f"norm={self.norm!r}, init_scale={self.init_scale}"


class DetachNorm(nn.Module):
    r"""Layer norm whose mean and variance are constants to the backward pass (Xu et al., 2019).

    Forward: eq. 3 without gain and bias; the gradient is the upstream gradient over ``sqrt(var +
    eps)``, without the projections along :math:`\mathbf{1}` and the output. ``(*, H)`` to the same.

    Example::

        >>> y = DetachNorm(16)(torch.randn(4, 16))  # the values of F.layer_norm(x, (16,))
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.normalized_shape = check_size("normalized_shape", normalized_shape)
        self.eps = check_eps(eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Nothing to reset: DetachNorm has no parameters (no gain, no bias)."""

    def forward(self, x: Tensor) -> Tensor:
        if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= 1
                and x.shape[-1] == self.normalized_shape):
            raise ValueError(f"DetachNorm({self.normalized_shape}) expects a floating-point "
                             f"tensor of shape (*, {self.normalized_shape}), got "
                             f"{getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
        h = self.normalized_shape
        x_hat, _ = normalize_detached(x.reshape(-1, h), self.eps)
        return x_hat.reshape(x.shape).to(x.dtype)  # (*, H)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, statistics detached"


class NormMLP(nn.Module):
    """``depth`` times ``Linear -> norm -> ReLU``, then ``Linear``, on flat 8x8 digits ``(N, 64)``;
    ``norm`` ``"layer"``, ``"simple"`` (no gain and bias), ``"detach"`` (:class:`DetachNorm`) or
    ``"none"``.
    """

    def __init__(self, norm: str = "layer", hidden: int = 32, depth: int = 3,
                 eps: float = 1e-5) -> None:
        super().__init__()
        check_choice("norm", norm, STATS_NORMS)
        if hidden < 1 or depth < 1:
            raise ValueError(f"hidden and depth must be >= 1, got {hidden} and {depth}")
        self.norm_kind = norm

        def make() -> nn.Module:
            if norm in ("layer", "simple"):  # LayerNorm-simple: without the gain and bias
                return LayerNorm(hidden, eps=eps, elementwise_affine=norm == "layer", impl="torch")
            return DetachNorm(hidden, eps=eps) if norm == "detach" else nn.Identity()

        sizes = [64] + [hidden] * depth
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        self.norms = nn.ModuleList(make() for _ in range(depth))
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: Tensor) -> Tensor:
        for layer, norm in zip(self.layers, self.norms, strict=True):
            x = F.relu(norm(layer(x)))  # (N, H)
        return self.head(x)  # (N, 10)
