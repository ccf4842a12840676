"""The sign of the first input: a tanh RNN with and without layer normalization, by sequence
length and batch size (chapter 7, `07_conclusion`, claim C22).

The target at every step is whether the first input was positive, so the read-out at the last
step must carry one bit through ``T`` steps. Every (variant, length, batch size) is one variant
of the engine's sweep; its seeds train as one :class:`~lnbook.engine.Stack` of
:class:`FirstSignRNN`, and the LN and the plain model of a seed share their initial weights and
their data.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_config, check_subset
from lnbook.engine import Job, Results, Stack, make_config, mean_after_start, sweep, train_copies
from lnbook.engine.config import RunConfig
from lnbook.engine.train import History

__all__ = ["NAME", "DESCRIPTION", "VARIANTS", "Config", "get_config", "first_sign_batch",
           "FirstSignRNN", "sensitivity_to_first", "setting_name", "run", "train", "Curves",
           "curves", "LEFT_ERROR", "c22_inputs"]

NAME = "first_sign"
DESCRIPTION = ("chapter 7: the sign of the first input, tanh RNN with and without LN, by "
               "sequence length and batch size")
VARIANTS = ("ln", "plain")
_EVAL_SEED = 20_000  # + length: the held-out sequences of a length, the same for every run


@dataclass
class Config(RunConfig):
    """Sizes of the first-sign experiment: every (``lengths``, ``batch_sizes``, ``variants``
    from :data:`VARIANTS`, seed) makes ``steps`` Adam updates at ``lr`` with ``hidden_size``
    units; the held-out error at the last step, on ``n_eval`` sequences, every
    ``eval_every`` updates (and :class:`~lnbook.engine.RunConfig`'s scale, seeds, threads,
    workers)."""

    lengths: tuple[int, ...] = (20, 60)  # the long length: chosen on pilot seeds (C22)
    batch_sizes: tuple[int, ...] = (4, 64)
    variants: tuple[str, ...] = VARIANTS
    hidden_size: int = 16
    steps: int = 150
    eval_every: int = 25
    lr: float = 1e-2
    n_eval: int = 256
    seeds: int | tuple[int, ...] = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        self.lengths, self.batch_sizes = tuple(self.lengths), tuple(self.batch_sizes)
        self.variants = tuple(self.variants)
        if not isinstance(self.seeds, int):
            self.seeds = tuple(self.seeds)
        check_subset("variants", self.variants, VARIANTS)
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths must be >= 1, got {self.lengths}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be >= 1, got {self.batch_sizes}")
        if self.eval_every < 1 or self.hidden_size < 1 or self.n_eval < 1 or not self.lr > 0:
            raise ValueError(f"eval_every, hidden_size and n_eval must be >= 1 and lr > 0, got "
                             f"{self.eval_every}, {self.hidden_size}, {self.n_eval}, {self.lr}")


# The paper runs no such task; "paper" keeps the grid and trains a wider RNN for longer.
_PRESETS: dict[str, dict[str, Any]] = {"quick": {}, "paper": {
    "threads": None, "hidden_size": 128, "steps": 5000, "eval_every": 250, "lr": 1e-3,
    "n_eval": 2048}}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def first_sign_batch(batch: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Inputs ``(length, batch, 1)`` ~ N(0, 1) and targets ``(length, batch)``: ``x_1 > 0``."""
    x = torch.randn(length, batch, 1, generator=generator)  # (T, B, 1)
    return x, (x[:1, :, 0] > 0).float().expand(length, -1)  # (T, B)


