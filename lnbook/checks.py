"""The argument checks every public function and layer of lnbook makes, in one place.

Exception types follow torch: a wrong type raises ``TypeError``, a bad value ``ValueError``, a
wrong tensor shape :class:`ShapeError` (a ``ValueError`` and a ``RuntimeError``), an input whose
dtype does not go with the parameters' :class:`DTypeError` (a ``TypeError``, and the
``RuntimeError`` and ``ValueError`` torch raises for it).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

__all__ = ["ShapeError", "DTypeError", "check_floating", "check_param_dtype", "check_bool",
           "check_size", "check_shape", "check_trailing", "check_param", "check_eps",
           "check_choice", "check_subset", "check_config", "as_normalized_shape", "make_module"]

_T = TypeVar("_T")


class ShapeError(ValueError, RuntimeError):
    """A tensor of the wrong shape: a :class:`ValueError` and, as torch's kernels raise for the
    same mistake, a :class:`RuntimeError`."""


class DTypeError(TypeError, ValueError, RuntimeError):
    """An input whose dtype does not go with a module's parameters (or parameters of two dtypes):
    a :class:`TypeError`, and what torch raises for the same mistake, a :class:`RuntimeError`
    from its normalization kernels ("mixed dtype") and a :class:`ValueError` from its recurrent
    layers."""


_HALF = (torch.float16, torch.bfloat16)


def check_param_dtype(x: Tensor, **params: Tensor | None) -> None:
    """Raise :class:`DTypeError` unless the parameters (``name=tensor`` or None) share one
    dtype that goes with ``x``'s, by torch's rule for its normalization layers: ``x``'s own
    dtype, or float32 for a float16 or bfloat16 ``x`` (statistics in float32)."""
    dt = x.dtype
    for p in params.values():  # the common case first: every dtype is x's, nothing to say
        if p is not None and p.dtype != dt:
            break
    else:
        return
    given = {n: p for n, p in params.items() if p is not None}
    dtypes = {p.dtype for p in given.values()}
    if len(dtypes) > 1:
        each = ", ".join(f"{n} {p.dtype}" for n, p in given.items())
        raise DTypeError(f"the parameters must share one dtype, got {each}")
    (want,) = dtypes
    if dt in _HALF and want == torch.float32:
        return
    raise DTypeError(
        f"input dtype {dt} does not match the dtype {want} of {', '.join(given)}: convert "
        f"the input with .to({want}) or the module with .to({dt}) (a float16 or bfloat16 "
        "input may also take float32 parameters)"
    )


def check_floating(x: object, what: str = "input") -> None:
    """Raise ``TypeError`` unless ``x`` is a floating-point tensor (``what`` names it)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{what} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}; convert it with .float() first"
        )


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool`` (not 0, 1 or a string); else raise ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {value!r}")
    return value


def check_size(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``; ``TypeError`` for a non-integer, else ``ValueError``."""
    want = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {want}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return int(value)


def check_shape(x: Tensor, shape: Sequence[int | None], what: str = "input") -> None:
    """Raise :class:`ShapeError` unless ``x`` has exactly ``shape`` (``None``: any size)."""
    if x.dim() != len(shape) or any(
        s is not None and s != n for s, n in zip(shape, x.shape, strict=True)
    ):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape)
        want += ",)" if len(shape) == 1 else ")"
        raise ShapeError(f"{what} must have shape {want}, got {tuple(x.shape)}")


def check_trailing(x: Tensor, shape: tuple[int, ...]) -> None:
    """Raise :class:`ShapeError` unless the trailing dimensions of ``x`` are ``shape``."""
    k = len(shape)
    if x.dim() < k or tuple(x.shape[x.dim() - k :]) != shape:
        raise ShapeError(
            f"normalized_shape {shape} must match the trailing dimensions of the input, "
            f"but the input has shape {tuple(x.shape)}"
        )


def check_param(p: Tensor | None, name: str, shape: tuple[int, ...]) -> None:
    """Check an optional parameter (``weight``, ``bias``): ``None``, or floating of ``shape``."""
    if p is None:
        return
    check_floating(p, name)
    if tuple(p.shape) != shape:
        raise ShapeError(f"{name} must have shape {shape}, got {tuple(p.shape)}")


def check_eps(eps: object, name: str = "eps", allow_none: bool = False) -> float | None:
    """Return ``eps`` as a float if finite and > 0 (or ``None`` with ``allow_none``, torch's
    ``rms_norm`` default); ``TypeError`` for a non-number, else ``ValueError``.
    """
    if eps is None and allow_none:
        return None
    what = "None or a finite number > 0" if allow_none else "a finite number > 0"
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {eps!r} ({type(eps).__name__})")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"{name} must be {what} (keeps sigma away from 0), got {eps!r}")
    return float(eps)


def check_choice(name: str, value: _T, choices: Sequence[object]) -> _T:
    """Return ``value`` if it is one of ``choices``; else raise ``ValueError`` naming them."""
    if value not in choices:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
        )
    return value


def check_subset(name: str, values: Iterable[object], choices: Sequence[object]) -> None:
    """Raise ``ValueError`` naming ``choices`` and every one of ``values`` that is not one."""
    bad = [v for v in values if v not in choices]
    if bad:
        raise ValueError(f"{name} must be drawn from {tuple(choices)}, got {bad}")


def check_config(config: object, cls: type, maker: str | None = "get_config") -> None:
    """Raise ``TypeError`` naming ``cls`` (as ``module.Name``) and ``maker`` unless ``config``
    is a ``cls``."""
    if not isinstance(config, cls):
        hint = f" (make one with {maker})" if maker else ""
        raise TypeError(f"config must be a {cls.__module__.rsplit('.', 1)[-1]}.{cls.__qualname__}"
                        f"{hint}, got {type(config).__name__}")


def as_normalized_shape(normalized_shape: object) -> tuple[int, ...]:
    """``normalized_shape`` (an int or a sequence of ints, not a str) as a tuple of ints > 0."""
    if type(normalized_shape) is tuple and all(  # the common case first: no message built
            type(s) is int and s > 0 for s in normalized_shape) and normalized_shape:
        return normalized_shape
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        shape: tuple[int, ...] = (int(normalized_shape),)
    elif (isinstance(normalized_shape, (str, bytes)) or not isinstance(normalized_shape, Sequence)
          or any(isinstance(s, bool) or not isinstance(s, numbers.Integral)
                 for s in normalized_shape)):
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    else:
        shape = tuple(int(s) for s in normalized_shape)
    if len(shape) == 0 or any(s <= 0 for s in shape):
        raise ValueError(f"normalized_shape must hold one or more positive sizes, got {shape}")
    return shape


def make_module(factory: object, size: int, what: str = "norm",
                device: torch.device | str | None = None,
                dtype: torch.dtype | None = None) -> torch.nn.Module:
    """``factory(size)``, checked to be a :class:`torch.nn.Module` (else ``TypeError``
    naming ``what``), on ``device`` in ``dtype``.
    """
    if not callable(factory):
        raise TypeError(f"{what} must be a callable size -> torch.nn.Module (for example "
                        f"torch.nn.LayerNorm or lnbook.RMSNorm), got {type(factory).__name__}")
    m = factory(size)
    if not isinstance(m, torch.nn.Module):
        raise TypeError(f"{what}({size}) must return a torch.nn.Module (for example "
                        f"torch.nn.LayerNorm({size})), got {type(m).__name__}")
    to = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    return m.to(**to) if to else m
