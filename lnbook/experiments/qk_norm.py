"""QK-norm and attention-logit growth: a learning-rate sweep with and without normalized q and k.

Book chapter `11_qk_norm` (Part II), claims P08-P09 (Dehghani et al. 2023; Wortsman et al. 2024).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from lnbook.checks import check_choice, check_config
from lnbook.engine import History, Job, Results, make_config, sweep
from lnbook.experiments.seq_tasks import SequenceTask, TaskConfig, check_lrs, presets, task_of
from lnbook.experiments.stacked import groups, in_job_order, train_stacked
from lnbook.norms import LN_IMPL, LN_IMPLS
from lnbook.transformer import Transformer, TransformerConfig

__all__ = ["NAME", "DESCRIPTION", "Config", "get_config", "model_config", "variant_name", "by_lr",
           "lr_sensitivity", "compare_within_rounding", "qk_logit_bound", "run", "train"]

NAME = "qk_norm"
DESCRIPTION = ("small Pre-LN Transformer over a learning-rate sweep with and without "
               "qk-layernorm: largest attention logit and final loss (Dehghani et al. 2023, "
               "Wortsman et al. 2024; P08-P09)")


@dataclass
class Config(TaskConfig):
    """Settings of the learning-rate sweep (:class:`~lnbook.experiments.seq_tasks.TaskConfig` plus):

    Attributes:
        lrs: Adam rates of the sweep, increasing (the quick top rate, 0.3, chosen on pilot seeds).
        qk_norms: which models to train: ``False`` (plain attention), ``True`` (qk-layernorm).
        warmup: updates of linear warm-up (0 = none).
        ln_impl: ``impl`` of the layer norms (:data:`lnbook.norms.LN_IMPL`; rounding only).
    """

    lrs: tuple[float, ...] = (1e-2, 3e-2, 1e-1, 3e-1)
    qk_norms: tuple[bool, ...] = (False, True)
    warmup: int = 0
    steps: int = 40
    eval_every: int = 20
    ln_impl: str = LN_IMPL

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("ln_impl", self.ln_impl, LN_IMPLS)
        check_lrs(self.lrs)
        if not self.qk_norms or any(not isinstance(q, bool) for q in self.qk_norms):
            raise ValueError(f"qk_norms must be a non-empty tuple of bools, got {self.qk_norms}")
        if not 0 <= self.warmup <= self.steps:
            raise ValueError(f"warmup must lie in [0, steps={self.steps}], got {self.warmup}")


_PRESETS = presets(lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1), warmup=500, steps=10_000)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def model_config(config: Config, qk_norm: bool, seq_len: int) -> TransformerConfig:
    """The Pre-LN Transformer with or without qk-layernorm for this config."""
    return config.model_config(seq_len, norm="layer", position="pre", qk_norm=qk_norm,
                               ln_impl=config.ln_impl)


def variant_name(qk_norm: bool, lr: float) -> str:
    """The name of one variant, e.g. ``"plain/lr0.1"`` or ``"qk/lr0.01"``."""
    return f"{'qk' if qk_norm else 'plain'}/lr{lr:g}"


def by_lr(results: Results, qk_norm: bool, metric: str, stat: str = "final") -> np.ndarray:
    """One number per (seed, learning rate) for one model, ``(seeds, len(lrs))``; ``stat``
    ``"final"``, ``"max"``, ``"min"`` or ``"initial"``.
    """
    cols = []
    for lr in results.config["lrs"]:
        name = variant_name(qk_norm, lr)
        if stat == "final":
            cols.append(results.final(name, metric))
        elif stat == "initial":
            cols.append([r.history.metric(metric)[0] for r in results.select(name)])
        elif stat in ("min", "max"):
            cols.append(results.best(name, metric, stat))
        else:
            raise ValueError(f"stat must be 'final', 'initial', 'min' or 'max', got {stat!r}")
    return np.array(cols, dtype=float).T  # (seeds, lrs)


def lr_sensitivity(final: np.ndarray, initial: np.ndarray) -> np.ndarray:
    """Learning-rate sensitivity per seed: mean over rates of ``min(l, l0) - min over rates``.

    Wortsman et al. (2024): a final loss ``l`` above the initial ``l0`` counts at ``l0``.
    ``final``, ``initial`` ``(seeds, rates)``; returns ``(seeds,)``.

    Example::

        >>> lr_sensitivity(np.array([[1.0, 2.0, 9.0]]), np.array([[3.0, 3.0, 3.0]]))
        array([1.])
    """
    final, initial = np.asarray(final, dtype=float), np.asarray(initial, dtype=float)
    if final.shape != initial.shape or final.ndim != 2:
        raise ValueError(f"final and initial must both be (seeds, rates), got {final.shape} "
                         f"and {initial.shape}")
    clipped = np.minimum(final, initial)  # (seeds, rates)
    return (clipped - clipped.min(axis=1, keepdims=True)).mean(axis=1)


def compare_within_rounding(margin: np.ndarray, band: float) -> str:
    """Read per-seed margins ``plain - qk-norm`` against ``band``, what rounding alone moves (P09):
    ``"lower on every seed"``, ``"higher on some seed"`` or ``"undecided"``.

    Example::

        >>> compare_within_rounding(np.array([0.03, 0.09, -0.01]), 0.02)
        'undecided'
    """
    margin = np.asarray(margin, dtype=float)
    if margin.ndim != 1 or margin.size == 0 or not np.isfinite(margin).all():
        raise ValueError(f"margin must be a non-empty 1-d array of finite numbers, got {margin}")
    if not (np.isfinite(band) and band >= 0):
        raise ValueError(f"band must be a finite number >= 0, got {band!r}")
    if np.all(margin > band):
        return "lower on every seed"
    if np.any(margin < -band):
        return "higher on some seed"
    return "undecided"


def qk_logit_bound(model: Transformer) -> float:
    """The largest attention logit a qk-normalized model can produce, from its gains.

    ``|q| <= max|g_q| sqrt(d_h) + |b_q|`` (likewise ``k``), and a logit ``q . k / sqrt(d_h)`` is at
    most ``|q| |k| / sqrt(d_h)``; the largest bound over blocks. ValueError without ``qk_norm``.
    """
    if not model.config.qk_norm:
        raise ValueError("qk_logit_bound needs a model built with qk_norm=True")
    bounds = []
    with torch.no_grad():
        for block in model.blocks:
            a = block.attn
            root = math.sqrt(a.d_head)
            size = [float(n.weight.abs().max()) * root + float(n.bias.norm())
                    for n in (a.q_norm, a.k_norm)]
            bounds.append(size[0] * size[1] / root)
    return max(bounds)


def run(config: Config, device: str | torch.device = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train the model with and without qk-layernorm at every learning rate and seed (those of
    one model at once on ``device``, all in one job of :func:`lnbook.engine.runner.sweep`); variants
    :func:`variant_name`; evaluations record ``loss``, ``accuracy`` and ``max_logit`` (a
    diverged run repeats its initial model's); qk-normalized runs' info holds ``logit_bound``
    (:func:`qk_logit_bound`); ``Results.info`` the task's. With ``out``, also writes
    ``out/qk_norm.json`` (finished runs under it are kept)."""
    check_config(config, Config)
    task = task_of(config)
    variants = {variant_name(qk, lr): (qk, lr) for qk in config.qk_norms for lr in config.lrs}
    return sweep(NAME, variants, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack="all", steps=config.steps,
                 threads=config.threads, workers=config.workers, info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """A job of :func:`run`: each model of ``job.variants`` (``(qk_norm, lr)``) with all its
    rates and the job's seeds at once; ``(history, info)`` per ``job.pairs`` entry."""
    task, trained = task.to(job.device), {}
    for qk, lrs in groups(job.variants).items():
        for r in train_stacked(
                model_config(config, qk, task.seq_len), task, job.seeds, lrs,
                steps=config.steps, batch_size=config.batch_size, eval_every=config.eval_every,
                warmup=config.warmup, order="fit", max_logit=True, stream_var=False,
                measure=_logit_bound if qk else None, bar=job.bar):
            trained[variant_name(qk, r.info["lr"]), r.info["seed"]] = r
    return in_job_order(job, trained)


def _logit_bound(model: Transformer) -> dict[str, float]:
    return {"logit_bound": qk_logit_bound(model)}


# --- claim P08's per-seed inputs to lnbook.ledger.decide_claim (chapter 11) ------------------

#: Nats below the position-wise unigram predictor both models must end at the lowest rate.
P08_TRIVIAL = 0.5


def p08_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P08's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed:
    without qk-norm at the highest rate, the final largest attention logit over its value
    before training, and the final loss over the best final loss of the sweep (infinite for a
    diverged run); with qk-norm, the same loss ratio; a seed counts when both models ended
    :data:`P08_TRIVIAL` below the unigram predictor at the lowest rate."""
    lrs = list(results.config["lrs"])
    j_lo, j_hi = lrs.index(min(lrs)), lrs.index(max(lrs))
    final = {q: by_lr(results, q, "loss") for q in (False, True)}  # (seeds, lrs)
    peak = by_lr(results, False, "max_logit")[:, j_hi]
    peak0 = by_lr(results, False, "max_logit", "initial")[:, j_hi]
    base = results.info["baseline_loss"]
    left = (final[False][:, j_lo] < base - P08_TRIVIAL) & (final[True][:, j_lo]
                                                          < base - P08_TRIVIAL)
    failed = np.array([bool(r.info["diverged"])
                       for r in results.select(variant_name(False, max(lrs)))])
    fail = np.where(failed, np.inf, final[False][:, j_hi] / final[False].min(axis=1))
    parts = ("logit growth", "failure at high rates", "qk-norm trains there")
    return {"values": dict(zip(parts, (peak / peak0, fail,
                                       final[True][:, j_hi] / final[True].min(axis=1)),
                               strict=True)),
            "trivial_ok": {k: left for k in parts}}


__all__ += ["P08_TRIVIAL", "p08_inputs"]


def p09_inputs(results: Results, redo: Results) -> dict[str, dict[str, Any]]:
    """P09's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed:
    "lower logits", qk-norm's final largest attention logit over the plain model's, the
    largest over the rates; "bounded", qk-norm's largest growth of that logit from its value
    before training, over the rates; "less sensitive", the plain model's learning-rate
    sensitivity (:func:`lr_sensitivity`) minus qk-norm's, in units of how far rounding alone
    moves the plain model's: ``redo`` is a run of the plain model at the highest rate with
    other kernels (chapter 3's code), the same function rounded differently. A seed counts
    where :func:`p08_inputs` counts it (both models left the trivial phase)."""
    lrs = list(results.config["lrs"])
    j_hi = lrs.index(max(lrs))
    final = {q: by_lr(results, q, "loss") for q in (False, True)}  # (seeds, lrs)
    init = {q: by_lr(results, q, "loss", "initial") for q in (False, True)}
    peak = {q: by_lr(results, q, "max_logit") for q in (False, True)}
    growth = peak[True] / by_lr(results, True, "max_logit", "initial")  # (seeds, lrs)
    sens = {q: lr_sensitivity(final[q], init[q]) for q in (False, True)}  # (seeds,)
    again = final[False].copy()
    again[:, j_hi] = by_lr(redo, False, "loss")[:, 0]
    delta = float(np.abs(lr_sensitivity(again, init[False]) - sens[False]).max())
    left = p08_inputs(results)["trivial_ok"]["logit growth"]
    parts = ("lower logits", "bounded", "less sensitive")
    return {"values": dict(zip(parts, (np.max(peak[True] / peak[False], axis=1),
                                       growth.max(axis=1),
                                       (sens[False] - sens[True]) / max(delta, 1e-9)),
                               strict=True)),
            "trivial_ok": dict.fromkeys(parts, left)}


__all__ += ["p09_inputs"]
