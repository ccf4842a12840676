"""Train many copies of one small Transformer at once: seeds and learning rates stacked.

Not an experiment itself. At the book's sizes an update of a small model is mostly Python
overhead, so :func:`train_stacked` trains ``n`` copies as one computation with a leading model
dimension (:func:`torch.func.stack_module_state` and :func:`torch.func.vmap`). Each copy is the
model built under ``torch.manual_seed(seed)``, trained with Adam (:func:`adam_step`);
evaluations record, per copy, the held-out ``loss``, ``accuracy`` and the residual stream's
variance ``var_0`` (embeddings) ... ``var_L``. The Transformer experiments call it from the
train function of a stacked job of :func:`lnbook.engine.runner.sweep`; a loop of another shape
(:mod:`~lnbook.experiments.dyt_regime`) builds on its pieces :func:`stack_models`,
:func:`copy_loss`, :func:`adam_update` and :func:`unstack_model`.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from lnbook.checks import check_choice
from lnbook.data import IGNORE_INDEX
from lnbook.engine.train import Batches, History, max_updates, note_smoke
from lnbook.experiments.seq_tasks import SequenceTask
from lnbook.transformer import Transformer, TransformerConfig, sequence_loss

__all__ = ["StackedRun", "adam_step", "adam_update", "batch_indices", "copy_loss",
           "fit_batch_indices", "groups", "in_job_order", "stack_models", "stream_forward",
           "train_stacked", "unstack_model"]

ORDERS = ("stacked", "fit")  # the batch orders of train_stacked

BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults


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


class _Stream(nn.Module):
    """``stream_forward`` as a module's forward, for :func:`torch.func.functional_call`."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: Tensor, with_var: bool = True) -> tuple[Tensor, Tensor]:
        return stream_forward(self.model, idx, with_var)


def adam_step(params: Sequence[Tensor], grads: Sequence[Tensor], state: dict[str, Any],
              lr: Tensor) -> None:
    """One in-place update of Adam on stacked parameters, one learning rate per copy.

    ``params[i]`` is ``(n, *shape_i)``, ``lr`` ``(n,)``; :class:`torch.optim.Adam`'s defaults:
    ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``,
    ``p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``. ``state`` starts as ``{}``.
    """
    b1, b2 = BETAS
    if not state:
        state.update(t=0, m=[torch.zeros_like(p) for p in params],
                     v=[torch.zeros_like(p) for p in params])
    state["t"] += 1
    c1, c2 = 1 - b1 ** state["t"], 1 - b2 ** state["t"]
    with torch.no_grad():
        for p, g, m, v in zip(params, grads, state["m"], state["v"], strict=True):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            rate = lr.view(-1, *[1] * (p.dim() - 1))  # (n, 1, ...)
            p.sub_(rate * (m / c1) / ((v / c2).sqrt() + ADAM_EPS))


def stack_models(model_config: TransformerConfig, seeds: Sequence[int], dev: torch.device
                 ) -> tuple[dict[str, Tensor], dict[str, Tensor], nn.Module]:
    """The model of each seed (built under ``torch.manual_seed(seed)``), stacked on ``dev``
    (parameters and buffers ``{name: (n, ...)}``), and a meta copy to call them with
    (:func:`copy_loss`, :func:`adam_update`; its forward is :func:`stream_forward`'s)."""
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(_Stream(Transformer.from_config(model_config)))
    params, buffers = stack_module_state(models)
    params = {k: v.detach().to(dev) for k, v in params.items()}
    buffers = {k: v.to(dev) for k, v in buffers.items()}
    return params, buffers, copy.deepcopy(models[0]).to("meta")


def copy_loss(base: nn.Module, p: dict, b: dict, x: Tensor, y: Tensor) -> Tensor:
    """The loss of one copy (``base`` of :func:`stack_models` with ``p``, ``b``) on ids ``x``
    and targets ``y``; vmap it over the copies."""
    return sequence_loss(functional_call(base, (p, b), (x, False))[0], y)


def adam_update(base: nn.Module, params: dict, buffers: dict, state: dict, rate: Tensor,
                x: Tensor, y: Tensor) -> Tensor:
    """One :func:`adam_step` of every copy of :func:`stack_models` on its batch ``x``, ``y``
    ``(n, B, T)`` at its rate ``rate`` ``(n,)``, in place; the losses before it ``(n,)``."""
    p = {k: v.detach().requires_grad_() for k, v in params.items()}
    loss = vmap(functools.partial(copy_loss, base))(p, buffers, x, y)  # (n,)
    grads = torch.autograd.grad(loss.sum(), list(p.values()))
    adam_step(list(params.values()), grads, state, rate)
    return loss.detach()


