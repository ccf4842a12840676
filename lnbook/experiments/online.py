"""Training online, one example per update (chapter `03_layer_norm`, claim C02).

Layer normalization's statistics come from one example, so a network with it can be trained at
batch size 1. :func:`run` trains a one-hidden-layer MLP with :class:`lnbook.LayerNorm` on the
8x8 digits by SGD at every size of ``batch_sizes`` (1, the online regime, and 32) on the same
number of examples, with a step per example that is the same at every size;
:func:`c02_inputs` reads the per-seed quantities of C02's rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_config, check_size
from lnbook.data import load_digits_tensor
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.job import Job
from lnbook.engine.metrics import classification_metrics, prior_nll
from lnbook.engine.results import Results
from lnbook.engine.runner import sweep
from lnbook.engine.train import Batches, History, fit
from lnbook.norms import LayerNorm

__all__ = ["NAME", "DESCRIPTION", "Config", "get_config", "build", "variant_name", "run",
           "train", "TRIVIAL_FRACTION", "c02_inputs"]

NAME = "online"
DESCRIPTION = ("an MLP with layer norm on the 8x8 digits, trained by SGD one example per update "
               "(online) and at batch size 32 on the same examples (claim C02)")


@dataclass
class Config(RunConfig):
    """Settings of the online experiment; :func:`get_config` gives the presets.

    Attributes:
        steps: updates at the largest batch size; every run sees the same
            ``steps x max(batch_sizes)`` examples, so a run at batch size ``B`` makes
            ``steps x max(batch_sizes) / B`` updates (quick: 44 updates of 32, one pass over
            the 1,438 training digits cut to whole batches).
        batch_sizes: the sizes compared, each dividing the largest; the smallest is the online
            one.
        hidden: units of the hidden layer (layer norm between its Linear and its ReLU).
        lr_per_example: SGD's step at batch size ``B`` is ``lr_per_example x B`` (the loss is
            the batch's mean), the same step per example at every size.
        scale, seeds, threads, workers: :class:`~lnbook.engine.RunConfig`'s.
    """

    steps: int = 44
    batch_sizes: tuple[int, ...] = (1, 32)
    hidden: int = 64
    lr_per_example: float = 0.01
    seeds: int | tuple[int, ...] = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_size("hidden", self.hidden)
        sizes = tuple(self.batch_sizes)
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                            or max(sizes) % b for b in sizes):
            raise ValueError(f"batch_sizes must be ints >= 1 that divide the largest, got "
                             f"{self.batch_sizes!r}")
        if not self.lr_per_example > 0:
            raise ValueError(f"lr_per_example must be > 0, got {self.lr_per_example!r}")


_PRESETS: dict[str, dict[str, Any]] = {"quick": {}, "paper": {
    "threads": None, "hidden": 1000, "steps": 440}}  # ten passes


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def build(config: Config) -> nn.Sequential:
    """The MLP: ``Linear(64, hidden) -> LayerNorm -> ReLU -> Linear(hidden, 10)`` (no norm on
    the logits); layer norm by torch's fused kernel (``impl="torch"``), the function of eq. 3
    at a lower cost per call, which matters for thousands of one-example updates."""
    return nn.Sequential(nn.Linear(64, config.hidden),
                         LayerNorm(config.hidden, impl="torch"),
                         nn.ReLU(), nn.Linear(config.hidden, 10))


def variant_name(batch_size: int) -> str:
    """``"batch 1"``, ``"batch 32"``: the run at that batch size."""
    return f"batch {batch_size}"


def _updates(config: Config, variant: str, batch_size: int) -> int:
    return config.steps * max(config.batch_sizes) // batch_size


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train the MLP at every batch size with every seed, through
    :func:`lnbook.engine.runner.sweep`; each run is evaluated once, at its end, on the 359
    held-out digits (``nll``, ``error``). ``Results.info``: ``trivial_nll``, the held-out NLL
    of predicting the training set's class shares (:func:`~lnbook.engine.metrics.prior_nll`),
    and ``majority_error``, the error of always answering the most frequent training class."""
    check_config(config, Config)
    x, y = load_digits_tensor("train", flatten=True)  # (1438, 64), (1438,)
    xt, yt = load_digits_tensor("test", flatten=True)  # (359, 64), (359,)
    info = {"trivial_nll": prior_nll(y, yt),
            "majority_error": float((yt != y.bincount().argmax()).float().mean())}
    return sweep(NAME, {variant_name(b): b for b in config.batch_sizes}, config.seeds,
                 partial(train, config, (x, y, xt, yt)), config=config, device=device,
                 out=out, steps=partial(_updates, config), threads=config.threads,
                 workers=config.workers, info=info)


def train(config: Config, data: tuple[Tensor, ...], job: Job) -> History:
    """One run of :func:`run`: the MLP of seed ``job.seed`` trained by SGD at batch size
    ``job.params`` on ``data`` (``x, y, x_test, y_test``)."""
    x, y, xt, yt = data
    batch_size = job.params
    torch.manual_seed(job.seed)
    model = build(config)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr_per_example * batch_size,
                          foreach=True)
    steps = _updates(config, job.variant, batch_size)
    return fit(model, Batches(x, y, batch_size=batch_size, seed=job.seed), opt, steps=steps,
               eval_every=steps, eval_fn=partial(classification_metrics, x=xt, y=yt),
               device=job.device, seed=job.seed, bar=job.bar, label=job.label,
               loss_fn=lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]))


#: C02's trivial-phase bar: a seed counts when both its runs end with a held-out NLL below this
#: fraction of the trivial predictor's.
TRIVIAL_FRACTION = 0.5


def c02_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """C02's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed:
    the online run's held-out NLL over the trivial predictor's ("online leaves the trivial
    phase"), and the online run's minus the largest batch's ("online within the margin of
    batch 32"), counted where both runs end below :data:`TRIVIAL_FRACTION` of the trivial
    predictor's NLL."""
    sizes = sorted(int(v.split()[1]) for v in results.variants)
    trivial = results.info["trivial_nll"]
    online = results.final(variant_name(sizes[0]), "nll")  # (seeds,)
    ref = results.final(variant_name(sizes[-1]), "nll")  # (seeds,)
    left = (online < TRIVIAL_FRACTION * trivial) & (ref < TRIVIAL_FRACTION * trivial)
    within = "online within the margin of batch 32"
    return {"values": {"online leaves the trivial phase": online / trivial, within: online - ref},
            "trivial_ok": {within: left}}
