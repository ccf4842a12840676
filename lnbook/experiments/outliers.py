"""Outliers and massive activations: where they sit, what attention does with them, and the
attention options that are said to remove them.

Book chapter `20_outliers` (Part IV), claims P24 (Sun et al. 2024: a few residual-stream
activations are orders of magnitude larger than the median, at fixed dimensions and tokens,
and an explicit attention bias removes them), P25 (Bondarenko et al. 2023: clipped softmax or
gated attention removes the outliers without hurting the loss, so that activations quantize to
8 bits) and P26 (Kovaleva et al. 2021: zeroing a few outlier dimensions of the norms hurts far
more than zeroing as many random ones). One small Pre-LN Transformer per attention variant,
the seeds of a variant trained together as one stacked model; every evaluation records the
largest residual activation over the median per layer, and the end of training measures the
trained copies one by one (:func:`measure`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lnbook.checks import check_config, check_subset
from lnbook.engine import History, Job, Results, Stack, make_config, sweep, train_copies
from lnbook.experiments.seq_tasks import SequenceTask, TaskConfig, presets, task_of
from lnbook.transformer import Transformer, sequence_loss

__all__ = ["NAME", "DESCRIPTION", "VARIANTS", "Config", "get_config", "build", "run", "train",
           "stream", "top_ratio", "fake_quant", "quantized_loss", "outlier_dims",
           "zeroed_gain_loss", "measure", "left_trivial", "claim_values", "pilot"]

NAME = "outliers"
DESCRIPTION = ("Massive activations in a small Pre-LN Transformer and the attention options "
               "said to remove them: a sink, clipped softmax, gated attention (P24-P26)")
VARIANTS = ("plain", "sink", "clipped", "gated")


@dataclass
class Config(TaskConfig):
    """Settings of the outliers experiment (:class:`~lnbook.experiments.seq_tasks.TaskConfig`
    plus the following).

    Attributes:
        variants: which of :data:`VARIANTS` to train: ``"plain"`` softmax attention, an
            explicit attention bias (``"sink"``: a learned key and value per head), the clipped
            softmax (``"clipped"``, ``clip``), gated attention (``"gated"``).
        clip: the clipped softmax's ``(gamma, zeta)``.
        lr: Adam's learning rate (every variant).
        n_zero: how many gain dimensions :func:`zeroed_gain_loss` zeroes.
        n_random: how many random sets of ``n_zero`` dimensions it averages over.
        bits: the fake quantization's bits (:func:`fake_quant`).
        trivial_fraction: a run has left the trivial phase when its final held-out loss has
            removed at least this fraction of the input-blind baseline's.
        n_eval: held-out sequences per evaluation and per measurement.
    """

    variants: tuple[str, ...] = VARIANTS
    clip: tuple[float, float] = (-0.03, 1.0)
    lr: float = 3e-3
    n_zero: int = 2
    n_random: int = 10
    bits: int = 8
    trivial_fraction: float = 0.25
    size: int = 6
    d_model: int = 16
    n_heads: int = 2
    n_layers: int = 2
    n_eval: int = 128
    steps: int = 150
    eval_every: int = 25
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_subset("variants", self.variants, VARIANTS)
        self.variants = tuple(self.variants)
        self.clip = (float(self.clip[0]), float(self.clip[1]))
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 1 <= self.n_zero < self.d_model:
            raise ValueError(f"n_zero must lie in [1, d_model), got {self.n_zero}")
        for name in ("n_random", "n_eval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 2 <= self.bits <= 16:
            raise ValueError(f"bits must lie in [2, 16], got {self.bits}")
        if not 0 < self.trivial_fraction < 1:
            raise ValueError(f"trivial_fraction must lie in (0, 1), got {self.trivial_fraction}")


_PRESETS = presets(steps=5_000, eval_every=250, n_eval=512, d_model=128, n_heads=4,
                   n_layers=6)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def build(config: Config, variant: str, seq_len: int) -> Transformer:
    """A freshly initialized Pre-LN Transformer (LayerNorm, biases) with ``variant``'s
    attention."""
    fields = {"plain": {}, "sink": {"attn_sink": True}, "clipped": {"attn_clip": config.clip},
              "gated": {"attn_gate": True}}[variant]
    return Transformer(config.model_config(seq_len, **fields))


def run(config: Config, device: str | torch.device = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train every variant of ``config.variants``, the seeds of each as one stacked model (a
    job of :func:`lnbook.engine.runner.sweep`); each run's ``info`` is :func:`measure`'s."""
    check_config(config, Config)
    task = task_of(config)
    variants = {v: v for v in config.variants}
    return sweep(NAME, variants, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack="seeds", steps=config.steps,
                 threads=config.threads, workers=config.workers, info=task.info)