def unstack_model(model_config: TransformerConfig, params: dict, buffers: dict, k: int
                  ) -> Transformer:
    """Copy ``k`` of the stacked ``params`` and ``buffers`` as a model on the CPU."""
    model = Transformer.from_config(model_config)
    model.load_state_dict({n[len("model."):]: t[k].detach().cpu().clone()
                           for n, t in (params | buffers).items()})
    return model


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
                  stream_var: bool = True, bar: Any = None) -> list[StackedRun]:
    """Train one copy of the model per (learning rate, seed), all at once.

    Copies are ordered learning rate first. Copy ``(lr, seed)`` starts from the model built under
    ``torch.manual_seed(seed)`` and sees the batches drawn for ``seed``. Every ``eval_every``
    updates (and before the first) the held-out ``loss``, ``accuracy`` and ``var_0 ... var_L`` are
    recorded on the first ``n_eval`` held-out sequences. A copy whose loss stops being finite is
    marked ``diverged`` (``diverged_at``) and its later evaluations repeat its metrics at
    initialization; copies never mix. ``info``: ``seed``, ``lr``, ``diverged``, ``diverged_at``.

    Args:
        warmup: updates of linear warm-up (:func:`~lnbook.experiments.seq_tasks.linear_warmup`),
            one for all or one per rate (then recorded in ``info["warmup"]``).
        order: ``"stacked"`` (:func:`batch_indices`) or ``"fit"`` (:func:`fit_batch_indices`).
        max_logit: also record ``max_logit`` (a diverged copy keeps its last value).
        measure: ``model -> dict`` merged into the ``info`` of each copy that did not diverge.
        stream_var: record ``var_0 ... var_L``.
        bar: a progress bar (tqdm's, e.g. a sweep job's ``job.bar``) advanced by one per copy
            and update.
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
    steps = max_updates(steps)  # a smoke run's cap (lnbook.engine.capped), if any
    jobs = [(float(lr), int(seed)) for lr in lrs for seed in seeds]
    dev = task.x.device  # the copies train where the task's tensors are
    ramp = torch.tensor([float(w) for w in ramps for _ in seeds], device=dev)  # (n,)
    params, buffers, base = stack_models(model_config, [s for _, s in jobs], dev)  # (n, ...)

    def one(p: dict, b: dict, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, var = functional_call(base, (p, b), (x, stream_var))  # (B, T, V), (L + 1,)
        scored = y != IGNORE_INDEX  # (B, T)
        right = ((logits.argmax(-1) == y) & scored).sum() / scored.sum()
        if max_logit:  # the largest attention logit of any block, read after the forward set it
            top = torch.stack([b.attn.last_max_logit for b in base.model.blocks]).amax()
            var = torch.cat([var, top.view(1)])  # (L + 2,)
        return sequence_loss(logits, y), right, var

    evaluate = torch.no_grad()(vmap(one, in_dims=(0, 0, None, None)))
    x_test, y_test = task.x_test[:n_eval], task.y_test[:n_eval]
    draw = batch_indices if order == "stacked" else fit_batch_indices
    rows = torch.stack([draw(s, len(task.x), steps, batch_size) for _, s in jobs]).to(dev)
    lr = torch.tensor([r for r, _ in jobs], device=dev)  # (n,)
    hists = [History() for _ in jobs]
    diverged_at: list[int | None] = [None] * len(jobs)
    state: dict[str, Any] = {}
    initial: list[dict[str, float]] = []

    def record(step: int) -> None:
        loss, acc, var = evaluate(params, buffers, x_test, y_test)  # (n,), (n,), (n, L+1)
        n_var = var.shape[1] - int(max_logit)
        loss, acc, var = loss.tolist(), acc.tolist(), var.tolist()  # one copy off a GPU
        for k, h in enumerate(hists):
            m = {"loss": loss[k], "accuracy": acc[k],
                 **{f"var_{i}": v for i, v in enumerate(var[k][:n_var])}}
            if max_logit:
                m["max_logit"] = var[k][-1]
            if step == 0:
                initial.append(m)
            if diverged_at[k] is not None:  # the model at initialization (Wortsman et al. 2024)
                m = {**initial[k], **({"max_logit": h.metrics[-1]["max_logit"]}
                                      if max_logit else {})}
            h.eval_steps.append(step)
            h.metrics.append(m)

    record(0)
    times = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        idx = rows[:, step - 1]  # (n, batch)
        rate = lr if not ramp.any() else lr * torch.where(
            ramp > 0, (step / ramp.clamp(min=1)).clamp(max=1), 1.0)  # (n,)
        losses = adam_update(base, params, buffers, state, rate, task.x[idx], task.y[idx]).tolist()
        for k, (h, value) in enumerate(zip(hists, losses, strict=True)):
            if diverged_at[k] is None and not math.isfinite(value):
                diverged_at[k] = step
            if diverged_at[k] is None:
                h.steps.append(step)
                h.losses.append(value)
        times.append(time.perf_counter() - t0)
        if bar is not None:
            bar.update(len(jobs))
        if step % eval_every == 0 or step == steps:
            record(step)
    note_smoke(sum(p[0].numel() for p in params.values()), times)  # one copy's parameters
    out = []
    for k, ((r, seed), h) in enumerate(zip(jobs, hists, strict=True)):
        model = unstack_model(model_config, params, buffers, k)
        info = {"seed": seed, "lr": r, "diverged": diverged_at[k] is not None,
                "diverged_at": diverged_at[k]}
        if not isinstance(warmup, int) or warmup:
            info["warmup"] = int(ramp[k])
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
