"""Layer norm and attention, geometrically (Brody, Alon and Yahav, 2023).

Part III, chapter `17_attention_geometry` (claims P20 and P21). Layer norm without its gain and
bias is two maps one after the other: a *projection* onto the hyperplane orthogonal to the
all-ones vector (:func:`project`, subtract the mean) and a *scaling* of every vector to norm
``sqrt(d)`` (:func:`scale`). This module measures what each does to the attention that reads
the normalized vectors:

- P21, which keys can win the attention: a key is *un-selectable* when no query gives it a
  score strictly above every other key's, which happens exactly when it lies in the convex
  hull of the others (:func:`unselectable`, a linear programme per key); :func:`random_keys`
  draws keys of varying norms through each of the three maps;
- P20, learning the "majority" task (:func:`majority_task`: which symbol occurs most often in
  a sequence) with a one-layer, one-head attention model (:class:`MajorityAttention`) whose
  token vectors pass through layer norm, the projection only, or nothing (:data:`NORMS`);
  every seed and variant is trained at once, as one batched model (:func:`run`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lnbook.checks import check_choice
from lnbook.experiments.metrics import mean_after_start
from lnbook.experiments.presets import check_scale, make_config
from lnbook.experiments.results import Results, Run, save_results
from lnbook.seeds import verdict_seeds
from lnbook.train import History

__all__ = [
    "NAME",
    "DESCRIPTION",
    "NORMS",
    "Config",
    "get_config",
    "project",
    "scale",
    "normalize",
    "unselectable",
    "random_keys",
    "majority_task",
    "MajorityAttention",
    "learning_speed",
    "run",
]

NAME = "attention_geometry"
DESCRIPTION = (
    "layer norm's projection and scaling in attention: un-selectable keys, and a one-layer "
    "attention model learning 'majority' with LN, LN's projection only, or no norm "
    "(Brody et al. 2023)"
)
NORMS = ("layer", "projection", "none")


def project(x: Tensor) -> Tensor:
    """Layer norm's projection: ``x`` minus its mean over the last dimension.

    The result is orthogonal to the all-ones vector: ``project(x) @ ones(d) == 0``.

    Shape:
        - x: ``(*, d)``; output: the same.
    """
    return x - x.mean(dim=-1, keepdim=True)


def scale(x: Tensor, eps: float = 0.0) -> Tensor:
    r"""Layer norm's scaling: every vector of the last dimension to norm :math:`\sqrt{d}`.

    ``sqrt(d) x / sqrt(|x|^2 + d eps)``; with ``eps = 0`` the norm is exactly ``sqrt(d)``. For a
    vector with zero mean this is layer norm's division by the standard deviation, since
    ``|x|^2 = d sigma^2``.

    Shape:
        - x: ``(*, d)``; output: the same.
    """
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)


def normalize(x: Tensor, norm: str, eps: float = 1e-5) -> Tensor:
    """``x`` through one of :data:`NORMS`: ``"layer"`` (``scale(project(x))``, layer norm
    without gain and bias), ``"projection"`` (``project(x)``) or ``"none"`` (``x``)."""
    check_choice("norm", norm, NORMS)
    if norm == "none":
        return x
    p = project(x)
    return scale(p, eps) if norm == "layer" else p


def unselectable(keys: Tensor | np.ndarray, tol: float = 1e-6) -> np.ndarray:
    r"""Which keys no query can give the highest score: a boolean mask, one per key.

    Key :math:`k_i` is *selectable* when some query :math:`q` scores it strictly above every
    other key, :math:`q \cdot k_i > q \cdot k_j` for all :math:`j \ne i`. By the
    separating-hyperplane theorem that fails exactly when :math:`k_i` lies in the convex hull
    of the other keys (then :math:`q \cdot k_i` is an average of their scores, never above the
    largest). For each key the distance to that hull,

    .. math:: \min_{\lambda \ge 0,\ \sum_j \lambda_j = 1}
              \Bigl\lVert k_i - \sum_{j \ne i} \lambda_j k_j \Bigr\rVert,

    is computed by non-negative least squares (``scipy.optimize.nnls``, the constraint
    :math:`\sum_j \lambda_j = 1` as a heavily weighted extra row); the key is un-selectable
    when the distance is at most ``tol`` times the keys' largest norm. A repeated key is
    un-selectable too: no query separates it from its copy.

    Args:
        keys: ``(n, d)`` keys, ``n >= 2``.
        tol: relative distance below which a key counts as inside the hull.

    Example::

        >>> k = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, 0.2]])
        >>> unselectable(k).tolist()  # the last key is inside the triangle of the others
        [False, False, False, True]
    """
    from scipy.optimize import nnls

    k = torch.as_tensor(keys).detach().double().cpu().numpy()
    if k.ndim != 2 or k.shape[0] < 2:
        raise ValueError(f"keys must be (n, d) with n >= 2, got shape {tuple(k.shape)}")
    big = float(np.linalg.norm(k, axis=1).max()) or 1.0
    w = 1e3 * big  # weight of the row sum(lambda) = 1
    out = np.zeros(len(k), dtype=bool)
    for i in range(len(k)):
        others = np.delete(k, i, axis=0)  # (n - 1, d)
        a = np.vstack([others.T, np.full((1, len(others)), w)])  # (d + 1, n - 1)
        lam, _ = nnls(a, np.append(k[i], w), maxiter=50 * len(k))
        out[i] = np.linalg.norm(others.T @ lam - k[i]) <= tol * big
    return out


def random_keys(n: int, d: int, generator: torch.Generator | None = None,
                spread: float = 0.5) -> dict[str, Tensor]:
    """``n`` random token vectors of varying norm through each of :data:`NORMS`, float64.

    Each vector is a standard normal vector in ``d`` dimensions times ``exp(spread * z)``, z
    standard normal (so norms vary as they do between tokens of a residual stream); then each
    map of :data:`NORMS` is applied with ``eps = 0`` and the results are multiplied by one
    random ``(d, d)`` key projection (Gaussian, shared by the three).

    Returns:
        ``{norm: (n, d) keys}``.
    """
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    x = x * torch.exp(spread * torch.randn(n, 1, generator=generator, dtype=torch.float64))
    w = torch.randn(d, d, generator=generator, dtype=torch.float64) / math.sqrt(d)
    return {nm: normalize(x, nm, eps=0.0) @ w for nm in NORMS}


def majority_task(n: int, length: int, symbols: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n`` sequences of ``length`` symbols (uniform from ``0..symbols-1``) with one majority.

    The target is the symbol that occurs most often; sequences in which two symbols tie for
    most frequent are drawn again, so every target is unique.

    Returns:
        ``x``: int64 ``(n, length)``; ``y``: int64 ``(n,)``.
    """
    if min(n, length) < 1 or symbols < 2:
        raise ValueError(f"need n, length >= 1 and symbols >= 2, got {n}, {length}, {symbols}")
    g = torch.Generator().manual_seed(seed)
    xs, ys, have = [], [], 0
    while have < n:
        x = torch.randint(symbols, (2 * n, length), generator=g)
        counts = torch.nn.functional.one_hot(x, symbols).sum(1)  # (2n, symbols)
        top2 = counts.topk(2, dim=1).values  # (2n, 2)
        ok = top2[:, 0] > top2[:, 1]
        xs.append(x[ok])
        ys.append(counts[ok].argmax(1))
        have += int(ok.sum())
    return torch.cat(xs)[:n], torch.cat(ys)[:n]


