r"""Layer normalization in low precision, measured (Part III, chapter "Low precision").

Each function measures one thing a float16 or bfloat16 layer norm can get wrong, against a
float64 reference, so that the chapter can assert what was measured and the bound that the
dtype's rounding allows. With :math:`u` the unit roundoff of a dtype (half its machine epsilon:
:math:`2^{-11}` for float16, :math:`2^{-8}` for bfloat16, :math:`2^{-24}` for float32), one
rounding of a real number :math:`r` errs by at most half a unit in the last place (ulp) of
:math:`r`, about :math:`u |r|`.

- Statistics: the sum of squares :math:`\sum_i x_i^2` of a row overflows float16 (largest
  finite value 65504) long before the mean square does (:func:`overflow_grid`), and the
  one-pass variance :math:`E[x^2] - E[x]^2` loses the variance of rows whose mean is large
  next to their spread, once :math:`u\,(\mu/\sigma)^2` nears 1, where the two-pass variance
  :math:`E[(x - E[x])^2]` keeps it (:func:`variance_error`).
- The gain and the cast: :math:`y = \mathrm{round}(\hat x g)` (one rounding) against
  :math:`y = \mathrm{round}(\mathrm{round}(\hat x)\, g)` (two), :func:`gain_cast_order`.
- The weight gradient :math:`\partial L/\partial g = \sum_r \partial L/\partial y_r \odot
  \hat x_r`, summed over many rows with the running sum held in low precision or in float32
  (:func:`accumulate_rows`, :func:`weight_grad_error`).
- What :func:`lnbook.layer_norm` and torch's kernels return under ``torch.autocast`` on the
  CPU (:func:`autocast_report`).

An analysis module: it imports :mod:`lnbook.norms` and :mod:`lnbook.variants`; nothing in the
package imports it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_choice, check_floating, check_size
from lnbook.norms import LayerNorm, layer_norm
from lnbook.variants import rms_norm

__all__ = [
    "LOW_PRECISION",
    "unit_roundoff",
    "overflow_threshold",
    "half_ulps",
    "sum_of_squares",
    "overflow_grid",
    "predicted_overflow",
    "largest_safe_magnitude",
    "variance",
    "variance_error",
    "two_pass_bound",
    "CastOrder",
    "gain_cast_order",
    "accumulate_rows",
    "weight_grad_terms",
    "weight_grad_error",
    "stagnation_bound",
    "recursive_sum_bound",
    "kernel_weight_grad_error",
    "AutocastRow",
    "autocast_report",
]

LOW_PRECISION = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or dtype not in _FLOATS:
        raise TypeError(
            f"{name} must be one of torch.float16, torch.bfloat16, torch.float32, "
            f"torch.float64, got {dtype!r}"
        )
    return dtype


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of ``dtype``: the largest relative error of one rounding.

    Example::

        >>> unit_roundoff(torch.bfloat16) == 2.0 ** -8
        True
    """
    return torch.finfo(_check_dtype(dtype)).eps / 2


def overflow_threshold(dtype: torch.dtype) -> float:
    """The smallest real number that rounds to ``inf`` in ``dtype``: the largest finite value
    plus half an ulp there (65504 + 16 = 65520 for float16).

    Example::

        >>> overflow_threshold(torch.float16)
        65520.0
    """
    fi = torch.finfo(_check_dtype(dtype))
    ulp_at_max = 2.0 ** math.floor(math.log2(fi.max)) * fi.eps  # spacing of the top binade
    return fi.max + ulp_at_max / 2


