"""Batch, layer, instance and group norm as one family; batch norm at tiny batches (Wu, He 2018).

Part II, chapter `10_group_norm` (claims P06 and P07): :func:`statistics_set` and :func:`run`
(:class:`ConvNet` with :class:`GhostBatchNorm` or group norm on the 8x8 digits).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_choice, check_config, check_size
from lnbook.data import load_digits_tensor
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.job import Job
from lnbook.engine.metrics import classification_metrics
from lnbook.engine.results import Results
from lnbook.engine.runner import sweep
from lnbook.engine.train import Batches, History, fit
from lnbook.variants import GroupNorm, group_norm

__all__ = ["NAME", "DESCRIPTION", "NORMS", "Config", "get_config", "GhostBatchNorm", "ConvNet",
           "normalize", "statistics_set", "variant_name", "run", "train_one", "TRIVIAL_MARGIN",
           "p07_left", "p07_inputs"]

NAME = "group_norm"
DESCRIPTION = ("small ConvNet on the 8x8 digits: batch norm with statistics over 2 to 32 "
               "examples against group, layer and instance norm, at a fixed optimizer batch (Wu "
               "and He 2018)")
NORMS = ("batch", "group", "layer", "instance")


@dataclass
class Config(RunConfig):
    """Settings of the group-norm experiment; :func:`get_config` gives the presets.

    Attributes:
        norms: from :data:`NORMS`, with ``"batch"``.
        bn_batches: examples per batch-norm statistic, each dividing ``batch_size``, the
            examples per update. channels, groups: of the two conv layers and of group norm.
        steps, eval_every, lr: Adam updates, updates between evaluations, rate.
        scale, seeds, threads, workers: :class:`~lnbook.engine.RunConfig`'s.
    """

    norms: tuple[str, ...] = ("batch", "group")
    bn_batches: tuple[int, ...] = (2, 8, 32)
    batch_size: int = 32
    channels: int = 16
    groups: int = 4
    steps: int = 60
    eval_every: int = 30
    lr: float = 3e-3
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if "batch" not in self.norms or not set(self.norms) <= set(NORMS):
            raise ValueError(f"norms must include 'batch' and be drawn from {NORMS}, got "
                             f"{self.norms}")
        if any(b < 2 or self.batch_size % b for b in self.bn_batches):
            raise ValueError(f"every bn_batch must be >= 2 and divide batch_size="
                             f"{self.batch_size}, got {self.bn_batches}")
        if self.channels % self.groups:
            raise ValueError(f"groups={self.groups} must divide channels={self.channels}")
        check_size("eval_every", self.eval_every)


_PRESETS: dict[str, dict[str, Any]] = {"quick": {}, "paper": {
    "threads": None, "norms": NORMS, "bn_batches": (2, 4, 8, 16, 32), "channels": 64, "groups": 32,
    "steps": 2000, "eval_every": 100, "lr": 1e-3}}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset (all four norms, Wu and He's sizes), with ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


class GhostBatchNorm(nn.Module):
    """Batch normalization whose statistics come from groups of ``batch_size`` examples.

    In training each of the ``N / batch_size`` consecutive groups is normalized with its own
    per-channel mean and biased variance over ``(batch_size, H, W)`` (Wu and He's BN per GPU); the
    running averages serve in evaluation. With ``batch_size = N``: :class:`torch.nn.BatchNorm2d`.

    Example::

        >>> bn = GhostBatchNorm(8, batch_size=2)
        >>> y = bn(torch.randn(6, 8, 4, 4))  # three groups of two examples
    """

    def __init__(self, num_features: int, batch_size: int, eps: float = 1e-5,
                 momentum: float = 0.1) -> None:
        super().__init__()
        if not (isinstance(batch_size, int) and batch_size >= 2):
            raise ValueError(f"batch_size must be an int >= 2, got {batch_size!r}")
        self.num_features, self.batch_size = int(num_features), batch_size
        self.eps, self.momentum = float(eps), float(momentum)
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def reset_parameters(self) -> None:
        """Gain 1, bias 0, running mean 0 and running variance 1."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        self.running_mean.zero_()
        self.running_var.fill_(1.0)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.num_features:
            raise ValueError(f"expected input (N, {self.num_features}, H, W), got "
                             f"{tuple(x.shape)}")
        n, c, h, w = x.shape
        view = (1, c, 1, 1)
        if not self.training:
            xc = x[None] - self.running_mean.view(1, *view)  # (1, N, C, H, W)
            var = self.running_var.view(1, *view)  # (1, 1, C, 1, 1)
        else:
            if n % self.batch_size:
                raise ValueError(f"the batch of {n} examples does not split into groups of "
                                 f"batch_size={self.batch_size}")
            xg = x.view(n // self.batch_size, self.batch_size, c, h, w)  # (K, b, C, H, W)
            mu = xg.mean(dim=(1, 3, 4), keepdim=True)  # (K, 1, C, 1, 1)
            xc = xg - mu  # (K, b, C, H, W)
            var = xc.square().mean(dim=(1, 3, 4), keepdim=True)  # (K, 1, C, 1, 1) biased
            with torch.no_grad():
                m = self.batch_size * h * w  # values behind each statistic
                self.running_mean.lerp_(mu.mean(dim=0).flatten(), self.momentum)
                unbiased = var.mean(dim=0).flatten() * m / (m - 1)  # (C,)
                self.running_var.lerp_(unbiased, self.momentum)
        y = (xc * torch.rsqrt(var + self.eps)).view(n, c, h, w)  # (N, C, H, W)
        return y * self.weight.view(view) + self.bias.view(view)

    def extra_repr(self) -> str:
        return f"{self.num_features}, batch_size={self.batch_size}, eps={self.eps}"


def _norm(norm: str, channels: int, groups: int, bn_batch: int) -> nn.Module:
    if norm == "batch":
        return GhostBatchNorm(channels, bn_batch)
    return GroupNorm({"group": groups, "layer": 1, "instance": channels}[norm], channels)


class ConvNet(nn.Module):
    """``[conv3x3 -> norm -> ReLU -> maxpool 2] * 2 -> Linear``, ``(N, 1, 8, 8)`` to ``(N, 10)``.

    Bias-free convolutions; layer norm is group norm with 1 group, instance norm with ``C``; batch
    norm is :class:`GhostBatchNorm` over ``bn_batch`` examples.
    """

    def __init__(self, norm: str, channels: int = 16, groups: int = 4, bn_batch: int = 32):
        super().__init__()
        check_choice("norm", norm, NORMS)
        if channels % groups:
            raise ValueError(f"groups={groups} must divide channels={channels}")
        self.norm = norm
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1, bias=False)
        self.norm1 = _norm(norm, channels, groups, bn_batch)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = _norm(norm, channels, groups, bn_batch)
        self.head = nn.Linear(channels * 2 * 2, 10)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1:] != (1, 8, 8):
            raise ValueError(f"ConvNet expects (N, 1, 8, 8) images, got {tuple(x.shape)}")
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)  # (N, C, 4, 4)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)  # (N, C, 2, 2)
        return self.head(x.flatten(1))  # (N, 10)


