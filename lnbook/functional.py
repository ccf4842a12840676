r"""Layer normalization's mathematics, once: the forward of eq. 3 and the backward of chapter 3.

Paper (Ba, Kiros and Hinton, 2016) section 3 and supplement; book chapter 3 (`03_layer_norm`).
For one example, the ``H`` summed inputs ``a_1 .. a_H`` of a layer share one mean and one
standard deviation::

    mu = 1/H sum_i a_i,        sigma = sqrt( 1/H sum_i (a_i - mu)^2 )           (eq. 3)

    LN(z; alpha, beta) = (z - mu) / sigma * alpha + beta                         (eq. 15)

(eq. 16 is eq. 3 again, for the ``D`` entries of ``z``). As torch computes it, ``eps`` is added
to the variance inside the square root, so the normalized input is
``x_hat = (x - mu) / sqrt(sigma^2 + eps)`` and ``y = x_hat * g + b``. The backward pass that
chapter 3 derives, with ``u = dL/dy * g`` the gradient that reaches ``x_hat``::

    dL/dx = (u - mean(u) - x_hat * mean(u * x_hat)) / sigma                       (chapter 3)
    dL/dg = sum over rows of dL/dy * x_hat,         dL/db = sum over rows of dL/dy

Everything here works on **rows**: a tensor ``(R, D)``, one example per row and the ``D``
numbers it is normalized over along it. :func:`as_rows` makes rows out of a tensor of any shape
for any set of normalized dimensions and :func:`from_rows` puts them back. The variants the
book teaches are keyword arguments of :func:`normalize` and :func:`layer_norm_backward`; the
default is always the paper's (and torch's) choice:

====================  ===========================================================================
``center=False``      no mean: ``mu = 0`` and sigma the root mean square (RMSNorm, Part II)
``unbiased=True``     the variance divided by ``D - 1`` (``torch.var``'s default; a mistake)
``eps_inside=False``  ``(x - mu) / (sigma + eps)`` (older code; a mistake, NaN gradient at 0)
``one_pass=True``     ``sigma^2 = E[x^2] - E[x]^2`` (a mistake: cancels in float32 at a large mean)
``detach=True``       mu and sigma are constants to autograd (DetachNorm, Xu et al. 2019)
``stats_dtype``       the statistics' dtype: float32 for float16/bfloat16 inputs unless told
====================  ===========================================================================

The right computation is numerically careful: two passes (the mean, then the mean of what the
first mean missed, then the variance of the centred row; never ``E[x^2] - E[x]^2``), in float32
for half-precision inputs, and a constant row gives ``x_hat = 0`` exactly. Every function is
made of differentiable torch operations, so autograd differentiates through :func:`normalize`
(the variants' gradients are autograd's) and through :func:`layer_norm_backward` (second
derivatives). :func:`lnbook.layer_norm`, the hand BPTT of :mod:`lnbook.bptt`,
:func:`lnbook.rms_norm`, :func:`lnbook.group_norm`, the checkers of :mod:`lnbook.exercises`
and the mistakes of :mod:`lnbook.experiments.mistakes` all call this module;
:func:`lnbook.reference.layer_norm_numpy` does not, on purpose: it is the independent float64
check.

Example::

    >>> x = torch.randn(4, 10)                      # (R, D) four examples, ten units
    >>> x_hat, rstd = normalize(x)                  # eq. 3: (4, 10), (4, 1)
    >>> y = affine(x_hat, torch.ones(10), torch.zeros(10))  # eq. 15
    >>> dx, dg, db = layer_norm_backward(torch.randn(4, 10), x_hat, rstd, torch.ones(10))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from lnbook.checks import ShapeError, check_floating

__all__ = [
    "as_rows",
    "from_rows",
    "normalize",
    "affine",
    "layer_norm_forward",
    "layer_norm_backward",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _dims(ndim: int, dims: int | Sequence[int]) -> tuple[int, ...]:
    """``dims`` as sorted non-negative axes of a tensor with ``ndim`` dimensions."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = sorted({d % ndim if -ndim <= d < ndim else -1 for d in dims})
    if not dims or -1 in out or len(out) != len(dims):
        raise ShapeError(f"dims must name distinct axes of a {ndim}-d tensor, got {dims}")
    return tuple(out)


def as_rows(x: Tensor, dims: int | Sequence[int] = -1) -> Tensor:
    """``x`` as rows ``(R, D)``: ``D`` the product of the sizes of ``dims``, ``R`` the rest.

    Args:
        x: any tensor with at least one dimension.
        dims: the dimensions normalized over (layer norm: the trailing ones; the batch
            dimension 0 gives batch norm's statistics, a mistake the checkers name).

    A view where the memory allows (``dims`` trailing and ``x`` contiguous).

    Example::

        >>> as_rows(torch.zeros(2, 3, 5), (1, 2)).shape  # one row per example
        torch.Size([2, 15])
    """
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


def _check_rows(x: Tensor, what: str = "x") -> None:
    check_floating(x, what)
    if x.dim() != 2:
        raise ShapeError(f"{what} must be rows (R, D) (see lnbook.functional.as_rows), got "
                         f"shape {tuple(x.shape)}")


