"""The running-sum sign task: RNNs with and without normalization, by length and batch size.

Chapter 3.1 (`03_1_ln_rnn`, claims C04 and C05): :func:`run` trains one :class:`SignModel`
per variant and seed. Chapter 7's task, the sign of the first input, is
:mod:`lnbook.experiments.first_sign`.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.analysis import RecurrentDynamics, recurrent_dynamics
from lnbook.checks import check_choice, check_config, check_size
from lnbook.device import resolve_device
from lnbook.engine import (
    Job,
    Results,
    cpu_threads,
    make_config,
    resolve_seeds,
    sweep,
)
from lnbook.engine.config import RunConfig
from lnbook.engine.train import History, fit
from lnbook.recurrent_bn import BatchNormRNN
from lnbook.rnn import RNN, LNRNNCell

__all__ = ["NAME", "DESCRIPTION", "VARIANTS", "Config", "get_config", "running_sum_batch",
           "trivial_errors", "SignModel", "error_per_step", "input_sensitivity", "state_sum_corr",
           "variant_name", "per_step", "run", "TRIVIAL_MARGIN", "c04_quantities", "c04_inputs",
           "IMPULSE_SIZES", "GAINS", "impulse_dynamics", "span", "drift", "c05_measure",
           "c05_inputs", "c05_pilot"]

NAME = "rnn_length"
DESCRIPTION = ("running-sum sign task: LN-RNN, per-step BN-RNN and plain RNN by training "
               "length and batch size; test sequences longer than training (3.1)")
VARIANTS = ("ln", "bn", "plain")
_TEST_SEED, _EVAL_SEED = 10_000, 20_000


@dataclass
class Config(RunConfig):
    """Sizes of the running-sum experiment; ``quick`` runs in seconds on a CPU.

    One sweep variant per (``variants``, ``train_lens``, ``batch_sizes``), each ``steps`` Adam
    updates at ``lr``; ``test_len`` (None: the training length) is the length of the
    ``test_batch`` test sequences, ``n_eval`` held-out sequences give the learning curves every
    ``eval_every`` updates; ``bn_gain_init`` is the BN-RNN's initial gain.
    """

    variants: tuple[str, ...] = VARIANTS
    train_lens: tuple[int, ...] = (10,)
    batch_sizes: tuple[int, ...] = (32,)
    test_len: int | None = 50
    hidden_size: int = 16
    steps: int = 60
    eval_every: int = 20
    lr: float = 1e-2
    n_eval: int = 256
    test_batch: int = 256
    bn_gain_init: float = 1.0
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self.variants = tuple(self.variants)
        if not isinstance(self.seeds, int):
            self.seeds = tuple(self.seeds)
        self.train_lens, self.batch_sizes = tuple(self.train_lens), tuple(self.batch_sizes)
        if not self.variants or not set(self.variants) <= set(VARIANTS):
            raise ValueError(f"variants must be drawn from {VARIANTS}, got {self.variants}")
        if not self.train_lens or min(self.train_lens) < 1:
            raise ValueError(f"train_lens must be lengths >= 1, got {self.train_lens}")
        if not self.batch_sizes or min(self.batch_sizes) < 2:
            raise ValueError(f"batch_sizes must be >= 2 (BN needs two), got {self.batch_sizes}")
        if self.test_len is not None and self.test_len < 1:
            raise ValueError(f"test_len must be >= 1 or None, got {self.test_len}")
        check_size("eval_every", self.eval_every)


PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"hidden_size": 128, "train_lens": (50,), "batch_sizes": (64,), "test_len": 500,
              "steps": 3000, "eval_every": 250, "lr": 3e-3, "n_eval": 1024,
              "test_batch": 1024, "threads": None},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The preset for ``scale`` ("quick" or "paper"), with ``overrides`` applied."""
    return make_config(Config, PRESETS, scale, overrides)


