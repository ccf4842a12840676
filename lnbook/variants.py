"""Normalization after 2016: RMSNorm, group normalization and Dynamic Tanh (Part II).

Each changes one choice of eq. 5: RMSNorm drops the mean (P01-P03), group norm takes statistics
over groups of channels (P06-P07), Dynamic Tanh computes none (P11-P12). Plain torch operations;
half-precision statistics in float32; torch's arguments and state dicts (``eps`` must be > 0).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from lnbook.checks import (
    ShapeError,
    as_normalized_shape,
    check_bool,
    check_eps,
    check_floating,
    check_param,
    check_param_dtype,
    check_size,
    check_trailing,
)
from lnbook.functional import normalize, rms_normalize, statistics_dtype
from lnbook.norms import _Affine, _ShapeLike

__all__ = ["rms_norm", "RMSNorm", "group_norm", "GroupNorm", "dyt", "DyT"]


# -------------------- RMSNorm


def rms_norm(input: Tensor, normalized_shape: _ShapeLike, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    r"""Root mean square layer normalization (Zhang and Sennrich, 2019; Part II, "RMSNorm").

    .. math:: y = \frac{x}{\sqrt{\mathrm{mean}(x^2) + \epsilon}} \odot g

    Args:
        input: ``(*, *normalized_shape)``; output: same shape and dtype.
        normalized_shape: the trailing dimensions. weight: ``g`` or None.
        eps: None (default, as torch): the machine epsilon of the computation dtype
            (float32 for half inputs); else must be > 0.
    """
    shape = as_normalized_shape(normalized_shape)
    check_floating(input)
    check_trailing(input, shape)
    check_param(weight, "weight", shape)
    check_eps(eps, allow_none=True)
    if eps is None:  # the machine epsilon of the statistics' dtype (float32 for half inputs)
        eps = torch.finfo(statistics_dtype(input.dtype)).eps
    # eq. 3 without the mean, over rows (R, prod(shape)): x / sqrt(mean(x^2) + eps)
    y, _ = rms_normalize(input.reshape(-1, math.prod(shape)), eps)  # (R, D)
    y = y.reshape(input.shape)  # (*, *shape)
    if weight is not None:
        y = y * weight
    return y.to(input.dtype)


class RMSNorm(_Affine):
    r"""RMSNorm as a module (see :func:`rms_norm`); :class:`torch.nn.RMSNorm`'s interface and
    state dict. The gain starts at 1 (plain RMS normalization); ``bias`` is always None.
    """

    def __init__(self, normalized_shape: _ShapeLike, eps: float | None = None,
                 elementwise_affine: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        check_eps(eps, allow_none=True)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = check_bool("elementwise_affine", elementwise_affine)
        self._add_affine(self.normalized_shape, elementwise_affine, False,
                         {"device": device, "dtype": dtype})
        self.reset_parameters()

    def forward(self, input: Tensor) -> Tensor:
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


# -------------------- Group normalization


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    r"""Group normalization (Wu and He, 2018): per-example statistics over groups of channels.

    .. math:: y = \frac{x - \mu_{n,g}}{\sqrt{\sigma^2_{n,g} + \epsilon}} \cdot \gamma_c + \beta_c

    One group is layer norm over ``(C, *)``, C groups instance norm (P06-P07).

    Args:
        input: ``(N, C, *)``; output: same shape and dtype.
        num_groups: ``G``, divides ``C``. weight, bias: ``(C,)`` or None. eps: > 0.
    """
    check_floating(input)
    if input.dim() < 2:
        raise ShapeError(f"group_norm expects input of shape (N, C, *) with at least 2 dimensions, "
                         f"got shape {tuple(input.shape)}")
    check_size("num_groups", num_groups)
    n, c = input.shape[0], input.shape[1]
    if c % num_groups != 0:
        raise ValueError(f"the number of channels C = input.shape[1] = {c} must be divisible by "
                         f"num_groups = {num_groups}; input shape {tuple(input.shape)}")
    check_param(weight, "weight", (c,))
    check_param(bias, "bias", (c,))
    check_param_dtype(input, weight=weight, bias=bias)
    check_eps(eps)
    group_size = (c // num_groups) * math.prod(input.shape[2:])  # values per group
    # one row per (example, group): eq. 3 over the group, as layer norm's (two passes, biased)
    x_hat, _ = normalize(input.reshape(n * num_groups, group_size), eps)  # (N G, C/G prod(*))
    y = x_hat.reshape(input.shape)  # (N, C, *) float32 for half inputs
    view = (1, c) + (1,) * (input.dim() - 2)  # broadcast (C,) over (N, C, *)
    if weight is not None:
        y = y * weight.reshape(view).to(y.dtype)
    if bias is not None:
        y = y + bias.reshape(view).to(y.dtype)
    return y.to(input.dtype)


class GroupNorm(_Affine):
    r"""Group normalization as a module (see :func:`group_norm`); :class:`torch.nn.GroupNorm`'s
    interface and state dict.
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
                 bias: bool = True) -> None:
        super().__init__()
        check_size("num_groups", num_groups)
        check_size("num_channels", num_channels)
        if num_channels % num_groups != 0:
            raise ValueError(
                f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
            )
        check_eps(eps)
        self.num_groups, self.num_channels = int(num_groups), int(num_channels)
        self.eps, self.affine = float(eps), check_bool("affine", affine)
        check_bool("bias", bias)
        self._add_affine((self.num_channels,), self.affine, bias,
                         {"device": device, "dtype": dtype})
        self.reset_parameters()

    def forward(self, input: Tensor) -> Tensor:
        self._check_input(input, self.num_channels, f"(N, {self.num_channels}, *)")
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


# -------------------- Dynamic Tanh


def dyt(input: Tensor, alpha: Tensor | float, weight: Tensor | None = None,
        bias: Tensor | None = None) -> Tensor:
    r"""Dynamic Tanh (Zhu et al., 2025): an element-wise stand-in for a norm layer (P11-P12).

    .. math:: y = \gamma \odot \tanh(\alpha x) + \beta

    ``alpha`` is a number or one-element tensor; ``weight`` and ``bias`` broadcast or are None.
    """
    check_floating(input)
    if isinstance(alpha, Tensor) and alpha.numel() != 1:
        raise ValueError(f"alpha must be a scalar (one element), got shape {tuple(alpha.shape)}")
    y = torch.tanh(alpha * input)  # (*, *normalized_shape)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


class DyT(_Affine):
    r"""Dynamic Tanh as a module (see :func:`dyt`): ``alpha`` (1,) starts at ``alpha_init``
    (default 0.5), ``weight`` at 1, ``bias`` at 0; the authors' parameter names.
    """

    def __init__(self, normalized_shape: _ShapeLike, alpha_init: float = 0.5,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        if isinstance(alpha_init, bool) or not (
            isinstance(alpha_init, numbers.Real) and math.isfinite(alpha_init)
        ):
            raise ValueError(f"alpha_init must be a finite number, got {alpha_init!r}")
        self.alpha_init = float(alpha_init)
        kw = {"device": device, "dtype": dtype}
        self.alpha = nn.Parameter(torch.empty(1, **kw))
        self._add_affine(self.normalized_shape, True, True, kw)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``alpha`` to ``alpha_init``, the gain to 1 and the bias to 0."""
        nn.init.constant_(self.alpha, self.alpha_init)
        super().reset_parameters()

    def forward(self, input: Tensor) -> Tensor:
        check_floating(input)
        check_trailing(input, self.normalized_shape)
        return dyt(input, self.alpha, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, alpha_init={self.alpha_init}"
