"""Where each design trains: seven Transformer designs over depth x peak rate x warm-up.

Book chapter `19_design_map` (Part IV), claims P23 (Liu et al. 2020: where Post-LN trains it
ends better than Pre-LN, and it fails where Pre-LN trains) and P29 (OLMo 2's norm on the
sublayers' outputs, with QK-norm, trains more stably than Pre-LN); it revisits P04, P05 and
P16 on the same grid. The designs (:data:`DESIGNS`): no norm, Post-LN, Pre-LN, Peri-LN,
OLMo 2's ``x + norm(f(x))``, DyT in Pre-LN's places, and ReZero's gate ``x + alpha f(x)``.

Every cell (design, depth, peak rate, warm-up) is trained on every seed; the copies of one
design and depth train as one computation
(:func:`~lnbook.experiments.stacked.train_stacked`), all in one job of
:func:`lnbook.engine.runner.sweep`. Per seed: whether the run left the trivial phase
(:func:`left_trivial`) and its final held-out loss (:func:`final_loss`); per cell the map
(:func:`design_map`): the share of seeds that left, the median final loss and a
distribution-free interval for it (:func:`median_interval`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch

from lnbook.checks import check_choice, check_config
from lnbook.engine import History, Job, Results, make_config, resolve_seeds, sweep
from lnbook.experiments.seq_tasks import DeepTaskConfig, SequenceTask, check_lrs, presets, task_of
from lnbook.experiments.stacked import groups, in_job_order, train_stacked
from lnbook.transformer import Transformer, TransformerConfig

__all__ = ["NAME", "DESCRIPTION", "DESIGNS", "BAR", "Config", "Cell", "get_config",
           "model_config", "variant_name", "run", "train", "output_change", "amplification",
           "final_loss", "left_trivial", "loss_spikes", "spikes", "median_interval",
           "design_map", "cells", "cells_trained", "ends_lower", "total_spikes",
           "fewer_spikes", "both_trained", "claim_values", "pilot_summary", "collapsed",
           "course_reports", "plot_map", "AUTOCAST", "low_precision_config", "PrecisionCell",
           "precision_column"]

NAME = "design_map"
DESCRIPTION = ("Where each design trains: no norm, Post-LN, Pre-LN, Peri-LN, OLMo 2's output "
               "norm, DyT and ReZero over depth x peak rate x warm-up (Liu et al. 2020, OLMo 2; "
               "P23, P29)")

#: Each design's fields of :class:`~lnbook.transformer.TransformerConfig`.
DESIGNS: dict[str, dict[str, Any]] = {
    "none": {"norm": "none", "position": "pre"},  # x + f(x), no final norm
    "post": {"norm": "layer", "position": "post"},  # norm(x + f(x))
    "pre": {"norm": "layer", "position": "pre"},  # x + f(norm(x))
    "peri": {"norm": "layer", "position": "peri"},  # x + norm(f(norm(x)))
    "olmo2": {"norm": "layer", "position": "output", "qk_norm": True},  # x + norm(f(x))
    "dyt": {"norm": "dyt", "position": "pre"},  # x + f(DyT(x)), DyT as the final norm
    "rezero": {"norm": "none", "position": "rezero"},  # x + alpha f(x), alpha from 0
}
#: The trivial-phase bar: a run left the trivial phase when its final held-out loss is at
#: least this many nats below the position-wise unigram predictor's.
BAR = 0.2
#: The dtypes of ``Config.autocast``.
AUTOCAST = ("bfloat16", "float16")


@dataclass
class Config(DeepTaskConfig):
    """Settings of the design map (:class:`~lnbook.experiments.seq_tasks.DeepTaskConfig`'s
    task, model width and training, plus the grid).

    Attributes:
        designs: keys of :data:`DESIGNS`, in the map's order.
        depths: numbers of blocks, increasing.
        lrs: peak Adam learning rates, increasing.
        warmups: updates of linear warm-up to the peak (0: none), each at most ``steps``.
        n_eval: held-out sequences per evaluation.
        probe_depths, probe_step: the depths of :func:`amplification` (untrained models) and
            the size of the update it applies to every parameter entry.
        stack: what trains as one computation: ``"all"`` (one job: every cell of a design and
            depth at once) or ``"seeds"`` (one job per cell, its seeds at once; the paper
            preset's, whose copies are large).
        autocast: None, or ``"bfloat16"`` / ``"float16"``: every run trains in mixed precision
            (:class:`torch.autocast` in that dtype, the parameters and Adam in float32), its
            held-out loss measured in float32; the chapter's low-precision column
            (:func:`precision_column`).
    """

    designs: tuple[str, ...] = tuple(DESIGNS)
    depths: tuple[int, ...] = (1, 5)
    lrs: tuple[float, ...] = (1e-2, 1e-1)
    warmups: tuple[int, ...] = (0, 30)
    steps: int = 60
    eval_every: int = 30
    n_eval: int = 128
    seeds: int | tuple[int, ...] = 5
    probe_depths: tuple[int, ...] = (1, 4, 16)
    probe_step: float = 0.01
    stack: str = "all"
    autocast: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.autocast is not None:
            check_choice("autocast", self.autocast, AUTOCAST)
        self.designs, self.depths = tuple(self.designs), tuple(self.depths)
        self.lrs, self.warmups = tuple(self.lrs), tuple(self.warmups)
        unknown = [d for d in self.designs if d not in DESIGNS]
        if not self.designs or unknown or len(set(self.designs)) != len(self.designs):
            raise ValueError(f"designs must be distinct names of {list(DESIGNS)}, got "
                             f"{list(self.designs)}")
        if (not self.depths or list(self.depths) != sorted(set(self.depths))
                or self.depths[0] < 1):
            raise ValueError(f"depths must be increasing numbers of blocks >= 1, got "
                             f"{self.depths}")
        check_lrs(self.lrs)
        if (not self.warmups or len(set(self.warmups)) != len(self.warmups)
                or any(not 0 <= w <= self.steps for w in self.warmups)):
            raise ValueError(f"warmups must be distinct update counts in [0, steps="
                             f"{self.steps}], got {self.warmups}")
        if self.n_eval < 1:
            raise ValueError(f"n_eval must be >= 1, got {self.n_eval}")
        check_choice("stack", self.stack, ("all", "seeds"))
        self.probe_depths = tuple(self.probe_depths)
        if (not self.probe_depths or list(self.probe_depths) != sorted(set(self.probe_depths))
                or self.probe_depths[0] < 1 or not self.probe_step > 0):
            raise ValueError(f"probe_depths must be increasing depths >= 1 and probe_step > 0, "
                             f"got {self.probe_depths}, {self.probe_step}")


_PRESETS = presets(size=8, symbols=16, n_train=50_000, n_test=1_000, d_model=32, n_heads=4,
                   batch_size=32, depths=(4, 8, 16), lrs=(1e-3, 3e-3, 1e-2, 3e-2),
                   warmups=(0, 500), steps=5_000, eval_every=250, n_eval=128,
                   probe_depths=(4, 16, 64), probe_step=1e-3)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def model_config(config: Config, design: str, depth: int, seq_len: int) -> TransformerConfig:
    """The Transformer of one ``design`` (a key of :data:`DESIGNS`) with ``depth`` blocks."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {list(DESIGNS)}, got {design!r}")
    return config.model_config(seq_len, n_layers=depth, ln_impl="torch", **DESIGNS[design])


