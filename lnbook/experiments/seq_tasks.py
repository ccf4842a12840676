"""What the Transformer experiments of Part II share: a task, its trivial baseline, one run.

Not an experiment itself (it is not registered in :data:`lnbook.experiments.EXPERIMENTS`); the
experiments ``rmsnorm`` (chapter "RMSNorm", claim P02), ``placement`` (chapter "Where the norm
goes", P04-P05) and ``qk_norm`` (chapter "QK-norm and attention-logit growth", P08-P09) import
it, as they import ``lnbook.experiments.protocol``, so that the three train the same small
model on the same task in the same way:

- :class:`TaskConfig` holds the settings the three share (the task, the model's size, the
  training loop, how the sweep runs) with their presets (:func:`presets`); each experiment's
  ``Config`` subclasses it, adds its own fields and sets its own defaults, and
  :meth:`TaskConfig.model_config` gives the Transformer every run builds;
- :func:`make_task` draws a training and a held-out set of the sort task
  (:func:`lnbook.data.sort_task`; the associative-recall task is the alternative) and
  computes the loss of the trivial predictor every comparison must beat
  (:func:`position_unigram_loss`);
- :func:`sequence_metrics` is what every evaluation records: held-out loss, accuracy on the
  scored tokens and the largest attention logit;
- :func:`linear_warmup` ramps the learning rate up over the first updates (Xiong et al., 2020);
- :func:`train_transformer` builds a :class:`lnbook.Transformer` under the job's seed and trains
  it with Adam through :func:`lnbook.fit`; a run whose loss stops being finite is recorded as
  diverged instead of stopping the sweep.

The three chapters train through :func:`lnbook.experiments.stacked.train_stacked` (every seed
and learning rate of one model as one computation), so ``workers`` and ``checkpoint`` of
:class:`TaskConfig` are not used there; :func:`train_transformer` is the run trained alone that
the tests hold each stacked copy to.
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

__all__ = [
    "TASKS",
    "TaskConfig",
    "presets",
    "SequenceTask",
    "make_task",
    "position_unigram_loss",
    "sequence_metrics",
    "linear_warmup",
    "train_transformer",
    "sweep_task",
]

TASKS = ("sort", "recall")
_TEST_SEED_OFFSET = 10_007  # the held-out set is drawn with another seed than the training set


@dataclass
class TaskConfig:
    """The settings every Part II sequence-task experiment shares; its ``Config`` subclasses it.

    Attributes:
        scale: ``"quick"`` or ``"paper"``.
        task: ``"sort"`` or ``"recall"`` (:func:`make_task`).
        size: sequence length to sort (or key-value pairs to recall).
        symbols: content symbols of the task.
        n_train, n_test: training and held-out sequences.
        d_model, n_heads, n_layers: the Transformer (causal, d_ff = 4 d_model).
        batch_size, steps, eval_every: sequences per update, updates, updates between
            evaluations.
        seeds: seeds of the runs (initialization and batch order).
        checkpoint: write per-run checkpoints under ``out/`` and resume from them.
        threads: torch CPU threads during the run (restored afterwards; None: leave as is).
        workers: runs trained at once, each in its own process, on a CPU (see
            :func:`lnbook.experiments.runner.sweep`; from a script, call the experiment's
            ``run`` under ``if __name__ == "__main__":``). Results do not depend on it.
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
        """The Transformer of this task (``symbols + 1`` token ids, this config's width,
        heads and depth, ``max_len = seq_len``), with ``fields`` of
        :class:`lnbook.transformer.TransformerConfig` set or replaced (``norm``,
        ``position``, ``n_layers``, ...)."""
        return TransformerConfig(**{"vocab_size": self.symbols + 1, "d_model": self.d_model,
                                    "n_heads": self.n_heads, "n_layers": self.n_layers,
                                    "max_len": seq_len, **fields})


_PAPER: dict[str, Any] = {
    "threads": None,
    "size": 32,
    "symbols": 64,
    "n_train": 200_000,
    "n_test": 2_000,
    "d_model": 512,
    "n_heads": 8,
    "n_layers": 6,
    "batch_size": 64,
    "steps": 20_000,
    "eval_every": 500,
    "checkpoint": True,
}


def presets(**paper: Any) -> dict[str, dict[str, Any]]:
    """The ``quick`` and ``paper`` presets of a :class:`TaskConfig` experiment: ``quick`` is
    the Config's defaults, ``paper`` the shared large settings (the task at size 32 over 64
    symbols, 200,000 sequences, a 6-block, 512-wide model, 20,000 updates of 64, checkpoints)
    with the experiment's own ``paper`` fields on top."""
    return {"quick": {}, "paper": {**_PAPER, **paper}}