class FirstSignRNN(nn.Module):
    r"""A one-layer tanh RNN with one scalar input per step and a one-logit read-out.

    :math:`a_t = w^{ih} x_t + W^{hh} h_{t-1}` and :math:`h_t = \tanh(\mathrm{LN}(a_t; g) + b)`
    with layer normalization (paper eq. 4, over the H summed inputs of each example), or
    :math:`h_t = \tanh(a_t + b)` without; the logit is :math:`w^{out} \cdot h_t + c`. The
    weights are drawn uniform in +-1/sqrt(H) (as torch's RNN and Linear) from a generator
    seeded with ``seed``, in the same order for both variants, so that the LN and the plain
    model of one seed start from the same weights; the gain starts at 1.

    Shape:
        x: ``(T, B)``, one scalar input per step; output: logits ``(T, B)``.

    Example::

        >>> FirstSignRNN(True, hidden=8, seed=0)(torch.randn(5, 4)).shape
        torch.Size([5, 4])
    """

    def __init__(self, layer_norm: bool, hidden: int, seed: int = 0, eps: float = 1e-5) -> None:
        super().__init__()
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.layer_norm, self.hidden, self.eps = bool(layer_norm), hidden, eps
        g, k = torch.Generator().manual_seed(int(seed)), 1 / math.sqrt(hidden)

        def draw(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.rand(shape, generator=g) * 2 * k - k)

        self.w_ih, self.w_hh, self.bias = draw(hidden), draw(hidden, hidden), draw(hidden)
        self.w_out, self.b_out = draw(hidden), draw()
        if self.layer_norm:
            self.gain = nn.Parameter(torch.ones(hidden))

    def forward(self, x: Tensor) -> Tensor:
        xw = x.unsqueeze(-1) * self.w_ih  # (T, B, H) the input terms, all steps
        h, out = x.new_zeros(x.shape[1], self.hidden), []  # (B, H)
        for xw_t in xw.unbind(0):  # (B, H)
            a = torch.addmm(xw_t, h, self.w_hh.T)  # (B, H) a_t
            if self.layer_norm:
                a = F.layer_norm(a, (self.hidden,), eps=self.eps) * self.gain  # LN(a_t; g)
            h = torch.tanh(a + self.bias)
            out.append(h)
        return (torch.stack(out) * self.w_out).sum(-1) + self.b_out  # (T, B)

    def extra_repr(self) -> str:
        return f"layer_norm={self.layer_norm}, hidden={self.hidden}"


def sensitivity_to_first(layer_norm: bool, seeds: tuple[int, ...] | list[int], hidden: int,
                         x: Tensor, scale_hh: float = 1.0) -> np.ndarray:
    """Mean ``abs(d z_T / d x_1)`` at initialization of the :class:`FirstSignRNN` of each seed
    (its ``W_hh`` times ``scale_hh``) on its own sequences ``x[:, k]``: ``x (T, seeds, B)``
    -> ``(seeds,)``."""
    out = []
    for k, seed in enumerate(seeds):
        model = FirstSignRNN(layer_norm, hidden, seed)
        with torch.no_grad():
            model.w_hh.mul_(scale_hh)
        xk = x[:, k].detach().clone().requires_grad_(True)  # (T, B)
        (grad,) = torch.autograd.grad(model(xk)[-1].sum(), xk)
        out.append(grad[0].abs().mean().item())
    return np.array(out, dtype=np.float32)


