"""DyT's regime dependence: Dynamic Tanh against layer norm over amounts of training data.

Part III, chapter `16_removing_ln` (claim P22, Verma 2026): the small Pre-LN Transformer with
layer norms or :class:`lnbook.DyT` learns the sort task from nested training sets of several
sizes; per seed and size, DyT's final loss minus LN's (:func:`dyt_minus_ln`), the early share
of saturated tanh units (:func:`saturation_share`) and their rank agreement
(:func:`rank_correlation`). Every (size, seed) copy of one norm trains in one vmapped stack
(:func:`train_sizes`: a :class:`lnbook.engine.Stack` in :func:`lnbook.engine.copies.train_copies`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from lnbook.checks import check_config
from lnbook.engine import (
    History,
    Job,
    Results,
    make_config,
    max_updates,
    sweep,
    train_copies,
)
from lnbook.engine.config import RunConfig
from lnbook.experiments.seq_tasks import (  # noqa: F401 (make_task: ch. 16)
    SMOKE_BATCH,
    SequenceTask,
    make_task,
    task_of,
)
from lnbook.experiments.stacked import batch_indices, copy_loss, groups, stack_models
from lnbook.transformer import Transformer, TransformerConfig, run_hooked  # noqa: F401 (ditto)
from lnbook.variants import DyT

__all__ = ["NAME", "DESCRIPTION", "NORMS", "Config", "get_config", "saturation_share",
           "train_sizes", "table", "dyt_minus_ln", "left_trivial", "rank_correlation",
           "run", "train"]

NAME = "dyt_regime"
DESCRIPTION = ("small Pre-LN Transformer with layer norm or DyT over several training-set sizes; "
               "DyT's loss minus LN's and the share of saturated tanh units (Verma 2026)")
NORMS = ("layer", "dyt")


@dataclass
class Config(RunConfig):
    """Settings of the regime experiment; :func:`get_config` gives the presets.

    Attributes:
        task, size, symbols: the task (:func:`lnbook.experiments.seq_tasks.make_task`).
        n_trains, n_test: training-set sizes, increasing (the first ``n`` of one draw); held-out.
        d_model, n_heads, n_layers: the Transformer.
        batch_size, steps, lr: Adam's batch, updates and rate (the same for both norms).
        dyt_alpha_init: initial ``alpha`` of every DyT.
        early_step, threshold, n_probe: the saturated share (``|alpha * x| > threshold``) is
            measured after ``early_step`` updates on the first ``n_probe`` training sequences.
        scale, seeds, threads, workers: :class:`~lnbook.engine.RunConfig`'s.
    """

    task: str = "sort"
    size: int = 6
    symbols: int = 8
    n_trains: tuple[int, ...] = (32, 256, 2048)
    n_test: int = 256
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 1
    batch_size: int = 32
    steps: int = 120
    lr: float = 3e-3
    dyt_alpha_init: float = 0.5
    early_step: int = 12
    threshold: float = 2.0
    n_probe: int = 32
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self.n_trains = tuple(int(n) for n in self.n_trains)
        if len(self.n_trains) < 2 or list(self.n_trains) != sorted(set(self.n_trains)):
            raise ValueError(f"n_trains must hold two or more increasing sizes, got "
                             f"{self.n_trains}")
        if self.n_probe > self.n_trains[0]:
            raise ValueError(f"n_probe ({self.n_probe}) must be <= the smallest training set "
                             f"({self.n_trains[0]})")
        if not 1 <= self.early_step <= self.steps:
            raise ValueError(f"early_step must lie in [1, steps={self.steps}], got "
                             f"{self.early_step}")
        if not self.threshold > 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold!r}")

    @property
    def n_train(self) -> int:
        """The largest training set, the one drawn (the others are its first ``n``)."""
        return self.n_trains[-1]


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"threads": None, "size": 16, "symbols": 32, "n_trains": (256, 4096, 65536),
              "n_test": 2048, "d_model": 128, "n_heads": 8, "n_layers": 6, "batch_size": 128,
              "steps": 5000, "lr": 1e-3, "early_step": 250, "n_probe": 256},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset (larger; not Verma's), with ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def saturation_share(model: nn.Module, x: Tensor, threshold: float = 2.0) -> float:
    """The share of ``model``'s tanh units with ``|alpha * u| > threshold`` on the ids ``x``, ``u``
    each :class:`lnbook.DyT`'s input, pooled over every DyT (NaN without DyT)."""
    counts = [0, 0]

    def hook(module: DyT, args: tuple[Tensor, ...], _out: Tensor) -> None:
        z = (module.alpha * args[0]).abs()
        counts[0] += int((z > threshold).sum())
        counts[1] += z.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, DyT)]
    run_hooked(model, x, handles)
    return counts[0] / counts[1] if counts[1] else math.nan