class MajorityAttention(nn.Module):
    r"""One-layer, one-head attention that reads a sequence and names its majority symbol,
    for ``S`` independent models (seeds) at once.

    A sequence of ``L`` symbols gets a read-out token appended; each token's vector is its
    symbol's embedding plus its position's, :math:`h_t`. The vectors pass through the norm of
    :data:`NORMS` (no gain and bias), :math:`z_t = N(h_t)`; the read-out token's query
    attends over every token,

    .. math:: o = \sum_t \operatorname{softmax}_t\Bigl(\frac{(W_q z_{L+1}) \cdot
              (W_k z_t)}{\sqrt d}\Bigr)\, W_v z_t, \qquad \text{logits} = W_o\, o .

    Every parameter has a leading dimension of ``S``; model ``s`` sees only its own
    parameters, so training the sum of the ``S`` losses with Adam trains ``S`` separate models.

    Args:
        n_models: ``S``.
        symbols: symbols of the task (classes of the output).
        length: ``L``.
        d_model: width ``d`` of the vectors, queries and keys.
        norm: one of :data:`NORMS`.

    Shape:
        - input: int64 ``(S, B, L)``; output: ``(S, B, symbols)``.
    """

    def __init__(self, n_models: int, symbols: int, length: int, d_model: int,
                 norm: str = "layer") -> None:
        super().__init__()
        check_choice("norm", norm, NORMS)
        self.norm, self.symbols, self.d_model = norm, symbols, d_model
        s, d = n_models, d_model
        self.tok = nn.Parameter(torch.empty(s, symbols + 1, d))  # + the read-out token
        self.pos = nn.Parameter(torch.empty(s, length + 1, d))
        self.w_q, self.w_k, self.w_v = (nn.Parameter(torch.empty(s, d, d)) for _ in range(3))
        self.w_o = nn.Parameter(torch.empty(s, d, symbols))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings N(0, 1); projections N(0, 1/d), as ``nn.Linear`` scales its weights."""
        nn.init.normal_(self.tok)
        nn.init.normal_(self.pos)
        for w in (self.w_q, self.w_k, self.w_v, self.w_o):
            nn.init.normal_(w, std=self.d_model ** -0.5)

    def vectors(self, x: Tensor) -> Tensor:
        """``z_t``, the normalized vectors of every token: ``(S, B, L + 1, d)``."""
        s, b, length = x.shape
        ids = torch.cat([x, x.new_full((s, b, 1), self.symbols)], dim=2)  # (S, B, L+1)
        h = torch.gather(self.tok, 1, ids.reshape(s, -1, 1).expand(-1, -1, self.d_model))
        h = h.reshape(s, b, length + 1, self.d_model) + self.pos[:, None]  # (S, B, L+1, d)
        return normalize(h, self.norm)

    def keys(self, z: Tensor) -> Tensor:
        """``W_k z_t`` for vectors ``z`` of shape ``(S, N, d)``: ``(S, N, d)``."""
        return z @ self.w_k

    def forward(self, x: Tensor) -> Tensor:
        z = self.vectors(x)  # (S, B, T, d)
        q = z[:, :, -1:] @ self.w_q[:, None]  # (S, B, 1, d)
        k = z @ self.w_k[:, None]  # (S, B, T, d)
        v = z @ self.w_v[:, None]  # (S, B, T, d)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d_model), dim=-1)
        return (att @ v)[:, :, 0] @ self.w_o  # (S, B, symbols)

    def extra_repr(self) -> str:
        return (f"n_models={self.tok.shape[0]}, symbols={self.symbols}, "
                f"d_model={self.d_model}, norm={self.norm!r}")


@dataclass
class Config:
    """Settings of the majority experiment; :func:`get_config` gives the presets.

    Attributes:
        scale: ``"quick"`` or ``"paper"``.
        length: symbols per sequence.
        symbols: distinct symbols (chance accuracy about ``1 / symbols``).
        n_train, n_test: training and held-out sequences (drawn with seeds 0 and 1).
        d_model: width of the token vectors, queries and keys.
        batch: sequences per update (each seed draws its own batches).
        steps: Adam updates.
        eval_every: updates between held-out evaluations.
        lr: Adam's learning rate, the same for every variant.
        norms: the variants, from :data:`NORMS`.
        seeds: seeds of the runs (initialization and batch order).
        threads: torch CPU threads during the run (restored afterwards; None: leave as is).
    """

    scale: str = "quick"
    length: int = 16
    symbols: int = 8
    n_train: int = 4096
    n_test: int = 512
    d_model: int = 16
    batch: int = 32
    steps: int = 200
    eval_every: int = 20
    lr: float = 3e-3
    norms: tuple[str, ...] = NORMS
    seeds: tuple[int, ...] = verdict_seeds(10)
    threads: int | None = 1

    def __post_init__(self) -> None:
        check_scale(self.scale)
        for n in self.norms:
            check_choice("norms", n, NORMS)
        if min(self.length, self.n_train, self.n_test, self.d_model, self.batch,
               self.steps, self.eval_every) < 1 or self.symbols < 2:
            raise ValueError("length, n_train, n_test, d_model, batch, steps and eval_every "
                             "must be >= 1 and symbols >= 2")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"threads": None, "length": 64, "symbols": 16, "n_train": 100_000,
              "n_test": 4096, "d_model": 64, "batch": 128, "steps": 5000,
              "eval_every": 100},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``.

    ``paper`` makes the sequences, the alphabet and the model larger and trains longer; it is
    not Brody et al.'s setting, which we could not read offline.
    """
    return make_config(Config, _PRESETS, scale, overrides)


