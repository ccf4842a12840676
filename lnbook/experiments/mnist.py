"""Permutation-invariant MNIST with a 784-1000-1000-10 MLP (paper section 6.6, Figure 6).

Book chapter `06_6_mnist`. :class:`MLP` with no norm, batch norm on every layer (the unbiased
variance for small batches, claim C18) or layer norm on the hidden layers, trained with Adam at
batch sizes 128 and 4. Engine ``"seeds"`` trains the seeds of a variant as one
:class:`lnbook.batched.SeedMLP` and reads batch norm three ways (:data:`BN_READINGS`); engine
``"runs"`` trains one run at a time. Both go through :func:`lnbook.engine.runner.sweep`.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.batched import SeedMLP, seed_batches, seed_nll, train_mode_logits
from lnbook.checks import check_choice, check_config, check_size, check_subset
from lnbook.data import mnist_train_test, pixel_permutation
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.copies import train_copies
from lnbook.engine.job import Job
from lnbook.engine.metrics import classification_metrics, mean_after_start
from lnbook.engine.results import Results
from lnbook.engine.runner import sweep
from lnbook.engine.train import Batches, History, fit
from lnbook.norms import BatchNorm, LayerNorm

__all__ = [
    "NAME", "DESCRIPTION", "NORMS", "ENGINES", "BN_READINGS", "Config",
    "get_config", "MLP", "curves", "late_mean",
    "mode_nll", "run", "seed_metrics", "seed_model", "schedule", "variant_name",
    "TRIVIAL_SHARE", "c17_left", "c17_inputs",
]

NAME = "mnist"
DESCRIPTION = (
    "permutation-invariant MNIST, MLP 784-1000-1000-10 with no norm / batch norm / layer norm, "
    "Adam, batch sizes 128 and 4 (section 6.6, Figure 6)"
)
NORMS = ("none", "batch", "layer")
ENGINES = ("seeds", "runs")
#: the readings of batch norm that engine "seeds" records at every evaluation (suffixes)
BN_READINGS = ("", "_recal", "_tmode")
#: a seed counts in C17 when every run of it ends with at most this share of the test error
#: of the majority-class predictor (``Results.info["majority_error"]``)
TRIVIAL_SHARE = 0.5


@dataclass
class Config(RunConfig):
    """Settings of the permutation-invariant MNIST experiment; :func:`get_config` gives presets.

    ``examples`` (with ``eval_examples``): examples seen per run at every batch size (``examples
    // B`` updates at batch size B); None: ``steps`` updates whatever the batch size.
    ``bn_unbiased_max_batch``: BN uses the unbiased variance up to this batch size. ``engine``:
    from :data:`ENGINES`; ``n_recal``: training images that recalibrate batch norm (engine
    ``"seeds"``); ``checkpoint``: checkpoint each job (a stack of seeds, or a run) under
    ``out`` (a run resumes). :class:`~lnbook.engine.RunConfig` describes the rest.
    """

    hidden: tuple[int, ...] = (128, 128)
    norms: tuple[str, ...] = NORMS
    batch_sizes: tuple[int, ...] = (128, 4)
    examples: int | None = None
    eval_examples: int | None = None
    steps: int = 200
    eval_every: int = 20
    lr: float = 1e-3
    n_train: int | None = None
    n_eval_train: int = 1000
    n_test: int | None = None
    bn_unbiased_max_batch: int = 16
    permute_pixels: bool = True
    seeds: int | tuple[int, ...] = 3
    source: str = "auto"
    checkpoint: bool = False
    engine: str = "seeds"
    n_recal: int = 4000

    def __post_init__(self) -> None:
        super().__post_init__()
        check_subset("norms", self.norms, NORMS)
        if any(b < 2 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be >= 2 (BN needs two), got {self.batch_sizes}")
        check_choice("engine", self.engine, ENGINES)
        if self.n_recal < max(self.batch_sizes, default=2):
            raise ValueError(f"n_recal ({self.n_recal}) must be at least the largest batch "
                             f"size {max(self.batch_sizes)}")
        check_size("eval_every", self.eval_every)
        if (self.examples is None) != (self.eval_examples is None):
            raise ValueError("give examples and eval_examples together (or neither, to train "
                             f"every batch size for `steps` updates), got {self.examples} and "
                             f"{self.eval_examples}")
        if self.examples is not None and self.eval_examples is not None:
            bad = [b for b in self.batch_sizes
                   if self.examples % b or self.eval_examples % b or self.eval_examples < b]
            if bad or self.examples < self.eval_examples:
                raise ValueError(
                    f"examples ({self.examples}) and eval_examples ({self.eval_examples}) must "
                    f"be multiples of every batch size {self.batch_sizes}, with examples >= "
                    f"eval_examples, so that all batch sizes are evaluated after the same "
                    f"numbers of examples (batch sizes that do not divide them: {bad})")


_PRESETS: dict[str, dict[str, Any]] = {
    # chapter 6.6's design, piloted on lnbook.seeds.pilot_seeds (see the chapter's dropdown):
    # 784-64-64-10, Adam 1e-3, 1,000 updates at each batch size (equal updates), 5 seeds
    "quick": {"hidden": (64, 64), "steps": 1000, "eval_every": 50, "n_recal": 1000,
              "seeds": 5},
    # 20,000 updates at each batch size (about 46 epochs of 55,000 at batch size 128)
    "paper": {"hidden": (1000, 1000), "steps": 20_000, "eval_every": 500, "n_train": 55_000,
              "n_eval_train": 10_000, "n_recal": 10_000, "n_test": None, "threads": None,
              "checkpoint": True},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``; overriding
    ``steps`` or ``eval_every`` without ``examples`` sets ``examples`` to None (equal updates)."""
    if ({"steps", "eval_every"} & set(overrides)) and "examples" not in overrides:
        overrides = {**overrides, "examples": None, "eval_examples": None}
    return make_config(Config, _PRESETS, scale, overrides)


def schedule(config: Config, batch_size: int) -> tuple[int, int]:
    """``(updates, updates between evaluations)`` of a run at ``batch_size`` under ``config``."""
    if config.examples is None or config.eval_examples is None:
        return config.steps, config.eval_every
    return config.examples // batch_size, config.eval_examples // batch_size


class MLP(nn.Module):
    """A ReLU MLP whose summed inputs go through a normalization before the nonlinearity.

    ``x -> [Linear -> norm -> ReLU] * len(hidden) -> Linear [-> BN]``: LN on the hidden layers
    only (LN of the logits would remove their scale, the softmax's confidence), BN on every
    layer; ``bn_unbiased``: BN with the unbiased variance (claim C18).

    Shape: ``(N, sizes[0])`` -> logits ``(N, sizes[-1])``.
    """

    def __init__(self, sizes: tuple[int, ...], norm: str = "layer", bn_unbiased: bool = False):
        super().__init__()
        check_choice("norm", norm, NORMS)
        if len(sizes) < 2:
            raise ValueError(f"sizes needs an input and an output width, got {sizes}")
        self.norm = norm
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            last = i == len(sizes) - 2
            # a norm with a learned bias follows: the Linear's own bias would be redundant
            bias = norm == "none" or (last and norm == "layer")
            layers.append(nn.Linear(d_in, d_out, bias=bias))
            if norm == "batch":
                layers.append(BatchNorm(d_out, unbiased=bn_unbiased))
            elif norm == "layer" and not last:
                layers.append(LayerNorm(d_out))
            if not last:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)
        self.in_features = sizes[0]

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"MLP expects (N, {self.in_features}) inputs, got {tuple(x.shape)}")
        return self.net(x)  # (N, classes)


