"""The training loop of section 6's experiments (`06_*`): :func:`fit`, with checkpoint and
resume. The batch for step ``s`` is a pure function of ``s`` (:class:`Batches`) and the
checkpoint holds model, optimizer, generator states and history, so a resumed run ends
bit-identical to an uninterrupted one (on CPU; ``tests/test_train.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from lnbook.checks import check_size
from lnbook.device import resolve_device

__all__ = ["Batches", "CannotWrite", "History", "UnreadableFile", "capped", "fit",
           "load_checkpoint", "max_updates", "progress_enabled"]

_CAP: contextvars.ContextVar[int | None] = contextvars.ContextVar("lnbook_cap", default=None)
_MEASURED: contextvars.ContextVar[list | None] = contextvars.ContextVar("lnbook_measured",
                                                                        default=None)


@contextlib.contextmanager
def capped(n: int | None) -> Iterator[list[dict[str, float]]]:
    """Every training loop in the body stops after ``n`` updates (None: no cap) and evaluates
    once at the end: the smoke run of ``python -m lnbook run NAME --max-updates N``.

    A sweep under a cap records ``max_updates`` in its config (so its files never pass for a
    full run's). Yields a list that each loop in this process appends to:
    ``{"parameters": ..., "seconds_per_update": ...}``. Loops read the cap through
    :func:`max_updates`."""
    if n is not None:
        check_size("max_updates", n)
    measured: list[dict[str, float]] = []
    tokens = _CAP.set(n), _MEASURED.set(measured)
    try:
        yield measured
    finally:
        _CAP.reset(tokens[0])
        _MEASURED.reset(tokens[1])


def max_updates(steps: int | None = None) -> int | None:
    """The cap of :func:`capped` in force (None: none); with ``steps``, the updates a loop of
    ``steps`` updates makes under it (``min(steps, cap)``). Every training loop honours it:
    :func:`fit`, :func:`~lnbook.engine.copies.train_copies`, and an experiment's own loop with
    ``steps = engine.max_updates(steps)``; data built for ``steps`` updates can be cut
    short the same way."""
    cap = _CAP.get()
    if steps is None:
        return cap
    return steps if cap is None else min(int(steps), cap)


def note_smoke(parameters: int, seconds: list[float]) -> None:
    """Record, under :func:`capped`, a loop's parameter count and seconds per update (the
    first update, which warms up, left out when there are more)."""
    measured = _MEASURED.get()
    if measured is not None and seconds:
        timed = seconds[1:] or seconds
        measured.append({"parameters": int(parameters),
                         "seconds_per_update": sum(timed) / len(timed)})

Batch = tuple[Tensor, ...]


@dataclass
class History:
    """What a training run recorded: per update ``steps`` and training ``losses``; at
    ``eval_steps`` (0 = before training) the ``metrics`` dicts of ``eval_fn``; ``wall_time``
    (seconds, summed over resumed sessions) and optional ``step_times``."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    wall_time: float = 0.0
    step_times: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (see :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        """Rebuild a history from :meth:`to_dict` output (e.g. read back from JSON)."""
        return cls(
            steps=[int(s) for s in d["steps"]],
            losses=[float(v) for v in d["losses"]],
            eval_steps=[int(s) for s in d["eval_steps"]],
            metrics=[{k: float(v) for k, v in m.items()} for m in d["metrics"]],
            wall_time=float(d.get("wall_time", 0.0)),
            step_times=None if d.get("step_times") is None else [float(t) for t in d["step_times"]],
        )

    def metric(self, name: str) -> list[float]:
        """The values of one metric over ``eval_steps``."""
        return [m[name] for m in self.metrics]


class Batches:
    """Mini-batches as a pure function of the step: ``batches(step) -> tuple of tensors``.

    Epoch ``e`` visits the examples in an order drawn from ``(seed, e)`` alone; an incomplete
    last batch is dropped.

    Example::

        >>> batches = Batches(torch.randn(10, 3), torch.arange(10), batch_size=4)
        >>> x, y = batches(0)
        >>> x.shape, y.shape
        (torch.Size([4, 3]), torch.Size([4]))
    """

    def __init__(self, *tensors: Tensor, batch_size: int, seed: int = 0) -> None:
        if not tensors:
            raise ValueError("Batches needs at least one tensor")
        if not all(isinstance(t, Tensor) for t in tensors):
            raise TypeError("Batches takes tensors, e.g. Batches(x, y, batch_size=32)")
        n = tensors[0].shape[0] if tensors[0].dim() > 0 else 0
        if any(t.dim() == 0 or t.shape[0] != n for t in tensors):
            raise ValueError(
                "all tensors must share their first dimension, got shapes "
                f"{[tuple(t.shape) for t in tensors]}"
            )
        if not (isinstance(batch_size, int) and 1 <= batch_size <= n):
            raise ValueError(f"batch_size must be an int in [1, {n}], got {batch_size!r}")
        self.tensors, self.batch_size, self.seed = tensors, batch_size, int(seed)
        self.n = n
        self.batches_per_epoch = n // batch_size
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __call__(self, step: int) -> Batch:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        epoch, i = divmod(int(step), self.batches_per_epoch)
        if epoch != self._epoch:  # a cache only: the permutation depends on (seed, epoch) alone
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.n, generator=g)
        idx = self._perm[i * self.batch_size : (i + 1) * self.batch_size]  # (batch_size,)
        return tuple(t[idx] for t in self.tensors)