def train_sizes(model_config: TransformerConfig, task: SequenceTask,
                copies: list[tuple[int, int]], *, steps: int, batch_size: int, lr: float,
                early_step: int, probe: Tensor, threshold: float, bar: Any = None
                ) -> list[dict[str, Any]]:
    """Train one model per ``(n, seed)`` of ``copies`` at once; what each one measured.

    Copy ``(n, seed)``: the model of ``seed`` trained with Adam on the batches
    :func:`~lnbook.experiments.stacked.batch_indices` draws for ``seed`` over the first ``n``
    training sequences (all copies a :class:`lnbook.engine.Stack` in
    :func:`lnbook.engine.copies.train_copies`). Returns per copy ``n``, ``seed``, ``loss``
    (held-out, final), ``loss_early`` (after ``early_step`` updates), ``train_loss`` (mean of
    the last 10 updates), ``saturated`` (on ``probe`` after ``early_step``) and ``diverged``.
    ``bar``: a progress bar advanced by one per copy and update (a sweep job's ``job.bar``)."""
    steps = max_updates(steps)  # a smoke run's cap (lnbook.engine.capped), if any
    early_step = min(early_step, steps)
    stack = stack_models(model_config, [s for _, s in copies]).to(task.x.device)
    opt = torch.optim.Adam(stack.parameters(), lr=lr, foreach=True)
    rows = torch.stack([batch_indices(s, n, steps, batch_size) for n, s in copies])
    hists = [History() for _ in copies]
    diverged: list[int | None] = [None] * len(copies)
    out = [{"n": n, "seed": s} for n, s in copies]
    done = [0]  # the updates done when evaluate is called

    def losses(step: int) -> Tensor:  # (copies,)
        done[0] = step + 1
        idx = rows[:, step]  # (copies, batch)
        return stack.call(copy_loss, task.x[idx], task.y[idx])

    def evaluate() -> list[dict[str, float]]:  # measures after early_step and steps updates
        keys = [k for k, at in (("loss_early", early_step), ("loss", steps)) if done[0] == at]
        if keys:
            with torch.no_grad():
                held = stack.call(copy_loss, task.x_test, task.y_test, shared=(0, 1)).tolist()
            dyt = "loss_early" in keys and model_config.norm == "dyt"
            models = stack.unstack() if dyt else [None] * len(copies)
            for o, value, model in zip(out, held, models, strict=True):
                o.update(dict.fromkeys(keys, value))
                if "loss_early" in keys:
                    o["saturated"] = saturation_share(model.to(probe.device).eval(), probe,
                                                      threshold) if dyt else math.nan
        return [{} for _ in copies]

    train_copies(losses, evaluate, opt, hists, steps, early_step, bar=bar, diverged=diverged)
    for k, (o, h) in enumerate(zip(out, hists, strict=True)):
        o["train_loss"] = math.nan if diverged[k] else sum(h.losses[-10:]) / len(h.losses[-10:])
        o["diverged"] = not (math.isfinite(o["loss"]) and math.isfinite(o["train_loss"]))
    return out


