"""Normalization after 2016: RMSNorm, group normalization and Dynamic Tanh (Part II of the book).

Each layer here changes one choice in eq. 5 of the paper,

    h_i = f( g_i / sigma_i * (a_i - mu_i) + b_i ),

that layer normalization (eq. 3) made:

- RMSNorm (Zhang and Sennrich, 2019) keeps the per-example statistics but drops the mean:
  mu = 0 and sigma = sqrt(mean(a^2) + eps), and no bias. Part II, chapter "RMSNorm" (P01-P03).
- Group normalization (Wu and He, 2018) takes mu and sigma per example over a group of channels
  and all their positions; one group is layer norm over (C, H, W), one channel per group is
  instance norm. Part II, chapter "One family: batch, layer, instance and group norm" (P06-P07).
- Dynamic Tanh (Zhu et al., 2025) computes no statistics at all: ``weight * tanh(alpha * x) +
  bias`` with a learned scalar ``alpha``. Part II, chapter "Transformers without normalization"
  (P11-P12).

Everything is written in plain public torch operations (what the chapters show is what runs), so
it works under :func:`torch.func.grad`, :func:`torch.func.vmap` and :func:`torch.compile`.
Statistics of float16/bfloat16 inputs are computed in float32 and the result is cast back.
``rms_norm``/``RMSNorm`` and ``group_norm``/``GroupNorm`` take the same arguments as their torch
namesakes and their state dicts load both ways; unlike torch, a negative or zero ``eps`` is
refused with an error.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lnbook.checks import (
    ShapeError,
    as_normalized_shape,
    check_bool,
    check_eps,
    check_floating,
    check_param,
    check_size,
    check_trailing,
)
from lnbook.functional import normalize

__all__ = ["rms_norm", "RMSNorm", "group_norm", "GroupNorm", "dyt", "DyT"]

_ShapeLike = int | Sequence[int] | torch.Size
_LOW_PRECISION = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------


def rms_norm(
    input: Tensor,
    normalized_shape: _ShapeLike,
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    r"""Root mean square layer normalization (Zhang and Sennrich, 2019; Part II, "RMSNorm").

    Each example is divided by the root mean square of its own values over the trailing
    ``normalized_shape`` dimensions; unlike layer norm (eq. 3 of the paper) the mean is not
    subtracted and there is no bias:

    .. math:: y = \frac{x}{\sqrt{\frac{1}{n}\sum_{i=1}^{n} x_i^2 + \epsilon}} \odot g

    Interchangeable with :func:`torch.nn.functional.rms_norm`: same arguments, same values and
    gradients. The result is invariant to re-scaling ``x`` by a positive constant (a negative
    one flips its sign) but not to re-centering it (claim P01).

    Args:
        input: floating-point input ``(*, *normalized_shape)``.
        normalized_shape: the trailing dimensions to normalize over (an int or a sequence).
        weight: gain ``g`` of shape ``normalized_shape``, or None for 1.
        eps: added to the mean square inside the square root; ``None`` (default, as torch)
            uses the machine epsilon of the computation dtype, ``torch.finfo(torch.float32).eps``
            for float16, bfloat16 and float32 inputs and ``torch.finfo(torch.float64).eps`` for
            float64. Must be > 0 when given (torch also accepts eps <= 0; lnbook refuses it).

    The mean square is computed in float32 for float16/bfloat16 inputs (no overflow of
    ``x ** 2``), and the result is cast back to the input's dtype. An all-zero row gives zeros.

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape and dtype.

    Example::

        >>> x = torch.randn(4, 10)
        >>> y = rms_norm(x, 10)
        >>> torch.allclose(y.square().mean(-1), torch.ones(4), atol=1e-5)
        True
    """
    shape = as_normalized_shape(normalized_shape)
    check_floating(input)
    check_trailing(input, shape)
    check_param(weight, "weight", shape)
    check_eps(eps, allow_none=True)
    if eps is None:  # the machine epsilon of the statistics' dtype (float32 for half inputs)
        eps = torch.finfo(torch.float32 if input.dtype in _LOW_PRECISION else input.dtype).eps
    # eq. 3 without the mean, over rows (R, prod(shape)): x / sqrt(mean(x^2) + eps)
    y, _ = normalize(input.reshape(-1, math.prod(shape)), eps, center=False)  # (R, D)
    y = y.reshape(input.shape)  # (*, *shape)
    if weight is not None:
        y = y * weight
    return y.to(input.dtype)


class RMSNorm(nn.Module):
    r"""Root mean square layer normalization as a module (Zhang and Sennrich, 2019).

    Divides each example by the root mean square over its trailing ``normalized_shape``
    dimensions and multiplies by a learned gain ``weight`` (initialized to 1); see
    :func:`rms_norm`. Explained in Part II, chapter "RMSNorm" (claims P01-P03).
    Interchangeable with :class:`torch.nn.RMSNorm`: same constructor arguments, the same
    ``eps=None`` default, the same state dict (``weight`` only), which loads in both
    directions.

    Args:
        normalized_shape: the trailing dimensions to normalize over.
        eps: added to the mean square inside the square root; None (default) uses the
            machine epsilon of the computation dtype (see :func:`rms_norm`).
        elementwise_affine: learn a per-element gain ``weight``. Default: True.
        device: where the parameter lives. Default: torch's default device.
        dtype: the parameter's dtype. Default: torch's default dtype.

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape.

    Example::

        >>> norm = RMSNorm(64)
        >>> y = norm(torch.randn(8, 16, 64))
    """

    def __init__(
        self,
        normalized_shape: _ShapeLike,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        check_eps(eps, allow_none=True)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = check_bool("elementwise_affine", elementwise_affine)
        if self.elementwise_affine:
            self.weight = nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The gain to 1 (the layer starts as plain RMS normalization)."""
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}"
        )


