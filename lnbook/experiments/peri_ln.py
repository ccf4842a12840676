"""Normalizing both sides: the residual stream of Pre-LN, Post-LN and Peri-LN Transformers.

Book chapter `14_peri_ln` (Part III), claims P15-P16. Kim et al. (2025) compare Pre-LN
(``x + F(LN(x))``), Post-LN (``LN(x + F(x))``) and Peri-LN (``x + LN(F(LN(x)))``, the norms on
both sides of each sublayer, Gemma 2's "sandwich"): in Pre-LN nothing bounds what a sublayer
adds to the residual stream, whose variance grows with depth and over training; Peri-LN's output
norms bound each addition, and they report steadier training over learning rates and seeds.

:func:`run` trains Pre-LN and Peri-LN over a learning-rate sweep and Post-LN at one rate, every
seed and rate of one placement at once (:func:`lnbook.experiments.stacked.train_stacked`), on
the sort task of :mod:`lnbook.experiments.seq_tasks`; every evaluation records the variance of
the residual stream after each block (``var_0`` ... ``var_L``). The ``quick`` preset is a
6-block, 16-wide model trained for 60 updates (seconds on a CPU); ``paper`` a 24-block,
512-wide one for 10,000 updates.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lnbook.experiments.protocol import Results, Run, make_config
from lnbook.experiments.seq_tasks import SequenceTask, TaskConfig, presets
from lnbook.experiments.stacked import sweep_stacked, train_stacked
from lnbook.seeds import verdict_seeds
from lnbook.transformer import TransformerConfig

__all__ = [
    "NAME",
    "DESCRIPTION",
    "Config",
    "get_config",
    "model_config",
    "variant_name",
    "run",
    "stream_variance",
    "final_by_lr",
    "rise_to_top",
]

NAME = "peri_ln"
DESCRIPTION = (
    "Pre-LN, Post-LN and Peri-LN Transformers: residual-stream variance by depth and over "
    "training, and final loss over a learning-rate sweep (Kim et al. 2025; P15-P16)"
)


@dataclass
class Config(TaskConfig):
    """Settings of the Peri-LN experiment; :func:`get_config` gives the presets.

    The task, model, training and sweep fields are
    :class:`~lnbook.experiments.seq_tasks.TaskConfig`'s (here sort 6 symbols, a 6-block,
    16-wide model with 2 heads, 60 updates of 16 sequences, evaluated every 30 on 128 held-out
    sequences); the experiment's own:

    Attributes:
        lrs: Adam learning rates of the sweep of Pre-LN and Peri-LN, increasing.
        post_lr: the one rate at which Post-LN is trained (for its stream, not its loss).
        n_eval: held-out sequences of each evaluation.
    """

    size: int = 6
    d_model: int = 16
    n_heads: int = 2
    n_layers: int = 6
    batch_size: int = 16
    steps: int = 60
    eval_every: int = 30
    n_test: int = 128
    seeds: tuple[int, ...] = verdict_seeds(5)
    lrs: tuple[float, ...] = (1e-2, 3e-2, 1e-1)
    post_lr: float = 1e-2
    n_eval: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.lrs or any(lr <= 0 for lr in self.lrs) or list(self.lrs) != sorted(self.lrs):
            raise ValueError(f"lrs must be positive and increasing, got {self.lrs}")
        if not self.post_lr > 0 or self.n_eval < 1:
            raise ValueError(f"post_lr must be > 0 and n_eval >= 1, got {self.post_lr}, "
                             f"{self.n_eval}")


_PRESETS = presets(n_layers=24, lrs=(3e-4, 1e-3, 3e-3, 1e-2), post_lr=3e-4, steps=10_000,
                   n_eval=512)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def model_config(config: Config, position: str, seq_len: int) -> TransformerConfig:
    """The layer-normalized Transformer with ``position`` ``"pre"``, ``"post"`` or
    ``"peri"`` (each with its usual final norm: none for Post-LN)."""
    return config.model_config(seq_len, norm="layer", position=position, ln_impl="torch")


def variant_name(position: str, lr: float) -> str:
    """The name of one variant, e.g. ``"pre/lr0.03"``."""
    return f"{position}/lr{lr:g}"


def run(
    config: Config,
    device: str | torch.device = "cpu",
    out: str | os.PathLike | None = None,
    seeds: tuple[int, ...] | list[int] | None = None,
) -> Results:
    """Train Pre-LN and Peri-LN at every rate of ``config.lrs`` and Post-LN at ``post_lr``.

    Every seed and rate of one placement train at once
    (:func:`~lnbook.experiments.stacked.train_stacked`, on ``device``); the runs come back as one
    :class:`Results` (variants :func:`variant_name`, in the order pre, peri, post), each run's
    info with ``lr`` and ``diverged``. ``Results.info`` holds the task's ``uniform_loss`` and
    ``baseline_loss``. With ``out``, the results are also written to ``out/peri_ln.json``.
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a peri_ln.Config (get_config), got "
                        f"{type(config).__name__}")
    return sweep_stacked(NAME, config, device, seeds, out, functools.partial(_train, config))


def _train(config: Config, task: SequenceTask, seeds: tuple[int, ...]) -> list[Run]:
    """Every placement of :func:`run`, each with all its seeds and rates at once."""
    runs = []
    for position, lrs in (("pre", config.lrs), ("peri", config.lrs),
                          ("post", (config.post_lr,))):
        trained = train_stacked(model_config(config, position, task.seq_len), task, seeds,
                                lrs, steps=config.steps, batch_size=config.batch_size,
                                eval_every=config.eval_every, n_eval=config.n_eval)
        runs += [Run(variant_name(position, r.info["lr"]), r.info["seed"], r.history, r.info)
                 for r in trained]
    return runs


def stream_variance(results: Results, variant: str, step: int | None = None) -> np.ndarray:
    """The residual stream's variance after each block, per seed: ``(seeds, L + 1)``.

    Column 0 is the embeddings, column ``l`` block ``l``'s output; ``step`` is the evaluation's
    update count (None: the last evaluation).
    """
    rows = []
    for r in results.select(variant):
        h = r.history
        i = len(h.eval_steps) - 1 if step is None else h.eval_steps.index(step)
        m = h.metrics[i]
        rows.append([m[f"var_{k}"] for k in range(sum(n.startswith("var_") for n in m))])
    return np.array(rows, dtype=float)


def final_by_lr(results: Results, position: str, metric: str = "loss") -> np.ndarray:
    """The final ``metric`` of one placement at every rate of the sweep: ``(seeds, lrs)``."""
    return np.array([results.final(variant_name(position, lr), metric)
                     for lr in results.config["lrs"]], dtype=float).T


def rise_to_top(loss: np.ndarray) -> np.ndarray:
    """How much the final loss rises from a seed's best rate to the sweep's highest rate.

    ``loss`` is ``(seeds, rates)`` with the rates increasing (:func:`final_by_lr`); returns
    ``loss[:, -1] - min over rates``, ``(seeds,)``: 0 when the highest rate is the best, large
    when training at the highest rate falls apart (infinite when its loss is not finite, NaN
    when no rate's is).
    """
    loss = np.asarray(loss, dtype=float)
    if loss.ndim != 2 or loss.shape[1] < 1:
        raise ValueError(f"loss must be (seeds, rates), got shape {loss.shape}")
    top = np.where(np.isfinite(loss[:, -1]), loss[:, -1], np.inf)
    finite = np.where(np.isfinite(loss), loss, np.inf).min(1)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(finite), top - finite, np.nan)
