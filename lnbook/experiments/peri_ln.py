"""Normalizing both sides: the residual stream of Pre-LN, Post-LN and Peri-LN Transformers.

Book chapter `14_peri_ln` (Part III), claims P15-P16 (Kim et al. 2025: Pre-LN ``x + F(LN(x))``,
Post-LN ``LN(x + F(x))``, Peri-LN ``x + LN(F(LN(x)))``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from lnbook.checks import check_config
from lnbook.engine import History, Job, Results, make_config, sweep
from lnbook.experiments.seq_tasks import (
    DeepTaskConfig,
    SequenceTask,
    check_lrs,
    presets,
    stream_variance,
    task_of,
)
from lnbook.experiments.stacked import groups, in_job_order, train_stacked
from lnbook.transformer import TransformerConfig

__all__ = ["NAME", "DESCRIPTION", "Config", "get_config", "model_config", "variant_name", "run",
           "train", "stream_variance", "final_by_lr", "rise_to_top"]

NAME = "peri_ln"
DESCRIPTION = ("Pre-LN, Post-LN and Peri-LN Transformers: residual-stream variance by depth and "
               "over training, and final loss over a learning-rate sweep (Kim et al. 2025; "
               "P15-P16)")


@dataclass
class Config(DeepTaskConfig):
    """Settings of the Peri-LN experiment (:class:`~lnbook.experiments.seq_tasks.DeepTaskConfig`
    plus ``lrs``, the increasing sweep of Pre-LN and Peri-LN; ``post_lr``, Post-LN's one rate; and
    ``n_eval``, held-out sequences per evaluation).
    """

    n_layers: int = 6
    lrs: tuple[float, ...] = (1e-2, 3e-2, 1e-1)
    post_lr: float = 1e-2
    n_eval: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        check_lrs(self.lrs)
        if not self.post_lr > 0 or self.n_eval < 1:
            raise ValueError(f"post_lr must be > 0 and n_eval >= 1, got {self.post_lr}, "
                             f"{self.n_eval}")


_PRESETS = presets(n_layers=24, lrs=(3e-4, 1e-3, 3e-3, 1e-2), post_lr=3e-4, steps=10_000,
                   n_eval=512)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def model_config(config: Config, position: str, seq_len: int) -> TransformerConfig:
    """The Transformer with ``position`` 'pre', 'post' or 'peri'."""
    return config.model_config(seq_len, norm="layer", position=position, ln_impl="torch")


def variant_name(position: str, lr: float) -> str:
    """The name of one variant, e.g. ``"pre/lr0.03"``."""
    return f"{position}/lr{lr:g}"


def run(config: Config, device: str | torch.device = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train Pre-LN and Peri-LN at every rate of ``config.lrs`` and Post-LN at ``post_lr``, every
    seed and rate of one placement at once (all in one job of :func:`lnbook.engine.runner.sweep`);
    variants :func:`variant_name` (pre, peri, post), each recording the stream's variance
    ``var_0 ... var_L``; ``Results.info`` the task's. With ``out``, also writes
    ``out/peri_ln.json`` (finished runs under it are kept).
    """
    check_config(config, Config)
    task = task_of(config)
    variants = {variant_name(p, lr): (p, lr) for p, lrs in (
        ("pre", config.lrs), ("peri", config.lrs), ("post", (config.post_lr,))) for lr in lrs}
    return sweep(NAME, variants, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack="all", steps=config.steps,
                 threads=config.threads, workers=config.workers, info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """A job of :func:`run`: each placement of ``job.variants`` (``(position, lr)``) with all
    its rates and the job's seeds at once; ``(history, info)`` per ``job.pairs`` entry."""
    task, trained = task.to(job.device), {}
    for position, lrs in groups(job.variants).items():
        for r in train_stacked(model_config(config, position, task.seq_len), task, job.seeds,
                               lrs, steps=config.steps, batch_size=config.batch_size,
                               eval_every=config.eval_every, n_eval=config.n_eval,
                               bar=job.bar):
            trained[variant_name(position, r.info["lr"]), r.info["seed"]] = r
    return in_job_order(job, trained)


def final_by_lr(results: Results, position: str, metric: str = "loss") -> np.ndarray:
    """The final ``metric`` of one placement at every rate of the sweep: ``(seeds, lrs)``."""
    return np.array([results.final(variant_name(position, lr), metric)
                     for lr in results.config["lrs"]], dtype=float).T


def rise_to_top(loss: np.ndarray) -> np.ndarray:
    """``loss[:, -1] - min over rates`` per seed for ``loss`` ``(seeds, rates)``, rates increasing:
    how much the final loss rises from a seed's best rate to the highest (inf when the top rate's
    loss is not finite, NaN when no rate's is).
    """
    loss = np.asarray(loss, dtype=float)
    if loss.ndim != 2 or loss.shape[1] < 1:
        raise ValueError(f"loss must be (seeds, rates), got shape {loss.shape}")
    top = np.where(np.isfinite(loss[:, -1]), loss[:, -1], np.inf)
    finite = np.where(np.isfinite(loss), loss, np.inf).min(1)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(finite), top - finite, np.nan)


# --- claims P15 and P16: per-seed inputs to lnbook.ledger.decide_claim (chapter 14) ----------

#: Nats below the position-wise unigram predictor that a compared run must end (P15, P16).
PERI_TRIVIAL = 0.2


def p15_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P15's ``values`` and ``trivial_ok``, per seed at the middle rate of the sweep: log10 of
    Pre-LN's over Peri-LN's final variance of the last block's output, and of their growths
    over training (final over initial); a seed counts when both placements ended
    :data:`PERI_TRIVIAL` below the unigram predictor at that rate."""
    lrs = list(results.config["lrs"])
    mid = len(lrs) // 2
    pre, peri = (variant_name(p, lrs[mid]) for p in ("pre", "peri"))
    end = {n: stream_variance(results, n)[:, -1] for n in (pre, peri)}
    start = {n: stream_variance(results, n, 0)[:, -1] for n in (pre, peri)}
    base = results.info["baseline_loss"]
    left = ((final_by_lr(results, "pre")[:, mid] < base - PERI_TRIVIAL)
            & (final_by_lr(results, "peri")[:, mid] < base - PERI_TRIVIAL))
    larger, grows = "larger stream after training", "grows more over training"
    return {"values": {larger: np.log10(end[pre] / end[peri]),
                       grows: np.log10((end[pre] / start[pre]) / (end[peri] / start[peri]))},
            "trivial_ok": {larger: left, grows: left}}


def p16_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P16's ``values`` and ``trivial_ok``, per seed: the rise of the final loss from the
    best rate to the highest (:func:`rise_to_top`), Pre-LN's minus Peri-LN's; the best final
    loss over the sweep, Peri-LN's minus Pre-LN's; a seed counts when both placements' best
    run ended :data:`PERI_TRIVIAL` below the unigram predictor."""
    pre, peri = final_by_lr(results, "pre"), final_by_lr(results, "peri")
    base = results.info["baseline_loss"]
    both = (pre.min(1) < base - PERI_TRIVIAL) & (peri.min(1) < base - PERI_TRIVIAL)
    steadier, lower = "steadier at a high rate", "lower loss"
    return {"values": {steadier: rise_to_top(pre) - rise_to_top(peri),
                       lower: peri.min(1) - pre.min(1)},
            "trivial_ok": {steadier: both, lower: both}}


__all__ += ["PERI_TRIVIAL", "p15_inputs", "p16_inputs"]