def setting_name(variant: str, length: int, batch_size: int) -> str:
    """The sweep variant of one setting, e.g. ``ln/len100/bs4``."""
    return f"{variant}/len{length}/bs{batch_size}"


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every (variant, length, batch size, seed) of ``config`` through the engine's
    sweep: the seeds of one setting as one job (:func:`train`); evaluations record the
    held-out ``error`` at the last step. With ``out``, also writes the results under it."""
    check_config(config, Config)
    variants = {setting_name(v, n, b): (v, n, b) for n, b in
                itertools.product(config.lengths, config.batch_sizes) for v in config.variants}
    return sweep(NAME, variants, config.seeds, partial(train, config), config=config,
                 stack="seeds", device=device, out=out, steps=config.steps,
                 threads=config.threads, workers=config.workers)


@dataclass
class Curves:
    """The learning curves of a :func:`run`: ``error[(variant, length, batch)]`` is
    ``(seeds, E)``, the held-out error at the last step at the updates ``steps`` ``(E,)``."""

    lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: np.ndarray
    error: dict[tuple[str, int, int], np.ndarray]

    def curves(self, variant: str, length: int, batch: int) -> np.ndarray:
        """The ``(seeds, E)`` error curves of one setting."""
        return self.error[(variant, length, batch)]


def curves(results: Results) -> Curves:
    """The :class:`Curves` of the results of :func:`run` (read back from a file as well)."""
    c = results.config
    lengths, batch_sizes = tuple(c["lengths"]), tuple(c["batch_sizes"])
    error, steps = {}, None
    for v, n, b in itertools.product(c["variants"], lengths, batch_sizes):
        steps, e = results.curves(setting_name(v, n, b), "error")  # (E,), (seeds, E)
        error[(v, n, b)] = np.asarray(e, dtype=np.float32)
    return Curves(lengths, batch_sizes, tuple(results.seeds), np.asarray(steps), error)


#: C22's trivial-phase bar: a layer-normalized arm has left chance (0.5) when its final
#: held-out error is at most this.
LEFT_ERROR = 0.25


def c22_inputs(results: Curves) -> dict[str, dict[str, Any]]:
    """C22's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, from
    :func:`curves` of a :func:`run` with two lengths (short, long) and two batch sizes (small,
    big).

    Per seed, the gain ``d`` of a setting is the plain RNN's error averaged over the
    evaluations after the start (:func:`lnbook.engine.metrics.mean_after_start`) minus the LN-RNN's.
    The parts: ``d`` at the long length and the small batch; ``d`` long minus short at each
    batch size; ``d`` small minus big at each length. A seed counts for a part where the
    LN-RNN's final error is at most :data:`LEFT_ERROR` in every setting the part reads."""
    (short, long), (small, big) = results.lengths, results.batch_sizes
    d = {(n, b): mean_after_start(results.curves("plain", n, b))
         - mean_after_start(results.curves("ln", n, b))
         for n in (short, long) for b in (small, big)}  # (seeds,) each
    parts = {f"LN helps (length {long}, batch {small})": ((long, small),)}
    parts.update({f"longer sequences, larger gain (batch {b})": ((long, b), (short, b))
                  for b in (small, big)})
    parts.update({f"smaller batches, larger gain (length {n})": ((n, small), (n, big))
                  for n in (short, long)})
    left = {k: results.curves("ln", *k)[:, -1] <= LEFT_ERROR for k in d}  # (seeds,) bools
    return {"values": {p: d[k[0]] - (d[k[1]] if len(k) > 1 else 0) for p, k in parts.items()},
            "trivial_ok": {p: np.all([left[k] for k in ks], axis=0)
                           for p, ks in parts.items()}}


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(model(x), y)


def train(c: Config, job: Job) -> list[History]:
    """The job of one (variant, length, batch size) of :func:`run`: its seeds as one
    :class:`~lnbook.engine.Stack` trained by :func:`~lnbook.engine.copies.train_copies` with
    Adam; one history per seed."""
    (variant, length, bs), seeds = job.params, job.seeds
    stack = Stack([FirstSignRNN(variant == "ln", c.hidden_size, s) for s in seeds]).to(job.device)
    opt = torch.optim.Adam(stack.parameters(), lr=c.lr, foreach=True)
    gens = [torch.Generator().manual_seed(s * 1_000_003 + 1_000 * length + bs) for s in seeds]
    x_eval, y_eval = first_sign_batch(c.n_eval, length,
                                      torch.Generator().manual_seed(_EVAL_SEED + length))
    x_eval, y_last = x_eval[..., 0].to(job.device), y_eval[-1].to(job.device)  # (T, N), (N,)

    def losses(step: int) -> Tensor:  # (M,): each copy's mean loss on its seed's batch
        xy = [first_sign_batch(bs, length, g) for g in gens]  # one data stream per seed
        x = torch.stack([x[..., 0] for x, _ in xy]).to(job.device)  # (M, T, B)
        return stack.call(_loss, x, torch.stack([y for _, y in xy]).to(job.device))

    def evaluate() -> list[dict[str, float]]:
        with torch.no_grad():
            wrong = (stack(x_eval, shared=(0,))[:, -1] > 0).float() != y_last  # (M, N)
        return [{"error": e} for e in wrong.float().mean(-1).tolist()]

    return train_copies(losses, evaluate, opt, [History() for _ in seeds], c.steps,
                        c.eval_every, state=stack, generators=gens, checkpoint=job.checkpoint,
                        bar=job.bar, label=job.label)
