"""The argument checks every public function and layer of lnbook makes, in one place.

A wrong input gets the same kind of message everywhere: what was expected, named, and what was
given. Where torch rejects the same mistake, lnbook raises an exception of torch's type for it
too, so that a user's ``except RuntimeError`` or ``except TypeError`` around torch code also
catches lnbook's error:

- a value of the wrong *type* (a ``str`` for a size, an ``int`` for a flag, an integer tensor)
  raises :class:`TypeError`, as torch does;
- a value of the right type but outside what is allowed (a size of 0, an unknown choice) raises
  :class:`ValueError`;
- a tensor whose *shape* does not fit raises :class:`ShapeError`, which is both a
  :class:`ValueError` (lnbook's own word for it) and a :class:`RuntimeError` (what torch's
  kernels raise for a shape mismatch).

Nothing here knows about normalization; :mod:`lnbook.norms` and every other module import it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TypeVar

import torch
from torch import Tensor

__all__ = [
    "ShapeError",
    "check_floating",
    "check_bool",
    "check_size",
    "check_shape",
    "check_trailing",
    "check_param",
    "check_eps",
    "check_choice",
    "as_normalized_shape",
    "make_module",
]

_T = TypeVar("_T")


class ShapeError(ValueError, RuntimeError):
    """A tensor of the wrong shape: a :class:`ValueError` and, as torch's kernels raise for the
    same mistake, a :class:`RuntimeError`."""


def check_floating(x: object, what: str = "input") -> None:
    """Raise ``TypeError`` unless ``x`` is a floating-point :class:`torch.Tensor`.

    Args:
        x: the object to check.
        what: its name in the message, e.g. ``"input"`` or ``"hx"``.

    Example::

        >>> check_floating(torch.ones(2), "input")  # passes
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{what} must be a floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}; convert it with .float() first"
        )


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``; else raise ``TypeError``.

    ``0``, ``1`` and ``"False"`` are refused: ``bool("False")`` is ``True``, so accepting
    them would flip an option silently (torch's modules refuse them too).

    Example::

        >>> check_bool("batch_first", True)
        True
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {value!r}")
    return value


def check_size(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` as an int if it is an integer ``>= minimum``.

    A value that is not an integer (``3.0``, ``"3"``, ``True``) raises ``TypeError``; an
    integer below ``minimum`` raises ``ValueError``. Use ``minimum=0`` for sizes that may be
    0, such as ``proj_size``.

    Example::

        >>> check_size("hidden_size", 256)
        256
    """
    want = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {want}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return int(value)


def check_shape(x: Tensor, shape: Sequence[int | None], what: str = "input") -> None:
    """Raise :class:`ShapeError` unless ``x`` has exactly ``shape`` (``None``: any size there).

    Example::

        >>> check_shape(torch.zeros(4, 3), (None, 3), "hx")  # passes
    """
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
    """Return ``eps`` as a float if it is a finite number > 0 (or ``None``, if allowed).

    A value that is not a real number raises ``TypeError``; one that is not finite and
    positive raises ``ValueError``. ``allow_none=True`` lets ``None`` through (torch's
    ``rms_norm`` takes it for "the dtype's machine epsilon").
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
    """Return ``value`` if it is one of ``choices``; else raise ``ValueError`` naming them.

    Example::

        >>> check_choice("nonlinearity", "tanh", ("tanh", "relu"))
        'tanh'
    """
    if value not in choices:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
        )
    return value


def as_normalized_shape(normalized_shape: object) -> tuple[int, ...]:
    """``normalized_shape`` (an int or a sequence of ints, as torch takes it) as a tuple.

    A ``str`` is refused (``"12"`` is not the shape ``(1, 2)``), and so is a sequence holding
    anything but ints.

    Example::

        >>> as_normalized_shape(8), as_normalized_shape([4, 8])
        ((8,), (4, 8))
    """
    if type(normalized_shape) is tuple and all(  # the common case first: no message built
            type(s) is int and s > 0 for s in normalized_shape) and normalized_shape:
        return normalized_shape
    bad = TypeError(
        f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
    )
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        shape: tuple[int, ...] = (int(normalized_shape),)
    elif isinstance(normalized_shape, (str, bytes)) or not isinstance(
        normalized_shape, (Sequence, torch.Size)
    ):
        raise bad
    else:
        if any(isinstance(s, bool) or not isinstance(s, numbers.Integral)
               for s in normalized_shape):
            raise bad
        shape = tuple(int(s) for s in normalized_shape)
    if len(shape) == 0 or any(s <= 0 for s in shape):
        raise ValueError(f"normalized_shape must hold one or more positive sizes, got {shape}")
    return shape


def make_module(
    factory: object, size: int, what: str = "norm",
    device: torch.device | str | None = None, dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """``factory(size)``, checked to be a :class:`torch.nn.Module`, on ``device`` in ``dtype``.

    How a model builds a layer it was given as a factory (``norm=torch.nn.LayerNorm``,
    ``norm=lnbook.RMSNorm``, ...). A factory that is not callable, or that returns something
    other than a module, raises :class:`TypeError` naming ``what``.
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
