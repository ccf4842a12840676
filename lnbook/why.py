"""Why does normalization help? The measurements of chapter 6.8 (``06_8_why_normalization_helps``)
on lab 3.2's deep MLP: covariate shift on purpose (:class:`SignalNoise`), the effective learning
rate of scale-invariant weights, the smoothness of the loss, the gradients through the
statistics, and dead or always-on units; every seed of a run trains at once (:func:`train_seeds`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.batched import SeedMLP, seed_batches, seed_nll, seed_sq_norm
from lnbook.checks import check_choice, check_size, check_subset
from lnbook.engine import check_scale, make_config, resolve_seeds
from lnbook.engine.train import Batches
from lnbook.exercises import digits_split
from lnbook.experiments import mistakes
from lnbook.experiments.deep_mlp import DeepMLP

__all__ = [
    "VARIANTS", "Config", "get_config", "SignalNoise", "build", "train_deep", "train_seeds",
    "seed_model", "run", "norm_growth_step", "lr_sweep", "landscape", "landscape_seeds",
    "stats_seeds", "unit_rates",
]

VARIANTS = ("none", "none+noise", "layer", "layer+noise", "batch", "batch+noise")
"""The networks of :func:`run`: a norm (``none``, ``layer``, ``batch``), ``+noise`` adds
:class:`SignalNoise` after it."""


@dataclass
class Config:
    """Settings of the chapter's runs (:func:`get_config` gives the presets): the
    :class:`DeepMLP`'s ``depth`` and ``width``, ``init_scale`` (times He's std), SGD's
    ``batch``, ``steps``, ``lr``, ``momentum``, ``eval_every``, the :class:`SignalNoise`
    size ``noise``, the ``variants`` and the ``seeds`` (trained together)."""

    scale: str = "quick"
    depth: int = 8
    width: int = 64
    init_scale: float = 1.0
    batch: int = 64
    steps: int = 150
    lr: float = 0.05
    momentum: float = 0.9
    eval_every: int = 20
    noise: float = 0.2
    variants: tuple[str, ...] = VARIANTS
    seeds: int | tuple[int, ...] = 10

    def __post_init__(self) -> None:
        check_scale(self.scale)
        check_subset("variants", self.variants, VARIANTS)
        for name in ("depth", "width", "batch", "steps", "eval_every"):
            check_size(name, getattr(self, name))
        if not (self.init_scale > 0 and self.lr > 0 and self.noise >= 0):
            raise ValueError("init_scale and lr must be positive and noise >= 0, got "
                             f"{self.init_scale}, {self.lr}, {self.noise}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"eval_every": 150},  # the chapter reads the final losses only
    "paper": {"width": 256, "steps": 2000, "eval_every": 100, "seeds": 10},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


class SignalNoise(nn.Module):
    r"""Covariate shift on purpose (Santurkar et al., 2018): in training mode every unit gets,
    at every forward, :math:`h_{ni} \to s_i h_{ni} + m_i` with :math:`s_i \sim U(1 - r, 1 + r)`,
    :math:`m_i \sim \mathcal N(r, r^2)\,\mathrm{rms}_i` (its detached rms over the batch),
    ``r = size`` in [0, 1). In evaluation mode it does nothing.

    Shape:
        - Input: ``(N, H)``; output: the same.
    """

    def __init__(self, size: float = 0.5) -> None:
        super().__init__()
        if not 0 <= size < 1:
            raise ValueError(f"size must lie in [0, 1), got {size!r}")
        self.size = float(size)

    def forward(self, h: Tensor) -> Tensor:
        if not self.training or self.size == 0:
            return h
        r = self.size
        rms = h.detach().square().mean(0).sqrt()  # (H,) per unit, over the batch
        scale = 1 + r * (2 * torch.rand_like(rms) - 1)  # (H,) in [1 - r, 1 + r]
        shift = r * (1 + torch.randn_like(rms)) * rms  # (H,) mean r rms, std r rms
        return h * scale + shift

    def extra_repr(self) -> str:
        return f"size={self.size}"


def build(variant: str, config: Config) -> DeepMLP:
    """The :class:`DeepMLP` of ``variant`` (one of :data:`VARIANTS`) with ``config``'s sizes."""
    check_choice("variant", variant, VARIANTS)
    norm, _, noisy = variant.partition("+")
    sizes = (64, *[config.width] * config.depth, 10)
    model = DeepMLP(sizes, norm, init_scale=config.init_scale)
    if noisy:
        model.norms = nn.ModuleList(nn.Sequential(n, SignalNoise(config.noise))
                                    for n in model.norms)
    return model


