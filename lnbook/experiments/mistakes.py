"""Common mistakes in layer normalization (Part II, chapter `13_common_mistakes`, claims P10,
P13, P14): :func:`layer_norm_variant` (eq. 3 right or in a common wrong way), loading weights
trained with the unbiased variance (:class:`UnbiasedLayerNorm`, :func:`to_biased`), DeepNorm's
constant (:func:`residual_placements`, :func:`run`: the model update of deep Post-LN stacks), and
Xu et al. (2019)'s ablation of the statistics' gradients and the gain and bias
(:func:`run_stats`, :func:`run_affine`).
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

from lnbook.batched import SeedMLP, seed_batches, seed_nll
from lnbook.checks import check_config
from lnbook.data import load_digits_tensor, sort_task
from lnbook.engine import (
    Batches,
    History,
    Job,
    Results,
    classification_metrics,
    cpu_threads,
    fit,
    make_config,
    max_updates,
    resolve_seeds,
    sweep,
    train_copies,
)
from lnbook.engine.config import RunConfig
from lnbook.functional import (
    normalize,
    normalize_detached,
    normalize_eps_outside,
    normalize_in_input_dtype,
    normalize_one_pass,
    normalize_unbiased,
)
from lnbook.mlp import STATS_NORMS, DetachNorm, NormMLP
from lnbook.norms import LayerNorm, layer_norm
from lnbook.transformer import Transformer, sequence_loss

__all__ = ["NAME", "DESCRIPTION", "KINDS", "Config", "get_config", "layer_norm_variant",
           "UnbiasedLayerNorm", "DigitsMLP", "train_digits_mlp", "to_biased",
           "residual_placements", "variant_name", "run", "STATS_NORMS", "NORM_LABELS",
           "DetachNorm", "NormMLP", "StatsConfig", "get_stats_config", "run_stats", "AFFINE_NORMS",
           "affine_mlp", "run_affine"]

NAME = "mistakes"
DESCRIPTION = ("size of the first model updates of deep Post-LN Transformers, plain and with "
               "DeepNorm (Wang et al. 2022), at several depths")
KINDS = ("post", "deepnorm")


def layer_norm_variant(x: Tensor, eps: float = 1e-5, *, unbiased: bool = False,
                       one_pass: bool = False, eps_inside: bool = True,
                       stats_dtype: torch.dtype | None = None, detach: bool = False) -> Tensor:
    """Eq. 3 over the last dimension ``(*, H)``, no gain and bias, right or in a common wrong way.

    Right (every option at its default): ``(x - mu) / sqrt(var + eps)``, biased two-pass variance,
    float32 statistics for half inputs. Each option, one at a time, picks a variant of
    :func:`lnbook.functional.normalize`: ``unbiased`` (divide by ``H - 1``), ``one_pass``
    (``E[x^2] - E[x]^2``), ``eps_inside=False`` (``(x - mu) / (sqrt(var) + eps)``), ``stats_dtype``
    (``torch.float16``: ``x ** 2`` overflows from ``|x| >= 256``), ``detach`` (:class:`DetachNorm`).
    """
    if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= 1):
        raise TypeError("x must be a floating-point tensor of shape (*, H)")
    h = x.shape[-1]
    if unbiased and h < 2:
        raise ValueError(f"the unbiased variance needs H >= 2 values, got H={h}")
    picked = [f for on, f in ((unbiased, normalize_unbiased), (one_pass, normalize_one_pass),
                              (not eps_inside, normalize_eps_outside),
                              (stats_dtype is not None, normalize_in_input_dtype),
                              (detach, normalize_detached)) if on]
    if len(picked) > 1:
        raise ValueError("layer_norm_variant makes one mistake at a time")
    rows = x.reshape(-1, h) if stats_dtype is None else x.reshape(-1, h).to(stats_dtype)
    x_hat, _ = (picked[0] if picked else normalize)(rows, eps)
    return x_hat.reshape(x.shape).to(x.dtype)


class UnbiasedLayerNorm(nn.Module):
    """Layer norm with the *unbiased* variance: the mistake, as a module
    (:class:`lnbook.LayerNorm`'s parameters and state dict; outputs ``sqrt((H - 1) / H)``
    times LN's before the bias).
    """

    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.hidden, self.eps = int(hidden), float(eps)
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_variant(x, self.eps, unbiased=True) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.hidden}, eps={self.eps}, unbiased variance"


class DigitsMLP(nn.Module):
    """``Linear -> norm -> ReLU -> Linear -> norm -> ReLU -> Linear`` on 8x8 digits ``(N, 64)``;
    ``norm`` ``"biased"`` (:class:`lnbook.LayerNorm`) or ``"unbiased"``
    (:class:`UnbiasedLayerNorm`).
    """

    def __init__(self, norm: str = "biased", hidden: int = 8, eps: float = 1e-5) -> None:
        super().__init__()
        if norm not in ("biased", "unbiased"):
            raise ValueError(f"norm must be 'biased' or 'unbiased', got {norm!r}")
        self.norm_kind, self.hidden = norm, int(hidden)
        norm_cls = LayerNorm if norm == "biased" else UnbiasedLayerNorm
        self.fc1, self.norm1 = nn.Linear(64, hidden), norm_cls(hidden, eps=eps)
        self.fc2, self.norm2 = nn.Linear(hidden, hidden), norm_cls(hidden, eps=eps)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.norm1(self.fc1(x)))  # (N, H)
        h = F.relu(self.norm2(self.fc2(h)))  # (N, H)
        return self.head(h)  # (N, 10)


def train_digits_mlp(norm: str = "unbiased", hidden: int = 8, steps: int = 300,
                     seed: int = 0, lr: float = 1e-2) -> DigitsMLP:
    """A :class:`DigitsMLP` trained with Adam on the 1,438 training digits (batch 32)."""
    x, y = load_digits_tensor("train", flatten=True)  # (1438, 64), (1438,)
    torch.manual_seed(seed)
    model = DigitsMLP(norm, hidden)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    fit(model, Batches(x, y, batch_size=32, seed=seed), opt, steps=steps, eval_every=steps,
        device="cpu", seed=seed, loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
        progress=False)
    return model.eval()


def to_biased(model: DigitsMLP) -> DigitsMLP:
    """The :class:`DigitsMLP` with biased layer norms that computes what ``model`` computes:
    ``g' = g * sqrt((H - 1) / H)`` and ``eps' = eps * (H - 1) / H``, all else kept.
    """
    if model.norm_kind != "unbiased":
        raise ValueError("to_biased converts a model built with norm='unbiased'")
    h = model.hidden
    c = (h - 1) / h
    new = DigitsMLP("biased", h, eps=model.norm1.eps * c)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for name in ("norm1", "norm2"):
        state[f"{name}.weight"] = state[f"{name}.weight"] * math.sqrt(c)
    new.load_state_dict(state)
    return new.eval()


def residual_placements(x: Tensor, branch: Tensor, alpha: float) -> dict[str, Tensor]:
    """A Post-LN residual with DeepNorm's ``alpha`` in three places: ``"residual"`` ``LN(alpha x +
    G(x))`` (Wang et al., 2022), ``"branch"`` ``LN(x + alpha G(x))``, ``"output"`` ``alpha LN(x +
    G(x))``; ``branch`` is ``G(x)``, LN without gain and bias.
    """
    if x.shape != branch.shape:
        raise ValueError(f"x and branch must have the same shape, got {tuple(x.shape)} and "
                         f"{tuple(branch.shape)}")
    d = x.shape[-1]
    return {"residual": layer_norm(alpha * x + branch, d),
            "branch": layer_norm(x + alpha * branch, d),
            "output": alpha * layer_norm(x + branch, d)}


@dataclass
class Config(RunConfig):
    """Settings of the DeepNorm update-size experiment (:func:`get_config` gives the presets):
    a stack of each of ``depths`` blocks and ``kinds``, on the sort task (``length``,
    ``vocab_size``), ``steps`` Adam updates (the update size measured after each) and
    ``n_probe`` held-out sequences on which the logits are compared; ``threads``: torch CPU
    threads (None: leave as is); ``workers``: runs trained at once, one process each."""

    depths: tuple[int, ...] = (2, 6, 18)
    kinds: tuple[str, ...] = KINDS
    d_model: int = 16
    n_heads: int = 2
    length: int = 6
    vocab_size: int = 8
    batch_size: int = 16
    steps: int = 1
    lr: float = 1e-3
    n_probe: int = 64
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(k not in KINDS for k in self.kinds) or not self.kinds:
            raise ValueError(f"kinds must be drawn from {KINDS}, got {self.kinds}")
        if not self.depths or any(d < 1 for d in self.depths):
            raise ValueError(f"depths must be positive, got {self.depths}")
        if self.steps < 1:
            raise ValueError("steps must be >= 1")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"threads": None, "depths": (6, 18, 50, 100, 200), "d_model": 128, "n_heads": 4,
              "length": 16, "vocab_size": 32, "batch_size": 64, "steps": 100, "lr": 5e-4,
              "n_probe": 256},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset (200 blocks; wants a GPU), with ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


_SMOKE_PROBE = 8  # probe sequences of a smoke run of the paper preset


def variant_name(kind: str, depth: int) -> str:
    """``"post/L18"``, ``"deepnorm/L18"``."""
    return f"{kind}/L{depth}"


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every (kind, depth) stack for ``steps`` Adam updates, with every seed; each evaluation
    records ``val_loss`` and ``update``, the RMS change of the logits on ``n_probe`` held-out
    sequences since initialization (Wang et al.'s ``||F(x, theta_t) - F(x, theta_0)||``).
    """
    check_config(config, Config)
    seeds, n_probe = config.seeds, config.n_probe
    if max_updates() is not None and config.scale == "paper":
        # a smoke run of the paper preset (lnbook.engine.capped): every model at full size,
        # but one seed and a few probe sequences, so that stacks of 200 blocks step within
        # minutes on a CPU (a probe pass of 256 sequences through one takes 10-20 s there)
        seeds, n_probe = resolve_seeds(seeds)[:1], min(n_probe, _SMOKE_PROBE)
    x, y = sort_task(4096, config.length, config.vocab_size, seed=0)  # (n, T)
    xp, yp = sort_task(n_probe, config.length, config.vocab_size, seed=1)
    variants = {variant_name(k, d): (k, d) for d in config.depths for k in config.kinds}
    return sweep(NAME, variants, seeds, partial(train_one, config, (x, y, xp, yp)),
                 config=config, device=device, out=out, steps=config.steps, threads=config.threads,
                 workers=config.workers)