def learning_speed(results: Results, variant: str) -> np.ndarray:
    """Per seed, the mean held-out accuracy over the evaluations after the start: the area
    under the learning curve, higher for a variant that learns sooner (see
    :func:`lnbook.experiments.metrics.mean_after_start`)."""
    _, acc = results.curves(variant, "accuracy")  # (seeds, evals)
    return mean_after_start(acc)


def _evaluate(model: MajorityAttention, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        logits = model(x.expand(model.tok.shape[0], -1, -1))  # (S, n, symbols)
        loss = nn.functional.cross_entropy(logits.transpose(1, 2), y.expand(len(logits), -1),
                                           reduction="none").mean(1)
        acc = (logits.argmax(-1) == y).double().mean(1)
    return loss, acc  # (S,), (S,)


def run(
    config: Config,
    device: str | torch.device = "cpu",
    out: str | os.PathLike | None = None,
    seeds: tuple[int, ...] | list[int] | None = None,
) -> Results:
    """Train every variant with every seed (the seeds of a variant as one batched model).

    Each run's history holds the training loss per update and, every ``eval_every`` updates,
    ``loss`` and ``accuracy`` on the held-out sequences. Model ``s`` is initialized by
    ``torch.manual_seed(seed_s)`` and draws its batches from a generator seeded with
    ``seed_s``, so a run does not depend on the other seeds trained beside it. ``info`` of each
    run holds ``unselectable_keys``: of the trained model's keys for every (symbol, position)
    pair, how many no query can select (:func:`unselectable`). ``Results.info`` holds
    ``chance`` (the held-out accuracy of always naming the most frequent training target).
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be an attention_geometry.Config (get_config), got "
                        f"{type(config).__name__}")
    run_seeds = tuple(config.seeds if seeds is None else seeds)
    x, y = majority_task(config.n_train, config.length, config.symbols, seed=0)
    xt, yt = majority_task(config.n_test, config.length, config.symbols, seed=1)
    chance = float((yt == torch.bincount(y).argmax()).double().mean())
    old_threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        runs = [r for norm in config.norms for r in _train_norm(config, norm, run_seeds,
                                                                  x, y, xt, yt)]
    finally:
        torch.set_num_threads(old_threads)
    results = Results(NAME, dict(vars(config)), str(device), runs, {"chance": chance})
    if out is not None:
        save_results(results, Path(out) / f"{NAME}.json")
    return results


def _train_norm(config: Config, norm: str, seeds: tuple[int, ...], x: Tensor, y: Tensor,
                xt: Tensor, yt: Tensor) -> list[Run]:
    s = len(seeds)
    model = MajorityAttention(s, config.symbols, config.length, config.d_model, norm)
    with torch.no_grad():
        for i, seed in enumerate(seeds):  # model i: the one seed ``seed`` would build alone
            torch.manual_seed(seed)
            one = MajorityAttention(1, config.symbols, config.length, config.d_model, norm)
            for p, q in zip(model.parameters(), one.parameters(), strict=True):
                p[i] = q[0]
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    hists = [History() for _ in seeds]

    def evaluate(step: int) -> None:
        loss, acc = _evaluate(model, xt, yt)
        for i, h in enumerate(hists):
            h.eval_steps.append(step)
            h.metrics.append({"loss": float(loss[i]), "accuracy": float(acc[i])})

    evaluate(0)
    for step in range(1, config.steps + 1):
        idx = torch.stack([torch.randint(len(x), (config.batch,), generator=g) for g in gens])
        logits = model(x[idx])  # (S, B, symbols)
        losses = nn.functional.cross_entropy(logits.transpose(1, 2), y[idx],
                                             reduction="none").mean(1)  # (S,)
        opt.zero_grad()
        losses.sum().backward()
        opt.step()
        for i, h in enumerate(hists):
            h.steps.append(step)
            h.losses.append(float(losses[i].detach()))
        if step % config.eval_every == 0 or step == config.steps:
            evaluate(step)
    keys = _trained_keys(model, config)  # (S, N, d)
    return [Run(norm, seed, hists[i], {"unselectable_keys": int(unselectable(keys[i]).sum()),
                                       "n_keys": int(keys.shape[1])})
            for i, seed in enumerate(seeds)]


def _trained_keys(model: MajorityAttention, config: Config) -> Tensor:
    """Keys of every (symbol, position) pair of the sequence, per model: ``(S, N, d)``."""
    s, n_sym, length = model.tok.shape[0], config.symbols, config.length
    with torch.no_grad():
        h = model.tok[:, :n_sym, None] + model.pos[:, None, :length]  # (S, V, L, d)
        z = normalize(h.reshape(s, n_sym * length, -1), model.norm)
        return model.keys(z)
