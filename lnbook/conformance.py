r"""Check a reader's own normalization layer against the forms the book teaches (chapter 13).

:func:`check_norm` probes a module or function with constructed inputs and reports, one finding
at a time, which axes it normalizes, whether it centres, its variance (biased or unbiased), where
``eps`` sits and its value, its gain and bias, the dtype of its statistics for float16 and
bfloat16 inputs, its stability at large means, its output on a constant row and its gradients.
The references are eq. 3 built from :mod:`lnbook.functional`'s steps, each the variant the
probes found (so a finding measures one convention, not the rest), and
:func:`lnbook.precision.half_ulps` for the half-precision errors. It then names the known
family the layer belongs to (:data:`FAMILIES`).

Each probe reads one quantity, with the gain set to 1 and the bias to 0 on a copy of the layer:

* axes: perturb one input value and see which outputs move;
* centring: add 3 to every value; a centring norm does not move;
* variance: rows of spread ``s = 1000`` (``eps`` negligible) come out scaled by 1 (biased) or
  :math:`\sqrt{(D-1)/D}` (unbiased);
* ``eps``: rows of spread ``s`` from 1 down to :math:`10^{-15}` come out scaled by ``k``; with
  ``eps`` inside the root :math:`1/k^2 - s^2` is the same number at every ``s``, outside it
  :math:`1/k - s` is.
"""

from __future__ import annotations

import copy
import math
import numbers
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lnbook.checks import ShapeError, check_size
from lnbook.functional import (
    as_rows,
    centre,
    check_rows,
    from_rows,
    statistics_rows,
    sum_of_squares,
    sum_of_squares_one_pass,
)
from lnbook.precision import half_ulps

__all__ = ["Finding", "NormCheck", "FAMILIES", "check_norm"]

FAMILIES: dict[str, dict[str, object]] = {
    "torch.nn.LayerNorm": dict(
        axes="trailing", params="normalized", center=True, unbiased=False, eps_inside=True,
        gain="w", bias=True),
    "the Annotated Transformer's LayerNorm (unbiased std, eps outside the root)": dict(
        axes="trailing", params="normalized", center=True, unbiased=True, eps_inside=False,
        gain="w", bias=True),
    "T5/LLaMA RMSNorm": dict(
        axes="trailing", params="normalized", center=False, unbiased=False, eps_inside=True,
        gain="w", bias=False),
    "Gemma RMSNorm": dict(
        axes="trailing", params="normalized", center=False, unbiased=False, eps_inside=True,
        gain="1 + w", bias=False),
    "GroupNorm(1, C)": dict(
        axes="all but batch", params="channel", center=True, unbiased=False, eps_inside=True,
        gain="w", bias=True),
    "LayerNorm2d": dict(
        axes="channels", center=True, unbiased=False, eps_inside=True,
        gain="w", bias=True),
}
"""The known families and the forward form that defines each (a key left out: either way).
``axes``: ``"trailing"`` (the last dimensions, torch's ``normalized_shape``), ``"channels"``
(dimension 1 alone of an ``(N, C, *)`` input, ConvNeXt's channels-first LN) or ``"all but
batch"``; ``params``: the gain and bias have the normalized shape or one value per channel.
The numerics (half-precision statistics, large means, constant rows, gradients) are findings
of their own and do not change the family."""

_WHAT = {  # how a difference from a family is said
    "axes": "the axes it normalizes", "params": "the shape of its gain and bias",
    "center": "centring", "unbiased": "the variance (biased or unbiased)",
    "eps_inside": "where eps sits", "gain": "the gain", "bias": "the bias"}
