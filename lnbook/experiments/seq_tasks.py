"""What the Transformer experiments of Parts II-III share: a task and its trivial baseline.

Not an experiment itself; ``rmsnorm``, ``placement``, ``qk_norm``, ``peri_ln`` and ``depth``
build on :class:`TaskConfig` (shared settings and presets, and the model every run builds) and
:func:`make_task`, and train through :func:`lnbook.experiments.stacked.train_stacked` in a job
of :func:`lnbook.engine.runner.sweep`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lnbook.checks import check_choice
from lnbook.data import IGNORE_INDEX, associative_recall, sort_task
from lnbook.engine import max_updates
from lnbook.engine.config import RunConfig
from lnbook.engine.results import Results
from lnbook.transformer import TransformerConfig

__all__ = ["TASKS", "TaskConfig", "DeepTaskConfig", "presets", "SequenceTask", "make_task",
           "task_of", "position_unigram_loss"]

TASKS = ("sort", "recall")
_TEST_SEED_OFFSET = 10_007  # the held-out set is drawn with another seed than the training set
SMOKE_HELD_OUT = 16  # held-out sequences of a smoke run (task_of)
SMOKE_BATCH = 8  # sequences per update of a smoke run (stacked.train_stacked)


@dataclass
class TaskConfig(RunConfig):
    """The settings every Part II sequence-task experiment shares; its ``Config`` subclasses it.

    Attributes:
        task, size, symbols: :func:`make_task`'s.
        n_train, n_test: training and held-out sequences.
        d_model, n_heads, n_layers: the Transformer (causal, d_ff = 4 d_model).
        batch_size, steps, eval_every: sequences per update, updates, updates between
            evaluations.
        scale, seeds, threads, workers: :class:`~lnbook.engine.RunConfig`'s.
        checkpoint: not read by :func:`~lnbook.experiments.stacked.train_stacked`.
    """

    task: str = "sort"
    size: int = 8
    symbols: int = 8
    n_train: int = 2000
    n_test: int = 256
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    batch_size: int = 32
    steps: int = 50
    eval_every: int = 10
    seeds: int | tuple[int, ...] = 3
    checkpoint: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("task", self.task, TASKS)
        if min(self.eval_every, self.batch_size, self.n_train, self.n_test) < 1:
            raise ValueError("eval_every, batch_size, n_train and n_test must be >= 1")

    def model_config(self, seq_len: int, **fields: Any) -> TransformerConfig:
        """The Transformer of this task (``symbols + 1`` token ids, ``max_len = seq_len``) with
        ``fields`` of :class:`~lnbook.transformer.TransformerConfig` set or replaced.
        """
        return TransformerConfig(**{"vocab_size": self.symbols + 1, "d_model": self.d_model,
                                    "n_heads": self.n_heads, "n_layers": self.n_layers,
                                    "max_len": seq_len, **fields})


@dataclass
class DeepTaskConfig(TaskConfig):
    """:class:`TaskConfig` with the narrow model, short training and five seeds that chapters 14
    and 15 share (:mod:`~lnbook.experiments.peri_ln`, :mod:`~lnbook.experiments.depth`)."""

    size: int = 6
    d_model: int = 16
    n_heads: int = 2
    batch_size: int = 16
    steps: int = 60
    eval_every: int = 30
    n_test: int = 128
    seeds: int | tuple[int, ...] = 5


def stream_variance(results: Results, variant: str, step: int | None = None) -> np.ndarray:
    """The stream's variance after each block per seed, ``(seeds, L + 1)`` (column 0 the embeddings)
    at the evaluation after ``step`` updates (None: the last).
    """
    rows = []
    for r in results.select(variant):
        h = r.history
        m = h.metrics[-1 if step is None else h.eval_steps.index(step)]
        rows.append([m[f"var_{k}"] for k in range(sum(n.startswith("var_") for n in m))])
    return np.array(rows, dtype=float)


_PAPER: dict[str, Any] = {
    "threads": None, "size": 32, "symbols": 64, "n_train": 200_000, "n_test": 2_000,
    "d_model": 512, "n_heads": 8, "n_layers": 6, "batch_size": 64, "steps": 20_000,
    "eval_every": 500, "checkpoint": True}


def check_lrs(lrs: Sequence[float]) -> None:
    """Raise ValueError unless ``lrs`` is a non-empty increasing tuple of positive rates."""
    if not lrs or any(lr <= 0 for lr in lrs) or list(lrs) != sorted(lrs):
        raise ValueError(f"lrs must be positive and increasing, got {lrs}")


def presets(**paper: Any) -> dict[str, dict[str, Any]]:
    """The ``quick`` (the Config's defaults) and ``paper`` presets (shared, ``paper`` on top)."""
    return {"quick": {}, "paper": {**_PAPER, **paper}}


@dataclass
class SequenceTask:
    """A training set, a held-out set and what a model that learnt nothing would score: ``x``,
    ``y``, ``x_test``, ``y_test`` int64 ``(n, T)`` (targets :data:`lnbook.data.IGNORE_INDEX`
    where not scored), ``vocab_size``, ``uniform_loss`` (``log(symbols)``) and ``baseline_loss``
    (:func:`position_unigram_loss`)."""

    name: str
    x: Tensor
    y: Tensor
    x_test: Tensor
    y_test: Tensor
    vocab_size: int
    uniform_loss: float
    baseline_loss: float

    @property
    def seq_len(self) -> int:
        """``T``, the length of every input sequence."""
        return int(self.x.shape[1])

    @property
    def info(self) -> dict[str, Any]:
        """What a stacked experiment records as ``Results.info``: ``task`` (the name),
        ``uniform_loss`` and ``baseline_loss``."""
        return {"task": self.name, "uniform_loss": self.uniform_loss,
                "baseline_loss": self.baseline_loss}

    def to(self, device: torch.device | str) -> SequenceTask:
        """The task with its four tensors on ``device``."""
        return dataclasses.replace(self, x=self.x.to(device), y=self.y.to(device),
                                   x_test=self.x_test.to(device), y_test=self.y_test.to(device))


def position_unigram_loss(y_train: Tensor, y_test: Tensor, vocab: int) -> float:
    """Held-out loss (nats per scored token) of the best predictor that ignores the input: per
    position the add-one smoothed target frequencies of ``y_train`` ``(n, T)``.

    Example::

        >>> y = torch.tensor([[-100, 0], [-100, 1]])
        >>> round(position_unigram_loss(y, y, 2), 4)  # each symbol half the time
        0.6931
    """
    if y_train.dim() != 2 or y_test.dim() != 2 or y_train.shape[1] != y_test.shape[1]:
        raise ValueError(f"targets must be (n, T) with the same T, got {tuple(y_train.shape)} "
                         f"and {tuple(y_test.shape)}")
    row, pos = (y_train != IGNORE_INDEX).nonzero(as_tuple=True)  # the scored (row, position)s
    counts = torch.ones(y_train.shape[1], vocab, dtype=torch.float64)  # (T, V) add-one
    counts.index_put_((pos, y_train[row, pos]), torch.ones(len(pos), dtype=torch.float64),
                      accumulate=True)
    log_p = (counts / counts.sum(1, keepdim=True)).log()  # (T, V)
    row, pos = (y_test != IGNORE_INDEX).nonzero(as_tuple=True)
    return float(-log_p[pos, y_test[row, pos]].mean())


def make_task(name: str, n_train: int, n_test: int, size: int, symbols: int, seed: int = 0
              ) -> SequenceTask:
    """Draw the training and held-out sets of one task and its trivial baseline.

    ``name`` ``"sort"`` (:func:`lnbook.data.sort_task`, inputs of length ``2 * size``) or
    ``"recall"`` (:func:`lnbook.data.associative_recall`, ``size`` pairs, length ``2 * size + 2``);
    ``symbols`` content symbols; the training set is drawn with ``seed``, the held-out set with
    ``seed + 10007``."""
    check_choice("task", name, TASKS)
    make = sort_task if name == "sort" else associative_recall
    x, y = make(n_train, size, symbols, seed=seed)
    x_test, y_test = make(n_test, size, symbols, seed=seed + _TEST_SEED_OFFSET)
    return SequenceTask(name, x, y, x_test, y_test, vocab_size=symbols + 1,
                        uniform_loss=math.log(symbols),
                        baseline_loss=position_unigram_loss(y, y_test, symbols))


def task_of(config: Any) -> SequenceTask:
    """The task a config names: :func:`make_task` of its ``task``, ``n_train``, ``n_test``,
    ``size`` and ``symbols``; in a smoke run (:func:`lnbook.engine.train.capped`) at most
    :data:`SMOKE_HELD_OUT` held-out sequences (a paper-scale evaluation alone takes minutes)."""
    n_test = config.n_test if max_updates() is None else min(config.n_test, SMOKE_HELD_OUT)
    return make_task(config.task, config.n_train, n_test, config.size, config.symbols)