# ---------------------------------------------------------------------------------------------
# Group normalization
# ---------------------------------------------------------------------------------------------


def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    r"""Group normalization (Wu and He, 2018): per-example statistics over groups of channels.

    The ``C`` channels of each example are split into ``num_groups`` groups of ``C / G``
    consecutive channels; each group is normalized with the mean and biased variance of all its
    values (its channels at every position), then a per-channel gain and bias are applied:

    .. math:: y = \frac{x - \mu_{n,g}}{\sqrt{\sigma^2_{n,g} + \epsilon}} \cdot \gamma_c + \beta_c

    With one group this is layer normalization over ``(C, *)`` (eq. 3 of the paper, followed
    by a per-channel affine map); with ``C`` groups it is instance normalization. No statistic
    crosses examples, so an example's output does not depend on its batch-mates (claims
    P06-P07; Part II, chapter "One family: batch, layer, instance and group norm").
    Interchangeable with :func:`torch.nn.functional.group_norm`.

    Args:
        input: floating-point input ``(N, C, *)``.
        num_groups: number of groups ``G``; must divide ``C``.
        weight: per-channel gain ``gamma`` of shape ``(C,)``, or None for 1.
        bias: per-channel bias ``beta`` of shape ``(C,)``, or None for 0.
        eps: added to the variance inside the square root; must be > 0. Default: 1e-5.

    Statistics are two-pass (mean first, then the mean of squared deviations), in float32 for
    float16/bfloat16 inputs; a constant group gives ``bias`` (not NaN).

    Shape:
        - Input: ``(N, C, *)``; output: the same shape and dtype.

    Example::

        >>> x = torch.randn(2, 6, 4, 4)
        >>> y = group_norm(x, 3)
        >>> torch.allclose(y.reshape(2, 3, -1).mean(-1), torch.zeros(2, 3), atol=1e-6)
        True
    """
    check_floating(input)
    if input.dim() < 2:
        raise ShapeError(
            f"group_norm expects input of shape (N, C, *) with at least 2 dimensions, "
            f"got shape {tuple(input.shape)}"
        )
    check_size("num_groups", num_groups)
    n, c = input.shape[0], input.shape[1]
    if c % num_groups != 0:
        raise ValueError(
            f"the number of channels C = input.shape[1] = {c} must be divisible by "
            f"num_groups = {num_groups}; input shape {tuple(input.shape)}"
        )
    check_param(weight, "weight", (c,))
    check_param(bias, "bias", (c,))
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


