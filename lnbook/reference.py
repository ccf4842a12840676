"""The plain numpy layer normalization the book starts from (paper eq. 3; chapter 3).

No autograd, no dtype tricks: the three lines of eq. 3 and the gain and bias of eq. 4. The
package's :func:`lnbook.layer_norm` and :class:`lnbook.LayerNorm` are tested against it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["layer_norm_numpy"]


def layer_norm_numpy(
    x: np.ndarray,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> np.ndarray:
    """Layer-normalize ``x`` over its trailing ``weight.ndim`` axes (eq. 3; chapter 3).

    Args:
        x: array ``(*, *S)``.
        weight: gain of shape ``S``; None means S is the last axis and the gain is 1.
        bias: bias of shape ``S``, or None for 0.
        eps: added to the variance inside the square root.

    Returns:
        ``(x - mu) / sqrt(sigma^2 + eps) * weight + bias``, the same shape as ``x``.

    Example::

        >>> layer_norm_numpy(np.array([[1.0, 2.0, 3.0]])).round(3)
        array([[-1.225,  0.   ,  1.225]])
    """
    x = np.asarray(x)
    k = 1 if weight is None else np.ndim(weight)
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)  # eq. 3, left
    sigma2 = ((x - mu) ** 2).mean(axis=axes, keepdims=True)  # eq. 3, right (squared)
    y = (x - mu) / np.sqrt(sigma2 + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