@dataclass
class SequenceTask:
    """A training set, a held-out set and what a model that learnt nothing would score.

    Attributes:
        name: ``"sort"`` or ``"recall"``.
        x, y: training inputs and next-token targets, int64 ``(n_train, T)``; targets are
            :data:`lnbook.data.IGNORE_INDEX` where nothing is scored.
        x_test, y_test: the held-out set, ``(n_test, T)``.
        vocab_size: token ids a model needs (content symbols plus the separator).
        uniform_loss: ``log(content symbols)``, nats per scored token of a uniform guess.
        baseline_loss: held-out loss of the position-wise unigram predictor
            (:func:`position_unigram_loss`), the trivial predictor runs must beat.
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
    """Held-out loss of the best predictor that ignores the input: one histogram per position.

    For each scored position ``t`` the predictor outputs the frequencies of the target tokens
    at ``t`` in the training set (add-one smoothed), whatever the sequence; its mean
    cross-entropy on the scored targets of ``y_test`` is returned, in nats per token. For the
    sort task this is the distribution of the ``t``-th smallest of the random symbols, which
    is lower than ``log(vocab)``: a model must beat this number to show that it reads its input.

    Args:
        y_train, y_test: int64 targets ``(n, T)`` with :data:`IGNORE_INDEX` where not scored.
        vocab: the number of symbols a target can take (targets lie in ``[0, vocab)``).

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

    Args:
        name: ``"sort"`` (:func:`lnbook.data.sort_task`, ``size`` = sequence length; inputs
            have length ``2 * size``) or ``"recall"`` (:func:`lnbook.data.associative_recall`,
            ``size`` = key-value pairs; inputs have length ``2 * size + 2``).
        n_train, n_test: number of training and held-out sequences.
        size: see ``name``.
        symbols: number of content symbols (the separator is one more token id).
        seed: seed of the training set; the held-out set uses ``seed + 10007``.
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
    """Held-out ``loss`` (nats per scored token), ``accuracy`` and ``max_logit`` of a model.

    ``max_logit`` is the largest attention logit of any block on this batch
    (:func:`lnbook.transformer.max_attention_logits`). Call it under ``torch.no_grad()`` in
    eval mode, as :func:`lnbook.fit` runs its ``eval_fn``.
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
    """Ramp every group's learning rate linearly from ``lr / warmup`` to ``lr`` over ``warmup``.

    Update ``t`` (1-based) uses ``lr * min(1, t / warmup)``, then the rate stays at ``lr``: the
    warm-up stage of Vaswani et al. (2017) without the decay that follows it, the schedule
    Xiong et al. (2020) remove for Pre-LN. Implemented as a step pre-hook of ``optimizer``
    that reads the number of updates done from the optimizer's own state (Adam's ``step``), so
    a run resumed from a checkpoint continues the ramp where it stopped. The peak rate of each
    group is stored in the group as ``"peak_lr"``.

    Returns:
        ``optimizer`` (with the hook registered).
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

    The model is built with :meth:`lnbook.transformer.Transformer.from_config` under
    ``torch.manual_seed(job.seed)`` and trained with Adam (``lr``, optional
    :func:`linear_warmup` over ``warmup`` updates) on mini-batches of ``task``'s training set
    shuffled with the job's seed, by :func:`lnbook.fit`; every ``eval_every`` updates
    :func:`sequence_metrics` runs on the held-out set.

    A run whose training loss stops being finite is not an error here: the updates before it
    stay in the history, and every later evaluation is filled with the metrics of the model at
    initialization, the convention of Wortsman et al. (2024), whose learning-rate sensitivity
    counts a failed run at the loss it started from (``max_logit`` keeps the last value
    measured). ``info`` says ``{"diverged": bool, "diverged_at": update or None}``, plus
    what ``measure`` returns for the trained model (not called after a divergence).

    Args:
        job: from :func:`lnbook.experiments.runner.sweep`.
        model_config: the Transformer to build (its ``vocab_size`` and ``max_len`` must fit
            the task).
        task: from :func:`make_task`.
        lr: Adam's (peak) learning rate.
        steps, batch_size, eval_every: updates, sequences per update, updates between
            evaluations.
        warmup: updates of linear warm-up; 0 for none.
        measure: ``model -> dict`` of JSON values, called on the trained model (e.g. to
            record its learned gains).
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


def sweep_task(
    name: str,
    variants: Mapping[str, Any],
    train_one: Callable[..., tuple[History, dict[str, Any]]],
    config: Any,
    device: str | torch.device,
    out: str | os.PathLike | None,
    seeds: Sequence[int] | None,
) -> Results:
    """The sweep of a Part II experiment on ``config``'s sequence task (:func:`make_task`).

    Makes the task once, then runs :func:`lnbook.experiments.runner.sweep` with
    ``train_one(job, config=config, task=task)`` (a module-level function, so that
    ``config.workers > 1`` can train runs in worker processes) and ``config``'s seeds (or
    ``seeds``), checkpointing, steps, threads and workers. ``Results.info`` holds the task's
    name, ``uniform_loss`` and ``baseline_loss`` (the predictor every run must beat).
    """
    task = make_task(config.task, config.n_train, config.n_test, config.size, config.symbols)
    return sweep(name, variants, tuple(config.seeds if seeds is None else seeds),
                 partial(train_one, config=config, task=task), config=config, device=device,
                 out=out, checkpoint=config.checkpoint, steps=config.steps,
                 info={"task": config.task, "uniform_loss": task.uniform_loss,
                       "baseline_loss": task.baseline_loss},
                 threads=config.threads, workers=config.workers)
