"""Text-conditioned handwriting generation with a mixture density LSTM (section 6.5, Figure 5).

Book chapter `06_5_handwriting`; claim C16. :func:`make_handwriting` writes generated cursive
(IAM-OnDB cannot be downloaded here) as Graves' ``(dx, dy, eos)`` points with the letter each
point belongs to; :class:`HandwritingModel` is Graves' (2013) stacked LSTM with skip connections
and a mixture density output, reading the pen and the letter. :data:`VARIANTS`: ``"baseline"``
(eqs. 17-19), ``"layer_norm"`` (eqs. 20-22) and ``"ln_recurrent"`` (:class:`RecurrenceLNLSTM`:
eqs. 20-22 without the LN of ``W_x x_t``).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.bptt import ln_lstm_recurrence
from lnbook.checks import check_choice, check_config, check_size, check_subset
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.copies import train_copies
from lnbook.engine.job import Job, cpu_threads
from lnbook.engine.metrics import speedup
from lnbook.engine.results import Results
from lnbook.engine.runner import resolve_seeds, sweep
from lnbook.engine.stack import Stack
from lnbook.engine.train import Batches, History, fit
from lnbook.norms import LayerNorm
from lnbook.rnn import LSTM

__all__ = [
    "NAME", "DESCRIPTION", "VARIANTS", "LETTERS", "Letter", "Lines", "Config", "get_config",
    "make_handwriting", "strokes", "MixtureParams", "split_mixture_params", "mixture_nll",
    "fit_gaussian_mixture", "mixture_baseline_nll", "RecurrenceLNLSTM", "HandwritingModel",
    "evaluate", "race", "c16_quantities", "run",
]

NAME = "handwriting"
DESCRIPTION = (
    "Text-conditioned handwriting generation on generated cursive: a mixture density LSTM with "
    "no LN, LN (eqs. 20-22) and LN on the recurrence only, batches of 8 (section 6.5, Fig. 5)"
)
VARIANTS: tuple[str, ...] = ("baseline", "layer_norm", "ln_recurrent")
OFFSET_SCALE = 0.1  # pen units per offset unit: offsets are divided by it (std about 1)


class Letter(NamedTuple):
    """One letter shape of the generated cursive (sizes in pen units)."""

    name: str
    height: float
    width: float
    loop: float  # strength of the sideways swing; above about 0.5 it draws a loop
    cycles: int  # up-and-down swings per letter
    descender: bool  # drawn below the baseline


LETTERS: tuple[Letter, ...] = (
    Letter("a", 0.7, 0.8, 0.3, 1, False),
    Letter("e", 0.6, 0.6, 0.9, 1, False),
    Letter("l", 1.6, 0.5, 0.9, 1, False),
    Letter("t", 1.3, 0.5, 0.0, 1, False),
    Letter("m", 0.7, 1.0, 0.0, 2, False),
    Letter("w", 0.7, 1.0, 0.6, 2, False),
    Letter("g", 0.7, 0.7, 0.4, 1, True),
    Letter("y", 0.8, 0.6, 0.0, 1, True),
)


class Lines(NamedTuple):
    """Lines of handwriting: ``points`` float32 ``(N, T + 1, 3)`` (a zero start point, then
    ``(dx, dy, eos)`` in units of :data:`OFFSET_SCALE`) and ``letters`` int64 ``(N, T)`` (the
    index into :data:`LETTERS` of the letter of point ``t + 1``)."""

    points: Tensor
    letters: Tensor


@dataclass
class Config(RunConfig):
    """Sizes of the data, the model and the run (presets in :func:`get_config`).

    ``margin``: nats per point both models must end below the per-letter mixture to count
    as past the trivial phase (C16's bar, :func:`c16_quantities`); ``grad_clip`` clips every
    gradient entry to ``[-grad_clip, grad_clip]`` (0: off);
    ``stacked`` trains the seeds of each variant as one engine :class:`~lnbook.engine.Stack`
    (the same updates as one at a time, to rounding), False one by one with
    :func:`lnbook.fit` (the ``paper`` preset); both go through
    :func:`lnbook.engine.runner.sweep`, and
    ``checkpoint`` checkpoints each job under ``out``. :class:`~lnbook.engine.RunConfig`
    describes ``seeds``, ``steps``, ``threads`` and ``workers``.
    """

    seq_len: int = 100
    n_train: int = 160
    n_val: int = 8
    hidden_size: int = 32
    num_layers: int = 1
    n_mixtures: int = 5
    batch_size: int = 8
    steps: int = 60
    eval_every: int = 5
    lr: float = 5e-3
    grad_clip: float = 10.0
    margin: float = 0.5
    variants: tuple[str, ...] = VARIANTS
    seeds: int | tuple[int, ...] = 3
    data_seed: int = 2024
    stacked: bool = True
    checkpoint: bool = False

    def __post_init__(self) -> None:
        check_subset("variants", self.variants, VARIANTS)
        for name in ("seq_len", "n_train", "n_val", "hidden_size", "num_layers",
                     "n_mixtures", "batch_size", "steps", "eval_every"):
            check_size(name, getattr(self, name))


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        # Graves (2013) section 5.2 as the paper: 3 layers of 400, 20 components; Figure 5:
        # batches of 8, sequences of 500 points
        "seq_len": 500, "n_train": 12_000, "n_val": 256, "hidden_size": 400, "num_layers": 3,
        "n_mixtures": 20, "steps": 20_000, "eval_every": 500, "lr": 1e-4, "grad_clip": 10.0,
        "threads": None, "stacked": False, "checkpoint": True,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field overridden by keyword."""
    return make_config(Config, _PRESETS, scale, overrides)


# ----------------------------------------------------------------------------- the data


def _line(rng: np.random.Generator, n_points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pen positions ``(n, 2)``, end-of-stroke bits ``(n,)`` and letter indices ``(n,)``."""
    slant = rng.uniform(-0.2, 0.6)  # x shear per unit of height
    speed = rng.uniform(0.7, 1.4)  # a fast writer covers a letter in fewer points
    size = rng.uniform(0.8, 1.2)
    xs, ys, eos, ids = [], [], [], []
    x0 = 0.0
    while len(xs) < n_points:
        for _ in range(int(rng.integers(2, 6))):  # one word = one stroke
            k = int(rng.integers(len(LETTERS)))
            let = LETTERS[k]
            height = size * let.height * rng.uniform(0.9, 1.1)
            width = size * let.width * rng.uniform(0.9, 1.1)
            loop = max(0.0, let.loop + rng.uniform(-0.1, 0.1))
            n = max(4, int(round(let.cycles * rng.uniform(11, 14) / speed)))
            phi = np.linspace(0.0, 2 * np.pi * let.cycles, n, endpoint=False)  # (n,)
            y = 0.5 * height * (1 - np.cos(phi))  # up and down from the baseline
            if let.descender:
                y = -1.2 * y
            x = x0 + width * phi / (2 * np.pi * let.cycles) - 0.35 * loop * width * np.sin(phi)
            xs.extend(x + slant * y)
            ys.extend(y)
            eos.extend([0.0] * n)
            ids.extend([k] * n)
            x0 += width
        eos[-1] = 1.0  # lift the pen after the word
        x0 += size * rng.uniform(0.4, 0.9)  # the gap to the next word
    pts = np.stack([np.asarray(xs), np.asarray(ys)], axis=1)[:n_points]  # (n, 2)
    pts = pts + rng.normal(0.0, 0.01, size=pts.shape)  # a little tremor
    return pts, np.asarray(eos[:n_points]), np.asarray(ids[:n_points])


def make_handwriting(n: int, seq_len: int, seed: int) -> Lines:
    """Write ``n`` (>= 1) lines of ``seq_len`` (>= 2) points, deterministically from ``seed``:
    :class:`Lines` ``(n, seq_len + 1, 3)``, ``(n, seq_len)`` (the pen swings up and down once or
    twice per letter; each line has its own slant, size and speed; the pen lifts between words)."""
    for name, v, lo in (("n", n, 1), ("seq_len", seq_len, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    rng = np.random.default_rng(seed)
    points = np.zeros((n, seq_len + 1, 3), dtype=np.float32)
    letters = np.zeros((n, seq_len), dtype=np.int64)
    for k in range(n):
        pts, eos, ids = _line(rng, seq_len + 1)  # (seq_len + 1, 2), (seq_len + 1,) twice
        points[k, 1:, :2] = np.diff(pts, axis=0) / OFFSET_SCALE
        points[k, 1:, 2] = eos[1:]
        letters[k] = ids[1:]
    return Lines(torch.from_numpy(points), torch.from_numpy(letters))


def strokes(seq: Tensor | np.ndarray) -> list[np.ndarray]:
    """Turn ``(T, 3)`` offsets into a list of pen-down strokes, each ``(n, 2)`` positions (pen
    units); a stroke ends at every point whose end-of-stroke bit is 1."""
    a = np.asarray(seq.detach().cpu() if isinstance(seq, Tensor) else seq, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"seq must have shape (T, 3) = (dx, dy, eos) per point, got {a.shape}")
    pos = np.cumsum(a[:, :2] * OFFSET_SCALE, axis=0)  # (T, 2)
    ends = np.flatnonzero(a[:, 2] > 0.5)
    return [stroke for stroke in np.split(pos, ends + 1) if len(stroke)]


# ----------------------------------------------------------------------------- the mixture


@dataclass
class MixtureParams:
    """The output distribution of one point: ``M`` bivariate Gaussians and a Bernoulli."""

    log_pi: Tensor  # (*, M) log mixture weights
    mu: Tensor  # (*, M, 2) means of (dx, dy)
    log_sigma: Tensor  # (*, M, 2)
    rho: Tensor  # (*, M) correlations in (-1, 1)
    eos_logit: Tensor  # (*,) logit of the end-of-stroke probability


def split_mixture_params(y: Tensor, n_mixtures: int) -> MixtureParams:
    """Read the ``6M + 1`` raw outputs of the network as a :class:`MixtureParams` (Graves eqs.
    18-22, with ``sigmoid`` instead of Graves' ``1 / (1 + exp(e))`` for the end-of-stroke)."""
    M = n_mixtures
    if y.shape[-1] != 6 * M + 1:
        raise ValueError(f"expected {6 * M + 1} = 6M + 1 outputs for M={M}, got {y.shape[-1]}")
    lead = y.shape[:-1]
    pi, mu, ls, rho, e = y.split([M, 2 * M, 2 * M, M, 1], dim=-1)
    return MixtureParams(
        log_pi=torch.log_softmax(pi, dim=-1),  # (*, M)
        mu=mu.reshape(*lead, M, 2),  # (*, M, 2)
        log_sigma=ls.reshape(*lead, M, 2).clamp(min=-7.0, max=7.0),  # (*, M, 2)
        rho=torch.tanh(rho) * (1 - 1e-5),  # (*, M), kept off +-1
        eos_logit=e.squeeze(-1),  # (*,)
    )


def mixture_nll(p: MixtureParams, target: Tensor) -> Tensor:
    r"""Negative log likelihood (nats) of points ``target`` = ``(*, 3)`` = (dx, dy, eos).

    .. math::

        -\log \sum_j \pi_j \mathcal N(dx, dy \mid \mu_j, \sigma_j, \rho_j)
        - \log \big(e^{eos} (1 - e)^{1 - eos}\big),

    with the bivariate normal density
    :math:`\exp(-Z / (2(1-\rho^2))) / (2\pi\sigma_1\sigma_2\sqrt{1-\rho^2})`,
    :math:`Z = z_1^2 + z_2^2 - 2\rho z_1 z_2`, :math:`z_k = (x_k - \mu_k)/\sigma_k`
    (Graves 2013, eqs. 23-26), with ``logsumexp``. Returns ``(*)``.
    """
    if target.shape[-1] != 3:
        raise ValueError(f"target must end in 3 = (dx, dy, eos), got shape {tuple(target.shape)}")
    xy = target[..., None, :2]  # (*, 1, 2)
    z = (xy - p.mu) * torch.exp(-p.log_sigma)  # (*, M, 2)
    one_m_r2 = 1 - p.rho**2  # (*, M)
    Z = z[..., 0] ** 2 + z[..., 1] ** 2 - 2 * p.rho * z[..., 0] * z[..., 1]  # (*, M)
    log_n = (-Z / (2 * one_m_r2) - math.log(2 * math.pi) - p.log_sigma.sum(-1)
             - 0.5 * torch.log(one_m_r2))  # (*, M)
    nll_xy = -torch.logsumexp(p.log_pi + log_n, dim=-1)  # (*)
    nll_eos = F.binary_cross_entropy_with_logits(p.eos_logit, target[..., 2], reduction="none")
    return nll_xy + nll_eos


def fit_gaussian_mixture(xy: np.ndarray, n_components: int, seed: int = 0, iters: int = 40,
                         reg: float = 1e-4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit ``n_components`` bivariate Gaussians to ``xy`` ``(N, 2)`` by EM (at most ``iters``
    steps, float64; ``reg`` added to every covariance's diagonal).

    Returns ``(weights (K,), means (K, 2), covariances (K, 2, 2))``.
    """
    x = np.asarray(xy, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != 2 or len(x) < n_components:
        raise ValueError(f"xy must be (N >= {n_components}, 2) points, got {x.shape}")
    rng = np.random.default_rng(seed)
    means = x[rng.choice(len(x), n_components, replace=False)]  # (K, 2)
    covs = np.repeat(np.cov(x.T)[None] + reg * np.eye(2), n_components, axis=0)  # (K, 2, 2)
    weights = np.full(n_components, 1.0 / n_components)
    prev = -np.inf
    for _ in range(iters):
        ll, r = _mixture_log_likelihood(x, weights, means, covs)  # (N,), (N, K)
        nk = r.sum(0) + 1e-12  # (K,)
        weights = nk / len(x)
        means = (r.T @ x) / nk[:, None]  # (K, 2)
        d0, d1 = x[:, :1] - means[:, 0], x[:, 1:] - means[:, 1]  # (N, K) each
        s00, s01, s11 = ((r * d0 * d0).sum(0), (r * d0 * d1).sum(0), (r * d1 * d1).sum(0))
        covs = np.stack([np.stack([s00, s01], -1), np.stack([s01, s11], -1)], -2)
        covs = covs / nk[:, None, None] + reg * np.eye(2)  # (K, 2, 2)
        if ll.mean() - prev < 1e-6:
            break
        prev = ll.mean()
    return weights, means, covs


def _mixture_log_likelihood(x: np.ndarray, weights: np.ndarray, means: np.ndarray,
                            covs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``log sum_k w_k N(x_n | mu_k, S_k)`` ``(N,)`` and the responsibilities ``(N, K)``."""
    a, b, c = covs[:, 0, 0], covs[:, 0, 1], covs[:, 1, 1]  # (K,)
    det = a * c - b * b
    d = x[:, None, :] - means[None]  # (N, K, 2)
    maha = (c * d[..., 0] ** 2 - 2 * b * d[..., 0] * d[..., 1] + a * d[..., 1] ** 2) / det
    log_p = np.log(weights) - np.log(2 * np.pi) - 0.5 * np.log(det) - 0.5 * maha  # (N, K)
    top = log_p.max(axis=1, keepdims=True)
    e = np.exp(log_p - top)
    total = e.sum(axis=1, keepdims=True)
    return (np.log(total) + top)[:, 0], e / total


def mixture_baseline_nll(train: Lines, valid: Lines, n_components: int = 5,
                         per_letter: bool = True, seed: int = 0, max_points: int = 1500) -> float:
    """Held-out NLL per point (nats) of a memoryless predictor: a Gaussian mixture of the
    offsets and a Bernoulli of the end-of-stroke bit (one per letter with ``per_letter``),
    fitted to at most ``max_points`` training points each: the trivial predictor to beat."""
    rng = np.random.default_rng(seed)
    tr, va = (d.points[:, 1:].reshape(-1, 3).double().numpy() for d in (train, valid))  # (N T, 3)
    tr_xy, tr_eos, va_xy, va_eos = tr[:, :2], tr[:, 2], va[:, :2], va[:, 2]
    tr_k, va_k = (d.letters.reshape(-1).numpy() if per_letter else np.zeros(d.letters.numel(), int)
                  for d in (train, valid))
    nll = np.zeros(len(va_xy))
    for k in np.unique(va_k):
        rows = np.flatnonzero(tr_k == k)
        if len(rows) < n_components:
            raise ValueError(f"letter {k} has {len(rows)} training points; too few to fit")
        if len(rows) > max_points:
            rows = rng.choice(rows, max_points, replace=False)
        params = fit_gaussian_mixture(tr_xy[rows], n_components, seed=seed)
        p = float(np.clip(tr_eos[rows].mean(), 1e-4, 1 - 1e-4))
        m = va_k == k
        log_xy = _mixture_log_likelihood(va_xy[m], *params)[0]
        nll[m] = -log_xy - np.where(va_eos[m] > 0.5, np.log(p), np.log1p(-p))
    return float(nll.mean())


# ----------------------------------------------------------------------------- the LSTMs


class RecurrenceLNLSTM(nn.Module):
    r"""One LSTM layer with layer normalization on the recurrence (eqs. 20-22, optionally
    without the LN of the input term).

    .. math::

        (f_t, i_t, o_t, g_t) = \mathrm{LN}(W_h h_{t-1}; \alpha_1) + [\mathrm{LN}](W_x x_t) + b,
        \qquad h_t = \sigma(o_t) \odot \tanh(\mathrm{LN}(c_t; \alpha_3, \beta_3)),

    with :math:`c_t` as eq. 21; ``normalize_input=True`` normalizes :math:`W_x x_t` too (then
    it is ``lnbook.LSTM(layer_norm=True)``). The time loop is
    :func:`lnbook.bptt.ln_lstm_recurrence`.

    Shape: x ``(T, B, input_size)``, state ``(h_0, c_0)`` each ``(1, B, H)`` or None; output
    ``(output (T, B, H), (h_n, c_n))`` as :class:`torch.nn.LSTM`.
    """

    def __init__(self, input_size: int, hidden_size: int, normalize_input: bool = False,
                 eps: float = 1e-5) -> None:
        super().__init__()
        for name, v in (("input_size", input_size), ("hidden_size", hidden_size)):
            check_size(name, v)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.normalize_input, self.eps = bool(normalize_input), float(eps)
        G = 4 * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(G, input_size))
        self.weight_hh = nn.Parameter(torch.empty(G, hidden_size))
        self.bias = nn.Parameter(torch.empty(G))
        self.ln_ih = LayerNorm(G, eps=eps) if normalize_input else None
        self.ln_hh = LayerNorm(G, eps=eps, bias=False)  # its bias would duplicate `bias`
        self.ln_c = LayerNorm(hidden_size, eps=eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights and bias uniform in +-1/sqrt(H) as torch's LSTM; LN gains 1, biases 0."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in (self.weight_ih, self.weight_hh, self.bias):
            nn.init.uniform_(p, -bound, bound)
        for m in (self.ln_ih, self.ln_hh, self.ln_c):
            if m is not None:
                m.reset_parameters()

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"x must be (T, B, {self.input_size}), got {tuple(x.shape)}")
        B, H, G = x.shape[1], self.hidden_size, 4 * self.hidden_size
        if state is None:
            h0 = c0 = x.new_zeros(B, H)
        else:
            h0, c0 = state[0].reshape(B, H), state[1].reshape(B, H)
        gi = F.linear(x, self.weight_ih)  # (T, B, 4H)
        if self.ln_ih is not None:
            gi = F.layer_norm(gi, (G,), self.ln_ih.weight, self.ln_ih.bias, self.eps)
        gi = gi + self.bias
        # the time loop and its backward through time: lnbook.bptt, as in lnbook.LSTM
        hs, h, c = ln_lstm_recurrence(gi, h0, c0, self.weight_hh, self.ln_hh.weight,
                                      self.ln_c.weight, self.ln_c.bias, self.eps, self.eps)
        return hs, (h[None], c[None])  # (T, B, H), ((1, B, H), (1, B, H))

    @torch.no_grad()
    def match_input_scale(self, x: Tensor) -> float:
        """Scale ``weight_ih`` so that ``W_x x`` has unit variance across the gates on ``x``
        ``(T, B, input_size)``, as LN would give it; the factor (1 with ``normalize_input``)."""
        if self.ln_ih is not None:
            return 1.0
        std = float(F.linear(x, self.weight_ih).var(-1, unbiased=False).mean().sqrt())
        if not std > 0:
            raise ValueError("the input term is zero on these inputs; cannot match its scale")
        self.weight_ih.div_(std)
        return 1.0 / std

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, "
                f"normalize_input={self.normalize_input}, eps={self.eps}")


_LSTMS: dict[str, Callable[[int, int], nn.Module]] = {  # (input_size, hidden_size) -> layer
    "baseline": nn.LSTM,  # eqs. 17-19
    "layer_norm": partial(LSTM, layer_norm=True),  # eqs. 20-22
    "ln_recurrent": RecurrenceLNLSTM,  # eqs. 20-22 without the LN of W_x x_t
}


# ----------------------------------------------------------------------------- the model


class HandwritingModel(nn.Module):
    """Stacked LSTMs with skip connections and a mixture density output, reading the pen and
    the letter being written (Graves 2013, sections 4-5).

    Step t reads ``x_t = [pen point t (3), one-hot letter of point t + 1 (K)]``; layer l > 1
    also reads layer l-1's output; the head reads all layers and emits the ``6M + 1`` mixture
    parameters of point t + 1.

    Shape: ``forward(points (B, T + 1, 3), letters (B, T))`` -> mean NLL per point (scalar);
    :meth:`nll` -> ``(B, T)``; :meth:`sample` -> ``(T, 3)``.
    """

    def __init__(self, hidden_size: int = 32, num_layers: int = 1, n_mixtures: int = 5,
                 variant: str = "layer_norm", n_letters: int = len(LETTERS)) -> None:
        super().__init__()
        check_choice("variant", variant, VARIANTS)
        self.hidden_size, self.num_layers, self.n_mixtures = hidden_size, num_layers, n_mixtures
        self.variant, self.n_letters = variant, n_letters
        n_in = 3 + n_letters
        self.layers = nn.ModuleList(_LSTMS[variant](n_in if k == 0 else n_in + hidden_size,
                                                    hidden_size) for k in range(num_layers))
        self.head = nn.Linear(num_layers * hidden_size, 6 * n_mixtures + 1)

    def _run(self, x: Tensor, states: list[tuple[Tensor, Tensor]] | None = None,
             factors: list[float] | None = None) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Raw outputs ``(T, B, 6M + 1)`` and states; ``factors``: match input scales first."""
        inp, outs, new_states = x, [], []
        for k, lstm in enumerate(self.layers):
            if factors is not None and isinstance(lstm, RecurrenceLNLSTM):
                factors.append(lstm.match_input_scale(inp))
            y, st = lstm(inp, None if states is None else states[k])  # (T, B, H)
            outs.append(y)
            new_states.append(st)
            inp = torch.cat([x, y], dim=-1)  # (T, B, 3 + K + H) skip connection from the input
        return self.head(torch.cat(outs, dim=-1)), new_states

    def _inputs(self, pen: Tensor, letters: Tensor) -> Tensor:
        """``(T, B, 3 + K)`` inputs from pen points ``(B, T, 3)`` and letters ``(B, T)``."""
        code = F.one_hot(letters, self.n_letters).to(pen.dtype)  # (B, T, K)
        return torch.cat([pen, code], dim=-1).transpose(0, 1)

    def nll(self, points: Tensor, letters: Tensor) -> Tensor:
        """Per-point NLL ``(B, T)`` of ``points[:, 1:]`` given the points before each."""
        if not isinstance(points, Tensor) or points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must be a (B, T + 1, 3) tensor, got "
                             f"{getattr(points, 'shape', points)}")
        B, T = points.shape[0], points.shape[1] - 1
        if letters.shape != (B, T) or letters.dtype != torch.int64:
            raise ValueError(f"letters must be int64 ({B}, {T}) for these points, got "
                             f"{letters.dtype} {tuple(letters.shape)}")
        if letters.min() < 0 or letters.max() >= self.n_letters:
            raise ValueError(f"letters must lie in [0, {self.n_letters}), got "
                             f"[{int(letters.min())}, {int(letters.max())}]")
        return self._nll(points, letters).t()  # (B, T)

    def _nll(self, points: Tensor, letters: Tensor) -> Tensor:
        """:meth:`nll` without its checks, ``(T, B)``: what runs under ``vmap``, where the
        checks of the letters' values (read as Python numbers) cannot."""
        y, _ = self._run(self._inputs(points[:, :-1], letters))  # (T, B, 6M + 1)
        p = split_mixture_params(y, self.n_mixtures)
        return mixture_nll(p, points[:, 1:].transpose(0, 1))

    def forward(self, points: Tensor, letters: Tensor) -> Tensor:
        return self.nll(points, letters).mean()

    @torch.no_grad()
    def match_input_scales(self, points: Tensor, letters: Tensor) -> list[float]:
        """:meth:`RecurrenceLNLSTM.match_input_scale` on every such layer, layer by layer on
        the inputs it gets from these lines; the factors."""
        factors: list[float] = []
        self._run(self._inputs(points[:, :-1], letters), factors=factors)
        return factors

    @torch.no_grad()
    def sample(self, letters: Tensor, seed: int = 0, bias: float = 0.0) -> Tensor:
        """Write ``letters`` ``(T,)`` (one per point) one point at a time, feeding each sample
        back; ``bias`` >= 0 sharpens it as Graves (2013, section 5.4)."""
        g = torch.Generator().manual_seed(seed)
        dev = self.head.weight.device
        pen = torch.zeros(1, 1, 3, device=dev)  # (B=1, T=1, 3) the start point
        states, out = None, []
        for k in letters.tolist():
            x = self._inputs(pen, torch.tensor([[k]], device=dev))  # (1, 1, 3 + K)
            y, states = self._run(x, states)  # (1, 1, 6M + 1)
            p = split_mixture_params(y[0, 0].cpu(), self.n_mixtures)
            j = int(torch.multinomial(torch.softmax(p.log_pi * (1 + bias), -1), 1, generator=g))
            s = torch.exp(p.log_sigma[j] - bias)  # (2,)
            r = float(p.rho[j])
            e1, e2 = torch.randn(2, generator=g)
            dx = p.mu[j, 0] + s[0] * e1
            dy = p.mu[j, 1] + s[1] * (r * e1 + math.sqrt(1 - r * r) * e2)
            eos = float(torch.rand(1, generator=g) < torch.sigmoid(p.eos_logit))
            out.append(torch.tensor([float(dx), float(dy), eos]))
            pen = out[-1].to(dev).view(1, 1, 3)
        return torch.stack(out)  # (T, 3)


def evaluate(model: HandwritingModel, data: Lines, batch_size: int = 64) -> dict[str, float]:
    """Mean NLL per point (nats) of ``model`` on ``data``."""
    dev = model.head.weight.device
    total = 0.0
    for i in range(0, len(data.points), batch_size):
        pts = data.points[i : i + batch_size].to(dev)
        total += float(model.nll(pts, data.letters[i : i + batch_size].to(dev)).sum())
    return {"nll": total / data.letters.numel()}


# ----------------------------------------------------------------------------- the experiment


def race(results: Results, variant: str, reference: str = "baseline",
         metric: str = "nll") -> dict[str, np.ndarray]:
    """Updates each seed of ``variant`` needs to reach the last ``metric`` of the same seed of
    ``reference`` (lower is better), both read between evaluations
    (:meth:`~lnbook.engine.results.Results.updates_to`).

    Returns ``{"target", "reference_updates", "updates", "speedup"}``, one value per seed
    (``updates`` inf where never reached; ``speedup``: ``reference_updates / updates`` by
    :func:`lnbook.engine.metrics.speedup`, 0 where ``variant`` never reached the target).
    """
    target = results.final(reference, metric)  # (seeds,)
    u_ref = results.updates_to(reference, metric, target)
    u = results.updates_to(variant, metric, target)
    return {"target": target, "reference_updates": u_ref, "updates": u,
            "speedup": speedup(u_ref, u)}


def c16_quantities(results: Results) -> dict[str, np.ndarray]:
    """The per-seed quantities of C16's rule, ``(seeds,)`` each, from a run of :func:`run`:
    the baseline's updates to its own final held-out NLL over the LN-LSTM's (``much
    faster``, :func:`race`), the LN-LSTM's final NLL minus the baseline's in tenths of the
    baseline's distance below the per-letter mixture (``comparable``: at most 1 is within a
    tenth), and whether both models ended ``config.margin`` nats per point below the per-letter
    mixture (``left``, the trivial-phase bar)."""
    bar = results.info["gmm_letter_nll"]
    base, ln = results.final("baseline", "nll"), results.final("layer_norm", "nll")
    left = (base < bar - results.config["margin"]) & (ln < bar - results.config["margin"])
    return {"much faster": race(results, "layer_norm")["speedup"],
            "comparable": (ln - base) / (0.1 * (bar - base)), "left": left}


def _clip_hooks(model: nn.Module, clip: float) -> None:
    if clip > 0:
        for p in model.parameters():
            p.register_hook(lambda g: g.clamp(-clip, clip))


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every variant under every seed through :func:`lnbook.engine.runner.sweep`
    (stacked: one job per variant, its seeds the copies of one engine
    :class:`~lnbook.engine.Stack`; else one job per run).

    Runs record the held-out ``nll`` (nats per point); their ``info`` holds ``input_scales``
    (:meth:`HandwritingModel.match_input_scales`) and, for the first seed, ``sample`` (a line
    written for the first held-out line's letters). ``Results.info``: ``gmm_nll`` and
    ``gmm_letter_nll`` (:func:`mixture_baseline_nll` without and with ``per_letter``).
    """
    check_config(config, Config)
    with cpu_threads(config.threads):
        train = make_handwriting(config.n_train, config.seq_len, seed=config.data_seed)
        valid = make_handwriting(config.n_val, config.seq_len, seed=config.data_seed + 1)
        trivial = {"gmm_nll": mixture_baseline_nll(train, valid, config.n_mixtures, False),
                   "gmm_letter_nll": mixture_baseline_nll(train, valid, config.n_mixtures)}
    fn = partial(_train_stack if config.stacked else _train_one, config=config, train=train,
                 valid=valid, first=resolve_seeds(config.seeds)[0])
    return sweep(NAME, {v: v for v in config.variants}, config.seeds, fn, config=config,
                 stack="seeds" if config.stacked else None, device=device, out=out,
                 checkpoint=config.checkpoint, steps=config.steps, info=trivial,
                 threads=config.threads, workers=config.workers)


def _head(config: Config, train: Lines) -> tuple[Tensor, Tensor]:
    """The first training batch, on which ``ln_recurrent`` matches its input scales."""
    return train.points[: config.batch_size], train.letters[: config.batch_size]


def _train_one(job: Job, config: Config, train: Lines, valid: Lines,
               first: int) -> tuple[History, dict[str, Any]]:
    """One (variant, seed) of :func:`run` with :func:`lnbook.fit` (checkpointed)."""
    model, scales = _start(config, job.variant, job.seed, _head(config, train))
    _clip_hooks(model, config.grad_clip)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    hist = fit(model, Batches(*train, batch_size=config.batch_size, seed=job.seed),
               opt, steps=config.steps, eval_every=config.eval_every,
               eval_fn=partial(evaluate, data=valid), device=job.device,
               seed=job.seed, checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    return hist, _info(model, scales, job.seed, first, valid)


def _mean_nll(model: HandwritingModel, points: Tensor, letters: Tensor) -> Tensor:
    """One copy's mean NLL per point under the engine's ``vmap`` (the experiment's own lines
    pass :meth:`HandwritingModel.nll`'s checks)."""
    return model._nll(points, letters).mean()


def _vmappable(model: HandwritingModel) -> HandwritingModel:
    """``model`` with each torch ``nn.LSTM`` (the baseline's; it has no ``vmap`` rule) made
    :class:`lnbook.LSTM` without layer norm: the same parameters, names and function."""
    for k, layer in enumerate(model.layers):
        if isinstance(layer, nn.LSTM):
            model.layers[k] = LSTM.from_torch(layer, layer_norm=False)
    return model


def _train_stack(job: Job, config: Config, train: Lines, valid: Lines,
                 first: int) -> list[tuple[History, dict[str, Any]]]:
    """The seeds of the job's variant as the copies of one engine :class:`~lnbook.engine.Stack`;
    each copy reads its batches as its run alone reads them."""
    dev, seeds = job.device, job.seeds
    started = [_start(config, job.variant, s, _head(config, train)) for s in seeds]
    stack = Stack([_vmappable(copy.deepcopy(model)) for model, _ in started]).to(dev)
    _clip_hooks(stack, config.grad_clip)
    on_dev = [t.to(dev) for t in train]
    batches = [Batches(*on_dev, batch_size=config.batch_size, seed=s) for s in seeds]
    held_out = [t.to(dev) for t in valid]

    def losses(step: int) -> Tensor:
        pts, let = (torch.stack(t) for t in zip(*(b(step) for b in batches), strict=True))
        return stack.call(_mean_nll, pts, let)  # (S,): pts (S, B, T + 1, 3), let (S, B, T)

    @torch.no_grad()
    def evaluate_all() -> list[dict[str, float]]:
        return [{"nll": v} for v in stack.call(_mean_nll, *held_out, shared=(0, 1)).tolist()]

    opt = torch.optim.Adam(stack.parameters(), lr=config.lr, foreach=True)
    hist = train_copies(losses, evaluate_all, opt, [History() for _ in seeds], config.steps,
                        config.eval_every, state=stack, checkpoint=job.checkpoint,
                        bar=job.bar, label=job.label)
    out = []
    for s, (model, scales), trained, h in zip(seeds, started, stack.unstack(), hist,
                                                strict=True):
        model.to(dev).load_state_dict(trained.state_dict())  # torch's nn.LSTM back in place
        h.wall_time /= len(seeds)
        out.append((h, _info(model, scales, s, first, valid)))
    return out


def _start(config: Config, variant: str, seed: int,
           train_head: tuple[Tensor, Tensor]) -> tuple[HandwritingModel, list[float]]:
    """A model started under ``seed``, its input scales matched (ln_recurrent only)."""
    torch.manual_seed(seed)
    model = HandwritingModel(config.hidden_size, config.num_layers, config.n_mixtures,
                             variant=variant)
    return model, model.match_input_scales(*train_head)


def _info(model: HandwritingModel, scales: list[float], seed: int, first: int,
          valid: Lines) -> dict[str, Any]:
    """A run's info: its input scales and, for the first seed, a line the model wrote."""
    info: dict[str, Any] = {"input_scales": scales}
    if seed == first:
        model.eval()
        sample = model.sample(valid.letters[0].to(model.head.weight.device), seed=seed)
        info["sample"] = sample.cpu().numpy().round(4).tolist()  # (seq_len, 3)
    return info