def half_ulps(y: Tensor, ref: Tensor, dtype: torch.dtype, floor: float = 1.0) -> Tensor:
    r"""``|y - ref|`` in units of half an ulp of ``dtype`` at ``max(|ref|, floor)``.

    For :math:`2^e \le |r| < 2^{e+1}` half an ulp is :math:`2^e \epsilon / 2`, so a value that
    is ``ref`` correctly rounded to ``dtype`` scores at most 1 (0 where ``ref`` is exactly
    representable). Below ``floor`` the unit stays that of ``floor``: the outputs of a norm
    have a root mean square of 1, and an error smaller than the rounding of 1 near a zero
    output is not counted as many ulps of that tiny value (``floor=0`` counts it so).

    Args:
        y: the computed values, any dtype.
        ref: the reference (float64), the same shape.
        dtype: whose ulp is the unit.
        floor: the magnitude below which the unit no longer shrinks (>= 0).

    Returns:
        float64 tensor of the shape of ``ref``.
    """
    fi = torch.finfo(_check_dtype(dtype))
    r = ref.double()
    e = torch.floor(torch.log2(r.abs().clamp_min(max(floor, fi.tiny))))  # binade of ref
    return (y.double() - r).abs() / (torch.exp2(e) * fi.eps / 2)


# ----------------------------------------------------------------------------------------------
# (a) statistics: the float16 sum of squares, and one-pass against two-pass variance


def sum_of_squares(x: Tensor, dtype: torch.dtype) -> Tensor:
    r""":math:`\sum_i x_i^2` over the last dimension, written in ``dtype`` as torch runs it.

    ``x`` is rounded to ``dtype``, squared there (each square rounded to ``dtype``) and summed
    with :meth:`torch.Tensor.sum`, whose result is rounded to ``dtype``: on the CPU, torch
    accumulates a float16/bfloat16 sum in float32 internally and rounds once at the end, so it
    overflows exactly when the rounded total does.

    Args:
        x: ``(*, D)`` floating-point rows.
        dtype: the dtype of the computation.

    Returns:
        ``(*)`` in ``dtype``.
    """
    check_floating(x)
    xl = x.to(_check_dtype(dtype))  # (*, D)
    return (xl * xl).sum(-1)  # (*)


def overflow_grid(
    dims: Sequence[int], magnitudes: Sequence[float], dtype: torch.dtype = torch.float16
) -> Tensor:
    """Whether :func:`sum_of_squares` of a row of ``D`` equal values ``a`` is infinite, measured.

    Args:
        dims: the row sizes ``D`` to try.
        magnitudes: the values ``a`` to try (each row is ``D`` copies of ``a``).
        dtype: the dtype of the computation.

    Returns:
        bool tensor ``(len(dims), len(magnitudes))``, True where the sum overflowed.
    """
    out = torch.zeros(len(dims), len(magnitudes), dtype=torch.bool)
    for i, d in enumerate(dims):
        check_size("dim", d)
        rows = torch.tensor(list(magnitudes), dtype=torch.float64)[:, None].expand(-1, d)
        out[i] = ~torch.isfinite(sum_of_squares(rows, dtype))
    return out


def predicted_overflow(
    dims: Sequence[int], magnitudes: Sequence[float], dtype: torch.dtype = torch.float16
) -> Tensor:
    r"""The overflow :func:`overflow_grid` should find, from the rounding rules alone.

    The square of :math:`a` rounded to ``dtype`` is :math:`q = \mathrm{fl}(\mathrm{fl}(a)^2)`;
    :math:`q` itself is infinite if :math:`\mathrm{fl}(a)^2` reaches :func:`overflow_threshold`,
    and the sum :math:`D q` (exact in float64 for these sizes) overflows when it does.

    Returns:
        bool tensor ``(len(dims), len(magnitudes))``.
    """
    a = torch.tensor(list(magnitudes), dtype=torch.float64).to(dtype).double()
    q = (a * a).to(dtype).double()  # (M,) each square rounded, inf if it overflowed
    d = torch.tensor(list(dims), dtype=torch.float64)[:, None]  # (N, 1)
    return (d * q[None, :]) >= overflow_threshold(dtype)


def largest_safe_magnitude(dim: int, dtype: torch.dtype = torch.float16) -> float:
    r"""The root mean square above which a row of ``dim`` values has a sum of squares that
    overflows ``dtype``: :math:`\sqrt{x_{max} / D}` (4.0 for ``dim=4094`` in float16, since
    :math:`4094 \cdot 16 = 65504`).

    Example::

        >>> largest_safe_magnitude(4094)  # 4094 * 4.0 ** 2 == 65504, the largest float16
        4.0
    """
    check_size("dim", dim)
    return math.sqrt(torch.finfo(_check_dtype(dtype)).max / dim)


