"""Where the norm goes: Post-LN and Pre-LN, gradients at initialization and learning-rate warm-up.

Book chapter `09_norm_placement` (Part II), claims P04-P05. Xiong et al. (2020) compare the
original Transformer's Post-LN block, ``x <- LN(x + F(x))``, with the Pre-LN block,
``x <- x + F(LN(x))`` (plus a final norm). They show that at initialization the gradients of
the parameters near the output are large for Post-LN and well-behaved for Pre-LN, which is why
Post-LN needs a learning-rate warm-up and Pre-LN can do without one. Two measurements:

- :func:`gradient_profiles` (P04): the norm of the loss gradient of each block's parameters at
  initialization (:func:`lnbook.transformer.layer_gradient_norms`), for several depths and
  seeds, for both placements; no training;
- :func:`run` (P05): both placements trained on the sort task with and without a linear
  warm-up of the learning rate (:func:`lnbook.experiments.seq_tasks.linear_warmup`), several
  seeds, every seed and warm-up of one placement at once
  (:func:`lnbook.experiments.stacked.train_stacked`; each copy is the run that
  :func:`lnbook.experiments.seq_tasks.train_transformer` trains alone, up to rounding).

The ``quick`` preset uses a 2-block model (gradient profiles up to 8 blocks) and trains in
seconds on a CPU; ``paper`` uses Xiong et al.'s base sizes (6 layers, width 512) and their
warm-up of 4000 updates, on our synthetic task.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lnbook.experiments.protocol import Results, Run, make_config
from lnbook.experiments.seq_tasks import SequenceTask, TaskConfig, make_task, presets
from lnbook.experiments.stacked import sweep_stacked, train_stacked
from lnbook.seeds import verdict_seeds
from lnbook.transformer import Transformer, TransformerConfig, layer_gradient_norms

__all__ = [
    "NAME",
    "DESCRIPTION",
    "Config",
    "get_config",
    "model_config",
    "variant_name",
    "gradient_profiles",
    "run",
]

PLACEMENTS = ("post", "pre")  # the two of Xiong et al. (2020) (lnbook.transformer has more)
NAME = "placement"
DESCRIPTION = (
    "Post-LN vs Pre-LN Transformer: per-layer gradient norms at initialization for several "
    "depths, and training with and without learning-rate warm-up (Xiong et al. 2020; P04-P05)"
)


@dataclass
class Config(TaskConfig):
    """Settings of the placement experiments; :func:`get_config` gives the presets.

    The task, model, training and sweep fields are
    :class:`~lnbook.experiments.seq_tasks.TaskConfig`'s (here 60 updates, evaluated every 20,
    10 seeds);
    the experiment's own:

    Attributes:
        positions: placements to train, from ``("post", "pre")``.
        warmups: warm-up lengths in updates (0 = none), each trained with each placement.
        lr: peak learning rate of Adam; 0.03 was chosen on pilot runs
            (:func:`lnbook.seeds.pilot_seeds`) as the largest of 0.01, 0.03 and 0.1 at which every
            warmed-up run of both placements leaves the trivial phase (at 0.1 Post-LN's do not,
            with warm-up or without; at 0.01 Post-LN trains as well without warm-up as with).
        grad_depths: numbers of blocks of the models whose gradients are measured at
            initialization.
        grad_seeds: seeds of those models.
        grad_batch: training sequences in the batch whose loss gradient is measured.
    """

    positions: tuple[str, ...] = ("post", "pre")
    warmups: tuple[int, ...] = (0, 20)
    lr: float = 3e-2
    steps: int = 60
    eval_every: int = 20
    seeds: tuple[int, ...] = verdict_seeds(10)
    grad_depths: tuple[int, ...] = (2, 4, 8)
    grad_seeds: tuple[int, ...] = verdict_seeds(10)
    grad_batch: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [p for p in self.positions if p not in PLACEMENTS]
        if bad or not self.positions:
            raise ValueError(f"positions must be drawn from {PLACEMENTS}, got {self.positions}")
        if any(w < 0 or w > self.steps for w in self.warmups) or not self.warmups:
            raise ValueError(f"warmups must lie in [0, steps={self.steps}], got {self.warmups}")
        if any(d < 1 for d in self.grad_depths) or self.grad_batch < 1:
            raise ValueError("grad_depths and grad_batch must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


_PRESETS = presets(warmups=(0, 4000), lr=1e-3, grad_depths=(6, 12, 18), grad_batch=512)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def model_config(config: Config, position: str, n_layers: int, seq_len: int
                 ) -> TransformerConfig:
    """The layer-normalized Transformer with ``position`` "post" or "pre" and ``n_layers``.

    Post-LN has no final norm (its last block ends in one), Pre-LN has one, as usual.
    """
    return config.model_config(seq_len, n_layers=n_layers, norm="layer", position=position)


def variant_name(position: str, warmup: int) -> str:
    """The name of one trained variant, e.g. ``"post/warmup0"`` or ``"pre/warmup20"``."""
    return f"{position}/warmup{warmup}"


def gradient_profiles(
    config: Config, param: str = "mlp.fc2.weight", positions: tuple[str, ...] = PLACEMENTS
) -> dict[str, dict[int, np.ndarray]]:
    """Per-block gradient norms at initialization, for every placement, depth and seed (P04).

    For each placement in ``("post", "pre")``, each depth in ``config.grad_depths`` and each
    seed in ``config.grad_seeds``, a fresh model is built under ``torch.manual_seed(seed)``
    and the gradient of the loss on the first ``grad_batch`` training sequences of the task is
    taken (:func:`lnbook.transformer.layer_gradient_norms`). ``param`` names what is measured
    in each block: a parameter (``"mlp.fc2.weight"``, the second feed-forward matrix) or a
    group (``"block"``, ``"attention"``, ``"ffn"``). ``positions`` are the placements
    measured (both by default).

    Returns:
        ``{position: {depth: norms (seeds, depth)}}``, block 1 (nearest the input) first.
    """
    task = make_task(config.task, config.grad_batch, 1, config.size, config.symbols)
    out: dict[str, dict[int, np.ndarray]] = {}
    if not positions or any(p not in PLACEMENTS for p in positions):
        raise ValueError(f"positions must be drawn from {PLACEMENTS}, got {positions}")
    for position in positions:
        out[position] = {}
        for depth in config.grad_depths:
            rows = []
            for seed in config.grad_seeds:
                torch.manual_seed(seed)
                model = Transformer.from_config(
                    model_config(config, position, depth, task.seq_len))
                norms = layer_gradient_norms(model, task.x, task.y)
                rows.append([block[param] for block in norms])
            out[position][depth] = np.array(rows)  # (seeds, depth)
    return out


def run(
    config: Config,
    device: str | torch.device = "auto",
    out: str | os.PathLike | None = None,
    seeds: tuple[int, ...] | list[int] | None = None,
) -> Results:
    """Train every (placement, warm-up) variant with every seed (claim P05).

    Variants are named by :func:`variant_name`. Each run uses Adam with peak rate
    ``config.lr``, reached after ``warmup`` updates of linear warm-up (or at once for 0), and
    records ``loss``, ``accuracy`` and ``max_logit`` on the held-out set at every evaluation;
    ``Results.info`` holds the task's ``uniform_loss`` and ``baseline_loss``. A run whose loss
    stops being finite is marked ``diverged`` in its info (see
    :func:`lnbook.experiments.seq_tasks.train_transformer`). Every seed and warm-up of one
    placement train at once on ``device`` (:func:`~lnbook.experiments.stacked.train_stacked`;
    ``config.workers`` and ``checkpoint`` are not used); with ``out``, the results are also
    written to ``out/placement.json``.
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a placement.Config (get_config), got "
                        f"{type(config).__name__}")
    return sweep_stacked(NAME, config, device, seeds, out, functools.partial(_train, config))


def _train(config: Config, task: SequenceTask, seeds: tuple[int, ...]) -> list[Run]:
    """Every placement of :func:`run`, each with all its seeds and warm-ups at once."""
    runs = []
    for position in config.positions:
        trained = train_stacked(
            model_config(config, position, config.n_layers, task.seq_len), task, seeds,
            [config.lr] * len(config.warmups), steps=config.steps,
            batch_size=config.batch_size, eval_every=config.eval_every,
            warmup=list(config.warmups), order="fit", max_logit=True,
            stream_var=False)
        runs += [Run(variant_name(position, r.info["warmup"]), r.info["seed"], r.history,
                     r.info) for r in trained]
    return runs
