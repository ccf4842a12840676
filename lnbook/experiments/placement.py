"""Where the norm goes (chapter `09_norm_placement`, claims P04-P05): the Post-LN block
``x <- LN(x + F(x))`` against the Pre-LN block ``x <- x + F(LN(x))`` (plus a final norm) of
Xiong et al. (2020), at initialization (:func:`gradient_profiles`) and in training with and
without warm-up (:func:`run`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from lnbook.checks import check_config
from lnbook.engine import History, Job, Results, make_config, resolve_seeds, sweep
from lnbook.experiments.seq_tasks import SequenceTask, TaskConfig, make_task, presets, task_of
from lnbook.experiments.stacked import groups, in_job_order, train_stacked
from lnbook.transformer import Transformer, TransformerConfig, layer_gradient_norms

__all__ = ["NAME", "DESCRIPTION", "Config", "get_config", "model_config", "variant_name",
           "gradient_profiles", "run", "train"]

PLACEMENTS = ("post", "pre")  # the two of Xiong et al. (2020) (lnbook.transformer has more)
NAME = "placement"
DESCRIPTION = ("Post-LN vs Pre-LN Transformer: per-layer gradient norms at initialization for "
               "several depths, and training with and without learning-rate warm-up (Xiong et "
               "al. 2020; P04-P05)")


def _check_positions(positions: tuple[str, ...]) -> None:
    if not positions or any(p not in PLACEMENTS for p in positions):
        raise ValueError(f"positions must be drawn from {PLACEMENTS}, got {positions}")


@dataclass
class Config(TaskConfig):
    """Settings of the placement experiments (:func:`get_config` gives the presets): the task,
    model, training and sweep fields of :class:`~lnbook.experiments.seq_tasks.TaskConfig`, and
    ``positions`` (from ``("post", "pre")``) trained with every ``warmups`` length (updates,
    0 = none) at the peak Adam rate ``lr`` (chosen on pilot seeds, see the chapter);
    ``grad_depths`` and ``grad_seeds``, the models whose gradients :func:`gradient_profiles`
    measures on ``grad_batch`` training sequences."""

    positions: tuple[str, ...] = PLACEMENTS
    warmups: tuple[int, ...] = (0, 20)
    lr: float = 3e-2
    steps: int = 60
    eval_every: int = 20
    seeds: int | tuple[int, ...] = 10
    grad_depths: tuple[int, ...] = (2, 4, 8)
    grad_seeds: int | tuple[int, ...] = 10
    grad_batch: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positions(self.positions)
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
    """The layer-normalized Transformer with ``position`` "post" (no final norm: its last block
    ends in one) or "pre" (a final norm) and ``n_layers`` blocks."""
    return config.model_config(seq_len, n_layers=n_layers, norm="layer", position=position)


def variant_name(position: str, warmup: int) -> str:
    """The name of one trained variant, e.g. ``"post/warmup0"`` or ``"pre/warmup20"``."""
    return f"{position}/warmup{warmup}"


def gradient_profiles(config: Config, param: str = "mlp.fc2.weight",
                      positions: tuple[str, ...] = PLACEMENTS) -> dict[str, dict[int, np.ndarray]]:
    """Per-block gradient norms at initialization (P04): ``{position: {depth: (seeds, depth)}}``
    (block 1 nearest the input), of models built under ``torch.manual_seed(seed)`` for every
    seed of ``config.grad_seeds`` (:func:`~lnbook.engine.runner.resolve_seeds`: an int ``n`` is the
    first ``n`` of the seed set in force), on the first ``grad_batch`` training sequences
    (:func:`lnbook.transformer.layer_gradient_norms`); ``param``: a block's parameter
    (``"mlp.fc2.weight"``) or group (``"block"``, ``"attention"``, ``"ffn"``)."""
    _check_positions(positions)
    task = make_task(config.task, config.grad_batch, 1, config.size, config.symbols)

    def norms(position: str, depth: int, seed: int) -> list[float]:
        torch.manual_seed(seed)
        model = Transformer.from_config(model_config(config, position, depth, task.seq_len))
        return [block[param] for block in layer_gradient_norms(model, task.x, task.y)]

    seeds = resolve_seeds(config.grad_seeds)
    return {p: {d: np.array([norms(p, d, s) for s in seeds])
                for d in config.grad_depths} for p in positions}


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every (placement, warm-up) variant (:func:`variant_name`) with every seed (P05),
    in one job of :func:`lnbook.engine.runner.sweep` (:func:`train`): Adam reaches ``config.lr``
    after ``warmup`` updates of linear warm-up; evaluations record ``loss``, ``accuracy`` and
    ``max_logit``; a run whose loss stops being finite is ``diverged``. ``Results.info``: the
    task's. ``out``: also write ``out/placement.json`` (finished runs under it are kept)."""
    check_config(config, Config)
    # recorded as the seeds they are now, as sweep records ``seeds``
    config = replace(config, grad_seeds=resolve_seeds(config.grad_seeds))
    task = task_of(config)
    variants = {variant_name(p, w): (p, w) for p in config.positions for w in config.warmups}
    return sweep(NAME, variants, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack="all", steps=config.steps,
                 threads=config.threads, workers=config.workers, info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """A job of :func:`run`: each placement of ``job.variants`` (``(position, warmup)``) with
    all its warm-ups and the job's seeds at once; ``(history, info)`` per ``job.pairs``."""
    task, trained = task.to(job.device), {}
    for position, warmups in groups(job.variants).items():
        for r in train_stacked(
                model_config(config, position, config.n_layers, task.seq_len), task,
                job.seeds, [config.lr] * len(warmups), steps=config.steps,
                batch_size=config.batch_size, eval_every=config.eval_every, warmup=warmups,
                order="fit", max_logit=True, stream_var=False, bar=job.bar):
            trained[variant_name(position, r.info["warmup"]), r.info["seed"]] = r
    return in_job_order(job, trained)


# --- claim P05's per-seed inputs to lnbook.ledger.decide_claim (chapter 9) -------------------

#: Nats below the position-wise unigram predictor that a compared run must end (P05's bar).
P05_TRIVIAL = 0.5


def p05_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P05's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim` from a run
    of :func:`run`, per seed: each placement's final held-out loss without warm-up minus with
    the longest warm-up; a seed counts for Post-LN's part when both warmed-up runs cleared
    :data:`P05_TRIVIAL`, for Pre-LN's when Pre-LN without warm-up did too."""
    w = max(int(v.rsplit("warmup", 1)[1]) for v in results.variants)
    base = results.info["baseline_loss"]
    f = {(p, u): results.final(variant_name(p, u), "loss") for p in ("post", "pre")
         for u in (0, w)}
    warm_ok = (f["post", w] < base - P05_TRIVIAL) & (f["pre", w] < base - P05_TRIVIAL)
    pre, post = "Pre-LN trains without warm-up", "Post-LN worse without warm-up"
    return {"values": {pre: f["pre", 0] - f["pre", w], post: f["post", 0] - f["post", w]},
            "trivial_ok": {pre: warm_ok & (f["pre", 0] < base - P05_TRIVIAL),
                           post: warm_ok}}


__all__ += ["P05_TRIVIAL", "p05_inputs"]


def p04_inputs(profiles: dict[str, dict[int, np.ndarray]],
               more: dict[str, dict[int, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """P04's ``values`` for :func:`lnbook.ledger.decide_claim` from :func:`gradient_profiles`
    (``profiles``, both placements) and further Post-LN seeds at the largest depth (``more``).
    Per seed: Pre-LN's gradient norm at the last block over the first, the largest over the
    depths ("Pre-LN does not grow"); Post-LN's over Pre-LN's at the last block, the smallest
    over the depths ("Post-LN larger near the output"). Once, over the seeds of both:
    Post-LN's root mean square gradient norm at the last block over the first, at the largest
    depth ("Post-LN grows in expectation")."""
    depths = sorted(profiles["pre"])
    pre, post = profiles["pre"], profiles["post"]  # {depth: (seeds, depth)}
    deep = np.r_[post[depths[-1]], more["post"][depths[-1]]]  # (all seeds, depth)
    rms = np.sqrt((deep ** 2).mean(axis=0))  # (depth,) block by block
    return {"values": {
        "Pre-LN does not grow": np.max([pre[d][:, -1] / pre[d][:, 0] for d in depths], axis=0),
        "Post-LN larger near the output": np.min([post[d][:, -1] / pre[d][:, -1]
                                                  for d in depths], axis=0),
        "Post-LN grows in expectation": [float(rms[-1] / rms[0])]}}


__all__ += ["p04_inputs"]


def p04_pilot(config: Config, groups: tuple[int, ...] = (16, 32, 64),
              part_seeds: int = 10) -> dict[str, dict[str, Any]]:
    """P04's pilot (``pilot: measure`` in ``claims.yml``), on untrained models: how many
    initializations "Post-LN grows in expectation" needs, and what the per-seed parts give.

    With every seed of ``config.seeds`` (the pilot seeds) the Post-LN model of the largest of
    ``config.grad_depths``: its last block's root mean square gradient norm over its first's,
    over all the seeds and over disjoint groups of each size of ``groups`` (how many groups
    fall below 1); on the first ``part_seeds`` seeds, the per-seed values of P04's other two
    parts (:func:`p04_inputs`, both placements at every depth)."""
    seeds = resolve_seeds(config.seeds)
    deep = max(config.grad_depths)
    post = gradient_profiles(replace(config, grad_depths=(deep,), grad_seeds=seeds),
                             positions=("post",))["post"][deep]  # (seeds, deep)

    def growth(g: np.ndarray) -> float:  # last block's root mean square over the first's
        rms = np.sqrt((g ** 2).mean(axis=0))
        return float(rms[-1] / rms[0])

    expectation: dict[str, Any] = {f"over all {len(seeds)} seeds": growth(post)}
    for size in groups:
        ratios = [growth(post[k:k + size]) for k in range(0, len(seeds) - size + 1, size)]
        expectation[f"below 1 in groups of {size}"] = (f"({sum(r < 1 for r in ratios)} of "
                                                       f"{len(ratios)})")
    profiles = gradient_profiles(replace(config, grad_seeds=seeds[:part_seeds]))
    parts = p04_inputs(profiles, {"post": {deep: post[part_seeds:]}})["values"]
    return {f"Post-LN, {deep} blocks, last over first (root mean square)": expectation,
            f"P04 on the first {part_seeds} seeds": {
                k: np.asarray(v).tolist() for k, v in parts.items()
                if k != "Post-LN grows in expectation"}}


__all__ += ["p04_pilot"]
