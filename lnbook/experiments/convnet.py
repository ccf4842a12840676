"""A small ConvNet on MNIST with no norm, batch norm, layer norm (two readings) and group norm.

Paper section 6.7; book chapter `06_7_convnets` (claim C19). LN of summed inputs ``(N, C, H, W)``
is read two ways: ``"layer_chw"`` over all ``C * H * W`` units (eq. 3 literally) and
``"layer_c"`` over the channels per position (:class:`lnbook.norms.ChannelLayerNorm`); with
``"batch"`` and ``"group"`` (:class:`torch.nn.GroupNorm`). A control trains on digits cropped to
their centre (:func:`crop_center`), where the units near the boundary do see ink.
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

from lnbook.checks import check_choice, check_config, check_subset
from lnbook.data import mnist_train_test
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.job import Job, cpu_threads
from lnbook.engine.metrics import mean_after_start
from lnbook.engine.results import Results
from lnbook.engine.runner import sweep
from lnbook.engine.train import Batches, History, fit
from lnbook.norms import BatchNorm, ChannelLayerNorm, LayerNorm

__all__ = [
    "NAME", "DESCRIPTION", "NORMS", "Config", "get_config", "ConvNet", "crop_center",
    "boundary_mask", "activation_maps", "ring_and_centre", "maps_of", "variant_name", "run",
    "train_one", "TRIVIAL_MARGIN", "c19_left", "c19_inputs",
]

NAME = "convnet"
DESCRIPTION = (
    "small ConvNet on MNIST: none / batch norm / layer norm over (C,H,W) and over C per position "
    "/ group norm, activation statistics near the image boundary, and a control on digits "
    "cropped to their central pixels (section 6.7)"
)
NORMS = ("none", "batch", "layer_chw", "layer_c", "group")
IMAGE_SIZE = 28
#: a seed counts in C19 when every run of it ends with a test error at least this far below
#: the majority-class predictor's (``Results.info["majority_error"]``); fixed before the runs
TRIVIAL_MARGIN = 0.5


def _norm_layer(norm: str, channels: int, size: int, groups: int) -> nn.Module:
    if norm == "batch":
        return BatchNorm(channels)
    if norm == "layer_chw":
        return LayerNorm((channels, size, size), impl="torch")  # eq. 3, torch's fast kernel
    if norm == "layer_c":
        return ChannelLayerNorm(channels)
    if norm == "group":
        return nn.GroupNorm(groups, channels)
    return nn.Identity()


class ConvNet(nn.Module):
    """``[conv3x3 (padding 1) -> norm -> ReLU -> maxpool 2] * len(channels) -> Linear``.

    ``norm`` from :data:`NORMS`; ``groups`` (for ``"group"``) must divide every channel count.

    Shape: ``(N, S * S)`` or ``(N, 1, S, S)`` with ``S = image_size`` -> logits ``(N, classes)``.
    """

    def __init__(self, channels: tuple[int, ...] = (8, 16), norm: str = "none", groups: int = 4,
                 classes: int = 10, image_size: int = IMAGE_SIZE) -> None:
        super().__init__()
        check_choice("norm", norm, NORMS)
        if norm == "group" and any(c % groups for c in channels):
            raise ValueError(f"groups={groups} must divide every channel count {channels}")
        if image_size < 2 ** len(channels):
            raise ValueError(f"image_size={image_size} is too small for {len(channels)} "
                             "poolings by 2")
        self.norm, self.image_size = norm, image_size
        self.convs, self.norms = nn.ModuleList(), nn.ModuleList()
        c_in, size = 1, image_size
        for c in channels:
            self.convs.append(nn.Conv2d(c_in, c, 3, padding=1, bias=(norm == "none")))
            self.norms.append(_norm_layer(norm, c, size, groups))
            c_in, size = c, size // 2
        self.head = nn.Linear(c_in * size * size, classes)

    def forward(self, x: Tensor, return_summed: bool = False
                ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits; with ``return_summed`` also the summed inputs of each conv layer."""
        S = self.image_size
        if x.dim() == 2 and x.shape[1] == S * S:
            x = x.view(-1, 1, S, S)  # (N, 1, S, S)
        if x.dim() != 4 or x.shape[1:] != (1, S, S):
            raise ValueError(f"ConvNet expects (N, {S * S}) or (N, 1, {S}, {S}), "
                             f"got {tuple(x.shape)}")
        summed = []
        for conv, norm in zip(self.convs, self.norms, strict=True):
            a = conv(x)  # (N, C, S, S): summed inputs
            summed.append(a)
            x = F.max_pool2d(F.relu(norm(a)), 2)  # (N, C, S/2, S/2)
        logits = self.head(x.flatten(1))  # (N, classes)
        return (logits, summed) if return_summed else logits