_NONE = "none of the known families"
_SHIFT = 3.0  # the centring probe's shift
_BIG = 1e3  # the variance probe's spread: eps negligible against s^2 = 1e6
_LADDER = tuple(10.0 ** (-k / 2) for k in range(31))  # the eps probe's spreads, 1 to 1e-15
_MEANS = (1e4, 1e5, 1e6, 1e7)  # the large-mean probe, in float32
_KNOWN_EPS = ((1e-5, "torch's default"), (1e-6, "common in Transformers"), (1e-12, "BERT's"),
              *((torch.finfo(t).eps, f"{str(t)[6:]}'s machine epsilon: torch.nn.RMSNorm's eps="
                 "None") for t in (torch.float32, torch.float64)))


@dataclass(frozen=True)
class Finding:
    """One convention: ``name``, what the layer does (``follows``), ``ok`` (True: as the book's
    reference; False: a mistake of chapter 13; None: a different, legitimate convention) and the
    numbers measured (``evidence``)."""

    name: str
    follows: str
    ok: bool | None
    evidence: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """``"ok"``, ``"BREAKS"`` or ``"differs"``."""
        return {True: "ok", False: "BREAKS", None: "differs"}[self.ok]


@dataclass(frozen=True)
class NormCheck:
    """What :func:`check_norm` found: ``findings`` (:class:`Finding`, in probe order),
    ``family`` (a key of :data:`FAMILIES` or ``"none of the known families"``), ``nearest``
    family and the conventions in which the layer ``differs`` from it, ``shape`` and ``dtype``
    of the probes. ``check[name]`` is the finding ``name``; ``breaks`` names those that break
    the book's reference; ``ok``: none does."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    findings: tuple[Finding, ...]
    family: str
    nearest: str | None
    differs: tuple[str, ...]

    def __getitem__(self, name: str) -> Finding:
        for f in self.findings:
            if f.name == name:
                return f
        raise KeyError(f"no finding {name!r}; the findings are "
                       f"{', '.join(f.name for f in self.findings)}")

    @property
    def ok(self) -> bool:
        """True when no finding breaks the book's reference (``differs`` is allowed)."""
        return not self.breaks

    @property
    def breaks(self) -> tuple[str, ...]:
        """The names of the findings that break the book's reference (chapter 13's mistakes)."""
        return tuple(f.name for f in self.findings if f.ok is False)

    def _breaks_line(self) -> str:
        return "breaks: " + (", ".join(self.breaks) if self.breaks else "nothing the book checks")

    def _family_line(self) -> str:
        if self.family != _NONE:
            return f"family: {self.family}"
        if self.nearest is None:
            return f"family: {_NONE}"
        return (f"family: {_NONE}; nearest: {self.nearest}, which differs in "
                f"{', '.join(_WHAT[k] for k in self.differs)}")

    def __str__(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        head = [f"check_norm({self.name}) on inputs of shape {self.shape}, probed in {dt}"]
        head += textwrap.wrap(self._family_line(), 88, subsequent_indent="  ")
        head += textwrap.wrap(self._breaks_line(), 88, subsequent_indent="  ")
        rows = []
        for f in self.findings:
            rows += textwrap.wrap(f.follows, 88, initial_indent=f"{f.name:<11}{f.verdict:<8}",
                                  subsequent_indent=" " * 19)
        return "\n".join(head + rows)

    def __repr__(self) -> str:
        return f"NormCheck({self.name}, family={self.family!r}, breaks={self.breaks})"

    def _repr_markdown_(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        lines = [f"**check_norm({self.name})** on inputs of shape `{self.shape}`, "
                 f"probed in {dt}. F{self._family_line()[1:]}; "
                 f"{self._breaks_line()}.", "",
                 "| convention | verdict | what it does |", "|---|---|---|"]
        lines += [f"| {f.name} | {f.verdict} | {f.follows.replace('|', '/')} |"
                  for f in self.findings]
        return "\n".join(lines)


# -------------------- probing


class _Probe:
    """A copy of the layer with its gain at 1 and bias at 0, and the inputs that probe it."""

    def __init__(self, norm: Callable[[Tensor], Tensor], shape: tuple[int, ...], seed: int):
        self.norm, self.shape = norm, shape
        self.module = norm if isinstance(norm, nn.Module) else None
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype = torch.float64
        try:
            y = self._call(self._copy(torch.float64), self.randn())
            if y.dtype != torch.float64:
                self.dtype = torch.float32
        except (RuntimeError, TypeError, ValueError):
            self.dtype = torch.float32
        self.f = self._copy(self.dtype)

    def _copy(self, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
        if self.module is None:
            return self.norm
        return copy.deepcopy(self.module).to("cpu", dtype)  # the probes run on the CPU

    def _call(self, f: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        try:
            y = f(x)
        except Exception as e:  # the reader's layer: any exception, said with the shape
            raise ShapeError(f"the norm raised {type(e).__name__} on an input of shape "
                             f"{tuple(x.shape)} and dtype {x.dtype}: {e}") from e
        if not isinstance(y, Tensor) or y.shape != x.shape:
            got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
            raise ShapeError(f"the norm must return a tensor of its input's shape "
                             f"{tuple(x.shape)}, got {got}")
        return y

    def __call__(self, x: Tensor, f: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        with torch.no_grad():
            return self._call(self.f if f is None else f, x.to(self.dtype)).double()

    def randn(self) -> Tensor:
        return torch.randn(self.shape, generator=self.gen, dtype=torch.float64)

    def pattern(self, axes: tuple[int, ...]) -> Tensor:
        """Random values whose every normalized group has mean 0 and biased variance 1."""
        rows = as_rows(self.randn(), axes)  # (R, D)
        rows = rows - rows.mean(1, keepdim=True)
        return from_rows(rows / rows.pow(2).mean(1, keepdim=True).sqrt(), self.shape, axes)


def _axes(p: _Probe) -> tuple[tuple[int, ...], bool]:
    """The axes whose values share statistics with the first one; True if some axis is only
    partly shared (groups)."""
    x = p.randn()
    x2 = x.clone()
    x2[(0,) * x.dim()] += 0.5
    moved = (p(x2) - p(x)) != 0
    idx = moved.nonzero()  # (k, ndim)
    axes = tuple(a for a in range(x.dim()) if idx[:, a].unique().numel() > 1)
    partial = any(idx[:, a].unique().numel() < x.shape[a] for a in axes)
    return axes, partial


def _affine(p: _Probe, axes: tuple[int, ...]) -> tuple[list[Finding], dict[str, object]]:
    """Find the gain and bias among the parameters; set them to the identity in ``p.f``."""
    if p.module is None:
        return [Finding("gain", "none: a function without parameters (gain 1)", None),
                Finding("bias", "none: a function without parameters", None)], {
                    "gain": None, "bias": None, "params": None}
    sizes = {math.prod(p.shape[a] for a in axes)} | {p.shape[a] for a in axes}
    d = math.prod(p.shape[a] for a in axes)
    x = p.pattern(axes)
    gains, biases = [], []
    for name, w in p.f.named_parameters():
        if not w.is_floating_point() or w.numel() not in sizes or w.numel() < 2:
            continue
        init = w.detach().clone()
        y0 = p(x)
        with torch.no_grad():
            w.add_(0.5)
        delta = p(x) - y0
        with torch.no_grad():
            w.copy_(init)
        if delta.abs().max() < 1e-6:
            continue  # does not act on the output
        layout = "normalized" if w.numel() == d else "channel"
        if (delta - 0.5).abs().max() < 1e-4:
            biases.append((name, w, init, layout))
        else:
            gains.append((name, w, init, layout))
    with torch.no_grad():
        for _, w, _, _ in biases:
            w.zero_()
    found: dict[str, object] = {"gain": "none", "bias": bool(biases), "params": None}
    out = []
    if gains:
        name, w, init, layout = gains[0]
        with torch.no_grad():
            w.zero_()
            y_zero = p(x)
            w.fill_(1.0)
            y_one = p(x)
        if y_zero.abs().max() < 1e-4:
            form, applied = "w", init
        elif (y_one - 2 * y_zero).abs().max() < 1e-4:
            form, applied = "1 + w", 1 + init
            with torch.no_grad():
                w.zero_()
        else:
            form, applied = "another form", init
            with torch.no_grad():
                w.copy_(init)
        found.update(gain=form, params=layout)
        starts = float(applied.double().mean())
        at_one = bool((applied.double() - 1).abs().max() < 1e-6)
        shape = "the normalized shape" if layout == "normalized" else "one per channel"
        what = {"w": f"multiplies by {name}", "1 + w": f"multiplies by 1 + {name} (Gemma)",
                "another form": f"{name} scales the output, neither as w nor as 1 + w"}[form]
        ok = (at_one if form == "w" else None if form == "1 + w" and at_one else False)
        out.append(Finding("gain", f"{what}, {shape}; the applied gain starts at "
                           f"{'1' if at_one else f'{starts:.3g} on average'}", ok,
                           {"applied_at_start": starts}))
    else:
        out.append(Finding("gain", "none (eq. 15 has a gain g, starting at 1)", False))
    if biases:
        name, w, init, layout = biases[0]
        found["params"] = found["params"] or layout
        zero = bool(init.abs().max() == 0)
        out.append(Finding("bias", f"adds {name}, which starts at "
                           f"{'0' if zero else f'{float(init.double().mean()):.3g} on average'}",
                           zero, {"start": float(init.double().abs().max())}))
    return out, found


def _centring(p: _Probe, axes: tuple[int, ...]) -> tuple[Finding, bool]:
    z = p.pattern(axes)
    moved = float((p(z + _SHIFT) - p(z)).abs().max())
    center = moved < 1e-3
    what = ("subtracts the mean (layer norm)" if center
            else "does not subtract the mean (RMSNorm)")
    return Finding("centring", f"{what}: adding {_SHIFT:g} to every value moves the output by "
                   f"{moved:.1e}", None if not center else True, {"moved": moved}), center


def _variance(p: _Probe, axes: tuple[int, ...], d: int,
              center: bool) -> tuple[Finding, bool | None, float]:
    z = p.pattern(axes)
    r = float(p(_BIG * z).norm() / z.norm())  # output scale, eps negligible
    unb = math.sqrt((d - 1) / d)
    dist_b, dist_u = abs(math.log(r)), abs(math.log(r / unb))
    stat = "variance" if center else "mean square"
    ev = {"scale": r, "biased": 1.0, "unbiased": unb}
    if min(dist_b, dist_u) > max(1e-4, abs(math.log(unb)) / 4):
        return Finding("variance", f"neither biased nor unbiased: rows of spread {_BIG:g} come "
                       f"out scaled by {r:.4f} (biased: 1, unbiased: {unb:.4f})", False,
                       ev), None, r
    unbiased = dist_u < dist_b
    if unbiased:
        return Finding("variance", f"unbiased {stat} (divides by D - 1 = {d - 1}): outputs "
                       f"{r:.4f} times torch's, sqrt((D-1)/D) = {unb:.4f}", False,
                       ev), True, r
    return Finding("variance", f"biased {stat} (divides by D = {d}): output scale {r:.6f}",
                   True, ev), False, r


def _eps(p: _Probe, axes: tuple[int, ...], d: int, unbiased: bool,
         center: bool) -> tuple[Finding, bool | None, float]:
    z = p.pattern(axes)
    n = d / (d - 1) if unbiased else 1.0
    est: dict[bool, list[float]] = {True: [], False: []}
    for s in _LADDER:
        k = float(p(s * z).norm() / (s * z).norm())  # 1 / sqrt(v + eps) or 1 / (sqrt(v) + eps)
        v = n * s * s
        if not (math.isfinite(k) and k > 0) or abs(k * math.sqrt(v) - 1) < 1e-4:
            continue  # eps invisible at this spread (or the output broke down)
        est[True].append(1 / k**2 - v)
        est[False].append(1 / k - math.sqrt(v))
    if not est[True]:
        return Finding("eps", f"no eps seen down to a spread of {_LADDER[-1]:g}: eps is 0 or "
                       "smaller (eq. 3's eps keeps sigma away from 0)", False), None, 0.0

    def spread(e: list[float]) -> float:
        return math.inf if min(e) <= 0 else math.log(max(e) / min(e))

    inside = spread(est[True]) <= spread(est[False])
    e = sorted(est[inside])[len(est[inside]) // 2]  # the median
    name = next((f" ({what})" for v, what in _KNOWN_EPS if abs(e / v - 1) < 0.01), "")
    top, stat = ("(x - mu)", "var") if center else ("x", "mean(x^2)")
    where = (f"inside the root, {top} / sqrt({stat} + eps)" if inside
             else f"outside the root, {top} / (sqrt({stat}) + eps)")
    ev = {"eps": e, "spread_inside": spread(est[True]), "spread_outside": spread(est[False]),
          "spreads_used": float(len(est[True]))}
    return Finding("eps", f"{where}; eps = {e:.3g}{name}", inside, ev), inside, e


def _half(p: _Probe, axes: tuple[int, ...], dtype: torch.dtype,
          ref: dict[str, object]) -> Finding:
    name = str(dtype).removeprefix("torch.")
    f = p._copy(dtype)
    zs = [300 * p.pattern(axes)] if dtype == torch.float16 else []  # x^2 overflows float16
    zs += [8 + p.pattern(axes), p.pattern(axes), 3 * p.pattern(axes)]
    err = err32 = errh = 0.0
    out_dtype = dtype
    for z in zs:
        x = z.to(dtype)
        try:
            with torch.no_grad():
                y = p._call(f, x)
        except ShapeError as e:
            why = textwrap.shorten(str(e.__cause__), 120)
            return Finding(name, f"cannot run in {name}: {why}", None)
        out_dtype = y.dtype
        truth = _reference(x.double(), axes, ref)
        y32 = _reference(x, axes, ref).to(dtype)  # float32 statistics
        yh = _reference(x, axes, ref, in_input_dtype=True)
        for e_name, yy in (("m", y), ("r", y32), ("h", yh)):
            u = half_ulps(yy, truth, dtype, floor=0.5).nan_to_num(math.inf).max()
            if e_name == "m":
                err = max(err, float(u))
            elif e_name == "r":
                err32 = max(err32, float(u))
            else:
                errh = max(errh, float(u))
    ok = err <= 1.01 * max(err32, 1.0)
    cast = "" if out_dtype == dtype else f"; returns {str(out_dtype).removeprefix('torch.')}"
    what = ("statistics in float32 (or wider)" if ok
            else f"statistics in {name}: the cast to float32 comes too late or never")
    ev = {"half_ulps": err, "float32_statistics": err32, f"{name}_statistics": errh}
    return Finding(name, f"{what}: largest error {err:.3g} half-ulps (float32 statistics: "
                   f"{err32:.3g}, {name} statistics: {errh:.3g}){cast}", ok, ev)


def _reference(x: Tensor, axes: tuple[int, ...], ref: dict[str, object], *,
               one_pass: bool = False, in_input_dtype: bool = False) -> Tensor:
    """The book's normalization with the conventions found, gain 1 and bias 0: the steps of
    :func:`lnbook.functional.normalize`, each as ``ref`` says (``one_pass``:
    ``E[x^2] - E[x]^2``; ``in_input_dtype``: no float32 statistics for half inputs)."""
    rows = as_rows(x, axes)
    rows = check_rows(rows) if in_input_dtype else statistics_rows(rows)  # (R, D)
    d = rows.shape[1]
    if not ref["center"]:  # RMSNorm's statistic
        xc, ss = rows, sum_of_squares(rows)
    elif one_pass:
        mu = rows.mean(dim=1, keepdim=True)  # (R, 1)
        xc, ss = rows - mu, sum_of_squares_one_pass(rows, mu)
    else:
        xc = centre(rows)
        ss = sum_of_squares(xc)
    var = ss / (d - 1 if ref["unbiased"] else d)  # (R, 1)
    eps = ref["eps"]
    rstd = torch.rsqrt(var + eps) if ref["eps_inside"] else (var.sqrt() + eps).reciprocal()
    return from_rows(xc * rstd, x.shape, axes)


def _large_mean(p: _Probe, axes: tuple[int, ...], ref: dict[str, object]) -> Finding:
    """Rows of spread 1 at means 1e4 to 1e7 in float32, against float64: an error near
    u * mean (float32's rounding of the mean) is the most float32 can promise; the one-pass
    variance loses u * mean^2 (chapter 13, mistake 3)."""
    if not ref["center"]:
        return Finding("large mean", "nothing to cancel: no mean is subtracted", True)
    f = p._copy(torch.float32)
    u = torch.finfo(torch.float32).eps / 2
    worst = {"module": 0.0, "two_pass": 0.0, "one_pass": 0.0}
    ev = {}
    for m in _MEANS:
        x = (m + p.pattern(axes)).float()
        with torch.no_grad():
            y = p._call(f, x).double()
        truth = _reference(x.double(), axes, ref)
        errs = {"module": y, "two_pass": _reference(x, axes, ref).double(),
                "one_pass": _reference(x, axes, ref, one_pass=True).double()}
        for k, yy in errs.items():
            e = float((yy - truth).abs().nan_to_num(math.inf).max()) / (u * m)
            worst[k] = max(worst[k], e)
            ev[f"{k}_{m:g}"] = e * u * m
    ok = worst["module"] <= 16
    what = "stable" if ok else "unstable, like E[x^2] - E[x]^2"
    ev.update({f"worst_{k}": v for k, v in worst.items()})
    return Finding("large mean", f"{what}: at means 1e4 to 1e7 in float32 its largest error is "
                   f"{worst['module']:.2g} u x mean (two passes: {worst['two_pass']:.2g}, one "
                   f"pass: {worst['one_pass']:.2g}; u = 2^-24)", ok, ev)


def _grad(p: _Probe, x: Tensor, up: Tensor) -> Tensor | None:
    """The gradient of ``sum(norm(x) * up)`` with respect to ``x``; None if autograd has none
    (an output detached, or computed outside torch)."""
    x = x.detach().to(p.dtype).requires_grad_(True)
    y = p._call(p.f, x)
    if not y.requires_grad:
        return None
    (grad,) = torch.autograd.grad((y * up.to(y.dtype)).sum(), x, allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad


_NO_GRAD = "no gradient: the output is detached or computed outside autograd"


def _constant(p: _Probe, axes: tuple[int, ...], ref: dict[str, object]) -> Finding:
    x = torch.full(p.shape, 0.75, dtype=torch.float64)  # its squares and sums are exact
    y = p(x)
    grad = _grad(p, x, p.randn())
    y_ok = bool(y.isfinite().all())
    g_ok = grad is not None and bool(grad.isfinite().all())
    gap = float((y - _reference(x, axes, ref)).abs().max()) if y_ok else math.inf
    say = ("output " + (f"finite, {float(y.abs().max()):.3g} at most" if y_ok
                        else "not finite (NaN or inf)") + "; ")
    if grad is None:
        say += _NO_GRAD
    else:
        say += "gradient " + ("finite" if g_ok else "not finite (NaN)" + (
            ": the slope of a square root at 0" if y_ok else ""))
    return Finding("constant", f"a constant row: {say}", y_ok and g_ok,
                   {"output_finite": float(y_ok), "gradient_finite": float(g_ok),
                    "vs_reference": gap})


def _gradient(p: _Probe, axes: tuple[int, ...], ref: dict[str, object],
              exact: bool) -> Finding:
    x, up = p.pattern(axes), p.randn()
    grad = _grad(p, x, up)
    if grad is None:
        return Finding("gradient", _NO_GRAD, False)
    xr = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad((_reference(xr, axes, ref) * up).sum(), xr)
    rel = float((grad.double() - want).abs().max() / want.abs().max())
    tol = 1e-9 if exact else 1e-4
    ev = {"vs_reference": rel}
    gc = None
    if exact:
        gc = torch.autograd.gradcheck(p.f, (x.clone().requires_grad_(True),), fast_mode=True,
                                      raise_exception=False)
        ev["gradcheck"] = float(gc)
    ok = rel < tol and gc is not False
    how = ("" if gc is None else "gradcheck in float64 " + ("passes" if gc else "fails")
           + "; ")
    return Finding("gradient", f"{how}largest difference from the reference's gradient "
                   f"{rel:.1e} of its largest value", ok, ev)


def _axes_label(axes: tuple[int, ...], ndim: int) -> str:
    if ndim >= 3 and axes == (1,):
        return "channels"
    if axes == tuple(range(ndim - len(axes), ndim)):
        return "trailing" if len(axes) < ndim - 1 or ndim < 3 else "all but batch"
    return "other"


def _family(found: dict[str, object]) -> tuple[str, str | None, tuple[str, ...]]:
    best: tuple[int, str, tuple[str, ...]] | None = None
    for name, conv in FAMILIES.items():
        diff = []
        for k, want in conv.items():
            got = found.get(k)
            if got is None:
                continue  # not measured (a function without parameters, say)
            if k == "axes":
                ok = got == want or (got == "all but batch" and want == "trailing")
            else:
                ok = got == want
            if not ok:
                diff.append(k)
        if best is None or len(diff) < best[0]:
            best = (len(diff), name, tuple(diff))
    assert best is not None
    n, name, diff = best
    return (name, name, ()) if n == 0 else (_NONE, name, diff)


def _check_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, torch.Size):
        shape = tuple(shape)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"shape must be a sequence of positive ints such as (4, 16), "
                        f"got {shape!r}")
    out = tuple(check_size(f"shape[{i}]", s) for i, s in enumerate(shape))
    if not out:
        raise ValueError("shape must have at least one dimension, got ()")
    return out


def _check_dims(dims: object, normalized_shape: object, shape: tuple[int, ...]) -> tuple[int, ...]:
    nd = len(shape)
    if dims is not None and normalized_shape is not None:
        raise ValueError("give dims or normalized_shape, not both")
    if normalized_shape is not None:
        ns = ((normalized_shape,) if isinstance(normalized_shape, numbers.Integral)
              else normalized_shape)
        if isinstance(ns, (str, bytes)) or not isinstance(ns, Sequence):
            raise TypeError(f"normalized_shape must be an int or a sequence of ints, "
                            f"got {normalized_shape!r}")
        ns = tuple(check_size("normalized_shape", s) for s in ns)
        if not ns or len(ns) > nd or shape[nd - len(ns):] != ns:
            raise ShapeError(f"normalized_shape {ns} must match the trailing dimensions of "
                             f"shape {shape}")
        return tuple(range(nd - len(ns), nd))
    if dims is None:
        return (nd - 1,)
    raw = (dims,) if isinstance(dims, numbers.Integral) else dims
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence) or any(
            isinstance(a, bool) or not isinstance(a, numbers.Integral) for a in raw):
        raise TypeError(f"dims must be an int or a sequence of ints, got {dims!r}")
    out = sorted({int(a) % nd for a in raw if -nd <= a < nd})
    if not raw or len(out) != len(raw):
        raise ValueError(f"dims must name distinct axes of a {nd}-d input of shape {shape}, "
                         f"got {dims!r}")
    return tuple(out)


def check_norm(norm: Callable[[Tensor], Tensor], shape: Sequence[int], *,
               dims: int | Sequence[int] | None = None,
               normalized_shape: int | Sequence[int] | None = None, seed: int = 0) -> NormCheck:
    """Probe a normalization layer and report the conventions it follows (chapter 13).

    Args:
        norm: an :class:`torch.nn.Module` (probed on copies; the module itself is not changed)
            or a function ``tensor -> tensor`` of the same shape.
        shape: the input shape to probe with, for example ``(4, 16)`` or ``(2, 8, 4, 4)``.
        dims: the axes the layer is meant to normalize (``1`` for a channels-first
            ``(N, C, H, W)`` layer norm); or ``normalized_shape``: the trailing dimensions, as
            torch's. Default: the last dimension.
        seed: of the random probes.

    Returns:
        A :class:`NormCheck`: ``print`` it (or show it in a notebook) for the report.

    It probes in float64 where the layer accepts it (else float32), and in float32, float16
    and bfloat16 for the large-mean and half-precision findings.
    """
    if not callable(norm):
        raise TypeError(f"norm must be a torch.nn.Module or a function tensor -> tensor, "
                        f"got {type(norm).__name__}")
    shape = _check_shape(shape)
    want = _check_dims(dims, normalized_shape, shape)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r}")
    name = type(norm).__name__ if isinstance(norm, nn.Module) else getattr(
        norm, "__name__", type(norm).__name__)
    p = _Probe(norm, shape, int(seed))
    axes, partial = _axes(p)
    sizes = " x ".join(str(shape[a]) for a in axes)
    label = _axes_label(axes, len(shape))
    say = (f"normalizes dims {axes} ({sizes} values{', in groups' if partial else ''})"
           if axes else "normalizes nothing: each output depends on its own input alone")
    say += "" if axes == want else f"; expected dims {want}"
    if 0 in axes:
        say += " (across the batch, as batch norm in training)"
    findings = [Finding("axes", say, axes == want and not partial,
                        {"dims": float(len(axes))})]
    found: dict[str, object] = {"axes": label}
    d = math.prod(shape[a] for a in axes) if axes else 1
    if d < 2 or partial:
        return NormCheck(name, shape, p.dtype, tuple(findings), _NONE, None, ())
    affine, got = _affine(p, axes)
    found.update(got)
    c, center = _centring(p, axes)
    found["center"] = center
    v, unbiased, _ = _variance(p, axes, d, center)
    found["unbiased"] = unbiased
    e, inside, eps = _eps(p, axes, d, bool(unbiased), center)
    found["eps_inside"] = inside
    if found["bias"] is False:  # judged by the reference: layer norm has a bias, RMSNorm none
        affine.append(Finding("bias", "none" + (" (eq. 15 has a bias b, starting at 0)"
                                                if center else ""), not center))
    elif found["bias"] and not center:
        affine[-1] = Finding("bias", affine[-1].follows + " (RMSNorm has none)", None,
                             affine[-1].evidence)
    findings += [c, v, e, *affine]
    ref = {"center": center, "unbiased": bool(unbiased), "eps_inside": inside is not False,
           "eps": eps}
    exact = p.dtype == torch.float64
    if exact:  # a layer that casts to float32 inside is float64 in name only
        z = p.pattern(axes)
        exact = bool((p(z) - _reference(z, axes, ref)).abs().max() < 1e-9)
    findings += [_half(p, axes, dt, ref) for dt in (torch.float16, torch.bfloat16)]
    findings += [_large_mean(p, axes, ref), _constant(p, axes, ref),
                 _gradient(p, axes, ref, exact)]
    family, nearest, differs = _family(found)
    return NormCheck(name, shape, p.dtype, tuple(findings), family, nearest, differs)