def train_one(config: Config, data: tuple[Tensor, ...], job: Job) -> History:
    """One run of :func:`run`: the Post-LN (or DeepNorm) stack of ``job.params`` (kind, depth)
    trained on ``data`` (``x, y`` and the probe ``xp, yp``) with seed ``job.seed``."""
    x, y, xp, yp = data
    kind, depth = job.params
    torch.manual_seed(job.seed)
    model = Transformer(config.vocab_size + 1, config.d_model, config.n_heads, depth,
                        x.shape[1], norm="layer", position="post",
                        deepnorm=(kind == "deepnorm")).to(job.device)
    probe, targets = xp.to(job.device), yp.to(job.device)
    with torch.no_grad():
        start = model(probe)  # (n_probe, T, V) logits at initialization

    def eval_fn(m: nn.Module) -> dict[str, float]:
        logits = m(probe)  # (n_probe, T, V)
        return {"update": float((logits - start).square().mean().sqrt()),
                "val_loss": float(sequence_loss(logits, targets))}

    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    return fit(model, Batches(x, y, batch_size=config.batch_size, seed=job.seed), opt,
               steps=config.steps, eval_every=1, eval_fn=eval_fn, device=job.device,
               seed=job.seed, loss_fn=lambda m, b: sequence_loss(m(b[0]), b[1]),
               bar=job.bar, label=job.label)