def crop_center(images: Tensor, size: int) -> Tensor:
    """The central ``size`` x ``size`` pixels of flat 28 x 28 images: ``(N, 784) -> (N, size^2)``"""
    if images.dim() != 2 or images.shape[1] != IMAGE_SIZE * IMAGE_SIZE:
        raise ValueError(f"images must be (N, {IMAGE_SIZE * IMAGE_SIZE}), got "
                         f"{tuple(images.shape)}")
    if not (isinstance(size, int) and 4 <= size <= IMAGE_SIZE):
        raise ValueError(f"size must be an int in [4, {IMAGE_SIZE}], got {size!r}")
    lo = (IMAGE_SIZE - size) // 2
    img = images.view(-1, IMAGE_SIZE, IMAGE_SIZE)[:, lo : lo + size, lo : lo + size]
    return img.reshape(-1, size * size)  # (N, size^2)


def boundary_mask(size: int = IMAGE_SIZE, width: int = 4) -> Tensor:
    """``(size, size)`` booleans, True on the ring of ``width`` positions along the edges."""
    if not 0 < 2 * width < size:
        raise ValueError(f"width must be in [1, {(size - 1) // 2}] for size {size}, got {width}")
    m = torch.ones(size, size, dtype=torch.bool)
    m[width:-width, width:-width] = False
    return m


def activation_maps(model: ConvNet, x: Tensor, layer: int = 0) -> dict[str, Tensor]:
    """Per-position statistics of one conv layer's units over the examples ``x``, ``(S, S)`` maps
    averaged over the channels: ``on`` (fraction of examples with output after norm and ReLU
    > 0), ``mean`` and ``std`` over examples of the summed input."""
    model.eval()
    with torch.no_grad():
        a = model(x, return_summed=True)[1][layer]  # (N, C, S, S)
        on = (F.relu(model.norms[layer](a)) > 0).float()  # (N, C, S, S)
    return {"on": on.mean(dim=(0, 1)), "mean": a.mean(dim=0).mean(dim=0),
            "std": a.std(dim=0).mean(dim=0)}


def _test(model: ConvNet, x: Tensor, y: Tensor, chunk: int = 250) -> dict[str, Any]:
    """Test NLL, error and the first layer's :func:`activation_maps`, in one pass by chunks."""
    model.eval()
    nll, wrong, on, s1, s2 = 0.0, 0, 0.0, 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), chunk):
            logits, summed = model(x[i : i + chunk], return_summed=True)  # (n, classes)
            yb, a = y[i : i + chunk], summed[0]  # (n,), (n, C, S, S)
            nll += float(F.cross_entropy(logits, yb, reduction="sum"))
            wrong += int((logits.argmax(1) != yb).sum())
            on = on + (F.relu(model.norms[0](a)) > 0).float().sum(0)  # (C, S, S)
            s1, s2 = s1 + a.double().sum(0), s2 + (a.double() ** 2).sum(0)
    n = len(y)
    mean = s1 / n  # (C, S, S)
    std = ((s2 - n * mean**2).clamp(min=0) / max(n - 1, 1)).sqrt()
    maps = {"on": on.mean(0) / n, "mean": mean.mean(0), "std": std.mean(0)}  # (S, S) each
    return {"test_error": wrong / n, "test_nll": nll / n,
            "maps": {k: v.float().cpu().numpy().round(6).tolist() for k, v in maps.items()}}


