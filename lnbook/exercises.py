"""Checkers of chapter 3's coding exercises (`03_layer_norm`): :func:`check_layer_norm` (3.1,
the forward pass, eq. 3 with eq. 15's ``g`` and ``b``), :func:`check_ln_mlp` (3.2, an MLP with
LN on its two hidden layers, trained on the 8x8 digits), :func:`check_layer_norm_backward`
(3.4, the backward pass) and :func:`check_layer_norm_function` (3.7, the capstone: both passes
as a ``torch.autograd.Function``). The layer-norm checkers call the reader's function on copies
and fail one that changes an input in place; errors it raises are translated from the
operations it called (a traced run). The known wrong answers are computed with
:mod:`lnbook.functional`. A checker raises :class:`ExerciseError` (an ``AssertionError``;
``err.part`` names the wrong part) or returns a :class:`CheckReport`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from lnbook.data import load_digits_tensor
from lnbook.display import wrap
from lnbook.engine.job import cpu_threads
from lnbook.engine.metrics import classification_metrics, prior_nll
from lnbook.engine.train import Batches, fit
from lnbook.functional import (
    as_rows,
    from_rows,
    layer_norm_backward,
    normalize,
    normalize_detached,
    normalize_eps_outside,
    normalize_one_pass,
    normalize_unbiased,
    rms_normalize,
)
from lnbook.norms import BatchNorm, LayerNorm
from lnbook.table import Table

__all__ = [
    "CheckReport", "ExerciseError", "check_layer_norm", "check_layer_norm_backward",
    "check_layer_norm_function", "check_ln_mlp", "digits_split",
]

ForwardFn = Callable[[Tensor, tuple[int, ...], Tensor, Tensor, float], Tensor]
BackwardFn = Callable[[Tensor, Tensor, Tensor, float], Sequence[Tensor]]

_F64 = torch.float64


class ExerciseError(AssertionError):
    """A checker found a mistake: ``exercise`` (the checker), ``part`` (what is wrong, one
    word: ``"shape"``, ``"axes"``, ``"eps"``, ``"dL/da"``, ``"placement"``, ...) and ``case``
    (the test case); the message says how to fix it, wrapped at 88 characters a line
    (:func:`lnbook.display.wrap`) to fit the book's column when a chapter prints it."""

    def __init__(self, exercise: str, part: str, message: str, case: str = "") -> None:
        where = f"\n  (test case: {case})" if case else ""
        super().__init__(wrap(f"{exercise}: {message}{where}"))
        self.exercise, self.part, self.case = exercise, part, case


@dataclass
class CheckReport:
    """What a checker verified: ``checks`` (``(what, seen)`` per check) and ``figures``
    (numbers measured on the way, e.g. :func:`check_ln_mlp`'s held-out loss)."""

    exercise: str
    checks: list[tuple[str, str]]
    figures: dict[str, float] = field(default_factory=dict)

    def table(self) -> Table:
        """The checks as a :class:`lnbook.experiments.Table`."""
        return Table(["check", "result"], self.checks,
                     caption=f"{self.exercise}: all {len(self.checks)} checks passed")

    def _repr_markdown_(self) -> str:
        return self.table()._repr_markdown_()

    def __str__(self) -> str:
        return str(self.table())

    __repr__ = __str__


def _max_diff(a: Tensor, b: Tensor) -> float:
    return float((a.detach().to(_F64) - b.detach().to(_F64)).abs().max())


# ----------------------------------------------------------------------------------------------
# Exercise 3.1: the forward pass


@dataclass
class _Case:
    name: str
    x: Tensor
    shape: tuple[int, ...]
    g: Tensor
    b: Tensor
    eps: float
    plain: bool = False  # g = 1 and b = 0: the output is the normalized x itself
    constant_row: int | None = None  # index of a row whose entries are all equal
    probe: str = "other"  # the part this case tests, named when an unknown mistake shows here
    hint: str = ""  # what a right answer does on this case
    tol: float = 1e-9  # largest difference from torch allowed


def _forward_cases() -> list[_Case]:
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=_F64)

    def gain(*shape: int) -> Tensor:
        return 0.5 + torch.rand(*shape, generator=gen, dtype=_F64)

    x = 3.0 + 2.0 * randn(4, 8)  # (4, 8) mean about 3, variance about 4
    g, b = gain(8), randn(8)  # (8,) a gain and a bias that differ from 1 and 0
    x3 = 1.0 + 2.0 * randn(2, 3, 5)  # (B, T, D) = (2, 3, 5)
    xc = randn(3, 8)
    xc[1] = 7.0  # (3, 8) the middle row is constant
    ones, zeros = torch.ones(8, dtype=_F64), torch.zeros(8, dtype=_F64)
    return [
        _Case("x (4, 8), normalized_shape (8,), g = 1, b = 0, float64", x, (8,), ones, zeros,
              1e-5, plain=True),
        _Case("x (4, 8), normalized_shape (8,), a random gain g and bias b", x, (8,), g, b, 1e-5,
              probe="gain/bias", hint="with g = 1 and b = 0 your output was right; the output "
              "is g * x_hat + b, elementwise, with g and b of shape normalized_shape"),
        _Case("rows whose variance (about 1e-5) is close to eps = 1e-5",
              1.0 + 3e-3 * randn(4, 8), (8,), g, b, 1e-5, probe="eps",
              hint="here eps is as large as the variance: sigma = sqrt(var + eps)"),
        _Case("eps = 0.5 passed as the last argument", x, (8,), g, b, 0.5, probe="eps",
              hint="use the eps argument, inside the square root: sqrt(var + eps)"),
        _Case("x (B, T, D) = (2, 3, 5), normalized_shape (5,): one mean per (b, t)", x3, (5,),
              gain(5), randn(5), 1e-5, probe="axes", hint="the statistics are taken over the "
              "last dimension only, one (mu, sigma) per (b, t)"),
        _Case("x (B, T, D) = (2, 3, 5), normalized_shape (3, 5): one mean per b", x3, (3, 5),
              gain(3, 5), randn(3, 5), 1e-5, probe="axes", hint="the statistics are taken over "
              "the last two dimensions together, one (mu, sigma) per b"),
        _Case("float32 input (16, 32): the output stays float32", (3.0 + 2.0 * randn(16, 32))
              .float(), (32,), gain(32).float(), randn(32).float(), 1e-5, tol=2e-5),
        _Case("float32 input (8, 32) with mean 1e4 and spread 1", (1e4 + randn(8, 32)).float(),
              (32,), gain(32).float(), randn(32).float(), 1e-5, probe="variance", tol=1e-2,
              hint=_ONE_PASS_HINT),
        _Case("a row whose 8 entries are all 7.0 (variance 0)", xc, (8,), g, b, 1e-5,
              constant_row=1, probe="eps", hint="a constant row comes out as the bias b: "
              "(x - mu) is 0 and sqrt(0 + eps) keeps the division finite"),
    ]