def _nll(model: nn.Module, x: Tensor, y: Tensor) -> Any:
    """The loss in evaluation mode: a float, or ``(S,)`` per seed for a :class:`SeedMLP`."""
    was = model.training
    model.eval()
    with torch.no_grad():
        if isinstance(model, SeedMLP):
            out = seed_nll(model(x), y).numpy()  # (S,)
        else:
            out = float(F.cross_entropy(model(x), y))
    model.train(was)
    return out


def _sgd(model: nn.Module, hidden: list[Tensor], config: Config, lr: float | None,
         momentum: float | None, hidden_lr: float | None) -> torch.optim.SGD:
    """SGD with step ``hidden_lr`` on the ``hidden`` weights and ``lr`` on the rest."""
    lr = config.lr if lr is None else lr
    ids = {id(w) for w in hidden}
    groups = [{"params": hidden, "lr": lr if hidden_lr is None else hidden_lr},
              {"params": [p for p in model.parameters() if id(p) not in ids]}]
    return torch.optim.SGD(groups, lr=lr,
                           momentum=config.momentum if momentum is None else momentum)


def train_deep(variant: str, seed: int, config: Config, lr: float | None = None,
               momentum: float | None = None, hidden_lr: float | None = None) -> dict[str, Any]:
    """Train one :func:`build` network on the digits with SGD. The record: ``steps``,
    ``test_nll`` at them, final ``train_nll``, ``weight_norms`` ``(2, depth)`` (start, end),
    ``diverged`` and ``model``. ``hidden_lr``: the hidden weight matrices' own step size."""
    x, y, xt, yt = digits_split()
    torch.manual_seed(seed)
    model = build(variant, config)
    hidden = [lin.weight for lin in model.linears[:-1]]
    opt = _sgd(model, hidden, config, lr, momentum, hidden_lr)
    batches = Batches(x, y, batch_size=config.batch, seed=seed)
    norms0 = [float(w.detach().norm()) for w in hidden]
    steps, test, diverged = [0], [_nll(model, xt, yt)], False
    for step in range(1, config.steps + 1):
        xb, yb = batches(step - 1)
        loss = F.cross_entropy(model(xb), yb)
        if not torch.isfinite(loss):
            diverged = True
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % config.eval_every == 0:
            steps.append(step)
            test.append(_nll(model, xt, yt))
    model.eval()
    train = math.inf if diverged else _nll(model, x, y)
    diverged = diverged or not (math.isfinite(train) and math.isfinite(test[-1]))
    return {"steps": np.array(steps), "test_nll": np.array(test),
            "train_nll": train if math.isfinite(train) else math.inf,
            "weight_norms": np.array([norms0, [float(w.detach().norm()) for w in hidden]]),
            "diverged": diverged, "model": model}


def seed_model(variant: str, seeds: tuple[int, ...], config: Config) -> SeedMLP:
    """The :func:`build` networks of ``seeds`` (each made after ``torch.manual_seed(seed)``,
    as :func:`train_deep` makes it), stacked into one :class:`SeedMLP`."""
    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(build(variant, config))
    norm, _, noisy = variant.partition("+")
    return SeedMLP.from_models(models, (64, *[config.width] * config.depth, 10), norm,
                               noise=config.noise if noisy else 0.0)