def variant_name(design: str, depth: int, lr: float, warmup: int) -> str:
    """The name of one cell, e.g. ``"pre/L4/lr0.03/w0"``."""
    return f"{design}/L{depth}/lr{lr:g}/w{warmup}"


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every cell of the grid on every seed in one call of
    :func:`lnbook.engine.runner.sweep` (one job, or one per cell: ``config.stack``);
    variants :func:`variant_name`, each with ``(design, depth), (lr, warmup)``;
    ``Results.info`` the task's (``baseline_loss``).
    """
    check_config(config, Config)
    task = task_of(config)
    variants = {variant_name(d, n, lr, w): ((d, n), (lr, w)) for d in config.designs
                for n in config.depths for lr in config.lrs for w in config.warmups}
    return sweep(NAME, variants, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack=config.stack, steps=config.steps,
                 threads=config.threads, workers=config.workers, info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """A job of :func:`run`: each (design, depth) of ``job.variants`` with all its rates,
    warm-ups and the job's seeds at once; ``(history, info)`` per ``job.pairs`` entry."""
    task, trained = task.to(job.device), {}
    for (design, depth), settings in groups(job.variants).items():
        lrs, warmups = [lr for lr, _ in settings], [w for _, w in settings]
        for r in train_stacked(model_config(config, design, depth, task.seq_len), task,
                               job.seeds, lrs, warmup=warmups, steps=config.steps,
                               batch_size=config.batch_size, eval_every=config.eval_every,
                               n_eval=config.n_eval, stream_var=False, bar=job.bar,
                               autocast=(None if config.autocast is None
                                         else getattr(torch, config.autocast))):
            name = variant_name(design, depth, r.info["lr"], r.info["warmup"])
            trained[name, r.info["seed"]] = r
    return in_job_order(job, trained)


