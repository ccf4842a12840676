"""Transformers without normalization: Dynamic Tanh against layer norm (Zhu et al., 2025).

Part II, chapter `12_dyt` (claims P11 and P12): the same small Pre-LN Transformer with layer
norms or with :class:`lnbook.DyT`, same seeds, data and rate. P11: least-squares line and tanh
fits (:func:`fit_line_and_tanh`) to each trained layer norm's input-to-output map
(:func:`norm_pairs`); P12: both models' held-out loss.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from lnbook.checks import check_choice, check_config, check_size
from lnbook.data import associative_recall, copy_task, sort_task
from lnbook.engine import Job, Results, make_config, resolve_seeds, sweep
from lnbook.engine.config import RunConfig
from lnbook.engine.train import Batches, History, fit, max_updates
from lnbook.experiments.seq_tasks import SMOKE_BATCH, SMOKE_HELD_OUT
from lnbook.norms import LayerNorm, layer_norm
from lnbook.transformer import Transformer, norm_inputs_outputs, sequence_loss
from lnbook.variants import DyT

__all__ = ["NAME", "DESCRIPTION", "NORMS", "TASKS", "Config", "get_config", "make_task",
           "norm_pairs", "token_scale_spread", "fit_line_and_tanh", "run", "train_one"]

NAME = "dyt"
DESCRIPTION = ("small Pre-LN Transformer on a sequence task with layer norm or Dynamic Tanh; "
               "shape of the trained layer norms' input-output maps (Zhu et al. 2025)")
NORMS = ("layer", "dyt", "none")
_MAKERS = {"sort": sort_task, "copy": copy_task, "recall": associative_recall}
TASKS = tuple(_MAKERS)


@dataclass
class Config(RunConfig):
    """Settings of the DyT experiment; :func:`get_config` gives the presets.

    Attributes:
        task, length, vocab_size: ``"sort"``, ``"copy"`` or ``"recall"``, its length, symbols.
        n_train, n_val: training (seed 0) and held-out (seed 1) sequences.
        d_model, n_heads, n_layers: the Transformer.
        batch_size, steps, eval_every, lr: Adam's batch, updates, updates between
            evaluations, rate.
        dyt_alpha_init: initial ``alpha`` of every DyT.
        norms: the variants, from :data:`NORMS` (``"none"``: no norm at all).
        n_probe, n_points: held-out sequences fitted; pairs per norm kept for plots (first seed).
        scale, seeds, threads, workers: :class:`~lnbook.engine.RunConfig`'s.
    """

    task: str = "sort"
    length: int = 6
    vocab_size: int = 8
    n_train: int = 8192
    n_val: int = 256
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 1
    batch_size: int = 32
    steps: int = 150
    eval_every: int = 50
    lr: float = 3e-3
    dyt_alpha_init: float = 0.5
    norms: tuple[str, ...] = ("layer", "dyt")
    n_probe: int = 64
    n_points: int = 1500
    seeds: int | tuple[int, ...] = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("task", self.task, TASKS)
        if "layer" not in self.norms or any(n not in NORMS for n in self.norms):
            raise ValueError(f"norms must include 'layer' and be drawn from {NORMS}, got "
                             f"{self.norms}")
        if self.n_probe > self.n_val:
            raise ValueError(f"n_probe ({self.n_probe}) must be <= n_val ({self.n_val})")
        check_size("eval_every", self.eval_every)


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"threads": None, "length": 16, "vocab_size": 32, "n_train": 100_000,
        "n_val": 2048, "d_model": 128, "n_heads": 8, "n_layers": 6, "batch_size": 128,
        "steps": 5000, "eval_every": 250, "lr": 1e-3, "n_probe": 256, "seeds": 5},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset (larger, wants a GPU), with ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def make_task(config: Config, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` sequences of the configured task: ``(inputs, targets)`` (see :mod:`lnbook.data`)."""
    return _MAKERS[config.task](n, config.length, config.vocab_size, seed=seed)


