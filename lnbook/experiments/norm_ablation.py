"""Xu et al. (2019)'s ablation of layer norm (Part II, chapter `13_common_mistakes`, claims P13
and P14): what the forward normalization, the statistics' gradients and the gain and bias each
bring, on an MLP on the 8x8 digits.

:func:`run` trains a :class:`~lnbook.mlp.NormMLP` with each norm of ``config.norms``
(:data:`~lnbook.mlp.STATS_NORMS`: LayerNorm, LayerNorm-simple without gain and bias,
:class:`~lnbook.mlp.DetachNorm` whose statistics are constants to the backward pass, no norm);
:func:`p13_inputs` reads P13's per-seed quantities from it. With ``bias_after_norm`` it trains
the two arms of P14 instead, each bias after the norm (:class:`BiasAfterMLP`), and
:func:`p14_inputs` reads them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_bool, check_choice, check_config, check_size
from lnbook.data import load_digits_tensor
from lnbook.engine import (
    Batches,
    History,
    Job,
    Results,
    Stack,
    make_config,
    sweep,
    train_copies,
)
from lnbook.engine.config import RunConfig
from lnbook.mlp import STATS_NORMS, NormMLP

__all__ = ["NAME", "DESCRIPTION", "AFFINE_NORMS", "BiasAfterMLP", "Config", "get_config", "run",
           "train", "NORM_LABELS", "TRIVIAL_MARGIN", "HURT", "p13_inputs",
           "p14_inputs", "p14_pilot"]

NAME = "norm_ablation"
DESCRIPTION = ("an MLP on the 8x8 digits with LayerNorm, LayerNorm-simple (no gain and bias), "
               "DetachNorm (statistics detached) and no norm (Xu et al. 2019)")

NORM_LABELS = {"layer": "LayerNorm", "simple": "LayerNorm-simple", "detach": "DetachNorm",
               "none": "no norm"}


#: The two arms of P14's network (:class:`BiasAfterMLP`): layer norm with its gain and bias,
#: and LayerNorm-simple followed by a bias.
AFFINE_NORMS = ("layer", "simple")


class BiasAfterMLP(nn.Module):
    r"""P14's network: ``depth`` times ``Linear (no bias) -> norm -> + b -> ReLU``, then
    ``Linear``, on flat 8x8 digits ``(N, 64)``.

    With ``norm="layer"`` the norm and the bias are layer norm's own, :math:`g \odot \hat a + b`
    (eq. 3 with its gain and bias); with ``"simple"`` they are LayerNorm-simple (no gain) and a
    plain bias per unit, :math:`\hat a + b`. Every ReLU thus keeps a threshold of its own
    (in front of the norm, centring would remove most of a bias). The weights are drawn
    He-normal, layer by layer, so that the two arms built under one seed start alike.
    """

    def __init__(self, norm: str = "layer", hidden: int = 32, depth: int = 3,
                 eps: float = 1e-5) -> None:
        super().__init__()
        check_choice("norm", norm, AFFINE_NORMS)
        check_size("hidden", hidden)
        check_size("depth", depth)
        self.norm_kind, self.eps = norm, float(eps)
        sizes = (64, *[hidden] * depth, 10)
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(i, o))
                                        for i, o in zip(sizes[:-1], sizes[1:], strict=True))
        self.out_bias = nn.Parameter(torch.zeros(10))
        self.gains = nn.ParameterList(nn.Parameter(torch.ones(hidden))
                                      for _ in range(depth if norm == "layer" else 0))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(hidden)) for _ in range(depth))
        for w in self.weights:
            nn.init.normal_(w, std=math.sqrt(2.0 / w.shape[0]))

    @property
    def hidden_weights(self) -> list[nn.Parameter]:
        """The weight matrices in front of a norm."""
        return [self.weights[k] for k in range(len(self.biases))]

    def forward(self, x: Tensor) -> Tensor:
        h = x  # (N, 64)
        for k in range(len(self.biases)):  # indexed: a slice would bypass torch.func's swap
            w, b = self.weights[k], self.biases[k]
            a = F.layer_norm(h @ w, w.shape[1:], eps=self.eps)  # (N, H)
            a = torch.addcmul(b, a, self.gains[k]) if len(self.gains) else a + b
            h = torch.relu(a)
        return torch.addmm(self.out_bias, h, self.weights[-1])  # (N, 10)

    def extra_repr(self) -> str:
        return f"norm={self.norm_kind!r}, depth={len(self.biases)}, eps={self.eps}"


@dataclass
class Config(RunConfig):
    """Settings of the ablation (:func:`get_config` gives the presets): a :class:`NormMLP`
    (``hidden_size``, ``depth``) with each of ``norms`` (:data:`STATS_NORMS`), or with
    ``bias_after_norm`` P14's :class:`BiasAfterMLP` with each of ``norms`` (then from
    :data:`AFFINE_NORMS`), trained with Adam (``lr``, ``batch_size``) for ``steps`` updates,
    evaluated every ``eval_every``."""

    norms: tuple[str, ...] = STATS_NORMS
    bias_after_norm: bool = False
    hidden_size: int = 32
    depth: int = 3
    batch_size: int = 64
    steps: int = 150
    lr: float = 3e-3
    eval_every: int = 25
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("bias_after_norm", self.bias_after_norm)
        known = AFFINE_NORMS if self.bias_after_norm else STATS_NORMS
        if not self.norms or any(n not in known for n in self.norms):
            raise ValueError(f"norms must be drawn from {known}"
                             f"{' (bias_after_norm)' if self.bias_after_norm else ''}, got "
                             f"{self.norms}")
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
    """Train the network of ``config`` (:class:`NormMLP`, or :class:`BiasAfterMLP` with
    ``bias_after_norm``) with every norm of ``config.norms``, the seeds of each norm as
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


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(model(x), y)


