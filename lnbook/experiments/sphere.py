"""The sphere and no norm at all: nGPT and a ReZero gate against Pre-LN and Post-LN.

Book chapter `21_sphere` (Part IV), claims P27 (Loshchilov et al. 2025: nGPT reaches the same
loss in several times fewer updates) and P28 (Bachlechner et al. 2021: a zero-started gate
``x + alpha f(x)`` trains deep networks without a norm and converges faster than Pre-LN and
Post-LN). Every design is trained at every depth of ``depths`` on the same task, each at its own
learning rate (chosen on pilot seeds), all seeds of a design stacked as one model.
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
from lnbook.engine.metrics import speedup
from lnbook.engine.train import max_updates
from lnbook.experiments.seq_tasks import (
    SMOKE_BATCH,
    SequenceTask,
    TaskConfig,
    presets,
    task_of,
)
from lnbook.ngpt import NGPT, NGPTConfig, unit
from lnbook.transformer import Transformer, sequence_loss

__all__ = ["NAME", "DESCRIPTION", "DESIGNS", "Config", "get_config", "build", "variant_name",
           "run", "train", "targets", "updates_to_targets", "speedups", "left_trivial",
           "choose_lrs", "claim_values", "pilot", "PILOT_LRS"]

NAME = "sphere"
DESCRIPTION = ("nGPT (every vector on the unit sphere) and a ReZero gate (no norm) against "
               "Pre-LN and Post-LN over depth: updates to fixed loss targets (P27-P28)")
DESIGNS = ("pre", "post", "rezero", "ngpt")


@dataclass
class Config(TaskConfig):
    """Settings of the sphere experiment (:class:`~lnbook.experiments.seq_tasks.TaskConfig`
    plus the following).

    Attributes:
        designs: which of :data:`DESIGNS` to train.
        depths: the numbers of blocks; every design is trained at each.
        lrs: Adam's learning rate of each design (keys :data:`DESIGNS`), chosen on pilot seeds.
        fractions: the loss targets, as the fraction of the trivial baseline's loss removed
            (:func:`targets`), increasing; the last is read as "converged".
        trivial_fraction: a run has left the trivial phase when its final held-out loss has
            removed at least this fraction of the baseline's (:func:`left_trivial`).
        n_eval: held-out sequences per evaluation.
    """

    designs: tuple[str, ...] = DESIGNS
    depths: tuple[int, ...] = (2, 6)
    lrs: tuple[tuple[str, float], ...] = (("pre", 1e-2), ("post", 1e-2), ("rezero", 1e-2),
                                          ("ngpt", 3e-2))
    fractions: tuple[float, ...] = (0.5, 0.75, 0.9)
    trivial_fraction: float = 0.25
    size: int = 6
    d_model: int = 16
    n_heads: int = 2
    n_eval: int = 128
    steps: int = 200
    eval_every: int = 10
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_subset("designs", self.designs, DESIGNS)
        self.designs = tuple(self.designs)
        self.depths = tuple(int(d) for d in self.depths)
        self.lrs = tuple((str(k), float(v)) for k, v in dict(self.lrs).items())
        if not self.depths or min(self.depths) < 1:
            raise ValueError(f"depths must be a non-empty tuple of ints >= 1, got {self.depths}")
        missing = [d for d in self.designs if d not in dict(self.lrs)]
        if missing or any(v <= 0 for _, v in self.lrs):
            raise ValueError(f"lrs must give a positive rate to every design, missing {missing}")
        self.fractions = tuple(float(f) for f in self.fractions)
        if (not self.fractions or not all(0 < f < 1 for f in self.fractions)
                or list(self.fractions) != sorted(set(self.fractions))):
            raise ValueError(f"fractions must increase within (0, 1), got {self.fractions}")
        if not 0 < self.trivial_fraction < 1:
            raise ValueError(f"trivial_fraction must lie in (0, 1), got {self.trivial_fraction}")
        if self.n_eval < 1:
            raise ValueError(f"n_eval must be >= 1, got {self.n_eval}")


_PRESETS = presets(depths=(6, 24), steps=10_000, eval_every=100, n_eval=1_000)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def variant_name(design: str, depth: int) -> str:
    """The name of one variant, e.g. ``"ngpt/L8"``."""
    return f"{design}/L{depth}"


def build(config: Config, design: str, depth: int, seq_len: int) -> nn.Module:
    """A freshly initialized model of ``design`` with ``depth`` blocks, without biases, so the
    designs have the same matrices (nGPT's SwiGLU width keeps its MLP at a GELU MLP's count);
    what differs is the norms' gains and biases, ReZero's gates and nGPT's scales."""
    if design == "ngpt":
        return NGPT(NGPTConfig(config.symbols + 1, config.d_model, config.n_heads, depth,
                               seq_len))
    fields = {"pre": {"position": "pre"}, "post": {"position": "post"},
              "rezero": {"position": "rezero", "norm": "none"}}[design]
    return Transformer(config.model_config(seq_len, n_layers=depth, bias=False, ln_impl="torch",
                                           **fields))