def running_sum_batch(batch: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Inputs ``(length, batch, 1)`` ~ N(0, 1) and targets ``(length, batch)``: sum so far > 0."""
    x = torch.randn(length, batch, 1, generator=generator)  # (T, B, 1)
    y = (x.squeeze(-1).cumsum(0) > 0).float()  # (T, B)
    return x, y


def trivial_errors(x: Tensor, y: Tensor) -> dict[str, list[float]]:
    """Per-step error rates, ``(T,)`` lists, of two untrained predictors: ``majority`` (the
    more frequent target at each step) and ``last_input`` (the sign of x_t alone)."""
    pos = y.mean(1)  # (T,)
    majority = torch.minimum(pos, 1 - pos)  # (T,)
    last = ((x.squeeze(-1) > 0).float() != y).float().mean(1)  # (T,)
    return {"majority": majority.tolist(), "last_input": last.tolist()}


class SignModel(nn.Module):
    """A one-layer tanh RNN (``ln``, ``bn`` or ``plain``) and a linear read-out to one logit.

    ``ln``: :class:`lnbook.RNN` with eq. 4; ``bn``: :class:`lnbook.BatchNormRNN` with
    ``train_len`` per-step statistics slots; ``plain``: :class:`lnbook.RNN` without LN.

    Shape:
        x: ``(T, B, 1)``, y: ``(T, B)``; ``forward(x, y)``: mean BCE; ``logits(x)``: ``(T, B)``.
    """

    def __init__(self, variant: str, hidden: int, train_len: int,
                 bn_gain_init: float = 1.0) -> None:
        super().__init__()
        self.variant = check_choice("variant", variant, VARIANTS)
        if variant == "bn":
            self.rnn: nn.Module = BatchNormRNN(1, hidden, max_steps=train_len,
                                               gain_init=bn_gain_init)
        else:
            self.rnn = RNN(1, hidden, layer_norm=variant == "ln")
        self.out = nn.Linear(hidden, 1)

    def logits(self, x: Tensor) -> Tensor:
        """``x`` (T, B, 1) -> logits (T, B)."""
        h, _ = self.rnn(x)  # (T, B, H)
        return self.out(h).squeeze(-1)  # (T, B)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(self.logits(x), y)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}"


def error_per_step(model: SignModel, x: Tensor, y: Tensor, batch_stats: bool = False) -> Tensor:
    """Fraction of wrong signs at each step, ``(T,)``: in eval mode, or with ``batch_stats``
    in training mode on a copy (BN uses the statistics of ``x``; T <= BN's ``max_steps``)."""
    m = copy.deepcopy(model) if batch_stats else model
    was = m.training
    m.train(batch_stats)
    with torch.no_grad():
        err = ((m.logits(x) > 0).float() != y).float().mean(1)  # (T,)
    m.train(was)
    return err


def input_sensitivity(model: SignModel, x: Tensor) -> Tensor:
    """Mean ``abs(d logit_T / d x_t)`` over the sequences of ``x``, ``(T,)``, in eval mode."""
    was = model.training
    model.eval()
    x = x.detach().clone().requires_grad_(True)  # (T, B, 1)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(model.logits(x)[-1].sum(), x)  # (T, B, 1)
    model.train(was)
    return grad.abs().mean(dim=(1, 2))  # (T,)


def state_sum_corr(model: SignModel, x: Tensor) -> float:
    """Pearson correlation of the state's norm with ``abs(x_1 + ... + x_t)`` over all steps
    and sequences of ``x`` (T, B, 1), in eval mode."""
    was = model.training
    model.eval()
    with torch.no_grad():
        h, _ = model.rnn(x)  # (T, B, H)
    model.train(was)
    size = x.squeeze(-1).cumsum(0).abs().flatten()  # (T * B,)
    norm = h.norm(dim=-1).flatten()  # (T * B,)
    return float(torch.corrcoef(torch.stack([norm, size]))[0, 1])


def variant_name(variant: str, train_len: int, batch_size: int) -> str:
    """The name of one (model, training length, batch size) variant, e.g. ``ln/len80/bs4``."""
    return f"{variant}/len{train_len}/bs{batch_size}"


def per_step(results: Results, variant: str, train_len: int, batch_size: int,
             key: str = "error") -> np.ndarray:
    """A per-step record of every seed of one variant: ``(seeds, T)`` (``info[key]``)."""
    return np.array(results.info_of(variant_name(variant, train_len, batch_size), key))


#: C04's trivial-phase bar: within the training length every model of a seed must beat the
#: better trivial predictor (:func:`trivial_errors`) by this much in error rate.
TRIVIAL_MARGIN = 0.1


def c04_quantities(results: Results) -> dict[str, Any]:
    """What C04's rule reads from a :func:`run`, at the first training length ``L`` and batch
    size of its config (``results.config``): per variant, ``(seeds,)`` each, the test error
    averaged over the steps within the training length (``inside``) and past it (``beyond``)
    and their ratio (``ratio``, the degradation); ``best_trivial``, the better trivial
    predictor's error within ``L``; and ``left`` (per seed), every model beating it by
    :data:`TRIVIAL_MARGIN`."""
    config = results.config
    n, b = config["train_lens"][0], config["batch_sizes"][0]
    err = {v: per_step(results, v, n, b) for v in config["variants"]}  # (seeds, test_len)
    trivial = results.info["trivial"][str(config["test_len"])]
    inside = {v: e[:, :n].mean(1) for v, e in err.items()}
    beyond = {v: e[:, n:].mean(1) for v, e in err.items()}
    best = min(float(np.mean(trivial["majority"][:n])),
               float(np.mean(trivial["last_input"][:n])))
    left = np.all([inside[v] <= best - TRIVIAL_MARGIN for v in config["variants"]], 0)
    return {"inside": inside, "beyond": beyond,
            "ratio": {v: beyond[v] / inside[v] for v in config["variants"]},
            "best_trivial": best, "left": left}


def c04_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """C04's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per seed
    (:func:`c04_quantities`): BN's degradation (error past the training length over the error
    within it) minus LN's; BN's error past the training length minus LN's; LN's degradation
    minus the plain RNN's. A seed counts where every model left the trivial phase."""
    q = c04_quantities(results)
    ratio, beyond = q["ratio"], q["beyond"]
    values = {"BN degrades more than LN": ratio["bn"] - ratio["ln"],
              "BN worse than LN past the training length": beyond["bn"] - beyond["ln"],
              "LN degrades no more than the plain RNN": ratio["ln"] - ratio["plain"]}
    return {"values": values, "trivial_ok": dict.fromkeys(values, q["left"])}


def _batch(n: int, length: int, seed: int) -> tuple[Tensor, Tensor]:
    return running_sum_batch(n, length, torch.Generator().manual_seed(seed))


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every (variant, length, batch size) with every seed; return the sweep's results.

    Curves: held-out ``nll`` and ``error``. ``Run.info``: ``error`` (per test step),
    ``sensitivity``, ``state_sum_corr`` (first ``length`` steps) and, for BN,
    ``error_batch_stats``. ``Results.info["trivial"][str(length)]``: :func:`trivial_errors`
    and ``constant_nll`` (log 2).
    """
    check_config(config, Config)
    test_len = {n: n if config.test_len is None else config.test_len for n in config.train_lens}
    held = {n: _batch(config.n_eval, n, _EVAL_SEED + n) for n in config.train_lens}
    tests = {n: _batch(config.test_batch, n, _TEST_SEED + n)
             for n in sorted(set(test_len.values()))}
    trivial = {str(n): {**trivial_errors(*xy), "constant_nll": math.log(2)}
               for n, xy in tests.items()}
    variants = {variant_name(v, L, B): (v, L, B) for L in config.train_lens
                for B in config.batch_sizes for v in config.variants}
    tests_of = {n: tests[test_len[n]] for n in config.train_lens}
    with cpu_threads(config.threads):
        return sweep(NAME, variants, config.seeds, partial(train_one, config, held, tests_of),
                     config=config, device=resolve_device(device), out=out, steps=config.steps,
                     threads=config.threads, workers=config.workers, info={"trivial": trivial})


def train_one(config: Config, held: dict[int, tuple[Tensor, Tensor]],
              tests: dict[int, tuple[Tensor, Tensor]], job: Job
              ) -> tuple[History, dict[str, Any]]:
    """One run: the :class:`SignModel` of ``job.params`` (variant, length, batch size) trained
    with seed ``job.seed``, evaluated on ``held[length]``; its history and the measurements on
    ``tests[length]`` (the test sequences of that training length)."""
    variant, length, bs = job.params
    torch.manual_seed(job.seed)
    model = SignModel(variant, config.hidden_size, length, config.bn_gain_init)
    x_eval, y_eval = (t.to(job.device) for t in held[length])

    def eval_fn(m: nn.Module) -> dict[str, float]:
        logits = m.logits(x_eval)  # (T, B)
        nll = F.binary_cross_entropy_with_logits(logits, y_eval)
        err = ((logits > 0).float() != y_eval).float().mean()
        return {"nll": float(nll), "error": float(err)}

    def data(step: int) -> tuple[Tensor, Tensor]:
        return _batch(bs, length, job.seed * 1_000_003 + step)

    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    hist = fit(model, data, opt, steps=config.steps, eval_every=config.eval_every,
               eval_fn=eval_fn, device=job.device, seed=job.seed,
               checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    x_test, y_test = (t.to(job.device) for t in tests[length])
    x_in, y_in = x_test[:length], y_test[:length]  # (L, B, 1), (L, B)
    info = {"error": error_per_step(model, x_test, y_test).cpu().tolist(),
            "sensitivity": input_sensitivity(model, x_test).cpu().tolist(),
            "state_sum_corr": state_sum_corr(model, x_in)}
    if variant == "bn":
        info["error_batch_stats"] = error_per_step(model, x_in, y_in, True).cpu().tolist()
    return hist, info


# --- claim C05: an untrained cell's response to one input (chapter 3.1) -----------------------

#: The impulse measurement's sizes per scale: (time steps T, hidden units H).
IMPULSE_SIZES = {"quick": (120, 64), "paper": (500, 256)}
#: The recurrence scales gamma of C05: contracting, neutral, expanding.
GAINS = (0.5, 1.0, 3.0)


def impulse_dynamics(gain: float, layer_norm: bool, seed: int, steps: int = 120,
                     hidden: int = 64, ln_gain: float = 1.0, every_step: bool = False
                     ) -> RecurrentDynamics:
    """An untrained cell's response to one input at t = 0 followed by zeros, in float64
    (:func:`lnbook.recurrent_dynamics` of 16 sequences of 8 inputs, ``steps`` long): an
    :class:`lnbook.LNRNNCell` of ``hidden`` units, with or without ``layer_norm``, whose W_hh is
    ``gain`` times a random orthogonal matrix and whose LN gain g is ``ln_gain``. With
    ``every_step`` a standard normal input arrives at every step instead (Exercise 3.1.2).
    ``seed`` draws the cell, the matrix and the input; torch's global random state is left as
    it was."""
    f64 = torch.float64
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cell = LNRNNCell(8, hidden, layer_norm=layer_norm).double()
        with torch.no_grad():
            q, _ = torch.linalg.qr(torch.randn(hidden, hidden, dtype=f64))  # (H, H)
            cell.weight_hh.copy_(gain * q)
            if layer_norm:
                cell.ln.weight.fill_(ln_gain)  # the gain g of eq. (4)
        x = torch.zeros(steps, 16, 8, dtype=f64)  # (T, B, 8)
        x[0] = 3 * torch.randn(16, 8, dtype=f64)
        if every_step:
            x = torch.randn(steps, 16, 8, dtype=f64)
    return recurrent_dynamics(cell, x)


def span(d: RecurrentDynamics) -> float:
    """The gradient span in decades: log10 ||dL/dh_1|| / ||dL/dh_T||."""
    return float(np.log10((d.grad_norm[0] / d.grad_norm[-1]).item()))


def drift(d: RecurrentDynamics) -> float:
    """The summed inputs' drift in decades: log10 rms(a_T) / rms(a_2)."""
    return float(np.log10((d.summed_input_rms[-1] / d.summed_input_rms[1]).item()))


def c05_measure(seeds: Sequence[int], gains: Sequence[float] = GAINS, steps: int = 120,
                hidden: int = 64) -> tuple[dict, dict, dict]:
    """Every (gain, layer_norm, seed)'s :func:`impulse_dynamics`, :func:`span` and
    :func:`drift`, three dicts with those keys (plain RNN and LN-RNN at each of ``gains``)."""
    dyn = {(g, ln, s): impulse_dynamics(g, ln, s, steps, hidden)
           for g in gains for ln in (False, True) for s in seeds}
    return (dyn, {k: span(d) for k, d in dyn.items()},
            {k: drift(d) for k, d in dyn.items()})


def c05_pilot(config: Config) -> dict[str, dict[str, Any]]:
    """C05's pilot (``pilot: measure`` in ``claims.yml``), on untrained cells: its per-seed
    quantities (:func:`c05_inputs`) on ``config.seeds`` at the scale's :data:`IMPULSE_SIZES`."""
    seeds = resolve_seeds(config.seeds)
    steps, hidden = IMPULSE_SIZES[config.scale]
    _, sp, dr = c05_measure(seeds, GAINS, steps, hidden)
    return c05_inputs(sp, dr, seeds, GAINS)


def c05_inputs(span: Mapping[tuple[float, bool, int], float],
               drift: Mapping[tuple[float, bool, int], float], seeds: Sequence[int],
               gains: Sequence[float]) -> dict[str, dict[str, Any]]:
    """C05's ``values`` for :func:`lnbook.ledger.decide_claim` from chapter 3.1's impulse
    measurements: ``span`` (log10 of the gradient reaching step 1 over that at the last step)
    and ``drift`` (log10 of the summed inputs' RMS at the last step over step 2), each keyed
    ``(gain, layer_norm, seed)``, at the recurrent ``gains`` (which include 1). Per seed:

    - "plain RNN drifts with the scale": the plain RNN's span at the smallest gain lies 3
      decades below its span at gain 1, at the largest 3 above, and its drift rises with the
      gain;
    - "LN removes the scale": at every gain the LN-RNN's span lies within log10 2 of its span
      at gain 1 and its drift within log10 1.05 of 0;
    - "LN inputs (gradient) steadier than plain at gamma 1": the LN-RNN's largest ``|drift|``
      (``|span|``) over the gains minus the plain RNN's at gain 1, in decades.
    """
    lo, hi = min(gains), max(gains)

    def plain(s: int) -> bool:
        sp, dr = (lambda g: span[(g, False, s)]), (lambda g: drift[(g, False, s)])
        return sp(lo) < sp(1.0) - 3 and sp(hi) > sp(1.0) + 3 and dr(lo) < dr(1.0) < dr(hi)

    def ln_flat(s: int) -> bool:
        return all(abs(span[(g, True, s)] - span[(1.0, True, s)]) < np.log10(2)
                   and abs(drift[(g, True, s)]) < np.log10(1.05) for g in gains)

    def ln_minus_plain(table: Mapping[tuple[float, bool, int], float], s: int) -> float:
        return max(abs(table[(g, True, s)]) for g in gains) - abs(table[(1.0, False, s)])

    return {"values": {
        "plain RNN drifts with the scale": [plain(s) for s in seeds],
        "LN removes the scale": [ln_flat(s) for s in seeds],
        "LN inputs steadier than plain at gamma 1": [ln_minus_plain(drift, s) for s in seeds],
        "LN gradient steadier than plain at gamma 1": [ln_minus_plain(span, s)
                                                       for s in seeds]}}
