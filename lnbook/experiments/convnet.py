"""A small ConvNet on MNIST with no norm, batch norm, layer norm (two readings) and group norm.

Paper section 6.7; book chapter `06_7_convnets`. The paper reports, without numbers, that layer
normalization speeds up a ConvNet over no normalization but that batch normalization does
better, and blames the hidden units whose receptive fields lie near the image boundary: they are
rarely on and their statistics differ from those of the other units of the layer (claim C19).
The paper does not say over which axes LN runs in a convolutional layer, so both readings are
here, for summed inputs ``a`` of shape ``(N, C, H, W)``:

- ``"layer_chw"``: one mean and variance per example over all ``C * H * W`` units of the layer
  (eq. 3 read literally: every hidden unit of the layer), gain and bias per unit
  (:class:`lnbook.LayerNorm` with ``normalized_shape=(C, H, W)``);
- ``"layer_c"``: one mean and variance per example *and position* over the ``C`` channels
  (:class:`lnbook.norms.ChannelLayerNorm`), gain and bias per channel, as later ConvNets do;

plus ``"batch"`` (:class:`lnbook.BatchNorm`, per channel over ``N, H, W``) and ``"group"``
(:class:`torch.nn.GroupNorm`, Wu and He 2018: per example over groups of channels and all
positions, the later remedy).

The network is ``[conv3x3 -> norm -> ReLU -> maxpool2] * 2 -> Linear``. Neither preset comes from
the paper, which gives no architecture; ``paper`` only makes the network and the run larger.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.data import load_mnist, warn_if_subset
from lnbook.experiments.protocol import (
    Job,
    Results,
    check_scale,
    classification_metrics,
    make_config,
    sweep,
)
from lnbook.norms import BatchNorm, ChannelLayerNorm, LayerNorm
from lnbook.train import Batches, History, fit

__all__ = [
    "NAME",
    "DESCRIPTION",
    "NORMS",
    "Config",
    "get_config",
    "ConvNet",
    "boundary_mask",
    "activation_maps",
    "maps_of",
    "run",
]

NAME = "convnet"
DESCRIPTION = (
    "small ConvNet on MNIST: none / batch norm / layer norm over (C,H,W) and over C per position "
    "/ group norm, plus activation statistics near the image boundary (section 6.7)"
)
NORMS = ("none", "batch", "layer_chw", "layer_c", "group")
IMAGE_SIZE = 28


def _norm_layer(norm: str, channels: int, size: int, groups: int) -> nn.Module:
    if norm == "batch":
        return BatchNorm(channels)
    if norm == "layer_chw":
        return LayerNorm((channels, size, size))
    if norm == "layer_c":
        return ChannelLayerNorm(channels)
    if norm == "group":
        return nn.GroupNorm(groups, channels)
    return nn.Identity()


class ConvNet(nn.Module):
    """``[conv3x3 (padding 1) -> norm -> ReLU -> maxpool 2] * len(channels) -> Linear``.

    Args:
        channels: output channels of each conv layer, e.g. ``(8, 16)``.
        norm: one of :data:`NORMS`.
        groups: number of groups for ``norm="group"`` (must divide every channel count).
        classes: number of outputs.

    Shape:
        - Input: ``(N, 784)`` or ``(N, 1, 28, 28)``; output: logits ``(N, classes)``.

    Example::

        >>> net = ConvNet((8, 16), norm="layer_c")
        >>> net(torch.rand(2, 784)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self, channels: tuple[int, ...] = (8, 16), norm: str = "none", groups: int = 4,
        classes: int = 10,
    ) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        if norm == "group" and any(c % groups for c in channels):
            raise ValueError(f"groups={groups} must divide every channel count {channels}")
        self.norm = norm
        self.convs, self.norms = nn.ModuleList(), nn.ModuleList()
        c_in, size = 1, IMAGE_SIZE
        for c in channels:
            self.convs.append(nn.Conv2d(c_in, c, 3, padding=1, bias=(norm == "none")))
            self.norms.append(_norm_layer(norm, c, size, groups))
            c_in, size = c, size // 2
        self.head = nn.Linear(c_in * size * size, classes)

    def forward(
        self, x: Tensor, return_summed: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits; with ``return_summed`` also the summed inputs of each conv layer."""
        if x.dim() == 2 and x.shape[1] == IMAGE_SIZE * IMAGE_SIZE:
            x = x.view(-1, 1, IMAGE_SIZE, IMAGE_SIZE)  # (N, 1, 28, 28)
        if x.dim() != 4 or x.shape[1:] != (1, IMAGE_SIZE, IMAGE_SIZE):
            raise ValueError(f"ConvNet expects (N, 784) or (N, 1, 28, 28), got {tuple(x.shape)}")
        summed = []
        for conv, norm in zip(self.convs, self.norms, strict=True):
            a = conv(x)  # (N, C, S, S): summed inputs
            summed.append(a)
            x = F.max_pool2d(F.relu(norm(a)), 2)  # (N, C, S/2, S/2)
        logits = self.head(x.flatten(1))  # (N, classes)
        return (logits, summed) if return_summed else logits


def boundary_mask(size: int = IMAGE_SIZE, width: int = 4) -> Tensor:
    """``(size, size)`` booleans, True on the ring of ``width`` positions along the edges."""
    if not 0 < 2 * width < size:
        raise ValueError(f"width must be in [1, {(size - 1) // 2}] for size {size}, got {width}")
    m = torch.ones(size, size, dtype=torch.bool)
    m[width:-width, width:-width] = False
    return m


def activation_maps(model: ConvNet, x: Tensor, layer: int = 0) -> dict[str, Tensor]:
    """Per-position statistics of one conv layer's units over the examples ``x``.

    Returns ``(S, S)`` maps, each averaged over the channels: ``on`` = fraction of examples for
    which a unit's output after norm and ReLU is > 0; ``mean`` and ``std`` = mean and standard
    deviation over examples of the unit's summed input (before the norm).
    """
    model.eval()
    with torch.no_grad():
        _, summed = model(x, return_summed=True)
        a = summed[layer]  # (N, C, S, S)
        on = (F.relu(model.norms[layer](a)) > 0).float()  # (N, C, S, S)
    return {
        "on": on.mean(dim=(0, 1)),
        "mean": a.mean(dim=0).mean(dim=0),
        "std": a.std(dim=0).mean(dim=0),
    }


@dataclass
class Config:
    """Settings of the ConvNet experiment; :func:`get_config` gives the presets.

    Attributes:
        scale: ``"quick"`` or ``"paper"``.
        channels: conv layer widths.
        norms: variants, from :data:`NORMS`.
        groups: groups for GroupNorm.
        batch_size: mini-batch size.
        steps: Adam updates per run.
        eval_every: updates between evaluations.
        lr: Adam learning rate.
        n_train, n_eval_train, n_test: images for training, for the training NLL, for the test
            error (None = all).
        n_maps: training images over which the activation maps are taken.
        boundary_width: width of the ring of positions counted as "near the boundary".
        seeds: seeds of the runs.
        source: MNIST source for :func:`lnbook.data.load_mnist`.
        checkpoint: write per-run checkpoints under ``out/`` and resume from them.
    """

    scale: str = "quick"
    channels: tuple[int, ...] = (8, 16)
    norms: tuple[str, ...] = NORMS
    groups: int = 4
    batch_size: int = 32
    steps: int = 120
    eval_every: int = 40
    lr: float = 1e-3
    n_train: int | None = None
    n_eval_train: int = 300
    n_test: int | None = 500
    n_maps: int = 500
    boundary_width: int = 4
    seeds: tuple[int, ...] = (0, 1, 2)
    source: str = "auto"
    checkpoint: bool = False

    def __post_init__(self) -> None:
        check_scale(self.scale)
        bad = [n for n in self.norms if n not in NORMS]
        if bad:
            raise ValueError(f"norms must be drawn from {NORMS}, got {bad}")
        if self.batch_size < 2 or self.steps < 1 or self.eval_every < 1:
            raise ValueError("batch_size must be >= 2, steps and eval_every >= 1")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        "channels": (32, 64),
        "groups": 8,
        "batch_size": 128,
        "steps": 10_000,
        "eval_every": 500,
        "n_train": 55_000,
        "n_eval_train": 10_000,
        "n_test": None,
        "n_maps": 10_000,
        "checkpoint": True,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def run(
    config: Config,
    device: str | torch.device = "auto",
    out: str | os.PathLike | None = None,
    seeds: tuple[int, ...] | list[int] | None = None,
) -> Results:
    """Train every normalization variant with every seed; return the sweep's results.

    Variants are the names in ``config.norms``. Every run records ``train_nll``,
    ``train_error``, ``test_nll`` and ``test_error`` at each evaluation, and in its ``info``
    the first conv layer's activation ``maps`` ``{"on", "mean", "std"}`` ((28, 28) lists).
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a convnet.Config, got {type(config).__name__}")
    train = load_mnist(split="train", source=config.source)
    warn_if_subset(train, config.scale, "convnet")
    test = load_mnist(split="test", source=config.source)
    x, y = train.images[: config.n_train], train.labels[: config.n_train]  # (N, 784), (N,)
    xt, yt = test.images[: config.n_test], test.labels[: config.n_test]
    x_eval, y_eval = x[: config.n_eval_train], y[: config.n_eval_train]

    def eval_fn(model: nn.Module) -> dict[str, float]:
        tr = classification_metrics(model, x_eval, y_eval)
        te = classification_metrics(model, xt, yt)
        return {"train_nll": tr["nll"], "train_error": tr["error"],
                "test_nll": te["nll"], "test_error": te["error"]}

    def train_one(job: Job) -> tuple[History, dict[str, Any]]:
        torch.manual_seed(job.seed)
        model = ConvNet(config.channels, job.params, groups=config.groups)
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
        hist = fit(model, Batches(x, y, batch_size=config.batch_size, seed=job.seed), opt,
                   steps=config.steps, eval_every=config.eval_every, eval_fn=eval_fn,
                   device=job.device, seed=job.seed, checkpoint=job.checkpoint,
                   loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                   bar=job.bar, label=job.label)
        maps = activation_maps(model, x[: config.n_maps].to(job.device), layer=0)
        return hist, {"maps": {k: v.cpu().numpy().round(6).tolist() for k, v in maps.items()}}

    return sweep(NAME, {n: n for n in config.norms}, tuple(config.seeds if seeds is None
                                                                 else seeds),
                 train_one, config=config, device=device, out=out,
                 checkpoint=config.checkpoint, steps=config.steps,
                 info={"source": train.source})


def maps_of(results: Results, norm: str, key: str = "on") -> np.ndarray:
    """The ``(seeds, 28, 28)`` maps ``key`` ("on", "mean" or "std") of one variant's runs."""
    return np.array([m[key] for m in results.info_of(norm, "maps")], dtype=float)