def _dims(x: Tensor, shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(range(x.dim() - len(shape), x.dim()))


def _variant(x: Tensor, g: Tensor, b: Tensor, eps: float, dims: tuple[int, ...], *,
             center: bool = True, divide: str = "std", affine: str = "g*x+b",
             dtype: torch.dtype = _F64, norm: Callable[..., tuple[Tensor, Tensor]] = normalize
             ) -> Tensor:
    """Layer norm with one known mistake; ``norm``: :func:`lnbook.functional.normalize` or one
    of its variants."""
    x, g, b = x.to(dtype), g.to(dtype), b.to(dtype)
    rows = as_rows(x, dims)  # (R, D)
    x_hat, rstd = norm(rows, eps)  # (R, D), (R, 1)
    if divide == "rms":  # (x - mu) / sqrt(mean(x^2) + eps): sigma of x, not of x - mu
        x_hat = x_hat / rstd * rms_normalize(rows, eps)[1]
    elif divide == "var":  # (x - mu) / (var + eps)
        x_hat = x_hat * rstd
    elif divide == "none":  # x - mu
        x_hat = x_hat / rstd
    if not center:  # x / sigma
        x_hat = rows * rstd
    x_hat = from_rows(x_hat, x.shape, dims)
    return {"g*x+b": g * x_hat + b, "b*x+g": b * x_hat + g, "x+b": x_hat + b,
            "g*x": g * x_hat, "x": x_hat, "(x+b)*g": (x_hat + b) * g}[affine]


_ONE_PASS_HINT = ("at a mean of 1e4 and a spread of 1, E[x^2] - E[x]^2 (the one-pass variance) "
                  "subtracts two numbers near 1e8 that agree in every digit float32 keeps, and "
                  "what is left is rounding (or negative: NaN). Take the mean first, then the "
                  "mean of (x - mu) ** 2: two passes")
_VARIANCE_HINT = ("eq. 3 divides by D, the number of units normalized over: torch.var and "
                  "Tensor.std default to unbiased=True (D - 1); pass unbiased=False (or "
                  "correction=0), or write ((x - mu) ** 2).mean(dims, keepdim=True)")


def _forward_mistakes(case: _Case) -> list[tuple[str, str, dict[str, Any]]]:
    """``(part, diagnosis, keywords of _variant)`` for each known mistake, on ``case``."""
    x, shape, k = case.x, case.shape, len(case.shape)
    out = [
        ("axes", "you normalized each unit over the batch (dimension 0): that is batch "
         "normalization (chapter 2). Layer normalization takes the mean and the variance of "
         f"each example over its last len(normalized_shape) = {k} dimension(s)", {"dims": (0,)}),
        ("axes", "you normalized over every dimension, the batch included: each example must "
         f"get its own mean and variance, over the last {k} dimension(s) only",
         {"dims": tuple(range(x.dim()))}),
    ]
    if x.dim() > 2 and k == 1:
        out.append(("axes", f"you normalized over every dimension after the first; "
                    f"normalized_shape {shape} means the last dimension only (statistics per "
                    "example AND per position)", {"dims": tuple(range(1, x.dim()))}))
    if k > 1:
        out.append(("axes", f"you normalized over the last dimension only; normalized_shape "
                    f"{shape} means the statistics are taken over the last {k} dimensions "
                    f"together: dims = tuple(range(-{k}, 0))", {"dims": (x.dim() - 1,)}))
    out += [
        ("variance", "the variance is the unbiased one (divided by D - 1 = "
         f"{math.prod(shape) - 1}); " + _VARIANCE_HINT, {"norm": normalize_unbiased}),
        ("variance", "you divided by the variance sigma^2 + eps; divide by its square root, "
         "sigma = sqrt(var + eps)", {"divide": "var"}),
        ("variance", "your sigma is the root mean square of x, not of x - mu: subtract the "
         "mean before squaring (that is RMSNorm's statistic, Part II)", {"divide": "rms"}),
        ("mean", "the numerator is x, not x - mu: subtract the mean of each example before "
         "dividing", {"center": False}),
        ("variance", "you subtracted the mean but never divided by sigma = sqrt(var + eps)",
         {"divide": "none"}),
        ("eps", "eps is added to sigma, outside the square root; torch and the chapter add it "
         "to the variance: sigma = sqrt(var + eps)", {"norm": normalize_eps_outside}),
        ("eps", "eps is missing: sigma = sqrt(var + eps), so that a row of equal values "
         "gives 0 / sqrt(eps) = 0 instead of 0 / 0", {"eps": 0.0}),
    ]
    if x.dtype == torch.float32:
        out.append(("variance", "your variance is E[x^2] - E[x]^2, computed in one pass: "
                    + _ONE_PASS_HINT, {"norm": normalize_one_pass, "dtype": torch.float32}))
    if case.eps != 1e-5:
        out.append(("eps", f"you used eps = 1e-5, but the call passed eps = {case.eps:g}: use "
                    "the eps argument", {"eps": 1e-5}))
    affine = {"b*x+g": "the gain and the bias are swapped (g multiplies, b is added)",
              "x+b": "the gain g is never applied", "g*x": "the bias b is never added",
              "x": "neither the gain g nor the bias b is applied",
              "(x+b)*g": "the bias is added before the gain multiplies, (x_hat + b) * g"}
    # with g = 1 and b = 0 these equal the right answer and are skipped
    return out + [("gain/bias", f"{why}: the output is g * x_hat + b", {"affine": form})
                  for form, why in affine.items()]


def _call(exercise: str, fn: Callable[..., Any], args: tuple, shown: str, case: str) -> Any:
    __tracebackhide__ = True
    try:
        return fn(*args)
    except ExerciseError:
        raise
    except Exception as e:  # the reader's code failed: say how it was called
        raise ExerciseError(exercise, "error", f"your function raised {type(e).__name__}: {e}\n"
                            f"  It was called as {shown}.", case) from e


_REDUCTIONS = frozenset({"mean", "var", "std", "sum", "var_mean", "std_mean", "nanmean",
                         "nansum", "amax", "amin", "norm", "vector_norm"})
_COPIES = {"tensor": "torch.tensor({name})", "as_tensor": "torch.as_tensor({name})",
           "detach": "{name}.detach()", "numpy": "{name}.numpy()"}


class _Trace(TorchFunctionMode):
    """What the reader's function does with its inputs: the shapes of its reductions' results,
    the copies it makes of a watched input (``torch.tensor(g)``, ``g.detach()``, numpy), and the
    operation that raised, with its operands' shapes and which watched input each one views."""

    def __init__(self, watched: dict[str, Tensor]) -> None:
        super().__init__()
        self.watched = watched
        self.reduced: list[tuple[int, ...]] = []  # result shapes of mean, var, sum, ...
        self.copied: list[str] = []  # e.g. "torch.tensor(g)"
        self.failed: tuple[str, list[tuple[tuple[int, ...], str | None]]] | None = None

    def origin(self, t: Any) -> str | None:
        """The watched input that ``t`` is a view of (same memory, same size), or None."""
        if not isinstance(t, Tensor) or t.numel() == 0 or t.layout != torch.strided:
            return None
        for name, w in self.watched.items():
            if t.numel() == w.numel() and t.data_ptr() == w.data_ptr():
                return name
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        fname = getattr(func, "__name__", "")
        if fname in _COPIES and args and (src := self.origin(args[0])):
            self.copied.append(_COPIES[fname].format(name=src))
        try:
            out = func(*args, **kwargs)
        except Exception:
            if self.failed is None:
                self.failed = (fname, [(tuple(a.shape), self.origin(a)) for a in args
                                       if isinstance(a, Tensor)])
            raise
        if fname in _REDUCTIONS and isinstance(out, Tensor):
            self.reduced.append(tuple(out.shape))
        return out


_IN_PLACE = ("your function changed its input {what} in place ({how}); the caller's tensor is "
             "then wrong for everything that uses it after your function (the next layer, the "
             "optimizer, autograd). Compute new tensors instead: x - mu, not x -= mu or "
             "x.sub_(mu); u = dy * g, not dy *= g")
_SAVED = ("a tensor that autograd saved for the backward pass was changed in place: autograd "
          "refuses to differentiate through it. Write x_hat = (x - mu) / sigma as new tensors, "
          "without in-place operations (-=, /=, .sub_(), .div_(), x[...] = ...)")


def _call_watched(exercise: str, fn: Callable[..., Any], args: tuple, names: Sequence[str],
                  shown: str, case: str, *, shape: tuple[int, ...],
                  copy: bool = True) -> tuple[Any, _Trace]:
    """Call ``fn`` on copies of ``args`` (``copy``; else on them as given) while tracing it;
    raise if it changes an input in place or fails, translating what it raised."""
    __tracebackhide__ = True
    passed = tuple(a.clone() if copy and isinstance(a, Tensor) else a for a in args)
    trace = _Trace({n: a for n, a in zip(names, passed, strict=True)
                    if n and isinstance(a, Tensor)})
    try:
        with trace:
            out = fn(*passed)
    except Exception as e:  # the reader's code failed: say why, when the trace shows it
        part, why = _explain_error(e, trace, args, names, shape)
        raise ExerciseError(exercise, part, f"{why}\n  Your function raised "
                            f"{type(e).__name__}: {e}\n  It was called as {shown}.", case) from e
    for name, a, p in zip(names, args, passed, strict=True):
        if name and isinstance(a, Tensor) and not torch.equal(a.detach(), p.detach()):
            raise ExerciseError(exercise, "in-place", _IN_PLACE.format(
                what=name, how=f"{name} -= ..., {name}.sub_(...) or {name}[...] = ...: the "
                "checker compared it with a copy made before the call"), case)
    return out, trace


def _explain_error(e: Exception, trace: _Trace, args: tuple, names: Sequence[str],
                   shape: tuple[int, ...]) -> tuple[str, str]:
    """``(part, advice)`` for an exception of the reader's function, from the trace."""
    msg = str(e)
    if "leaf Variable that requires grad is being used in an in-place" in msg:
        leaf = next((n for n, a in zip(names, args, strict=True) if isinstance(a, Tensor)
                     and a.requires_grad and a.is_leaf), "an input")
        return "in-place", _IN_PLACE.format(what=leaf, how="here on a tensor that requires "
                                            "grad, which autograd forbids")
    if "modified by an inplace operation" in msg:
        return "in-place", _SAVED
    if "numpy() on Tensor that requires grad" in msg:
        return "gradient", _DETACHED.format(what="no gradient reaches x at all: your function "
                                            "goes through numpy, which autograd cannot follow")
    if trace.failed is None or not ("must match the size" in msg or "broadcast" in msg
                                    or "shape" in msg.lower()):
        return "error", "your function failed on this call"
    op, operands = trace.failed
    xname = "x" if "x" in names else "a"
    x = args[names.index(xname)]
    k = len(shape)
    lead = tuple(x.shape[:-k])
    for shp, origin in operands:  # a gain or a bias reshaped: it has the shape normalized_shape
        if origin in ("g", "b") and shp != shape:
            flat = len(shp) == 1 and len(shape) > 1
            how = ("flattened it to " if flat else "made it ") + str(shp)
            col = " (a column)" if len(shp) == 2 and shp[-1] == 1 else ""
            return "gain/bias", (f"{origin} has the shape normalized_shape {shape} and is used as "
                                 f"it is: g * x_hat + b broadcasts it over the leading dimensions "
                                 f"of x. Your code {how}{col} before the operation {op!r}; "
                                 f"leave {origin} as it is (no reshape, flatten, [:, None] or .T)")
    for shp, _origin in operands:  # a statistic that lost its dimensions
        lost = shp in trace.reduced and len(shp) < x.dim()  # a reduction without keepdim
        if shp and shp != tuple(x.shape) and (shp == lead or lost):
            return "shape", (f"keep the statistics with keepdim=True: a row statistic (a mean, "
                             f"a variance) of shape {shp} does not broadcast against {xname} of "
                             f"shape "
                             f"{tuple(x.shape)} (the operation {op!r} failed). With "
                             f"x.mean(dims, keepdim=True) each row's statistic keeps a "
                             f"dimension of size 1 and is subtracted from its own row")
    return "error", (f"two tensors of shapes {[s for s, _ in operands]} do not broadcast in the "
                     f"operation {op!r}: mu and sigma keep their dimensions (keepdim=True), g "
                     f"and b have the shape normalized_shape {shape}")


def _shape_advice(y: Tensor, x: Tensor, shape: tuple[int, ...], trace: _Trace) -> str:
    """Why the output has the wrong shape, from the shapes the trace saw."""
    k, got = len(shape), tuple(y.shape)
    lead = tuple(x.shape[:-k])
    if got == lead or (got in trace.reduced and y.dim() < x.dim()):
        return ("it is the shape of a statistic: a mean or a sum dropped the normalized "
                "dimensions. Use keepdim=True so that mu and sigma broadcast against x, and "
                "return the normalized x, not its statistics")
    if k > 1 and got == (*lead, math.prod(shape)):
        return (f"the {k} normalized dimensions come back flattened into one of size "
                f"{math.prod(shape)}. Take the statistics over dims = tuple(range(-{k}, 0)) "
                f"with keepdim=True, and multiply by g and add b as they are, of shape "
                f"{shape}: no flattening is needed (or reshape the result to x.shape)")
    if y.numel() > x.numel():
        origin = [o for _, o in (trace.failed or ("", []))[1] if o]
        return ("something broadcast into a larger tensor: g and b have the shape "
                f"normalized_shape {shape} and multiply x_hat as they are (a column g[:, None] "
                "or a statistic without keepdim=True makes a new dimension)"
                + (f"; the trace saw {origin}" if origin else ""))
    return "layer normalization keeps the shape of its input"


def _check_forward_case(fn: ForwardFn, case: _Case, name: str = "check_layer_norm",
                        gradient: bool = True) -> str:
    __tracebackhide__ = True
    x = case.x
    shown = (f"fn(x, {case.shape}, g, b, {case.eps:g}) with x of shape {tuple(x.shape)} and g, "
             f"b of shape {case.shape}")
    y, trace = _call_watched(name, fn, (x, case.shape, case.g, case.b, case.eps),
                             ("x", "", "g", "b", ""), shown, case.name, shape=case.shape)
    if not isinstance(y, Tensor):
        raise ExerciseError(name, "type", f"return a torch.Tensor, got {type(y).__name__}",
                            case.name)
    if tuple(y.shape) != tuple(x.shape):
        raise ExerciseError(name, "shape", f"the output has shape {tuple(y.shape)}, the input "
                            f"{tuple(x.shape)}: {_shape_advice(y, x, case.shape, trace)}",
                            case.name)
    if y.dtype != x.dtype:
        raise ExerciseError(name, "dtype", f"the output is {y.dtype} for a {x.dtype} input; "
                            "keep the input's dtype (do not call .double() or .float() on the "
                            "result)", case.name)
    if case.constant_row is not None and not torch.isfinite(y[case.constant_row]).all():
        raise ExerciseError(name, "eps", "the constant row came out as NaN or inf: its "
                            "variance is 0, so sigma must be sqrt(var + eps) with eps inside "
                            "the square root; the row's output is then exactly the bias b",
                            case.name)
    if not torch.isfinite(y).all():
        if case.probe == "variance":  # a large mean: the one-pass variance turned negative
            raise ExerciseError(name, "variance", "the output holds NaN or inf for finite "
                                f"input: {case.hint}", case.name)
        raise ExerciseError(name, "nan", "the output holds NaN or inf for finite input",
                            case.name)
    ref = F.layer_norm(x.to(_F64), case.shape, case.g.to(_F64), case.b.to(_F64), case.eps)
    err = _max_diff(y, ref)
    if err <= case.tol:
        seen = f"max |yours - torch| = {err:.1e}"
        if x.dtype == _F64 and gradient:  # the values are right: now the gradients
            seen += f"; gradients {_check_forward_gradient(fn, case, shown, name, trace)}"
        return seen
    dims = _dims(x, case.shape)
    for part, why, kw in _forward_mistakes(case):
        wrong = _variant(x, case.g, case.b, **{"eps": case.eps, "dims": dims, **kw})
        if _max_diff(wrong, ref) > 10 * case.tol and _max_diff(y, wrong) <= case.tol:
            raise ExerciseError(name, part, why, case.name)
    raise ExerciseError(name, *_forward_fallback(fn, case, y, ref, err), case.name)


_DETACHED = ("your output is right but its gradient with respect to x is not: {what}. The "
             "mean and the variance depend on x, and the gradient flows through them too "
             "(chapter 3: they remove the components of the gradient along 1 and along x_hat); "
             "compute them from x with torch operations, without .detach(), .item(), .data, "
             "torch.no_grad() or numpy")


def _check_forward_gradient(fn: ForwardFn, case: _Case, shown: str, name: str,
                            trace: _Trace) -> str:
    """Autograd through the reader's function against torch's: dL/dx, dL/dg, dL/db for
    L = sum(y * r), called with leaves that require grad (as a layer's parameters are)."""
    __tracebackhide__ = True
    r = torch.randn(case.x.shape, generator=torch.Generator().manual_seed(7), dtype=_F64)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (case.x, case.g, case.b))
    y, trace = _call_watched(name, fn, (leaves[0], case.shape, leaves[1], leaves[2], case.eps),
                             ("x", "", "g", "b", ""), shown + ", x, g and b leaves requiring "
                             "a gradient", case.name, shape=case.shape, copy=False)

    def grad(out: Tensor) -> tuple[Tensor | None, ...]:  # dL/d(x, g, b) for L = sum(out * r)
        return torch.autograd.grad((out * r).sum(), leaves, allow_unused=True)

    if not (isinstance(y, Tensor) and y.requires_grad):
        raise ExerciseError(name, "gradient", _DETACHED.format(
            what="no gradient reaches x at all"), case.name)
    try:
        mine = grad(y)
    except RuntimeError as e:  # an intermediate saved for backward was changed in place
        raise ExerciseError(name, "in-place", f"{_SAVED}\n  autograd raised: {e}",
                            case.name) from e
    want = grad(F.layer_norm(leaves[0], case.shape, leaves[1], leaves[2], case.eps))
    for label, src, m, w in zip(("x", "g", "b"), ("x", "g", "b"), mine, want, strict=True):
        if label != "x" and not case.plain and (m is None or _max_diff(m, w) > 1e-8):
            copies = [c for c in trace.copied if c.endswith(f"({src})") or
                      c.startswith(f"{src}.")]
            what = ("no gradient reaches it" if m is None else
                    f"it differs from torch's by up to {_max_diff(m, w):.2e}")
            cause = (f"your function made a new tensor with {copies[0]}, which is cut from "
                     f"the graph: the optimizer's {src} then never learns. Use {src} as "
                     f"given: y = g * x_hat + b" if copies else
                     f"use {src} as given, with torch operations (no torch.tensor({src}), "
                     f".detach(), .data, .item() or numpy copies)")
            raise ExerciseError(name, "gradient", f"your output is right but dL/d{label} is "
                                f"not: {what}. {cause}", case.name)
    err = _max_diff(mine[0], want[0]) if mine[0] is not None else math.inf
    if err > 1e-8:
        x = leaves[0]
        detached = _variant(x, case.g, case.b, case.eps, _dims(x, case.shape),
                            norm=normalize_detached)
        what = (f"the gradient differs from torch's by up to {err:.2e}, and it is the gradient "
                "with the mean and the variance detached (treated as constants)"
                if mine[0] is not None and _max_diff(mine[0], torch.autograd.grad(
                    (detached * r).sum(), x)[0]) <= 1e-8 else
                f"it differs from torch's by up to {err:.2e}")
        raise ExerciseError(name, "gradient", _DETACHED.format(what=what), case.name)
    # with g = 1 and b = 0 (plain) only x's gradient is held to torch's: a g or b that the
    # reader's code leaves out shows on the affine cases, where it is named
    pairs = list(zip(mine, want, strict=True))[:1 if case.plain else 3]
    worst = max(_max_diff(m, w) for m, w in pairs if m is not None)
    return f"{'x' if case.plain else '(x, g, b)'} {worst:.1e}"


