"""Layer norm and attention, geometrically (Brody, Alon and Yahav, 2023; chapter
`17_attention_geometry`, claims P20 and P21).

Layer norm without gain and bias is a projection (:func:`project`) then a scaling
(:func:`scale`); P21's un-selectable keys (:func:`unselectable`); P20's one-layer attention
model (:class:`MajorityAttention`) learning "majority" with each of :data:`NORMS` (:func:`run`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lnbook.checks import check_choice, check_config, check_subset
from lnbook.engine import Job, max_updates, sweep
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.copies import train_copies
from lnbook.engine.metrics import mean_after_start
from lnbook.engine.results import Results
from lnbook.engine.train import History

__all__ = ["NAME", "DESCRIPTION", "NORMS", "Config", "get_config", "project", "scale",
           "normalize", "unselectable", "random_keys", "majority_task", "MajorityAttention",
           "learning_speed", "run"]

NAME = "attention_geometry"
DESCRIPTION = ("layer norm's projection and scaling in attention: un-selectable keys, and a "
               "one-layer attention model learning 'majority' with LN, LN's projection only, "
               "or no norm (Brody et al. 2023)")
NORMS = ("layer", "projection", "none")


def project(x: Tensor) -> Tensor:
    """Layer norm's projection, ``x`` minus its mean over the last dimension (orthogonal to
    the all-ones vector). Shape: ``(*, d)`` -> the same."""
    return x - x.mean(dim=-1, keepdim=True)


def scale(x: Tensor, eps: float = 0.0) -> Tensor:
    r"""Layer norm's scaling, ``sqrt(d) x / sqrt(|x|^2 + d eps)``: with ``eps = 0`` every vector
    of the last dimension gets norm :math:`\sqrt{d}` (for a zero-mean vector, layer norm's
    division by the standard deviation). Shape: ``(*, d)`` -> the same."""
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
    r"""Which of ``(n, d)`` keys (``n >= 2``) no query can give the highest score (a mask).

    Key :math:`k_i` is un-selectable when no :math:`q` has :math:`q \cdot k_i > q \cdot k_j`
    for all :math:`j \ne i`: exactly when it lies in the convex hull of the others (a repeated
    key too). Its distance to that hull is found by non-negative least squares
    (``scipy.optimize.nnls``, the weights' sum 1 as a heavily weighted extra row); inside means
    at most ``tol`` times the keys' largest norm. Example::

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
    """``{norm: (n, d) keys}``, float64: ``n`` standard normal vectors times ``exp(spread z)``
    (z standard normal, so norms vary as between tokens of a residual stream), through each
    map of :data:`NORMS` with ``eps = 0``, then one shared random ``(d, d)`` key projection."""
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    x = x * torch.exp(spread * torch.randn(n, 1, generator=generator, dtype=torch.float64))
    w = torch.randn(d, d, generator=generator, dtype=torch.float64) / math.sqrt(d)
    return {nm: normalize(x, nm, eps=0.0) @ w for nm in NORMS}


def majority_task(n: int, length: int, symbols: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n`` sequences ``x`` (int64 ``(n, length)``, symbols uniform from ``0..symbols-1``) and
    their most frequent symbol ``y`` (``(n,)``); sequences with a tie are drawn again."""
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
    r"""One-layer, one-head attention naming a sequence's majority symbol, ``S`` models at once:
    a read-out token is appended to the ``L`` symbols; token vectors :math:`h_t` (symbol plus
    position embedding) pass through the norm of :data:`NORMS` (no gain and bias),
    :math:`z_t = N(h_t)`, and the read-out token's query attends over every token:
    :math:`\text{logits} = W_o \sum_t \operatorname{softmax}_t((W_q z_{L+1}) \cdot (W_k z_t)
    / \sqrt d)\, W_v z_t`. Every parameter has a leading dimension ``S`` and model ``s`` sees
    only its own, so Adam on the sum of the ``S`` losses trains ``S`` separate models.
    Input int64 ``(S, B, L)``; output ``(S, B, symbols)``."""

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
        for w in (self.tok, self.pos):
            nn.init.normal_(w)
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
        z = self.vectors(x)  # (S, B, T, d); below q . W_k z_t as (W_k q) . z_t, and the
        q = z[:, :, -1:] @ self.w_q[:, None] @ self.w_k.transpose(1, 2)[:, None]  # (S, B, 1, d)
        att = torch.softmax(q @ z.transpose(-1, -2) / math.sqrt(self.d_model), dim=-1)
        return (att @ z)[:, :, 0] @ self.w_v @ self.w_o  # values after the average: (S, B, V)

    def extra_repr(self) -> str:
        return f"n_models={len(self.tok)}, symbols={self.symbols}, norm={self.norm!r}"


@dataclass
class Config(RunConfig):
    """Settings of the majority experiment (:func:`get_config` gives the presets).

    ``length`` symbols per sequence out of ``symbols``; ``n_train`` and ``n_test`` sequences
    (drawn with seeds 0 and 1); width ``d_model``; ``batch_size`` sequences per Adam update (each
    seed draws its own), ``steps`` updates at rate ``lr`` (the same for every variant), held-out
    evaluations every ``eval_every``; variants ``norms`` from :data:`NORMS`; ``seeds``
    (initialization and batch order: an int n, the first n of the seed set in force when the
    run starts), ``group`` of them per value of P20's rule (chosen on pilot seeds, see the
    chapter); ``checkpoint``: checkpoint each variant's stack under ``out`` (a run resumes).
    The fields of :class:`~lnbook.engine.RunConfig` are described there."""

    length: int = 16
    symbols: int = 8
    n_train: int = 4096
    n_test: int = 512
    d_model: int = 16
    batch_size: int = 32
    steps: int = 200
    eval_every: int = 20
    lr: float = 3e-3
    norms: tuple[str, ...] = NORMS
    seeds: int | tuple[int, ...] = 60
    group: int = 6
    checkpoint: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_subset("norms", self.norms, NORMS)
        if min(self.length, self.n_train, self.n_test, self.d_model, self.batch_size,
               self.eval_every, self.group) < 1 or self.symbols < 2:
            raise ValueError("length, n_train, n_test, d_model, batch_size and eval_every "
                             "must be >= 1 and symbols >= 2")


_PRESETS: dict[str, dict[str, Any]] = {"quick": {}, "paper": {
    "threads": None, "length": 64, "symbols": 16, "n_train": 100_000, "n_test": 4096,
    "d_model": 64, "batch_size": 128, "steps": 5000, "eval_every": 100, "checkpoint": True}}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset (larger sequences, alphabet and model, longer training;
    not Brody et al.'s setting), with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def learning_speed(results: Results, variant: str, group: int = 1) -> np.ndarray:
    """Per seed, the mean held-out accuracy over the evaluations after the start (the area
    under the learning curve, :func:`lnbook.engine.metrics.mean_after_start`), averaged
    over each ``group`` of consecutive seeds: ``(seeds // group,)``."""
    speed = mean_after_start(results.curves(variant, "accuracy")[1])  # (seeds,)
    return speed[:len(speed) // group * group].reshape(-1, group).mean(1)


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every variant with every seed, the seeds of a variant as one batched model: the
    training loss per update, held-out ``loss`` and ``accuracy`` every ``eval_every``. Model
    ``s`` is built under ``torch.manual_seed(seed_s)`` and draws its batches from a generator
    seeded with ``seed_s`` (independent of the seeds beside it). ``info["unselectable_keys"]``:
    the trained keys of (symbol, position) pairs no query can select (:func:`unselectable`);
    ``Results.info["chance"]``: the accuracy of always naming the most frequent target.
    ``out``: folder for ``attention_geometry.json``, the runs and checkpoints."""
    check_config(config, Config)
    smoke = max_updates() is not None  # a smoke run: short data (minutes to build otherwise)
    n_train, n_test = (min(config.n_train, 1024), min(config.n_test, 64)) if smoke else (
        config.n_train, config.n_test)
    train = majority_task(n_train, config.length, config.symbols, seed=0)
    test = majority_task(n_test, config.length, config.symbols, seed=1)
    chance = float((test[1] == torch.bincount(train[1]).argmax()).double().mean())
    return sweep(NAME, {norm: norm for norm in config.norms}, config.seeds,
                 partial(_train_norm, config=config, train=train, test=test), config=config,
                 stack="seeds", device=device, out=out, checkpoint=config.checkpoint,
                 steps=config.steps, info={"chance": chance}, threads=config.threads or None,
                 workers=config.workers)


def _loss_acc(model: MajorityAttention, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Per model, the mean loss and accuracy on ``x`` ``(S, n, L)``, ``y`` ``(S, n)``."""
    logits = model(x)  # (S, n, symbols)
    loss = nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1)
    return loss, (logits.argmax(-1) == y).double().mean(1)


def _train_norm(job: Job, config: Config, train: tuple[Tensor, Tensor],
                test: tuple[Tensor, Tensor]) -> list[tuple[History, dict[str, int]]]:
    """Every seed of one variant (a job of :func:`run`'s sweep) as one batched model, trained
    by :func:`lnbook.engine.copies.train_copies`: one ``(History, info)`` per seed."""
    norm, seeds, dev = job.variant, job.seeds, job.device
    s, (x, y), (xt, yt) = len(seeds), train, test
    model = MajorityAttention(s, config.symbols, config.length, config.d_model, norm)
    with torch.no_grad():
        for i, seed in enumerate(seeds):  # model i: the one seed ``seed`` would build alone
            torch.manual_seed(seed)
            one = MajorityAttention(1, config.symbols, config.length, config.d_model, norm)
            for p, q in zip(model.parameters(), one.parameters(), strict=True):
                p[i] = q[0]
    model.to(dev)
    x, y, xt, yt = (t.to(dev) for t in (x, y, xt, yt))
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]

    def losses(step: int) -> Tensor:
        idx = torch.stack([torch.randint(len(x), (config.batch_size,), generator=g) for g in gens])
        idx = idx.to(dev)
        return _loss_acc(model, x[idx], y[idx])[0]  # (S,)

    def evaluate() -> list[dict[str, float]]:
        with torch.no_grad():
            loss, acc = _loss_acc(model, xt.expand(s, -1, -1), yt.expand(s, -1))
        return [{"loss": lo, "accuracy": ac}
                for lo, ac in zip(loss.tolist(), acc.tolist(), strict=True)]

    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    hists = train_copies(losses, evaluate, opt, [History() for _ in seeds], config.steps,
                         config.eval_every, state=model, generators=gens,
                         checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    with torch.no_grad():  # the keys of every (symbol, position) pair, per model: (S, N, d)
        h = model.tok[:, :config.symbols, None] + model.pos[:, None, :config.length]
        keys = model.keys(normalize(h.reshape(s, config.symbols * config.length, -1), norm))
    if max_updates() is not None:  # a smoke run: 32 keys (an NNLS per key: minutes otherwise)
        keys = keys[:, :32]
    return [(hists[i], {"unselectable_keys": int(unselectable(keys[i]).sum()),
                        "n_keys": int(keys.shape[1])}) for i in range(s)]


# --- claims P20 and P21: per-seed inputs to lnbook.ledger.decide_claim (chapter 17) ----------

#: Held-out accuracy above always naming the most frequent target that a group of seeds must
#: reach, on its average, to leave the trivial phase (P20).
P20_TRIVIAL = 0.2


def left_trivial(results: Results, group: int) -> dict[str, np.ndarray]:
    """Per variant, whether each ``group`` of consecutive seeds ends, on its mean final held-out
    accuracy, :data:`P20_TRIVIAL` above ``Results.info["chance"]``: ``(seeds // group,)``."""
    chance = results.info["chance"]
    out = {}
    for v in results.variants:
        acc = results.final(v, "accuracy")
        final = acc[:len(acc) // group * group].reshape(-1, group).mean(1)
        out[v] = final >= chance + P20_TRIVIAL
    return out


def p20_inputs(results: Results, group: int) -> dict[str, dict[str, Any]]:
    """P20's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, per group of
    ``group`` consecutive seeds: the :func:`learning_speed` of layer norm, and of the
    projection only, minus no norm's; a group counts where both compared arms
    :func:`left_trivial`."""
    speed = {v: learning_speed(results, v, group) for v in NORMS}
    ok = left_trivial(results, group)
    ln, pr = "LN learns majority faster", "the projection alone learns it faster"
    return {"values": {ln: speed["layer"] - speed["none"],
                       pr: speed["projection"] - speed["none"]},
            "trivial_ok": {ln: ok["layer"] & ok["none"], pr: ok["projection"] & ok["none"]}}


def unselectable_counts(seeds: Sequence[int], n: int = 64, d: int = 8, spread: float = 0.5
                        ) -> dict[str, list[int]]:
    """Per norm of :data:`NORMS`, the number of :func:`unselectable` keys among one draw of
    :func:`random_keys` (``n`` keys in ``d`` dimensions, length spread ``spread``) per seed,
    each drawn from a generator seeded with the seed."""
    counts: dict[str, list[int]] = {v: [] for v in NORMS}
    for seed in seeds:
        keys = random_keys(n, d, torch.Generator().manual_seed(seed), spread)
        for v in NORMS:
            counts[v].append(int(unselectable(keys[v]).sum()))
    return counts


def p21_inputs(counts: Mapping[str, Sequence[int]]) -> dict[str, dict[str, Any]]:
    """P21's ``values`` for :func:`lnbook.ledger.decide_claim` from :func:`unselectable_counts`:
    per draw, the un-selectable keys with layer norm and with the projection only."""
    return {"values": {"no key un-selectable with LN": np.array(counts["layer"]),
                       "some un-selectable without the scaling":
                           np.array(counts["projection"])}}


__all__ += ["P20_TRIVIAL", "left_trivial", "p20_inputs", "unselectable_counts", "p21_inputs"]
