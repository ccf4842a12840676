"""Train many copies of one small Transformer at once: seeds and learning rates stacked.

Not an experiment itself. At the book's sizes an update of a small model is mostly Python
overhead, so :func:`train_stacked` trains ``n`` copies as one model with a leading copy
dimension (:class:`lnbook.engine.Stack`), in the engine's loop for copies
(:func:`lnbook.engine.copies.train_copies`): each copy is the model built under
``torch.manual_seed(seed)``, trained by :class:`torch.optim.Adam` with its own learning rate
and warm-up (one parameter group per rate, :func:`lnbook.engine.copies.linear_warmup`); evaluations
record, per copy, the held-out ``loss``, ``accuracy`` and the residual stream's variance
``var_0`` (embeddings) ... ``var_L``. The Transformer experiments call it from the train
function of a stacked job of :func:`lnbook.engine.runner.sweep`; a loop of another shape
(:mod:`~lnbook.experiments.dyt_regime`) builds on :func:`copy_loss` and :func:`batch_indices`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lnbook.checks import check_choice
from lnbook.data import IGNORE_INDEX
from lnbook.engine import Batches, History, Stack, linear_warmup, max_updates, train_copies
from lnbook.experiments.seq_tasks import SMOKE_BATCH, SequenceTask
from lnbook.transformer import Transformer, TransformerConfig, sequence_loss

__all__ = ["StackedRun", "batch_indices", "copy_loss", "fit_batch_indices", "groups",
           "in_job_order", "stack_models", "stream_forward", "train_stacked"]

ORDERS = ("stacked", "fit")  # the batch orders of train_stacked


def stream_forward(model: Transformer, idx: Tensor, with_var: bool = True
                   ) -> tuple[Tensor, Tensor]:
    """Logits ``(B, T, V)`` of ``model`` on ``idx`` ``(B, T)`` and the variance of each of ``x_0 ..
    x_L``, ``(L + 1,)`` (empty with ``with_var=False``): ``model(idx)`` without the argument checks
    that cannot run under :func:`torch.func.vmap`.
    """
    x = model.tok_emb(idx) + model.pos_emb.weight[: idx.shape[-1]]  # (B, T, D)
    var = [x.var()] if with_var else []
    for block in model.blocks:
        x = block(x)  # (B, T, D)
        if with_var:
            var.append(x.var())
    logits = model.head(model.final_norm(x))  # (B, T, V)
    return logits, torch.stack(var) if with_var else x.new_zeros(0)  # (L + 1,) or (0,)


def stack_models(model_config: TransformerConfig, seeds: Sequence[int],
                 blocks: Sequence[int] | None = None) -> Stack:
    """The model of each seed (built under ``torch.manual_seed(seed)``) as one
    :class:`~lnbook.engine.Stack` (on the CPU; ``blocks`` as the Stack's)."""
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(Transformer.from_config(model_config))
    return Stack(models, blocks=blocks)


def copy_loss(model: Transformer, x: Tensor, y: Tensor) -> Tensor:
    """The training loss of one copy on ids ``x`` and targets ``y`` (``Stack.call`` it)."""
    return sequence_loss(stream_forward(model, x, False)[0], y)


def _copy_metrics(model: Transformer, x: Tensor, y: Tensor, stream_var: bool,
                  max_logit: bool) -> tuple[Tensor, Tensor, Tensor]:
    """One copy's held-out loss, accuracy and ``var_0 .. var_L`` (then the largest attention
    logit of any block, read after the forward set it)."""
    logits, var = stream_forward(model, x, stream_var)  # (B, T, V), (L + 1,)
    scored = y != IGNORE_INDEX  # (B, T)
    right = ((logits.argmax(-1) == y) & scored).sum() / scored.sum()
    if max_logit:
        top = torch.stack([b.attn.last_max_logit for b in model.blocks]).amax()
        var = torch.cat([var, top.view(1)])  # (L + 2,)
    return sequence_loss(logits, y), right, var


def batch_indices(seed: int, n: int, steps: int, batch_size: int) -> Tensor:
    """The training rows of each update for one seed, ``(steps, batch_size)``: epochs of random
    permutations of ``n`` rows drawn with a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    need = steps * batch_size
    perms = [torch.randperm(n, generator=g) for _ in range(math.ceil(need / n))]
    return torch.cat(perms)[:need].view(steps, batch_size)


def fit_batch_indices(seed: int, n: int, steps: int, batch_size: int) -> Tensor:
    """The rows of each update in the order of :class:`lnbook.engine.train.Batches` with ``seed``,
    ``(steps, batch_size)``: the batches :func:`lnbook.fit` gives a run of that seed."""
    batches = Batches(torch.arange(n), batch_size=batch_size, seed=seed)
    return torch.stack([batches(step)[0] for step in range(steps)])


class StackedRun:
    """One trained copy: its ``history``, ``info`` and trained ``model``."""

    def __init__(self, history: History, info: dict[str, Any], model: Transformer) -> None:
        self.history, self.info, self.model = history, info, model


def train_stacked(model_config: TransformerConfig, task: SequenceTask, seeds: Sequence[int],
                  lrs: Sequence[float], *, steps: int, batch_size: int, eval_every: int,
                  n_eval: int | None = None, warmup: int | Sequence[int] = 0,
                  order: str = "stacked", max_logit: bool = False,
                  measure: Callable[[Transformer], dict[str, Any]] | None = None,
                  stream_var: bool = True, bar: Any = None,
                  autocast: torch.dtype | None = None) -> list[StackedRun]:
    """Train one copy of the model per (learning rate, seed), all at once.

    Copies are ordered learning rate first. Copy ``(lr, seed)`` starts from the model built under
    ``torch.manual_seed(seed)`` and sees the batches drawn for ``seed``. Every ``eval_every``
    updates (and before the first) the held-out ``loss``, ``accuracy`` and ``var_0 ... var_L`` are
    recorded on the first ``n_eval`` held-out sequences. A copy whose loss stops being finite is
    marked ``diverged`` (``diverged_at``) and its later evaluations repeat its metrics at
    initialization; copies never mix. ``info``: ``seed``, ``lr``, ``diverged``, ``diverged_at``.

    Args:
        warmup: updates of linear warm-up (:func:`lnbook.engine.copies.linear_warmup`), one for
            all or one per rate (then recorded in ``info["warmup"]``).
        order: ``"stacked"`` (:func:`batch_indices`) or ``"fit"`` (:func:`fit_batch_indices`).
        max_logit: also record ``max_logit`` (a diverged copy keeps its last value).
        measure: ``model -> dict`` merged into the ``info`` of each copy that did not diverge.
        stream_var: record ``var_0 ... var_L``.
        bar: a progress bar (tqdm's, e.g. a sweep job's ``job.bar``) advanced by one per copy
            and update.
        autocast: train in mixed precision, the training losses under :class:`torch.autocast`
            in this dtype (:func:`lnbook.engine.copies.train_copies`); the held-out metrics are
            computed in the parameters' dtype. None: no autocast.

    In a smoke run (:func:`lnbook.engine.train.capped`) a batch holds at most
    :data:`~lnbook.experiments.seq_tasks.SMOKE_BATCH` sequences (a paper-scale update of
    several copies takes minutes on a CPU).
    """
    if not seeds or not lrs or min(steps, batch_size, eval_every) < 1:
        raise ValueError("train_stacked needs seeds, learning rates, and steps, batch_size, "
                         f"eval_every >= 1; got {len(seeds)} seeds, {len(lrs)} rates, "
                         f"steps={steps}, batch_size={batch_size}, eval_every={eval_every}")
    if any(not (isinstance(r, int | float) and r > 0) for r in lrs):
        raise ValueError(f"learning rates must be numbers > 0, got {list(lrs)}")
    check_choice("order", order, ORDERS)
    ramps = [warmup] * len(lrs) if isinstance(warmup, int) else list(warmup)
    if len(ramps) != len(lrs) or any(
            isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in ramps):
        raise ValueError(f"warmup must be an int >= 0 or one per learning rate, got {warmup!r}")
    jobs = [(float(lr), int(seed)) for lr in lrs for seed in seeds]
    dev = task.x.device  # the copies train where the task's tensors are
    stack = stack_models(model_config, [s for _, s in jobs], [len(seeds)] * len(lrs)).to(dev)
    opt = linear_warmup(torch.optim.Adam(stack.param_groups(lr=[float(r) for r in lrs]),
                                         foreach=True),
                        ramps)
    x_test, y_test = task.x_test[:n_eval], task.y_test[:n_eval]
    draw = batch_indices if order == "stacked" else fit_batch_indices
    n_rows = max_updates(steps)  # a smoke run's cap (lnbook.engine.capped), if any
    if max_updates() is not None:
        batch_size = min(batch_size, SMOKE_BATCH)
    rows = torch.stack([draw(s, len(task.x), n_rows, batch_size) for _, s in jobs]).to(dev)
    hists = [History() for _ in jobs]
    diverged_at: list[int | None] = [None] * len(jobs)
    metrics = partial(_copy_metrics, stream_var=stream_var, max_logit=max_logit)

    def losses(step: int) -> Tensor:  # (copies,)
        idx = rows[:, step]  # (copies, batch)
        return stack.call(copy_loss, task.x[idx], task.y[idx])

    def evaluate() -> list[dict[str, float]]:
        with torch.no_grad():
            loss, acc, var = stack.call(metrics, x_test, y_test, shared=(0, 1))
        n_var = var.shape[1] - int(max_logit)
        loss, acc, var = loss.tolist(), acc.tolist(), var.tolist()  # one copy off a GPU
        out = []
        for k, h in enumerate(hists):
            m = {"loss": loss[k], "accuracy": acc[k],
                 **{f"var_{i}": v for i, v in enumerate(var[k][:n_var])}}
            if max_logit:
                m["max_logit"] = var[k][-1]
            if diverged_at[k] is not None:  # the model at initialization (Wortsman et al. 2024)
                m = {**h.metrics[0], **({"max_logit": h.metrics[-1]["max_logit"]}
                                        if max_logit else {})}
            out.append(m)
        return out

    train_copies(losses, evaluate, opt, hists, steps, eval_every, bar=bar,
                 diverged=diverged_at, autocast=autocast)
    out = []
    for k, ((r, seed), h, model) in enumerate(zip(jobs, hists, stack.unstack(), strict=True)):
        info = {"seed": seed, "lr": r, "diverged": diverged_at[k] is not None,
                "diverged_at": diverged_at[k]}
        if not isinstance(warmup, int) or warmup:
            info["warmup"] = ramps[k // len(seeds)]
        if measure is not None and diverged_at[k] is None:
            info.update(measure(model))
        out.append(StackedRun(h, info, model))
    return out


def groups(variants: dict[str, tuple[Any, Any]]) -> dict[Any, list[Any]]:
    """A stacked job's variants ``name -> (model, setting)`` grouped by model, in order:
    ``{model: [setting, ...]}`` (the copies of one :func:`train_stacked` call).

    Example::

        >>> groups({"pre/lr0.1": ("pre", 0.1), "post/lr0.1": ("post", 0.1),
        ...         "pre/lr1": ("pre", 1.0)})
        {'pre': [0.1, 1.0], 'post': [0.1]}
    """
    out: dict[Any, list[Any]] = {}
    for model, setting in variants.values():
        out.setdefault(model, []).append(setting)
    return out


def in_job_order(job: Any, trained: dict[tuple[str, int], StackedRun]
                 ) -> list[tuple[History, dict[str, Any]]]:
    """``(history, info)`` of each ``(variant, seed)`` of ``job.pairs``, in that order: what a
    stacked job of :func:`lnbook.engine.runner.sweep` returns."""
    return [(trained[pair].history, trained[pair].info) for pair in job.pairs]