_EPS_CANDIDATES = (1e-5, 1e-6, 1e-8, 1e-12, 0.0, 1e-3, 1e-4, 1e-7, 1e-9, 1e-10)


def _forward_fallback(fn: ForwardFn, case: _Case, y: Tensor, ref: Tensor, err: float
                      ) -> tuple[str, str]:
    """Which part is off when no known mistake matches: evidence from the reader's own output
    (its statistics, torch's layer norm with another eps, the same call with g = 1, b = 0)."""
    __tracebackhide__ = True
    x, shape = case.x, case.shape
    dims = _dims(x, shape)
    d = math.prod(shape)
    # the index as a tuple (not torch.unravel_index: its first call imports sympy, seconds)
    idx = tuple(int(i) for i in np.unravel_index(int((y.to(_F64) - ref).abs().argmax()), y.shape))
    at = (f"largest difference {err:.2e} at index {idx}: expected {float(ref[idx]):.6g}, "
          f"got {float(y[idx]):.6g}")
    x64, g64, b64 = x.to(_F64), case.g.to(_F64), case.b.to(_F64)
    for eps in _EPS_CANDIDATES:  # a hard-coded eps: torch with that eps gives your output
        if eps != case.eps and _max_diff(y, F.layer_norm(x64, shape, g64, b64, eps)) <= case.tol:
            return "eps", (f"your output is exactly torch's layer norm with eps = {eps:g}, but "
                           f"the call passed eps = {case.eps:g}: use the eps argument, not a "
                           f"constant, inside the square root: sqrt(var + eps)")
    plain = case.plain
    if not plain:  # the same call with g = 1 and b = 0: are the statistics right?
        ones, zeros = torch.ones_like(case.g), torch.zeros_like(case.b)
        try:
            y1 = fn(x.clone(), shape, ones, zeros, case.eps)
        except Exception:  # noqa: BLE001 (any failure: no evidence either way)
            y1 = None
        if isinstance(y1, Tensor) and tuple(y1.shape) == tuple(x.shape):
            if _max_diff(y1, F.layer_norm(x64, shape, None, None, case.eps)) <= case.tol:
                return "gain/bias", (f"with g = 1 and b = 0 your output is right on this "
                                     f"case, so mu and sigma are right and the gain or the bias "
                                     f"is applied wrongly: the output is g * x_hat + b, "
                                     f"elementwise, with g and b of shape normalized_shape "
                                     f"{shape} broadcast as they are against x (no reshaping, "
                                     f"flattening, [:, None] or .T); {at}")
    if plain:
        y64 = y.to(_F64)
        mean = float(y64.mean(dim=dims).abs().max())
        if mean > 1e-6:
            return "mean", (f"with g = 1 and b = 0 every example's output should have mean 0 "
                            f"over the normalized dimensions; yours has means up to {mean:.3g}. "
                            f"Subtract mu = x.mean(dims, keepdim=True) with dims the last "
                            f"len(normalized_shape) dimensions; {at}")
        var, want = (normalize(as_rows(t, dims), 0.0)[1].pow(-2) for t in (y64, ref))
        if float((var - want).abs().max()) > 1e-6:
            ratio = var / want  # (R, 1): (D - 1) / D when sigma came from the unbiased variance
            spread = (f"yours ranges over {float(var.min()):.6g}-{float(var.max()):.6g}, "
                      f"{float(ratio.min()):.6g}-{float(ratio.max()):.6g} times the right one")
            if float((ratio - (d - 1) / d).abs().max()) < 1e-3 / d:
                return "variance", (f"with g = 1 and b = 0 every example's output should have "
                                    f"(biased) variance {float(want.mean()):.6f} (1 up to eps); "
                                    f"{spread}, which is (D - 1) / D = {d - 1}/{d}: "
                                    f"{_VARIANCE_HINT}; {at}")
            return "variance", (f"with g = 1 and b = 0 every example's output should have "
                                f"(biased) variance {float(want.mean()):.6f} (1 up to eps); "
                                f"{spread}, not the (D - 1) / D = {d - 1}/{d} of an unbiased "
                                f"variance: check how sigma is computed, sqrt(mean((x - mu) ** "
                                f"2) + eps) with the eps argument; {at}")
    if err < 1e-3:
        return "other", (f"close but not equal to torch ({at}). Rounding of this size "
                         f"suggests a different formula or an intermediate in lower precision")
    return case.probe, (f"{case.hint}; {at}" if case.hint else at)