def train_seeds(variant: str, seeds: tuple[int, ...], config: Config,
                lr: float | None = None, momentum: float | None = None,
                hidden_lr: float | None = None) -> list[dict[str, Any]]:
    """:func:`train_deep` for every seed at once in one :class:`lnbook.batched.SeedMLP` (its
    weights and batches; the noise from another stream); one record per seed."""
    seeds = tuple(int(s) for s in seeds)
    x, y, xt, yt = digits_split()
    model = seed_model(variant, seeds, config)
    torch.manual_seed(seeds[0])
    hidden = model.hidden_weights
    opt = _sgd(model, hidden, config, lr, momentum, hidden_lr)
    batches = seed_batches(x, y, config.batch, seeds)
    norms0 = torch.stack([w.detach().flatten(1).norm(dim=1) for w in hidden], 1)  # (S, L)
    steps, test = [0], [_nll(model, xt, yt)]
    stop = np.full(len(seeds), config.steps + 1)  # the first update whose loss was not finite
    for step in range(1, config.steps + 1):
        xb, yb = batches(step - 1)
        losses = seed_nll(model(xb), yb)  # (S,)
        bad = ~torch.isfinite(losses.detach()).numpy()
        stop[bad & (stop > step)] = step
        opt.zero_grad()
        losses.sum().backward()
        opt.step()
        if step % config.eval_every == 0:
            steps.append(step)
            test.append(_nll(model, xt, yt))
    train = _nll(model, x, y)
    norms1 = torch.stack([w.detach().flatten(1).norm(dim=1) for w in hidden], 1)
    curve, at = np.stack(test, 1), np.array(steps)  # (S, E), (E,)
    records = []
    for i in range(len(seeds)):
        keep = at < stop[i]
        diverged = bool(stop[i] <= config.steps) or not (
            math.isfinite(train[i]) and math.isfinite(curve[i, keep][-1]))
        one = build(variant, config)
        model.copy_to(one, i)
        records.append({"steps": at[keep], "test_nll": curve[i, keep],
                        "train_nll": math.inf if diverged else float(train[i]),
                        "weight_norms": np.stack([norms0[i].numpy(), norms1[i].numpy()]),
                        "diverged": diverged, "model": one.eval()})
    return records


def run(config: Config) -> dict[str, list[dict[str, Any]]]:
    """Every variant of ``config.variants`` with every seed (trained together):
    ``{variant: [record per seed]}``."""
    seeds = resolve_seeds(config.seeds)
    return {v: train_seeds(v, seeds, config) for v in config.variants}


def norm_growth_step(model: DeepMLP, x: Tensor, y: Tensor, lr: float,
                     layer: int = 1) -> dict[str, float]:
    r"""One plain SGD step on ``model`` (in place): for a scale-invariant :math:`W`,
    :math:`\lVert W - \eta g\rVert^2 = \lVert W\rVert^2 + \eta^2\lVert g\rVert^2`. Returns
    ``cos`` (of W and g), the squared norms ``before``, ``after`` and ``predicted``."""
    w = model.linears[layer].weight
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        g = w.grad.clone()
        before = float(w.square().sum())
        cos = float((w * g).sum() / (w.norm() * g.norm()))
        predicted = before + lr**2 * float(g.square().sum())
        w -= lr * g
        after = float(w.square().sum())
    return {"cos": cos, "before": before, "after": after, "predicted": predicted}


def lr_sweep(config: Config, lrs: tuple[float, ...], norms: tuple[str, ...] = ("none", "layer"),
             seeds: tuple[int, ...] | None = None) -> dict[tuple[str, float], list[dict]]:
    """``{(norm, lr): [record per seed]}``: plain SGD with step ``lr`` on the hidden weights,
    ``config.lr`` on the rest (Arora, Li and Lyu, 2019)."""
    seeds = resolve_seeds(config.seeds if seeds is None else seeds)
    return {(n, lr): train_seeds(n, seeds, config, momentum=0.0, hidden_lr=lr)
            for n in norms for lr in lrs}


