"""Why normalization helps: a deep MLP with a poor start, watched layer by layer (lab 3.2).

Chapter `03_2_lab_why_it_helps` (no experiment of the paper): :class:`DeepMLP` with no norm,
batch norm (eq. 2) or layer norm (eq. 3), and :class:`LayerProbe`, which records its layers.
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

from lnbook.checks import check_choice, check_config, check_size, check_subset
from lnbook.data import load_digits_tensor, load_mnist
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.job import Job
from lnbook.engine.metrics import classification_metrics, prior_nll
from lnbook.engine.results import Results
from lnbook.engine.runner import sweep
from lnbook.engine.train import Batches, History, fit
from lnbook.mlp import NORMS, DeepMLP

__all__ = ["NAME", "DESCRIPTION", "NORMS", "PROBE_KEYS", "Config", "get_config", "DeepMLP",
           "LayerProbe", "log_spread", "probe_array", "run", "train_one"]

NAME = "deep_mlp"
DESCRIPTION = ("lab 3.2: an 8-layer ReLU MLP started with weights 2x too small, trained by SGD "
               "with no norm / batch norm / layer norm on the 8x8 digits; per-layer activations, "
               "gradients and update-to-weight ratios recorded during training")
PROBE_KEYS = ("act_rms", "grad_rms", "grad_zero_frac", "act_hist", "grad_hist",
              "weight_grad_norm", "update_ratio")
"""What :class:`LayerProbe` records in a run's ``info`` at each probed update."""


@dataclass
class Config(RunConfig):
    """Settings of the lab's deep-MLP experiment; :func:`get_config` gives the presets.

    Attributes:
        data: ``"digits"`` or ``"mnist"``.
        depth, width: hidden layers (``Linear -> norm -> ReLU``) and their units.
        init_scale: weights start with standard deviation ``init_scale * sqrt(2 / fan_in)``.
        norms: variants, from :data:`NORMS`.
        batch_size, steps, eval_every, lr, momentum: SGD's batch, updates, evaluations, rate.
        probe_updates: updates (1 = the first) at which the probe records.
        hist_range, hist_bins: the histograms' ``(low, high)`` in log10 ``|value|``, and bins.
        n_eval_train: training examples on which the training NLL is measured.
        scale, seeds, threads, workers: :class:`~lnbook.engine.RunConfig`'s.
    """

    data: str = "digits"
    depth: int = 8
    width: int = 64
    init_scale: float = 0.5
    norms: tuple[str, ...] = NORMS
    batch_size: int = 64
    steps: int = 300
    eval_every: int = 10
    lr: float = 0.05
    momentum: float = 0.9
    probe_updates: tuple[int, ...] = (1, 30, 100, 300)
    hist_range: tuple[float, float] = (-8.0, 2.0)
    hist_bins: int = 40
    n_eval_train: int = 512
    seeds: int | tuple[int, ...] = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("data", self.data, ("digits", "mnist"))
        check_subset("norms", self.norms, NORMS)
        if self.depth < 1 or self.width < 2:
            raise ValueError(f"depth must be >= 1 and width >= 2, got {self.depth}, {self.width}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {self.init_scale}")
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 (BN needs two examples), got "
                             f"{self.batch_size}")
        check_size("eval_every", self.eval_every)
        if any(not 1 <= u <= self.steps for u in self.probe_updates):
            raise ValueError(f"probe_updates must lie in [1, steps={self.steps}], got "
                             f"{self.probe_updates}")
        if not (self.hist_range[0] < self.hist_range[1] and self.hist_bins >= 1):
            raise ValueError(f"hist_range must be (low, high) with low < high and hist_bins >= 1, "
                             f"got {self.hist_range}, {self.hist_bins}")


# The paper has no such experiment; "paper" takes the sizes of its MNIST MLP (section 6.6: 1000
# units, mini-batches of 128) at the lab's depth, on MNIST.
_PRESETS: dict[str, dict[str, Any]] = {"quick": {}, "paper": {
    "threads": None, "data": "mnist", "width": 1000, "batch_size": 128, "steps": 5000,
    "eval_every": 100, "lr": 0.02, "probe_updates": (1, 100, 1000, 5000), "n_eval_train": 10_000,
    "seeds": 5}}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def _log_hist(t: Tensor, edges: np.ndarray) -> list[int]:
    """Counts of log10 |t| in the bins ``edges`` (exact zeros left out; the ends clip)."""
    v = t.detach().abs().flatten().double()
    v = v[v > 0].log10().clamp(float(edges[0]), float(edges[-1]))
    return np.histogram(v.cpu().numpy(), bins=edges)[0].tolist()