NORM_LABELS = {"layer": "LayerNorm", "simple": "LayerNorm-simple", "detach": "DetachNorm",
               "none": "no norm"}


@dataclass
class StatsConfig(RunConfig):
    """Settings of the norm-ablation experiment on the digits (:func:`get_stats_config`): a
    :class:`NormMLP` (``hidden_size``, ``depth``) with each of ``norms`` (:data:`STATS_NORMS`),
    trained with Adam; ``threads``: torch CPU threads (None: leave as is); ``workers``: runs
    trained at once, one process each."""

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
        for name in ("hidden_size", "depth", "batch_size", "steps", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")


_STATS_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"threads": None, "hidden_size": 256, "depth": 8, "steps": 10000, "lr": 1e-3,
              "eval_every": 500, "seeds": 10},
}


def get_stats_config(scale: str = "quick", **overrides: Any) -> StatsConfig:
    """The ``quick`` or ``paper`` preset of :func:`run_stats`, with ``overrides``."""
    return make_config(StatsConfig, _STATS_PRESETS, scale, overrides)


def run_stats(config: StatsConfig, device: str | torch.device = "auto",
              out: str | os.PathLike | None = None) -> Results:
    """Train a :class:`NormMLP` with every norm of ``config.norms``, with every seed. Runs record
    ``val_nll``/``val_error`` (359 held-out digits), ``train_nll``/``train_error`` and, in
    ``info``, ``weight_growth`` per hidden layer; ``Results.info`` holds ``majority_error``."""
    check_config(config, StatsConfig, "get_stats_config")
    x, y = load_digits_tensor("train", flatten=True)  # (1438, 64), (1438,)
    xv, yv = load_digits_tensor("test", flatten=True)  # (359, 64), (359,)
    majority = int(torch.bincount(y).argmax())
    majority_error = float((yv != majority).float().mean())
    variants = {n: n for n in config.norms}
    return sweep(f"{NAME}_stats", variants, config.seeds,
                 partial(train_stats_one, config, (x, y, xv, yv)), config=config,
                 device=device, out=out, steps=config.steps, threads=config.threads,
                 workers=config.workers,
                 info={"majority_class": majority, "majority_error": majority_error})