def _gradcheck(name: str, fn: Callable[..., Tensor], inputs: tuple[Tensor, ...], what: str,
               case: str) -> tuple[str, str]:
    """:func:`torch.autograd.gradcheck` (finite differences against the function's own
    backward) through every tensor input, in float64, as a report row."""
    __tracebackhide__ = True
    leaves = tuple(t.detach().to(_F64).clone().requires_grad_() for t in inputs)
    try:
        ok = torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)
    except Exception as e:  # gradcheck's own message says which input and which entries
        raise ExerciseError(name, "gradcheck", f"torch.autograd.gradcheck through {what} "
                            f"failed: {str(e)[:600]}", case) from e
    return f"gradcheck through {what}: {case}", "passes" if ok else "fails"


def check_layer_norm(fn: ForwardFn) -> CheckReport:
    """Check the reader's layer normalization forward pass (Exercise 3.1).

    ``fn(x, normalized_shape, g, b, eps)`` must return ``g * (x - mu) / sqrt(var + eps) + b``,
    ``mu`` and the biased ``var`` over the trailing ``normalized_shape`` dims (paper eq. 3), in
    ``x``'s dtype, without changing its inputs. Nine cases are compared with
    :func:`torch.nn.functional.layer_norm`, the float64 ones' gradients with respect to ``x``,
    ``g`` and ``b`` too (called with leaves that require grad), and one case goes through
    :func:`torch.autograd.gradcheck`.

    Returns:
        A :class:`CheckReport`. Raises :class:`ExerciseError` on the first mistake.
    """
    __tracebackhide__ = True
    if not callable(fn):
        raise TypeError(f"check_layer_norm takes your function, got {type(fn).__name__}")
    cases = _forward_cases()
    checks = [(case.name, _check_forward_case(fn, case)) for case in cases]
    c = cases[1]  # (4, 8), a random gain and bias
    checks.append(_gradcheck("check_layer_norm", lambda x, g, b: fn(x, c.shape, g, b, c.eps),
                             (c.x, c.g, c.b), "x, g and b", c.name))
    return CheckReport("check_layer_norm", checks)


