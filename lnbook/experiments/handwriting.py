"""Handwriting generation with a mixture density LSTM (paper section 6.5, Figure 5, claim C16).

Book chapter `06_5_handwriting`. Section 6.5 trains the handwriting model of Graves (2013) on
IAM-OnDB pen trajectories (about 700 points per line) with mini-batches of 8, with and without
layer normalization in its LSTMs. IAM-OnDB cannot be downloaded here, so
:func:`make_handwriting` draws cursive-like pen trajectories from a small oscillation model of
handwriting: the pen moves right at a steady pace while it oscillates up and down once or twice
per letter; a horizontal oscillation in quadrature with the vertical one draws loops whenever it
is strong enough to reverse the pen; letters differ in height, width and loopiness, a line has
its own slant and speed, and the pen is lifted between words. A point is stored as Graves does,
as the offset from the previous point and an end-of-stroke bit, ``(dx, dy, eos)``.

The model (:class:`HandwritingModel`) is the unconditional network of Graves (2013, section 4):
stacked LSTMs with skip connections (the input feeds every layer, every layer feeds the output)
and a mixture density output: ``M`` bivariate Gaussians for the next offset and a Bernoulli for
the end-of-stroke bit. The loss is the negative log likelihood of the next point,
:func:`mixture_nll`, averaged over the points of a sequence (nats per point).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.device import resolve_device
from lnbook.experiments.protocol import make_config, save_results
from lnbook.rnn import LSTM
from lnbook.train import Batches, History, fit

__all__ = [
    "NAME",
    "DESCRIPTION",
    "VARIANTS",
    "Config",
    "get_config",
    "make_handwriting",
    "strokes",
    "MixtureParams",
    "split_mixture_params",
    "mixture_nll",
    "HandwritingModel",
    "evaluate",
    "updates_to_reach",
    "run",
]

NAME = "handwriting"
DESCRIPTION = (
    "Unconditional handwriting generation on generated cursive pen trajectories: stacked LSTMs "
    "with a Gaussian mixture output, with and without layer normalization (section 6.5, Fig. 5)"
)
VARIANTS: tuple[str, ...] = ("baseline", "layer_norm")
OFFSET_SCALE = 0.1  # pen units per offset unit: offsets are divided by it (std about 1)


@dataclass
class Config:
    """Sizes of the data, the model and the run (presets in :func:`get_config`).

    Attributes:
        scale: ``"quick"`` (seconds on a CPU) or ``"paper"`` (the paper's sizes, for a GPU).
        seq_len: points per training sequence (the model predicts ``seq_len`` points).
        n_train, n_valid: generated training and validation sequences.
        hidden_size, num_layers: LSTM units per layer and stacked layers.
        n_mixtures: bivariate Gaussian components M of the output.
        batch_size, steps, eval_every, lr: Adam training schedule (batch 8 as the paper).
        grad_clip: every gradient entry is clipped to [-grad_clip, grad_clip] (Graves 2013
            clips the derivatives too); 0 disables it.
        variants: from :data:`VARIANTS`.
        seeds: seeds of the models (initialization and batch order); the data are fixed.
        data_seed: seed of the generated trajectories.
    """

    scale: str = "quick"
    seq_len: int = 80
    n_train: int = 400
    n_valid: int = 32
    hidden_size: int = 48
    num_layers: int = 1
    n_mixtures: int = 5
    batch_size: int = 8
    steps: int = 100
    eval_every: int = 20
    lr: float = 5e-3
    grad_clip: float = 10.0
    variants: tuple[str, ...] = VARIANTS
    seeds: tuple[int, ...] = (0, 1, 2)
    data_seed: int = 2024


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        "seq_len": 700, "n_train": 12_000, "n_valid": 256, "hidden_size": 400, "num_layers": 3,
        "n_mixtures": 20, "steps": 20_000, "eval_every": 500, "lr": 1e-4, "grad_clip": 10.0,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field overridden by keyword.

    Example::

        >>> get_config("paper").hidden_size
        400
    """
    cfg = make_config(Config, _PRESETS, scale, overrides)
    for v in cfg.variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; expected one of {VARIANTS}")
    return cfg


# ----------------------------------------------------------------------------- the data


def _line(rng: np.random.Generator, n_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Pen positions ``(n, 2)`` and end-of-stroke bits ``(n,)`` of one line of cursive."""
    slant = rng.uniform(-0.2, 0.6)  # x shear per unit of height
    speed = rng.uniform(0.7, 1.4)  # a fast writer covers a letter in fewer points
    xs, ys, eos = [], [], []
    x0 = 0.0
    while len(xs) < n_points:
        n_letters = int(rng.integers(2, 6))  # one word = one stroke
        for _ in range(n_letters):
            height = rng.uniform(0.5, 1.5)
            width = rng.uniform(0.5, 1.0)
            loop = rng.uniform(0.0, 1.0) if rng.uniform() < 0.6 else 0.0  # >~0.5: a loop
            cycles = 2 if rng.uniform() < 0.25 else 1  # "m"- and "w"-like letters
            n = max(4, int(round(cycles * rng.uniform(10, 16) / speed)))
            phi = np.linspace(0.0, 2 * np.pi * cycles, n, endpoint=False)  # (n,)
            y = 0.5 * height * (1 - np.cos(phi))  # up and down from the baseline
            if rng.uniform() < 0.15:  # a descender, as in "g" or "y"
                y = -1.2 * y
            x = x0 + width * phi / (2 * np.pi * cycles) - 0.35 * loop * width * np.sin(phi)
            xs.extend(x + slant * y)
            ys.extend(y)
            eos.extend([0.0] * n)
            x0 += width
        eos[-1] = 1.0  # lift the pen after the word
        x0 += rng.uniform(0.4, 0.9)  # the gap to the next word
    pts = np.stack([np.asarray(xs), np.asarray(ys)], axis=1)[:n_points]  # (n, 2)
    pts = pts + rng.normal(0.0, 0.01, size=pts.shape)  # a little tremor
    return pts, np.asarray(eos[:n_points])


def make_handwriting(n: int, seq_len: int, seed: int) -> Tensor:
    """Generate ``n`` pen trajectories of ``seq_len`` points, deterministically from ``seed``.

    Each sequence starts with the zero point ``(0, 0, 0)`` (the model's first input), followed by
    ``seq_len`` points ``(dx, dy, eos)``: the pen's offset from the previous point in units of
    :data:`OFFSET_SCALE` and 1 when the pen is lifted after this point. See the module docstring
    for the model of handwriting.

    Args:
        n: number of sequences (>= 1).
        seq_len: points per sequence (>= 2).
        seed: seed of numpy's generator.

    Returns:
        float32 ``(n, seq_len + 1, 3)``.

    Example::

        >>> make_handwriting(2, 50, seed=0).shape
        torch.Size([2, 51, 3])
    """
    for name, v, lo in (("n", n, 1), ("seq_len", seq_len, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    rng = np.random.default_rng(seed)
    out = np.zeros((n, seq_len + 1, 3), dtype=np.float32)
    for k in range(n):
        pts, eos = _line(rng, seq_len + 1)  # (seq_len + 1, 2), (seq_len + 1,)
        out[k, 1:, :2] = np.diff(pts, axis=0) / OFFSET_SCALE
        out[k, 1:, 2] = eos[1:]
    return torch.from_numpy(out)


def strokes(seq: Tensor | np.ndarray) -> list[np.ndarray]:
    """Turn ``(T, 3)`` offsets into a list of pen-down strokes, each ``(n, 2)`` positions.

    Positions are the running sum of the offsets (in pen units); a stroke ends at every point
    whose end-of-stroke bit is 1 (the move to the next point is made with the pen up).
    """
    a = np.asarray(seq.detach().cpu() if isinstance(seq, Tensor) else seq, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"seq must have shape (T, 3) = (dx, dy, eos) per point, got {a.shape}")
    pos = np.cumsum(a[:, :2] * OFFSET_SCALE, axis=0)  # (T, 2)
    ends = np.flatnonzero(a[:, 2] > 0.5)
    out, start = [], 0
    for e in list(ends) + [len(a) - 1]:
        if e >= start:
            out.append(pos[start : e + 1])
        start = e + 1
    return out


# ----------------------------------------------------------------------------- the mixture


@dataclass
class MixtureParams:
    """The output distribution of one point: ``M`` bivariate Gaussians and a Bernoulli.

    Attributes (each with leading shape ``(*)``):
        log_pi: ``(*, M)`` log mixture weights (log-softmax of the raw outputs).
        mu: ``(*, M, 2)`` means of (dx, dy).
        log_sigma: ``(*, M, 2)`` log standard deviations.
        rho: ``(*, M)`` correlations in (-1, 1).
        eos_logit: ``(*,)`` logit of the end-of-stroke probability.
    """

    log_pi: Tensor
    mu: Tensor
    log_sigma: Tensor
    rho: Tensor
    eos_logit: Tensor


def split_mixture_params(y: Tensor, n_mixtures: int) -> MixtureParams:
    """Read the ``6M + 1`` raw outputs of the network as a :class:`MixtureParams` (Graves eqs.
    18-22, with ``sigmoid`` instead of Graves' ``1 / (1 + exp(e))`` for the end-of-stroke).
    """
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
    (Graves 2013, eqs. 23-26). Computed with ``logsumexp``, so it stays finite when every
    component is far from the point.

    Returns:
        ``(*)`` the NLL of every point.
    """
    if target.shape[-1] != 3:
        raise ValueError(f"target must end in 3 = (dx, dy, eos), got shape {tuple(target.shape)}")
    xy = target[..., None, :2]  # (*, 1, 2)
    z = (xy - p.mu) * torch.exp(-p.log_sigma)  # (*, M, 2)
    one_m_r2 = 1 - p.rho**2  # (*, M)
    Z = z[..., 0] ** 2 + z[..., 1] ** 2 - 2 * p.rho * z[..., 0] * z[..., 1]  # (*, M)
    log_n = (
        -Z / (2 * one_m_r2)
        - math.log(2 * math.pi)
        - p.log_sigma.sum(-1)
        - 0.5 * torch.log(one_m_r2)
    )  # (*, M)
    nll_xy = -torch.logsumexp(p.log_pi + log_n, dim=-1)  # (*)
    nll_eos = F.binary_cross_entropy_with_logits(p.eos_logit, target[..., 2], reduction="none")
    return nll_xy + nll_eos


# ----------------------------------------------------------------------------- the model


class HandwritingModel(nn.Module):
    """Stacked LSTMs with skip connections and a mixture density output (Graves 2013, sec. 4).

    Layer 1 reads the point ``x_t``; layer l > 1 reads ``x_t`` and layer l-1's output; the
    output layer reads all layers' outputs and emits the ``6M + 1`` mixture parameters of
    ``x_{t+1}``. Each layer is an :class:`lnbook.LSTM` (eqs. 20-22 with ``layer_norm=True``,
    eqs. 17-19 without).

    Args:
        hidden_size: LSTM units per layer.
        num_layers: stacked layers.
        n_mixtures: Gaussian components M.
        layer_norm: layer-normalized LSTMs.

    Shape:
        - ``forward(seq)``: seq ``(B, T + 1, 3)`` (first point the zero start point); returns
          the mean NLL per predicted point (a scalar).
        - :meth:`nll`: ``(B, T)`` per-point NLL. :meth:`sample`: ``(T, 3)``.

    Example::

        >>> model = HandwritingModel(32, num_layers=2, n_mixtures=3)
        >>> loss = model(make_handwriting(4, 30, seed=0))
    """

    def __init__(
        self, hidden_size: int = 48, num_layers: int = 1, n_mixtures: int = 5,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        self.hidden_size, self.num_layers, self.n_mixtures = hidden_size, num_layers, n_mixtures
        self.layers = nn.ModuleList(
            LSTM(3 if k == 0 else 3 + hidden_size, hidden_size, layer_norm=layer_norm)
            for k in range(num_layers)
        )
        self.head = nn.Linear(num_layers * hidden_size, 6 * n_mixtures + 1)

    def _run(
        self, x: Tensor, states: list[tuple[Tensor, Tensor]] | None = None
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Raw outputs ``(T, B, 6M + 1)`` for time-first ``x`` ``(T, B, 3)``, and the states."""
        inp, outs, new_states = x, [], []
        for k, lstm in enumerate(self.layers):
            y, st = lstm(inp, None if states is None else states[k])  # (T, B, H)
            outs.append(y)
            new_states.append(st)
            inp = torch.cat([x, y], dim=-1)  # (T, B, 3 + H) skip connection from the input
        return self.head(torch.cat(outs, dim=-1)), new_states

    def nll(self, seq: Tensor) -> Tensor:
        """Per-point NLL ``(B, T)`` of ``seq[:, 1:]`` given the points before each."""
        if not isinstance(seq, Tensor) or seq.dim() != 3 or seq.shape[-1] != 3:
            shape = getattr(seq, "shape", seq)
            raise ValueError(f"seq must be a (B, T + 1, 3) tensor, got {shape}")
        y, _ = self._run(seq[:, :-1].transpose(0, 1))  # (T, B, 6M + 1)
        p = split_mixture_params(y, self.n_mixtures)
        return mixture_nll(p, seq[:, 1:].transpose(0, 1)).t()  # (B, T)

    def forward(self, seq: Tensor) -> Tensor:
        return self.nll(seq).mean()

    @torch.no_grad()
    def sample(self, steps: int, seed: int = 0, bias: float = 0.0) -> Tensor:
        """Draw a trajectory of ``steps`` points, one point at a time.

        ``bias`` >= 0 sharpens the samples as Graves (2013, section 5.4): the mixture weights'
        logits are scaled by ``1 + bias`` and the standard deviations shrink by ``exp(-bias)``.
        """
        g = torch.Generator().manual_seed(seed)
        dev = self.head.weight.device
        x = torch.zeros(1, 1, 3, device=dev)  # (T=1, B=1, 3) the start point
        states, out = None, []
        for _ in range(steps):
            y, states = self._run(x, states)  # (1, 1, 6M + 1)
            p = split_mixture_params(y[0, 0].cpu(), self.n_mixtures)
            j = int(torch.multinomial(torch.softmax(p.log_pi * (1 + bias), -1), 1, generator=g))
            s = torch.exp(p.log_sigma[j] - bias)  # (2,)
            r = float(p.rho[j])
            e1, e2 = torch.randn(2, generator=g)
            dx = p.mu[j, 0] + s[0] * e1
            dy = p.mu[j, 1] + s[1] * (r * e1 + math.sqrt(1 - r * r) * e2)
            eos = float(torch.rand(1, generator=g) < torch.sigmoid(p.eos_logit))
            pt = torch.tensor([float(dx), float(dy), eos])
            out.append(pt)
            x = pt.to(dev).view(1, 1, 3)
        return torch.stack(out)  # (steps, 3)


def evaluate(model: HandwritingModel, data: Tensor, batch_size: int = 64) -> dict[str, float]:
    """Mean NLL per point (nats) of ``model`` on ``data`` ``(N, T + 1, 3)``."""
    dev = model.head.weight.device
    total = 0.0
    for i in range(0, len(data), batch_size):
        total += float(model.nll(data[i : i + batch_size].to(dev)).sum())
    return {"nll": total / (data.shape[0] * (data.shape[1] - 1))}


def updates_to_reach(eval_steps: list[int], values: list[float], target: float) -> int | None:
    """The first evaluation step at which ``values`` is at or below ``target`` (None if never)."""
    for s, v in zip(eval_steps, values, strict=True):
        if v <= target:
            return s
    return None


# ----------------------------------------------------------------------------- the experiment


def _clip_hooks(model: nn.Module, clip: float) -> None:
    if clip > 0:
        for p in model.parameters():
            p.register_hook(lambda g: g.clamp(-clip, clip))


def run(
    config: Config,
    device: str = "auto",
    out: str | os.PathLike | None = None,
    seeds: list[int] | tuple[int, ...] | None = None,
    progress: bool | None = None,
    keep_models: bool = False,
) -> dict[str, Any]:
    """Train both variants under every seed; NLL curves, final NLL and updates-to-reach.

    Args:
        config: from :func:`get_config`.
        device: ``"auto"`` (cuda, then mps, then cpu) or a device name.
        out: folder for ``handwriting.json`` and (at ``paper`` scale) checkpoints to resume.
        seeds: overrides ``config.seeds``.
        progress: tqdm bars (default: only in a terminal without ``CI``).
        keep_models: also return the trained models of the first seed under ``"models"``
            (``{variant: HandwritingModel}``, for sampling; not JSON, never written to disk).

    Returns:
        ``{"name", "config", "device", "histories": {variant: {seed: History dict}},
        "final_nll": {variant: {seed: float}}}`` (plus ``"models"``, see ``keep_models``).
    """
    seeds = tuple(config.seeds if seeds is None else seeds)
    dev = resolve_device(device)
    train = make_handwriting(config.n_train, config.seq_len, seed=config.data_seed)
    valid = make_handwriting(config.n_valid, config.seq_len, seed=config.data_seed + 1)
    results: dict[str, Any] = {
        "name": NAME, "config": asdict(config), "device": str(dev),
        "histories": {}, "final_nll": {},
    }
    models: dict[str, HandwritingModel] = {}
    for variant in config.variants:
        results["histories"][variant], results["final_nll"][variant] = {}, {}
        for seed in seeds:
            torch.manual_seed(seed)
            model = HandwritingModel(
                config.hidden_size, config.num_layers, config.n_mixtures,
                layer_norm=variant == "layer_norm",
            )
            _clip_hooks(model, config.grad_clip)
            opt = torch.optim.Adam(model.parameters(), lr=config.lr)
            ckpt = None
            if out is not None and config.scale == "paper":
                ckpt = Path(out) / "checkpoints" / f"{NAME}_{variant}_seed{seed}.pt"
            hist: History = fit(
                model, Batches(train, batch_size=config.batch_size, seed=seed), opt,
                steps=config.steps, eval_every=config.eval_every,
                eval_fn=lambda m: evaluate(m, valid), device=dev, seed=seed, checkpoint=ckpt,
                progress=progress,
            )
            results["histories"][variant][str(seed)] = hist.to_dict()
            results["final_nll"][variant][str(seed)] = hist.metric("nll")[-1]
            if seed == seeds[0]:
                models[variant] = model
    if out is not None:
        save_results(results, Path(out) / f"{NAME}.json")
    if keep_models:
        results["models"] = models
    return results