def train_stats_one(config: StatsConfig, data: tuple[Tensor, ...], job: Job
                    ) -> tuple[History, dict[str, Any]]:
    """One run of :func:`run_stats`: a :class:`NormMLP` with norm ``job.params`` trained on the
    digits ``data`` (``x, y, x_val, y_val``) with seed ``job.seed``; ``weight_growth`` in info."""
    x, y, xv, yv = data
    torch.manual_seed(job.seed)
    model = NormMLP(job.params, config.hidden_size, config.depth).to(job.device)
    norms_init = [float(layer.weight.detach().norm()) for layer in model.layers]

    def eval_fn(m: nn.Module) -> dict[str, float]:  # val_nll, val_error, train_nll, ...
        return {f"{split}_{k}": v for split, xs, ys in (("val", xv, yv), ("train", x, y))
                for k, v in classification_metrics(m, xs, ys).items()}

    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    history = fit(model, Batches(x, y, batch_size=config.batch_size, seed=job.seed), opt,
                  steps=config.steps, eval_every=config.eval_every, eval_fn=eval_fn,
                  device=job.device, seed=job.seed,
                  loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                  bar=job.bar, label=job.label, checkpoint=job.checkpoint)
    growth = [float(layer.weight.detach().norm()) / n0
              for layer, n0 in zip(model.layers, norms_init, strict=True)]
    return history, {"weight_growth": growth}


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