def variant_name(norm: str, batch_size: int) -> str:
    """The name of one (normalization, batch size) variant in the results, e.g. ``layer/bs4``."""
    return f"{norm}/bs{batch_size}"


def curves(results: Results, norm: str, batch_size: int,
           metric: str) -> tuple[np.ndarray, np.ndarray]:
    """One metric of every seed of one variant: ``(eval_steps (E,), values (seeds, E))``."""
    return results.curves(variant_name(norm, batch_size), metric)


def late_mean(results: Results, norm: str, batch_size: int, metric: str) -> np.ndarray:
    """The mean of ``metric`` over the evaluations of the second half of a variant's run
    (updates made > half of the last), per seed: ``(seeds,)``."""
    steps, values = curves(results, norm, batch_size, metric)  # (E,), (seeds, E)
    return values[:, steps > steps[-1] / 2].mean(axis=1)


def c17_left(results: Results) -> np.ndarray:
    """Per seed, ``(seeds,)``: whether every run of the seed ends with at most
    :data:`TRIVIAL_SHARE` of the majority-class predictor's test error (C17's trivial bar)."""
    bar = TRIVIAL_SHARE * results.info["majority_error"]
    return np.all([results.final(v, "test_error") <= bar for v in results.variants], axis=0)


def c17_inputs(results: Results) -> dict[str, dict[str, np.ndarray]]:
    """C17's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, from a run
    of :func:`run` (engine ``"seeds"``: it reads :data:`BN_READINGS`) at batch sizes 128 and 4
    with ``"batch"`` and ``"layer"``, per seed, ``(seeds,)`` each.

    "faster than BN at batch 128" (and "at batch 4"): LN's mean training NLL over the
    evaluations after the start (:func:`lnbook.engine.metrics.mean_after_start`) minus BN's at
    the same batch size, BN read the way that gives it the lowest mean of
    :data:`BN_READINGS`. "robust to batch size": LN's late test error (:func:`late_mean`) at
    batch 4 minus at batch 128, minus the same for BN, whose late test error at each batch size
    is the lower of its running-average and recalibrated readings. The mask, the same for
    every part: :func:`c17_left`.
    """
    def area(norm: str, bs: int, reading: str = "") -> np.ndarray:
        return mean_after_start(curves(results, norm, bs, "train_nll" + reading)[1])

    def late(norm: str, bs: int) -> np.ndarray:
        error = late_mean(results, norm, bs, "test_error")
        return error if norm != "batch" else np.minimum(
            error, late_mean(results, norm, bs, "test_error_recal"))

    faster = {bs: area("layer", bs) - np.min([area("batch", bs, r) for r in BN_READINGS],
                                             axis=0) for bs in (128, 4)}
    robust = (late("layer", 4) - late("layer", 128)) - (late("batch", 4) - late("batch", 128))
    parts = ("faster than BN at batch 128", "faster than BN at batch 4", "robust to batch size")
    return {"values": dict(zip(parts, (faster[128], faster[4], robust), strict=True)),
            "trivial_ok": dict.fromkeys(parts, c17_left(results))}


