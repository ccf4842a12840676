r"""Layer normalization in low precision, measured against float64 (Part III, chapter "Low
precision"): float16 overflow of the sum of squares, one-pass against two-pass variance, the gain
before or after the cast, the weight gradient summed over many rows, and what layer norms return
under CPU autocast. :math:`u` is a dtype's unit roundoff (half its machine epsilon).
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
    "LOW_PRECISION", "unit_roundoff", "overflow_threshold", "half_ulps", "sum_of_squares",
    "overflow_grid", "predicted_overflow", "largest_safe_magnitude", "variance",
    "variance_error", "two_pass_bound", "CastOrder", "gain_cast_order", "accumulate_rows",
    "weight_grad_terms", "weight_grad_error", "stagnation_bound", "recursive_sum_bound",
    "kernel_weight_grad_error", "AutocastRow", "autocast_report",
]

LOW_PRECISION = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or dtype not in _FLOATS:
        raise TypeError(f"{name} must be one of torch.float16, torch.bfloat16, torch.float32, "
                        f"torch.float64, got {dtype!r}")
    return dtype


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of ``dtype``: the largest relative error of one rounding."""
    return torch.finfo(_check_dtype(dtype)).eps / 2


def overflow_threshold(dtype: torch.dtype) -> float:
    """The smallest real number that rounds to ``inf`` in ``dtype`` (max + half an ulp)."""
    fi = torch.finfo(_check_dtype(dtype))
    ulp_at_max = 2.0 ** math.floor(math.log2(fi.max)) * fi.eps  # spacing of the top binade
    return fi.max + ulp_at_max / 2


def half_ulps(y: Tensor, ref: Tensor, dtype: torch.dtype, floor: float = 1.0) -> Tensor:
    r"""``|y - ref|`` in half-ulps of ``dtype`` at ``max(|ref|, floor)``, float64: a correctly
    rounded ``ref`` scores at most 1 (for :math:`2^e \le |r| < 2^{e+1}` the unit is
    :math:`2^e \epsilon / 2`); below ``floor`` the unit stops shrinking."""
    fi = torch.finfo(_check_dtype(dtype))
    r = ref.double()
    e = torch.floor(torch.log2(r.abs().clamp_min(max(floor, fi.tiny))))  # binade of ref
    return (y.double() - r).abs() / (torch.exp2(e) * fi.eps / 2)


def sum_of_squares(x: Tensor, dtype: torch.dtype) -> Tensor:
    r""":math:`\sum_i x_i^2` of rows ``(*, D)`` computed in ``dtype`` as torch runs it (squares
    rounded; the CPU sums in float32 and rounds once), shape ``(*)``."""
    check_floating(x)
    xl = x.to(_check_dtype(dtype))  # (*, D)
    return (xl * xl).sum(-1)  # (*)


def overflow_grid(dims: Sequence[int], magnitudes: Sequence[float],
                  dtype: torch.dtype = torch.float16) -> Tensor:
    """Whether :func:`sum_of_squares` of ``D`` copies of ``a`` is infinite, measured, for each
    ``D`` of ``dims`` and ``a`` of ``magnitudes``: bool ``(len(dims), len(magnitudes))``."""
    out = torch.zeros(len(dims), len(magnitudes), dtype=torch.bool)
    for i, d in enumerate(dims):
        check_size("dim", d)
        rows = torch.tensor(list(magnitudes), dtype=torch.float64)[:, None].expand(-1, d)
        out[i] = ~torch.isfinite(sum_of_squares(rows, dtype))
    return out


def predicted_overflow(dims: Sequence[int], magnitudes: Sequence[float],
                       dtype: torch.dtype = torch.float16) -> Tensor:
    r"""The overflow :func:`overflow_grid` should find, from the rounding rules alone:
    :math:`D\,\mathrm{fl}(\mathrm{fl}(a)^2)` reaches :func:`overflow_threshold`."""
    a = torch.tensor(list(magnitudes), dtype=torch.float64).to(dtype).double()
    q = (a * a).to(dtype).double()  # (M,) each square rounded, inf if it overflowed
    d = torch.tensor(list(dims), dtype=torch.float64)[:, None]  # (N, 1)
    return (d * q[None, :]) >= overflow_threshold(dtype)


def largest_safe_magnitude(dim: int, dtype: torch.dtype = torch.float16) -> float:
    r"""The root mean square above which the sum of squares of ``dim`` values overflows
    ``dtype``: :math:`\sqrt{x_{max} / D}`.
    """
    check_size("dim", dim)
    return math.sqrt(torch.finfo(_check_dtype(dtype)).max / dim)


def variance(x: Tensor, dtype: torch.dtype, method: Literal["one-pass", "two-pass"]) -> Tensor:
    r"""The biased variance of rows ``(*, D)`` -> ``(*)``, every result rounded to ``dtype``:
    ``"one-pass"`` :math:`E[x^2] - E[x]^2` or ``"two-pass"`` :math:`E[(x - E[x])^2]`."""
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