def progress_enabled(progress: bool | None = None) -> bool:
    """Whether to draw a tqdm bar: ``progress`` if given, else only in a terminal without ``CI``."""
    if progress is not None:
        return bool(progress)
    return sys.stderr.isatty() and not os.environ.get("CI")


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                     step: int, steps: int, history: History,
                     rng: dict[str, Any] | None = None) -> None:
    state = {"step": step, "steps": steps, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "rng": _rng_state() if rng is None else rng,
             "history": history.to_dict()}
    # atomic: a crash while saving leaves the previous checkpoint intact, and no .tmp
    write_atomically(path, lambda tmp: torch.save(state, tmp))


class CannotWrite(OSError):
    """A file of the results could not be written (a full disk, a folder gone read-only): an
    ``OSError`` with the ``errno`` and ``filename`` of the file meant, nothing half-written
    left behind."""

    def __init__(self, errno: int | None, strerror: str, filename: str | os.PathLike) -> None:
        super().__init__(errno, strerror, str(filename))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror} (nothing half-written was left)"


def write_atomically(path: str | os.PathLike, write: Any) -> Path:
    """``write(tmp)`` into ``path.tmp``, then rename it to ``path``: a reader sees the old file
    or the new one, never half of one. On any error the ``.tmp`` is deleted; an ``OSError``
    (or torch's ``RuntimeError`` for a failed write) becomes :class:`CannotWrite` naming
    ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise CannotWrite(exc.errno, exc.strerror or str(exc), path) from exc
        if isinstance(exc, RuntimeError) and "writ" in str(exc):  # torch.save's stream writer
            raise CannotWrite(None, str(exc).splitlines()[-1].strip(), path) from exc
        raise
    return path


class UnreadableFile(RuntimeError):
    """A checkpoint or run file that cannot be read (truncated, or not lnbook's): a
    ``RuntimeError`` with ``path``, ``reason`` and ``remedy``, all in the message."""

    def __init__(self, path: str | os.PathLike, reason: str, remedy: str) -> None:
        self.path, self.reason, self.remedy = Path(path), reason, remedy
        super().__init__(f"cannot read {self.path}: {reason}; {remedy}")

    def __reduce__(self) -> tuple[type, tuple[Path, str, str]]:  # raised in a worker process
        return type(self), (self.path, self.reason, self.remedy)


def load_checkpoint(path: str | os.PathLike,
                    map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state :func:`fit` saved in ``path``; :class:`UnreadableFile` if it cannot be read."""
    path = Path(path)
    remedy = "delete it to train that run from the start, or put back a good copy"
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnreadableFile(path, f"not a complete checkpoint ({reason})", remedy) from exc
    missing = [k for k in ("step", "model", "optimizer", "rng", "history")
               if not isinstance(state, dict) or k not in state]
    if missing:
        raise UnreadableFile(path, f"not a checkpoint of lnbook.fit (no {', '.join(missing)})",
                             remedy)
    return state


def restore(path: Path, saved: dict[str, Any], model: nn.Module | Mapping[str, Tensor] | None,
            optimizer: torch.optim.Optimizer) -> None:
    """Load a checkpoint's model (a module, or a mapping of tensors copied in place) and
    optimizer states; :class:`UnreadableFile` when they do not fit (another model, or a
    checkpoint an older lnbook wrote)."""
    try:
        if isinstance(model, nn.Module):
            model.load_state_dict(saved["model"])
        elif model is not None:
            with torch.no_grad():
                for name, t in model.items():
                    t.copy_(saved["model"][name])
        optimizer.load_state_dict(saved["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:  # what torch raises for a misfit
        reason = " ".join(str(exc).split())  # torch's message spans several lines
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        raise UnreadableFile(path, f"written for another model or lnbook version ({reason})",
                             "move it away to train that run from the start") from exc


def _evaluate(model: nn.Module, eval_fn: Callable[[nn.Module], dict[str, float]],
              history: History, step: int) -> None:
    """Record ``eval_fn(model)`` (in eval mode, without gradients) at ``step``."""
    model.eval()
    with torch.no_grad():
        metrics = eval_fn(model)
    model.train()
    if not isinstance(metrics, dict):
        raise TypeError(f"eval_fn must return a dict[str, float], got {type(metrics).__name__}")
    history.eval_steps.append(step)
    history.metrics.append({str(k): float(v) for k, v in metrics.items()})


def fit(model: nn.Module, train_data: Callable[[int], Batch], optimizer: torch.optim.Optimizer,
        steps: int, eval_every: int, eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
        device: str | torch.device = "auto", seed: int = 0,
        checkpoint: str | os.PathLike | None = None,
        loss_fn: Callable[[nn.Module, Batch], Tensor] | None = None, progress: bool | None = None,
        bar: tqdm | None = None, label: str | None = None) -> History:
    """Train ``model`` for ``steps`` updates (fewer under :func:`capped`); evaluate,
    checkpoint and resume on the way.

    One update: ``batch = train_data(step)`` on the device, ``loss = loss_fn(model, batch)``
    (default ``model(*batch)``), backward, ``optimizer.step()``. ``eval_fn(model)`` runs under
    ``torch.no_grad()`` in eval mode before the first update, every ``eval_every`` updates and
    after the last.

    Args:
        model: the network, moved to ``device`` (parameters keep their identity).
        train_data: ``step -> batch``, deterministic in ``step`` (e.g. :class:`Batches`).
        optimizer: a torch optimizer over ``model``'s parameters.
        steps: total updates, counting those before a resume.
        eval_every: evaluate (and checkpoint) every this many updates.
        eval_fn: ``model -> dict[str, float]``, or None.
        device: ``"auto"`` (cuda, mps, cpu) or a device name.
        seed: seeds torch's global generator at the start (dropout etc., not the init).
        checkpoint: file written atomically at each evaluation and at the end; if it exists,
            training continues from it. Ctrl-C saves the last finished update.
        loss_fn: ``(model, batch) -> scalar loss``.
        progress: draw a tqdm bar (default: in a terminal without ``CI``).
        bar: advance this tqdm bar instead; label: names the run in bar and messages.

    Returns:
        The :class:`History` of the whole run.
    """
    check_size("steps", steps)
    steps = max_updates(steps)  # a smoke run's cap (:func:`capped`), if any
    if not (isinstance(eval_every, int) and eval_every >= 1):
        raise ValueError(f"eval_every must be an int >= 1, got {eval_every!r}")
    if not callable(train_data):
        raise TypeError("train_data must be a callable step -> batch, e.g. lnbook.Batches")
    dev = resolve_device(device)
    model.to(dev)
    model.train()
    torch.manual_seed(seed)
    history, start = History(step_times=[]), 0

    ckpt_path = Path(checkpoint) if checkpoint is not None else None
    if ckpt_path is not None and ckpt_path.exists():
        state = load_checkpoint(ckpt_path, map_location=dev)
        if state["step"] > steps:
            raise ValueError(
                f"checkpoint {ckpt_path} is at step {state['step']}, beyond steps={steps}"
            )
        restore(ckpt_path, state, model, optimizer)
        _set_rng_state(state["rng"])
        history, start = History.from_dict(state["history"]), int(state["step"])
        history.step_times = history.step_times or []

    name = label or "fit"
    if start > 0:
        tqdm.write(f"{name}: resuming from update {start} of {steps} ({ckpt_path})",
                   file=sys.stderr)
    t_start = time.perf_counter() - history.wall_time  # wall_time sums resumed sessions
    last_eval = history.eval_steps[-1] if history.eval_steps else None
    if eval_fn is not None and last_eval != start and (
            start == 0 or start % eval_every == 0 or start == steps):
        # before training, or an evaluation that an interrupt cut short
        _evaluate(model, eval_fn, history, start)

    own_bar = bar is None
    if own_bar:
        bar = tqdm(total=steps, initial=start, disable=not progress_enabled(progress), desc=name)
    else:
        bar.set_description(name)
        bar.update(start)
    # `done` updates are finished and recorded; `rng_mark` is the generator state a resumed
    # run must start from to continue exactly; `busy` is True while an update is half-applied
    done, busy, rng_mark = start, False, None
    try:
        for step in range(start, steps):
            rng_mark = _rng_state() if ckpt_path is not None else None
            t0 = time.perf_counter()
            batch = tuple(t.to(dev, non_blocking=True) for t in train_data(step))
            loss = loss_fn(model, batch) if loss_fn is not None else model(*batch)
            if not (isinstance(loss, Tensor) and loss.numel() == 1):
                raise TypeError("the loss must be a scalar Tensor (check loss_fn or model.forward)")
            if not torch.isfinite(loss.detach()):
                raise FloatingPointError(
                    f"the training loss is {float(loss.detach())} at update {step + 1}; stopping "
                    "rather than training on (the last checkpoint, if any, holds earlier weights)"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            busy = True
            optimizer.step()
            history.steps.append(step + 1)
            history.losses.append(float(loss.detach()))
            history.step_times.append(time.perf_counter() - t0)
            done = step + 1
            busy = False
            rng_mark = _rng_state() if ckpt_path is not None else None
            bar.update(1)
            if done % eval_every == 0 or done == steps:
                if eval_fn is not None:
                    _evaluate(model, eval_fn, history, done)
                    shown = {"train_loss": history.losses[-1], **history.metrics[-1]}
                    bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()})
                history.wall_time = time.perf_counter() - t_start
                if ckpt_path is not None:
                    _save_checkpoint(ckpt_path, model, optimizer, done, steps, history)
    except KeyboardInterrupt:
        if ckpt_path is not None and not busy and done > start:
            # the model and the optimizer hold update `done` exactly: keep it
            history.wall_time = time.perf_counter() - t_start
            _save_checkpoint(ckpt_path, model, optimizer, done, steps, history, rng_mark)
            tqdm.write(f"{name}: interrupted; saved update {done} of {steps} to {ckpt_path}",
                       file=sys.stderr)
        raise
    finally:
        if own_bar:
            bar.close()
    history.wall_time = time.perf_counter() - t_start
    note_smoke(sum(p.numel() for p in model.parameters()), history.step_times[start:])
    return history
