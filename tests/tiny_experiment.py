"""A registered-experiment stand-in for the command-line tests (not a test itself).

It has everything an experiment module has (``NAME``, ``DESCRIPTION``, ``Config`` with both
presets and ``workers``, ``get_config``, ``run``) and trains a 3-input linear regression in a
second, so that a test can meet the command line as a user does (a real process, its exit
status and messages, signals, the files in ``--out``) without the cost of a real experiment.
``python tests/tiny_experiment.py ARGS`` is ``python -m lnbook ARGS`` with it registered.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

from lnbook.engine import Job, Results, make_config, sweep
from lnbook.engine.train import Batches, History, fit
from lnbook.experiments import EXPERIMENTS

NAME = "tiny"
DESCRIPTION = "a linear regression that trains in a second (for the tests)"


@dataclass
class Config:
    scale: str = "quick"
    lr: float = 0.05
    steps: int = int(os.environ.get("TINY_STEPS", "12"))
    seeds: int | tuple[int, ...] = 2  # the first 2 seeds of the seed set in force
    variants: tuple[str, ...] = ("a", "b")
    checkpoint: bool = False
    workers: int = 1
    # to give a signal time to arrive, set TINY_SLEEP (seconds per update) in the environment
    seconds_per_step: float = float(os.environ.get("TINY_SLEEP", "0"))


PRESETS = {"quick": {}, "paper": {"lr": 0.02, "checkpoint": True}}


def get_config(scale: str = "quick", **overrides) -> Config:
    return make_config(Config, PRESETS, scale, overrides)


def train_one(job: Job, config: Config) -> History:
    # the start from a generator of the run's own, not torch's global one: runs that train at
    # once in threads (tests/test_executor.py) would otherwise race for the global state
    model = nn.Linear(3, 1)
    init = torch.Generator().manual_seed(job.seed)
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 3, generator=init) / 3 ** 0.5)
        model.bias.zero_()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + (0.1 if job.params == "b" else 0.0)
    batches = Batches(x, y, batch_size=8, seed=job.seed)

    def data(step: int):
        time.sleep(config.seconds_per_step)
        return batches(step)

    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    mse = lambda m, b: ((m(b[0]) - b[1]) ** 2).mean()  # noqa: E731
    return fit(model, data, opt, steps=config.steps, eval_every=4, loss_fn=mse,
               eval_fn=lambda m: {"mse": float(mse(m, (x, y)))}, device=job.device,
               seed=job.seed, checkpoint=job.checkpoint, bar=job.bar, label=job.label)


def run(config: Config, device="auto", out=None) -> Results:
    return sweep(NAME, {v: v for v in config.variants}, config.seeds,
                 functools.partial(train_one, config=config), config=config, device=device,
                 out=out, checkpoint=config.checkpoint, steps=config.steps,
                 workers=config.workers)


if __name__ == "__main__":
    import tiny_experiment  # this file under its importable name, for worker processes

    import lnbook.__main__ as cli

    EXPERIMENTS[NAME] = tiny_experiment
    sys.exit(cli.main(sys.argv[1:]))
