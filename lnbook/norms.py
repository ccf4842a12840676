"""Normalization layers: layer normalization and the two methods the paper compares it with.

Paper sections 2, 3, 5.1 and 6.7; book chapters 2 (`02_background`), 3 (`03_layer_norm`),
4 (`04_related_work`) and 6.7 (`06_7_convnets`). Every layer here reads eq. 5 of the paper,

    h_i = f( g_i / sigma_i * (a_i - mu_i) + b_i ),

with a different choice of mu and sigma:

- batch normalization (eq. 2): mu_i, sigma_i of unit i over the mini-batch,
- layer normalization (eq. 3): one mu, sigma per example over all H units of the layer
  (:class:`ChannelLayerNorm`: over the channels at each position of a feature map),
- weight normalization: mu_i = 0 and sigma_i = ||w_i||_2.

The input checks are :mod:`lnbook.checks`'s (re-exported here under their old names), so that a
wrong input gets the same clear message everywhere. A norm here knows nothing of training
loops or experiments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import (
    ShapeError,
    as_normalized_shape,
    check_bool,
    check_choice,
    check_eps,
    check_floating,
    check_param,
    check_shape,
    check_size,
    check_trailing,
)
from lnbook.functional import layer_norm_backward, layer_norm_forward, normalize

__all__ = [
    "LN_IMPL",
    "layer_norm",
    "LayerNorm",
    "ChannelLayerNorm",
    "BatchNorm",
    "WeightNormLinear",
    "check_floating",
    "check_size",
    "check_shape",
    "check_eps",
    "as_normalized_shape",
]

_ShapeLike = int | Sequence[int] | torch.Size
_LOW_PRECISION = (torch.float16, torch.bfloat16)
LN_IMPLS = ("autograd", "torch")  # the values of impl (of ln_impl in larger modules)

LN_IMPL: Literal["autograd", "torch"] = "torch"
"""The default ``impl`` of :func:`layer_norm` inside lnbook's larger modules (the recurrent
layers of :mod:`lnbook.rnn`, the Transformer of :mod:`lnbook.transformer`): ``"torch"`` (the
argument checks of :func:`layer_norm`, then torch's fused kernel, several times faster at the
experiments' small sizes) or ``"autograd"`` (lnbook's own forward and hand-derived backward of
chapter 3). Both give the same numbers to rounding; each module's ``ln_impl`` keyword overrides
it. :class:`LayerNorm` itself defaults to ``"autograd"``, the code chapter 3 teaches."""

def _check_impl(impl: object) -> None:
    check_choice("impl", impl, LN_IMPLS)


def _check_layer_norm_args(
    x: Tensor, shape: tuple[int, ...], weight: Tensor | None, bias: Tensor | None, eps: float
) -> None:
    check_floating(x)
    check_eps(eps)
    check_trailing(x, shape)
    check_param(weight, "weight", shape)
    check_param(bias, "bias", shape)


# ----------------------------------------------------------------------------------------------
# layer normalization: eq. 3 and the backward of chapter 3, from lnbook.functional


def _layer_norm_forward(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, d: int, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """y = x_hat * g + b (eqs. 3, 15-16) for x of any shape (*, D...); also x_hat and rstd."""
    w = None if weight is None else weight.reshape(d)  # (D,)
    b = None if bias is None else bias.reshape(d)  # (D,)
    y, x_hat, rstd = layer_norm_forward(x.reshape(-1, d), w, b, eps)  # (R, D), (R, D), (R, 1)
    return y.reshape(x.shape).to(x.dtype), x_hat, rstd


class _LayerNormFunction(torch.autograd.Function):
    """Eqs. 3 and 15-16 with the backward pass written out (derived in chapter 3).

    ``apply(x, weight, bias, normalized_shape, eps)`` returns ``(y, x_hat, rstd)``; the last
    two are what the backward reads, returned (and marked non-differentiable) because a
    Function in the ``setup_context`` style hands intermediates to its backward that way, and
    :func:`layer_norm` drops them. ``generate_vmap_rule`` lets ``torch.func.vmap`` run the
    forward on batched tensors (every op in it is a torch op).

    Second derivatives: ``x_hat`` and ``rstd`` come out of the forward with no graph behind
    them, so a backward that used them when its own graph is wanted (``create_graph=True``,
    ``torch.func.grad`` and ``jacrev`` always want it) would treat them as constants and drop
    their dependence on x. There, the backward computes them again from the saved input x with
    the same function as the forward, inside the graph; otherwise it reads the saved ones.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(  # type: ignore[override]
        x: Tensor, weight: Tensor | None, bias: Tensor | None, shape: tuple[int, ...], eps: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        return _layer_norm_forward(x, weight, bias, math.prod(shape), eps)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        x, weight, bias, shape, eps = inputs
        _, x_hat, rstd = output
        ctx.mark_non_differentiable(x_hat, rstd)
        ctx.set_materialize_grads(False)  # no zero tensors for the grads of x_hat and rstd
        ctx.save_for_backward(x, weight, x_hat, rstd)
        ctx.shape, ctx.eps = shape, eps
        ctx.bias_dtype = None if bias is None else bias.dtype

    @staticmethod
    def backward(ctx, grad_y, _grad_x_hat, _grad_rstd):  # type: ignore[override]
        if grad_y is None:
            return None, None, None, None, None
        x, weight, x_hat, rstd = ctx.saved_tensors
        d = x_hat.shape[1]
        if torch.is_grad_enabled():  # a graph of this backward is wanted: x_hat, rstd from x
            x_hat, rstd = normalize(x.reshape(-1, d), ctx.eps)
        w = None if weight is None else weight.reshape(d).to(x_hat.dtype)  # (D,)
        grad_x, grad_w, grad_b = layer_norm_backward(
            grad_y.reshape(-1, d).to(x_hat.dtype), x_hat, rstd, w)
        # needs_input_grad can read False for a parameter while torch.compile traces
        # torch.func.grad, so every gradient an input can take is returned there
        need = (True,) * 3 if torch.compiler.is_compiling() else ctx.needs_input_grad
        grad_w = grad_w.reshape(weight.shape).to(weight.dtype) if (
            weight is not None and need[1]) else None
        grad_b = grad_b.reshape(ctx.shape).to(ctx.bias_dtype) if (
            ctx.bias_dtype is not None and need[2]) else None
        return grad_x.reshape(x.shape).to(x.dtype), grad_w, grad_b, None, None


_NO_FORWARD_AD = (
    "lnbook.layer_norm(impl='autograd') has no forward-mode AD (torch.func.jvp, "
    "torch.autograd.forward_ad, jacfwd): its autograd.Function defines the hand-derived backward "
    "only (a custom jvp would stop torch.compile from tracing it). Use impl='torch' "
    "(LayerNorm(..., impl='torch')), which runs torch.nn.functional.layer_norm and supports it"
)


def layer_norm(
    x: Tensor,
    normalized_shape: _ShapeLike,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    impl: Literal["autograd", "torch"] = "autograd",
) -> Tensor:
    r"""Layer normalization (paper eqs. 3 and 15-16; chapter 3).

    Each example is normalized with the mean and the (biased) standard deviation of its own
    summed inputs, taken over the trailing ``normalized_shape`` dimensions:

    .. math:: y = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} \odot g + b

    The mathematics (forward and backward, on rows) is :mod:`lnbook.functional`'s; this
    function checks the arguments and makes rows of ``x``.

    Args:
        x: floating-point input ``(*, *normalized_shape)``.
        normalized_shape: the trailing dimensions to normalize over.
        weight: gain ``g`` of shape ``normalized_shape``, or None for 1.
        bias: bias ``b`` of shape ``normalized_shape``, or None for 0.
        eps: added to the variance inside the square root, as torch does; must be > 0.
        impl: ``"autograd"`` (default) runs lnbook's own forward and the backward derived by
            hand in chapter 3, in torch operations; ``"torch"`` checks the arguments the same
            way, then calls :func:`torch.nn.functional.layer_norm` (torch's fused kernel, the
            same numbers to rounding).

    Statistics are computed in float32 for float16/bfloat16 inputs and the result is cast
    back, so half-precision inputs neither overflow nor lose the variance to rounding. A
    constant row gives ``bias`` (not NaN); a NaN stays in its own row.

    Both paths work under ``torch.func`` (``vmap``, ``grad``, ``jacrev``, also nested: second
    derivatives are exact), ``torch.compile(fullgraph=True)`` and ``torch.export``.
    Forward-mode AD (``torch.func.jvp``, ``jacfwd``, ``torch.autograd.forward_ad``) needs
    ``impl="torch"``. For speed, compile the model that uses it (``torch.compile`` fuses the
    forward and the hand-derived backward) or use ``impl="torch"``.

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape and dtype.

    Example::

        >>> x = torch.randn(4, 10)
        >>> y = layer_norm(x, 10)
        >>> torch.allclose(y.mean(-1), torch.zeros(4), atol=1e-6)
        True
        >>> per_example = torch.func.vmap(torch.func.grad(lambda r: layer_norm(r, 10)[0]))(x)
    """
    shape = as_normalized_shape(normalized_shape)
    _check_layer_norm_args(x, shape, weight, bias, eps)
    _check_impl(impl)
    if impl == "torch":
        return F.layer_norm(x, shape, weight, bias, eps)
    try:
        y, _, _ = _LayerNormFunction.apply(x, weight, bias, shape, float(eps))
    except NotImplementedError as e:  # torch's words: "You must implement the jvp function ..."
        if "jvp" in str(e):
            raise NotImplementedError(_NO_FORWARD_AD) from e
        raise
    return y


class LayerNorm(nn.Module):
    r"""Layer normalization as a module (paper eqs. 3, 4 and 15-16; chapter 3).

    Normalizes each example over its trailing ``normalized_shape`` dimensions, then applies
    a learned per-unit gain ``weight`` (initialized to 1) and bias ``bias`` (initialized to 0).
    The computation is the same in training and evaluation mode (claim C01) and works at
    batch size 1 (claim C02). Arguments and parameter names match :class:`torch.nn.LayerNorm`,
    so it is a drop-in replacement and state dicts load in both directions.

    Args:
        normalized_shape: the trailing dimensions to normalize over.
        eps: added to the variance inside the square root. Default: 1e-5.
        elementwise_affine: learn a gain (and a bias). Default: True.
        bias: learn a bias when ``elementwise_affine`` is True. Default: True.
        impl: ``"autograd"`` (lnbook's hand-derived backward) or ``"torch"`` (torch's fused
            kernel); see :func:`layer_norm`.
        device, dtype: where and in which dtype the parameters are made, as in torch.

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape.

    Example::

        >>> ln = LayerNorm(256)
        >>> y = ln(torch.randn(32, 256))
        >>> fast = torch.compile(ln)  # forward and hand-derived backward, fused
    """

    def __init__(
        self,
        normalized_shape: _ShapeLike,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        impl: Literal["autograd", "torch"] = "autograd",
    ) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        self.eps = check_eps(eps)
        _check_impl(impl)
        self.elementwise_affine = check_bool("elementwise_affine", elementwise_affine)
        check_bool("bias", bias)
        self.impl = impl
        kw = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **kw))
            self.bias = nn.Parameter(torch.empty(self.normalized_shape, **kw)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gains to 1 and biases to 0, as the paper's experiments start (section 6)."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self.impl)

    def extra_repr(self) -> str:
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.elementwise_affine and self.bias is None:
            s += ", bias=False"
        if self.impl != "autograd":
            s += f", impl={self.impl!r}"
        return s


class ChannelLayerNorm(nn.Module):
    r"""Layer normalization over the channels at each position of a feature map (chapter 6.7).

    The paper (section 6.7) applies layer normalization to ConvNets without saying over which
    axes. This is the reading later ConvNets use: each example and each position ``(h, w)``
    gets its own mean and variance over the ``C`` channels (eq. 3 with the channels as the
    hidden units), and the gain and bias are per channel. The other reading, over all
    ``C * H * W`` units of the layer, is :class:`LayerNorm` with
    ``normalized_shape=(C, H, W)``.

    .. math:: y_{n,:,h,w} = \frac{a_{n,:,h,w} - \mu_{n,h,w}}{\sigma_{n,h,w}} \odot g + b

    Args:
        num_channels: ``C``.
        eps: added to the variance inside the square root. Default: 1e-5.
        device, dtype: where and in which dtype the parameters are made, as in torch.
        impl: ``"autograd"`` or ``"torch"``, as in :func:`layer_norm`.

    Shape:
        - Input: ``(N, C, H, W)``; output: the same shape.

    Example::

        >>> ln = ChannelLayerNorm(16)
        >>> ln(torch.randn(2, 16, 5, 5)).shape
        torch.Size([2, 16, 5, 5])
    """

    def __init__(
        self,
        num_channels: int,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        impl: Literal["autograd", "torch"] = "autograd",
    ) -> None:
        super().__init__()
        self.num_channels = check_size("num_channels", num_channels)
        self.eps = check_eps(eps)
        _check_impl(impl)
        self.impl = impl
        self.weight = nn.Parameter(torch.empty(self.num_channels, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(self.num_channels, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gains to 1 and biases to 0."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        check_floating(x)
        if x.dim() != 4 or x.shape[1] != self.num_channels:
            raise ShapeError(
                f"ChannelLayerNorm({self.num_channels}) expects (N, {self.num_channels}, H, W), "
                f"got {tuple(x.shape)}"
            )
        y = layer_norm(x.movedim(1, -1), self.num_channels, self.weight, self.bias, self.eps,
                       self.impl)  # (N, H, W, C)
        return y.movedim(-1, 1)  # (N, C, H, W)

    def extra_repr(self) -> str:
        s = f"{self.num_channels}, eps={self.eps}"
        return s if self.impl == "autograd" else s + f", impl={self.impl!r}"


class BatchNorm(nn.Module):
    r"""Batch normalization over dimension 0 (paper eq. 2; chapter 2).

    In training mode each unit (channel) is normalized with the mean and variance of its
    summed inputs over the mini-batch (and over any trailing spatial dimensions), and running
    averages are updated for evaluation mode, where they replace the batch statistics. The
    output for one example therefore depends on its batch-mates (claim C03).

    Args:
        num_features: number of units ``C``.
        eps: added to the variance inside the square root. Default: 1e-5.
        momentum: weight of the newest batch in the running averages. Default: 0.1.
        affine: learn a gain ``weight`` and a bias ``bias``. Default: True.
        device, dtype: where and in which dtype parameters and running statistics are made,
            as in torch.
        unbiased: (keyword only) normalize with the unbiased variance (divide by n - 1), as the
            paper does for batch size 4 in section 6.6 (claim C18). Default: False (divide by
            n, as torch).

    The positional arguments are :class:`torch.nn.BatchNorm1d`'s, in its order.

    Parameter and buffer names match :class:`torch.nn.BatchNorm1d`, whose running variance is
    always updated with the unbiased estimate; so is this one's.

    Shape:
        - Input: ``(N, C)`` or ``(N, C, *)``; output: the same shape.

    Example::

        >>> bn = BatchNorm(64)
        >>> y = bn(torch.randn(32, 64))
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        unbiased: bool = False,
    ) -> None:
        super().__init__()
        num_features = check_size("num_features", num_features)
        eps = check_eps(eps)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, float(momentum)
        self.unbiased = check_bool("unbiased", unbiased)
        self.affine = check_bool("affine", affine)
        kw = {"device": device, "dtype": dtype}
        if affine:
            self.weight = nn.Parameter(torch.empty(num_features, **kw))
            self.bias = nn.Parameter(torch.empty(num_features, **kw))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.register_buffer("running_mean", torch.zeros(num_features, **kw))
        self.register_buffer("running_var", torch.ones(num_features, **kw))
        self.register_buffer(
            "num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        self.running_mean.zero_()
        self.running_var.fill_(1.0)
        self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        check_floating(x)
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ShapeError(
                f"BatchNorm({self.num_features}) expects input of shape (N, {self.num_features}) "
                f"or (N, {self.num_features}, *), got {tuple(x.shape)}"
            )
        dims = [0] + list(range(2, x.dim()))  # everything but the unit axis
        view = [1, -1] + [1] * (x.dim() - 2)
        if self.training:
            n = x.numel() // self.num_features
            if n < 2:
                raise ValueError(
                    "BatchNorm in training mode needs more than one value per unit to estimate a "
                    f"variance, got input of shape {tuple(x.shape)}; batch statistics do not exist "
                    "at batch size 1 (use LayerNorm, or eval mode)"
                )
            xf = x.float() if x.dtype in _LOW_PRECISION else x
            mean = xf.mean(dim=dims)
            var_biased = ((xf - mean.view(view)) ** 2).mean(dim=dims)
            var_unbiased = var_biased * (n / (n - 1))
            var = var_unbiased if self.unbiased else var_biased
            with torch.no_grad():
                m = self.momentum
                new_mean = mean.detach().to(self.running_mean.dtype)
                new_var = var_unbiased.detach().to(self.running_var.dtype)
                self.running_mean.mul_(1 - m).add_(m * new_mean)
                self.running_var.mul_(1 - m).add_(m * new_var)
                self.num_batches_tracked.add_(1)
        else:
            xf = x.float() if x.dtype in _LOW_PRECISION else x
            mean, var = self.running_mean.to(xf.dtype), self.running_var.to(xf.dtype)
        y = (xf - mean.view(view)) * torch.rsqrt(var.view(view) + self.eps)
        if self.affine:
            y = y * self.weight.view(view).to(y.dtype) + self.bias.view(view).to(y.dtype)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"unbiased={self.unbiased}, affine={self.affine}"
        )


class WeightNormLinear(nn.Module):
    r"""A linear layer with weight normalization (eq. 5 with mu = 0, sigma = ||w_i||; chapter 4).

    .. math:: h_i = \frac{g_i}{\lVert w_i \rVert_2} w_i^\top x + b_i

    The direction ``weight`` (rows w_i) and the per-output ``gain`` g_i are separate
    parameters (Salimans and Kingma, 2016); scaling a row w_i leaves the output unchanged.

    Args:
        in_features: size of each input.
        out_features: size of each output (number of units H).
        bias: learn an additive bias. Default: True.
        device, dtype: where and in which dtype the parameters are made, as in torch.

    Shape:
        - Input: ``(*, in_features)``; output: ``(*, out_features)``.

    Example::

        >>> wn = WeightNormLinear(20, 30)
        >>> y = wn(torch.randn(8, 20))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = check_size("in_features", in_features)
        self.out_features = check_size("out_features", out_features)
        check_bool("bias", bias)
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.gain = nn.Parameter(torch.empty(out_features, **kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Directions as :class:`torch.nn.Linear`; gains to each row's norm, so h = Wx + b."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        with torch.no_grad():
            self.gain.copy_(self.weight.norm(dim=1))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        check_floating(x)
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ShapeError(
                f"WeightNormLinear expects input of shape (*, {self.in_features}), "
                f"got {tuple(x.shape)}"
            )
        w = self.weight * (self.gain / self.weight.norm(dim=1)).unsqueeze(1)  # (H, in)
        return F.linear(x, w, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )
