"""The one protocol every experiment follows: variants x seeds -> fit -> :class:`Results`.

Book chapters 6.1-6.7, 3.1, 7 and Part II. An experiment module describes *what* to train (its
``Config`` dataclass, a model, data, and a function that trains one variant with one seed);
:func:`sweep` runs every (variant, seed) pair, shows one progress bar for the whole sweep,
keeps finished runs and checkpoints on disk when given an ``out`` folder (so an interrupted
sweep resumes where it stopped), and returns one :class:`Results` layout that the chapters, the
plots and the claims ledger all read. The shared measurements of learning curves
(:func:`updates_to_reach`, :func:`mean_after_start`, :func:`best_step`) live here, once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import pickle
import re
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from lnbook.device import resolve_device
from lnbook.train import History, progress_enabled

__all__ = [
    "SCALES",
    "Job",
    "Results",
    "Run",
    "SweepInterrupted",
    "Table",
    "best_step",
    "check_scale",
    "classification_metrics",
    "cpu_threads",
    "load_results",
    "make_config",
    "mean_after_start",
    "save_results",
    "sweep",
    "updates_to_reach",
]

SCALES: tuple[str, ...] = ("quick", "paper")


# ---------------------------------------------------------------------------------------------
# configs and files


def check_scale(scale: str) -> str:
    """Return ``scale`` if it is ``"quick"`` or ``"paper"``, else raise ``ValueError``."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    return scale


def make_config(config_cls: type, presets: Mapping[str, Mapping[str, Any]], scale: str,
                overrides: Mapping[str, Any]) -> Any:
    """``config_cls`` built from the ``scale`` preset, with fields replaced by ``overrides``.

    Every experiment's ``get_config`` starts here: an unknown scale or field name raises
    ``ValueError`` naming the valid ones.
    """
    check_scale(scale)
    names = {f.name for f in dataclasses.fields(config_cls)} - {"scale"}
    unknown = set(overrides) - names
    if unknown:
        raise ValueError(f"unknown Config fields {sorted(unknown)}; known: {sorted(names)}")
    return config_cls(scale=scale, **{**presets[scale], **overrides})


def _jsonable(obj: Any) -> Any:
    """Plain JSON types; non-finite floats become None (strict JSON has no NaN)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "tolist"):  # numpy or torch array / scalar
        return _jsonable(obj.tolist())
    raise TypeError(f"cannot save a {type(obj).__name__} as JSON: {obj!r}")


def save_results(results: Any, path: str | os.PathLike) -> Path:
    """Write ``results`` (a :class:`Results` or a dict) as JSON, atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(results), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def load_results(path: str | os.PathLike) -> Results:
    """Read a :class:`Results` written by :func:`save_results`."""
    return Results.from_dict(json.loads(Path(path).read_text()))


# ---------------------------------------------------------------------------------------------
# the results layout


@dataclass
class Run:
    """One trained (variant, seed) pair.

    Attributes:
        variant: the variant's name (a key of the ``variants`` given to :func:`sweep`).
        seed: the seed of its initialization and data order.
        history: the :class:`lnbook.train.History` that :func:`lnbook.fit` recorded.
        info: anything else the experiment measured on this run (JSON types), e.g. the test
            error per time step.
    """

    variant: str
    seed: int
    history: History
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "seed": self.seed, "history": self.history.to_dict(),
                "info": _jsonable(self.info)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Run:
        return cls(str(d["variant"]), int(d["seed"]), History.from_dict(d["history"]),
                   dict(d.get("info", {})))


@dataclass
class Results:
    """What a sweep produced: every run, and how it was configured. One layout for all.

    Attributes:
        name: the experiment's name.
        config: its configuration, as a dict.
        device: the device it trained on.
        runs: one :class:`Run` per (variant, seed), in the order they were trained.
        info: what the experiment adds about the whole sweep (data source, trivial baselines).
    """

    name: str
    config: dict[str, Any]
    device: str
    runs: list[Run]
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "config": _jsonable(self.config), "device": self.device,
                "info": _jsonable(self.info), "runs": [r.to_dict() for r in self.runs]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Results:
        return cls(d["name"], dict(d["config"]), d["device"],
                   [Run.from_dict(r) for r in d["runs"]], dict(d.get("info", {})))

    # -- selection

    @property
    def variants(self) -> list[str]:
        """Variant names in the order they were trained."""
        return list(dict.fromkeys(r.variant for r in self.runs))

    @property
    def seeds(self) -> list[int]:
        """Seeds in the order they were trained."""
        return list(dict.fromkeys(r.seed for r in self.runs))

    def select(self, variant: str) -> list[Run]:
        """The runs of ``variant``, one per seed, in seed order."""
        runs = [r for r in self.runs if r.variant == variant]
        if not runs:
            raise KeyError(f"no runs of variant {variant!r}; variants: {self.variants}")
        return runs

    def curves(self, variant: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """One metric over training, every seed: ``(steps (E,), values (seeds, E))``.

        ``metric`` is a key of the dicts the evaluation returned (measured at ``eval_steps``),
        or ``"loss"`` for the training loss of every update (measured at ``steps``).
        """
        runs = self.select(variant)
        h = runs[0].history
        if metric == "loss":
            steps, rows = np.array(h.steps), [r.history.losses for r in runs]
        else:
            if not h.metrics or metric not in h.metrics[0]:
                known = sorted(h.metrics[0]) if h.metrics else []
                raise KeyError(f"no metric {metric!r} in {variant!r}; recorded: {known}")
            steps, rows = np.array(h.eval_steps), [r.history.metric(metric) for r in runs]
        if len({len(r) for r in rows}) != 1:
            raise ValueError(f"the seeds of {variant!r} recorded {metric!r} a different number "
                             "of times; compare them run by run")
        return steps, np.array(rows, dtype=float)

    def final(self, variant: str, metric: str) -> np.ndarray:
        """The last recorded value of ``metric``, per seed: ``(seeds,)``."""
        return np.array([r.history.metric(metric)[-1] for r in self.select(variant)])

    def best(self, variant: str, metric: str, mode: str = "min") -> np.ndarray:
        """The best value of ``metric`` over training, per seed (``mode`` "min" or "max")."""
        pick = _pick(mode)
        return np.array([pick(r.history.metric(metric)) for r in self.select(variant)])

    def info_of(self, variant: str, key: str) -> list[Any]:
        """``run.info[key]`` of every seed of ``variant``."""
        return [r.info[key] for r in self.select(variant)]

    def table(self, metrics: Sequence[str], stat: str = "final", fmt: str = ".3f",
              variants: Sequence[str] | None = None) -> Table:
        """A small table: one row per variant, one column per metric, values per seed.

        ``stat`` is ``"final"``, ``"min"`` or ``"max"`` (the best over training).
        """
        rows = []
        for v in variants or self.variants:
            cells = []
            for m in metrics:
                vals = self.final(v, m) if stat == "final" else self.best(v, m, stat)
                cells.append(" / ".join(format(x, fmt) for x in vals))
            rows.append([v, *cells])
        seeds = ", ".join(str(s) for s in self.seeds)
        return Table(["variant", *(f"{m} ({stat})" for m in metrics)], rows,
                     caption=f"one value per seed ({seeds})")


class Table:
    """Rows of text shown as a Markdown table in a notebook and aligned columns in a terminal."""

    def __init__(self, header: Sequence[str], rows: Iterable[Sequence[Any]],
                 caption: str | None = None) -> None:
        self.header = [str(h) for h in header]
        self.rows = [[str(c) for c in row] for row in rows]
        self.caption = caption

    def __str__(self) -> str:
        cols = list(zip(self.header, *self.rows, strict=True))
        widths = [max(len(c) for c in col) for col in cols]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                 for row in [self.header, *self.rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines + ([f"({self.caption})"] if self.caption else []))

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        def esc(s: str) -> str:
            return s.replace("|", "\\|")

        md = ["| " + " | ".join(esc(h) for h in self.header) + " |",
              "|" + "---|" * len(self.header)]
        md += ["| " + " | ".join(esc(c) for c in row) + " |" for row in self.rows]
        return "\n".join(md + ([f"\n*{self.caption}*"] if self.caption else []))


# ---------------------------------------------------------------------------------------------
# shared measurements of learning curves


def _pick(mode: str) -> Callable[[Sequence[float]], float]:
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    return min if mode == "min" else max


def updates_to_reach(steps: Sequence[int], values: Sequence[float], target: float,
                     mode: str = "min") -> int | None:
    """The first evaluation step at which ``values`` reaches ``target``, or None if never.

    With ``mode="min"`` (a loss or an error) reaching means ``value <= target``; with
    ``mode="max"`` (an accuracy or a recall) it means ``value >= target``.

    Example::

        >>> updates_to_reach([0, 10, 20], [200.0, 150.0, 140.0], 150.0)
        10
    """
    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length: {len(steps)} vs {len(values)}")
    _pick(mode)
    for s, v in zip(steps, values, strict=True):
        if (v <= target) if mode == "min" else (v >= target):
            return int(s)
    return None


def mean_after_start(values: np.ndarray) -> np.ndarray:
    """The mean of each curve over its evaluations after step 0: ``(seeds, E) -> (seeds,)``.

    The area under a learning curve, per evaluation: a method that gets low sooner has the
    smaller value (the measure of "converges faster" used across the book).
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or values.shape[1] < 2:
        raise ValueError(f"values must be (seeds, evaluations >= 2), got {values.shape}")
    return values[:, 1:].mean(axis=1)


def best_step(steps: Sequence[int], values: Sequence[float], mode: str = "min") -> int:
    """The evaluation step with the best value (the first one, on ties)."""
    best = _pick(mode)(values)
    return int(steps[list(values).index(best)])


def classification_metrics(
    model: nn.Module, x: Tensor, y: Tensor, chunk: int = 2000
) -> dict[str, float]:
    """Mean negative log likelihood (nats) and error rate of a classifier on ``(x, y)``.

    ``model(x)`` returns logits ``(N, classes)``; evaluated without gradients in chunks of
    ``chunk`` examples on the model's device, in whatever mode the model is in (``fit``'s
    ``eval_fn`` runs in eval mode).
    """
    dev = next(model.parameters()).device
    nll, wrong = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), chunk):
            xb, yb = x[i : i + chunk].to(dev), y[i : i + chunk].to(dev)
            logits = model(xb)  # (chunk, classes)
            nll += float(F.cross_entropy(logits, yb, reduction="sum"))
            wrong += int((logits.argmax(1) != yb).sum())
    return {"nll": nll / len(y), "error": wrong / len(y)}


@contextlib.contextmanager
def cpu_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``n`` torch CPU threads, then restore the previous count.

    The book's quick models multiply small matrices, for which extra threads only add
    overhead (and, on a busy machine, spin while they wait), so their presets use 1;
    ``None`` leaves torch's setting alone (the paper presets, on a GPU or a big CPU).
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be a positive int or None, got {n!r}")
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# the sweep


@dataclass
class Job:
    """One (variant, seed) pair, as :func:`sweep` hands it to the experiment's ``train_one``.

    Pass ``bar`` and ``label`` on to :func:`lnbook.fit` (its ``bar=``, ``label=``) and
    ``checkpoint`` as its ``checkpoint=``, so that the sweep's single progress bar advances and
    an interrupted run resumes.
    """

    variant: str
    params: Any
    seed: int
    device: torch.device
    checkpoint: Path | None
    bar: Any
    label: str


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: what is saved, so the caller can say how to resume.

    Attributes:
        finished: labels of the runs that were complete (saved when the sweep had ``out``).
        saved: ``(label, step, steps)`` of the interrupted run's checkpoint, if it had one.
        out: the sweep's output folder, or None when nothing was kept on disk.
    """

    def __init__(self, finished: list[str], saved: list[tuple[str, int, int]],
                 out: Path | None) -> None:
        self.finished, self.saved, self.out = finished, saved, out
        super().__init__(self.describe())

    def describe(self) -> str:
        if self.out is None:
            return "interrupted; nothing was saved (run with an output folder to resume)"
        lines = [f"interrupted; saved under {self.out}:"]
        lines += [f"  {label}: finished" for label in self.finished]
        lines += [f"  {label}: checkpoint at update {s} of {n}" for label, s, n in self.saved]
        if len(lines) == 1:
            lines.append("  nothing yet (no run reached its first checkpoint)")
        return "\n".join(lines)


def _file_stem(variant: str, seed: int) -> str:
    """``variant`` and ``seed`` as a file name (``layer/bs4`` -> ``layer_bs4-seed0``)."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', variant)}-seed{seed}"


def _run_file(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / f"{_file_stem(variant, seed)}.json"


# Config fields whose change continues a run from its checkpoint instead of starting another:
# train longer, evaluate or checkpoint at other times, use more processes or threads.
_CONTINUES = ("steps", "eval_every", "checkpoint", "threads", "workers")


def _checkpoint_file(out: Path, name: str, variant: str, seed: int, cfg: Any) -> Path:
    """The checkpoint of one run, named after the config it was trained under (a digest of
    every field but :data:`_CONTINUES`), so that a run of another config never resumes it."""
    kept = {k: v for k, v in cfg.items() if k not in _CONTINUES} if isinstance(cfg, dict) else cfg
    digest = hashlib.sha1(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:8]
    return out / "checkpoints" / f"{name}-{_file_stem(variant, seed)}-{digest}.pt"


def _label(variant: str, seed: int) -> str:
    return f"{variant} seed {seed}"


def sweep(
    name: str,
    variants: Mapping[str, Any],
    seeds: Sequence[int],
    train_one: Callable[[Job], History | tuple[History, dict[str, Any]]],
    *,
    config: Any,
    device: str | torch.device = "auto",
    out: str | os.PathLike | None = None,
    checkpoint: bool = False,
    steps: int | Callable[[str, Any], int] | None = None,
    info: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    threads: int | None = None,
    workers: int = 1,
) -> Results:
    """Train every variant with every seed through ``train_one``; return one :class:`Results`.

    Args:
        name: the experiment's name (``Results.name``; files are ``out/<name>.json``).
        variants: name -> parameters of the variant (anything ``train_one`` understands),
            trained in this order.
        seeds: the seeds, each variant trained once per seed.
        train_one: ``Job -> History`` or ``(History, info)``; builds the model under
            ``torch.manual_seed(job.seed)`` and calls :func:`lnbook.fit` with ``bar=job.bar``,
            ``label=job.label`` and ``checkpoint=job.checkpoint``.
        config: the experiment's config dataclass (stored with the results; a finished run
            on disk is reused only if it was trained under the same config).
        device: ``"auto"`` (cuda, mps, cpu) or a device.
        out: folder for ``<name>.json``, the finished runs (``runs/``) and the checkpoints
            (``checkpoints/``, when ``checkpoint`` is True); None keeps everything in memory.
            A checkpoint's name carries a digest of the config, so a run resumes only a
            checkpoint of its own config (``steps``, ``eval_every``, ``checkpoint``,
            ``threads`` and ``workers`` may differ: training longer continues the run).
        checkpoint: give every job a checkpoint file under ``out`` (paper-scale runs).
        steps: updates per run (an int, or ``(variant, params) -> int``), for the total of
            the progress bar.
        info: what to store about the whole sweep in ``Results.info``.
        progress: show the bar; default only in a terminal outside CI.
        threads: torch CPU threads while training (see :func:`cpu_threads`); None leaves
            torch's setting.
        workers: how many runs train at once, each in its own process, on a CPU device (on
            a GPU, or with one run to train, they train one after another). Results are the
            same as with 1: every run seeds itself. ``train_one`` must then be picklable (a
            module-level function, or a ``functools.partial`` of one), and the bar moves
            when a run finishes. Each worker starts a fresh Python (a few seconds).

    Raises:
        SweepInterrupted: on Ctrl-C, after saying which runs are finished and which
            checkpoint the interrupted one left (a ``KeyboardInterrupt``).
    """
    if not variants:
        raise ValueError("variants is empty: name at least one variant to train")
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    dev = resolve_device(device)
    folder = Path(out) if out is not None else None
    cfg = _jsonable(config)
    pairs = [(v, p, int(s)) for v, p in variants.items() for s in seeds]

    def n_steps(v: str, p: Any) -> int:
        return steps(v, p) if callable(steps) else int(steps or 0)

    total = sum(n_steps(v, p) for v, p, _ in pairs) if steps is not None else None
    bar = tqdm(total=total, disable=not progress_enabled(progress), desc=name, unit="update")
    done: dict[int, Run] = {}  # index in `pairs` -> finished run
    jobs: dict[int, tuple[Job, Path | None]] = {}  # the runs still to train, and their files
    for i, (variant, params, seed) in enumerate(pairs):
        label = _label(variant, seed)
        run_file = _run_file(folder, variant, seed) if folder is not None else None
        found = _load_finished(folder, variant, seed, cfg) if folder is not None else None
        if found is not None:
            tqdm.write(f"{label}: finished earlier, read from {run_file}", file=sys.stderr)
            done[i] = found
            bar.update(n_steps(variant, params))
            continue
        ckpt = None
        if folder is not None and checkpoint:
            ckpt = _checkpoint_file(folder, name, variant, seed, cfg)
        jobs[i] = (Job(variant, params, seed, dev, ckpt, bar, label), run_file)
    try:
        if workers > 1 and dev.type == "cpu" and len(jobs) > 1:
            _train_in_processes(jobs, done, train_one, threads, cfg, min(workers, len(jobs)),
                                bar, lambda i: n_steps(*pairs[i][:2]), folder)
        else:
            for i, (job, run_file) in jobs.items():
                try:
                    done[i] = _train_job(train_one, job, threads, cfg, run_file)
                except KeyboardInterrupt:
                    raise SweepInterrupted([_label(r.variant, r.seed) for r in done.values()],
                                           _saved_step(job.checkpoint, job.label),
                                           folder) from None
    finally:
        bar.close()
    results = Results(name, cfg, str(dev), [done[i] for i in sorted(done)], dict(info or {}))
    if folder is not None:
        save_results(results, folder / f"{name}.json")
    return results


def _train_job(train_one: Callable[[Job], Any], job: Job, threads: int | None, cfg: Any,
               run_file: Path | None) -> Run:
    """Train one job (in this process or a worker's) and keep the finished run on disk."""
    with cpu_threads(threads):
        got = train_one(job)
    hist, run_info = got if isinstance(got, tuple) else (got, {})
    run = Run(job.variant, job.seed, hist, dict(run_info))
    if run_file is not None:  # written here, so a worker's run survives an interrupted parent
        save_results({"config": cfg, "run": run}, run_file)
    return run


def _worker_ignores_ctrl_c() -> None:
    """Pool initializer: between runs a worker ignores Ctrl-C. A terminal sends it to every
    process of the group; a worker that is waiting for a run, or unpickling one, has nothing
    to save, and a KeyboardInterrupt there would end it with a traceback (the parent stops
    the sweep and reports)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _train_job_in_worker(*args: Any) -> Run:
    """:func:`_train_job` in a worker, where Ctrl-C interrupts the run (which then saves its
    checkpoint, as in the parent), and only while the run trains."""
    ignore = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _train_job(*args)
    finally:
        signal.signal(signal.SIGINT, ignore)


def _train_in_processes(jobs: dict[int, tuple[Job, Path | None]], done: dict[int, Run],
                        train_one: Callable[[Job], Any], threads: int | None, cfg: Any,
                        workers: int, bar: tqdm, n_steps: Callable[[int], int],
                        folder: Path | None) -> None:
    """Train ``jobs`` in ``workers`` fresh processes, filling ``done`` as runs finish."""
    try:
        pickle.dumps(train_one)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(
            f"with workers > 1 every run trains in another process, so train_one must be "
            f"picklable (a module-level function, or a functools.partial of one); "
            f"{train_one!r} is not: {exc}"
        ) from None
    quiet = tqdm(disable=True)  # a worker cannot draw on the parent's bar
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_ignores_ctrl_c)
    waiting = list(jobs)  # indices not yet handed to a worker, in order
    running: dict[Future, int] = {}  # at most `workers`: nothing queued that Ctrl-C must undo

    def start_next() -> None:
        i = waiting.pop(0)
        job, run_file = jobs[i]
        running[pool.submit(_train_job_in_worker, train_one, dataclasses.replace(job, bar=quiet),
                            threads, cfg, run_file)] = i

    try:
        while waiting and len(running) < workers:
            start_next()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                i = running.pop(future)
                done[i] = future.result()  # a worker's exception is raised here
                bar.set_description(f"{jobs[i][0].label} done")
                bar.update(n_steps(i))
                if waiting:
                    start_next()
    except BaseException as exc:
        pool.shutdown(wait=False, cancel_futures=True)
        if isinstance(exc, BrokenProcessPool):
            raise RuntimeError(
                "a worker process of the sweep stopped before its run finished. Called from a "
                "script, the sweep must run under `if __name__ == \"__main__\":` (each worker "
                "imports the main module); workers=1 trains in this process instead"
            ) from exc
        if not isinstance(exc, KeyboardInterrupt):
            raise
        # workers that got the Ctrl-C too (a terminal sends it to them all) save a checkpoint
        # and stop; runs whose worker did not (Jupyter interrupts the kernel only) go on in
        # the background and save their results when they finish
        wait(running, timeout=10)
        saved = []
        for future, i in running.items():
            job, run_file = jobs[i]
            if future.done() and future.exception() is None:
                done[i] = future.result()
            elif run_file is not None and run_file.exists():  # saved just before the Ctrl-C
                done[i] = Run.from_dict(json.loads(run_file.read_text())["run"])
            else:
                saved += _saved_step(job.checkpoint, job.label)
        finished = [_label(r.variant, r.seed) for _, r in sorted(done.items())]
        raise SweepInterrupted(finished, saved, folder) from None
    pool.shutdown()


def _load_finished(out: Path, variant: str, seed: int, cfg: Any) -> Run | None:
    path = _run_file(out, variant, seed)
    if not path.exists():
        return None
    saved = json.loads(path.read_text())

    def what(c: Any) -> Any:  # the results do not depend on workers
        return {k: v for k, v in c.items() if k != "workers"} if isinstance(c, dict) else c

    if what(saved.get("config")) != what(cfg):
        return None  # trained under another config: train again
    return Run.from_dict(saved["run"])


def _saved_step(ckpt: Path | None, label: str) -> list[tuple[str, int, int]]:
    if ckpt is None or not ckpt.exists():
        return []
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    return [(label, int(state["step"]), int(state.get("steps", state["step"])))]