def norm_pairs(model: nn.Module, inputs: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """``{name: (x, y)}`` for every layer norm on the residual stream (not q/k norms): its inputs
    and its outputs before gain and bias, ``(x - mu) / sqrt(sigma^2 + eps)``, flattened, float64."""
    return {name: (x.flatten().double(),  # (*, D) before gain and bias:
                   layer_norm(x, module.normalized_shape, eps=module.eps).flatten().double())
            for name, module, x in _ln_inputs(model, inputs)}


def _ln_inputs(model: nn.Module, inputs: Tensor) -> list[tuple[str, LayerNorm, Tensor]]:
    """``(name, module, input)`` of every layer norm on the residual stream."""
    return [(name, model.get_submodule(name), x)
            for name, (x, _) in norm_inputs_outputs(model, inputs).items()
            if isinstance(model.get_submodule(name), LayerNorm)
            and not name.endswith(("q_norm", "k_norm"))]


def token_scale_spread(model: nn.Module, inputs: Tensor) -> dict[str, float]:
    """Per layer norm of :func:`norm_pairs`, the standard deviation over tokens of ``log(sigma_t)``,
    ``sigma_t`` token ``t``'s input standard deviation (0: one straight line when pooled)."""
    return {name: float(x.double().std(dim=-1, unbiased=False).flatten().log().std())
            for name, _, x in _ln_inputs(model, inputs)}  # std over tokens of log(sigma_t)


def fit_line_and_tanh(x: Tensor, y: Tensor, grid: Tensor | None = None) -> dict[str, float]:
    r"""Least-squares fits of a line and of a tanh to the points ``(x, y)``.

    The line is :math:`y = a x + c`; the tanh :math:`y = a \tanh(b (x - m)) + c`, ``m`` the mean
    of ``x``, ``(a, c)`` exact for every ``b`` of ``grid`` (default 100 log-spaced values from
    1e-3 to 1e2 over ``std(x)``), the best ``b`` kept.

    Returns:
        ``line_mse``, ``tanh_mse``, ``var_y`` (the error of a constant), ``b``, ``bend`` (``b *
        max |x - m|``; above 1 the curve flattens within the data) and ``cut`` (``1 - tanh_mse /
        line_mse``).
    """
    x, y = x.double().flatten(), y.double().flatten()
    if x.shape != y.shape or x.numel() < 3:
        raise ValueError(f"x and y must hold the same number (>= 3) of points, got "
                         f"{x.numel()} and {y.numel()}")
    m, sd = x.mean(), x.std()
    grid = torch.logspace(-3, 2, 100, dtype=torch.float64) if grid is None else grid
    yc = y - y.mean()  # (n,)
    var_y = float(yc.square().mean())
    # best a * f + c for features f: residual = var(y) - cov(f, y)^2 / var(f), exactly
    feats = torch.cat([x[None], torch.tanh(grid[:, None] / sd * (x - m)[None])])  # (1+K, n)
    fc = feats - feats.mean(dim=1, keepdim=True)  # (1+K, n)
    cov = (fc * yc).mean(dim=1)  # (1+K,)
    mse = (var_y - cov.square() / fc.square().mean(dim=1)).clamp_min(0.0)  # (1+K,)
    line = float(mse[0])
    best = int(mse[1:].argmin())
    tanh = min(float(mse[1 + best]), line)
    b = float(grid[best] / sd)
    return {"line_mse": line, "tanh_mse": tanh, "var_y": var_y, "b": b,
            "bend": b * float((x - m).abs().max()),
            "cut": 1.0 - tanh / line if line > 0 else 0.0}


def _layer_info(info: dict, when: str, model: nn.Module, probe: Tensor, n_points: int) -> None:
    """Add ``fits_``, ``spread_`` and (``n_points > 0``) ``points_`` + ``when`` to ``info``."""
    pairs = norm_pairs(model, probe)
    info[f"fits_{when}"] = {name: fit_line_and_tanh(x, y) for name, (x, y) in pairs.items()}
    info[f"spread_{when}"] = token_scale_spread(model, probe)
    if n_points:
        g = torch.Generator().manual_seed(0)
        points = {}
        for name, (x, y) in pairs.items():
            idx = torch.randperm(x.numel(), generator=g)[:n_points]
            points[name] = [x[idx].tolist(), y[idx].tolist()]
        info[f"points_{when}"] = points


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train the layer-norm and the DyT Transformer with every seed; fit the norms' maps.

    Runs record ``val_loss``. ``"layer"`` runs' info: ``fits_init``/``fits_trained``,
    ``spread_init``/``spread_trained`` and, first seed, ``points_init``/``points_trained``;
    ``"dyt"`` runs': ``alpha`` and ``input_std`` of every DyT; ``Results.info["chance"]``:
    ``log(vocab_size)``."""
    check_config(config, Config)
    x, y = make_task(config, config.n_train, seed=0)  # (n, T), (n, T)
    smoke = max_updates() is not None  # a smoke run: a short held-out set (minutes otherwise)
    xv, yv = make_task(config, min(config.n_val, SMOKE_HELD_OUT) if smoke else config.n_val,
                       seed=1)
    seeds = resolve_seeds(config.seeds)
    data = (x, y, xv, yv, xv[: config.n_probe])
    return sweep(NAME, {n: n for n in config.norms}, seeds,
                 partial(train_one, config, data, seeds[0]), config=config,
                 device=device, out=out, steps=config.steps, threads=config.threads,
                 workers=config.workers, info={"chance": math.log(config.vocab_size),
                                               "task": config.task, "seq_len": int(x.shape[1])})


def train_one(config: Config, data: tuple[Tensor, ...], first_seed: int, job: Job
              ) -> tuple[History, dict[str, Any]]:
    """One run: the Transformer with norm ``job.params`` trained on ``data`` (``x, y``, the
    validation ``xv, yv`` and the ``probe`` inputs) with seed ``job.seed``; its history and the
    norms' measurements (the fitted points themselves only for ``first_seed``)."""
    x, y, xv, yv, probe = data
    if max_updates() is not None:  # a smoke run: short batches (minutes otherwise)
        config = replace(config, batch_size=min(config.batch_size, SMOKE_BATCH))

    def eval_fn(model: nn.Module) -> dict[str, float]:
        dev = next(model.parameters()).device
        return {"val_loss": float(sequence_loss(model(xv.to(dev)), yv.to(dev)))}

    torch.manual_seed(job.seed)
    model = Transformer(config.vocab_size + 1, config.d_model, config.n_heads,
                        config.n_layers, x.shape[1], norm=job.params,
                        dyt_alpha_init=config.dyt_alpha_init)
    info: dict[str, Any] = {}
    keep = job.seed == first_seed
    if job.params == "layer":
        _layer_info(info, "init", model, probe, config.n_points if keep else 0)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    hist = fit(model, Batches(x, y, batch_size=config.batch_size, seed=job.seed), opt,
               steps=config.steps, eval_every=config.eval_every, eval_fn=eval_fn,
               device=job.device, seed=job.seed,
               loss_fn=lambda m, b: sequence_loss(m(b[0]), b[1]),
               bar=job.bar, label=job.label)
    model.cpu().eval()
    if job.params == "layer":
        _layer_info(info, "trained", model, probe, config.n_points if keep else 0)
    elif job.params == "dyt":
        seen = norm_inputs_outputs(model, probe)
        info["alpha"] = {n: float(m.alpha.detach()) for n, m in model.named_modules()
                         if isinstance(m, DyT)}
        info["input_std"] = {n: float(seen[n][0].std()) for n in info["alpha"]}
    return hist, info


# --- claim P12's per-seed inputs to lnbook.ledger.decide_claim (chapter 12) ------------------

#: Nats below chance that every run of a seed must end (P11's and P12's trivial bar).
P12_TRIVIAL = 1.0


def left_trivial(results: Results) -> Any:
    """Per seed, whether every variant's final held-out loss lies :data:`P12_TRIVIAL` nats
    below chance (``Results.info["chance"]``): a ``(seeds,)`` boolean array."""
    import numpy as np

    chance = results.info["chance"]
    return np.all([results.final(v, "val_loss") < chance - P12_TRIVIAL
                   for v in results.variants], axis=0)


def p12_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P12's ``values``, ``trivial_ok`` and ``reference`` for :func:`lnbook.ledger.decide_claim`:
    per seed DyT's final held-out loss minus layer norm's, read against layer norm's loss (the
    rule is relative), counted where :func:`left_trivial`."""
    ln, dyt_ = results.final("layer", "val_loss"), results.final("dyt", "val_loss")
    part = "DyT matches layer norm"
    return {"values": {part: dyt_ - ln}, "trivial_ok": {part: left_trivial(results)},
            "reference": {part: ln}}


__all__ += ["P12_TRIVIAL", "left_trivial", "p12_inputs"]


# --- claim P11's per-seed inputs to lnbook.ledger.decide_claim (chapter 12) ------------------

#: P11's criteria, fixed before the runs: the share of the best line's squared error the best
#: tanh must remove, the bend ``b max|x - m|`` it must reach within the data, and the layer
#: norm the first two parts read (the deepest, in front of the head).
P11_CUT, P11_BEND, P11_LAST = 0.10, 1.0, "final_norm"


def s_shaped(fit: Mapping[str, float]) -> bool:
    """Whether one fit (an entry of a layer-norm run's ``fits_trained`` or ``fits_init``)
    passes both of P11's criteria: ``cut >= P11_CUT`` and ``bend >= P11_BEND``."""
    return bool(fit["cut"] >= P11_CUT and fit["bend"] >= P11_BEND)


def p11_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P11's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed of
    the layer-norm runs: whether the final norm's trained map is :func:`s_shaped`; its ``cut``
    trained minus at initialization; whether every layer norm's trained map is S-shaped; each
    part counted where :func:`left_trivial`."""
    runs = results.select("layer")
    trained = [r.info["fits_trained"] for r in runs]
    init = [r.info["fits_init"] for r in runs]
    parts = ("final norm S-shaped", "more than at initialization", "every norm S-shaped")
    values = {parts[0]: [s_shaped(f[P11_LAST]) for f in trained],
              parts[1]: [t[P11_LAST]["cut"] - i[P11_LAST]["cut"]
                         for t, i in zip(trained, init, strict=True)],
              parts[2]: [all(s_shaped(x) for x in f.values()) for f in trained]}
    left = left_trivial(results)
    return {"values": values, "trivial_ok": dict.fromkeys(parts, left)}


__all__ += ["P11_BEND", "P11_CUT", "P11_LAST", "p11_inputs", "s_shaped"]
