"""Why does normalization help? The experiment of chapter 6.8 (``06_8_why_normalization_helps``) on
lab 3.2's deep MLP (:class:`lnbook.mlp.DeepMLP`): covariate shift on purpose
(:class:`SignalNoise`, batch-shared, and :class:`ExampleNoise`, Santurkar et al.'s per-example
noise) and where a plain network breaks under it (:func:`blowup`), the effective learning rate of
scale-invariant weights and the equilibrium of their norm under weight decay
(:func:`decay_runs`), the smoothness of the loss, the gradients through the statistics, and dead
or always-on units; the chapter's table of known, contested and folklore statements built from
its measured values (:func:`evidence_rows`). :func:`run` trains the networks of :data:`VARIANTS`
through :func:`lnbook.engine.runner.sweep` (the seeds of a variant as one model); every other
measurement trains its seeds as one model too, through :func:`lnbook.engine.copies.train_copies`
(:func:`train_stack`).
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.batched import SeedMLP, seed_batches, seed_nll, seed_sq_norm
from lnbook.checks import check_choice, check_config, check_size, check_subset
from lnbook.engine import (
    History,
    Job,
    Results,
    make_config,
    max_updates,
    resolve_seeds,
    sweep,
    train_copies,
)
from lnbook.engine.config import RunConfig
from lnbook.exercises import digits_split
from lnbook.mlp import DeepMLP

__all__ = [
    "NAME", "DESCRIPTION", "VARIANTS", "Config", "get_config", "SignalNoise", "build",
    "seed_model", "run", "train_variant", "final_nll", "norm_growth_step", "lr_sweep",
    "landscape", "landscape_seeds",
    "unit_rates", "NOISES", "ExampleNoise", "noise_model", "train_stack",
    "noise_runs", "blowup", "decay_runs", "evidence_rows", "example_noise", "pilot_noise",
    "largest_safe", "blowup_rows", "decay_summary", "EVIDENCE_KEYS",
]

NAME = "why"
DESCRIPTION = ("chapter 6.8: lab 3.2's 8-layer ReLU MLP with no norm / layer norm / batch norm, "
               "with and without injected covariate shift, trained by SGD on the 8x8 digits")

NOISES = ("shared", "example")
"""The two injected noises: ``shared`` (:class:`SignalNoise`, one draw per unit for the whole
batch) and ``example`` (:class:`ExampleNoise`, Santurkar et al.'s: every activation of every
example its own draw, from a distribution drawn afresh at every update)."""

VARIANTS = ("none", "none+noise", "layer", "layer+noise", "batch", "batch+noise")
"""The networks of :func:`run`: a norm (``none``, ``layer``, ``batch``), ``+noise`` adds
:class:`SignalNoise` after it."""


@dataclass
class Config(RunConfig):
    """Settings of the chapter's runs (:func:`get_config` gives the presets): the
    :class:`DeepMLP`'s ``depth`` and ``width``, ``init_scale`` (times He's std), SGD's
    ``batch_size``, ``steps``, ``lr``, ``momentum``, ``eval_every``, the :class:`SignalNoise`
    size ``noise``, the ``variants`` and the ``seeds`` (a variant's seeds train as one
    model)."""

    depth: int = 8
    width: int = 64
    init_scale: float = 1.0
    batch_size: int = 64
    steps: int = 150
    lr: float = 0.05
    momentum: float = 0.9
    eval_every: int = 20
    noise: float = 0.2
    variants: tuple[str, ...] = VARIANTS
    seeds: int | tuple[int, ...] = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        check_subset("variants", self.variants, VARIANTS)
        for name in ("depth", "width", "batch_size", "steps", "eval_every"):
            check_size(name, getattr(self, name))
        if not (self.init_scale > 0 and self.lr > 0 and self.noise >= 0):
            raise ValueError("init_scale and lr must be positive and noise >= 0, got "
                             f"{self.init_scale}, {self.lr}, {self.noise}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"eval_every": 150},  # the chapter reads the final losses only
    "paper": {"width": 256, "steps": 2000, "eval_every": 100, "seeds": 10, "threads": None},
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


def example_noise(h: Tensor, size: float | Tensor, batch_dim: int = 0) -> Tensor:
    r"""Santurkar et al.'s noise on ``h`` (examples along ``batch_dim``): at every call each unit
    :math:`i` gets a distribution of its own, mean :math:`\mu_i \sim \mathcal N(r, r^2)\,
    \mathrm{rms}_i` and spread :math:`\sigma_i \sim U(0, 2r)\,\mathrm{rms}_i` (its detached
    rms over the batch), and every activation of every example its own draw from it:
    :math:`h_{ni} \to s_{ni} h_{ni} + \mu_i + \sigma_i z_{ni}`, :math:`s_{ni} \sim U(1 - r,
    1 + r)`, :math:`z_{ni} \sim \mathcal N(0, 1)`, ``r = size`` (a float, or a tensor that
    broadcasts against ``h``)."""
    r = size if isinstance(size, Tensor) else float(size)
    rms = h.detach().square().mean(batch_dim, keepdim=True).sqrt()  # per unit
    mean = r * (1 + torch.randn_like(rms)) * rms  # this update's mean, per unit
    spread = 2 * r * torch.rand_like(rms) * rms  # this update's spread, per unit
    scale = 1 + r * (2 * torch.rand_like(h) - 1)  # per example and unit
    return h * scale + mean + spread * torch.randn_like(h)


class ExampleNoise(SignalNoise):
    r"""Santurkar et al.'s (2018) injected noise, :func:`example_noise` (every activation of
    every example its own draw, non-zero mean, non-unit variance, the distribution drawn afresh
    at every forward), ``size`` = ``r`` in [0, 1). In evaluation mode it does nothing.

    Shape:
        - Input: ``(N, H)``; output: the same.
    """

    def forward(self, h: Tensor) -> Tensor:
        if not self.training or self.size == 0:
            return h
        return example_noise(h, self.size, batch_dim=0)


class _NoiseSeedMLP(SeedMLP):
    """:class:`SeedMLP` with a noise of its own per copy: ``sizes`` ``(S,)`` and ``example``
    ``(S,)`` (True: :func:`example_noise`, False: :class:`SignalNoise`'s shared draw), each
    over the copy's own batch."""

    def set_noise(self, sizes: Tensor, example: Tensor) -> _NoiseSeedMLP:
        self.sizes_r = sizes.reshape(-1, 1, 1).to(self.weights[0].dtype)
        self.example = example.reshape(-1, 1, 1).bool()
        return self

    def _noise(self, h: Tensor) -> Tensor:
        if not self.training:
            return h
        r = self.sizes_r
        rms = h.detach().square().mean(1, keepdim=True).sqrt()  # (S, 1, H)
        shared = h * (1 + r * (2 * torch.rand_like(rms) - 1)) + r * (
            1 + torch.randn_like(rms)) * rms  # SignalNoise, one draw per unit
        return torch.where(self.example, example_noise(h, r, batch_dim=1), shared)


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
            out = seed_nll(model(x), y).cpu().numpy()  # (S,)
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
                           momentum=config.momentum if momentum is None else momentum,
                           foreach=True)


