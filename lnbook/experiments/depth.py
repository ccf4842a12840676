"""The curse of depth: what each block of a deep, narrow Pre-LN Transformer contributes.

Book chapter `15_curse_of_depth` (Part III), claims P17-P18 (Sun et al. 2025; LayerNorm Scaling
multiplies each norm's output in block ``l`` by ``1 / sqrt(l)``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.func import jvp

from lnbook.checks import check_config
from lnbook.engine import History, Job, Results, make_config, sweep
from lnbook.experiments.seq_tasks import (
    DeepTaskConfig,
    SequenceTask,
    presets,
    stream_variance,
    task_of,
)
from lnbook.experiments.stacked import train_stacked
from lnbook.transformer import Transformer, TransformerConfig, residual_stream, sequence_loss

__all__ = ["NAME", "DESCRIPTION", "VARIANTS", "Config", "get_config", "model_config", "run",
           "train", "removal_costs", "jacobian_distance", "per_block", "halves"]

NAME = "depth"
DESCRIPTION = ("Deep, narrow Pre-LN Transformer with and without LayerNorm Scaling: stream "
               "variance, cost of removing each block, distance of each block's Jacobian from the "
               "identity (Sun et al. 2025; P17-P18)")
VARIANTS = {"pre": False, "scaled": True}  # variant name -> depth_scaling


@dataclass
class Config(DeepTaskConfig):
    """Settings of the depth experiment (:class:`~lnbook.experiments.seq_tasks.DeepTaskConfig`
    plus ``lr``; ``n_eval``, held-out sequences of each evaluation and measurement; ``n_dirs``,
    random directions per block for :func:`jacobian_distance`).
    """

    n_layers: int = 8
    lr: float = 1e-2
    n_eval: int = 64
    n_dirs: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.lr > 0 or self.n_eval < 1 or self.n_dirs < 1:
            raise ValueError(f"lr must be > 0 and n_eval, n_dirs >= 1, got {self.lr}, "
                             f"{self.n_eval}, {self.n_dirs}")
        if self.n_layers < 2:
            raise ValueError(f"n_layers must be >= 2 (early and deep halves), got "
                             f"{self.n_layers}")


_PRESETS = presets(n_layers=32, lr=1e-3, steps=10_000, n_eval=512, n_dirs=16)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def model_config(config: Config, depth_scaling: bool, seq_len: int) -> TransformerConfig:
    """The Pre-LN Transformer, with LayerNorm Scaling when ``depth_scaling``."""
    return config.model_config(seq_len, norm="layer", position="pre",
                               depth_scaling=depth_scaling, ln_impl="torch")


def removal_costs(model: Transformer, x: Tensor, y: Tensor) -> list[float]:
    """The rise in loss on ``(x, y)`` when each block is skipped (``x_l = x_{l-1}``)."""
    stream = residual_stream(model, x)  # [x_0, ..., x_L]
    with torch.no_grad():
        full = float(sequence_loss(model(x), y))
        costs = []
        for skip in range(1, len(model.blocks) + 1):
            h = stream[skip - 1]  # x_skip = x_{skip-1}
            for block in model.blocks[skip:]:
                h = block(h)  # (B, T, D)
            costs.append(float(sequence_loss(model.head(model.final_norm(h)), y)) - full)
    return costs


def jacobian_distance(model: Transformer, x: Tensor, n_dirs: int, seed: int = 0
                      ) -> list[float]:
    """Mean over ``n_dirs`` random directions ``v`` (drawn with ``seed``) of
    ``||J v - v|| / ||v||``, ``J`` each block's Jacobian at its input
    (:func:`torch.func.jvp`), block 1 first.
    """
    g = torch.Generator().manual_seed(seed)
    stream = residual_stream(model, x)
    out = []
    for block, h in zip(model.blocks, stream, strict=False):
        d = []
        for _ in range(n_dirs):
            v = torch.randn(h.shape, generator=g, dtype=h.dtype)  # (B, T, D)
            _, jv = jvp(block, (h,), (v,))
            d.append(float((jv - v).detach().norm() / v.norm()))
        out.append(float(np.mean(d)))
    return out


def run(config: Config, device: str | torch.device = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train the Pre-LN model with and without LayerNorm Scaling (:data:`VARIANTS`), every seed
    of a variant at once (a job of :func:`lnbook.engine.runner.sweep`); each run's info holds
    ``removal`` and ``jacobian`` per block; ``Results.info`` the task's. With ``out``, also
    writes ``out/depth.json`` (finished runs under it are kept).
    """
    check_config(config, Config)
    task = task_of(config)
    return sweep(NAME, VARIANTS, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack="seeds", steps=config.steps,
                 threads=config.threads, workers=config.workers, info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """The job of one variant of :func:`run` (``job.params``: ``depth_scaling``), every seed
    at once, each trained model measured block by block on ``n_eval`` held-out sequences (on
    the CPU); ``(history, info)`` per seed."""
    x, y = task.x_test[: config.n_eval], task.y_test[: config.n_eval]  # the CPU's, as the models
    out = []
    for r in train_stacked(model_config(config, job.params, task.seq_len),
                           task.to(job.device), job.seeds, [config.lr], steps=config.steps,
                           batch_size=config.batch_size, eval_every=config.eval_every,
                           n_eval=config.n_eval, bar=job.bar):
        info = {**r.info, "removal": removal_costs(r.model, x, y),
                "jacobian": jacobian_distance(r.model, x, config.n_dirs, r.info["seed"])}
        out.append((r.history, info))
    return out


def per_block(results: Results, variant: str, what: str, step: int | None = None
              ) -> np.ndarray:
    """One value per (seed, block) of a variant, ``(seeds, L)``: ``what`` ``"removal"``,
    ``"jacobian"`` or ``"variance"`` (of each ``x_l`` after ``step`` updates; None: the last).
    """
    if what not in ("removal", "jacobian", "variance"):
        raise ValueError(f"what must be 'removal', 'jacobian' or 'variance', got {what!r}")
    if what == "variance":
        return stream_variance(results, variant, step)[:, 1:]
    return np.array([r.info[what] for r in results.select(variant)], dtype=float)


def halves(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean over the early and the deep half of the blocks, ``(seeds,)`` each."""
    n = values.shape[1] // 2
    return values[:, :n].mean(1), values[:, values.shape[1] - n:].mean(1)


# --- claims P17 and P18: per-seed inputs to lnbook.ledger.decide_claim (chapter 15) ----------

#: Nats below the position-wise unigram predictor a model must end to leave the trivial phase.
TRIVIAL_BAR = 0.2


def left_trivial(results: Results) -> dict[str, np.ndarray]:
    """Per variant of :data:`VARIANTS`, whether each seed's final held-out loss lies
    :data:`TRIVIAL_BAR` nats below ``Results.info["baseline_loss"]``: ``(seeds,)`` booleans."""
    base = results.info["baseline_loss"]
    return {n: results.final(n, "loss") < base - TRIVIAL_BAR for n in VARIANTS}


def p17_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P17's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed of
    the Pre-LN model: log10 of the last block's output variance over the middle block's
    (block ``L // 2``), and the deep half's mean removal cost and Jacobian distance minus the
    early half's (:func:`halves`); a seed counts where the model left the trivial phase."""
    var = per_block(results, "pre", "variance")  # (seeds, L)
    cost = halves(per_block(results, "pre", "removal"))
    jac = halves(per_block(results, "pre", "jacobian"))
    parts = ("variance grows with depth", "deep blocks cost less to remove",
             "deep Jacobians nearer the identity")
    values = {parts[0]: np.log10(var[:, -1] / var[:, var.shape[1] // 2 - 1]),
              parts[1]: cost[1] - cost[0], parts[2]: jac[1] - jac[0]}
    return {"values": values, "trivial_ok": dict.fromkeys(parts, left_trivial(results)["pre"])}


def p18_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P18's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed:
    log10 of the last block's output variance without LayerNorm Scaling over with it, the deep
    half's mean Jacobian distance with minus without, and the final held-out loss with minus
    without; a seed counts where both models left the trivial phase."""
    var = {n: per_block(results, n, "variance")[:, -1] for n in VARIANTS}
    jac = {n: halves(per_block(results, n, "jacobian"))[1] for n in VARIANTS}
    loss = {n: results.final(n, "loss") for n in VARIANTS}
    left = left_trivial(results)
    parts = ("limits the growth", "deep blocks contribute more", "lower loss")
    values = {parts[0]: np.log10(var["pre"] / var["scaled"]),
              parts[1]: jac["scaled"] - jac["pre"], parts[2]: loss["scaled"] - loss["pre"]}
    return {"values": values, "trivial_ok": dict.fromkeys(parts, left["pre"] & left["scaled"])}


__all__ += ["TRIVIAL_BAR", "left_trivial", "p17_inputs", "p18_inputs"]