def ring_and_centre(maps: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of ``(seeds, S, S)`` maps over the ring of ``width`` positions along the edges and
    over the centre inside it: ``((seeds,), (seeds,))``."""
    maps = np.asarray(maps, dtype=float)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2]:
        raise ValueError(f"maps must be (seeds, S, S), got {maps.shape}")
    ring = boundary_mask(maps.shape[1], width).numpy()
    return maps[:, ring].mean(1), maps[:, ~ring].mean(1)


@dataclass
class Config(RunConfig):
    """Settings of the ConvNet experiment; :func:`get_config` gives the presets.

    ``norms`` train on the full images, ``control_norms`` on the central ``crop`` pixels (0: no
    control); ``boundary_width``: the ring of positions "near the boundary"; ``checkpoint``:
    per-run checkpoints under ``out/``. :class:`~lnbook.engine.RunConfig` describes the rest.
    """

    channels: tuple[int, ...] = (8, 16)
    norms: tuple[str, ...] = ("none", "batch", "layer_chw")
    control_norms: tuple[str, ...] = ("batch", "layer_chw")
    crop: int = 20
    groups: int = 4
    batch_size: int = 32
    steps: int = 50
    lr: float = 1e-3
    n_train: int | None = None
    n_test: int | None = None
    boundary_width: int = 4
    seeds: int | tuple[int, ...] = 5
    source: str = "auto"
    checkpoint: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_subset("norms", (*self.norms, *self.control_norms), NORMS)
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2, got {self.batch_size}")
        if self.crop and not 4 * self.boundary_width < self.crop <= IMAGE_SIZE:
            raise ValueError(f"crop must be 0 or in ({4 * self.boundary_width}, {IMAGE_SIZE}],"
                             f" got {self.crop}")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"channels": (32, 64), "norms": NORMS, "groups": 8, "batch_size": 128,
              "steps": 10_000, "n_train": 55_000, "n_test": None, "threads": None,
              "checkpoint": True},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def variant_name(norm: str, crop: int = 0) -> str:
    """``norm`` for the full images, ``"<norm>/crop<size>"`` for the cropped control."""
    return f"{norm}/crop{crop}" if crop else norm


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every variant (:func:`variant_name`) with every seed; return the sweep's results.

    Each run's ``info`` holds ``test_error``, ``test_nll`` and the first layer's activation
    ``maps`` on the test images cropped like its training images; ``Results.info`` the data
    ``source`` and ``majority_error`` (always answering the commonest training class).
    """
    check_config(config, Config)
    x, y, xt, yt, info = mnist_train_test(config.source, config.n_train, config.n_test,
                                          config.scale, NAME)  # (N, 784), (N,), (M, 784), (M,)
    variants = {variant_name(n): (n, 0) for n in config.norms}
    if config.crop:
        variants |= {variant_name(n, config.crop): (n, config.crop)
                     for n in config.control_norms}
    with cpu_threads(config.threads):
        return sweep(NAME, variants, config.seeds, partial(train_one, config, (x, y, xt, yt)),
                     config=config, device=device, out=out, checkpoint=config.checkpoint,
                     steps=config.steps, info=info, workers=config.workers)


def train_one(config: Config, data: tuple[Tensor, ...], job: Job
              ) -> tuple[History, dict[str, Any]]:
    """One run: the ConvNet of ``job.params`` (norm, crop) trained on ``data``
    (``x, y, x_test, y_test``) with seed ``job.seed``; its history and test measurements."""
    x, y, xt, yt = data
    norm, crop = job.params
    xs, xts = (crop_center(x, crop), crop_center(xt, crop)) if crop else (x, xt)
    torch.manual_seed(job.seed)
    model = ConvNet(config.channels, norm, groups=config.groups, image_size=crop or IMAGE_SIZE)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    hist = fit(model, Batches(xs, y, batch_size=config.batch_size, seed=job.seed), opt,
               steps=config.steps, eval_every=config.steps, device=job.device,
               seed=job.seed, checkpoint=job.checkpoint,
               loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
               bar=job.bar, label=job.label)
    return hist, _test(model, xts.to(job.device), yt.to(job.device))


def maps_of(results: Results, variant: str, key: str = "on") -> np.ndarray:
    """The ``(seeds, S, S)`` maps ``key`` ("on", "mean" or "std") of one variant's runs."""
    return np.array([m[key] for m in results.info_of(variant, "maps")], dtype=float)


def c19_left(results: Results) -> np.ndarray:
    """Per seed, ``(seeds,)``: whether every run of the seed ends with a test error at least
    :data:`TRIVIAL_MARGIN` below the majority-class predictor's (C19's trivial bar)."""
    bar = results.info["majority_error"] - TRIVIAL_MARGIN
    return np.all([np.array(results.info_of(v, "test_error")) <= bar
                   for v in results.variants], axis=0)


def c19_inputs(results: Results) -> dict[str, dict[str, np.ndarray]]:
    """C19's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, from a run
    of :func:`run` with ``"none"``, ``"batch"`` and ``"layer_chw"`` and the cropped control of
    every ``control_norms``, per seed, ``(seeds,)`` each.

    "LN faster than none": the mean training loss after the first update
    (:func:`lnbook.engine.metrics.mean_after_start`), LN over (C,H,W) minus no normalization.
    "BN beats LN": the final test error, batch norm minus LN over (C,H,W). "boundary units
    rarely on": the fraction of test images for which the first layer's ring units
    (``boundary_width`` positions along the edges, :func:`ring_and_centre`) of the LN network
    are on, minus the centre's. "boundary statistics differ" (yes or no): in every control
    network the ring's spread of summed inputs over the centre's (std maps, :func:`maps_of`)
    is higher on the cropped digits than on the full ones. The mask, the same for every part:
    :func:`c19_left`.
    """
    cfg = results.config
    if not (cfg.get("crop") and cfg.get("control_norms")):
        raise ValueError("C19's 'boundary statistics differ' reads the cropped control: run "
                         f"with crop > 0 and control_norms, got crop={cfg.get('crop')!r}, "
                         f"control_norms={cfg.get('control_norms')!r}")
    width = cfg["boundary_width"]
    area = {v: mean_after_start(results.curves(v, "loss")[1]) for v in ("none", "layer_chw")}
    err = {v: np.array(results.info_of(v, "test_error")) for v in ("batch", "layer_chw")}
    on_r, on_c = ring_and_centre(maps_of(results, "layer_chw", "on"), width)

    def spread(variant: str) -> np.ndarray:
        sd_r, sd_c = ring_and_centre(maps_of(results, variant, "std"), width)
        return sd_r / sd_c

    frame = np.all([spread(n) < spread(variant_name(n, cfg["crop"]))
                    for n in cfg["control_norms"]], axis=0)
    values = {"LN faster than none": area["layer_chw"] - area["none"],
              "BN beats LN": err["batch"] - err["layer_chw"],
              "boundary units rarely on": on_r - on_c, "boundary statistics differ": frame}
    return {"values": values, "trivial_ok": dict.fromkeys(values, c19_left(results))}
