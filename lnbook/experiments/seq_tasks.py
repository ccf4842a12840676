"""What the Transformer experiments of Parts II-III share: a task, its trivial baseline, one run.

Not an experiment itself; ``rmsnorm``, ``placement``, ``qk_norm``, ``peri_ln``, ``depth`` and
``attention_geometry`` build on :class:`TaskConfig` (shared settings and presets, and the model
every run builds), :func:`make_task` and :func:`sequence_metrics`, and train through
:func:`lnbook.experiments.stacked.train_stacked`; :func:`train_transformer` is the run trained
alone that the tests hold each stacked copy to.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from lnbook.data import IGNORE_INDEX, associative_recall, sort_task
from lnbook.experiments.protocol import Job, Results, check_scale, sweep
from lnbook.seeds import verdict_seeds
from lnbook.train import Batches, History, fit
from lnbook.transformer import Transformer, TransformerConfig, max_attention_logits, sequence_loss

__all__ = ["TASKS", "TaskConfig", "presets", "SequenceTask", "make_task", "position_unigram_loss",
           "sequence_metrics", "linear_warmup", "train_transformer", "sweep_task"]

TASKS = ("sort", "recall")
_TEST_SEED_OFFSET = 10_007  # the held-out set is drawn with another seed than the training set


@dataclass
class TaskConfig:
    """The settings every Part II sequence-task experiment shares; its ``Config`` subclasses it.

    Attributes:
        scale: ``"quick"`` or ``"paper"``. task, size, symbols: :func:`make_task`'s.
        n_train, n_test: training and held-out sequences.
        d_model, n_heads, n_layers: the Transformer (causal, d_ff = 4 d_model).
        batch_size, steps, eval_every: sequences per update, updates, updates between evaluations.
        seeds: seeds of the runs. checkpoint, workers: of :func:`sweep_task`.
        threads: torch CPU threads (None: leave as is).
    """

    scale: str = "quick"
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
    seeds: tuple[int, ...] = verdict_seeds(3)
    checkpoint: bool = False
    threads: int | None = 1
    workers: int = 1

    def __post_init__(self) -> None:
        check_scale(self.scale)
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if min(self.steps, self.eval_every, self.batch_size, self.n_train, self.n_test) < 1:
            raise ValueError("steps, eval_every, batch_size, n_train and n_test must be >= 1")

    def model_config(self, seq_len: int, **fields: Any) -> TransformerConfig:
        """The Transformer of this task (``symbols + 1`` token ids, ``max_len = seq_len``) with
        ``fields`` of :class:`~lnbook.transformer.TransformerConfig` set or replaced.
        """
        return TransformerConfig(**{"vocab_size": self.symbols + 1, "d_model": self.d_model,
                                    "n_heads": self.n_heads, "n_layers": self.n_layers,
                                    "max_len": seq_len, **fields})


_PAPER: dict[str, Any] = {
    "threads": None, "size": 32, "symbols": 64, "n_train": 200_000, "n_test": 2_000,
    "d_model": 512, "n_heads": 8, "n_layers": 6, "batch_size": 64, "steps": 20_000,
    "eval_every": 500, "checkpoint": True}


def check_lrs(lrs: Sequence[float]) -> None:
    """Raise ValueError unless ``lrs`` is a non-empty increasing tuple of positive rates."""
    if not lrs or any(lr <= 0 for lr in lrs) or list(lrs) != sorted(lrs):
        raise ValueError(f"lrs must be positive and increasing, got {lrs}")


def presets(**paper: Any) -> dict[str, dict[str, Any]]:
    """The ``quick`` (the Config's defaults) and ``paper`` presets (the shared large settings
    with the experiment's own ``paper`` fields on top)."""
    return {"quick": {}, "paper": {**_PAPER, **paper}}


@dataclass
class SequenceTask:
    """A training set, a held-out set and what a model that learnt nothing would score: ``x``,
    ``y``, ``x_test``, ``y_test`` int64 ``(n, T)`` (targets :data:`lnbook.data.IGNORE_INDEX`
    where not scored), ``vocab_size``, ``uniform_loss`` (``log(symbols)``) and ``baseline_loss``
    (:func:`position_unigram_loss`).
    """

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


def position_unigram_loss(y_train: Tensor, y_test: Tensor, vocab: int) -> float:
    """Held-out loss (nats per scored token) of the best predictor that ignores the input: per
    position the add-one smoothed target frequencies of ``y_train`` ``(n, T)``.

    Example::

        >>> y = torch.tensor([[-100, 0], [-100, 1]])
        >>> round(position_unigram_loss(y, y, 2), 4)  # each symbol half the time
        0.6931
    """
    if y_train.dim() != 2 or y_test.dim() != 2 or y_train.shape[1] != y_test.shape[1]:
        raise ValueError(
            f"targets must be (n, T) with the same T, got {tuple(y_train.shape)} and "
            f"{tuple(y_test.shape)}"
        )
    scored = y_train != IGNORE_INDEX  # (n, T)
    counts = torch.ones(y_train.shape[1], vocab, dtype=torch.float64)  # (T, V) add-one
    pos = torch.arange(y_train.shape[1]).expand_as(y_train)  # (n, T)
    counts.index_put_((pos[scored], y_train[scored]), torch.ones(int(scored.sum()),
                      dtype=torch.float64), accumulate=True)
    log_p = (counts / counts.sum(1, keepdim=True)).log()  # (T, V)
    test_scored = y_test != IGNORE_INDEX  # (m, T)
    pos_t = torch.arange(y_test.shape[1]).expand_as(y_test)  # (m, T)
    return float(-log_p[pos_t[test_scored], y_test[test_scored]].mean())


def make_task(
    name: str, n_train: int, n_test: int, size: int, symbols: int, seed: int = 0
) -> SequenceTask:
    """Draw the training and held-out sets of one task and its trivial baseline.

    ``name`` ``"sort"`` (:func:`lnbook.data.sort_task`, inputs of length ``2 * size``) or
    ``"recall"`` (:func:`lnbook.data.associative_recall`, ``size`` pairs, length ``2 * size + 2``);
    ``symbols`` content symbols; the training set is drawn with ``seed``, the held-out set with
    ``seed + 10007``.
    """
    if name not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {name!r}")
    make = sort_task if name == "sort" else associative_recall
    x, y = make(n_train, size, symbols, seed=seed)
    x_test, y_test = make(n_test, size, symbols, seed=seed + _TEST_SEED_OFFSET)
    return SequenceTask(name, x, y, x_test, y_test, vocab_size=symbols + 1,
                        uniform_loss=math.log(symbols),
                        baseline_loss=position_unigram_loss(y, y_test, symbols))


def sequence_metrics(model: Transformer, x: Tensor, y: Tensor) -> dict[str, float]:
    """Held-out ``loss`` (nats per scored token), ``accuracy`` and ``max_logit`` (the largest
    attention logit of any block) of a model; call under ``torch.no_grad()`` in eval mode.
    """
    dev = next(model.parameters()).device
    x, y = x.to(dev), y.to(dev)
    logits = model(x)  # (n, T, V)
    scored = y != IGNORE_INDEX  # (n, T)
    right = (logits.argmax(-1) == y) & scored  # (n, T)
    return {"loss": float(sequence_loss(logits, y)),
            "accuracy": float(right.sum() / scored.sum()),
            "max_logit": max(max_attention_logits(model))}


def linear_warmup(optimizer: torch.optim.Optimizer, warmup: int) -> torch.optim.Optimizer:
    """Ramp every group's learning rate linearly: update ``t`` (1-based) uses ``lr * min(1, t /
    warmup)``.

    A step pre-hook that reads the updates done from Adam's ``step`` state, so a resumed run
    continues the ramp; the peak rate is kept in each group as ``"peak_lr"``. Returns ``optimizer``.
    """
    if isinstance(warmup, bool) or not (isinstance(warmup, int) and warmup >= 1):
        raise ValueError(f"warmup must be an int >= 1 (updates), got {warmup!r}")
    for group in optimizer.param_groups:
        group.setdefault("peak_lr", group["lr"])

    def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in opt.param_groups:
            state = opt.state.get(group["params"][0], {})
            done = int(state["step"]) if "step" in state else 0  # updates applied so far
            group["lr"] = group["peak_lr"] * min(1.0, (done + 1) / warmup)

    optimizer.register_step_pre_hook(hook)
    return optimizer


def train_transformer(
    job: Job,
    model_config: TransformerConfig,
    task: SequenceTask,
    *,
    lr: float,
    steps: int,
    batch_size: int,
    eval_every: int,
    warmup: int = 0,
    measure: Callable[[Transformer], dict[str, Any]] | None = None,
) -> tuple[History, dict[str, Any]]:
    """Train one model for one (variant, seed) job of a sweep; returns ``(history, info)``.

    The model is built under ``torch.manual_seed(job.seed)`` and trained with Adam (``lr``, optional
    :func:`linear_warmup`) by :func:`lnbook.fit` on batches shuffled with the job's seed;
    :func:`sequence_metrics` runs every ``eval_every`` updates. A run whose loss stops being finite
    is recorded as diverged: later evaluations repeat the metrics at initialization (Wortsman et al.
    2024; ``max_logit`` keeps its last value). ``info``: ``diverged``, ``diverged_at`` and what
    ``measure(model)`` returns (not called after a divergence).
    """
    torch.manual_seed(job.seed)
    model = Transformer.from_config(model_config)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    if warmup:
        linear_warmup(opt, warmup)
    evals: list[tuple[int, dict[str, float]]] = []
    losses: list[float] = []

    def eval_fn(m: nn.Module) -> dict[str, float]:
        metrics = sequence_metrics(m, task.x_test, task.y_test)
        evals.append((len(losses), metrics))
        return metrics

    def loss_fn(m: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
        loss = sequence_loss(m(batch[0]), batch[1])
        losses.append(float(loss.detach()))
        return loss

    try:
        hist = fit(model, Batches(task.x, task.y, batch_size=batch_size, seed=job.seed), opt,
                   steps=steps, eval_every=eval_every, eval_fn=eval_fn, device=job.device,
                   seed=job.seed, checkpoint=job.checkpoint, loss_fn=loss_fn, bar=job.bar,
                   label=job.label)
        extra = {} if measure is None else dict(measure(model))
        return hist, {"diverged": False, "diverged_at": None, **extra}
    except FloatingPointError:
        at = len(losses)  # the update whose loss was not finite
    initial = dict(evals[0][1])
    hist = History(steps=list(range(1, at)), losses=losses[: at - 1])
    last_logit = evals[-1][1]["max_logit"]
    for s in sorted({*range(0, steps, eval_every), steps}):
        done = [m for step, m in evals if step == s]
        hist.eval_steps.append(s)
        hist.metrics.append(done[0] if done else {**initial, "max_logit": last_logit})
    return hist, {"diverged": True, "diverged_at": at}


def sweep_task(name: str, variants: Mapping[str, Any],
               train_one: Callable[..., tuple[History, dict[str, Any]]], config: Any,
               device: str | torch.device, out: str | os.PathLike | None,
               seeds: Sequence[int] | None) -> Results:
    """:func:`lnbook.experiments.runner.sweep` of ``train_one(job, config=config, task=task)`` on
    ``config``'s task (made once); ``Results.info`` holds ``task``, ``uniform_loss`` and
    ``baseline_loss``.
    """
    task = make_task(config.task, config.n_train, config.n_test, config.size, config.symbols)
    return sweep(name, variants, tuple(config.seeds if seeds is None else seeds),
                 partial(train_one, config=config, task=task), config=config, device=device,
                 out=out, checkpoint=config.checkpoint, steps=config.steps,
                 info={"task": config.task, "uniform_loss": task.uniform_loss,
                       "baseline_loss": task.baseline_loss},
                 threads=config.threads, workers=config.workers)