def variance(
    x: Tensor, dtype: torch.dtype, method: Literal["one-pass", "two-pass"]
) -> Tensor:
    r"""The biased variance of each row, every operation's result rounded to ``dtype``.

    - ``"one-pass"``: :math:`E[x^2] - E[x]^2` (one sweep over the data for both sums);
    - ``"two-pass"``: :math:`E[(x - E[x])^2]` (the mean first, then the centred squares).

    Means are :meth:`torch.Tensor.mean` in ``dtype`` (accumulated in float32 internally on the
    CPU, rounded to ``dtype`` once), so the loss measured here is the formula's, not the sum's.

    Args:
        x: ``(*, D)`` rows (rounded to ``dtype`` first).
        dtype: the dtype of the computation.
        method: ``"one-pass"`` or ``"two-pass"``.

    Returns:
        ``(*)`` in ``dtype``.
    """
    check_floating(x)
    check_choice("method", method, ("one-pass", "two-pass"))
    xl = x.to(_check_dtype(dtype))  # (*, D)
    mean = xl.mean(-1, keepdim=True)  # (*, 1)
    if method == "one-pass":
        return ((xl * xl).mean(-1, keepdim=True) - mean * mean).squeeze(-1)  # (*)
    centred = xl - mean  # (*, D)
    return (centred * centred).mean(-1)  # (*)