def output_change(config: Config, design: str, depth: int, seed: int, idx: torch.Tensor,
                  step: float | None = None) -> float:
    """How much one small update moves an untrained model's output (Liu et al. 2020's
    amplification): the model of ``design`` with ``depth`` blocks built under
    ``torch.manual_seed(seed)``, every parameter entry moved by ``+step`` or ``-step`` (random
    signs from a generator seeded with ``seed``: the size of Adam's first update at rate
    ``step``; default ``config.probe_step``); returns ``|f'(idx) - f(idx)| / |f(idx)|`` over
    the logits."""
    step = config.probe_step if step is None else step
    torch.manual_seed(seed)
    model = Transformer(model_config(config, design, depth, idx.shape[1]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        before = model(idx)  # (B, T, V)
        for p in model.parameters():
            signs = torch.randint(0, 2, p.shape, generator=g).to(p.dtype) * 2 - 1
            p.add_(step * signs)
        return float((model(idx) - before).norm() / before.norm())


def amplification(config: Config, idx: torch.Tensor, seeds: Sequence[int] | None = None
                  ) -> dict[str, np.ndarray]:
    """:func:`output_change` of every design at every ``config.probe_depths``:
    ``{design: (seeds, depths)}``; ``seeds`` default the config's
    (:func:`lnbook.engine.runner.resolve_seeds`)."""
    seeds = resolve_seeds(config.seeds) if seeds is None else list(seeds)
    return {d: np.array([[output_change(config, d, n, s, idx) for n in config.probe_depths]
                         for s in seeds]) for d in config.designs}


# --- per-seed quantities ---------------------------------------------------------------------


def final_loss(results: Results, variant: str) -> np.ndarray:
    """The final held-out loss of each seed, ``(seeds,)``; ``inf`` where the training loss
    stopped being finite (``info["diverged"]``)."""
    loss = results.final(variant, "loss").astype(float)
    diverged = np.array(results.info_of(variant, "diverged"), dtype=bool)
    return np.where(diverged | ~np.isfinite(loss), np.inf, loss)


def left_trivial(results: Results, variant: str, bar: float = BAR) -> np.ndarray:
    """Whether each seed left the trivial phase, ``(seeds,)`` bool: its final held-out loss is
    finite and at least ``bar`` nats below the position-wise unigram predictor's
    (``results.info["baseline_loss"]``)."""
    return final_loss(results, variant) < results.info["baseline_loss"] - bar


def loss_spikes(losses: Any, window: int = 5, rise: float = 0.5) -> int:
    """Loss spikes in one run's training losses (one per update): updates whose loss exceeds
    the lowest of the ``window`` losses before it by more than ``rise`` nats.

    Example::

        >>> loss_spikes([2.0, 1.5, 1.4, 2.2, 1.3, 1.2], window=2, rise=0.5)
        1
    """
    x = np.asarray(losses, dtype=float)
    if window < 1 or rise < 0:
        raise ValueError(f"window must be >= 1 and rise >= 0, got {window}, {rise}")
    return int(sum(x[t] > x[max(0, t - window):t].min() + rise for t in range(1, len(x))))


def spikes(results: Results, variant: str, window: int = 5, rise: float = 0.5) -> np.ndarray:
    """:func:`loss_spikes` of each seed's run, ``(seeds,)``; a run whose loss stopped being
    finite counts one more spike (its last)."""
    return np.array([loss_spikes(r.history.losses, window, rise) + int(r.info["diverged"])
                     for r in results.select(variant)], dtype=int)


def cells(results: Results) -> list[tuple[int, float, int]]:
    """The grid's ``(depth, lr, warmup)`` cells of each design, in the config's order."""
    c = results.config
    return [(n, lr, w) for n in c["depths"] for lr in c["lrs"] for w in c["warmups"]]


def cells_trained(results: Results, design: str, bar: float = BAR) -> np.ndarray:
    """For each seed, the share of the grid's cells in which ``design`` left the trivial
    phase, ``(seeds,)`` in [0, 1]."""
    left = [left_trivial(results, variant_name(design, *c), bar) for c in cells(results)]
    return np.mean(left, axis=0)


def ends_lower(results: Results, better: str, worse: str, bar: float = BAR) -> np.ndarray:
    """For each seed, how much lower ``better`` ends than ``worse`` where both train:
    over the cells in which both left the trivial phase, the median of ``(L_worse -
    L_better) / (baseline - min(L_worse, L_better))``, the gap as a share of what the better
    of the two learnt below the trivial predictor; NaN for a seed with no such cell.
    ``(seeds,)``."""
    base = results.info["baseline_loss"]
    rows = []
    for c in cells(results):
        a = final_loss(results, variant_name(better, *c))
        b = final_loss(results, variant_name(worse, *c))
        both = (a < base - bar) & (b < base - bar)
        with np.errstate(invalid="ignore", divide="ignore"):
            rows.append(np.where(both, (b - a) / (base - np.minimum(a, b)), np.nan))
    rows = np.array(rows)  # (cells, seeds)
    out = np.full(rows.shape[1], np.nan)
    for k in range(rows.shape[1]):
        seen = rows[:, k][np.isfinite(rows[:, k])]
        if seen.size:
            out[k] = float(np.median(seen))
    return out


# --- the map -------------------------------------------------------------------------------


def median_interval(values: Any, level: float = 0.9) -> tuple[float, float, float]:
    """The median of ``values`` and a distribution-free interval for the population median:
    the order statistics ``(k, n + 1 - k)`` with the largest ``k`` whose coverage
    ``1 - 2 P(Binomial(n, 1/2) < k)`` is at least ``level`` (the whole range when none is).
    Infinite values (runs that diverged) sort above every finite one.

    Example::

        >>> median_interval([3.0, 1.0, 2.0, 5.0, 4.0])  # n = 5: the range covers 94%
        (3.0, 1.0, 5.0)
    """
    x = np.sort(np.asarray(values, dtype=float).ravel())
    if x.size == 0 or np.isnan(x).any():
        raise ValueError(f"median_interval needs non-NaN values, got {values!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    n = x.size
    below = [sum(math.comb(n, i) for i in range(k)) / 2 ** n for k in range(n + 1)]
    k = max([k for k in range(1, (n + 1) // 2 + 1) if 1 - 2 * below[k] >= level] or [1])
    return float(np.median(x)), float(x[k - 1]), float(x[n - k])


class Cell(NamedTuple):
    """One cell of the map: ``left`` of ``n`` seeds left the trivial phase (``share``); the
    median final loss and its interval (:func:`median_interval`)."""

    left: int
    n: int
    share: float
    median: float
    low: float
    high: float


def design_map(results: Results, bar: float = BAR) -> dict[tuple[str, int, float, int], Cell]:
    """The map: ``(design, depth, lr, warmup) -> Cell`` for every cell of the grid."""
    out = {}
    for d in results.config["designs"]:
        for c in cells(results):
            v = variant_name(d, *c)
            left = left_trivial(results, v, bar)
            out[(d, *c)] = Cell(int(left.sum()), left.size, float(left.mean()),
                                *median_interval(final_loss(results, v)))
    return out


def collapsed(results: Results, variant: str, bar: float = BAR, window: int = 5
              ) -> np.ndarray:
    """Whether each seed's run learnt, then collapsed, ``(seeds,)`` bool: the mean of
    ``window`` consecutive training losses went at least ``bar`` below the position-wise
    unigram loss (a run with fewer losses is read loss by loss), and the run ended above it
    (final held-out loss) or stopped being finite."""
    base = results.info["baseline_loss"]
    end = final_loss(results, variant)
    out = []
    for k, r in enumerate(results.select(variant)):
        x = np.asarray(r.history.losses, dtype=float)
        m = np.convolve(x, np.ones(window) / window, "valid") if x.size >= window else x
        out.append(bool(m.size and m.min() < base - bar and end[k] > base))
    return np.array(out, dtype=bool)


def course_reports(results: Results, bar: float = BAR) -> dict[str, list[tuple]]:
    """Where on the map each kind of one-run report comes from.

    - ``"learnt, then collapsed"``: ``(design, depth, lr, warmup)`` cells where some seed's
      run learnt, then collapsed (:func:`collapsed`);
    - ``"fails at every rate"``: ``(design, depth, warmup)`` where at every peak rate fewer
      than half of the seeds left the trivial phase;
    - ``"no instability, Post-LN close to Pre-LN"``: ``(depth, lr, warmup)`` cells where
      every seed of Post-LN and of Pre-LN left the trivial phase and the two medians' intervals
      (:func:`median_interval`) overlap.
    """
    cfg, m = results.config, design_map(results, bar)
    out: dict[str, list[tuple]] = {"learnt, then collapsed": [], "fails at every rate": [],
                                   "no instability, Post-LN close to Pre-LN": []}
    for d in cfg["designs"]:
        for c in cells(results):
            if collapsed(results, variant_name(d, *c), bar).any():
                out["learnt, then collapsed"].append((d, *c))
        for n in cfg["depths"]:
            for w in cfg["warmups"]:
                if all(m[(d, n, lr, w)].share < 0.5 for lr in cfg["lrs"]):
                    out["fails at every rate"].append((d, n, w))
    if {"post", "pre"} <= set(cfg["designs"]):
        for c in cells(results):
            a, b = m[("post", *c)], m[("pre", *c)]
            if a.left == a.n and b.left == b.n and a.low <= b.high and b.low <= a.high:
                out["no instability, Post-LN close to Pre-LN"].append(c)
    return out


def _short(loss: float) -> str:
    """A final loss in a few characters: ``0.53``, ``8e+08``, ``inf``."""
    if not math.isfinite(loss):
        return "inf"
    return f"{loss:.2f}" if loss < 100 else f"{loss:.0e}"


def plot_map(results: Results, bar: float = BAR, ax: Any = None) -> Any:
    """A heat map of :func:`design_map`: one row per design and depth, one column per peak
    rate and warm-up, colour the share of seeds that left the trivial phase, text the
    seeds that left and the median final loss. Returns the axes."""
    import matplotlib.pyplot as plt

    cfg, m = results.config, design_map(results, bar)
    rows = [(d, n) for d in cfg["designs"] for n in cfg["depths"]]
    cols = [(lr, w) for lr in cfg["lrs"] for w in cfg["warmups"]]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.3 * len(cols) + 2, 0.42 * len(rows) + 1.2),
                             layout="constrained")
    share = np.array([[m[(d, n, lr, w)].share for lr, w in cols] for d, n in rows])
    im = ax.imshow(share, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for i, (d, n) in enumerate(rows):
        for j, (lr, w) in enumerate(cols):
            c = m[(d, n, lr, w)]
            ax.text(j, i, f"{c.left}/{c.n}  {_short(c.median)}", ha="center", va="center",
                    fontsize=8, color="white" if c.share < 0.5 else "black")
    ax.set_xticks(range(len(cols)), [f"lr {lr:g}\nwarm-up {w}" for lr, w in cols])
    ax.set_yticks(range(len(rows)),
                  [f"{d}, {n} block{'s' if n > 1 else ''}" for d, n in rows])
    ax.figure.colorbar(im, ax=ax, label="share of seeds that left the trivial phase")
    ax.set_title("seeds that left / median final loss (nats)")
    return ax


def total_spikes(results: Results, design: str, window: int = 5, rise: float = 0.5
                 ) -> np.ndarray:
    """``design``'s :func:`spikes` summed over the grid's cells, per seed, ``(seeds,)``."""
    return np.sum([spikes(results, variant_name(design, *c), window, rise)
                   for c in cells(results)], axis=0)


def fewer_spikes(results: Results, steadier: str, other: str, window: int = 5,
                 rise: float = 0.5) -> np.ndarray:
    """For each seed, ``(S_other - S_steadier) / max(S_other + S_steadier, 1)`` where ``S`` is
    a design's :func:`total_spikes`: in [-1, 1], positive when ``steadier`` spikes less, 0 when
    neither spikes. ``(seeds,)``."""
    a = total_spikes(results, steadier, window, rise)
    b = total_spikes(results, other, window, rise)
    return (b - a) / np.maximum(a + b, 1)


def both_trained(results: Results, a: str, b: str, bar: float = BAR) -> np.ndarray:
    """Whether designs ``a`` and ``b`` each left the trivial phase in at least one cell of
    the grid, per seed, ``(seeds,)`` bool: the trivial-phase bar of P23's and P29's parts."""
    return (cells_trained(results, a, bar) > 0) & (cells_trained(results, b, bar) > 0)


def claim_values(results: Results, amp: dict[str, np.ndarray], bar: float = BAR
                 ) -> dict[str, dict[str, np.ndarray]]:
    """The per-seed values of each part of P23 and P29 as ``claims.yml`` declares them:
    ``{"P23": {part: (seeds,)}, "P29": {...}}`` (NaN where a seed counts for neither side);
    ``amp`` is :func:`amplification`'s (its deepest depth is read)."""
    return {
        "P23": {"Post-LN amplifies a small update": np.log10(amp["post"][:, -1]
                                                              / amp["pre"][:, -1]),
                "Post-LN ends lower where it trains": ends_lower(results, "post", "pre", bar),
                "Post-LN fails where Pre-LN trains": cells_trained(results, "pre", bar)
                - cells_trained(results, "post", bar)},
        "P29": {"trains where Pre-LN does not": cells_trained(results, "olmo2", bar)
                - cells_trained(results, "pre", bar),
                "fewer loss spikes": fewer_spikes(results, "olmo2", "pre")},
    }


def pilot_summary(results: Results, amp: dict[str, np.ndarray], claim: str, note: str,
                  bar: float = BAR) -> dict[str, Any]:
    """What a pilot record (``lnbook/pilots/<claim>.json``) keeps of a pilot run: the config
    and seeds, the per-seed values of the claim's parts (:func:`claim_values`), the map
    (:func:`design_map`, one line per cell), the amplification probe's seed means per design
    and depth, and ``note``, what the pilot showed and chose."""
    values = claim_values(results, amp, bar)[claim]
    cellmap = {variant_name(d, n, lr, w): {k: "inf" if v == math.inf else v
                                           for k, v in c._asdict().items()}
               for (d, n, lr, w), c in design_map(results, bar).items()}
    return {"claim": claim, "experiment": NAME, "config": results.config,
            "seeds": results.seeds, "baseline_loss": results.info["baseline_loss"],
            "bar": bar, "per_seed": {k: [None if not math.isfinite(x) else float(x)
                                         for x in v] for k, v in values.items()},
            "map": cellmap, "amplification": {d: a.mean(0).tolist() for d, a in amp.items()},
            "note": note}


# --- the low-precision column --------------------------------------------------------------


def low_precision_config(config: Config, designs: Sequence[str] = ("none", "post", "pre"),
                         seeds: int = 3, autocast: str = "bfloat16") -> Config:
    """The chapter's low-precision column: ``config`` cut to one cell, the deepest depth at the
    lowest peak rate and the longest warm-up (the cell where designs train most easily, so that
    a design that stops training in low precision shows), for ``designs`` (default the three
    of the course reports: no norm, Post-LN, Pre-LN), on the first ``seeds`` seeds of the set
    in force (seeds given as a tuple in ``config``: its first ``seeds``), every run under
    ``autocast``; :func:`precision_column` reads it against the float32 grid."""
    first = seeds if isinstance(config.seeds, int) else tuple(config.seeds)[:seeds]
    return replace(config, designs=tuple(designs), depths=(max(config.depths),),
                   lrs=(min(config.lrs),), warmups=(max(config.warmups),), seeds=first,
                   autocast=autocast)


class PrecisionCell(NamedTuple):
    """One design in the low-precision column: the final held-out losses of the column's seeds
    in float32 (read from the grid) and in low precision, ``(seeds,)`` each (``inf`` where a
    run's loss stopped being finite); how many of those seeds left the trivial phase in each;
    and the median over the seeds where both are finite of low precision's loss minus
    float32's (NaN where there is none)."""

    float32: np.ndarray
    low: np.ndarray
    left_float32: int
    left_low: int
    median_change: float


def precision_column(results: Results, low: Results, bar: float = BAR
                     ) -> dict[str, PrecisionCell]:
    """The low-precision column against the float32 grid, per design: ``low`` is a
    :func:`run` of one cell with ``autocast`` (:func:`low_precision_config`), ``results`` a run
    of the grid whose seeds include ``low``'s (the same seeds start from the same parameters
    and see the same batches, so each pair of runs differs only by the precision)."""
    c = low.config
    if len(c["depths"]) != 1 or len(c["lrs"]) != 1 or len(c["warmups"]) != 1:
        raise ValueError("low must be a run of one cell (one depth, rate and warm-up)")
    cell = (c["depths"][0], c["lrs"][0], c["warmups"][0])
    if cell not in cells(results):
        raise ValueError(f"the cell {cell} is not in the grid of results")
    missing = [s for s in low.seeds if s not in results.seeds]
    if missing:
        raise ValueError(f"seeds {missing} of low are not in results")
    idx = [results.seeds.index(s) for s in low.seeds]
    out = {}
    for d in c["designs"]:
        v = variant_name(d, *cell)
        a, b = final_loss(results, v)[idx], final_loss(low, v)
        both = np.isfinite(a) & np.isfinite(b)
        change = float(np.median(b[both] - a[both])) if both.any() else math.nan
        out[d] = PrecisionCell(a, b, int(left_trivial(results, v, bar)[idx].sum()),
                               int(left_trivial(low, v, bar).sum()), change)
    return out
