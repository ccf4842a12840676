"""Section 3.1 (claim C04): batch norm with per-step statistics against layer norm, on test
sequences longer than any training sequence. Book chapter 3.1 (`03_1_ln_rnn`).

The task is a running-sum sign: inputs x_t ~ N(0, 1) (one feature), and at every step the target
is 1 when x_1 + ... + x_t > 0, else 0. Solving it needs an integrator, whose state keeps growing
(like sqrt(t)), so the statistics of the summed inputs change with t: exactly the case where
per-step batch statistics learned on short sequences are not the right ones for later steps.

Three single-layer tanh RNNs with a linear read-out are trained on sequences of ``train_len``
steps: ``ln`` (:class:`lnbook.RNN`, eq. 4), ``bn`` (:class:`lnbook.BatchNormRNN`, separate
statistics per step; beyond ``train_len`` it uses the last step's statistics) and ``plain``
(no normalization). Each is then tested on sequences of ``test_len`` steps, and the error rate is
recorded per time step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.device import resolve_device
from lnbook.experiments import make_config, save_results
from lnbook.recurrent_bn import BatchNormRNN
from lnbook.rnn import RNN
from lnbook.train import fit

NAME = "rnn_length"
DESCRIPTION = "LN-RNN vs per-step batch-normalized RNN on test sequences longer than training (3.1)"
VARIANTS = ("ln", "bn", "plain")


@dataclass
class Config:
    """Sizes of the running-sum experiment; ``quick`` runs in seconds on a CPU."""

    scale: str = "quick"
    hidden: int = 32
    train_len: int = 20
    test_len: int = 100
    batch_size: int = 64
    steps: int = 150
    lr: float = 1e-2
    test_batch: int = 256
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    threads: int | None = 1  # torch CPU threads while running (1 is fastest for tiny models)


PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"hidden": 128, "train_len": 50, "test_len": 500, "steps": 3000, "lr": 3e-3,
              "test_batch": 1024, "seeds": [0, 1, 2, 3, 4], "threads": None},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The preset for ``scale`` ("quick" or "paper"), with ``overrides`` applied."""
    return make_config(Config, PRESETS, scale, overrides)


def running_sum_batch(batch: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Inputs ``(length, batch, 1)`` ~ N(0, 1) and targets ``(length, batch)``: sum so far > 0."""
    x = torch.randn(length, batch, 1, generator=generator)  # (T, B, 1)
    y = (x.squeeze(-1).cumsum(0) > 0).float()  # (T, B)
    return x, y


class SignModel(nn.Module):
    """A one-layer tanh RNN (``ln``, ``bn`` or ``plain``) and a linear read-out to one logit."""

    def __init__(self, variant: str, hidden: int, train_len: int) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.variant = variant
        if variant == "bn":
            self.rnn: nn.Module = BatchNormRNN(1, hidden, max_steps=train_len)
        else:
            self.rnn = RNN(1, hidden, layer_norm=variant == "ln")
        self.out = nn.Linear(hidden, 1)

    def logits(self, x: Tensor) -> Tensor:
        """``x`` (T, B, 1) -> logits (T, B)."""
        h, _ = self.rnn(x)  # (T, B, H)
        return self.out(h).squeeze(-1)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(self.logits(x), y)


def error_per_step(model: SignModel, x: Tensor, y: Tensor) -> Tensor:
    """Fraction of wrong signs at each step, ``(T,)``, in eval mode without gradients."""
    was = model.training
    model.eval()
    with torch.no_grad():
        err = ((model.logits(x) > 0).float() != y).float().mean(1)  # (T,)
    model.train(was)
    return err


def run(
    config: Config, device: str = "auto", out: str | Path | None = None,
    seeds: list[int] | None = None,
) -> dict:
    """Train every variant for every seed; return the per-step test error rates.

    Returns a dict with ``config``, ``histories[variant][seed]`` (``History.to_dict()``) and
    ``error[variant][seed]``: the test error rate at steps 1..test_len (a list of floats).
    """
    dev = resolve_device(device)
    seeds = list(config.seeds if seeds is None else seeds)
    threads = torch.get_num_threads()
    if config.threads is not None and dev.type == "cpu":
        torch.set_num_threads(config.threads)
    try:
        res = _run(config, dev, seeds)
    finally:
        torch.set_num_threads(threads)
    if out is not None:
        save_results(res, Path(out) / f"{NAME}.json")
    return res


def _run(config: Config, dev: torch.device, seeds: list[int]) -> dict[str, Any]:
    g = torch.Generator().manual_seed(10_000)
    x_test, y_test = running_sum_batch(config.test_batch, config.test_len, g)
    res: dict[str, Any] = {"config": asdict(config), "device": str(dev), "histories": {},
                           "error": {}}
    for variant in config.variants:
        res["histories"][variant], res["error"][variant] = {}, {}
        for seed in seeds:
            torch.manual_seed(seed)
            model = SignModel(variant, config.hidden, config.train_len)

            def data(step: int, seed: int = seed) -> tuple[Tensor, Tensor]:
                gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
                return running_sum_batch(config.batch_size, config.train_len, gen)

            opt = torch.optim.Adam(model.parameters(), lr=config.lr)
            hist = fit(model, data, opt, steps=config.steps, eval_every=config.steps,
                       device=dev, seed=seed)
            err = error_per_step(model, x_test.to(dev), y_test.to(dev))
            res["histories"][variant][str(seed)] = hist.to_dict()
            res["error"][variant][str(seed)] = err.cpu().tolist()
    return res