# ----------------------------------------------------------------------------------------------
# Exercise 3.4: the backward pass


def _reference_grads(dy: Tensor, a: Tensor, g: Tensor, eps: float) -> tuple[Tensor, ...]:
    """Autograd's ``(dL/da, dL/dg, dL/db)`` through torch's layer norm, for ``L = sum(y * dy)``."""
    a, g = a.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
    b = torch.zeros_like(g, requires_grad=True)
    y = F.layer_norm(a, (a.shape[-1],), g, b, eps)  # (N, H)
    # the scalar sum(y * dy) has gradient dy with respect to y (passing dy as grad_outputs
    # would give the same numbers, but its first call imports sympy, seconds of start-up)
    return torch.autograd.grad((y * dy).sum(), (a, g, b))


_Grads = tuple[Tensor, Tensor, Tensor]
_LABELS = ("dL/da", "dL/dg", "dL/db")
_SAME_SIGMA = "; the backward must use the forward's sigma and a_hat, in dL/da and in dL/dg"
_EPS_OUTSIDE = ("your sigma is sqrt(var) + eps, with eps outside the square root; the forward "
                "(eq. 3 as torch computes it) uses sigma = sqrt(var + eps)" + _SAME_SIGMA)
_UNBIASED = ("your sigma comes from the unbiased variance (divided by H - 1, torch.var's "
             "default); eq. 3 divides by H (unbiased=False, or ((a - mu) ** 2).mean(-1))"
             + _SAME_SIGMA)


_ONE_TERM = ("g enters every term: u = dL/dy * g is the gradient reaching a_hat, and dL/da = "
             "(u - mean(u) - a_hat * mean(u * a_hat)) / sigma has u in all three terms; ")
_A_MINUS_MU = ("the last term needs a_hat = (a - mu) / sigma in both places, a_hat * mean(u * "
               "a_hat) (it comes from d sigma / d a_j = a_hat_j / H); ")
_SUMS = ("the two terms from mu and sigma are means over the row (each a_j moves mu by 1/H "
         "and sigma by a_hat_j / H), not sums: you used ")


