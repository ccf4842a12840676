"""The measurements of learning curves that the chapters share, written once."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["best_step", "classification_metrics", "mean_after_start", "prior_nll", "speedup",
           "updates_to_reach"]


def _pick(mode: str) -> Callable[[Sequence[float]], float]:
    """``min`` for ``mode="min"``, ``max`` for ``"max"``; anything else raises ``ValueError``."""
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    return min if mode == "min" else max


def updates_to_reach(steps: Sequence[int], values: Sequence[float] | np.ndarray,
                     target: float | Sequence[float], mode: str = "min"
                     ) -> float | np.ndarray:
    """The number of updates at which ``values`` reaches ``target`` (``<=`` for ``mode="min"``,
    ``>=`` for ``"max"``), interpolated linearly between the last evaluation before it and the
    first that reached it; ``math.inf`` if never (the one convention of the book for "never
    reached"). Reached at the first evaluation, or just after a value that is not finite, it is
    that evaluation's step.

    ``values`` ``(E,)`` gives one float; ``(seeds, E)`` gives one per row, ``(seeds,)``, each
    row against ``target`` or its own ``target[k]``.

    Example::

        >>> updates_to_reach([0, 10, 20], [200.0, 150.0, 140.0], 150.0)
        10.0
        >>> updates_to_reach([0, 10, 20], [200.0, 160.0, 140.0], 150.0)  # halfway from 10 to 20
        15.0
        >>> updates_to_reach([0, 10], [[3.0, 1.0], [3.0, 2.0]], [1.0, 1.0])
        array([10., inf])
    """
    _pick(mode)
    rows = np.asarray(values, dtype=float)
    if rows.ndim == 2:
        targets = np.broadcast_to(np.asarray(target, dtype=float), rows.shape[:1])
        return np.array([updates_to_reach(steps, r, t, mode) for r, t in zip(rows, targets,
                                                                             strict=True)],
                        dtype=float)
    if len(steps) != len(rows):
        raise ValueError(f"steps and values differ in length: {len(steps)} vs {len(rows)}")
    sign = 1.0 if mode == "min" else -1.0  # below the target in "min" terms
    prev = None
    for s, v in zip(steps, rows.tolist(), strict=True):
        if sign * v <= sign * target:
            if prev is None or not math.isfinite(prev[1]):
                return float(s)
            (s0, v0) = prev  # v0 had not reached the target: the fraction of the way from it
            return float(s0 + (s - s0) * (v0 - target) / (v0 - v))
        prev = (s, v)
    return math.inf


def speedup(slower: np.ndarray | Sequence[float], faster: np.ndarray | Sequence[float]
            ) -> np.ndarray:
    """``slower / faster``, elementwise, for updates to a target (:func:`updates_to_reach`):
    above 1 where ``faster`` needed fewer updates; ``inf`` where only ``faster`` reached it,
    ``0`` where only ``slower`` did, NaN where neither did.

    Example::

        >>> speedup([300.0, math.inf, 100.0, math.inf], [200.0, 50.0, math.inf, math.inf])
        array([1.5, inf, 0. , nan])
    """
    a = np.asarray(faster, dtype=float)
    b = np.asarray(slower, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"slower and faster differ in shape: {b.shape} vs {a.shape}")
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = b / np.maximum(a, 1)  # a run reaching the target at update 0 counts as 1
    return np.where(np.isinf(a) & np.isinf(b), np.nan, np.where(np.isinf(a), 0.0, ratio))


def mean_after_start(values: np.ndarray) -> np.ndarray:
    """The mean of each curve after step 0, ``(seeds, E) -> (seeds,)``: the area under a
    learning curve, the book's measure of "converges faster"."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or values.shape[1] < 2:
        raise ValueError(f"values must be (seeds, evaluations >= 2), got {values.shape}")
    return values[:, 1:].mean(axis=1)


def best_step(steps: Sequence[int], values: Sequence[float], mode: str = "min") -> int:
    """The evaluation step with the best value (the first one, on ties)."""
    best = _pick(mode)(values)
    return int(steps[list(values).index(best)])


def classification_metrics(model: nn.Module, x: Tensor, y: Tensor,
                           chunk: int = 2000) -> dict[str, float]:
    """Mean NLL (nats) and error rate of a classifier's logits on ``(x, y)``, without
    gradients, in chunks, in whatever mode the model is in."""
    dev = next(model.parameters()).device
    nll, wrong = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), chunk):
            xb, yb = x[i : i + chunk].to(dev), y[i : i + chunk].to(dev)
            logits = model(xb)  # (chunk, classes)
            nll += float(F.cross_entropy(logits, yb, reduction="sum"))
            wrong += int((logits.argmax(1) != yb).sum())
    return {"nll": nll / len(y), "error": wrong / len(y)}


def prior_nll(y_train: Tensor, y_test: Tensor, classes: int = 10) -> float:
    """Held-out NLL (nats) on ``y_test`` of the trivial predictor that outputs the training
    set's class shares, add-one smoothed (no class gets probability 0), in float64."""
    counts = torch.bincount(y_train, minlength=classes).double() + 1.0  # add-one smoothing
    return float(-(counts / counts.sum()).log()[y_test].mean())