def seed_model(variant: str, seeds: tuple[int, ...], config: Config) -> SeedMLP:
    """The :func:`build` networks of ``seeds`` (each made after ``torch.manual_seed(seed)``,
    as one seed alone would be made), stacked into one :class:`SeedMLP`."""
    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(build(variant, config))
    norm, _, noisy = variant.partition("+")
    return SeedMLP.from_models(models, (64, *[config.width] * config.depth, 10), norm,
                               noise=config.noise if noisy else 0.0)


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Every variant of ``config.variants`` with every seed, through
    :func:`lnbook.engine.runner.sweep` (the seeds of a variant trained as one model,
    :func:`train_variant`). Each run records ``test_nll`` at its evaluations (up to the last
    before it diverged, if it did) and, in ``info``, ``train_nll`` (``inf`` for a diverged run;
    :func:`final_nll` reads it), ``diverged``, ``diverged_at``, ``weight_norms`` (start, end;
    hidden layers) and ``unit_rates`` (:func:`unit_rates` on the test digits)."""
    check_config(config, Config)
    return sweep(NAME, {v: v for v in config.variants}, config.seeds,
                 partial(train_variant, config), config=config, stack="seeds",
                 device=device, out=out, steps=config.steps, threads=config.threads,
                 workers=config.workers, info={"data": "sklearn digits"})


def train_variant(config: Config, job: Job) -> list[tuple[History, dict[str, Any]]]:
    """One job of :func:`run`: the seeds of variant ``job.variant`` trained as one
    :func:`seed_model` by :func:`train_stack`; one ``(History, info)`` per seed."""
    seeds = job.seeds
    model = seed_model(job.variant, seeds, config)
    histories = [History() for _ in seeds]
    rec = train_stack(model, seeds, config, histories=histories, bar=job.bar,
                      label=job.label, device=job.device)
    _, _, xt, _ = digits_split()
    out = []
    for i, h in enumerate(histories):
        stop = rec["diverged_at"][i]
        if np.isfinite(stop):  # keep the evaluations made before the update that diverged
            keep = [k for k, step in enumerate(h.eval_steps) if step < stop]
            h.eval_steps = [h.eval_steps[k] for k in keep]
            h.metrics = [h.metrics[k] for k in keep]
            h.losses = [v if step < stop else math.nan
                        for step, v in zip(h.steps, h.losses, strict=True)]
        one = model.copy_to(build(job.variant, config), i).eval()
        out.append((h, {"train_nll": float(rec["train_nll"][i]),
                        "diverged": bool(np.isinf(rec["train_nll"][i])),
                        "diverged_at": float(stop),
                        "weight_norms": rec["weight_norms"][i].tolist(),
                        "unit_rates": unit_rates(one, xt).tolist()}))
    return out


def final_nll(results: Results, variant: str) -> tuple[np.ndarray, np.ndarray]:
    """``(test, train)``: per seed ``(S,)`` the last test NLL a run of :func:`run` recorded
    (before it diverged, if it did) and its final training NLL (``inf`` for a diverged run,
    also when read back from a file, where it is stored as null)."""
    train = [math.inf if v is None else v for v in results.info_of(variant, "train_nll")]
    return results.final(variant, "test_nll"), np.array(train, dtype=float)


def norm_growth_step(model: DeepMLP, x: Tensor, y: Tensor, lr: float,
                     layer: int = 1) -> dict[str, float]:
    r"""One plain SGD step on ``model`` (in place): for a scale-invariant :math:`W`,
    :math:`\lVert W - \eta g\rVert^2 = \lVert W\rVert^2 + \eta^2\lVert g\rVert^2`. Returns
    ``cos`` (of W and g), the squared norms ``before``, ``after`` and ``predicted``."""
    w = model.linears[layer].weight
    (g,) = torch.autograd.grad(F.cross_entropy(model(x), y), w)
    with torch.no_grad():
        before = float(w.square().sum())
        cos = float((w * g).sum() / (w.norm() * g.norm()))
        predicted = before + lr**2 * float(g.square().sum())
        w -= lr * g
        after = float(w.square().sum())
    return {"cos": cos, "before": before, "after": after, "predicted": predicted}


def lr_sweep(config: Config, lrs: tuple[float, ...], norms: tuple[str, ...] = ("none", "layer"),
             seeds: tuple[int, ...] | None = None) -> dict[tuple[str, float], list[dict]]:
    """``{(norm, lr): [record per seed]}``: plain SGD with step ``lr`` on the hidden weights,
    ``config.lr`` on the rest (Arora, Li and Lyu, 2019); a record holds ``train_nll`` (``inf``
    for a diverged seed) and ``weight_norms`` ``(2, depth)``, start and end
    (:func:`train_stack`)."""
    seeds = resolve_seeds(config.seeds if seeds is None else seeds)
    out = {}
    for n in norms:
        for lr in lrs:
            rec = train_stack(seed_model(n, seeds, config), seeds, config, momentum=0.0,
                              hidden_lr=lr)
            out[(n, lr)] = [{"train_nll": float(rec["train_nll"][i]),
                             "weight_norms": rec["weight_norms"][i]} for i in range(len(seeds))]
    return out


def _along(model: nn.Module, x: Tensor, y: Tensor, lr: float, multiples: tuple[float, ...]
           ) -> tuple[list, list]:
    """Losses and ``||g_k - g|| / (k lr ||g||)`` at ``w - k lr g`` for each ``k``, on a copy in
    training mode (per seed, ``(S,)`` tensors, for a :class:`SeedMLP`)."""
    model = copy.deepcopy(model).train()
    params = [p for p in model.parameters() if p.requires_grad]
    per_seed = isinstance(model, SeedMLP)

    def grad_at() -> tuple[Any, list[Tensor]]:
        loss = seed_nll(model(x), y) if per_seed else F.cross_entropy(model(x), y)  # (S,) or ()
        grads = list(torch.autograd.grad(loss.sum(), params))  # each seed's own gradient
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


def noise_model(norm: str, copies: list[tuple[str, float, int]], config: Config
                ) -> SeedMLP:
    """The :func:`seed_model` networks of ``norm`` (``none``, ``layer``, ``batch``), one per
    ``(kind, size, seed)`` of ``copies``, each with the noise ``kind`` (one of :data:`NOISES`)
    of ``size`` after every hidden norm. Copies that all share one kind and size of
    ``shared`` noise are a plain :class:`SeedMLP` with ``noise=size`` (the networks and the
    noise draws of :func:`run`)."""
    check_choice("norm", norm, ("none", "layer", "batch"))
    for kind, size, _ in copies:
        check_choice("kind", kind, NOISES)
        if not 0 <= size < 1:
            raise ValueError(f"size must lie in [0, 1), got {size!r}")
    models = []
    for _, _, s in copies:
        torch.manual_seed(s)
        models.append(build(norm, config))
    sizes = (64, *[config.width] * config.depth, 10)
    if len({(k, r) for k, r, _ in copies}) == 1 and copies[0][0] == "shared":
        return SeedMLP.from_models(models, sizes, norm, noise=copies[0][1])
    model = _NoiseSeedMLP.from_models(models, sizes, norm)
    return model.set_noise(torch.tensor([r for _, r, _ in copies]),
                           torch.tensor([k == "example" for k, _, _ in copies]))


def train_stack(model: SeedMLP, seeds: tuple[int, ...], config: Config, *,
                hidden_lr: float | None = None, momentum: float | None = None,
                weight_decay: float = 0.0, watch: bool = False,
                histories: list[History] | None = None, bar: Any = None,
                label: str | None = None, device: str | torch.device = "cpu"
                ) -> dict[str, np.ndarray]:
    """Train every seed of ``model`` (the seeds' own batches, SGD, the noise from the stream of
    ``seeds[0]``) through :func:`lnbook.engine.copies.train_copies`. ``weight_decay``: on the hidden
    weights only. A seed whose loss is not finite is left out of the sum from then on. Returns
    ``(S,)`` arrays ``train_nll`` and ``test_nll`` (``inf`` for a diverged seed),
    ``diverged_at`` (the first update with a non-finite loss, ``inf`` if none) and
    ``weight_norms`` ``(S, 2, depth)``, the hidden weights' norms at the start and the end
    (NaN for a diverged seed); with ``watch``, per update ``rms`` ``(S, steps, depth)``, every
    hidden layer's summed inputs' root mean square, and the hidden weights' ``norm`` ``(S,
    steps + 1, depth)`` and ``turn`` ``(S, steps, depth)``, the angle (radians) each update
    turns them by. ``histories`` (one per seed, filled in place): the losses, and the test NLL
    every ``config.eval_every`` updates and after the last; ``bar``, ``label``: the sweep's."""
    seeds = tuple(int(s) for s in seeds)
    dev = torch.device(device)
    x, y, xt, yt = (t.to(dev) for t in digits_split())
    model.to(dev)
    torch.manual_seed(seeds[0])
    hidden = model.hidden_weights
    opt = _sgd(model, hidden, config, None, momentum, hidden_lr)
    opt.param_groups[0]["weight_decay"] = float(weight_decay)
    batches = seed_batches(x, y, config.batch_size, seeds)
    stop = np.full(len(seeds), np.inf)
    rms: list[Tensor] = []
    norms = [torch.stack([w.detach().norm(dim=(1, 2)) for w in hidden], 1)]  # (S, L)
    start = torch.stack([w.detach().flatten(1).norm(dim=1) for w in hidden], 1)  # (S, L)
    turns: list[Tensor] = []
    last = [w.detach().clone() for w in hidden]
    steps, done = max_updates(config.steps), [0]

    def losses(step: int) -> Tensor:
        xb, yb = batches(step)
        logits, summed = model(xb, return_summed=True)
        loss = seed_nll(logits, yb)  # (S,)
        ok = torch.isfinite(loss.detach())
        stop[(~ok).cpu().numpy() & np.isinf(stop)] = step + 1
        if watch:
            rms.append(torch.stack([a.detach().square().mean((1, 2)).sqrt() for a in summed], 1))
        done[0] = step + 1
        return torch.where(ok, loss, torch.zeros_like(loss))

    def evaluate() -> list[dict[str, float]]:
        if watch and len(norms) <= len(rms):  # after an update: the weights' norm and turn
            now = [w.detach() for w in hidden]
            norms.append(torch.stack([w.norm(dim=(1, 2)) for w in now], 1))
            cos = torch.stack([(a * b).sum((1, 2)) / (a.norm(dim=(1, 2)) * b.norm(dim=(1, 2)))
                               for a, b in zip(now, last, strict=True)], 1)
            turns.append(torch.arccos(cos.clamp(-1, 1)))
            for a, b in zip(last, now, strict=True):
                a.copy_(b)
        if histories is None or (done[0] % config.eval_every and done[0] != steps):
            return [{} for _ in seeds]
        return [{"test_nll": float(v)} for v in _nll(model, xt, yt)]

    every = 1 if watch else (config.eval_every if histories is not None else config.steps)
    train_copies(losses, evaluate, opt, histories or [History() for _ in seeds], config.steps,
                 every, bar=bar, label=label)
    bad = np.isfinite(stop)
    end = torch.stack([w.detach().flatten(1).norm(dim=1) for w in hidden], 1)  # (S, L)
    out = {"train_nll": np.where(bad, np.inf, _nll(model, x, y)).astype(float),
           "test_nll": np.where(bad, np.inf, _nll(model, xt, yt)).astype(float),
           "diverged_at": stop,
           "weight_norms": torch.stack([start, end], 1).cpu().numpy()}
    for k in ("train_nll", "test_nll"):
        out[k][~np.isfinite(out[k])] = np.inf
    out["weight_norms"][~np.isfinite(out["train_nll"])] = np.nan
    if watch:
        out["rms"] = torch.stack(rms, 1).cpu().double().numpy()
        out["norm"] = torch.stack(norms, 1).cpu().double().numpy()
        out["turn"] = torch.stack(turns, 1).cpu().double().numpy()
    return out