def normalize(kind: str, x: Tensor, groups: int = 2, eps: float = 1e-5) -> Tensor:
    """Normalize ``x`` ``(N, C, H, W)`` the way ``kind`` does, without gain and bias:
    ``"batch"`` over ``(N, H, W)``, ``"layer"`` over ``(C, H, W)``, ``"instance"`` over
    ``(H, W)``, ``"group"`` over a group of channels and ``(H, W)``.
    """
    if x.dim() != 4:
        raise ValueError(f"x must be (N, C, H, W), got {tuple(x.shape)}")
    if kind == "batch":
        mu = x.mean(dim=(0, 2, 3), keepdim=True)  # (1, C, 1, 1)
        var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)  # (1, C, 1, 1)
        return (x - mu) * torch.rsqrt(var + eps)
    check_choice("kind", kind, NORMS)
    return group_norm(x, {"group": groups, "layer": 1, "instance": x.shape[1]}[kind], eps=eps)


def statistics_set(kind: str, shape: tuple[int, int, int, int], index: tuple[int, ...],
                   groups: int = 2) -> Tensor:
    """Which inputs the normalized output at ``index`` depends on (nonzero gradient of
    :func:`normalize` on random float64 inputs): a boolean tensor of ``shape``.

    Example::

        >>> int(statistics_set("instance", (2, 3, 2, 2), (0, 1, 0, 0)).sum())
        4
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    y = normalize(kind, x, groups=groups)
    (grad,) = torch.autograd.grad(y[index], x)
    return grad != 0


def variant_name(norm: str, bn_batch: int | None = None) -> str:
    """``"batch/bs2"`` for batch norm with statistics over 2 examples; ``"group"`` etc."""
    return f"batch/bs{bn_batch}" if norm == "batch" else norm


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train batch norm at every ``bn_batches`` size and the other norms once, per seed.

    Runs record ``test_error`` and ``test_nll`` on the 359 test digits; ``Results.info`` holds
    ``majority_error`` (always answering the most frequent training digit).
    """
    check_config(config, Config)
    x, y = load_digits_tensor("train")  # (1438, 1, 8, 8), (1438,)
    xt, yt = load_digits_tensor("test")  # (359, 1, 8, 8), (359,)
    majority_error = float((yt != torch.bincount(y).argmax()).float().mean())
    variants: dict[str, tuple[str, int]] = {
        variant_name("batch", b): ("batch", b) for b in config.bn_batches}
    variants |= {variant_name(n): (n, config.batch_size) for n in config.norms if n != "batch"}
    return sweep(NAME, variants, config.seeds, partial(train_one, config, (x, y, xt, yt)),
                 config=config, device=device, out=out, steps=config.steps,
                 threads=config.threads, workers=config.workers,
                 info={"majority_error": majority_error, "n_train": len(y), "n_test": len(yt)})