def variance_error(mean: float, dtype: torch.dtype, method: Literal["one-pass", "two-pass"],
                   std: float = 1.0, rows: int = 16, dim: int = 1024, seed: int = 0) -> float:
    r""":math:`\max_r |v_r - v^{64}_r| / v^{64}_r` of :func:`variance` on rows ``mean + std * z``
    stored in ``dtype``, against the float64 variance of the same stored rows."""
    x = _rows(mean, std, rows, dim, seed).to(_check_dtype(dtype))  # (R, D) stored in dtype
    ref = x.double().var(-1, unbiased=False)  # (R,)
    got = variance(x, dtype, method).double()  # (R,)
    return ((got - ref).abs() / ref).max().item()


def two_pass_bound(mean_over_std: float, dtype: torch.dtype, dim: int = 1024) -> float:
    r"""A bound on the relative error of the two-pass :func:`variance` of rows of ``dim``:
    :math:`2\,((1 + u)^3 (1 + (\delta/\sigma)^2) - 1)` with the mean's error
    :math:`\delta \le (u + \gamma_D)(1 + u)(|\mu| + \sigma)` (float32 sums, then rounded)."""
    u = unit_roundoff(dtype)
    g = recursive_sum_bound(check_size("dim", dim), torch.float32)
    shift = ((u + g) * (1 + u) * (abs(mean_over_std) + 1)) ** 2
    return 2 * ((1 + u) ** 3 * (1 + shift) - 1)


@dataclass(frozen=True)
class CastOrder:
    """What :func:`gain_cast_order` measured: the outputs ``before`` (``round(x_hat g + b)``)
    and ``after`` (``round(round(x_hat) g) + b``), the float64 ``reference``, their largest
    errors in half-ulps, the shares correctly rounded, and the share where the two differ."""

    before: Tensor
    after: Tensor
    reference: Tensor
    max_half_ulps_before: float
    max_half_ulps_after: float
    exact_before: float
    exact_after: float
    differ: float


def _normalize(v: Tensor, eps: float, rms: bool) -> Tensor:
    """``x_hat`` of layer norm (of RMSNorm with ``rms``) in ``v``'s dtype, ``(*, D)``."""
    if rms:
        return v * torch.rsqrt(v.square().mean(-1, keepdim=True) + eps)
    return F.layer_norm(v, v.shape[-1:], eps=eps)


def gain_cast_order(x: Tensor, weight: Tensor, bias: Tensor | None = None, eps: float = 1e-5,
                    rms: bool = False) -> CastOrder:
    r"""Apply the gain before or after casting the normalized row back to ``x.dtype``.

    :math:`\hat x` in float32 (layer norm, or RMSNorm with ``rms=True``); before:
    :math:`\mathrm{fl}(\hat x g + b)`; after: :math:`\mathrm{fl}(\mathrm{fl}(\mathrm{fl}
    (\hat x) g) + b)`. x ``(*, D)`` float16 or bfloat16; weight, bias ``(D,)`` cast to it.
    """
    check_floating(x)
    if x.dtype not in LOW_PRECISION:
        raise TypeError(f"x must be float16 or bfloat16, got {x.dtype}")
    dt = x.dtype
    w = weight.to(dt)  # (D,) as stored
    b = None if bias is None else bias.to(dt)  # (D,)

    x_hat = _normalize(x.float(), eps, rms)  # (*, D) float32
    before = (x_hat * w.float() + (0.0 if b is None else b.float())).to(dt)  # one rounding
    after = w * x_hat.to(dt)  # (*, D) in dt: product rounded
    after = after if b is None else after + b  # the sum rounded again
    ref = _normalize(x.double(), eps, rms) * w.double() + (0.0 if b is None else b.double())
    hb, ha = half_ulps(before, ref, dt), half_ulps(after, ref, dt)
    exact = ref.to(dt)  # (*, D) the reference correctly rounded
    return CastOrder(before=before, after=after, reference=ref,
                     max_half_ulps_before=hb.max().item(), max_half_ulps_after=ha.max().item(),
                     exact_before=(before == exact).double().mean().item(),
                     exact_after=(after == exact).double().mean().item(),
                     differ=(before != after).double().mean().item())


def accumulate_rows(terms: Tensor, acc_dtype: torch.dtype, chunk: int = 1,
                    at: Sequence[int] | None = None) -> Tensor:
    r""":math:`\sum_r t_r` over the rows of ``terms`` ``(R, D)``, the running sum held in
    ``acc_dtype``: ``chunk`` rows at a time are summed in float32 and added, then rounded (as
    ``.grad.add_`` does). Returns the sums after each row count of ``at`` (None: ``[R]``),
    ``(len(at), D)``."""
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
    r"""The per-row terms :math:`\hat x_r^2` of :math:`\partial L/\partial g` for
    :math:`L = \tfrac12 \sum_r \|y_r\|^2` at :math:`g = 1, b = 0`, :math:`\hat x` stored in
    ``dtype``: ``(rows, dim)`` float32, exact (the errors measured are the summation's)."""
    check_size("rows", rows)
    check_size("dim", dim)
    x = _rows(0.0, 1.0, rows, dim, seed)  # (R, D) float64
    x_hat = F.layer_norm(x, (dim,)).to(_check_dtype(dtype)).float()  # (R, D) stored in dtype
    return x_hat * x_hat  # (R, D) exact in float32