def _backward_mistakes(dy: Tensor, a: Tensor, g: Tensor, eps: float
                       ) -> list[tuple[int, str, _Grads]]:
    """``(i, diagnosis, (dL/da, dL/dg, dL/db))`` of each known mistake in gradient ``i``."""
    a_hat, rstd = normalize(a, eps)  # (N, H), (N, 1): eq. 3
    da, dg, db = layer_norm_backward(dy, a_hat, rstd, g)  # the right answer
    no_proj = layer_norm_backward(dy, torch.zeros_like(a_hat), rstd, g)[0]  # (u - mean u) / s

    def with_stats(norm: Callable[..., tuple[Tensor, Tensor]], e: float = eps,
                   backward: dict | None = None) -> _Grads:  # other statistics
        x_hat, r = norm(a, e)
        return layer_norm_backward(dy, x_hat, r, g, **(backward or {}))

    def da_of(**variant: Any) -> _Grads:  # dL/da of layer_norm_backward's variant, the rest right
        return layer_norm_backward(dy, a_hat, rstd, **{"weight": g, **variant})[0], dg, db

    u, c = dy * g, a_hat / rstd  # (N, H): dL/da_hat, and a - mu
    mean_u, mean_ua = u.mean(-1, keepdim=True), (u * a_hat).mean(-1, keepdim=True)  # (N, 1)

    return [
        (0, "the gradient reaching a_hat is u = dL/dy * g; you used dL/dy itself",
         da_of(weight=None)),
        (0, "the term - mean(u) is missing: it comes from mu, which every a_j moves by 1/H (so "
         "dL/da must sum to 0 over each row)", da_of(center=False)),
        (0, "the term - a_hat * mean(u * a_hat) is missing: it comes from sigma, which a_j "
         "moves by a_hat_j / H", (no_proj, dg, db)),
        (0, "you kept only u / sigma: a also moves mu and sigma, which adds - mean(u) - a_hat * "
         "mean(u * a_hat) inside the bracket", da_of(detach=True)),
        (0, "the a_hat term has the wrong sign: dL/da = (u - mean(u) - a_hat * mean(u * "
         "a_hat)) / sigma", (2 * no_proj - da, dg, db)),
        (0, "you multiplied by sigma; the bracket is divided by sigma",
         (da / rstd.square(), dg, db)),
        (0, "the bracket (u - mean(u) - a_hat * mean(u * a_hat)) is not divided by sigma: "
         "dL/da = bracket / sigma. Its rows still sum to 0, so a row-sum check cannot see "
         "this mistake", (da / rstd, dg, db)),
        (0, "your sigma has no eps; the forward used sqrt(var + eps)" + _SAME_SIGMA,
         with_stats(normalize, 0.0)),
        (0, _EPS_OUTSIDE, with_stats(normalize_eps_outside)),
        (0, _EPS_OUTSIDE, with_stats(normalize_eps_outside,
                                     backward={"eps_inside": False, "eps": eps})),
        (0, _UNBIASED, with_stats(normalize_unbiased)),
        (0, _UNBIASED, with_stats(normalize_unbiased, backward={"unbiased": True})),
        (0, _ONE_TERM + "the mean(u) term used dL/dy without g",
         ((u - dy.mean(-1, keepdim=True) - a_hat * mean_ua) * rstd, dg, db)),
        (0, _ONE_TERM + "the a_hat * mean(u * a_hat) term used dL/dy without g",
         ((u - mean_u - a_hat * (dy * a_hat).mean(-1, keepdim=True)) * rstd, dg, db)),
        (0, _ONE_TERM + "the first term is dL/dy without g",
         ((dy - mean_u - a_hat * mean_ua) * rstd, dg, db)),
        (0, _ONE_TERM + "only the first term has g (the two means use dL/dy)",
         ((u - dy.mean(-1, keepdim=True) - a_hat * (dy * a_hat).mean(-1, keepdim=True))
          * rstd, dg, db)),
        (0, _A_MINUS_MU + "yours has a - mu in one of them, (a - mu) * mean(u * a_hat) or "
         "a_hat * mean(u * (a - mu)) (the same numbers), sigma times too large",
         ((u - mean_u - c * mean_ua) * rstd, dg, db)),
        (0, _A_MINUS_MU + "yours is (a - mu) * mean(u * (a - mu)), sigma^2 times too large",
         ((u - mean_u - c * (u * c).mean(-1, keepdim=True)) * rstd, dg, db)),
        (0, _SUMS + "sum(u) instead of mean(u)",
         ((u - u.sum(-1, keepdim=True) - a_hat * mean_ua) * rstd, dg, db)),
        (0, _SUMS + "sum(u * a_hat) instead of mean(u * a_hat)",
         ((u - mean_u - a_hat * (u * a_hat).sum(-1, keepdim=True)) * rstd, dg, db)),
        (0, _SUMS + "sum(u) and sum(u * a_hat) instead of their means",
         ((u - u.sum(-1, keepdim=True) - a_hat * (u * a_hat).sum(-1, keepdim=True)) * rstd,
          dg, db)),
        (1, "dL/dg multiplies dL/dy by a_hat = (a - mu) / sigma; you used a - mu, which is "
         "sigma times too large", (da, (dy * c).sum(0), db)),
        (1, "dL/dg multiplies dL/dy by a_hat, the normalized input, not by a",
         (da, (dy * a).sum(0), db)),
        (1, "dL/dg is the sum over rows of dL/dy * a_hat; you summed dL/dy alone (that is "
         "dL/db)", (da, dy.sum(0), db)),
        (1, "dL/dg sums over the rows of the batch (each row adds its share); you averaged",
         (da, (dy * a_hat).mean(0), db)),
        (1, "dL/dg is the sum over rows of dL/dy * a_hat, with no factor g",
         (da, (dy * a_hat * g).sum(0), db)),
        (2, "dL/db sums dL/dy over the rows of the batch; you averaged", (da, dg, dy.mean(0))),
        (2, "dL/db is the sum over rows of dL/dy, with no factor g", (da, dg, (dy * g).sum(0))),
    ]


def _backward_cases() -> list[tuple[str, Tensor, Tensor, Tensor, float]]:
    gen = torch.Generator().manual_seed(1)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=_F64)

    return [  # (what it tests, a, g, dy, eps)
        ("a (6, 10), a random gain, float64", 1.0 + 2.0 * randn(6, 10),
         0.5 + torch.rand(10, generator=gen, dtype=_F64), randn(6, 10), 1e-5),
        ("a (3, 16) with rows whose variance (about 1e-5) is close to eps = 1e-5",
         1.0 + 3e-3 * randn(3, 16), 0.5 + torch.rand(16, generator=gen, dtype=_F64),
         randn(3, 16), 1e-5),
        ("a (B, T, H) = (2, 3, 8): one (mu, sigma) per (b, t); dL/dg, dL/db sum over b and t",
         1.0 + 2.0 * randn(2, 3, 8), 0.5 + torch.rand(8, generator=gen, dtype=_F64),
         randn(2, 3, 8), 1e-5),
    ]


def check_layer_norm_backward(fn: BackwardFn, *, _name: str = "check_layer_norm_backward",
                              _watch: bool = True) -> CheckReport:
    """Check the reader's hand-written backward of layer normalization (Exercise 3.4).

    ``fn(dy, a, g, eps)`` (``a``, ``dy``: ``(..., H)``, ``g``: ``(H,)``, ``y = g * a_hat + b``
    over the last dimension) returns ``(dL/da (..., H), dL/dg (H,), dL/db (H,))``, compared
    with float64 autograd through :func:`torch.nn.functional.layer_norm` on three cases (rows
    ``(N, H)``, rows whose variance is close to eps, and ``(B, T, H)``); a known mistake is
    named, and a function that changes ``dy``, ``a`` or ``g`` in place fails.

    Returns:
        A :class:`CheckReport`, one row per gradient and case. Raises :class:`ExerciseError`.
    """
    __tracebackhide__ = True
    name = _name
    if not callable(fn):
        raise TypeError(f"{name} takes your function, got {type(fn).__name__}")
    checks = []
    for case, a, g, dy, eps in _backward_cases():
        shown = f"fn(dy, a, g, {eps:g}) with dy and a of shape {tuple(a.shape)}"
        if _watch:
            got, _ = _call_watched(name, fn, (dy, a, g, eps), ("dy", "a", "g", ""), shown, case,
                                   shape=(a.shape[-1],))
        else:
            got = _call(name, fn, (dy.clone(), a.clone(), g.clone(), eps), shown, case)
        if not (isinstance(got, Sequence) and len(got) == 3
                and all(isinstance(t, Tensor) for t in got)):
            raise ExerciseError(name, "type", "return three tensors, (dL/da, dL/dg, dL/db)",
                                case)
        want = _reference_grads(dy, a, g, eps)
        _check_order(name, case, got, want)
        for label, mine, ref in zip(_LABELS, got, want, strict=True):
            if tuple(mine.shape) != tuple(ref.shape):
                hint = (" The gain and the bias are shared by every row, so their gradients "
                        "sum the rows' contributions over every dimension but the last: "
                        ".sum(0) for (N, H) inputs, .sum((0, 1)) for (B, T, H), or "
                        ".sum(dim=tuple(range(dy.dim() - 1))) for both."
                        if label != "dL/da" else "")
                raise ExerciseError(name, "shape", f"{label} has shape {tuple(mine.shape)},"
                                    f" expected {tuple(ref.shape)}.{hint}", case)
        h = a.shape[-1]  # compare as rows (R, H): the known mistakes are computed on rows
        rows = (got[0].reshape(-1, h), got[1], got[2])
        checks += _compare_grads(name, case, rows, (want[0].reshape(-1, h), *want[1:]),
                                 (dy.reshape(-1, h), a.reshape(-1, h), g, eps))
    return CheckReport(name, checks)


