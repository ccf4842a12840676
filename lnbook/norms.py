"""Normalization layers: layer normalization and the two methods the paper compares it with.

Paper sections 2, 3, 5.1, 6.7; chapters 2, 3, 4 and 6.7. Each reads eq. 5,
``h_i = f(g_i / sigma_i * (a_i - mu_i) + b_i)``, with mu and sigma over the mini-batch (batch
norm, eq. 2), over the layer's units per example (layer norm, eq. 3; :class:`ChannelLayerNorm`
over the channels at each position) or mu = 0, sigma = ||w_i|| (weight normalization).
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
    check_param_dtype,
    check_shape,
    check_size,
    check_trailing,
)
from lnbook.functional import (
    affine,
    layer_norm_backward,
    layer_norm_forward,
    normalize,
    statistics_dtype,
)

__all__ = ["LN_IMPL", "layer_norm", "LayerNorm", "ChannelLayerNorm", "BatchNorm",
           "WeightNormLinear", "check_floating", "check_size", "check_shape", "check_eps",
           "as_normalized_shape"]

_ShapeLike = int | Sequence[int] | torch.Size
LN_IMPLS = ("autograd", "torch")  # the values of impl (of ln_impl in larger modules)

LN_IMPL: Literal["autograd", "torch"] = "torch"
"""The default ``impl`` of the layer norms inside :mod:`lnbook.rnn` and :mod:`lnbook.transformer`
(their ``ln_impl`` keyword overrides it): ``"torch"``, :func:`layer_norm`'s checks then torch's
fused kernel, faster at the experiments' sizes than ``"autograd"``, chapter 3's code (the default
of :class:`LayerNorm` itself). Both give the same numbers to rounding."""


class _Affine(nn.Module):
    """A norm's gain ``weight`` (ones) and bias ``bias`` (zeros), either possibly None."""

    def _add_affine(self, shape: tuple[int, ...], weight: bool, bias: bool, kw: dict) -> None:
        self.register_parameter(
            "weight", nn.Parameter(torch.empty(shape, **kw)) if weight else None)
        self.register_parameter(
            "bias", nn.Parameter(torch.empty(shape, **kw)) if weight and bias else None)

    def _check_input(self, x: Tensor, c: int, layouts: str) -> None:
        """``x`` floating with ``c`` channels in dimension 1; ``layouts`` names the shapes."""
        check_floating(x)
        if x.dim() < 2 or x.shape[1] != c:
            raise ShapeError(f"{self!r} expects input of shape {layouts}, got {tuple(x.shape)}")

    def reset_parameters(self) -> None:
        """Gains to 1 and biases to 0, as the paper's experiments start (section 6)."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


# ----------------------------------------------------------------------------------------------
# layer normalization: eq. 3 and the backward of chapter 3, from lnbook.functional


class _LayerNormFunction(torch.autograd.Function):
    """Eqs. 3, 15-16 with chapter 3's backward: ``apply(x, weight, bias, shape, eps) -> (y, x_hat,
    rstd)``, the last two non-differentiable (recomputed from x for second derivatives)."""

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, shape, eps):  # type: ignore[override]
        """Under ``vmap`` (copies in an engine ``Stack``, per-example gradients): the copies'
        rows as one batch, by :class:`_LayerNormCopies`. torch's generated rule runs this
        function under a nested ``vmap`` and costs about a millisecond a call in Python."""
        xd, wd, bd = in_dims[:3]
        n, d = info.batch_size, math.prod(shape)
        x = x.movedim(xd, 0) if xd is not None else x.expand(n, *x.shape)  # (n, *, *shape)

        def copies(p: Tensor | None, pd: int | None) -> Tensor | None:  # (n, D), (D,) or None
            return None if p is None else p.movedim(pd, 0).reshape(n, d) if pd is not None \
                else p.reshape(d)
        y, x_hat, rstd = _LayerNormCopies.apply(
            x.reshape(n, -1, d), copies(weight, wd), copies(bias, bd), eps)
        return (y.reshape(x.shape), x_hat, rstd), (0, 0, 0)

    @staticmethod
    def forward(  # type: ignore[override]
        x: Tensor, weight: Tensor | None, bias: Tensor | None, shape: tuple[int, ...], eps: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        """y = x_hat * g + b for x ``(*, *shape)``; also x_hat ``(R, D)`` and rstd ``(R, 1)``."""
        d = math.prod(shape)
        w = None if weight is None else weight.reshape(d)  # (D,)
        b = None if bias is None else bias.reshape(d)  # (D,)
        y, x_hat, rstd = layer_norm_forward(x.reshape(-1, d), w, b, eps)  # (R, D) rows
        return y.reshape(x.shape).to(x.dtype), x_hat, rstd

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


class _LayerNormCopies(torch.autograd.Function):
    """:class:`_LayerNormFunction` for ``n`` copies at once, its rule under ``vmap``: x ``(n, R,
    D)``; weight and bias ``(n, D)`` (one per copy), ``(D,)`` (shared) or None. The operations
    are those torch's generated rule runs (layer_norm_forward and layer_norm_backward with a
    copy dimension), so the numbers are the same, bit for bit (tests/test_norms.py)."""

    @staticmethod
    def forward(  # type: ignore[override]
        x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, d = x.shape[0], x.shape[-1]
        x_hat, rstd = normalize(x.reshape(-1, d), eps)  # (nR, D), (nR, 1)
        x_hat, rstd = x_hat.view(n, -1, d), rstd.view(n, -1, 1)  # (n, R, D), (n, R, 1)

        def row(p: Tensor | None) -> Tensor | None:  # broadcast over the rows of each copy
            return p.unsqueeze(1) if p is not None and p.dim() == 2 else p
        return affine(x_hat, row(weight), row(bias)).to(x.dtype), x_hat, rstd

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        x, weight, bias, eps = inputs
        _, x_hat, rstd = output
        ctx.mark_non_differentiable(x_hat, rstd)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, weight, x_hat, rstd)
        ctx.eps, ctx.bias = eps, None if bias is None else (bias.dtype, bias.dim())

    @staticmethod
    def backward(ctx, grad_y, _grad_x_hat, _grad_rstd):  # type: ignore[override]
        if grad_y is None:
            return None, None, None, None
        x, w, x_hat, rstd = ctx.saved_tensors
        n, d = x_hat.shape[0], x_hat.shape[-1]
        if torch.is_grad_enabled():  # a graph of this backward is wanted: x_hat, rstd from x
            x_hat, rstd = (t.view(n, -1, t.shape[-1]) for t in normalize(x.reshape(-1, d),
                                                                         ctx.eps))
        gy = grad_y.to(x_hat.dtype)  # (n, R, D)
        wt = None if w is None else w.to(x_hat.dtype)  # (n, D) or (D,)
        gy_x_hat = gy * x_hat  # (n, R, D)
        grad_w, grad_b = gy_x_hat.sum(dim=1), gy.sum(dim=1)  # (n, D) each copy's
        if wt is None:
            mean_u = gy.mean(dim=2, keepdim=True)  # (n, R, 1)
            mean_ux = gy_x_hat.mean(dim=2, keepdim=True)  # (n, R, 1)
            grad_x = (x_hat * mean_ux).sub_(gy)
        else:  # the row means as products with g, as layer_norm_backward takes them
            col = wt.unsqueeze(-1)  # (n, D, 1) or (D, 1)
            mean_u, mean_ux = (gy @ col) / d, (gy_x_hat @ col) / d  # (n, R, 1)
            grad_x = torch.addcmul(x_hat * mean_ux, gy, wt.unsqueeze(-2) if wt.dim() == 2
                                   else wt, value=-1)
        grad_x = grad_x.add_(mean_u).mul_(-rstd)  # (n, R, D)
        need = (True,) * 3 if torch.compiler.is_compiling() else ctx.needs_input_grad
        if w is None or not need[1]:
            grad_w = None
        else:  # a shared gain's gradient: each copy's, in its dtype, summed over the copies
            grad_w = grad_w.to(w.dtype) if w.dim() == 2 else grad_w.to(w.dtype).sum(0)
        if ctx.bias is None or not need[2]:
            grad_b = None
        else:
            grad_b = grad_b.to(ctx.bias[0])
            grad_b = grad_b if ctx.bias[1] == 2 else grad_b.sum(0)
        return grad_x.to(x.dtype), grad_w, grad_b, None


_NO_FORWARD_AD = (
    "lnbook.layer_norm(impl='autograd') has no forward-mode AD (torch.func.jvp, "
    "torch.autograd.forward_ad, jacfwd): its autograd.Function defines the hand-derived backward "
    "only (a custom jvp would stop torch.compile from tracing it). Use impl='torch' "
    "(LayerNorm(..., impl='torch')), which runs torch.nn.functional.layer_norm and supports it"
)


def layer_norm(x: Tensor, normalized_shape: _ShapeLike, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5,
               impl: Literal["autograd", "torch"] = "autograd") -> Tensor:
    r"""Layer normalization (paper eqs. 3 and 15-16; chapter 3).

    .. math:: y = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} \odot g + b

    over the trailing ``normalized_shape`` dimensions, the mathematics of :mod:`lnbook.functional`.

    Args:
        x: floating-point input ``(*, *normalized_shape)``; output: same shape and dtype.
        normalized_shape: the trailing dimensions to normalize over.
        weight, bias: ``g`` and ``b`` of shape ``normalized_shape``, or None (1 and 0).
        eps: added to the variance inside the square root; must be > 0.
        impl: ``"autograd"`` (lnbook's forward and hand-derived backward) or ``"torch"``
            (the same checks, then :func:`torch.nn.functional.layer_norm`).

    Half-precision statistics are float32. Works under ``torch.func``, ``torch.compile`` and
    ``torch.export``; forward-mode AD needs ``impl="torch"``.
    """
    shape = as_normalized_shape(normalized_shape)
    check_floating(x)
    check_eps(eps)
    check_trailing(x, shape)
    check_param(weight, "weight", shape)
    check_param(bias, "bias", shape)
    check_param_dtype(x, weight=weight, bias=bias)
    check_choice("impl", impl, LN_IMPLS)
    if impl == "torch":
        return F.layer_norm(x, shape, weight, bias, eps)
    try:
        y, _, _ = _LayerNormFunction.apply(x, weight, bias, shape, float(eps))
    except NotImplementedError as e:  # torch's words: "You must implement the jvp function ..."
        if "jvp" in str(e):
            raise NotImplementedError(_NO_FORWARD_AD) from e
        raise
    return y


class LayerNorm(_Affine):
    r"""Layer normalization as a module (eqs. 3, 4 and 15-16; chapter 3).

    :class:`torch.nn.LayerNorm`'s interface and state dict.

    Args:
        normalized_shape, eps, elementwise_affine, bias, device, dtype: as torch.
        impl: ``"autograd"`` or ``"torch"`` (keyword-only), see :func:`layer_norm`.
    """

    def __init__(self, normalized_shape: _ShapeLike, eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
                 impl: Literal["autograd", "torch"] = "autograd") -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        self.eps = check_eps(eps)
        self.impl = check_choice("impl", impl, LN_IMPLS)
        self.elementwise_affine = check_bool("elementwise_affine", elementwise_affine)
        check_bool("bias", bias)
        self._add_affine(self.normalized_shape, elementwise_affine, bias,
                         {"device": device, "dtype": dtype})
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self.impl)

    def extra_repr(self) -> str:
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.elementwise_affine and self.bias is None:
            s += ", bias=False"
        if self.impl != "autograd":
            s += f", impl={self.impl!r}"
        return s


class ChannelLayerNorm(_Affine):
    r"""Layer normalization over the channels at each position of a feature map (chapter 6.7).

    .. math:: y_{n,:,h,w} = \frac{a_{n,:,h,w} - \mu_{n,h,w}}{\sigma_{n,h,w}} \odot g + b

    (:class:`LayerNorm` with ``normalized_shape=(C, H, W)`` is the other reading of section 6.7.)

    Args:
        num_channels: ``C``. eps, device, dtype: as torch. impl: as :func:`layer_norm`.

    Shape: ``(N, C, H, W)`` in and out.
    """

    def __init__(self, num_channels: int, eps: float = 1e-5,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
                 impl: Literal["autograd", "torch"] = "autograd") -> None:
        super().__init__()
        self.num_channels = check_size("num_channels", num_channels)
        self.eps = check_eps(eps)
        self.impl = check_choice("impl", impl, LN_IMPLS)
        self._add_affine((self.num_channels,), True, True, {"device": device, "dtype": dtype})
        self.reset_parameters()

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


def _update_running(run_mean: Tensor, run_var: Tensor, mean: Tensor, var_unbiased: Tensor,
                   momentum: float) -> None:
    """torch's running averages, in place: ``run = (1 - momentum) run + momentum new``."""
    with torch.no_grad():
        run_mean.mul_(1 - momentum).add_(momentum * mean.detach().to(run_mean.dtype))
        run_var.mul_(1 - momentum).add_(momentum * var_unbiased.detach().to(run_var.dtype))


class BatchNorm(_Affine):
    r"""Batch normalization over dimension 0 (paper eq. 2; chapter 2).

    Per-unit batch statistics in training (an example's output depends on its batch-mates, claim
    C03), running averages in eval mode; :class:`torch.nn.BatchNorm1d`'s arguments, names and
    running-variance update.

    Args:
        num_features, eps, momentum, affine, device, dtype: as torch.
        unbiased: (keyword-only) normalize with the unbiased variance (section 6.6, claim C18).

    Shape: ``(N, C)`` or ``(N, C, *)`` in and out.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, *, unbiased: bool = False) -> None:
        super().__init__()
        num_features = check_size("num_features", num_features)
        eps = check_eps(eps)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must lie in [0, 1], got {momentum!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, float(momentum)
        self.unbiased = check_bool("unbiased", unbiased)
        self.affine = check_bool("affine", affine)
        kw = {"device": device, "dtype": dtype}
        self._add_affine((num_features,), affine, True, kw)
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
        super().reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        c = self.num_features
        self._check_input(x, c, f"(N, {c}) or (N, {c}, *)")
        check_param_dtype(x, weight=self.weight, bias=self.bias,
                          running_mean=self.running_mean, running_var=self.running_var)
        dims = [0] + list(range(2, x.dim()))  # everything but the unit axis
        view = [1, -1] + [1] * (x.dim() - 2)
        xf = x.to(statistics_dtype(x.dtype))
        if self.training:
            n = x.numel() // self.num_features
            if n < 2:
                raise ValueError(
                    "BatchNorm in training mode needs more than one value per unit to estimate a "
                    f"variance, got input of shape {tuple(x.shape)}; batch statistics do not exist "
                    "at batch size 1 (use LayerNorm, or eval mode)"
                )
            mean = xf.mean(dim=dims)
            var_biased = ((xf - mean.view(view)) ** 2).mean(dim=dims)
            var_unbiased = var_biased * (n / (n - 1))
            var = var_unbiased if self.unbiased else var_biased
            _update_running(self.running_mean, self.running_var, mean, var_unbiased, self.momentum)
            self.num_batches_tracked.add_(1)
        else:
            mean, var = self.running_mean.to(xf.dtype), self.running_var.to(xf.dtype)
        y = (xf - mean.view(view)) * torch.rsqrt(var.view(view) + self.eps)
        if self.affine:
            y = y * self.weight.view(view).to(y.dtype) + self.bias.view(view).to(y.dtype)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"unbiased={self.unbiased}, affine={self.affine}")


class WeightNormLinear(nn.Module):
    r"""A linear layer with weight normalization (eq. 5 with mu = 0, sigma = ||w_i||; chapter 4).

    .. math:: h_i = \frac{g_i}{\lVert w_i \rVert_2} w_i^\top x + b_i

    Args: in_features, out_features, bias, device, dtype as :class:`torch.nn.Linear`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features = check_size("in_features", in_features)
        self.out_features = check_size("out_features", out_features)
        check_bool("bias", bias)
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.gain = nn.Parameter(torch.empty(out_features, **kw))
        self.register_parameter(
            "bias", nn.Parameter(torch.empty(out_features, **kw)) if bias else None)
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
            raise ShapeError(f"WeightNormLinear expects input of shape (*, {self.in_features}), "
                             f"got {tuple(x.shape)}")
        w = self.weight * (self.gain / self.weight.norm(dim=1)).unsqueeze(1)  # (H, in)
        return F.linear(x, w, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
