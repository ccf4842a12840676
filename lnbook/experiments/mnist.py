"""Permutation-invariant MNIST with a 784-1000-1000-10 MLP (paper section 6.6, Figure 6).

Book chapter `06_6_mnist`. Three variants of the same fully connected ReLU network, trained with
Adam at two batch sizes (128 and 4):

- ``"none"``: no normalization;
- ``"batch"``: batch normalization (eq. 2) on the summed inputs of every layer, the logits
  included; for small batches the variance is the unbiased estimate (claim C18);
- ``"layer"``: layer normalization (eq. 3) on the summed inputs of the hidden layers only. The
  logits stay un-normalized: LN would make the output invariant to re-scaling the logits, but
  the scale of the logits is exactly the confidence of the softmax prediction.

The metrics follow Figure 6: the negative log likelihood on (a fixed subset of) the training set
and the error rate on the test set, against the number of updates. The ``paper`` preset uses
55,000 training images and the paper's layer sizes; the ``quick`` preset shrinks the layers and
the number of updates so that all variants, batch sizes and seeds run in seconds on a CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.data import load_mnist, pixel_permutation, warn_if_subset
from lnbook.experiments.protocol import (
    Job,
    Results,
    check_scale,
    classification_metrics,
    make_config,
    sweep,
)
from lnbook.norms import BatchNorm, LayerNorm
from lnbook.train import Batches, History, fit

__all__ = [
    "NAME",
    "DESCRIPTION",
    "NORMS",
    "Config",
    "get_config",
    "MLP",
    "curves",
    "mean_gap",
    "run",
    "variant_name",
]

NAME = "mnist"
DESCRIPTION = (
    "permutation-invariant MNIST, MLP 784-1000-1000-10 with no norm / batch norm / layer norm, "
    "Adam, batch sizes 128 and 4 (section 6.6, Figure 6)"
)
NORMS = ("none", "batch", "layer")


@dataclass
class Config:
    """Settings of the permutation-invariant MNIST experiment; :func:`get_config` gives presets.

    Attributes:
        scale: ``"quick"`` or ``"paper"``.
        hidden: sizes of the hidden layers (the paper: 1000, 1000).
        norms: variants to train, from :data:`NORMS`.
        batch_sizes: mini-batch sizes (the paper: 128 and 4).
        steps: Adam updates per run (the same for every batch size, as Figure 6's x-axis).
        eval_every: updates between evaluations.
        lr: Adam learning rate (the paper does not give it; Adam's default 1e-3).
        n_train: training images used (the paper: 55,000; None = all available).
        n_eval_train: training images on which the training NLL is measured.
        n_test: test images on which the error is measured (None = all).
        bn_unbiased_max_batch: BN uses the unbiased variance for batch sizes up to this.
        permute_pixels: shuffle the pixels with a fixed permutation (seed 0).
        seeds: seeds of the runs (initialization and batch order).
        source: MNIST source for :func:`lnbook.data.load_mnist`.
        checkpoint: write per-run checkpoints under ``out/`` and resume from them.
    """

    scale: str = "quick"
    hidden: tuple[int, ...] = (128, 128)
    norms: tuple[str, ...] = NORMS
    batch_sizes: tuple[int, ...] = (128, 4)
    steps: int = 200
    eval_every: int = 20
    lr: float = 1e-3
    n_train: int | None = None
    n_eval_train: int = 1000
    n_test: int | None = None
    bn_unbiased_max_batch: int = 16
    permute_pixels: bool = True
    seeds: tuple[int, ...] = (0, 1, 2)
    source: str = "auto"
    checkpoint: bool = False

    def __post_init__(self) -> None:
        check_scale(self.scale)
        bad = [n for n in self.norms if n not in NORMS]
        if bad:
            raise ValueError(f"norms must be drawn from {NORMS}, got {bad}")
        if any(b < 2 for b in self.batch_sizes):
            raise ValueError(
                f"batch sizes must be >= 2 (BN needs two examples), got {self.batch_sizes}"
            )
        if self.steps < 1 or self.eval_every < 1:
            raise ValueError("steps and eval_every must be >= 1")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        "hidden": (1000, 1000),
        "steps": 20_000,
        "eval_every": 500,
        "n_train": 55_000,
        "n_eval_train": 10_000,
        "n_test": None,
        "checkpoint": True,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


class MLP(nn.Module):
    """A ReLU MLP whose summed inputs go through a normalization before the nonlinearity.

    ``x -> [Linear -> norm -> ReLU] * len(hidden) -> Linear [-> BN]``: LN on the hidden layers
    only, BN on every layer including the logits (section 6.6).

    Args:
        sizes: layer widths, input first and classes last, e.g. ``(784, 1000, 1000, 10)``.
        norm: ``"none"``, ``"batch"`` or ``"layer"``.
        bn_unbiased: BN normalizes with the unbiased variance (for small batches, claim C18).

    Shape:
        - Input: ``(N, sizes[0])``; output: logits ``(N, sizes[-1])``.

    Example::

        >>> model = MLP((784, 100, 100, 10), norm="layer")
        >>> model(torch.rand(4, 784)).shape
        torch.Size([4, 10])
    """

    def __init__(self, sizes: tuple[int, ...], norm: str = "layer", bn_unbiased: bool = False):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        if len(sizes) < 2:
            raise ValueError(f"sizes needs an input and an output width, got {sizes}")
        self.norm = norm
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            last = i == len(sizes) - 2
            # a norm with a learned bias follows: the Linear's own bias would be redundant
            bias = norm == "none" or (last and norm == "layer")
            layers.append(nn.Linear(d_in, d_out, bias=bias))
            if norm == "batch":
                layers.append(BatchNorm(d_out, unbiased=bn_unbiased))
            elif norm == "layer" and not last:
                layers.append(LayerNorm(d_out))
            if not last:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)
        self.in_features = sizes[0]

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"MLP expects (N, {self.in_features}) inputs, got {tuple(x.shape)}")
        return self.net(x)  # (N, classes)


def variant_name(norm: str, batch_size: int) -> str:
    """The name of one (normalization, batch size) variant in the results, e.g. ``layer/bs4``."""
    return f"{norm}/bs{batch_size}"


def curves(
    results: Results, norm: str, batch_size: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """One metric of every seed of one variant: ``(eval_steps (E,), values (seeds, E))``."""
    return results.curves(variant_name(norm, batch_size), metric)


def mean_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean over evaluations (after step 0) of ``|a - b|``, per seed: ``(seeds, E) -> (seeds,)``."""
    return np.abs(a[:, 1:] - b[:, 1:]).mean(axis=1)


def _data(config: Config) -> dict[str, Any]:
    train = load_mnist(split="train", source=config.source)
    warn_if_subset(train, config.scale, "mnist")
    test = load_mnist(split="test", source=config.source)
    x, y = train.images, train.labels  # (N, 784), (N,)
    if config.n_train is not None:
        x, y = x[: config.n_train], y[: config.n_train]
    xt, yt = test.images, test.labels
    if config.n_test is not None:
        xt, yt = xt[: config.n_test], yt[: config.n_test]
    if config.permute_pixels:
        perm = pixel_permutation(0)
        x, xt = x[:, perm], xt[:, perm]
    return {"x": x, "y": y, "x_test": xt, "y_test": yt, "source": train.source}


def run(
    config: Config,
    device: str | torch.device = "auto",
    out: str | os.PathLike | None = None,
    seeds: tuple[int, ...] | list[int] | None = None,
) -> Results:
    """Train every (norm, batch size) variant with every seed; return the sweep's results.

    Variants are named ``"<norm>/bs<B>"`` (:func:`variant_name`); every run records, at each
    evaluation, ``train_nll`` and ``train_error`` (on ``n_eval_train`` training images) and
    ``test_nll`` and ``test_error``, in eval mode. ``Results.info["source"]`` names the data.
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a mnist.Config (get_config), got {type(config).__name__}")
    d = _data(config)
    x_eval, y_eval = d["x"][: config.n_eval_train], d["y"][: config.n_eval_train]
    sizes = (784, *config.hidden, 10)

    def eval_fn(model: nn.Module) -> dict[str, float]:
        tr = classification_metrics(model, x_eval, y_eval)
        te = classification_metrics(model, d["x_test"], d["y_test"])
        return {"train_nll": tr["nll"], "train_error": tr["error"],
                "test_nll": te["nll"], "test_error": te["error"]}

    def train_one(job: Job) -> History:
        norm, bs = job.params
        torch.manual_seed(job.seed)
        model = MLP(sizes, norm, bn_unbiased=bs <= config.bn_unbiased_max_batch)
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
        return fit(model, Batches(d["x"], d["y"], batch_size=bs, seed=job.seed), opt,
                   steps=config.steps, eval_every=config.eval_every, eval_fn=eval_fn,
                   device=job.device, seed=job.seed, checkpoint=job.checkpoint,
                   loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                   bar=job.bar, label=job.label)

    variants = {variant_name(n, bs): (n, bs) for bs in config.batch_sizes for n in config.norms}
    return sweep(NAME, variants, tuple(config.seeds if seeds is None else seeds), train_one,
                 config=config, device=device, out=out, checkpoint=config.checkpoint,
                 steps=config.steps, info={"source": d["source"]})
