"""Normalization layers: layer normalization and the two methods the paper compares it with.

Paper sections 2, 3 and 5.1; book chapters 2 (`02_background`), 3 (`03_layer_norm`) and 4
(`04_related_work`). Every layer here reads eq. 5 of the paper,

    h_i = f( g_i / sigma_i * (a_i - mu_i) + b_i ),

with a different choice of mu and sigma:

- batch normalization (eq. 2): mu_i, sigma_i of unit i over the mini-batch,
- layer normalization (eq. 3): one mu, sigma per example over all H units of the layer,
- weight normalization: mu_i = 0 and sigma_i = ||w_i||_2.

A norm here knows nothing of training loops or experiments.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["layer_norm", "LayerNorm", "BatchNorm", "WeightNormLinear"]

_ShapeLike = int | Sequence[int] | torch.Size
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _as_shape(normalized_shape: _ShapeLike) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(int(s) for s in normalized_shape)  # type: ignore[union-attr]
        except TypeError:
            raise TypeError(
                f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
            ) from None
    if len(shape) == 0 or any(s <= 0 for s in shape):
        raise ValueError(f"normalized_shape must hold one or more positive sizes, got {shape}")
    return shape


def _check_floating(x: Tensor, what: str = "input") -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{what} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}; convert it with .float() first"
        )


def _check_layer_norm_args(
    x: Tensor, shape: tuple[int, ...], weight: Tensor | None, bias: Tensor | None, eps: float
) -> None:
    _check_floating(x)
    if not (isinstance(eps, numbers.Real) and eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number > 0 (keeps sigma away from 0), got {eps!r}")
    k = len(shape)
    if x.dim() < k or tuple(x.shape[x.dim() - k :]) != shape:
        raise ValueError(
            f"normalized_shape {shape} must match the trailing dimensions of the input, "
            f"but the input has shape {tuple(x.shape)}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        _check_floating(p, name)
        if tuple(p.shape) != shape:
            raise ValueError(
                f"{name} must have shape normalized_shape={shape}, got {tuple(p.shape)}"
            )


def _graph_is_kept() -> bool:
    """True unless autograd says this backward runs with ``retain_graph=False``.

    Asked through a private torch hook; where it is missing or cannot answer, the answer is
    True, which only costs the in-place backward its speed, never its correctness.
    """
    ask = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    if ask is None:
        return True
    try:
        return bool(ask())
    except RuntimeError:
        return True


def _is_batched(t: Tensor) -> bool:
    """True for a vmap-batched tensor (``is_grads_batched=True``); True if torch cannot say."""
    ft = getattr(torch._C, "_functorch", None)
    checks = [getattr(ft, n, None) for n in ("is_batchedtensor", "is_legacy_batchedtensor")]
    if ft is None or None in checks:
        return True
    return any(check(t) for check in checks)


class _LayerNormFunction(torch.autograd.Function):
    """Eqs. 3 and 15-16 with the backward pass written out (derived in chapter 3).

    Forward, per row z of D = prod(normalized_shape) numbers:
        mu = mean(z),  sigma = sqrt(mean((z - mu)^2) + eps),  z_hat = (z - mu) / sigma,
        y = z_hat * g + b.
    Backward, with u = dL/dy * g:
        dL/dz = (u - mean(u) - z_hat * mean(u * z_hat)) / sigma,
        dL/dg = sum over rows of dL/dy * z_hat,  dL/db = sum over rows of dL/dy.

    Speed on CPU is memory traffic: each full pass over a (rows, D) tensor costs, and a fresh
    full-size tensor costs most (its pages are faulted in). The forward makes two such tensors,
    z_hat (kept for the backward) and y, or only one when no gradient is wanted (y is then
    written over z_hat). The backward makes none when autograd frees the graph after it
    (``retain_graph=False``, the usual case): it forms dL/dy * z_hat in z_hat's own buffer,
    takes its sums, then writes dL/dz over it, with (z - mu) / sigma standing in for z_hat.
    Since z_hat has row mean 0, mean(u) is the row mean of u - z_hat * mean(u * z_hat), so the
    last step subtracts a row mean. When the graph is kept or the gradients are vmap-batched,
    z_hat must survive, and one new tensor is made instead. When a graph of the backward
    itself is asked for (``create_graph=True``, as in gradgradcheck), the backward is
    recomputed from the saved input with differentiable torch ops.
    """

    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps):  # type: ignore[override]
        d = math.prod(shape)
        xf = (x.float() if x.dtype in _LOW_PRECISION else x).reshape(-1, d)  # (R, D)
        mu = xf.mean(dim=1, keepdim=True)  # (R, 1)
        x_hat = xf - mu  # (R, D) centred first: no E[x^2] - E[x]^2
        mu_err = x_hat.mean(dim=1, keepdim=True)  # (R, 1) rounding error of mu
        x_hat.sub_(mu_err)  # second pass: z - mu - mu_err, exactly centred
        var = torch.linalg.vector_norm(x_hat, dim=1, keepdim=True).square_().div_(d)  # (R, 1)
        rstd = torch.rsqrt(var + eps)  # (R, 1)
        x_hat.mul_(rstd)
        w = None if weight is None else weight.reshape(d).to(x_hat.dtype)  # (D,)
        b = None if bias is None else bias.reshape(d).to(x_hat.dtype)  # (D,)
        ctx.shape, ctx.eps = shape, eps
        if not any(ctx.needs_input_grad):  # no backward will run: y is written over z_hat
            y = x_hat if w is None else x_hat.mul_(w)
            y = y if b is None else y.add_(b)
            return y.reshape(x.shape).to(x.dtype)
        if w is not None:
            y = torch.addcmul(b, x_hat, w) if b is not None else x_hat * w
        else:
            y = x_hat + b if b is not None else x_hat.clone()
        ctx.save_for_backward(x, weight, bias, x_hat, mu, rstd)
        return y.reshape(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        x, weight, bias, x_hat, mu, rstd = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            return _layer_norm_backward_graph(ctx, grad_y, x, weight, bias)
        d = x_hat.shape[1]
        g = grad_y.to(x_hat.dtype).reshape(-1, d)  # (R, D)
        w = None if weight is None else weight.reshape(d).to(x_hat.dtype)  # (D,)
        grad_b = g.sum(dim=0).reshape(bias.shape).to(bias.dtype) if (
            bias is not None and ctx.needs_input_grad[3]) else None
        in_place = not (_graph_is_kept() or _is_batched(g) or _is_batched(x_hat))
        gx = x_hat.mul_(g) if in_place else g * x_hat  # (R, D) dL/dy * z_hat
        grad_w = gx.sum(dim=0).reshape(weight.shape).to(weight.dtype) if (
            weight is not None and ctx.needs_input_grad[2]) else None
        if w is not None:
            gx.mul_(w)  # u * z_hat
        ux_mean = gx.mean(dim=1, keepdim=True)  # (R, 1) mean(u * z_hat)
        if in_place:  # z_hat is gone: (z - mu) * rstd stands in for it (mu_err: see below)
            grad_x = torch.sub(x.reshape(-1, d), mu, out=gx).mul_(-(rstd * ux_mean))  # (R, D)
        else:
            grad_x = gx.copy_(x_hat).mul_(-ux_mean)  # (R, D) -z_hat * mean(u * z_hat)
        if w is not None:
            grad_x.addcmul_(g, w)  # + u, u = g * w
        else:
            grad_x.add_(g)
        # - mean(u): z_hat has row mean 0, so mean(u) is the row mean of what the buffer holds
        # now; subtracting that row mean also removes the mu_err part left by the in-place path
        grad_x.sub_(grad_x.mean(dim=1, keepdim=True)).mul_(rstd)
        return grad_x.reshape(x.shape).to(x.dtype), None, grad_w, grad_b, None


def _layer_norm_backward_graph(ctx, grad_y, x, weight, bias):
    """The same backward from the saved input with differentiable ops (for double backward)."""
    shape, eps = ctx.shape, ctx.eps
    dims = tuple(range(-len(shape), 0))
    x_hat, rstd = _normalize(x, shape, eps)  # (..., *shape), (..., 1...)
    g = grad_y.to(x_hat.dtype)
    u = g * weight.to(x_hat.dtype) if weight is not None else g
    u_mean = u.mean(dim=dims, keepdim=True)
    ux_mean = (u * x_hat).mean(dim=dims, keepdim=True)
    grad_x = (u - u_mean - x_hat * ux_mean) * rstd
    grad_w = grad_b = None
    batch_dims = tuple(range(x.dim() - len(shape)))
    if weight is not None and ctx.needs_input_grad[2]:
        grad_w = (g * x_hat).sum(dim=batch_dims).to(weight.dtype)
    if bias is not None and ctx.needs_input_grad[3]:
        grad_b = g.sum(dim=batch_dims).to(bias.dtype)
    return grad_x.to(x.dtype), None, grad_w, grad_b, None


def _normalize(x: Tensor, shape: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor]:
    """Two-pass mean and biased variance over the trailing dims; float32 for half inputs."""
    dims = tuple(range(-len(shape), 0))
    xf = x.float() if x.dtype in _LOW_PRECISION else x
    mu = xf.mean(dim=dims, keepdim=True)  # (..., 1, ..., 1)
    xc = xf - mu  # centring first keeps a large mean from cancelling digits
    xc = xc - xc.mean(dim=dims, keepdim=True)  # second pass: removes the rounding error of mu
    var = (xc * xc).mean(dim=dims, keepdim=True)  # biased, as in eq. 3
    rstd = torch.rsqrt(var + eps)
    return xc * rstd, rstd


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

    Args:
        x: floating-point input ``(*, *normalized_shape)``.
        normalized_shape: the trailing dimensions to normalize over.
        weight: gain ``g`` of shape ``normalized_shape``, or None for 1.
        bias: bias ``b`` of shape ``normalized_shape``, or None for 0.
        eps: added to the variance inside the square root, as torch does; must be > 0.
        impl: ``"autograd"`` (default) runs lnbook's own forward and hand-derived backward;
            ``"torch"`` checks the arguments the same way, then calls
            :func:`torch.nn.functional.layer_norm` (the fast path, same numbers to rounding).

    Statistics are computed in float32 for float16/bfloat16 inputs and the result is cast
    back, so half-precision inputs neither overflow nor lose the variance to rounding. A
    constant row gives ``bias`` (not NaN); a NaN stays in its own row.

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape and dtype.

    Example::

        >>> x = torch.randn(4, 10)
        >>> y = layer_norm(x, 10)
        >>> torch.allclose(y.mean(-1), torch.zeros(4), atol=1e-6)
        True
    """
    shape = _as_shape(normalized_shape)
    _check_layer_norm_args(x, shape, weight, bias, eps)
    if impl == "torch":
        return F.layer_norm(x, shape, weight, bias, eps)
    if impl != "autograd":
        raise ValueError(f"impl must be 'autograd' or 'torch', got {impl!r}")
    return _LayerNormFunction.apply(x, shape, weight, bias, float(eps))