def _split(record: dict[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    """A :func:`train_stack` record of ``k * n`` copies as ``k`` records of ``n``."""
    return [{key: v[i:i + n] for key, v in record.items()} for i in range(0, len(
        record["train_nll"]), n)]


def noise_runs(config: Config, size: float, kinds: tuple[str, ...] = NOISES,
               norms: tuple[str, ...] = ("none", "layer", "batch"),
               seeds: tuple[int, ...] | None = None) -> dict[str, dict[str, dict]]:
    """``{kind: {norm: train_stack record}}``: the chapter's networks trained with each
    noise of ``kinds`` at ``size`` (``seeds``: default ``config.seeds``); the kinds of one
    norm train together as one model."""
    seeds = resolve_seeds(config.seeds if seeds is None else seeds)
    copies = [(k, size, s) for k in kinds for s in seeds]
    out: dict[str, dict[str, dict]] = {k: {} for k in kinds}
    for n in norms:
        rec = train_stack(noise_model(n, copies, config), tuple(s for *_, s in copies),
                          config)
        for k, part in zip(kinds, _split(rec, len(seeds)), strict=True):
            out[k][n] = part
    return out


def blowup(config: Config, seeds: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
    """The plain network with :class:`SignalNoise` of ``config.noise`` (``none+noise`` of
    :func:`run`, the same updates) watched update by update: :func:`train_stack`'s record
    with ``rms``, every hidden layer's summed inputs, per update."""
    seeds = resolve_seeds(config.seeds if seeds is None else seeds)
    model = noise_model("none", [("shared", config.noise, s) for s in seeds], config)
    return train_stack(model, seeds, config, watch=True)


def decay_runs(config: Config, runs: tuple[tuple[float, float], ...],
               seeds: tuple[int, ...] | None = None) -> dict[tuple[float, float], dict]:
    """``{(lr, weight_decay): train_stack record with watch}``: the layer-normalized network,
    plain SGD (no momentum) with step ``lr`` and ``weight_decay`` on the hidden weights,
    ``config.lr`` and no decay on the rest."""
    seeds = resolve_seeds(config.seeds if seeds is None else seeds)
    return {(lr, wd): train_stack(seed_model("layer", seeds, config), seeds, config,
                                  hidden_lr=lr, momentum=0.0, weight_decay=wd, watch=True)
            for lr, wd in runs}


def decay_summary(record: dict[str, np.ndarray], lr: float, weight_decay: float,
                  last: int = 50) -> dict[str, np.ndarray]:
    r"""Per seed ``(S,)``, from a :func:`decay_runs` record (hidden layers averaged): the
    weights' norm at the start (``norm_start``) and the end (``norm_end``); its relative change
    over the first ``last`` updates (``change_first``) and between the mean over the ``last``
    updates and the mean over the ``last`` before them (``settle``); the mean turn per update
    over the first and the ``last`` updates (``turn_first``, ``turn_end``, radians);
    ``predicted``, the equilibrium turn :math:`\sqrt{2\eta\lambda}`; ``train_nll``."""
    check_size("last", last)
    norm = record["norm"].mean(2)  # (S, steps + 1)
    turn = record["turn"].mean(2)  # (S, steps)
    if 2 * last > turn.shape[1]:
        raise ValueError(f"last must be at most half the {turn.shape[1]} updates, got {last}")
    n = len(norm)
    recent = norm[:, -last:].mean(1)
    return {"norm_start": norm[:, 0], "norm_end": norm[:, -1],
            "change_first": norm[:, last] / norm[:, 0] - 1,
            "settle": recent / norm[:, -2 * last:-last].mean(1) - 1,
            "turn_first": turn[:, :last].mean(1), "turn_end": turn[:, -last:].mean(1),
            "predicted": np.full(n, math.sqrt(2 * lr * weight_decay)),
            "train_nll": record["train_nll"]}


def pilot_noise(config: Config, sizes: tuple[float, ...], seeds: tuple[int, ...]
                ) -> dict[tuple[str, float], dict[str, np.ndarray]]:
    """``{(kind, size): train_stack record}``: the plain network with each noise of
    :data:`NOISES` at each size, on ``seeds`` (the design runs: pilot seeds), all trained
    together as one model."""
    keys = [(k, r) for k in NOISES for r in sizes]
    copies = [(k, r, s) for k, r in keys for s in seeds]
    rec = train_stack(noise_model("none", copies, config), tuple(s for *_, s in copies),
                      config)
    return dict(zip(keys, _split(rec, len(seeds)), strict=True))


def largest_safe(pilot: dict[tuple[str, float], dict[str, np.ndarray]],
                 below: float = math.inf) -> float:
    """The largest size of ``pilot`` (:func:`pilot_noise`) at which, under every noise kind,
    no seed diverged and every seed's training NLL ended below ``below``; ``ValueError`` if
    there is none."""
    sizes = sorted({s for _, s in pilot})
    safe = [s for s in sizes
            if all(np.isinf(r["diverged_at"]).all() and (r["train_nll"] < below).all()
                   for (_, t), r in pilot.items() if t == s)]
    if not safe:
        raise ValueError(f"at every size of {sizes} some seed diverged or ended at or above "
                         f"{below}")
    return safe[-1]


def blowup_rows(noisy: dict[str, np.ndarray], clean: dict[str, np.ndarray],
                before: int = 30) -> list[list[Any]]:
    """One row per seed that diverged in ``noisy`` (:func:`blowup`): the seed's index, the
    update whose loss was not finite, and the root mean square of the first and the last hidden
    layer's summed inputs at the first update, ``before`` updates before it and one update
    before it; then the last layer's at those updates in ``clean`` (the same seeds, no
    noise)."""
    rows = []
    for i, at in enumerate(noisy["diverged_at"]):
        if not np.isfinite(at):
            continue
        at = int(at)  # update `at` is index at - 1 of the per-update records
        idx = [0, max(at - 1 - before, 0), at - 2]
        rows.append([i, at, *(float(noisy["rms"][i, j, 0]) for j in idx),
                     *(float(noisy["rms"][i, j, -1]) for j in idx),
                     *(float(clean["rms"][i, j, -1]) for j in idx)])
    return rows


EVIDENCE_KEYS = (
    "n", "majority", "shared_cost", "shared_blown", "ex_size", "ex_cost", "ex_blown",
    "ex_better", "cos_max", "identity_err", "growth_ordered", "none5_diverged",
    "ln5_diverged", "ln5_above_chance", "ln5_median", "ln5_worse", "settled", "turn_ratio",
    "decay_fail", "detach_worse_simple", "detach_worse_none", "beta_less", "x2_ratio",
    "bn_train_better", "bn_test_better")
"""The chapter's recorded numbers that :func:`evidence_rows` reads (counts are of seeds)."""


def _count(k: int, m: dict[str, Any]) -> str:
    return f"{k} of {m['n']} seeds"


def evidence_rows(m: dict[str, Any]) -> list[list[str]]:
    """The rows ``[statement, status, evidence]`` of chapter 6.8's table of known, contested
    and folklore statements, built from its measured values ``m`` (the keys of
    :data:`EVIDENCE_KEYS`): each statement says only what its run showed (a count reaches
    ``m["majority"]`` of ``m["n"]`` seeds or the row says less), and its evidence names the
    section and the table or figure with the numbers."""
    missing = [k for k in EVIDENCE_KEYS if k not in m]
    if missing:
        raise KeyError(f"evidence_rows needs the measured values {missing}")
    maj, c = m["majority"], (lambda k: _count(k, m))
    rows = []
    # section 2: scale invariance
    grows = m["growth_ordered"] >= maj
    rows.append([
        "a normalized layer's weights are orthogonal to their gradient, so plain SGD only "
        "lengthens them" + (", and a larger step lengthens them more" if grows else ""),
        "**known**" if m["identity_err"] < 1e-6 else "not shown here",
        f"section 2, table 6.8.5: |cos(W, g)| at most {m['cos_max']:.0e}, the identity to a "
        f"relative {m['identity_err']:.0e}; table 6.8.6: growth ordered by the step on "
        f"{c(m['growth_ordered'])}"])
    # section 2.1: length and direction, weight decay
    settle = m["settled"] >= maj and all(abs(r - 1) < 0.25 for r in m["turn_ratio"])
    rows.append([
        "with weight decay a normalized layer's length and direction part: the length settles "
        "where the gradient's growth balances the decay, and the direction then turns by "
        "about sqrt(2 lr wd) per update" if settle else
        "with weight decay the length of a normalized layer's weights settles (not seen in "
        "this run)",
        "**known**" if settle else "not shown here",
        f"section 2.1, table 6.8.7 and figure 6.8.1: the norm's mean moved by less than 10% "
        f"between the last two windows of 50 updates on {c(m['settled'])}; the turn was "
        + " and ".join(f"{r:.2f}" for r in m["turn_ratio"])
        + " times sqrt(2 lr wd) (median, two runs with the same product)"])
    # section 2: step sizes
    plain_blows = m["none5_diverged"] >= maj
    ln_survives = m["n"] - m["ln5_diverged"] >= maj
    ln_trains = m["n"] - m["ln5_above_chance"] >= maj
    if plain_blows and ln_survives and ln_trains:
        step = "normalization lets a network train at a step size where the plain one diverges"
    elif plain_blows and ln_survives:
        step = ("at a step size where the plain network diverges, the normalized one does not "
                "diverge, but it does not train there either")
    else:
        step = "normalization keeps a network from diverging at large steps (not seen here)"
    rows.append([
        step, "**known**" if plain_blows and ln_survives else "not shown here",
        f"section 2, table 6.8.6, step 5: the plain network diverged on "
        f"{c(m['none5_diverged'])}, layer norm on {m['ln5_diverged']}; layer norm ended at a "
        f"median {m['ln5_median']:.3f} nats, above chance (2.303) on "
        f"{c(m['ln5_above_chance'])}"])
    # section 3: the statistics' gradients
    hurts = m["detach_worse_simple"] >= maj
    rows.append([
        ("dropping the gradients through the mean and variance (the same forward pass, a biased "
         "pseudo-gradient) makes training worse"
         + (", worse than no normalization" if m["detach_worse_none"] >= maj else "")
         + "; this shows that they cannot be dropped, not that the projection is where "
         "normalization's benefit comes from") if hurts else
        "dropping the gradients through the mean and variance makes training worse (not seen "
        "here)",
        "**known**" if hurts else "not shown here",
        f"section 3, table 6.8.8: DetachNorm worse than LayerNorm-simple on "
        f"{c(m['detach_worse_simple'])}, worse than no norm on {m['detach_worse_none']}"])
    # section 1: covariate shift
    cost = ", ".join(f"{k} {v}" for k, v in m["ex_cost"].items())
    better = ", ".join(f"{k} {v}" for k, v in m["ex_better"].items())
    rows.append([
        "normalization works by reducing internal covariate shift", "**contested**",
        f"section 1, table 6.8.2: a batch-shared shift (r = 0.2) cost every network on at "
        f"least {c(min(m['shared_cost'].values()))}; table 6.8.3: the plain network diverged "
        f"on {m['shared_blown']}, blowing up in its deepest layer; table 6.8.4: Santurkar et "
        f"al.'s noise (r = {m['ex_size']}), the plain network diverged on {m['ex_blown']}; "
        f"worse than without noise: {cost}; better than the plain network with it: {better}"])
    # section 4: smoothness
    rows.append([
        "normalization makes the loss landscape smoother", "**contested**",
        "section 4, table 6.8.9: at initialization beta below the plain network's on "
        + ", ".join(f"{k} {v}" for k, v in m["beta_less"].items())
        + f" of {m['n']} seeds; doubling the weights divides beta by {m['x2_ratio']:.1f}"])
    # section 2 and 2.1: tuning
    untuned = m["ln5_worse"] >= maj or m["decay_fail"] >= maj
    rows.append([
        "with normalization the learning rate does not need tuning",
        "**folklore**, as stated" if untuned else "not contradicted here",
        f"section 2, table 6.8.6: the largest step worse than the smallest by more than 0.5 "
        f"nats on {c(m['ln5_worse'])}; section 2.1, table 6.8.7: with weight decay the turn "
        f"is set by lr x wd, and at lr wd = 0.1 the network ended near chance on "
        f"{c(m['decay_fail'])}"])
    # section 5: batch against layer
    rows.append([
        "batch norm helps mainly by the regularizing noise of its batch statistics",
        "**folklore** here" if m["bn_train_better"] >= maj else "not contradicted here",
        f"section 5, table 6.8.10: batch norm's training NLL below layer norm's on "
        f"{c(m['bn_train_better'])}"])
    rows.append([
        "layer norm is always at least as good as batch norm where both apply",
        "**folklore**" if m["bn_test_better"] >= maj else "not contradicted here",
        f"section 5, tables 6.8.1 and 6.8.10: batch norm's test NLL below layer norm's on "
        f"{c(m['bn_test_better'])}"])
    return rows