def _rows(mean: float, std: float, rows: int, dim: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return mean + std * torch.randn(rows, dim, generator=g, dtype=torch.float64)  # (R, D)


def variance_error(
    mean: float,
    dtype: torch.dtype,
    method: Literal["one-pass", "two-pass"],
    std: float = 1.0,
    rows: int = 16,
    dim: int = 1024,
    seed: int = 0,
) -> float:
    r"""Largest relative error of :func:`variance` over ``rows`` rows of mean ``mean``.

    The rows are ``mean + std * z`` with ``z`` standard normal (from a generator seeded with
    ``seed``), rounded to ``dtype``; the reference is the float64 variance of the *rounded*
    rows, so what is measured is the formula's error, not the input's rounding.

    Returns:
        :math:`\max_r |v_r - v^{64}_r| / v^{64}_r` (``inf`` or ``nan`` if the formula
        overflowed).
    """
    x = _rows(mean, std, rows, dim, seed).to(_check_dtype(dtype))  # (R, D) stored in dtype
    ref = x.double().var(-1, unbiased=False)  # (R,)
    got = variance(x, dtype, method).double()  # (R,)
    return ((got - ref).abs() / ref).max().item()


def two_pass_bound(mean_over_std: float, dtype: torch.dtype, dim: int = 1024) -> float:
    r"""A bound on the relative error of the two-pass :func:`variance` of rows of ``dim``.

    torch sums a row in float32 (also for float16 and bfloat16 inputs), which errs by at most
    :math:`\gamma_{D}` relative in any order (:func:`recursive_sum_bound`), and rounds the mean
    to ``dtype``: the mean is off by :math:`\delta \le (u + \gamma_D)(1 + u)(|\mu| +
    \sigma)` (the sample's own mean lies within about :math:`\sigma` of :math:`\mu`). The
    centred values, their squares and their mean are rounded once each,
    :math:`(1 + u)^3 - 1`, and the mean's error adds :math:`(\delta / \sigma)^2` to the
    result. With a factor 2 of headroom for the float32 sums inside the means:
    :math:`2\,((1 + u)^3 (1 + (\delta/\sigma)^2) - 1)`. For float32 rows the
    :math:`\gamma_D` of an arbitrary summation order dominates, and the bound is loose.
    """
    u = unit_roundoff(dtype)
    g = recursive_sum_bound(check_size("dim", dim), torch.float32)
    shift = ((u + g) * (1 + u) * (abs(mean_over_std) + 1)) ** 2
    return 2 * ((1 + u) ** 3 * (1 + shift) - 1)


# ----------------------------------------------------------------------------------------------
# (b) the gain before or after the cast


@dataclass(frozen=True)
class CastOrder:
    """What :func:`gain_cast_order` measured: the two outputs and their errors.

    Attributes:
        before: ``round(x_hat * g + b)``, the gain applied in float32 and the result cast once
            (torch's kernel, :func:`lnbook.layer_norm`, Gemma 2's RMSNorm).
        after: ``round(round(x_hat) * g) + b`` in ``dtype`` (cast first, then the gain in
            ``dtype``: Llama's and Qwen2's RMSNorm in Hugging Face transformers).
        reference: ``x_hat * g + b`` in float64 from the same stored inputs.
        max_half_ulps_before, max_half_ulps_after: the largest error, in half-ulps of ``dtype``
            at the reference (1 is what one correct rounding can cost).
        exact_before, exact_after: the share of outputs equal to the reference rounded to
            ``dtype`` (correctly rounded).
        differ: the share of outputs where ``before`` and ``after`` differ.
    """

    before: Tensor
    after: Tensor
    reference: Tensor
    max_half_ulps_before: float
    max_half_ulps_after: float
    exact_before: float
    exact_after: float
    differ: float


def gain_cast_order(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    rms: bool = False,
) -> CastOrder:
    r"""Apply the gain before or after casting the normalized row back to ``x.dtype``.

    Both orders normalize in float32, :math:`\hat x = (x - \mu)/\sqrt{\sigma^2 + \epsilon}`
    (or :math:`x / \sqrt{E[x^2] + \epsilon}` with ``rms=True``), then

    - before: :math:`y = \mathrm{fl}(\hat x g + b)`, one rounding;
    - after: :math:`y = \mathrm{fl}(\mathrm{fl}(\mathrm{fl}(\hat x) g) + b)`, the gain and the
      bias applied in ``x.dtype``, so up to three roundings.

    Args:
        x: ``(*, D)`` in float16 or bfloat16 (the stored activations).
        weight: ``(D,)`` the gain, cast to ``x.dtype`` (a low-precision model stores it so).
        bias: ``(D,)`` or None, cast likewise.
        eps: added to the variance (mean square) inside the square root.
        rms: normalize as RMSNorm (no mean) instead of layer norm.

    Returns:
        :class:`CastOrder`.
    """
    check_floating(x)
    if x.dtype not in LOW_PRECISION:
        raise TypeError(f"x must be float16 or bfloat16, got {x.dtype}")
    dt = x.dtype
    w = weight.to(dt)  # (D,) as stored
    b = None if bias is None else bias.to(dt)  # (D,)

    def normalize(v: Tensor) -> Tensor:  # (*, D) -> (*, D), in v's dtype
        if rms:
            return v * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)
        return F.layer_norm(v, v.shape[-1:], eps=eps)

    x_hat = normalize(x.float())  # (*, D) float32
    before = x_hat * w.float() + (0.0 if b is None else b.float())  # (*, D) float32
    before = before.to(dt)
    after = w * x_hat.to(dt)  # (*, D) in dt: product rounded
    after = after if b is None else after + b  # the sum rounded again
    ref = normalize(x.double()) * w.double() + (0.0 if b is None else b.double())
    hb, ha = half_ulps(before, ref, dt), half_ulps(after, ref, dt)
    exact = ref.to(dt)  # (*, D) the reference correctly rounded
    return CastOrder(
        before=before,
        after=after,
        reference=ref,
        max_half_ulps_before=hb.max().item(),
        max_half_ulps_after=ha.max().item(),
        exact_before=(before == exact).double().mean().item(),
        exact_after=(after == exact).double().mean().item(),
        differ=(before != after).double().mean().item(),
    )


# ----------------------------------------------------------------------------------------------
# (c) the weight gradient summed over many rows


