"""Does batch norm's batch noise regularize? Mini-batch statistics against the training set's.

Book chapter `02_background`, the fourth part of claim C03. Two arms of one network
(:class:`StatsMLP`, batch norm after each hidden layer) differ only in where batch norm takes its
statistics while training: ``"batch"`` from the mini-batch of ``batch_size`` examples (the usual
estimate, noisy), ``"full"`` from the whole training set under the current weights (eq. 2's
expectation over the training data, no batch noise). Same initialization, data order and updates;
both are evaluated with the training set's statistics, on a held-out set. The training labels
carry noise (``label_noise``), so a network can fit what does not generalize. Also
:func:`c03_inputs`, the per-seed values of C03's four parts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_config, check_subset
from lnbook.engine import History, Job, Results, Stack, make_config, sweep, train_copies
from lnbook.engine.config import RunConfig
from lnbook.engine.metrics import prior_nll
from lnbook.functional import batch_normalize

__all__ = ["NAME", "DESCRIPTION", "ARMS", "Config", "get_config", "teacher_task", "StatsMLP",
           "run", "train", "TRIVIAL_MARGIN", "left_trivial", "c03_inputs"]

NAME = "batch_noise"
DESCRIPTION = ("chapter 2: an MLP with batch norm on a small, label-noisy synthetic task, "
               "statistics from the mini-batch against from the whole training set (C03)")
ARMS = ("batch", "full")
"""Where batch norm takes its statistics while training: the mini-batch, or the training set."""


@dataclass
class Config(RunConfig):
    """Settings of the batch-noise experiment; :func:`get_config` gives the presets.

    Attributes:
        arms: from :data:`ARMS`.
        dim, classes: inputs and classes of :func:`teacher_task`; n_train, n_test: its
            examples; label_noise: the share of training labels replaced by a random class.
        width, depth: :class:`StatsMLP`'s hidden units and layers.
        batch_size, steps, eval_every, lr: Adam's examples per update, updates, updates
            between evaluations, rate.
        seeds (:class:`~lnbook.engine.RunConfig`'s, like scale, threads, workers): they vary
            the initialization and the data order (the task is fixed).
    """

    arms: tuple[str, ...] = ARMS
    dim: int = 16
    classes: int = 4
    n_train: int = 256
    n_test: int = 1024
    label_noise: float = 0.2
    width: int = 64
    depth: int = 2
    batch_size: int = 8
    steps: int = 600
    eval_every: int = 50
    lr: float = 3e-3
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_subset("arms", self.arms, ARMS)
        if min(self.dim, self.width, self.depth, self.eval_every) < 1:
            raise ValueError("dim, width, depth and eval_every must be >= 1")
        if self.classes < 2 or not 2 <= self.batch_size <= self.n_train or self.n_test < 1:
            raise ValueError(f"need classes >= 2, 2 <= batch_size <= n_train and n_test >= 1, "
                             f"got {self.classes}, {self.batch_size}, {self.n_train}, "
                             f"{self.n_test}")
        if not 0 <= self.label_noise < 1 or not self.lr > 0:
            raise ValueError(f"label_noise must lie in [0, 1) and lr be > 0, got "
                             f"{self.label_noise}, {self.lr}")


# The paper has no such experiment; "paper" takes its MNIST MLP's mini-batch of 128 and
# 1000 units on a training set of 10,000.
_PRESETS: dict[str, dict[str, Any]] = {"quick": {}, "paper": {
    "threads": None, "dim": 64, "n_train": 10_000, "n_test": 10_000, "width": 1000,
    "batch_size": 128, "steps": 20_000, "eval_every": 500, "lr": 1e-3}}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def teacher_task(config: Config, seed: int = 0) -> dict[str, Tensor]:
    """Gaussian inputs ``(N, dim)`` labelled by a random two-layer tanh teacher (the most
    probable of ``classes``); ``label_noise`` of the training labels replaced by a uniformly
    drawn class (the held-out labels are clean). Keys ``x, y, x_test, y_test``; float32 inputs
    whatever torch's default dtype."""
    g = torch.Generator().manual_seed(seed)
    n = config.n_train + config.n_test
    x = torch.randn(n, config.dim, generator=g, dtype=torch.float32)  # (N, dim)
    w1 = torch.randn(config.dim, 32, generator=g, dtype=torch.float32) / config.dim ** 0.5
    w2 = torch.randn(32, config.classes, generator=g, dtype=torch.float32)
    y = (torch.tanh(x @ w1) @ w2).argmax(1)  # (N,) the teacher's class
    train = y[: config.n_train].clone()
    flip = torch.rand(config.n_train, generator=g, dtype=torch.float32) < config.label_noise
    train[flip] = torch.randint(config.classes, (int(flip.sum()),), generator=g)
    return {"x": x[: config.n_train], "y": train, "x_test": x[config.n_train:],
            "y_test": y[config.n_train:]}


class StatsMLP(nn.Module):
    """``[Linear -> batch norm (gain, bias) -> ReLU] * depth -> Linear``, ``(N, dim)`` to
    ``(N, classes)``; batch norm (:func:`lnbook.functional.batch_normalize`) takes its statistics
    from the input rows, or, given ``ref`` ``(M, dim)``, from ``ref``'s rows carried through the
    same layers. No running averages: evaluation passes the training set as ``ref``. Float32
    unless ``dtype`` says otherwise, whatever torch's default dtype."""

    def __init__(self, dim: int, width: int, depth: int, classes: int,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        sizes = [dim] + [width] * depth
        self.linears = nn.ModuleList(nn.Linear(a, b, bias=False, dtype=dtype)
                                     for a, b in zip(sizes, sizes[1:], strict=False))
        self.gains = nn.ParameterList(nn.Parameter(torch.ones(width, dtype=dtype))
                                      for _ in range(depth))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(width, dtype=dtype))
                                       for _ in range(depth))
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, x: Tensor, ref: Tensor | None = None) -> Tensor:
        n = len(x)
        h = x if ref is None else torch.cat([x, ref])  # (N [+ M], dim)
        for lin, g, b in zip(self.linears, self.gains, self.biases, strict=True):
            a = lin(h)  # (N [+ M], width) summed inputs
            h = F.relu(g * batch_normalize(a, None if ref is None else a[n:]) + b)
        return self.head(h[:n])  # (N, classes)


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train each arm of ``config.arms`` with every seed (the seeds of an arm as one
    :class:`~lnbook.engine.Stack`); evaluations record ``test_nll``, ``test_error`` and
    ``train_nll`` (on the noisy training labels); ``Results.info`` holds ``majority_error``
    (always answering the most frequent training class) and ``prior_nll``."""
    check_config(config, Config)
    task = teacher_task(config)
    counts = torch.bincount(task["y"], minlength=config.classes)
    info = {"majority_error": float((task["y_test"] != counts.argmax()).double().mean()),
            "prior_nll": prior_nll(task["y"], task["y_test"], config.classes)}
    return sweep(NAME, {a: a for a in config.arms}, config.seeds, partial(train, config, task),
                 config=config, device=device, out=out, stack="seeds", steps=config.steps,
                 threads=config.threads, workers=config.workers, info=info)


def _logits(model: StatsMLP, x: Tensor, ref: Tensor | None = None) -> Tensor:
    return model(x, ref)


def train(config: Config, task: dict[str, Tensor], job: Job) -> list[History]:
    """Every seed of one arm as one :class:`~lnbook.engine.Stack` trained by
    :func:`~lnbook.engine.copies.train_copies` with Adam; seed ``s`` starts from
    ``torch.manual_seed(s)`` and draws its mini-batches from its own generator."""
    arm, seeds, dev = job.params, job.seeds, job.device
    x, y, xt, yt = (task[k].to(dev) for k in ("x", "y", "x_test", "y_test"))
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(StatsMLP(config.dim, config.width, config.depth, config.classes))
    stack = Stack(models).to(dev)
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]

    def losses(step: int) -> Tensor:
        idx = torch.stack([torch.randperm(len(x), generator=g)[: config.batch_size]
                           for g in gens]).to(dev)  # (S, B) each seed its own examples
        if arm == "batch":
            logits = stack.call(_logits, x[idx])  # (S, B, classes)
        else:  # the statistics of the whole training set, under the current weights
            logits = stack.call(_logits, x[idx], x, shared=(1,))
        return F.cross_entropy(logits.flatten(0, 1), y[idx].flatten(),
                               reduction="none").view(len(seeds), -1).mean(1)  # (S,)

    def evaluate() -> list[dict[str, float]]:
        with torch.no_grad():
            lt = stack.call(_logits, xt, x, shared=(0, 1))  # (S, N_test, classes)
            lx = stack.call(_logits, x, x, shared=(0, 1))  # (S, N_train, classes)
        return [{"test_nll": float(F.cross_entropy(a, yt)),
                 "test_error": float((a.argmax(1) != yt).double().mean()),
                 "train_nll": float(F.cross_entropy(b, y))} for a, b in zip(lt, lx, strict=True)]

    opt = torch.optim.Adam(stack.parameters(), lr=config.lr, foreach=True)
    return train_copies(losses, evaluate, opt, [History() for _ in seeds], config.steps,
                        config.eval_every, state=stack, generators=gens,
                        checkpoint=job.checkpoint, bar=job.bar, label=job.label)


# --- claim C03: per-seed inputs to lnbook.ledger.decide_claim (chapter 2) ---------------------

#: A seed counts for the regularization part when both arms end with a held-out error at least
#: this much below the majority class's.
TRIVIAL_MARGIN = 0.1


def left_trivial(results: Results) -> np.ndarray:
    """Per seed, whether both arms ended :data:`TRIVIAL_MARGIN` below the majority class's
    held-out error: ``(seeds,)`` bools. ``ValueError`` if ``results`` lacks an arm."""
    missing = [a for a in ARMS if a not in results.variants]
    if missing:
        raise ValueError(f"C03 compares both arms {ARMS}; these results lack {missing} "
                         f"(run with arms={ARMS})")
    bar = results.info["majority_error"] - TRIVIAL_MARGIN
    return np.all([results.final(a, "test_error") <= bar for a in ARMS], axis=0)


def c03_inputs(spreads: Sequence[Sequence[float]], batch_sizes: Sequence[int],
               train_eval_gaps: Sequence[float], refuses_one: bool,
               b2_median: Sequence[float], results: Results) -> dict[str, dict[str, Any]]:
    """C03's ``values``, ``trivial_ok`` and ``reference`` for
    :func:`lnbook.ledger.decide_claim`, per seed:

    - "depends on batch-mates, less as B grows": one example's output spread over random
      batch-mates (``spreads``, one list per seed over ``batch_sizes``) is above 1e-3 at every
      size, falls at every larger size, and falls more than 4-fold from B = 4 to B = 256;
    - "needs running averages": ``train_eval_gaps``, as measured;
    - "breaks down at tiny batches": a batch of one is refused and the median ``|output|`` at
      batch 2 (``b2_median``) exceeds 0.999;
    - "batch noise regularizes": the final held-out error of the ``"full"`` arm of ``results``
      (a run of :func:`run`) minus the ``"batch"`` arm's, read against the ``"full"`` arm's
      (the reference), counted where :func:`left_trivial`.
    """
    i4, i256 = list(batch_sizes).index(4), list(batch_sizes).index(256)
    falls = [min(sp) > 1e-3 and all(a > b for a, b in zip(sp[:-1], sp[1:], strict=True))
             and sp[i4] / sp[i256] > 4 for sp in spreads]
    left = left_trivial(results)  # first: it names a missing arm
    full, batch = results.final("full", "test_error"), results.final("batch", "test_error")
    part = "batch noise regularizes"
    return {"values": {"depends on batch-mates, less as B grows": falls,
                       "needs running averages": list(train_eval_gaps),
                       "breaks down at tiny batches": [bool(refuses_one) and m > 0.999
                                                       for m in b2_median],
                       part: full - batch},
            "trivial_ok": {part: left}, "reference": {part: full}}
