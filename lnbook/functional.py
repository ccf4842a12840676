r"""Layer normalization's mathematics, once: eq. 3's forward and chapter 3's backward, on rows.

Paper section 3; chapter 3 (`03_layer_norm`). A tensor ``(R, D)`` holds one example per row
(:func:`as_rows`, :func:`from_rows` convert)::

    mu = 1/D sum_i x_i,   sigma^2 = 1/D sum_i (x_i - mu)^2,   x_hat = (x - mu) / sqrt(sigma^2 + eps)
    y = x_hat * g + b                                                    (eqs. 3, 15)
    u = dL/dy * g:   dL/dx = (u - mean(u) - x_hat * mean(u * x_hat)) / sigma
                     dL/dg = sum_rows dL/dy * x_hat,   dL/db = sum_rows dL/dy

:func:`normalize` is eq. 3 in four steps (the statistics' dtype, ``x - mu``, ``sigma^2``,
``1 / sqrt(sigma^2 + eps)``). Beside it, each variant the book teaches is the same function with
one step changed: :func:`rms_normalize` (RMSNorm, no mean), the mistakes
:func:`normalize_unbiased` (``D - 1``), :func:`normalize_eps_outside` (``sigma + eps``),
:func:`normalize_one_pass` (``E[x^2] - E[x]^2``) and :func:`normalize_in_input_dtype` (float16
statistics), and :func:`normalize_detached` (DetachNorm). Float32 statistics for half inputs
come from one place, :func:`statistics_dtype`. Keywords of :func:`layer_norm_backward` give the
backward of each variant. All differentiable torch ops (:mod:`lnbook.reference` checks them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from lnbook.checks import ShapeError, check_floating

__all__ = ["as_rows", "from_rows", "check_rows", "statistics_dtype", "statistics_rows", "centre",
           "sum_of_squares", "sum_of_squares_one_pass", "normalize", "rms_normalize",
           "normalize_unbiased", "normalize_eps_outside", "normalize_one_pass",
           "normalize_in_input_dtype", "normalize_detached", "batch_normalize", "affine",
           "layer_norm_forward", "layer_norm_backward"]

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


def check_rows(x: Tensor) -> Tensor:
    """``x`` itself, once checked to be floating-point rows ``(R, D)``."""
    check_floating(x, "x")
    if x.dim() != 2:
        raise ShapeError(f"x must be rows (R, D) (see lnbook.functional.as_rows), got shape "
                         f"{tuple(x.shape)}")
    return x


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a norm computes its statistics in for inputs of ``dtype``: float32 for float16
    and bfloat16 (in float16, ``x^2`` overflows from ``|x| >= 256``), else ``dtype`` itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def statistics_rows(x: Tensor) -> Tensor:
    """Checked rows ``(R, D)`` in :func:`statistics_dtype`."""
    dtype = statistics_dtype(check_rows(x).dtype)
    return x if x.dtype == dtype else x.to(dtype)


def centre(x: Tensor) -> Tensor:
    """``x - mu`` for rows ``(R, D)``, in two passes: the mean of what the first subtraction left
    (rounding) is taken away again, so that the rows sum to 0 as nearly as the dtype allows."""
    xc = x - x.mean(dim=1, keepdim=True)  # (R, D)
    mu_err = xc.mean(dim=1, keepdim=True)  # (R, 1) what the first mean missed
    return xc.sub_(mu_err) if _no_graph() else xc - mu_err


def sum_of_squares(x: Tensor) -> Tensor:
    """``sum_i x_i^2`` of each row: ``(R, 1)``, without an ``(R, D)`` temporary ``x^2``."""
    return torch.linalg.vector_norm(x, dim=1, keepdim=True).square()


def sum_of_squares_one_pass(x: Tensor, mu: Tensor) -> Tensor:
    """``sum_i (x_i - mu)^2`` of each row as ``sum_i x_i^2 - D mu^2`` (``E[x^2] - E[x]^2``, times
    ``D``), ``mu`` the rows' means ``(R, 1)``: one pass over the data, and cancellation when the
    mean is large against the spread."""
    return x.square().sum(dim=1, keepdim=True) - x.shape[1] * mu.square()  # (R, 1)


def _no_graph() -> bool:
    """No autograd graph is recorded: a fresh temporary may be overwritten in place."""
    return not torch.is_grad_enabled()


def _rsqrt(var: Tensor, eps: float) -> Tensor:
    """``1 / sqrt(var + eps)``, written into the fresh ``var`` when no graph is recorded."""
    return var.add_(eps).rsqrt_() if _no_graph() else torch.rsqrt(var + eps)


def _times(xc: Tensor, rstd: Tensor) -> Tensor:
    """``xc * rstd``, written into the fresh ``xc`` when no graph is recorded."""
    return xc.mul_(rstd) if _no_graph() else xc * rstd


def normalize(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """Eq. 3 for each row: ``x_hat = (x - mu) / sqrt(sigma^2 + eps)``, and ``rstd``.

    Args:
        x: rows ``(R, D)``, floating point. eps: added to the variance; 0 allowed.

    Returns:
        ``x_hat (R, D)`` and ``rstd = 1 / sqrt(sigma^2 + eps) (R, 1)``, in float32 for float16
        and bfloat16 inputs (:func:`statistics_rows`), else in ``x``'s dtype.
    """
    x = statistics_rows(x)  # (R, D)
    xc = centre(x)  # (R, D) x - mu
    var = sum_of_squares(xc) / x.shape[1]  # (R, 1) sigma^2: the mean of (x - mu)^2
    rstd = _rsqrt(var, eps)  # (R, 1) 1 / sqrt(sigma^2 + eps)
    return _times(xc, rstd), rstd


# The variants the book teaches: each is normalize with one step changed (marked <-).


def rms_normalize(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """RMSNorm's statistic (Zhang and Sennrich 2019): ``x / sqrt(mean(x^2) + eps)``, no mean
    subtracted; ``(x_hat, rstd)`` as :func:`normalize`."""
    x = statistics_rows(x)  # (R, D)
    var = sum_of_squares(x) / x.shape[1]  # (R, 1) <- the mean square of x itself
    rstd = _rsqrt(var, eps)  # (R, 1)
    return x * rstd, rstd


def normalize_unbiased(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """The mistake of ``torch.var``'s default: the variance divided by ``D - 1``, not ``D``
    (outputs ``sqrt((D - 1) / D)`` times eq. 3's when ``eps = 0``); needs ``D >= 2``."""
    x = statistics_rows(x)  # (R, D)
    if x.shape[1] < 2:
        raise ShapeError(f"the unbiased variance needs D >= 2 values per row, got D={x.shape[1]}")
    xc = centre(x)  # (R, D)
    var = sum_of_squares(xc) / (x.shape[1] - 1)  # (R, 1) <- D - 1
    rstd = _rsqrt(var, eps)  # (R, 1)
    return _times(xc, rstd), rstd


def normalize_eps_outside(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """The mistake ``(x - mu) / (sigma + eps)``: ``eps`` added to the standard deviation, outside
    the root; ``rstd = 1 / (sigma + eps)``."""
    x = statistics_rows(x)  # (R, D)
    xc = centre(x)  # (R, D)
    var = sum_of_squares(xc) / x.shape[1]  # (R, 1)
    rstd = (var.sqrt() + eps).reciprocal()  # (R, 1) <- 1 / (sigma + eps)
    return _times(xc, rstd), rstd


def normalize_one_pass(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """The mistake ``sigma^2 = E[x^2] - E[x]^2`` (:func:`sum_of_squares_one_pass`): right in exact
    arithmetic, lost to cancellation in float32 once the mean is large against the spread."""
    x = statistics_rows(x)  # (R, D)
    mu = x.mean(dim=1, keepdim=True)  # (R, 1)
    xc = x - mu  # (R, D) <- one subtraction
    var = sum_of_squares_one_pass(x, mu) / x.shape[1]  # (R, 1) <- E[x^2] - E[x]^2
    rstd = _rsqrt(var, eps)  # (R, 1)
    return _times(xc, rstd), rstd


def normalize_in_input_dtype(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """The mistake of computing the statistics in a float16 or bfloat16 input's own dtype (in
    float16, ``x^2`` overflows from ``|x| >= 256``); eq. 3 otherwise."""
    x = check_rows(x)  # (R, D) <- no float32 for half inputs
    xc = centre(x)  # (R, D)
    var = sum_of_squares(xc) / x.shape[1]  # (R, 1)
    rstd = _rsqrt(var, eps)  # (R, 1)
    return _times(xc, rstd), rstd


def normalize_detached(x: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """Eq. 3's values with ``mu`` and ``sigma`` held constant in the backward (``DetachNorm``,
    chapter 6.8): the gradient is ``dL/dx_hat * rstd`` alone."""
    x = statistics_rows(x)  # (R, D)
    with torch.no_grad():  # <- mu and sigma without a graph
        x_hat, rstd = normalize(x, eps)  # (R, D), (R, 1)
    # (x - x.detach()) * rstd is exactly 0, with the gradient of (x - mu) * rstd, mu and rstd fixed
    return x_hat + (x - x.detach()) * rstd, rstd


def batch_normalize(x: Tensor, ref: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Eq. 2 with sample statistics, the other axis: each column (unit) of ``x`` ``(N, H)``
    standardized by the mean and biased variance of that column over the rows of ``ref``
    ``(M, H)``; ``ref`` None is ``x`` itself (a mini-batch's statistics). Chapter 2's arms of
    claim C03 differ only in ``ref``."""
    ref = x if ref is None else ref
    mu = ref.mean(dim=0)  # (H,) one mean per unit, over the rows of ref
    var = (ref - mu).square().mean(dim=0)  # (H,) biased
    return (x - mu) * torch.rsqrt(var + eps)  # (N, H)


def affine(x_hat: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """Eq. 15: ``y = x_hat * g + b`` for rows; ``weight``, ``bias`` ``(D,)`` or None."""
    w = None if weight is None else weight.to(x_hat.dtype)  # (D,)
    b = None if bias is None else bias.to(x_hat.dtype)  # (D,)
    if w is not None:
        return torch.addcmul(b, x_hat, w) if b is not None else x_hat * w  # (R, D)
    return x_hat + b if b is not None else x_hat.clone()  # (R, D): y is not x_hat itself


def layer_norm_forward(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
                       eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """Eqs. 3 and 15 for rows: ``(y, x_hat, rstd)``."""
    x_hat, rstd = normalize(x, eps)
    return affine(x_hat, weight, bias), x_hat, rstd


def layer_norm_backward(grad_y: Tensor, x_hat: Tensor, rstd: Tensor, weight: Tensor | None = None,
                        *, center: bool = True, unbiased: bool = False, eps_inside: bool = True,
                        eps: float = 1e-5, detach: bool = False,
                        params: bool = True) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The backward of eqs. 3 and 15 (chapter 3) for rows ``(R, D)``.

    ``dL/dx = (u - mean(u) - x_hat * mean(u * x_hat)) / sigma`` with ``u = dL/dy * g``. For the
    forward's variants: ``center=False`` (:func:`rms_normalize`) drops ``- mean(u)``;
    ``unbiased`` (:func:`normalize_unbiased`) takes the second mean over ``D - 1``;
    ``eps_inside=False`` (:func:`normalize_eps_outside`, with its ``eps``) scales it by
    ``(sigma + eps) / sigma``; ``detach`` (:func:`normalize_detached`) keeps ``u / sigma``.

    Args:
        grad_y: ``(R, D)``. x_hat, rstd: from :func:`normalize` or the variant's function.
            weight: ``g`` ``(D,)`` or None.
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

