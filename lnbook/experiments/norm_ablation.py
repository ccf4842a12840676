"""Xu et al. (2019)'s ablation of layer norm (Part II, chapter `13_common_mistakes`, claims P13
and P14): what the forward normalization, the statistics' gradients and the gain and bias each
bring, on an MLP on the 8x8 digits.

:func:`run` trains a :class:`~lnbook.mlp.NormMLP` with each norm of ``config.norms``
(:data:`~lnbook.mlp.STATS_NORMS`: LayerNorm, LayerNorm-simple without gain and bias,
:class:`~lnbook.mlp.DetachNorm` whose statistics are constants to the backward pass, no norm);
:func:`p13_inputs` reads P13's per-seed quantities from it. :func:`run_affine` trains the two
arms of P14 with each bias after the norm (:func:`affine_mlp`); :func:`p14_inputs` reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lnbook.batched import SeedMLP, seed_batches, seed_nll
from lnbook.checks import check_config, check_size
from lnbook.data import load_digits_tensor
from lnbook.engine import (
    Batches,
    History,
    Job,
    Results,
    Stack,
    cpu_threads,
    make_config,
    resolve_seeds,
    sweep,
    train_copies,
)
from lnbook.engine.config import RunConfig
from lnbook.mlp import STATS_NORMS, NormMLP

__all__ = ["NAME", "DESCRIPTION", "Config", "get_config", "run", "train", "NORM_LABELS",
           "TRIVIAL_MARGIN", "p13_inputs", "AFFINE_NORMS", "affine_mlp", "run_affine",
           "p14_inputs"]

NAME = "norm_ablation"
DESCRIPTION = ("an MLP on the 8x8 digits with LayerNorm, LayerNorm-simple (no gain and bias), "
               "DetachNorm (statistics detached) and no norm (Xu et al. 2019)")

NORM_LABELS = {"layer": "LayerNorm", "simple": "LayerNorm-simple", "detach": "DetachNorm",
               "none": "no norm"}


@dataclass
class Config(RunConfig):
    """Settings of the ablation (:func:`get_config` gives the presets): a :class:`NormMLP`
    (``hidden_size``, ``depth``) with each of ``norms`` (:data:`STATS_NORMS`), trained with
    Adam (``lr``, ``batch_size``) for ``steps`` updates, evaluated every ``eval_every``."""

    norms: tuple[str, ...] = STATS_NORMS
    hidden_size: int = 32
    depth: int = 3
    batch_size: int = 64
    steps: int = 150
    lr: float = 3e-3
    eval_every: int = 25
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.norms or any(n not in STATS_NORMS for n in self.norms):
            raise ValueError(f"norms must be drawn from {STATS_NORMS}, got {self.norms}")
        for name in ("hidden_size", "depth", "batch_size", "eval_every"):
            check_size(name, getattr(self, name))
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"threads": None, "hidden_size": 256, "depth": 8, "steps": 10000, "lr": 1e-3,
              "eval_every": 500, "seeds": 10},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train a :class:`NormMLP` with every norm of ``config.norms``, the seeds of each norm as
    one stacked model (a job of :func:`lnbook.engine.runner.sweep`). Runs record
    ``val_nll``/``val_error`` (359 held-out digits), ``train_nll``/``train_error`` and, in
    ``info``, ``weight_growth`` per hidden layer; ``Results.info`` holds ``majority_error``."""
    check_config(config, Config)
    x, y = load_digits_tensor("train", flatten=True)  # (1438, 64), (1438,)
    xv, yv = load_digits_tensor("test", flatten=True)  # (359, 64), (359,)
    majority = int(torch.bincount(y).argmax())
    majority_error = float((yv != majority).float().mean())
    variants = {n: n for n in config.norms}
    return sweep(NAME, variants, config.seeds, partial(train, config, (x, y, xv, yv)),
                 config=config, device=device, out=out, stack="seeds", steps=config.steps,
                 threads=config.threads, workers=config.workers,
                 info={"majority_class": majority, "majority_error": majority_error})