def normalize(
    x: Tensor,
    eps: float = 1e-5,
    *,
    center: bool = True,
    unbiased: bool = False,
    eps_inside: bool = True,
    one_pass: bool = False,
    detach: bool = False,
    stats_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """Eq. 3 for each row: ``x_hat = (x - mu) / sqrt(sigma^2 + eps)`` and ``rstd``.

    Args:
        x: rows ``(R, D)``, floating point.
        eps: added to the variance inside the square root (``eps_inside``), or to sigma;
            0 is allowed here (no eps at all).
        center: subtract the mean (layer norm); False: ``mu = 0`` (RMSNorm's statistic).
        unbiased: divide the sum of squares by ``D - 1`` instead of ``D``.
        eps_inside: False computes ``(x - mu) / (sigma + eps)``.
        one_pass: the variance as ``E[x^2] - E[x]^2`` (loses every digit at a large mean in
            float32, and can turn negative).
        detach: the mean and the variance are constants to autograd (computed without a
            graph); the forward values are the same.
        stats_dtype: the dtype of the whole computation; None: float32 for float16/bfloat16
            inputs, the input's dtype otherwise.

    Returns:
        ``x_hat (R, D)`` in ``stats_dtype`` and ``rstd (R, 1)``, the reciprocal of the
        denominator (``1 / sqrt(sigma^2 + eps)``, or ``1 / (sigma + eps)``).

    Two passes by default: the mean is taken, the row centred, and the mean of the centred
    row (the rounding error of the first mean, which at a mean of 1e4 in float32 is not small
    next to sigma) taken away, before the variance is formed. Without autograd recording
    (``torch.no_grad``, inside an ``autograd.Function``), its own temporaries are written
    over in place; ``x`` itself never is.

    Example::

        >>> x_hat, rstd = normalize(torch.tensor([[1.0, 2.0, 3.0]]), eps=0.0)
        >>> x_hat
        tensor([[-1.2247,  0.0000,  1.2247]])
    """
    _check_rows(x)
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
    """Eq. 15's gain and bias: ``y = x_hat * g + b`` for rows ``(R, D)``; a new tensor.

    ``weight`` and ``bias`` are ``(D,)`` (None: 1 and 0) and are cast to ``x_hat``'s dtype.
    """
    w = None if weight is None else weight.to(x_hat.dtype)  # (D,)
    b = None if bias is None else bias.to(x_hat.dtype)  # (D,)
    if w is not None:
        return torch.addcmul(b, x_hat, w) if b is not None else x_hat * w  # (R, D)
    return x_hat + b if b is not None else x_hat.clone()  # (R, D): y is not x_hat itself


def layer_norm_forward(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    **variant: object,
) -> tuple[Tensor, Tensor, Tensor]:
    """Eqs. 3 and 15 for rows ``(R, D)``: ``(y, x_hat, rstd)``, in the statistics' dtype.

    ``variant`` holds :func:`normalize`'s keywords (``center``, ``unbiased``, ...). ``x_hat``
    and ``rstd`` are what :func:`layer_norm_backward` reads.

    Example::

        >>> y, x_hat, rstd = layer_norm_forward(torch.randn(4, 10), torch.ones(10))
        >>> y.shape, rstd.shape
        (torch.Size([4, 10]), torch.Size([4, 1]))
    """
    x_hat, rstd = normalize(x, eps, **variant)  # type: ignore[arg-type]
    return affine(x_hat, weight, bias), x_hat, rstd


def layer_norm_backward(
    grad_y: Tensor,
    x_hat: Tensor,
    rstd: Tensor,
    weight: Tensor | None = None,
    *,
    center: bool = True,
    unbiased: bool = False,
    eps_inside: bool = True,
    eps: float = 1e-5,
    detach: bool = False,
    params: bool = True,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The backward of eqs. 3 and 15 derived in chapter 3, for rows ``(R, D)``.

    With ``u = dL/dy * g``::

        dL/dx = (u - mean(u) - x_hat * mean(u * x_hat)) / sigma
        dL/dg = sum over rows of dL/dy * x_hat,    dL/db = sum over rows of dL/dy

    The variants of :func:`normalize`, with the same keywords, change it so:
    ``center=False`` drops ``- mean(u)``; ``unbiased=True`` takes ``mean(u * x_hat)`` over
    ``D - 1``; ``eps_inside=False`` multiplies that term by ``(sigma + eps) / sigma`` (give
    the forward's ``eps``); ``detach=True`` keeps ``u / sigma`` only (no projections);
    ``one_pass`` is the same function in exact arithmetic and needs no keyword.

    Args:
        grad_y: ``dL/dy`` ``(R, D)``.
        x_hat, rstd: what :func:`normalize` returned, ``(R, D)`` and ``(R, 1)``.
        weight: the gain ``g`` ``(D,)`` in ``x_hat``'s dtype, or None for 1.
        params: False skips ``dL/dg`` and ``dL/db`` (returned as None).

    Returns:
        ``(dL/dx (R, D), dL/dg (D,), dL/db (D,))``.

    Every op is a differentiable torch op (autograd can differentiate this backward again).
    The buffer of ``dL/dx`` is made by an op that reads every input (``x_hat``, ``dL/dy`` and,
    through the row means, ``g``) before it is written in place, so that the in-place steps are
    valid under ``torch.func.vmap`` whichever input is batched.

    Example::

        >>> x_hat, rstd = normalize(torch.randn(4, 10))
        >>> dx, dg, db = layer_norm_backward(torch.randn(4, 10), x_hat, rstd)
        >>> dx.sum(1).abs().max() < 1e-5  # shifting a row changes nothing
        tensor(True)
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

