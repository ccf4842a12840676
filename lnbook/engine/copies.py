"""The training loop of copies of a model trained as one (a stacked job of
:func:`~lnbook.engine.runner.sweep`:
``reader``, ``draw``, ``handwriting``, ``mnist``, ``attention_geometry``), with checkpoint and
resume as :func:`~lnbook.engine.train.fit` has them.

Copy ``k``'s loss depends only on its own parameters, so the gradient of the summed losses is
each copy's own, and an elementwise optimizer (Adam) makes each copy's update as ``fit`` would.
Copies with a learning rate of their own are parameter groups
(:meth:`~lnbook.engine.stack.Stack.param_groups`), each with its own warm-up
(:func:`linear_warmup`); a copy whose loss stops being finite can be left behind while the
others train on (``diverged``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from lnbook.checks import check_size
from lnbook.engine.train import (
    History,
    _rng_state,
    _set_rng_state,
    load_checkpoint,
    max_updates,
    note_smoke,
    progress_enabled,
    restore,
)

__all__ = ["AUTOCAST_DTYPES", "linear_warmup", "train_copies"]

#: The dtypes :func:`train_copies` can train in under :class:`torch.autocast`.
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)

State = nn.Module | Mapping[str, Tensor]


def _tensors(state: State | None) -> dict[str, Tensor]:
    """The tensors a checkpoint keeps of ``state`` (a module's state dict, or the mapping)."""
    if state is None:
        return {}
    return dict(state.state_dict() if isinstance(state, nn.Module) else state)


def _save(path: Path, state: State | None, opt: torch.optim.Optimizer, generators:
          Sequence[torch.Generator], step: int, steps: int, histories: list[History],
          rng: dict[str, Any] | None = None, diverged: list[int | None] | None = None
          ) -> None:
    """Everything a stacked run needs to go on: parameters (and buffers), the optimizer's
    moments, torch's and the copies' generators, the step and the histories (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    rng = dict(_rng_state() if rng is None else rng)
    rng.setdefault("generators", [g.get_state() for g in generators])
    torch.save({"step": step, "steps": steps, "copies": len(histories),
                "model": {k: v.detach().clone() for k, v in _tensors(state).items()},
                "optimizer": opt.state_dict(), "rng": rng,
                "history": [h.to_dict() for h in histories], "diverged": diverged}, tmp)
    os.replace(tmp, path)


def _resume(path: Path, state: State | None, opt: torch.optim.Optimizer,
            generators: Sequence[torch.Generator], histories: list[History],
            steps: int, diverged: list[int | None] | None) -> int:
    """Load ``path`` into the copies, optimizer and generators; fill ``histories``; return
    the step it holds."""
    saved = load_checkpoint(path, map_location="cpu")
    if saved.get("copies") != len(histories) or not isinstance(saved["history"], list):
        raise ValueError(f"checkpoint {path} holds {saved.get('copies', 'one model, not')} "
                         f"copies, not {len(histories)}; move it away to train from the start")
    if saved["step"] > steps:
        raise ValueError(f"checkpoint {path} is at step {saved['step']}, beyond steps={steps}")
    restore(path, saved, state, opt)
    _set_rng_state(saved["rng"])
    for g, s in zip(generators, saved["rng"]["generators"], strict=True):
        g.set_state(s)
    for h, d in zip(histories, saved["history"], strict=True):
        got = History.from_dict(d)
        got.step_times = h.step_times if got.step_times is None else got.step_times
        h.__dict__.update(got.__dict__)
    if diverged is not None:
        diverged[:] = saved.get("diverged") or [None] * len(histories)
    return int(saved["step"])


def train_copies(losses: Callable[[int], Tensor], evaluate: Callable[[], list[dict[str, float]]],
                 opt: torch.optim.Optimizer, histories: list[History], steps: int,
                 eval_every: int, progress: bool | None = False, label: str | None = None, *,
                 state: State | None = None, generators: Sequence[torch.Generator] = (),
                 checkpoint: str | os.PathLike | None = None, bar: tqdm | None = None,
                 diverged: list[int | None] | None = None,
                 autocast: torch.dtype | None = None) -> list[History]:
    """``steps`` updates of every copy; ``losses(step)`` is ``(M,)``, ``evaluate()`` one dict
    per copy, recorded before training, every ``eval_every`` updates and after the last.

    Args:
        losses: ``step -> (M,)`` losses of the copies, deterministic in ``step`` given the
            state of ``generators`` (the data position is the step).
        evaluate: ``() -> [metrics of copy k]``; opt: the optimizer over every copy.
        histories: one :class:`History` per copy, filled in place (and returned).
        progress, label: draw a tqdm bar (default not) named ``label``; or ``bar``: advance
            that bar (a sweep's) by ``M`` per update.
        state: the copies' parameters and buffers (a module, or name -> tensor), saved and
            restored with ``checkpoint``; generators: the random generators ``losses`` draws
            from (restored too, as is torch's global one).
        checkpoint: file written atomically at each evaluation and at the end; if it exists,
            training continues from it, to the numbers of an uninterrupted run. Ctrl-C saves
            the last finished update.
        diverged: one ``None`` per copy, filled in place: a copy whose loss stops being
            finite gets the update's number there and its loss is no longer recorded (its
            history ends the update before; the others train on, as copies never mix), and
            ``evaluate`` can read it. Without it a loss that is not finite raises
            :class:`FloatingPointError`.
        autocast: ``torch.bfloat16`` or ``torch.float16``: every update's ``losses(step)`` runs
            under :class:`torch.autocast` on the parameters' device (mixed precision: the
            operations autocast lists run in that dtype, the parameters, their gradients and the
            optimizer stay as they are); ``evaluate()`` runs as the caller wrote it. None: no
            autocast.

    Under :func:`~lnbook.engine.train.capped` it stops after the cap's updates (and
    evaluates there), and notes its parameters and seconds per update.
    """
    check_size("steps", steps)
    check_size("eval_every", eval_every)
    if autocast is not None and autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast must be None or one of {AUTOCAST_DTYPES}, got {autocast!r}")
    device_type = opt.param_groups[0]["params"][0].device.type
    steps = max_updates(steps)
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and state is None:
        raise ValueError("a checkpoint needs the copies' state (state=module or tensors)")
    if diverged is not None and len(diverged) != len(histories):
        raise ValueError(f"diverged needs one entry per copy ({len(histories)}), got "
                         f"{len(diverged)}")
    start = 0
    if path is not None and path.exists():
        start = _resume(path, state, opt, generators, histories, steps, diverged)
        tqdm.write(f"{label or 'copies'}: resuming from update {start} of {steps} ({path})",
                   file=sys.stderr)
    wall0 = histories[0].wall_time if start else 0.0
    t_start = time.perf_counter() - wall0

    def record(step: int) -> None:
        for h, metrics in zip(histories, evaluate(), strict=True):
            h.eval_steps.append(step)
            h.metrics.append(metrics)

    def save(done: int, rng: dict[str, Any] | None = None) -> None:
        for h in histories:
            h.wall_time = time.perf_counter() - t_start
        if path is not None:
            _save(path, state, opt, generators, done, steps, histories, rng, diverged)

    last_eval = histories[0].eval_steps[-1] if histories[0].eval_steps else None
    if last_eval != start and (start == 0 or start % eval_every == 0 or start == steps):
        record(start)  # before training, or an evaluation an interrupt cut short
    m = len(histories)
    own_bar = bar is None
    if own_bar:
        bar = tqdm(total=steps, initial=start, disable=not progress_enabled(progress),
                   desc=label)
    else:
        bar.update(start * m)

    def rng() -> dict[str, Any] | None:  # what a resumed run must start from
        if path is None:
            return None
        return {**_rng_state(), "generators": [g.get_state() for g in generators]}

    # `done` updates are finished and recorded, `mark` holds the generators' states after
    # them; `busy` is True while an update is half-applied
    done, busy, mark = start, False, rng()
    times: list[float] = []
    try:
        for step in range(start, steps):
            t0 = time.perf_counter()
            with (torch.autocast(device_type, dtype=autocast) if autocast is not None
                  else contextlib.nullcontext()):
                loss = losses(step)  # (M,)
            opt.zero_grad(set_to_none=True)
            loss.sum().backward()
            values = loss.tolist()
            if diverged is None and not all(np.isfinite(values)):
                raise FloatingPointError(f"the training losses are {values} at update "
                                         f"{step + 1}")
            busy = True
            opt.step()
            for k, (h, v) in enumerate(zip(histories, values, strict=True)):
                if diverged is not None and diverged[k] is None and not np.isfinite(v):
                    diverged[k] = step + 1
                if diverged is None or diverged[k] is None:
                    h.steps.append(step + 1)
                    h.losses.append(v)
            done, busy, mark = step + 1, False, rng()
            times.append(time.perf_counter() - t0)
            bar.update(1 if own_bar else m)
            if done % eval_every == 0 or done == steps:
                record(done)
                save(done)
    except KeyboardInterrupt:
        if path is not None and not busy and done > start:
            save(done, mark)  # the copies and the optimizer hold update `done` exactly
            tqdm.write(f"{label or 'copies'}: interrupted; saved update {done} of {steps} "
                       f"to {path}", file=sys.stderr)
        raise
    finally:
        if own_bar:
            bar.close()
    for h in histories:
        h.wall_time = time.perf_counter() - t_start
    note_smoke(sum(p.numel() for g in opt.param_groups for p in g["params"]), times)
    return histories


def linear_warmup(optimizer: torch.optim.Optimizer, warmup: int | Sequence[int]
                  ) -> torch.optim.Optimizer:
    """Ramp each parameter group's learning rate linearly: update ``t`` (1-based) uses
    ``lr * min(1, t / warmup)``; ``warmup``: updates, for every group or one per group (0: that
    group keeps its rate).

    A step pre-hook that reads the updates done from the optimizer's ``step`` state (Adam's),
    so a resumed run continues the ramp; each group keeps its peak rate as ``"peak_lr"``.
    Returns ``optimizer``.

    Example::

        >>> p = nn.Parameter(torch.zeros(1))
        >>> opt = linear_warmup(torch.optim.Adam([p], lr=0.4), warmup=4)
        >>> p.grad = torch.ones(1)
        >>> opt.step(); opt.param_groups[0]["lr"]
        0.1
    """
    groups = optimizer.param_groups
    ramps = [warmup] * len(groups) if isinstance(warmup, int) else list(warmup)
    if (isinstance(warmup, int) and not isinstance(warmup, bool) and warmup < 1) or \
            len(ramps) != len(groups) or any(
                isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in ramps):
        raise ValueError(f"warmup must be an int >= 1 (updates) or one int >= 0 per parameter "
                         f"group ({len(groups)}), got {warmup!r}")
    for group, ramp in zip(groups, ramps, strict=True):
        group.setdefault("peak_lr", group["lr"])
        group["warmup"] = ramp

    def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in opt.param_groups:
            if group["warmup"]:
                state = opt.state.get(group["params"][0], {})
                done = int(state["step"]) if "step" in state else 0  # updates applied so far
                group["lr"] = group["peak_lr"] * min(1.0, (done + 1) / group["warmup"])

    optimizer.register_step_pre_hook(hook)
    return optimizer
