r"""Layer normalization's mathematics, once: eq. 3's forward and chapter 3's backward, on rows.

Paper section 3; chapter 3 (`03_layer_norm`). A tensor ``(R, D)`` holds one example per row
(:func:`as_rows`, :func:`from_rows` convert)::

    mu = 1/D sum_i x_i,   sigma^2 = 1/D sum_i (x_i - mu)^2,   x_hat = (x - mu) / sqrt(sigma^2 + eps)
    y = x_hat * g + b                                                    (eqs. 3, 15)
    u = dL/dy * g:   dL/dx = (u - mean(u) - x_hat * mean(u * x_hat)) / sigma
                     dL/dg = sum_rows dL/dy * x_hat,   dL/db = sum_rows dL/dy

Keywords of :func:`normalize` and :func:`layer_norm_backward` give the variants the book
teaches (``center=False`` RMSNorm; the mistakes ``unbiased``, ``eps_inside=False``,
``one_pass``; ``detach`` DetachNorm; ``stats_dtype``, float32 for half inputs by default).
Two passes for the variance; all differentiable torch ops (:mod:`lnbook.reference` checks them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from lnbook.checks import ShapeError, check_floating

__all__ = ["as_rows", "from_rows", "normalize", "affine", "layer_norm_forward",
           "layer_norm_backward"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _dims(ndim: int, dims: int | Sequence[int]) -> tuple[int, ...]:
    """``dims`` as sorted non-negative axes of a tensor with ``ndim`` dimensions."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = sorted({d % ndim if -ndim <= d < ndim else -1 for d in dims})
    if not dims or -1 in out or len(out) != len(dims):
        raise ShapeError(f"dims must name distinct axes of a {ndim}-d tensor, got {dims}")
    return tuple(out)


def as_rows(x: Tensor, dims: int | Sequence[int] = -1) -> Tensor:
    """``x`` as rows ``(R, D)``: D the size of ``dims`` together, R the rest (a view if it can)."""
    axes = _dims(x.dim(), dims)
    d = math.prod(x.shape[a] for a in axes)
    rest = tuple(a for a in range(x.dim()) if a not in axes)
    if axes != tuple(range(len(rest), x.dim())):  # not trailing: move them there
        x = x.permute(*rest, *axes)
    return x.reshape(-1, d)


def from_rows(rows: Tensor, shape: Sequence[int], dims: int | Sequence[int] = -1) -> Tensor:
    """The inverse of :func:`as_rows`: rows ``(R, D)`` back to ``shape``, ``dims`` in place."""
    axes = _dims(len(shape), dims)
    rest = tuple(a for a in range(len(shape)) if a not in axes)
    order = (*rest, *axes)
    y = rows.reshape([shape[a] for a in order])
    if order != tuple(range(len(shape))):
        y = y.permute(*sorted(range(len(order)), key=order.__getitem__))
    return y


