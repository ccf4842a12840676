"""The one-at-a-time reference run that each copy of
:func:`lnbook.experiments.stacked.train_stacked` is held to (moved here from ``seq_tasks``: only
the tests train a Part II Transformer alone)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lnbook.data import IGNORE_INDEX
from lnbook.engine import linear_warmup
from lnbook.engine.job import Job
from lnbook.engine.train import Batches, History, fit
from lnbook.experiments.seq_tasks import SequenceTask
from lnbook.transformer import Transformer, TransformerConfig, max_attention_logits, sequence_loss


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