def _loss(model: NormMLP, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(model(x), y)


def _nll_and_error(model: NormMLP, x: Tensor, y: Tensor) -> Tensor:
    """One copy's mean NLL (nats) and error rate on ``(x, y)``, ``(2,)``."""
    logits = model(x)  # (N, 10)
    return torch.stack([F.cross_entropy(logits, y), (logits.argmax(-1) != y).float().mean()])


def train(config: Config, data: tuple[Tensor, ...], job: Job) -> list[tuple[History, dict]]:
    """Every seed of norm ``job.params`` as one :class:`~lnbook.engine.Stack` of
    :class:`NormMLP` (copy ``k`` built under ``torch.manual_seed(seed_k)`` and fed the batches
    :class:`~lnbook.engine.Batches` gives that seed, as a run alone), trained with Adam by
    :func:`~lnbook.engine.copies.train_copies` on the digits ``data`` (``x, y, x_val,
    y_val``); ``weight_growth`` (each hidden layer's weight norm at the end over its start) in
    each run's info."""
    x, y, xv, yv = (t.to(job.device) for t in data)
    models = []
    for seed in job.seeds:
        torch.manual_seed(seed)
        models.append(NormMLP(job.params, config.hidden_size, config.depth))
    start = [[float(layer.weight.detach().norm()) for layer in m.layers] for m in models]
    stack = Stack(models).to(job.device)
    batches = [Batches(x, y, batch_size=config.batch_size, seed=s) for s in job.seeds]

    def losses(step: int) -> Tensor:  # (S,)
        xb, yb = zip(*(b(step) for b in batches), strict=True)
        return stack.call(_loss, torch.stack(xb), torch.stack(yb))  # (S, B, 64), (S, B)

    def evaluate() -> list[dict[str, float]]:  # val_nll, val_error, train_nll, train_error
        with torch.no_grad():
            m = {split: stack.call(_nll_and_error, xs, ys, shared=(0, 1)).tolist()  # (S, 2)
                 for split, xs, ys in (("val", xv, yv), ("train", x, y))}
        return [{f"{split}_{k}": rows[i][j] for split, rows in m.items()
                 for j, k in enumerate(("nll", "error"))} for i in range(len(job.seeds))]

    opt = torch.optim.Adam(stack.parameters(), lr=config.lr, foreach=True)
    hists = train_copies(losses, evaluate, opt, [History() for _ in job.seeds], config.steps,
                         config.eval_every, state=stack, checkpoint=job.checkpoint,
                         bar=job.bar, label=job.label)
    return [(h, {"weight_growth": [float(layer.weight.detach().norm()) / n0
                                   for layer, n0 in zip(m.layers, s0, strict=True)]})
            for h, m, s0 in zip(hists, stack.unstack(), start, strict=True)]


#: The two arms of :func:`run_affine`: layer norm with its gain and bias, and without them.
AFFINE_NORMS = ("layer", "simple")


def affine_mlp(seeds: tuple[int, ...] | list[int], hidden: int = 32, depth: int = 3) -> SeedMLP:
    """Both arms of :func:`run_affine` for every seed, as one batched
    :class:`~lnbook.batched.SeedMLP` (``hidden_bias=False``, ``affine=True``).

    Slices ``0 .. S-1``: layer norm with gain and bias; ``S .. 2S-1``: LayerNorm-simple followed by
    a bias (its gains' gradients zeroed, so they stay 1). Slices ``i`` and ``S + i`` start from the
    network built under ``torch.manual_seed(seeds[i])``.
    """
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    sizes, n = (64, *[hidden] * depth, 10), len(seeds)
    model = SeedMLP(2 * n, sizes, "layer", hidden_bias=False, affine=True)
    with torch.no_grad():
        for i, seed in enumerate(seeds):
            torch.manual_seed(seed)
            one = SeedMLP(1, sizes, "layer", hidden_bias=False, affine=True)
            for p, q in zip(model.parameters(), one.parameters(), strict=True):
                p[i] = p[n + i] = q[0]
    keep = torch.cat([torch.ones(n), torch.zeros(n)]).view(-1, 1, 1)  # (2S, 1, 1)
    for g in model.gains:
        g.register_hook(lambda grad: grad * keep)
    return model


def run_affine(config: Config) -> dict[str, dict[str, Any]]:
    """LayerNorm against LayerNorm-simple where every ReLU keeps its threshold (:func:`affine_mlp`,
    every seed at once, trained by the engine's
    :func:`~lnbook.engine.copies.train_copies`, batches as
    :class:`~lnbook.engine.train.Batches`). Returns ``{norm: {"val_nll", "val_error", "train_nll":
    (S,)}}`` and ``"info"``: ``{"majority_error": float}``.
    """
    check_config(config, Config)
    seeds = resolve_seeds(config.seeds)
    x, y = load_digits_tensor("train", flatten=True)  # (1438, 64), (1438,)
    xv, yv = load_digits_tensor("test", flatten=True)  # (359, 64), (359,)
    majority = int(torch.bincount(y).argmax())
    with cpu_threads(config.threads):
        model = affine_mlp(seeds, config.hidden_size, config.depth)
        opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
        batches = seed_batches(x, y, config.batch_size, seeds)

        def losses(step: int) -> Tensor:  # (2S,): both arms of every seed on its batch
            xb, yb = batches(step)  # (S, B, 64), (S, B)
            return seed_nll(model(torch.cat([xb, xb])), torch.cat([yb, yb]))

        copies = [History() for _ in range(2 * len(seeds))]
        train_copies(losses, lambda: [{} for _ in copies], opt, copies, config.steps,
                     config.steps)  # measured below, once
        with torch.no_grad():
            logits = model(xv)  # (2S, 359, 10)
            val = seed_nll(logits, yv).double().numpy()
            err = (logits.argmax(-1) != yv).double().mean(1).numpy()
            train = seed_nll(model(x), y).double().numpy()
    n = len(seeds)
    out: dict[str, dict[str, Any]] = {
        arm: {"val_nll": val[k * n:(k + 1) * n], "val_error": err[k * n:(k + 1) * n],
              "train_nll": train[k * n:(k + 1) * n]} for k, arm in enumerate(AFFINE_NORMS)}
    out["info"] = {"majority_error": float((yv != majority).float().mean())}
    return out


#: Rule 0 of P13 and P14: a run leaves the trivial phase when its held-out error is at least
#: this much below the error of always predicting the most frequent training class.
TRIVIAL_MARGIN = 0.5


def p13_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P13's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim` from a
    :func:`run`, per seed on the final held-out loss: what the statistics' gradients bring
    (DetachNorm minus LayerNorm-simple), and that minus what the forward normalization brings
    (no norm minus DetachNorm); a seed counts where LayerNorm's held-out error is
    :data:`TRIVIAL_MARGIN` below the majority class's."""
    nll = {v: results.final(v, "val_nll") for v in ("layer", "simple", "detach", "none")}
    backward, forward = nll["detach"] - nll["simple"], nll["none"] - nll["detach"]
    left = (results.final("layer", "val_error")
            <= results.info["majority_error"] - TRIVIAL_MARGIN)
    parts = ("statistics' gradients help", "more than the forward normalization")
    return {"values": {parts[0]: backward, parts[1]: backward - forward},
            "trivial_ok": dict.fromkeys(parts, left)}


def p14_inputs(affine: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """P14's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim` from the
    output of :func:`run_affine`, per seed: LayerNorm-simple's final held-out loss over
    LayerNorm's minus one, the two losses' difference, and the difference of their gaps
    (held-out minus training loss); a seed counts where both arms' held-out errors are
    :data:`TRIVIAL_MARGIN` below the majority class's."""
    ln, simple = affine["layer"], affine["simple"]
    bar = affine["info"]["majority_error"] - TRIVIAL_MARGIN
    both = (ln["val_error"] <= bar) & (simple["val_error"] <= bar)
    parts = ("does not hurt", "helps", "over-fits less")
    return {"values": {
        parts[0]: simple["val_nll"] / ln["val_nll"] - 1,
        parts[1]: simple["val_nll"] - ln["val_nll"],
        parts[2]: (simple["val_nll"] - simple["train_nll"]) - (ln["val_nll"] - ln["train_nll"])},
        "trivial_ok": dict.fromkeys(parts, both)}