def accumulate_rows(
    terms: Tensor, acc_dtype: torch.dtype, chunk: int = 1, at: Sequence[int] | None = None
) -> Tensor:
    r""":math:`\sum_r t_r` over the rows of ``terms``, the running sum held in ``acc_dtype``.

    The rows are taken ``chunk`` at a time (a micro-batch, or one kernel call): each chunk is
    summed in float32, added to the running sum, and the result rounded to ``acc_dtype`` before
    the next chunk, as when gradients are accumulated into a ``.grad`` of that dtype (torch's
    in-place ``add_`` of a float32 tensor into one of ``acc_dtype`` adds in float32 and rounds
    once). With ``chunk=1`` every row's term is rounded into the sum: plain recursive
    summation in ``acc_dtype``.

    Args:
        terms: ``(R, D)`` float32 (or float64) terms.
        acc_dtype: the dtype of the running sum.
        chunk: rows per chunk; must divide ``R`` and every entry of ``at``.
        at: row counts after which to record the running sum (the sums of the first ``n``
            rows, for each ``n``); None for ``[R]``.

    Returns:
        ``(len(at), D)`` in ``acc_dtype`` (``(1, D)`` for ``at=None``).
    """
    check_floating(terms, "terms")
    check_size("chunk", chunk)
    r, d = terms.shape
    at = [r] if at is None else list(at)
    for n in at:
        check_size("at", n)
        if n > r or n % chunk:
            raise ValueError(f"each entry of at must be a multiple of chunk={chunk} and at "
                             f"most the number of rows {r}, got {n}")
    if r % chunk:
        raise ValueError(f"chunk must divide the number of rows {r}, got {chunk}")
    parts = terms.float().reshape(r // chunk, chunk, d).sum(1)  # (R/chunk, D) float32
    acc = torch.zeros(d, dtype=_check_dtype(acc_dtype, "acc_dtype"))  # (D,)
    marks = {n // chunk for n in at}
    out = {}
    for i, p in enumerate(parts.unbind(0), start=1):
        acc.add_(p)  # float32 sum, rounded to acc_dtype
        if i in marks:
            out[i] = acc.clone()
    return torch.stack([out[n // chunk] for n in at])  # (len(at), D)


def weight_grad_terms(rows: int, dim: int, dtype: torch.dtype, seed: int = 0) -> Tensor:
    r"""The per-row terms :math:`\partial L/\partial y_r \odot \hat x_r` of :math:`\partial L /
    \partial g` for the loss :math:`L = \tfrac12 \sum_r \|y_r\|^2` at :math:`g = 1, b = 0`.

    There :math:`\partial L/\partial y_r = y_r = \hat x_r`, so each term is :math:`\hat x^2
    \ge 0` and :math:`\partial L/\partial g_j = \sum_r \hat x_{rj}^2` (whose columns sum to
    ``rows * dim``). :math:`\hat x` comes from standard normal rows and is stored in ``dtype``,
    as a low-precision layer would hand it on; the product of two float16 or bfloat16 numbers
    is exact in float32, so the terms carry no rounding and every error measured from them is
    the summation's.

    Returns:
        ``(rows, dim)`` float32, every entry >= 0.
    """
    check_size("rows", rows)
    check_size("dim", dim)
    x = _rows(0.0, 1.0, rows, dim, seed)  # (R, D) float64
    x_hat = F.layer_norm(x, (dim,)).to(_check_dtype(dtype)).float()  # (R, D) stored in dtype
    return x_hat * x_hat  # (R, D) exact in float32


def weight_grad_error(
    terms: Tensor, acc_dtype: torch.dtype, chunk: int = 1, at: Sequence[int] | None = None
) -> list[float]:
    r"""Largest relative error over columns of :func:`accumulate_rows` against float64.

    Args:
        terms, acc_dtype, chunk, at: as for :func:`accumulate_rows`.

    Returns:
        for each row count ``n`` of ``at``: :math:`\max_j |S_j - S^{64}_j| / S^{64}_j`, with
        :math:`S^{64}` the float64 sum of the same first ``n`` terms.
    """
    at = [terms.shape[0]] if at is None else list(at)
    ref = terms.double().cumsum(0)[torch.tensor(at) - 1]  # (len(at), D)
    got = accumulate_rows(terms, acc_dtype, chunk, at).double()  # (len(at), D)
    return ((got - ref).abs() / ref.abs()).amax(1).tolist()


def stagnation_bound(max_term: float, dtype: torch.dtype) -> float:
    r"""The most a running sum in ``dtype`` of terms in :math:`[0, T]` can ever reach.

    Once the sum :math:`s` is at least :math:`S^* = 2^{\lceil \log_2 (2T/u) \rceil}` (the first
    power of two with :math:`u S^* \ge 2T`), half an ulp of :math:`s` is at least :math:`2T`,
    so :math:`s + t` with :math:`t \le T` rounds back to :math:`s` (the float32 addition
    before it cannot pass :math:`s` plus half an ulp, a float32 number above the exact sum): the
    sum stops. Before that it is below :math:`S^*`, and its last step adds at most :math:`T`
    and one rounding: :math:`s \le (S^* + T)(1 + 2u)`, whatever the number of terms.

    Example::

        >>> stagnation_bound(1.0, torch.bfloat16)  # (512 + 1) * (1 + 2 ** -7)
        517.0078125
    """
    u = unit_roundoff(dtype)
    s_star = 2.0 ** math.ceil(math.log2(2 * max_term / u))
    return (s_star + max_term) * (1 + 2 * u)


def recursive_sum_bound(n: int, dtype: torch.dtype) -> float:
    r""":math:`\gamma_{n} = n u / (1 - n u)`: the relative error bound of a sum of :math:`n + 1`
    non-negative terms in ``dtype``, in any order (Higham, *Accuracy and Stability of
    Numerical Algorithms*, section 4.2)."""
    nu = n * unit_roundoff(dtype)
    if nu >= 1:
        return math.inf
    return nu / (1 - nu)


def kernel_weight_grad_error(
    rows: int,
    dim: int,
    dtype: torch.dtype = torch.bfloat16,
    impl: Literal["lnbook", "torch"] = "lnbook",
    seed: int = 0,
    weight_dtype: torch.dtype | None = None,
) -> float:
    r"""Largest relative error over columns of the weight gradient that a layer-norm kernel
    returns for ``dtype`` inputs and weights, against float64.

    The loss is :math:`L = \sum_r y_r \cdot \mathrm{sg}(y_r)` with :math:`\mathrm{sg}(y)` the
    output itself, detached (so :math:`\partial L / \partial y = y`, stored in ``dtype``, and
    every term :math:`y \hat x \ge 0`). The reference sums the same stored :math:`y` times the
    float64 :math:`\hat x` of the stored input, in float64.

    Args:
        rows, dim: the input's shape ``(rows, dim)``.
        dtype: float16 or bfloat16, for input and weight.
        impl: ``"lnbook"`` (:func:`lnbook.layer_norm`, the backward of chapter 3) or
            ``"torch"`` (:func:`torch.nn.functional.layer_norm`).
        seed: seeds the generator of the standard normal input.
        weight_dtype: the weight's dtype; None for ``dtype`` (a model stored in low
            precision), ``torch.float32`` for the weights of mixed precision (autocast).

    Returns:
        :math:`\max_j |G_j - G^{64}_j| / G^{64}_j`.
    """
    check_choice("impl", impl, ("lnbook", "torch"))
    x = _rows(0.0, 1.0, rows, dim, seed).to(_check_dtype(dtype))  # (R, D)
    wdt = dtype if weight_dtype is None else _check_dtype(weight_dtype, "weight_dtype")
    w = torch.ones(dim, dtype=wdt, requires_grad=True)  # (D,)
    fn: Callable[..., Tensor] = layer_norm if impl == "lnbook" else F.layer_norm
    y = fn(x, (dim,), w)  # (R, D) in dtype
    y.backward(y.detach())
    x_hat64 = F.layer_norm(x.double(), (dim,))  # (R, D)
    ref = (y.detach().double() * x_hat64).sum(0)  # (D,)
    return ((w.grad.double() - ref).abs() / ref.abs()).max().item()


# ----------------------------------------------------------------------------------------------
# (d) autocast on the CPU


@dataclass(frozen=True)
class AutocastRow:
    """One implementation under ``torch.autocast("cpu", dtype)``, measured.

    Attributes:
        name: the implementation.
        input_dtype: the dtype of its input (the output of a ``nn.Linear`` under autocast).
        output_dtype: the dtype it returned.
        grad_dtype: the dtype of its weight's gradient (None: no weight).
        max_half_ulps: the largest error of its output against float64, in half-ulps of
            ``dtype``, on rows of mean 1000 and spread 1 (at most about 1 if the
            statistics are computed in float32 from the stored input; hundreds if they were
            rounded to ``dtype``).
    """

    name: str
    input_dtype: torch.dtype
    output_dtype: torch.dtype
    grad_dtype: torch.dtype | None
    max_half_ulps: float


def _naive_layer_norm(x: Tensor, weight: Tensor) -> Tensor:
    """Eq. 3 written out with tensor operations in ``x``'s dtype (the statistics are rounded)."""
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * weight


def autocast_report(
    dtype: torch.dtype = torch.bfloat16, dim: int = 256, rows: int = 64, mean: float = 1000.0
) -> list[AutocastRow]:
    r"""Run each layer-norm implementation on the output of a ``nn.Linear`` under
    ``torch.autocast("cpu", dtype)``, and record what comes out.

    The Linear is the identity plus a bias of ``mean``, so its output (in ``dtype``, as autocast
    runs a Linear) is the rows :math:`\mu + z` rounded to ``dtype``; the reference normalizes
    that stored output in float64. The parameters are float32 (autocast leaves them so), their
    gradients come from ``out.float().sum()``.

    Returns:
        one :class:`AutocastRow` per implementation: ``lnbook.layer_norm``,
        ``lnbook.LayerNorm(impl="torch")``, ``F.layer_norm``, ``nn.LayerNorm``,
        ``lnbook.rms_norm``, ``F.rms_norm`` and eq. 3 written out in tensor operations.
    """
    _check_dtype(dtype)
    check_size("dim", dim)
    lin = nn.Linear(dim, dim)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(dim))
        lin.bias.fill_(mean)
    z = _rows(0.0, 1.0, rows, dim, 0).float()  # (R, D)
    w = torch.ones(dim, requires_grad=True)
    impls: list[tuple[str, Callable[[Tensor], Tensor], bool]] = [
        ("lnbook.layer_norm", lambda h: layer_norm(h, dim, w), False),
        ("lnbook.LayerNorm(impl='torch')", LayerNorm(dim, impl="torch"), False),
        ("F.layer_norm", lambda h: F.layer_norm(h, (dim,), w), False),
        ("nn.LayerNorm", nn.LayerNorm(dim), False),
        ("lnbook.rms_norm", lambda h: rms_norm(h, dim, w), True),
        ("F.rms_norm", lambda h: F.rms_norm(h, (dim,), w), True),
        ("eq. 3 in tensor ops", lambda h: _naive_layer_norm(h, w), False),
    ]
    report = []
    for name, fn, rms in impls:
        params = list(fn.parameters()) if isinstance(fn, nn.Module) else [w]
        for p in params:
            p.grad = None
        with torch.autocast("cpu", dtype=dtype), warnings.catch_warnings():
            # F.rms_norm warns that a float32 weight with a low-precision input cannot use
            # its fused kernel; it computes the same values without it
            warnings.filterwarnings("ignore", "Mismatch dtype", UserWarning)
            h = lin(z)  # (R, D) in dtype
            out = fn(h)  # (R, D)
        out.float().sum().backward()
        h64 = h.detach().double()
        if rms:
            ref = h64 * torch.rsqrt(h64.square().mean(-1, keepdim=True))
        else:
            ref = F.layer_norm(h64, (dim,), eps=1e-5)
        err = half_ulps(out.detach(), ref, dtype).max().item()
        grad = params[0].grad
        report.append(AutocastRow(name, h.dtype, out.dtype,
                                  None if grad is None else grad.dtype, err))
    return report