def _along(model: nn.Module, x: Tensor, y: Tensor, lr: float, multiples: tuple[float, ...]
           ) -> tuple[list, list]:
    """Losses and ``||g_k - g|| / (k lr ||g||)`` at ``w - k lr g`` for each ``k``, on a copy in
    training mode (per seed, ``(S,)`` tensors, for a :class:`SeedMLP`)."""
    model = copy.deepcopy(model).train()
    params = [p for p in model.parameters() if p.requires_grad]
    per_seed = isinstance(model, SeedMLP)

    def grad_at() -> tuple[Any, list[Tensor]]:
        model.zero_grad()
        loss = seed_nll(model(x), y) if per_seed else F.cross_entropy(model(x), y)  # (S,) or ()
        loss.sum().backward()  # each seed's own gradient
        grads = [p.grad.detach().clone() for p in params]
        return (loss.detach() if per_seed else float(loss.detach())), grads

    def norm(ts: list[Tensor]) -> Any:
        if per_seed:
            return seed_sq_norm(ts).sqrt()
        return math.sqrt(sum(float(t.square().sum()) for t in ts))

    _, g = grad_at()
    start = [p.detach().clone() for p in params]
    gnorm = norm(g)
    losses, betas = [], []
    for k in multiples:
        with torch.no_grad():
            for p, p0, gi in zip(params, start, g, strict=True):
                p.copy_(p0 - k * lr * gi)
        loss, gk = grad_at()
        losses.append(loss)
        betas.append(norm([a - b for a, b in zip(gk, g, strict=True)]) / (k * lr * gnorm))
    return losses, betas


def landscape(model: nn.Module, x: Tensor, y: Tensor, lr: float,
              multiples: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)) -> dict[str, float]:
    r"""How the loss and its gradient change along the gradient (Santurkar et al., 2018): at
    :math:`w - k\eta g` for ``k`` in ``multiples``, ``loss_range`` :math:`\max_k L_k - \min_k
    L_k` and ``beta`` :math:`\max_k \lVert g_k - g\rVert / (k\eta\lVert g\rVert)`, on a copy
    in training mode."""
    losses, betas = _along(model, x, y, lr, multiples)
    return {"loss_range": max(losses) - min(losses), "beta": max(betas)}


def landscape_seeds(model: SeedMLP, x: Tensor, y: Tensor, lr: float,
                    multiples: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
                    ) -> dict[str, np.ndarray]:
    """:func:`landscape` of every seed of a :class:`lnbook.batched.SeedMLP` at once, ``(S,)``."""
    losses, betas = _along(model, x, y, lr, multiples)
    loss_k = torch.stack(losses)  # (K, S)
    return {"loss_range": (loss_k.max(0).values - loss_k.min(0).values).double().numpy(),
            "beta": torch.stack(betas).max(0).values.double().numpy()}


def stats_seeds(config: mistakes.StatsConfig) -> dict[str, dict[str, np.ndarray]]:
    """Chapter 13's :func:`lnbook.experiments.mistakes.run_stats`, every seed at once:
    ``{norm: {"val_nll": (S,), "train_nll": (S,)}}``, the final losses (nats)."""
    x, y, xv, yv = digits_split()
    sizes = (64, *[config.hidden] * config.depth, 10)
    seeds = resolve_seeds(config.seeds)
    out = {}
    for norm in config.norms:
        models = []
        for s in seeds:
            torch.manual_seed(s)
            models.append(mistakes.NormMLP(norm, config.hidden, config.depth))
        model = SeedMLP.from_models(models, sizes, "none" if norm == "none" else "layer",
                                    hidden_bias=True, affine=norm == "layer",
                                    detach=norm == "detach")
        opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
        batches = seed_batches(x, y, config.batch, seeds)
        for step in range(config.steps):
            xb, yb = batches(step)
            opt.zero_grad()
            seed_nll(model(xb), yb).sum().backward()
            opt.step()
        out[norm] = {"val_nll": _nll(model, xv, yv),
                     "train_nll": _nll(model, x, y)}
    return out


def unit_rates(model: DeepMLP, x: Tensor) -> np.ndarray:
    """The fraction of the examples of ``x`` for which each hidden unit's ReLU is on,
    ``(depth, H)`` (evaluation mode): 0 is a dead unit, near 1 an effectively linear one."""
    was = model.training
    model.eval()
    with torch.no_grad():
        _, summed = model(x, return_summed=True)  # depth x (N, H)
        rates = [(torch.relu(n(a)) > 0).double().mean(0).numpy()
                 for a, n in zip(summed, model.norms, strict=True)]
    model.train(was)
    return np.stack(rates)
