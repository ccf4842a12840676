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
from lnbook.engine.train import History, max_updates, note_smoke, progress_enabled


def train_copies(losses: Callable[[int], Tensor], evaluate: Callable[[], list[dict[str, float]]],
                 opt: torch.optim.Optimizer, histories: list[History], steps: int, eval_every: int,
                 progress: bool | None = False, desc: str | None = None,
                 bar: tqdm | None = None) -> list[History]:
    """``steps`` updates of every copy; ``losses(step)`` is ``(M,)``, ``evaluate()`` one dict
    per copy, recorded before training, every ``eval_every`` updates and after the last.
    Under :func:`~lnbook.engine.train.capped` it stops after the cap's updates (and evaluates
    there); ``bar`` (a job's, :class:`~lnbook.engine.Job`) counts the updates instead of a bar
    of its own."""
    steps = max_updates(steps)
    t_start = time.perf_counter()
    times: list[float] = []

    def record(step: int) -> None:
        for h, metrics in zip(histories, evaluate(), strict=True):
            h.eval_steps.append(step)
            h.metrics.append(metrics)

    record(0)
    own_bar = bar is None
    if own_bar:
        bar = tqdm(total=steps, disable=not progress_enabled(progress), desc=desc)
    elif desc:
        bar.set_description(desc)
    try:
        for done in range(1, steps + 1):
            t0 = time.perf_counter()
            _update(losses, opt, histories, done)
            times.append(time.perf_counter() - t0)
            bar.update(1)
            if done % eval_every == 0 or done == steps:
                record(done)
    finally:
        if own_bar:
            bar.close()
    wall = time.perf_counter() - t_start
    for h in histories:
        h.wall_time = wall
    note_smoke(sum(p.numel() for g in opt.param_groups for p in g["params"]), times)
    return histories


def _update(losses: Callable[[int], Tensor], opt: torch.optim.Optimizer,
            histories: list[History], done: int) -> None:
    """One update of every copy, recorded in its history."""
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


def updates_to(results: Results, variant: str, metric: str, target: float) -> np.ndarray:
    """Per seed, the first evaluated update with ``metric`` <= ``target`` (never: ``inf``)."""
    out = []
    for run in results.select(variant):
        n = updates_to_reach(run.history.eval_steps, run.history.metric(metric), target)
        out.append(float("inf") if n is None else float(n))
    return np.array(out)