class GroupNorm(nn.Module):
    r"""Group normalization as a module (Wu and He, 2018; see :func:`group_norm`).

    Normalizes each example's channels in ``num_groups`` groups, then applies a learned
    per-channel gain ``weight`` (initialized to 1) and bias ``bias`` (initialized to 0).
    The same computation in training and evaluation mode and at any batch size, including 1.
    Explained in Part II, chapter "One family: batch, layer, instance and group norm" (claims
    P06-P07). Interchangeable with :class:`torch.nn.GroupNorm` (same arguments, same state
    dict, loads in both directions).

    Args:
        num_groups: number of groups ``G``; must divide ``num_channels``.
        num_channels: number of channels ``C`` expected in the input ``(N, C, *)``.
        eps: added to the variance inside the square root. Default: 1e-5.
        affine: learn a per-channel gain and bias. Default: True.
        device: where the parameters live. Default: torch's default device.
        dtype: the parameters' dtype. Default: torch's default dtype.
        bias: (keyword only) learn the bias when ``affine`` is True, as torch's ``bias``.
            Default: True.

    Shape:
        - Input: ``(N, C, *)``; output: the same shape.

    Example::

        >>> gn = GroupNorm(4, 32)
        >>> y = gn(torch.randn(2, 32, 8, 8))
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
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
        if self.affine:
            self.weight = nn.Parameter(torch.empty(num_channels, device=device, dtype=dtype))
            if bias:
                self.bias = nn.Parameter(torch.empty(num_channels, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gains to 1 and biases to 0, as torch and Wu and He (2018) start."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        check_floating(input)
        if input.dim() < 2 or input.shape[1] != self.num_channels:
            raise ShapeError(
                f"GroupNorm({self.num_groups}, {self.num_channels}) expects input of shape "
                f"(N, {self.num_channels}, *), got {tuple(input.shape)}"
            )
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
            f"bias={self.bias is not None}"
        )


# ---------------------------------------------------------------------------------------------
# Dynamic Tanh
# ---------------------------------------------------------------------------------------------


def dyt(
    input: Tensor, alpha: Tensor | float, weight: Tensor | None = None, bias: Tensor | None = None
) -> Tensor:
    r"""Dynamic Tanh (Zhu et al., 2025): an element-wise stand-in for a norm layer.

    .. math:: y = \gamma \odot \tanh(\alpha x) + \beta

    No statistics are computed: ``alpha`` is a learned scalar that sets how soon the S-shaped
    curve saturates, ``weight`` (gamma) and ``bias`` (beta) act per element like layer norm's
    gain and bias. Part II, chapter "Transformers without normalization" (claims P11-P12).

    Args:
        input: floating-point input ``(*, *normalized_shape)``.
        alpha: the scale inside the tanh, a number or a one-element tensor.
        weight: gain of shape ``normalized_shape`` (any shape that broadcasts), or None for 1.
        bias: bias of the same shape as ``weight``, or None for 0.

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape.

    Example::

        >>> y = dyt(torch.randn(4, 8), 0.5)
        >>> bool(y.abs().max() < 1)
        True
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


class DyT(nn.Module):
    r"""Dynamic Tanh, the drop-in replacement of a layer norm (Zhu et al., 2025).

    ``weight * tanh(alpha * x) + bias`` with a learned scalar ``alpha`` (initialized to
    ``alpha_init``), a per-element gain ``weight`` (ones) and bias ``bias`` (zeros) over the
    trailing ``normalized_shape`` dimensions; see :func:`dyt`. Parameter names and shapes
    (``alpha`` of shape ``(1,)``) follow the authors' code, so its state dicts load here.
    Explained in Part II, chapter "Transformers without normalization" (claims P11-P12).

    Args:
        normalized_shape: the trailing dimensions that ``weight`` and ``bias`` cover.
        alpha_init: the initial value of ``alpha``. Default: 0.5 (the default of the
            authors' code).
        device: where the parameters live. Default: torch's default device.
        dtype: the parameters' dtype. Default: torch's default dtype.

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape.

    Example::

        >>> act = DyT(64)
        >>> y = act(torch.randn(8, 16, 64))
    """

    def __init__(
        self,
        normalized_shape: _ShapeLike,
        alpha_init: float = 0.5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        if isinstance(alpha_init, bool) or not (
            isinstance(alpha_init, numbers.Real) and math.isfinite(alpha_init)
        ):
            raise ValueError(f"alpha_init must be a finite number, got {alpha_init!r}")
        self.alpha_init = float(alpha_init)
        kw = {"device": device, "dtype": dtype}
        self.alpha = nn.Parameter(torch.empty(1, **kw))
        self.weight = nn.Parameter(torch.empty(self.normalized_shape, **kw))
        self.bias = nn.Parameter(torch.empty(self.normalized_shape, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``alpha`` to ``alpha_init``, the gain to 1 and the bias to 0."""
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        check_floating(input)
        check_trailing(input, self.normalized_shape)
        return dyt(input, self.alpha, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, alpha_init={self.alpha_init}"