class LayerNorm(nn.Module):
    r"""Layer normalization as a module (paper eqs. 3, 4 and 15-16; chapter 3).

    Normalizes each example over its trailing ``normalized_shape`` dimensions, then applies
    a learned per-unit gain ``weight`` (initialized to 1) and bias ``bias`` (initialized to 0).
    The computation is the same in training and evaluation mode (claim C01) and works at
    batch size 1 (claim C02). Parameter names match :class:`torch.nn.LayerNorm`, so state
    dicts load in both directions.

    Args:
        normalized_shape: the trailing dimensions to normalize over.
        eps: added to the variance inside the square root. Default: 1e-5.
        elementwise_affine: learn a gain (and a bias). Default: True.
        bias: learn a bias when ``elementwise_affine`` is True. Default: True.
        impl: ``"autograd"`` (lnbook's hand-derived backward) or ``"torch"`` (fast path).

    Shape:
        - Input: ``(*, *normalized_shape)``; output: the same shape.

    Example::

        >>> ln = LayerNorm(256)
        >>> y = ln(torch.randn(32, 256))
    """

    def __init__(
        self,
        normalized_shape: _ShapeLike,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        impl: Literal["autograd", "torch"] = "autograd",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape)
        if not (isinstance(eps, numbers.Real) and eps > 0):
            raise ValueError(f"eps must be > 0, got {eps!r}")
        if impl not in ("autograd", "torch"):
            raise ValueError(f"impl must be 'autograd' or 'torch', got {impl!r}")
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
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
        unbiased: normalize with the unbiased variance (divide by n - 1), as the paper does for
            batch size 4 in section 6.6 (claim C18). Default: False (divide by n, as torch).
        affine: learn a gain ``weight`` and a bias ``bias``. Default: True.

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
        unbiased: bool = False,
        affine: bool = True,
    ) -> None:
        super().__init__()
        if not (isinstance(num_features, numbers.Integral) and num_features > 0):
            raise ValueError(f"num_features must be a positive int, got {num_features!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum!r}")
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), float(momentum)
        self.unbiased, self.affine = unbiased, affine
        if affine:
            self.weight = nn.Parameter(torch.empty(num_features))
            self.bias = nn.Parameter(torch.empty(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
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
        _check_floating(x)
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(
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

    Shape:
        - Input: ``(*, in_features)``; output: ``(*, out_features)``.

    Example::

        >>> wn = WeightNormLinear(20, 30)
        >>> y = wn(torch.randn(8, 20))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.gain = nn.Parameter(torch.empty(out_features))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features))
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
        _check_floating(x)
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(
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