def mode_nll(model: nn.Module, x: Tensor, y: Tensor, batch_size: int) -> dict[str, float]:
    """NLL and error of a copy of ``model`` on the whole batches of ``batch_size`` in ``(x, y)``,
    in training mode (each batch's statistics) and eval mode (running averages).

    Returns ``nll_{train,eval}_mode``, ``error_{train,eval}_mode`` and ``logit_std`` (the std
    of the logits over the classes, mean over examples, eval mode).
    """
    n = (len(y) // batch_size) * batch_size
    if n == 0:
        raise ValueError(f"need at least one batch of {batch_size} examples, got {len(y)}")
    probe = copy.deepcopy(model)
    dev = next(probe.parameters()).device
    xb = x[:n].to(dev).reshape(-1, batch_size, x.shape[1])  # (batches, B, 784)
    labels = y[:n].to(dev)  # (n,)

    def scores(logits: Tensor, mode: str) -> dict[str, float]:
        return {f"nll_{mode}_mode": float(F.cross_entropy(logits, labels)),
                f"error_{mode}_mode": float((logits.argmax(1) != labels).float().mean())}

    with torch.no_grad():
        probe.eval()  # running averages: no batch dependence, one pass over all n examples
        logits = probe(xb.reshape(n, -1))  # (n, classes)
        out = {**scores(logits, "eval"), "logit_std": float(logits.std(dim=1).mean())}
        probe.train()  # batch statistics (this moves only the copy's running averages)
        out.update(scores(torch.cat([probe(b) for b in xb]), "train"))  # (n, classes)
    return out


def _data(config: Config) -> dict[str, Any]:
    x, y, xt, yt, info = mnist_train_test(config.source, config.n_train, config.n_test,
                                          config.scale, NAME)  # (N, 784), (N,), (M, 784), (M,)
    if config.permute_pixels:
        perm = pixel_permutation(0)
        x, xt = x[:, perm], xt[:, perm]
    return {"x": x, "y": y, "x_test": xt, "y_test": yt, "info": info}


def seed_model(config: Config, norm: str, batch_size: int,
               seeds: tuple[int, ...] | list[int]) -> SeedMLP:
    """The :class:`MLP` s engine ``"runs"`` starts under each seed, as one
    :class:`lnbook.batched.SeedMLP`."""
    sizes = (784, *config.hidden, 10)
    unbiased = batch_size <= config.bn_unbiased_max_batch
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(MLP(sizes, norm, bn_unbiased=unbiased))
    return SeedMLP.from_models(models, sizes, norm, out_bias=norm != "batch",
                               norm_logits=norm == "batch", bn_unbiased=unbiased)


def _scores(logits: Tensor, y: Tensor, prefix: str, suffix: str) -> dict[str, np.ndarray]:
    """Per-seed NLL and error of logits ``(S, N, C)`` on labels ``(N,)``."""
    nll = seed_nll(logits, y[: logits.shape[1]]).cpu().numpy()  # (S,)
    err = (logits.argmax(-1) != y[: logits.shape[1]]).float().mean(1).cpu().numpy()  # (S,)
    return {f"{prefix}_nll{suffix}": nll, f"{prefix}_error{suffix}": err}


def seed_metrics(model: SeedMLP, data: dict[str, Tensor], batch_size: int,
                 x_recal: Tensor) -> dict[str, np.ndarray]:
    """One evaluation of every seed of ``model``: metric name -> ``(S,)`` values.

    ``train_*`` (``data["x_eval"]``) and ``test_*``, in eval mode (no suffix), recalibrated on
    ``x_recal`` (``_recal``) and, on the training images, in training mode with blocks of
    ``batch_size`` (``_tmode``); without batch norm the three are one reading, copied.
    """
    was_training = model.training
    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        model.eval()
        sets = (("train", data["x_eval"], data["y_eval"]), ("test", data["x_test"], data["y_test"]))
        for prefix, x, y in sets:
            out.update(_scores(model(x), y, prefix, ""))
        if model.norm == "batch":
            recal = model.recalibrated(x_recal)
            for prefix, x, y in sets:
                out.update(_scores(recal(x), y, prefix, "_recal"))
            out.update(_scores(train_mode_logits(model, data["x_eval"], batch_size),
                               data["y_eval"], "train", "_tmode"))
        else:
            out.update({k + "_recal": v for k, v in list(out.items())})
            out.update({f"train_{m}_tmode": out[f"train_{m}"] for m in ("nll", "error")})
    model.train(was_training)
    return out


def _train_variant(job: Job, config: Config, d: dict[str, Tensor]) -> list[History]:
    """Engine ``"seeds"``: the seeds of one variant (a job of :func:`run`'s sweep) trained as
    one :func:`seed_model` on ``d["x"]``, ``d["y"]``, :func:`seed_metrics` at every
    evaluation (the updates of engine ``"runs"``, to rounding)."""
    (norm, bs), seeds, dev = job.params, job.seeds, job.device
    d = {k: v.to(dev) for k, v in d.items()}
    model = seed_model(config, norm, bs, seeds).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, fused=dev.type in ("cpu", "cuda"))
    batches = seed_batches(d["x"], d["y"], bs, seeds)

    def losses(step: int) -> Tensor:
        xb, yb = batches(step)  # (S, B, 784), (S, B)
        return seed_nll(model(xb), yb)  # (S,)

    def evaluate() -> list[dict[str, float]]:
        m = seed_metrics(model, d, bs, d["x_recal"])
        return [{k: float(v[i]) for k, v in m.items()} for i in range(len(seeds))]

    steps, eval_every = schedule(config, bs)
    hist = train_copies(losses, evaluate, opt, [History() for _ in seeds], steps, eval_every,
                        state=model, checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    for h in hist:
        h.wall_time /= len(seeds)
    return hist


def _eval_fn(model: nn.Module, d: dict[str, Tensor]) -> dict[str, float]:
    """Engine ``"runs"``: one run's NLL and error on ``d["x_eval"]`` and the test images."""
    tr = classification_metrics(model, d["x_eval"], d["y_eval"])
    te = classification_metrics(model, d["x_test"], d["y_test"])
    return {"train_nll": tr["nll"], "train_error": tr["error"],
            "test_nll": te["nll"], "test_error": te["error"]}


def _cross_entropy(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _train_one(job: Job, config: Config, d: dict[str, Tensor]) -> tuple[History, dict]:
    """Engine ``"runs"``: one (variant, seed) of :func:`run`, with :func:`mode_nll` as info."""
    norm, bs = job.params
    steps, eval_every = schedule(config, bs)
    torch.manual_seed(job.seed)
    model = MLP((784, *config.hidden, 10), norm, bn_unbiased=bs <= config.bn_unbiased_max_batch)
    # fused Adam where torch has it: the same update, 1.5x faster at batch size 4 on a CPU
    opt = torch.optim.Adam(model.parameters(), lr=config.lr,
                           fused=job.device.type in ("cpu", "cuda"))
    hist = fit(model, Batches(d["x"], d["y"], batch_size=bs, seed=job.seed), opt,
               steps=steps, eval_every=eval_every, eval_fn=partial(_eval_fn, d=d),
               device=job.device, seed=job.seed, checkpoint=job.checkpoint,
               loss_fn=_cross_entropy, bar=job.bar, label=job.label)
    # at least one whole batch, even when n_eval_train is smaller than the batch size
    n_mode = max(config.n_eval_train, bs)
    return hist, mode_nll(model, d["x"][:n_mode], d["y"][:n_mode], bs)


def _steps(config: Config, variant: str, params: tuple[str, int]) -> int:
    return schedule(config, params[1])[0]


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every (norm, batch size) variant (:func:`variant_name`) with every seed, through
    :func:`lnbook.engine.runner.sweep` (engine ``"seeds"``: the seeds of a variant as one job).

    Runs record ``train_nll``, ``train_error`` (``n_eval_train`` training images),
    ``test_nll`` and ``test_error`` in eval mode; engine ``"seeds"`` adds the readings of
    :data:`BN_READINGS` (:func:`seed_metrics`), engine ``"runs"`` adds :func:`mode_nll` to
    each run's info. ``Results.info``: ``source`` and ``majority_error`` (the test error of
    always answering the most frequent training label), and ``engine`` for ``"seeds"``.
    Writes ``out/mnist.json``, the runs and checkpoints.
    """
    check_config(config, Config)
    d = _data(config)
    info = d.pop("info")
    if config.engine == "seeds":
        n_eval = max(config.n_eval_train, max(config.batch_sizes))
        d["x_recal"] = d["x"][: config.n_recal]
        info = {**info, "engine": "seeds"}
    else:
        n_eval = config.n_eval_train
    d["x_eval"], d["y_eval"] = d["x"][:n_eval], d["y"][:n_eval]
    seeds = config.engine == "seeds"
    train = partial(_train_variant if seeds else _train_one, config=config, d=d)
    variants = {variant_name(n, bs): (n, bs) for bs in config.batch_sizes for n in config.norms}
    return sweep(NAME, variants, config.seeds, train, config=config,
                 stack="seeds" if seeds else None, device=device, out=out,
                 checkpoint=config.checkpoint, steps=partial(_steps, config), info=info,
                 threads=config.threads, workers=config.workers)