def normalize(x: Tensor, eps: float = 1e-5, *, center: bool = True, unbiased: bool = False,
              eps_inside: bool = True, one_pass: bool = False, detach: bool = False,
              stats_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """Eq. 3 for each row: ``x_hat = (x - mu) / sqrt(sigma^2 + eps)`` and ``rstd``.

    Args:
        x: rows ``(R, D)``. eps: 0 allowed.
        center, unbiased, eps_inside, one_pass, detach, stats_dtype: the variants of the module
            docstring (defaults: the paper's and torch's computation).

    Returns:
        ``x_hat (R, D)`` in ``stats_dtype`` and ``rstd (R, 1) = 1 / sqrt(sigma^2 + eps)`` (or
        ``1 / (sigma + eps)``). Without autograd recording, temporaries are written in place.
    """
    check_floating(x, "x")
    if x.dim() != 2:
        raise ShapeError(f"x must be rows (R, D) (see lnbook.functional.as_rows), got shape "
                         f"{tuple(x.shape)}")
    if stats_dtype is None:
        stats_dtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
    if x.dtype != stats_dtype:
        x = x.to(stats_dtype)  # (R, D)
    d = x.shape[1]
    n = d - 1 if unbiased else d
    if n < 1:
        raise ShapeError(f"the unbiased variance needs D >= 2 values per row, got D={d}")
    if detach:  # the values without a graph, plus (x - x.detach()) * rstd: exactly 0, whose
        with torch.no_grad():  # gradient is that of (x - mu) * rstd with mu and rstd constant
            x_hat, rstd = normalize(x, eps, center=center, unbiased=unbiased,
                                    eps_inside=eps_inside, one_pass=one_pass)
        return x_hat + (x - x.detach()) * rstd, rstd
    own = not torch.is_grad_enabled()  # no graph: temporaries may be written over
    if not center:  # RMSNorm: the root mean square, no temporary x^2
        ms = torch.linalg.vector_norm(x, dim=1, keepdim=True).square() / n  # (R, 1)
        rstd = _rstd(ms, eps, eps_inside)  # (R, 1)
        return x * rstd, rstd
    mu = x.mean(dim=1, keepdim=True)  # (R, 1)
    xc = x - mu  # (R, D) centred first
    if one_pass:  # the mistake: E[x^2] - E[x]^2, times D
        ss = x.square().sum(dim=1, keepdim=True) - d * mu.square()  # (R, 1)
    else:
        mu_err = xc.mean(dim=1, keepdim=True)  # (R, 1) what the first mean missed
        xc = xc.sub_(mu_err) if own else xc - mu_err  # (R, D) exactly centred
        ss = torch.linalg.vector_norm(xc, dim=1, keepdim=True).square()  # (R, 1)
    if own and eps_inside:  # the same ops on the (R, 1) temporaries, without new tensors
        rstd = ss.div_(n).add_(eps).rsqrt_()  # (R, 1) 1 / sigma
        return xc.mul_(rstd), rstd
    rstd = _rstd(ss / n, eps, eps_inside)  # (R, 1) 1 / sigma
    return (xc.mul_(rstd) if own else xc * rstd), rstd


def _rstd(var: Tensor, eps: float, eps_inside: bool) -> Tensor:
    """``1 / sqrt(var + eps)``, or ``1 / (sqrt(var) + eps)``: (R, 1)."""
    return torch.rsqrt(var + eps) if eps_inside else (var.sqrt() + eps).reciprocal()


def affine(x_hat: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """Eq. 15: ``y = x_hat * g + b`` for rows; ``weight``, ``bias`` ``(D,)`` or None."""
    w = None if weight is None else weight.to(x_hat.dtype)  # (D,)
    b = None if bias is None else bias.to(x_hat.dtype)  # (D,)
    if w is not None:
        return torch.addcmul(b, x_hat, w) if b is not None else x_hat * w  # (R, D)
    return x_hat + b if b is not None else x_hat.clone()  # (R, D): y is not x_hat itself


def layer_norm_forward(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
                       eps: float = 1e-5, **variant: object) -> tuple[Tensor, Tensor, Tensor]:
    """Eqs. 3 and 15 for rows: ``(y, x_hat, rstd)``; ``variant``: :func:`normalize`'s keywords."""
    x_hat, rstd = normalize(x, eps, **variant)  # type: ignore[arg-type]
    return affine(x_hat, weight, bias), x_hat, rstd


def layer_norm_backward(grad_y: Tensor, x_hat: Tensor, rstd: Tensor, weight: Tensor | None = None,
                        *, center: bool = True, unbiased: bool = False, eps_inside: bool = True,
                        eps: float = 1e-5, detach: bool = False,
                        params: bool = True) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The backward of eqs. 3 and 15 (chapter 3) for rows ``(R, D)``.

    ``dL/dx = (u - mean(u) - x_hat * mean(u * x_hat)) / sigma`` with ``u = dL/dy * g``. The
    :func:`normalize` keywords change it: ``center=False`` drops ``- mean(u)``; ``unbiased`` takes
    the second mean over ``D - 1``; ``eps_inside=False`` scales it by ``(sigma + eps) / sigma``;
    ``detach`` keeps ``u / sigma``.

    Args:
        grad_y: ``(R, D)``. x_hat, rstd: from :func:`normalize`. weight: ``g`` ``(D,)`` or None.
        params: False skips ``dL/dg``, ``dL/db`` (returned as None).

    Returns: ``(dL/dx (R, D), dL/dg (D,), dL/db (D,))``; differentiable again (vmap-safe in-place
    steps).
    """
    d = grad_y.shape[1]
    n = d - 1 if unbiased else d
    w = weight
    if not params:  # dL/dx alone (the hand BPTT's many small rows): the fewest operations
        u = grad_y if w is None else grad_y * w  # (R, D)
        if detach:
            return u * rstd, None, None
        s_ux = torch.linalg.vecdot(u, x_hat).unsqueeze(1)  # (R, 1) sum(u * x_hat)
        if not eps_inside:
            s_ux = s_ux / (1 - eps * rstd)
        grad_x = torch.addcmul(u, x_hat, s_ux, value=-1.0 / n)  # (R, D) u - x_hat mean(u x_hat)
        if center:
            grad_x = grad_x.sub_(u.sum(dim=1, keepdim=True), alpha=1.0 / d)  # - mean(u)
        return grad_x.mul_(rstd), None, None
    gy_x_hat = grad_y * x_hat  # (R, D) dL/dy * x_hat
    grad_w = gy_x_hat.sum(dim=0)  # (D,)
    grad_b = grad_y.sum(dim=0)  # (D,)
    if detach:  # mu and sigma are constants: u / sigma
        del gy_x_hat
        return (grad_y if w is None else grad_y * w) * rstd, grad_w, grad_b
    mean_u: Tensor | None = None
    if w is None:  # u = dL/dy
        if center:
            mean_u = grad_y.mean(dim=1, keepdim=True)  # (R, 1)
        mean_ux = (gy_x_hat.mean(dim=1, keepdim=True) if n == d
                   else gy_x_hat.sum(dim=1, keepdim=True) / n)  # (R, 1)
    else:  # row means of u = dL/dy * g and of u * x_hat, as products with g
        if center:
            mean_u = (grad_y @ w).unsqueeze(1) / d  # (R, 1)
        mean_ux = (gy_x_hat @ w).unsqueeze(1) / n  # (R, 1)
    del gy_x_hat  # freed before the next (R, D) tensor is made, which can reuse its memory
    if not eps_inside:  # sigma moves the denominator sigma + eps: (sigma + eps) / sigma
        mean_ux = mean_ux / (1 - eps * rstd)
    if w is None:
        grad_x = (x_hat * mean_ux).sub_(grad_y)  # (R, D) x_hat * mean(u x_hat) - u
    else:
        grad_x = torch.addcmul(x_hat * mean_ux, grad_y, w, value=-1)  # (R, D) the same
    if mean_u is not None:
        grad_x = grad_x.add_(mean_u)
    return grad_x.mul_(-rstd), grad_w, grad_b  # (u - mean(u) - x_hat mean(u x_hat)) / sigma