def run(config: Config, device: str | torch.device = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train every design of ``config.designs`` at every depth, the seeds of each variant as one
    stacked model (a job of :func:`lnbook.engine.runner.sweep`); variants
    :func:`variant_name`; ``Results.info`` the task's."""
    check_config(config, Config)
    task = task_of(config)
    variants = {variant_name(d, n): (d, n) for n in config.depths for d in config.designs}
    return sweep(NAME, variants, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, stack="seeds", steps=config.steps,
                 threads=config.threads, workers=config.workers, info=task.info)


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The loss of one copy under ``vmap`` (the ids were checked when the task was made:
    :meth:`lnbook.transformer.Transformer.embed`'s check reads values, which ``vmap`` cannot)."""
    if isinstance(model, NGPT):
        return sequence_loss(model(x), y)
    pos = torch.arange(x.shape[-1], device=x.device)  # (T,)
    h = model.tok_emb(x) + model.pos_emb(pos)  # (B, T, D)
    for block in model.blocks:
        h = block(h)
    return sequence_loss(model.head(model.final_norm(h)), y)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """Every seed of one variant (``(design, depth)``) as one :class:`~lnbook.engine.Stack`,
    trained by :func:`~lnbook.engine.copies.train_copies` with Adam; nGPT's weights are put
    back on the sphere before each update's forward and before each evaluation (so after every
    update).
    A copy whose loss stops being finite stops there (its held-out loss is then not finite:
    it reaches no target); ``info["diverged_at"]`` is that update, or None. In a smoke run
    (:func:`lnbook.engine.train.capped`) a batch holds at most
    :data:`~lnbook.experiments.seq_tasks.SMOKE_BATCH` sequences."""
    (design, depth), seeds, dev = job.params, job.seeds, job.device
    task = task.to(dev)
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(build(config, design, depth, task.seq_len))
    stack = Stack(models).to(dev)
    spheres = ([(stack.named_stacked(b)[name], dim) for b in range(len(stack.blocks))
                for name, dim in models[0].matrices()] if design == "ngpt" else [])
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]
    n, xt, yt = len(seeds), task.x_test[:config.n_eval], task.y_test[:config.n_eval]
    batch = config.batch_size if max_updates() is None else min(config.batch_size, SMOKE_BATCH)

    @torch.no_grad()
    def project() -> None:
        for w, dim in spheres:
            w.copy_(unit(w, dim))

    def losses(step: int) -> Tensor:
        project()
        idx = torch.stack([torch.randint(len(task.x), (batch,), generator=g)
                           for g in gens]).to(dev)  # (S, B)
        return stack.call(_loss, task.x[idx], task.y[idx])  # (S,)

    def evaluate() -> list[dict[str, float]]:
        project()
        with torch.no_grad():
            loss = stack.call(_loss, xt, yt, shared=(0, 1))  # (S,)
        return [{"test_loss": v} for v in loss.tolist()]

    opt = torch.optim.Adam(stack.parameters(), lr=dict(config.lrs)[design], foreach=True)
    diverged: list[int | None] = [None] * n  # a copy whose loss stops being finite stops there
    hists = train_copies(losses, evaluate, opt, [History() for _ in range(n)], config.steps,
                         config.eval_every, state=stack, generators=gens,
                         checkpoint=job.checkpoint, bar=job.bar, label=job.label,
                         diverged=diverged)
    return [(h, {"diverged_at": d}) for h, d in zip(hists, diverged, strict=True)]


def targets(results: Results) -> np.ndarray:
    """The loss targets: ``baseline * (1 - f)`` for each ``f`` of ``config.fractions``, where
    ``baseline`` is the held-out loss of the best input-blind predictor (the trivial phase)."""
    base = results.info["baseline_loss"]
    return np.array([base * (1 - f) for f in results.config["fractions"]])


def updates_to_targets(results: Results, variant: str) -> np.ndarray:
    """Per seed and target, the updates at which the held-out loss reached it, interpolated
    between evaluations (:func:`lnbook.engine.metrics.updates_to_reach`), ``(seeds,
    targets)``; ``inf`` where it never did."""
    return np.stack([results.updates_to(variant, "test_loss", t) for t in targets(results)],
                    axis=1)


def speedups(results: Results, faster: str, slower: str) -> np.ndarray:
    """``updates(slower) / updates(faster)`` per seed and target, ``(seeds, targets)``: above 1
    where ``faster`` reached the target in fewer updates (inf if only it did, NaN if neither did;
    seeds paired by their order)."""
    return speedup(updates_to_targets(results, slower), updates_to_targets(results, faster))


def left_trivial(results: Results, variant: str) -> np.ndarray:
    """Per seed, whether the run left the trivial phase: its final held-out loss removed at
    least ``trivial_fraction`` of the input-blind baseline's."""
    bar = results.info["baseline_loss"] * (1 - results.config["trivial_fraction"])
    return results.final(variant, "test_loss") <= bar


def choose_lrs(pilots: dict[float, Results]) -> dict[str, float]:
    """The pilot's choice of each design's learning rate from runs at several rates
    (rate -> results of every design and depth): the rate whose median number of updates to
    the last (hardest) target, over depths and seeds, is smallest (never reached counts as
    infinite), ties broken by the lower median final loss."""
    designs = next(iter(pilots.values())).config["designs"]
    chosen = {}
    for design in designs:
        def cost(lr: float, design: str = design) -> tuple[float, float]:
            r = pilots[lr]
            names = [v for v in r.variants if v.startswith(design + "/")]
            upd = np.concatenate([updates_to_targets(r, v)[:, -1] for v in names])
            final = np.concatenate([r.final(v, "test_loss") for v in names])
            return float(np.median(upd)), float(np.median(final))
        chosen[design] = min(sorted(pilots), key=cost)
    return chosen


def claim_values(results: Results, claim: str) -> tuple[dict[str, np.ndarray],
                                                        dict[str, np.ndarray]]:
    """The per-seed quantities of claim ``"P27"`` or ``"P28"``'s parts (as ``claims.yml``
    names them) and, per part, which seeds left the trivial phase in every compared arm:
    ``(values, trivial_ok)`` for :func:`lnbook.ledger.decide_claim`. Speed-ups are read at the
    last target (the runs converged), at the deepest depth unless a part names another."""
    shallow, deep = results.config["depths"][0], results.config["depths"][-1]

    def pair(faster: str, slower: str, depth: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = variant_name(faster, depth), variant_name(slower, depth)
        return speedups(results, a, b)[:, -1], left_trivial(results, a) & left_trivial(results, b)

    if claim == "P27":
        deep_x, deep_ok = pair("ngpt", "pre", deep)
        shallow_x, shallow_ok = pair("ngpt", "pre", shallow)
        values = {"fewer updates": deep_x, "four times fewer": deep_x,
                  "fewer updates when shallow": shallow_x}
        ok = {"fewer updates": deep_ok, "four times fewer": deep_ok,
              "fewer updates when shallow": shallow_ok}
        return values, ok
    if claim == "P28":
        pre_x, pre_ok = pair("rezero", "pre", deep)
        post_x, post_ok = pair("rezero", "post", deep)
        trains = left_trivial(results, variant_name("rezero", deep))
        values = {"trains deep without a norm": trains, "faster than Pre-LN": pre_x,
                  "faster than Post-LN": post_x}
        ok = {"trains deep without a norm": np.ones_like(trains), "faster than Pre-LN": pre_ok,
              "faster than Post-LN": post_ok}
        return values, ok
    raise ValueError(f"claim must be 'P27' or 'P28', got {claim!r}")


PILOT_LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def _json(a: np.ndarray) -> list:
    """``a`` as nested lists, None where not finite (JSON has no infinity)."""
    return [[float(x) if np.isfinite(x) else None for x in row] for row in a]


def pilot(seeds: tuple[int, ...], lrs: tuple[float, ...] = PILOT_LRS, scale: str = "quick",
          device: str | torch.device = "auto", designs: tuple[str, ...] = DESIGNS
          ) -> dict[str, Any]:
    """The design run behind ``Config.lrs``: every design at every rate of ``lrs`` on the
    pilot ``seeds`` (:func:`lnbook.seeds.pilot_seeds`, never a verdict seed), or those of
    ``designs``; returns the
    record (config, seeds, per rate and variant the final held-out losses and updates to each
    target, None where never reached, and :func:`choose_lrs`' choice) that
    ``lnbook/pilots/sphere.json`` keeps."""
    runs = {lr: run(get_config(scale, seeds=tuple(seeds), designs=tuple(designs),
                               lrs=tuple((d, lr) for d in DESIGNS)), device=device)
            for lr in lrs}
    first = runs[lrs[0]]
    return {"experiment": NAME, "scale": scale, "seeds": list(seeds), "lrs": list(lrs),
            "targets": targets(first).tolist(),
            "config": {k: v for k, v in first.config.items() if k not in ("lrs", "seeds")},
            "runs": {f"{lr:g}": {v: {"final_test_loss": r.final(v, "test_loss").tolist(),
                                     "updates_to_targets": _json(updates_to_targets(r, v))}
                                 for v in r.variants} for lr, r in runs.items()},
            "chosen": {d: lr for d, lr in choose_lrs(runs).items()}}