def _check_order(name: str, case: str, got: Sequence[Tensor], want: Sequence[Tensor]) -> None:
    """Raise if the three gradients are returned in another order than (dL/da, dL/dg, dL/db)."""
    __tracebackhide__ = True

    def fits(mine: Tensor, ref: Tensor, values: bool) -> bool:
        return tuple(mine.shape) == tuple(ref.shape) and (
            not values or _max_diff(mine, ref) <= 1e-9)

    for values in (True, False):  # first the right numbers in another order, then the shapes
        for perm in itertools.permutations(range(3)):  # the right order, (0, 1, 2), first
            if all(fits(got[i], want[p], values) for i, p in enumerate(perm)):
                if perm == (0, 1, 2):
                    return
                order = ", ".join(_LABELS[p] for p in perm)
                raise ExerciseError(name, "order", f"the return order is swapped: you "
                                    f"returned ({order}); return (dL/da, dL/dg, dL/db)", case)


def _compare_grads(name: str, case: str, got: Sequence[Tensor], want: Sequence[Tensor],
                   inputs: tuple) -> list[tuple[str, str]]:
    __tracebackhide__ = True
    rows = []
    for i in (2, 1, 0):  # the simplest first: dL/db, then dL/dg, then dL/da
        label, err = _LABELS[i], _max_diff(got[i], want[i])
        if err <= 1e-9:
            rows.append((f"{label}: {case}", f"max |yours - autograd| = {err:.1e}"))
            continue
        # a known mistake: first one that gives all three of your gradients, then one that
        # gives this one (your other gradients may hold a second mistake)
        mistakes = _backward_mistakes(*inputs)
        for whole in (True, False):
            for j, why, wrong in mistakes:
                same = range(3) if whole else (i,)
                if (_max_diff(wrong[i], want[i]) > 1e-8
                        and all(_max_diff(got[k], wrong[k]) <= 1e-9 for k in same)
                        and (whole or j == i)):
                    raise ExerciseError(name, label, f"{label} is wrong: {why}", case)
        extra = _self_checks(got[0], *inputs) if i == 0 else ""
        raise ExerciseError(name, label, f"{label} differs from autograd by up to {err:.2e}."
                            + extra, case)
    return rows


def _self_checks(da: Tensor, dy: Tensor, a: Tensor, g: Tensor, eps: float) -> str:
    """Two checks of dL/da that need no reference, with the reader's numbers."""
    sums = float(da.detach().to(_F64).sum(-1).abs().max())
    v = torch.randn(a.shape, generator=torch.Generator().manual_seed(3), dtype=_F64)
    h = 1e-6

    def loss(t: Tensor) -> float:
        return float((F.layer_norm(t, (a.shape[-1],), g, None, eps) * dy).sum())

    fd = (loss(a + h * v) - loss(a - h * v)) / (2 * h)  # dL along v, by finite difference
    yours = float((da.detach().to(_F64) * v).sum())
    return (f" Two checks you can run without a reference: each row of dL/da must sum to 0 "
            f"(adding a constant to a row of a changes nothing); yours sum to up to {sums:.2e}. "
            f"That is necessary, not sufficient (dL/da without its 1/sigma sums to 0 too), so "
            f"also compare with a finite difference: for a random direction v and L = "
            f"sum(dL/dy * y), (L(a + h v) - L(a - h v)) / (2 h) must equal sum(dL/da * v); "
            f"here {fd:.6g} (h = {h:g}) against your {yours:.6g}.")


# ----------------------------------------------------------------------------------------------
# Exercise 3.7, the capstone: layer normalization as a torch.autograd.Function


def check_layer_norm_function(cls: type) -> CheckReport:
    """Check the reader's layer normalization written from memory as a
    :class:`torch.autograd.Function` (Exercise 3.7, chapter 3's capstone).

    ``cls.apply(x, g, b, eps)`` normalizes ``x (..., H)`` over its last dimension with gain and
    bias ``(H,)``; its ``backward`` returns ``(dL/dx, dL/dg, dL/db, None)``. The forward is held
    to :func:`check_layer_norm`'s cases with one trailing dimension, the backward to
    :func:`check_layer_norm_backward`'s (a known mistake is named), and
    :func:`torch.autograd.gradcheck` runs through ``x``, ``g`` and ``b`` for ``(N, H)`` and
    ``(B, T, H)`` inputs.

    Returns:
        A :class:`CheckReport`. Raises :class:`ExerciseError` on the first mistake.
    """
    __tracebackhide__ = True
    name = "check_layer_norm_function"
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        raise TypeError(f"{name} takes your torch.autograd.Function subclass (the class, not "
                        f"an instance), got {cls!r}")

    def forward(x: Tensor, shape: tuple[int, ...], g: Tensor, b: Tensor, eps: float) -> Tensor:
        return cls.apply(x, g, b, eps)

    checks = [(c.name, _check_forward_case(forward, c, name, gradient=False))
              for c in _forward_cases() if len(c.shape) == 1]

    def backward(dy: Tensor, a: Tensor, g: Tensor, eps: float) -> tuple[Tensor, ...]:
        __tracebackhide__ = True
        a, g = (t.detach().clone().requires_grad_() for t in (a, g))
        b = torch.zeros_like(g, requires_grad=True)
        y = cls.apply(a, g, b, eps)
        if not y.requires_grad:
            raise ExerciseError(name, "backward", "the output does not require grad: call "
                                "your class as MyLayerNorm.apply(x, g, b, eps), not its forward")
        try:
            got = torch.autograd.grad((y * dy).sum(), (a, g, b), allow_unused=True)
        except RuntimeError as e:
            if "incorrect number of gradients" in str(e):
                raise ExerciseError(name, "backward", "backward returns one gradient per "
                                    "input of forward, in forward's order: (dL/dx, dL/dg, "
                                    f"dL/db, None), with None for eps. torch says: {e}") from e
            raise
        missing = [lab for lab, t in zip(_LABELS, got, strict=True) if t is None]
        if missing:
            raise ExerciseError(name, "backward", f"backward returned None for "
                                f"{', '.join(missing)}: return a tensor for x, g and b, and "
                                "None only for eps")
        return got

    checks += check_layer_norm_backward(backward, _name=name, _watch=False).checks
    gen = torch.Generator().manual_seed(5)
    for shape in ((4, 6), (2, 3, 5)):
        x = 1.0 + 2.0 * torch.randn(*shape, generator=gen, dtype=_F64)
        g = 0.5 + torch.rand(shape[-1], generator=gen, dtype=_F64)
        b = torch.randn(shape[-1], generator=gen, dtype=_F64)
        checks.append(_gradcheck(name, lambda x, g, b: cls.apply(x, g, b, 1e-5), (x, g, b),
                                 "x, g and b", f"x {shape}"))
    return CheckReport(name, checks)


# ----------------------------------------------------------------------------------------------
# Exercise 3.2: layer normalization in an MLP, trained


def digits_split() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The 8x8 digits' fixed split, flattened: ``(x (1438, 64), y, x_test (359, 64), y_test)``."""
    return (*load_digits_tensor("train", flatten=True), *load_digits_tensor("test", flatten=True))


_NORMALIZERS = (LayerNorm, nn.LayerNorm)
_BATCH_NORMS = (BatchNorm, nn.modules.batchnorm._BatchNorm)
_ACTIVATIONS = (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid, nn.ELU, nn.LeakyReLU, nn.SiLU,
                nn.Softplus)