def stream(model: Transformer, x: Tensor) -> list[Tensor]:
    """The residual stream of ``model`` on ids ``x`` ``(B, T)``: the embeddings and each
    block's output, ``L + 1`` tensors ``(B, T, D)`` (works under ``vmap``: no value checks)."""
    pos = torch.arange(x.shape[-1], device=x.device)  # (T,)
    hs = [model.tok_emb(x) + model.pos_emb(pos)]  # (B, T, D)
    for block in model.blocks:
        hs.append(block(hs[-1]))
    return hs


def top_ratio(h: Tensor) -> Tensor:
    """The largest magnitude of ``h`` over its median magnitude (a scalar tensor): Sun et
    al.'s measure of a massive activation, read on a whole batch."""
    a = h.abs().flatten()
    return a.max() / a.median().clamp_min(1e-12)


def _eval(model: Transformer, x: Tensor, y: Tensor) -> Tensor:
    """``[loss, top_ratio of each block's output]`` of one copy, ``(1 + L,)``."""
    hs = stream(model, x)
    loss = sequence_loss(model.head(model.final_norm(hs[-1])), y)
    return torch.stack([loss] + [top_ratio(h) for h in hs[1:]])


def _loss(model: Transformer, x: Tensor, y: Tensor) -> Tensor:
    return sequence_loss(model.head(model.final_norm(stream(model, x)[-1])), y)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """Every seed of one variant as one :class:`~lnbook.engine.Stack`, trained by
    :func:`~lnbook.engine.copies.train_copies` with Adam; each evaluation records ``test_loss`` and
    ``ratio_l`` (:func:`top_ratio` of block ``l``'s output, from 1); each copy is then
    measured by :func:`measure`."""
    variant, seeds, dev = job.params, job.seeds, job.device
    task = task.to(dev)
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(build(config, variant, task.seq_len))
    stack = Stack(models).to(dev)
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]
    xt, yt = task.x_test[:config.n_eval], task.y_test[:config.n_eval]

    def losses(step: int) -> Tensor:
        idx = torch.stack([torch.randint(len(task.x), (config.batch_size,), generator=g)
                           for g in gens]).to(dev)  # (S, B)
        return stack.call(_loss, task.x[idx], task.y[idx])  # (S,)

    def evaluate() -> list[dict[str, float]]:
        with torch.no_grad():
            m = stack.call(_eval, xt, yt, shared=(0, 1)).tolist()  # (S, 1 + L)
        return [{"test_loss": row[0], **{f"ratio_{i}": r for i, r in enumerate(row[1:], 1)}}
                for row in m]

    opt = torch.optim.Adam(stack.parameters(), lr=config.lr, foreach=True)
    hists = train_copies(losses, evaluate, opt, [History() for _ in seeds], config.steps,
                         config.eval_every, state=stack, generators=gens,
                         checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    trained = stack.unstack()  # the copies with their trained values, on the CPU
    return [(h, measure(config, m, xt.cpu(), yt.cpu(), seed))
            for h, m, seed in zip(hists, trained, seeds, strict=True)]


def fake_quant(x: Tensor, bits: int = 8) -> Tensor:
    """Symmetric per-tensor fake quantization: ``round(x / s).clamp(-q, q) * s`` with ``q =
    2^(bits - 1) - 1`` and ``s = max|x| / q`` (``x`` unchanged where it is all zero)."""
    q = 2 ** (bits - 1) - 1
    s = x.detach().abs().amax() / q
    if s == 0:
        return x
    return (x / s).round().clamp(-q, q) * s


@torch.no_grad()
def quantized_loss(model: Transformer, x: Tensor, y: Tensor, bits: int = 8) -> float:
    """The held-out loss with every activation fake-quantized to ``bits`` (:func:`fake_quant`):
    the embeddings, each block's output (the residual stream) and the input of every linear
    layer (queries, keys, values, attention output, both feed-forward layers, the head)."""
    handles = [m.register_forward_pre_hook(lambda _m, a: (fake_quant(a[0], bits),))
               for m in model.modules() if isinstance(m, nn.Linear)]
    handles += [b.register_forward_hook(lambda _m, _a, o: fake_quant(o, bits))
                for b in model.blocks]
    try:
        pos = torch.arange(x.shape[-1])
        h = fake_quant(model.tok_emb(x) + model.pos_emb(pos), bits)
        for block in model.blocks:
            h = block(h)
        return float(sequence_loss(model.head(model.final_norm(h)), y))
    finally:
        for hd in handles:
            hd.remove()


def _norms(model: Transformer) -> list[nn.Module]:
    return [m for b in model.blocks for m in (b.norm1, b.norm2)] + [model.final_norm]


def outlier_dims(model: Transformer, k: int) -> list[int]:
    """The ``k`` dimensions whose norm gains stray furthest from the rest (Kovaleva et al.'s
    outlier dimensions): per dimension, the largest ``|g_d - mean(g)| / std(g)`` over the
    model's norms; the ``k`` largest, in decreasing order."""
    z = torch.stack([(n.weight - n.weight.mean()).abs() / n.weight.std().clamp_min(1e-12)
                     for n in _norms(model)])  # (norms, D); a constant gain scores 0
    return z.amax(0).argsort(descending=True)[:k].tolist()


@torch.no_grad()
def zeroed_gain_loss(model: Transformer, dims: list[int], x: Tensor, y: Tensor) -> float:
    """The held-out loss with the gains and biases of every norm set to 0 in ``dims`` (the
    model is left as it was)."""
    saved = [(n.weight.clone(), n.bias.clone()) for n in _norms(model)]
    try:
        for n in _norms(model):
            n.weight[dims] = 0.0
            n.bias[dims] = 0.0
        return float(_loss(model, x, y))
    finally:
        for n, (w, b) in zip(_norms(model), saved, strict=True):
            n.weight.copy_(w)
            n.bias.copy_(b)


@torch.no_grad()
def measure(config: Config, model: Transformer, x: Tensor, y: Tensor, seed: int
            ) -> dict[str, Any]:
    """What one trained copy shows on held-out ids ``x``: ``ratio`` (:func:`top_ratio` per
    block output), where the largest activation of the last block sits (``top_dim``,
    ``top_pos``, ``top_token``), ``dim_share`` (the share of the 1% largest magnitudes of
    the last block's output that lie in its two most frequent dimensions), ``attn_top``
    (the last block's mean attention weight on the position holding the largest activation
    of its input, over heads and the queries that see it) against ``attn_uniform`` (what a
    uniform causal head gives it), ``loss``, ``loss_int8`` (:func:`quantized_loss`),
    ``loss_zero_outlier`` and ``loss_zero_random`` (:func:`zeroed_gain_loss` of
    :func:`outlier_dims` and the mean over ``n_random`` random sets of as many other dims,
    drawn with ``seed``)."""
    model.eval()
    hs = stream(model, x)
    last = hs[-1].abs()  # (B, T, D)
    b, t, d = last.shape
    flat = int(last.argmax())
    top_dim, top_pos = flat % d, (flat // d) % t
    k = max(1, last.numel() // 100)
    dims = last.flatten().topk(k).indices % d  # (k,) the dimension of each
    counts = torch.bincount(dims, minlength=d).sort(descending=True).values
    before = hs[-2].abs().amax(-1).mean(0)  # (T,) per position, input of the last block
    p_in = int(before.argmax())
    blk = model.blocks[-1]
    w = blk.attn.weights(blk.norm1(hs[-2]))[..., :t]  # (B, H, T, T)
    attn_top = float(w[:, :, p_in:, p_in].mean())
    uniform = float(np.mean([1 / (q + 1) for q in range(p_in, t)]))
    out = {"ratio": [float(top_ratio(h)) for h in hs[1:]], "top_dim": top_dim,
           "top_pos": top_pos, "top_token": int(x.flatten()[flat // d]),
           "dim_share": float(counts[:2].sum() / k), "attn_pos": p_in,
           "attn_top": attn_top, "attn_uniform": uniform, "loss": float(_loss(model, x, y)),
           "loss_int8": quantized_loss(model, x, y, config.bits)}
    out_dims = outlier_dims(model, config.n_zero)
    rest = [i for i in range(d) if i not in out_dims]
    g = torch.Generator().manual_seed(seed)
    rand = [zeroed_gain_loss(model, [rest[int(i)] for i in
                                     torch.randperm(len(rest), generator=g)[:config.n_zero]],
                             x, y) for _ in range(config.n_random)]
    out.update(outlier_dims=out_dims, loss_zero_outlier=zeroed_gain_loss(model, out_dims, x, y),
               loss_zero_random=float(np.mean(rand)))
    return out


def left_trivial(results: Results, variant: str) -> np.ndarray:
    """Per seed, whether the run left the trivial phase: its final held-out loss removed at
    least ``trivial_fraction`` of the input-blind baseline's."""
    bar = results.info["baseline_loss"] * (1 - results.config["trivial_fraction"])
    return results.final(variant, "test_loss") <= bar


MASSIVE = 100.0  # a largest activation at least this many medians counts as massive


def _info(results: Results, variant: str, key: str) -> np.ndarray:
    return np.array(results.info_of(variant, key), dtype=float)


def claim_values(results: Results, claim: str) -> tuple[dict[str, np.ndarray],
                                                        dict[str, np.ndarray]]:
    """The per-seed quantities of claim ``"P24"``, ``"P25"`` or ``"P26"``'s parts (as
    ``claims.yml`` names them) and, per part, which seeds pass its trivial-phase bar:
    ``(values, trivial_ok)`` for :func:`lnbook.ledger.decide_claim`. Seeds are paired by
    their order. Ratios are read at the last block's output."""
    plain_r = _info(results, "plain", "ratio")[:, -1]
    massive = plain_r >= MASSIVE
    ok_plain = left_trivial(results, "plain")

    def reduction(variant: str) -> np.ndarray:
        return plain_r / _info(results, variant, "ratio")[:, -1]

    def both(variant: str) -> np.ndarray:
        return ok_plain & left_trivial(results, variant)

    if claim == "P24":
        values = {"a bias removes them": reduction("sink"),
                  "fixed dimensions": _info(results, "plain", "dim_share")}
        ok = {"a bias removes them": massive & both("sink"),
              "fixed dimensions": massive & ok_plain}
        return values, ok
    if claim == "P25":
        base = results.info["baseline_loss"]
        plain_l, gated_l = _info(results, "plain", "loss"), _info(results, "gated", "loss")
        damage = _info(results, "plain", "loss_int8") - plain_l
        gated_damage = _info(results, "gated", "loss_int8") - gated_l
        values = {"gated removes outliers": reduction("gated"),
                  "clipped removes outliers": reduction("clipped"),
                  "keeps the loss": (gated_l - plain_l) / (base - plain_l),
                  "eight-bit works": 1 - gated_damage / np.maximum(damage, 1e-12)}
        ok = {"gated removes outliers": massive & both("gated"),
              "clipped removes outliers": massive & both("clipped"),
              "keeps the loss": both("gated"),
              "eight-bit works": both("gated") & (damage >= 0.01 * plain_l)}
        return values, ok
    if claim == "P26":
        loss = _info(results, "plain", "loss")
        outl = _info(results, "plain", "loss_zero_outlier") - loss
        rand = _info(results, "plain", "loss_zero_random") - loss
        ratio = outl / np.maximum(rand, 1e-12)
        values = {"far more than random": ratio, "more than random": ratio}
        return values, {"far more than random": ok_plain, "more than random": ok_plain}
    raise ValueError(f"claim must be 'P24', 'P25' or 'P26', got {claim!r}")


def pilot(seeds: tuple[int, ...], scale: str = "quick", device: str | torch.device = "auto",
          **overrides: Any) -> dict[str, Any]:
    """The design run behind the quick preset: every variant on the pilot ``seeds``
    (:func:`lnbook.seeds.pilot_seeds`, never a verdict seed); returns the record (config,
    seeds, per variant and seed the final loss, the ratio per block, the int8 loss and the
    gain-zeroing losses) that ``lnbook/pilots/P24.json`` keeps."""
    r = run(get_config(scale, seeds=tuple(seeds), **overrides), device=device)
    keys = ("ratio", "top_dim", "top_pos", "dim_share", "attn_top", "attn_uniform", "loss",
            "loss_int8", "loss_zero_outlier", "loss_zero_random")
    return {"experiment": NAME, "scale": scale, "seeds": list(seeds),
            "baseline_loss": r.info["baseline_loss"],
            "config": {k: v for k, v in r.config.items() if k != "seeds"},
            "runs": {v: {k: r.info_of(v, k) for k in keys} for v in r.variants},
            "claim_values": {c: {p: [float(x) for x in vals]
                                 for p, vals in claim_values(r, c)[0].items()}
                             for c in ("P24", "P25", "P26")}}
