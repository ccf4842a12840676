"""Training loop and readout shared by the stacked experiments (`reader`, `draw`, `handwriting`,
`mnist`, `attention_geometry`).

Copy ``k``'s loss depends only on its own parameters, so the gradient of the summed losses is
each copy's own, and an elementwise optimizer (Adam) makes each copy's update as ``fit`` would.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from lnbook.engine.metrics import updates_to_reach
from lnbook.engine.results import Results
from lnbook.engine.train import History, progress_enabled


def train_copies(losses: Callable[[int], Tensor], evaluate: Callable[[], list[dict[str, float]]],
                 opt: torch.optim.Optimizer, histories: list[History], steps: int, eval_every: int,
                 progress: bool | None = False, desc: str | None = None) -> list[History]:
    """``steps`` updates of every copy; ``losses(step)`` is ``(M,)``, ``evaluate()`` one dict
    per copy, recorded before training, every ``eval_every`` updates and after the last."""
    t_start = time.perf_counter()

    def record(step: int) -> None:
        for h, metrics in zip(histories, evaluate(), strict=True):
            h.eval_steps.append(step)
            h.metrics.append(metrics)

    record(0)
    for done in tqdm(range(1, steps + 1), disable=not progress_enabled(progress), desc=desc):
        loss = losses(done - 1)  # (M,)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        values = loss.tolist()
        if not all(np.isfinite(values)):
            raise FloatingPointError(f"the training losses are {values} at update {done}")
        opt.step()
        for h, v in zip(histories, values, strict=True):
            h.steps.append(done)
            h.losses.append(v)
        if done % eval_every == 0 or done == steps:
            record(done)
    wall = time.perf_counter() - t_start
    for h in histories:
        h.wall_time = wall
    return histories


def updates_to(results: Results, variant: str, metric: str, target: float) -> np.ndarray:
    """Per seed, the first evaluated update with ``metric`` <= ``target`` (never: ``inf``)."""
    out = []
    for run in results.select(variant):
        n = updates_to_reach(run.history.eval_steps, run.history.metric(metric), target)
        out.append(float("inf") if n is None else float(n))
    return np.array(out)