def _leaf_order(model: nn.Module, x: Tensor) -> tuple[list[tuple[str, nn.Module]], Tensor]:
    """The leaf modules of ``model`` in the order its forward pass calls them, and its output."""
    calls: list[tuple[str, nn.Module]] = []
    names = {m: n for n, m in model.named_modules()}
    hooks = [m.register_forward_hook(lambda mod, _i, _o: calls.append((names[mod], mod)))
             for m in model.modules() if not list(m.children())]
    try:
        out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return calls, out


def _check_placement(name: str, calls: list[tuple[str, nn.Module]]) -> str:
    __tracebackhide__ = True
    seen = " -> ".join(type(m).__name__ for _, m in calls)
    if any(isinstance(m, _BATCH_NORMS) for _, m in calls):
        raise ExerciseError(name, "placement", f"your model uses batch normalization ({seen}); "
                            "this exercise is about layer normalization, which (unlike BN) "
                            "trains at batch size 1: use lnbook.LayerNorm or torch.nn.LayerNorm")
    linears = [i for i, (_, m) in enumerate(calls) if isinstance(m, nn.Linear)]
    lns = [i for i, (_, m) in enumerate(calls) if isinstance(m, _NORMALIZERS)]
    if not lns:
        raise ExerciseError(name, "placement", f"no LayerNorm module ran in the forward pass "
                            f"({seen}). Put lnbook.LayerNorm(H) (or torch.nn.LayerNorm) between "
                            "each hidden Linear and its non-linearity, as a module so that it "
                            "can be found")
    if not linears:
        raise ExerciseError(name, "placement", f"no nn.Linear ran in the forward pass ({seen})")
    if lns[-1] > linears[-1]:
        raise ExerciseError(name, "placement", "a LayerNorm acts on the logits (after the last "
                            f"Linear: {seen}). Leave the output layer un-normalized: normalized "
                            "logits have variance 1, which caps the confidence of every "
                            "prediction (chapter 6.6 computes the ceiling)")
    for i in linears[:-1]:
        lin = calls[i][1]
        nxt = calls[i + 1][1]  # there: a later Linear ran
        if not isinstance(nxt, _NORMALIZERS):
            more = (" The LayerNorm comes after the non-linearity; the paper normalizes the "
                    "summed inputs, before it (eq. 3)." if isinstance(nxt, _ACTIVATIONS) and
                    i + 2 < len(calls) and isinstance(calls[i + 2][1], _NORMALIZERS) else "")
            raise ExerciseError(name, "placement", f"the hidden layer {calls[i][0]!r} (Linear "
                                f"{lin.in_features} -> {lin.out_features}) is followed by "
                                f"{type(nxt).__name__}, not by a LayerNorm ({seen}). Every hidden "
                                "layer's summed inputs are normalized, between the Linear and "
                                f"the non-linearity.{more}")
        shape = tuple(nxt.normalized_shape)
        if shape != (lin.out_features,):
            raise ExerciseError(name, "placement", f"the LayerNorm {calls[i + 1][0]!r} after "
                                f"Linear {lin.in_features} -> {lin.out_features} normalizes "
                                f"over {shape}; use ({lin.out_features},)")
    if len(linears) - 1 < 2:
        raise ExerciseError(name, "placement", f"the exercise asks for two hidden layers, each "
                            "Linear -> LayerNorm -> non-linearity, then an output Linear; your "
                            f"model has {len(linears) - 1} ({seen})")
    return seen


def check_ln_mlp(model_fn: Callable[[], nn.Module], steps: int = 100, batch_size: int = 32,
                 lr: float = 3e-3, seed: int = 0, margin: float = 0.5) -> CheckReport:
    """Check and train the reader's MLP with layer normalization (Exercise 3.2).

    ``model_fn()`` (called under ``torch.manual_seed(seed)``) maps ``(N, 64)`` digits to
    ``(N, 10)`` logits. The checker lists the modules one forward pass calls (two hidden
    ``Linear -> LayerNorm -> non-linearity``, logits not normalized), checks that batch size 1
    works, then trains ``steps`` Adam updates with :func:`lnbook.fit` and asks for a held-out
    NLL below ``margin`` x the trivial predictor's (:func:`lnbook.engine.metrics.prior_nll`).

    Returns:
        A :class:`CheckReport` whose ``figures`` hold ``nll_before``, ``nll_after``,
        ``error_after`` and ``trivial_nll``. Raises :class:`ExerciseError`.
    """
    __tracebackhide__ = True
    name = "check_ln_mlp"
    if not callable(model_fn):
        raise TypeError(f"{name} takes a function that builds your model, got "
                        f"{type(model_fn).__name__}")
    x, y, xt, yt = digits_split()
    torch.manual_seed(seed)
    model = _call(name, model_fn, (), "model_fn()", "")
    if not isinstance(model, nn.Module):
        raise ExerciseError(name, "type", f"model_fn() must return an nn.Module, got "
                            f"{type(model).__name__}")
    model.train()
    calls, out = _call(name, _leaf_order, (model, x[:8]), "model(x) with x of shape (8, 64)",
                       "")
    if not isinstance(out, Tensor) or tuple(out.shape) != (8, 10):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ExerciseError(name, "output", f"for x of shape (8, 64) (8 flattened 8x8 digits) "
                            f"the model must return 10 logits per image, (8, 10); got {got}")
    if torch.allclose(out.sum(-1), torch.ones(8)) and bool((out >= 0).all()):
        raise ExerciseError(name, "output", "the outputs are probabilities (rows sum to 1): "
                            "return the logits and leave the softmax to F.cross_entropy")
    seen = _check_placement(name, calls)
    model.eval()  # (dropout, if any, off) the same weights, one image vs a batch
    with torch.no_grad():  # batch size 1 against 8
        gap = _max_diff(model(x[:1])[0], model(x[:8])[0])
    model.train()
    if gap > 1e-4:
        raise ExerciseError(name, "output", f"one image alone and the same image in a batch of "
                            f"8 get logits that differ by {gap:.2e}: something in the model "
                            "mixes the examples of a batch")
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    with cpu_threads(1):  # a tiny model: more threads only add overhead
        hist = fit(model, Batches(x, y, batch_size=batch_size, seed=seed), opt, steps=steps,
                   eval_every=steps, eval_fn=partial(classification_metrics, x=xt, y=yt),
                   device="cpu", seed=seed, loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                   progress=False)
    trivial = prior_nll(y, yt)
    before, after = hist.metric("nll")[0], hist.metric("nll")[-1]
    error = hist.metric("error")[-1]
    if not after < margin * trivial:
        raise ExerciseError(name, "training", f"after {steps} Adam updates (batch {batch_size}, "
                            f"lr {lr:g}) the held-out loss is {after:.3f} nats (from {before:.3f}),"
                            f" not below {margin * trivial:.3f}, {margin:g} x the "
                            f"{trivial:.3f} nats of always predicting the class frequencies. "
                            "Check that the hidden layers have a non-linearity and that the "
                            "model returns raw logits")
    checks = [
        ("modules called, in order", seen),
        ("one image alone vs in a batch of 8", f"max difference {gap:.1e}"),
        (f"held-out NLL after {steps} updates", f"{before:.3f} -> {after:.3f} nats "
         f"(trivial predictor {trivial:.3f}; needed < {margin * trivial:.3f})"),
        ("held-out error", f"{error:.3f}"),
    ]
    figures = {"nll_before": before, "nll_after": after, "error_after": error,
               "trivial_nll": trivial}
    return CheckReport(name, checks, figures)