def run_affine(config: StatsConfig) -> dict[str, dict[str, Any]]:
    """LayerNorm against LayerNorm-simple where every ReLU keeps its threshold (:func:`affine_mlp`,
    every seed at once, trained by the engine's
    :func:`~lnbook.engine.copies.train_copies`, batches as
    :class:`~lnbook.engine.train.Batches`). Returns ``{norm: {"val_nll", "val_error", "train_nll":
    (S,)}}`` and ``"info"``: ``{"majority_error": float}``.
    """
    check_config(config, StatsConfig, "get_stats_config")
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


# --- claims P10, P13 and P14: per-seed inputs to lnbook.ledger.decide_claim (chapter 13) -----

def p10_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P10's ``values`` for :func:`lnbook.ledger.decide_claim` from a :func:`run`, per seed on
    the final ``update`` (the RMS change of the logits): DeepNorm's over Post-LN's at the
    largest depth, and DeepNorm's growth from the smallest depth to the largest over Post-LN's
    (growth: the update at the largest depth over the one at the smallest)."""
    depths = sorted({int(v.rsplit("/L", 1)[1]) for v in results.variants})
    deep, shallow = depths[-1], depths[0]

    def update(kind: str, depth: int) -> Any:
        return results.final(variant_name(kind, depth), "update")  # (seeds,)

    growth = {k: update(k, deep) / update(k, shallow) for k in ("post", "deepnorm")}
    return {"values": {
        "smaller update at depth": update("deepnorm", deep) / update("post", deep),
        "grows less with depth": growth["deepnorm"] / growth["post"]}}


#: Rule 0 of P13 and P14: a run leaves the trivial phase when its held-out error is at least
#: this much below the error of always predicting the most frequent training class.
STATS_TRIVIAL = 0.5


def p13_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P13's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim` from a run of
    :func:`run_stats`, per seed on the final held-out loss: what the statistics' gradients bring
    (DetachNorm minus LayerNorm-simple), and that minus what the forward normalization brings
    (no norm minus DetachNorm); a seed counts where LayerNorm's held-out error is
    :data:`STATS_TRIVIAL` below the majority class's."""
    nll = {v: results.final(v, "val_nll") for v in ("layer", "simple", "detach", "none")}
    backward, forward = nll["detach"] - nll["simple"], nll["none"] - nll["detach"]
    left = (results.final("layer", "val_error")
            <= results.info["majority_error"] - STATS_TRIVIAL)
    parts = ("statistics' gradients help", "more than the forward normalization")
    return {"values": {parts[0]: backward, parts[1]: backward - forward},
            "trivial_ok": dict.fromkeys(parts, left)}


def p14_inputs(affine: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """P14's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim` from the
    output of :func:`run_affine`, per seed: LayerNorm-simple's final held-out loss over
    LayerNorm's minus one, the two losses' difference, and the difference of their gaps
    (held-out minus training loss); a seed counts where both arms' held-out errors are
    :data:`STATS_TRIVIAL` below the majority class's."""
    ln, simple = affine["layer"], affine["simple"]
    bar = affine["info"]["majority_error"] - STATS_TRIVIAL
    both = (ln["val_error"] <= bar) & (simple["val_error"] <= bar)
    parts = ("does not hurt", "helps", "over-fits less")
    return {"values": {
        parts[0]: simple["val_nll"] / ln["val_nll"] - 1,
        parts[1]: simple["val_nll"] - ln["val_nll"],
        parts[2]: (simple["val_nll"] - simple["train_nll"]) - (ln["val_nll"] - ln["train_nll"])},
        "trivial_ok": dict.fromkeys(parts, both)}


__all__ += ["STATS_TRIVIAL", "p10_inputs", "p13_inputs", "p14_inputs"]