def weight_grad_error(terms: Tensor, acc_dtype: torch.dtype, chunk: int = 1,
                      at: Sequence[int] | None = None) -> list[float]:
    r""":math:`\max_j |S_j - S^{64}_j| / S^{64}_j` of :func:`accumulate_rows` against the
    float64 sums, for each row count of ``at``."""
    at = [terms.shape[0]] if at is None else list(at)
    ref = terms.double().cumsum(0)[torch.tensor(at) - 1]  # (len(at), D)
    got = accumulate_rows(terms, acc_dtype, chunk, at).double()  # (len(at), D)
    return ((got - ref).abs() / ref.abs()).amax(1).tolist()


def stagnation_bound(max_term: float, dtype: torch.dtype) -> float:
    r"""The most a running sum in ``dtype`` of terms in :math:`[0, T]` can ever reach:
    :math:`(S^* + T)(1 + 2u)`, :math:`S^* = 2^{\lceil \log_2 (2T/u) \rceil}` (there half an ulp
    is :math:`\ge 2T` and the sum stops).
    """
    u = unit_roundoff(dtype)
    s_star = 2.0 ** math.ceil(math.log2(2 * max_term / u))
    return (s_star + max_term) * (1 + 2 * u)


def recursive_sum_bound(n: int, dtype: torch.dtype) -> float:
    r""":math:`\gamma_{n} = n u / (1 - n u)`, the error bound of a sum of :math:`n + 1` terms
    (Higham, section 4.2)."""
    nu = n * unit_roundoff(dtype)
    return math.inf if nu >= 1 else nu / (1 - nu)


def kernel_weight_grad_error(rows: int, dim: int, dtype: torch.dtype = torch.bfloat16,
                             impl: Literal["lnbook", "torch"] = "lnbook", seed: int = 0,
                             weight_dtype: torch.dtype | None = None) -> float:
    r""":math:`\max_j |G_j - G^{64}_j| / G^{64}_j` of the weight gradient a layer-norm kernel
    (``impl`` ``"lnbook"`` or ``"torch"``) returns for ``dtype`` input ``(rows, dim)`` and
    weight (``weight_dtype``, None: ``dtype``), for :math:`\partial L/\partial y = y`."""
    check_choice("impl", impl, ("lnbook", "torch"))
    x = _rows(0.0, 1.0, rows, dim, seed).to(_check_dtype(dtype))  # (R, D)
    wdt = dtype if weight_dtype is None else _check_dtype(weight_dtype, "weight_dtype")
    w = torch.ones(dim, dtype=wdt, requires_grad=True)  # (D,)
    fn: Callable[..., Tensor] = layer_norm if impl == "lnbook" else F.layer_norm
    y = fn(x, (dim,), w)  # (R, D) in dtype
    (grad,) = torch.autograd.grad(y, w, grad_outputs=y.detach())  # (D,) in wdt
    x_hat64 = F.layer_norm(x.double(), (dim,))  # (R, D)
    ref = (y.detach().double() * x_hat64).sum(0)  # (D,)
    return ((grad.double() - ref).abs() / ref.abs()).max().item()


@dataclass(frozen=True)
class AutocastRow:
    """One implementation under ``torch.autocast("cpu", dtype)``: the dtypes of its input,
    output and weight gradient (None: no weight), and its largest error in half-ulps."""

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


def autocast_report(dtype: torch.dtype = torch.bfloat16, dim: int = 256, rows: int = 64,
                    mean: float = 1000.0) -> list[AutocastRow]:
    r"""One :class:`AutocastRow` per layer-norm implementation run under
    ``torch.autocast("cpu", dtype)`` on a Linear's output, rows :math:`\mu + z` (``mean``)."""
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
        with torch.autocast("cpu", dtype=dtype), warnings.catch_warnings():
            # F.rms_norm warns that a float32 weight with a low-precision input cannot use
            # its fused kernel; it computes the same values without it
            warnings.filterwarnings("ignore", "Mismatch dtype", UserWarning)
            h = lin(z)  # (R, D) in dtype
            out = fn(h)  # (R, D)
        grads = torch.autograd.grad(out.float().sum(), params[:1], allow_unused=True)
        ref = _normalize(h.detach().double(), 0.0 if rms else 1e-5, rms)  # (R, D) float64
        err = half_ulps(out.detach(), ref, dtype).max().item()
        grad = grads[0]
        report.append(AutocastRow(name, h.dtype, out.dtype,
                                  None if grad is None else grad.dtype, err))
    return report