def _nll_and_error(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """One copy's mean NLL (nats) and error rate on ``(x, y)``, ``(2,)``."""
    logits = model(x)  # (N, 10)
    return torch.stack([F.cross_entropy(logits, y), (logits.argmax(-1) != y).float().mean()])


def train(config: Config, data: tuple[Tensor, ...], job: Job) -> list[tuple[History, dict]]:
    """Every seed of norm ``job.params`` as one :class:`~lnbook.engine.Stack` of
    :class:`NormMLP` or :class:`BiasAfterMLP` (copy ``k`` built under
    ``torch.manual_seed(seed_k)`` and fed the batches :class:`~lnbook.engine.Batches` gives
    that seed, as a run alone), trained with Adam by
    :func:`~lnbook.engine.copies.train_copies` on the digits ``data`` (``x, y, x_val,
    y_val``); ``weight_growth`` (each hidden layer's weight norm at the end over its start) in
    each run's info."""
    x, y, xv, yv = (t.to(job.device) for t in data)
    net = BiasAfterMLP if config.bias_after_norm else NormMLP
    models = []
    for seed in job.seeds:
        torch.manual_seed(seed)
        models.append(net(job.params, config.hidden_size, config.depth))
    start = [[float(w.detach().norm()) for w in _hidden_weights(m)] for m in models]
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
    return [(h, {"weight_growth": [float(w.detach().norm()) / n0
                                   for w, n0 in zip(_hidden_weights(m), s0, strict=True)]})
            for h, m, s0 in zip(hists, stack.unstack(), start, strict=True)]


def _hidden_weights(model: nn.Module) -> list[Tensor]:
    """The weight matrices in front of a norm, of a :class:`NormMLP` or a
    :class:`BiasAfterMLP`."""
    if isinstance(model, BiasAfterMLP):
        return model.hidden_weights
    return [layer.weight for layer in model.layers]


#: Rule 0 of P13 and P14: a run leaves the trivial phase when its held-out error is at least
#: this much below the error of always predicting the most frequent training class.
TRIVIAL_MARGIN = 0.5
#: P14's "does not hurt": LayerNorm-simple's held-out loss at most this fraction above
#: LayerNorm's (the rule's ``at`` in ``claims.yml``; a test holds them equal).
HURT = 0.05


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


def p14_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P14's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim` from a
    :func:`run` with ``bias_after_norm`` (both :data:`AFFINE_NORMS`), per seed:
    LayerNorm-simple's final held-out loss over LayerNorm's minus one, the two losses'
    difference, and the difference of their gaps (held-out minus training loss); a seed counts
    where both arms' held-out errors are :data:`TRIVIAL_MARGIN` below the majority class's."""
    ln, simple = ({k: results.final(arm, k) for k in ("val_nll", "val_error", "train_nll")}
                  for arm in AFFINE_NORMS)
    bar = results.info["majority_error"] - TRIVIAL_MARGIN
    both = (ln["val_error"] <= bar) & (simple["val_error"] <= bar)
    parts = ("does not hurt", "helps", "over-fits less")
    return {"values": {
        parts[0]: simple["val_nll"] / ln["val_nll"] - 1,
        parts[1]: simple["val_nll"] - ln["val_nll"],
        parts[2]: (simple["val_nll"] - simple["train_nll"]) - (ln["val_nll"] - ln["train_nll"])},
        "trivial_ok": dict.fromkeys(parts, both)}


def p14_pilot(results: Results) -> dict[str, dict[str, Any]]:
    """What P14's pilot records (``pilot: quantities`` in ``claims.yml``), from a :func:`run`
    with ``bias_after_norm``: per arm the final held-out and training loss and held-out error
    per seed; then the per-seed values of P14's parts, how many seeds have both arms out of the
    trivial phase, and on how many LayerNorm-simple's held-out loss is within :data:`HURT`
    of LayerNorm's (the bound of "does not hurt")."""
    out: dict[str, dict[str, Any]] = {
        arm: {k: results.final(arm, k).tolist() for k in ("val_nll", "train_nll", "val_error")}
        for arm in AFFINE_NORMS}
    inputs = p14_inputs(results)
    parts = {part: v.tolist() for part, v in inputs["values"].items()}
    out["P14"] = {**parts, "seeds out of the trivial phase":
                  int(inputs["trivial_ok"]["does not hurt"].sum()),
                  "seeds within 5 %": int((inputs["values"]["does not hurt"] <= HURT).sum())}
    return out