class LayerProbe:
    """Records per-layer statistics of a :class:`DeepMLP` at chosen updates (1-based).

    It hooks the optimizer; route each forward through :meth:`forward`. At a probed update it
    records per hidden layer the RMS and a histogram (``edges`` in log10) of ``|value|`` of the
    summed inputs and their gradients, and per weight the gradient norm and ``||W_after -
    W_before|| / ||W_before||`` (:data:`PROBE_KEYS`, in ``records``).
    """

    def __init__(self, model: DeepMLP, optimizer: torch.optim.Optimizer,
                 updates: tuple[int, ...] | list[int], edges: np.ndarray) -> None:
        self.model, self.updates = model, sorted(set(int(u) for u in updates))
        self.edges = np.asarray(edges, dtype=float)
        self.done = 0  # updates finished
        self.records: dict[str, list[Any]] = {k: [] for k in (*PROBE_KEYS, "probe_updates")}
        self._summed: list[Tensor] | None = None
        self._before: list[Tensor] | None = None
        optimizer.register_step_pre_hook(self._pre_step)
        optimizer.register_step_post_hook(self._post_step)

    @property
    def active(self) -> bool:
        """Whether the update now under way is recorded."""
        return self.done + 1 in self.updates

    def forward(self, x: Tensor) -> Tensor:
        """The model's logits; on a probed update also keep the summed inputs' gradients."""
        if not (self.active and self.model.training and torch.is_grad_enabled()):
            return self.model(x)
        logits, summed = self.model(x, return_summed=True)
        for a in summed:
            a.retain_grad()
        self._summed = summed
        return logits

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._summed is not None:
            self._before = [lin.weight.detach().clone() for lin in self.model.linears]

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.done += 1
        if self._summed is None or self._before is None:
            return
        summed, lins = self._summed, self.model.linears
        grads = [a.grad if a.grad is not None else torch.zeros_like(a) for a in summed]
        new = {
            "probe_updates": self.done,
            "act_rms": [float(a.detach().pow(2).mean().sqrt()) for a in summed],
            "grad_rms": [float(g.pow(2).mean().sqrt()) for g in grads],
            "grad_zero_frac": [float((g == 0).double().mean()) for g in grads],
            "act_hist": [_log_hist(a, self.edges) for a in summed],
            "grad_hist": [_log_hist(g, self.edges) for g in grads],
            "weight_grad_norm": [float(lin.weight.grad.norm()) if lin.weight.grad is not None
                                 else 0.0 for lin in lins],
            "update_ratio": [float((lin.weight.detach() - w0).norm() / w0.norm())
                             for lin, w0 in zip(lins, self._before, strict=True)],
        }
        for key, value in new.items():
            self.records[key].append(value)
        self._summed, self._before = None, None


def probe_array(results: Results, variant: str, key: str) -> np.ndarray:
    """One probe record of every seed: ``(seeds, probed updates, layers[, bins])``."""
    if key not in PROBE_KEYS:
        raise KeyError(f"key must be one of {PROBE_KEYS}, got {key!r}")
    return np.array(results.info_of(variant, key), dtype=float)


def log_spread(values: np.ndarray) -> np.ndarray:
    """log10(largest / smallest) over the last axis: how many decades the layers span."""
    values = np.asarray(values, dtype=float)
    if np.any(values <= 0):
        raise ValueError("log_spread needs positive values (RMS, norms)")
    return np.log10(values.max(axis=-1) / values.min(axis=-1))


def _data(config: Config) -> tuple[Tensor, Tensor, Tensor, Tensor, str]:
    """``x, y, x_test, y_test`` (inputs flattened, ``(N, 64)`` or ``(N, 784)``) and the source."""
    if config.data == "digits":
        return (*load_digits_tensor("train", flatten=True),
                *load_digits_tensor("test", flatten=True), "sklearn digits")
    train, test = load_mnist(split="train"), load_mnist(split="test")
    return train.images, train.labels, test.images, test.labels, f"mnist ({train.source})"


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every norm with every seed; return the sweep's results.

    Runs record ``train_nll``, ``test_nll`` and ``test_error``, and the :class:`LayerProbe` records
    in ``info``; ``Results.info`` holds the data source, the histogram edges and ``prior_nll``.
    """
    check_config(config, Config)
    x, y, x_test, y_test, source = _data(config)
    sizes = (x.shape[1], *([config.width] * config.depth), 10)
    edges = np.linspace(*config.hist_range, config.hist_bins + 1)
    variants = {n: n for n in config.norms}
    info = {"source": source, "hist_edges": edges.tolist(),
            "prior_nll": prior_nll(y, y_test), "sizes": list(sizes)}
    return sweep(NAME, variants, config.seeds,
                 partial(train_one, config, (x, y, x_test, y_test), sizes, edges),
                 config=config, device=device, out=out, checkpoint=False,
                 steps=config.steps, info=info, threads=config.threads,
                 workers=config.workers)


def train_one(config: Config, data: tuple[Tensor, ...], sizes: tuple[int, ...],
              edges: np.ndarray, job: Job) -> tuple[History, dict[str, Any]]:
    """One run: the :class:`DeepMLP` of ``sizes`` with norm ``job.params`` trained on ``data``
    (``x, y, x_test, y_test``) with seed ``job.seed``; its history and the probe's records
    (histograms over ``edges``)."""
    x, y, x_test, y_test = data
    x_eval, y_eval = x[: config.n_eval_train], y[: config.n_eval_train]

    def eval_fn(model: nn.Module) -> dict[str, float]:
        tr = classification_metrics(model, x_eval, y_eval)
        te = classification_metrics(model, x_test, y_test)
        return {"train_nll": tr["nll"], "test_nll": te["nll"], "test_error": te["error"]}

    torch.manual_seed(job.seed)
    model = DeepMLP(sizes, job.params, config.init_scale)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                          foreach=True)
    probe = LayerProbe(model, opt, config.probe_updates, edges)
    hist = fit(model, Batches(x, y, batch_size=config.batch_size, seed=job.seed),
               opt, steps=config.steps, eval_every=config.eval_every, eval_fn=eval_fn,
               device=job.device, seed=job.seed, checkpoint=job.checkpoint,
               loss_fn=lambda m, b: F.cross_entropy(probe.forward(b[0]), b[1]),
               bar=job.bar, label=job.label)
    return hist, probe.records