def run(config: Config, device: Any = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train both norms on every training-set size and seed (one job of
    :func:`lnbook.engine.runner.sweep`); one ``Run`` per (norm, size, seed), variant
    ``"<norm>/<n>"``, measurements in ``info`` (:func:`train_sizes`). ``Results.info`` holds
    ``task``, ``uniform_loss`` and ``baseline_loss``. With ``out``, also writes the results
    under ``out`` (finished runs under it are kept)."""
    check_config(config, Config)
    task = task_of(config)
    variants = {f"{norm}/{n}": (norm, n) for norm in NORMS for n in config.n_trains}
    return sweep(NAME, variants, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack="all", steps=config.steps,
                 threads=config.threads, workers=config.workers,
                 info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """A job of :func:`run`: each norm of ``job.variants`` (``(norm, n)``) with all its sizes
    and the job's seeds at once; ``(History(), measurements)`` per ``job.pairs`` entry."""
    task, trained = task.to(job.device), {}
    if max_updates() is not None:  # a smoke run: short batches and probe (minutes otherwise)
        config = replace(config, batch_size=min(config.batch_size, SMOKE_BATCH),
                         n_probe=min(config.n_probe, SMOKE_BATCH))
    for norm, sizes in groups(job.variants).items():
        mc = TransformerConfig(vocab_size=task.vocab_size, d_model=config.d_model,
                               n_heads=config.n_heads, n_layers=config.n_layers,
                               max_len=task.x.shape[1], norm=norm,
                               dyt_alpha_init=config.dyt_alpha_init)
        for m in train_sizes(mc, task, [(n, s) for n in sizes for s in job.seeds],
                              steps=config.steps, batch_size=config.batch_size, lr=config.lr,
                              early_step=config.early_step, probe=task.x[: config.n_probe],
                              threshold=config.threshold, bar=job.bar):
            trained[f"{norm}/{m['n']}", m["seed"]] = m
    return [(History(), trained[pair]) for pair in job.pairs]


def table(results: Results, key: str) -> dict[str, Tensor]:
    """``{norm: (sizes, seeds) tensor of info[key]}`` from :func:`run`'s results."""
    sizes, seeds = list(results.config["n_trains"]), list(results.config["seeds"])
    out = {norm: torch.full((len(sizes), len(seeds)), math.nan, dtype=torch.float64)
           for norm in NORMS}
    for r in results.runs:
        norm, n = r.variant.split("/")
        out[norm][sizes.index(int(n)), seeds.index(r.seed)] = float(r.info[key])
    return out


def dyt_minus_ln(results: Results, key: str = "loss", relative: bool = False) -> Tensor:
    """DyT's ``info[key]`` minus layer norm's, ``(sizes, seeds)``; ``relative``: over LN's."""
    t = table(results, key)
    diff = t["dyt"] - t["layer"]
    return diff / t["layer"] if relative else diff


def left_trivial(results: Results, bar: float = 0.5) -> Tensor:
    """Per seed ``(seeds,)``: on every size both norms' training loss is at least ``bar`` below the
    position-wise unigram predictor's held-out loss."""
    t = table(results, "train_loss")
    limit = results.info["baseline_loss"] - bar
    return ((t["layer"] <= limit) & (t["dyt"] <= limit)).all(0)


def rank_correlation(a: Tensor, b: Tensor) -> Tensor:
    """Spearman's rank correlation of ``a`` and ``b`` ``(k, m)`` along dimension 0, ``(m,)``
    (ties get their first rank)."""
    if a.shape != b.shape or a.dim() != 2 or a.shape[0] < 2:
        raise ValueError(f"rank_correlation needs two (k >= 2, m) tensors of one shape, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    ra, rb = (t.argsort(0).argsort(0).double() for t in (a, b))
    ra, rb = ra - ra.mean(0), rb - rb.mean(0)
    return (ra * rb).sum(0) / (ra.square().sum(0) * rb.square().sum(0)).sqrt()


# --- claim P22: per-seed inputs to lnbook.ledger.decide_claim (chapter 16) -------------------


def p22_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P22's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed (numpy
    arrays): DyT's held-out loss relative to layer norm's, ``(DyT - LN) / LN``, on the smallest
    and on the largest training set (:func:`dyt_minus_ln`), and the :func:`rank_correlation`
    over the sizes of DyT's early saturated share with that relative loss; a seed counts where
    :func:`left_trivial` (every size, both norms)."""
    rel = dyt_minus_ln(results, relative=True)  # (sizes, seeds)
    sat = table(results, "saturated")["dyt"]  # (sizes, seeds)
    parts = ("DyT lowers the loss on scarce data", "DyT raises the loss on plentiful data",
             "early saturation ranks DyT's effect")
    values = {parts[0]: rel[0].numpy(), parts[1]: rel[-1].numpy(),
              parts[2]: rank_correlation(sat, rel).numpy()}
    return {"values": values, "trivial_ok": dict.fromkeys(parts, left_trivial(results).numpy())}


__all__ += ["p22_inputs"]