def train_one(config: Config, data: tuple[Tensor, ...], job: Job) -> History:
    """One run: the ConvNet of ``job.params`` (norm, examples per batch-norm statistic) trained
    on ``data`` (``x, y, x_test, y_test``) with seed ``job.seed``, evaluated on the test set."""
    x, y, xt, yt = data
    norm, bn_batch = job.params
    torch.manual_seed(job.seed)
    model = ConvNet(norm, config.channels, config.groups, bn_batch)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)

    def eval_fn(model: nn.Module) -> dict[str, float]:
        m = classification_metrics(model, xt, yt)
        return {"test_nll": m["nll"], "test_error": m["error"]}

    return fit(model, Batches(x, y, batch_size=config.batch_size, seed=job.seed), opt,
               steps=config.steps, eval_every=config.eval_every, eval_fn=eval_fn,
               device=job.device, seed=job.seed,
               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]), bar=job.bar,
               label=job.label)


#: P07's trivial-phase bar: a seed counts when every one of its runs ends with a test error at
#: least this much below the majority class's.
TRIVIAL_MARGIN = 0.5


def p07_left(results: Results) -> np.ndarray:
    """Per seed, whether every run of :func:`run` ended :data:`TRIVIAL_MARGIN` below the
    majority class's test error: ``(seeds,)`` bools."""
    bar = results.info["majority_error"] - TRIVIAL_MARGIN
    return np.all([results.final(v, "test_error") <= bar for v in results.variants], axis=0)


def p07_inputs(results: Results, batch_independence: float) -> dict[str, dict[str, Any]]:
    """P07's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`:
    ``batch_independence`` (one measurement: group norm's largest output change over sets of
    batch-mates); per seed, batch norm's final test error with statistics over the fewest
    examples minus over the most ("BN falls at small batches"), and group norm's minus batch
    norm's over the fewest ("GN beats BN at batch 2"), counted where :func:`p07_left`."""
    sizes = sorted(int(v.split("/bs")[1]) for v in results.variants if v.startswith("batch/"))
    bn = {b: results.final(variant_name("batch", b), "test_error") for b in sizes}
    left = p07_left(results)
    return {"values": {"batch independence": [batch_independence],
                       "BN falls at small batches": bn[sizes[0]] - bn[sizes[-1]],
                       "GN beats BN at batch 2": results.final("group", "test_error")
                       - bn[sizes[0]]},
            "trivial_ok": {"BN falls at small batches": left, "GN beats BN at batch 2": left}}
