"""RMSNorm against layer norm: invariances, quality on a sequence task, Pre-RMSNorm equivalence.

Book chapter `08_rmsnorm` (Part II), claims P01-P03 (Zhang and Sennrich 2019: ``a_i / RMS(a) *
g_i``, ``RMS(a) = sqrt(mean(a^2))``): :func:`rms_normalized_layer` (P01, a Table 1 row),
:func:`run` (P02, LN vs RMSNorm on the sort task; the cost half is
``benchmarks/bench_rmsnorm.py``) and :func:`prermsnorm_gaps` (P03, Jiang et al. 2023).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lnbook.checks import check_config
from lnbook.engine import History, Job, Results, make_config, sweep
from lnbook.experiments.seq_tasks import SequenceTask, TaskConfig, presets, task_of
from lnbook.experiments.stacked import train_stacked
from lnbook.transformer import (
    Transformer,
    TransformerConfig,
    center_residual_stream_,
    residual_stream,
    to_pre_rmsnorm,
)
from lnbook.variants import rms_norm

__all__ = ["NAME", "DESCRIPTION", "NORMS", "Config", "get_config", "model_config",
           "rms_normalized_layer", "prermsnorm_gaps", "run", "train"]

NAME = "rmsnorm"
DESCRIPTION = ("small Pre-norm Transformer on the sort task with layer norm vs RMSNorm, several "
               "seeds (Zhang and Sennrich 2019; Part II, claim P02)")
NORMS = ("layer", "rms")


@dataclass
class Config(TaskConfig):
    """Settings of the LN-vs-RMSNorm comparison (:class:`~lnbook.experiments.seq_tasks.TaskConfig`
    plus ``norms``, from :data:`NORMS`, and ``lr``, Adam's constant rate).
    """

    norms: tuple[str, ...] = NORMS
    lr: float = 1e-2
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.norms or any(n not in NORMS for n in self.norms):
            raise ValueError(f"norms must be drawn from {NORMS}, got {self.norms}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


_PRESETS = presets(lr=5e-4)


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def model_config(config: Config, norm: str, seq_len: int) -> TransformerConfig:
    """The Pre-norm Transformer of one variant (``norm`` 'layer' or 'rms')."""
    return config.model_config(seq_len, norm=norm, position="pre")


def rms_normalized_layer(x: Tensor, weight: Tensor, gain: Tensor, bias: Tensor) -> Tensor:
    """The RMS-normalized layer ``g * a / RMS(a) + b`` with ``a = x W^T`` ``(N, H)`` (Zhang and
    Sennrich 2019), in the form of an extra layer of :func:`lnbook.analysis.invariance_changes`.

    Example::

        >>> from lnbook.analysis import invariance_table
        >>> row = invariance_table(layers={"rms": rms_normalized_layer})["rms"]
        >>> row["single_case_rescaling"], row["dataset_recentering"]
        (True, False)
    """
    a = x @ weight.T  # (N, H) summed inputs
    return rms_norm(a, a.shape[-1], weight=gain) + bias  # (N, H)


def prermsnorm_gaps(seed: int = 0, d_model: int = 32, n_heads: int = 4, n_layers: int = 2,
                    seq_len: int = 16, vocab_size: int = 9, batch: int = 8, noise: float = 0.3,
                    dtype: torch.dtype = torch.float64) -> dict[str, float]:
    """How far apart a Pre-LN Transformer and its Pre-RMSNorm conversion are (claim P03).

    A Pre-LN model built under ``seed`` gets ``noise * N(0, 1)`` added to every parameter (so gains
    are not 1 and biases not 0); on random ids it returns ``converted`` (relative largest logit gap
    to :func:`lnbook.transformer.to_pre_rmsnorm`, zero up to rounding), ``naive`` (the same for a
    Pre-RMSNorm model that just takes the weights), ``mean_before``/``mean_after`` (the largest
    ``|mean over D|`` of the stream before and after
    :func:`lnbook.transformer.center_residual_stream_`) and ``centred_logits`` (the logit gap the
    centring makes).
    """
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = Transformer(vocab_size, d_model, n_heads, n_layers, seq_len, dtype=dtype).eval()

    def rel(a: Tensor, b: Tensor) -> float:
        return float((a - b).abs().max() / a.abs().max())

    with torch.no_grad():
        for p in model.parameters():  # gains not 1, biases not 0
            p.add_(noise * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        idx = torch.randint(0, vocab_size, (batch, seq_len), generator=gen)  # (B, T)
        ref = model(idx)  # (B, T, V)
        converted = to_pre_rmsnorm(model)(idx)  # (B, T, V)
        naive_model = Transformer.from_config(replace(model.config, norm="rms"), dtype=dtype)
        state = {k: v for k, v in model.state_dict().items()
                 if not k.endswith(("norm1.bias", "norm2.bias", "final_norm.bias"))}
        naive_model.load_state_dict(state)
        naive = naive_model(idx)  # (B, T, V)
        before = max(float(x.mean(-1).abs().max()) for x in residual_stream(model, idx))
        centred = center_residual_stream_(model)
        after = max(float(x.mean(-1).abs().max()) for x in residual_stream(centred, idx))
        centred_logits = centred(idx)  # (B, T, V)
    return {"converted": rel(ref, converted), "naive": rel(ref, naive),
            "mean_before": before, "mean_after": after,
            "centred_logits": rel(ref, centred_logits)}


def run(config: Config, device: str | torch.device = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train the Pre-norm Transformer with each norm of ``config.norms`` and every seed (those
    of a norm at once on ``device``, one job of :func:`lnbook.engine.runner.sweep`); variants are
    named by the norm, evaluations record ``loss``, ``accuracy`` and ``max_logit``; ``Results.info``
    the task's (:attr:`~lnbook.experiments.seq_tasks.SequenceTask.info`). With ``out``, also
    writes ``out/rmsnorm.json``, finished runs under it kept."""
    check_config(config, Config)
    task = task_of(config)
    return sweep(NAME, {norm: norm for norm in config.norms}, config.seeds,
                 partial(train, config, task), config=config, device=device, out=out,
                 stack="seeds", steps=config.steps, threads=config.threads,
                 workers=config.workers, info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> list[tuple[History, dict]]:
    """The job of one norm of :func:`run`: the model with ``job.variant``'s norm, every seed of
    the job at once; ``(history, info)`` per seed."""
    trained = train_stacked(
        model_config(config, job.variant, task.seq_len), task.to(job.device), job.seeds,
        [config.lr], steps=config.steps, batch_size=config.batch_size,
        eval_every=config.eval_every, order="fit", max_logit=True, stream_var=False,
        bar=job.bar)
    return [(r.history, r.info) for r in trained]


# --- claim P02's per-seed inputs to lnbook.ledger.decide_claim (chapter 8) -------------------

#: Nats below the position-wise unigram predictor that both runs of a seed must end (P02).
P02_TRIVIAL = 0.5


def p02_inputs(results: Results, cost_ratio: float) -> dict[str, dict[str, Any]]:
    """P02's ``values``, ``trivial_ok`` and ``reference`` for :func:`lnbook.ledger.decide_claim`
    from a run of :func:`run`: per seed the absolute gap of the final held-out losses of
    RMSNorm and layer norm (read against layer norm's loss, the rule being relative), whether
    both runs cleared :data:`P02_TRIVIAL`; ``cost_ratio`` is the benchmark's RMSNorm / layer
    norm time (one computation)."""
    import numpy as np

    ln, rms = results.final("layer", "loss"), results.final("rms", "loss")
    return {"values": {"comparable quality": np.abs(rms - ln),
                       "lower cost": [float(cost_ratio)]},
            "trivial_ok": {"comparable quality": p02_left(results)},
            "reference": {"comparable quality": ln}}


__all__ += ["P02_TRIVIAL", "p02_inputs"]


def p02_left(results: Results) -> Any:
    """Per seed, whether both runs ended :data:`P02_TRIVIAL` nats below the position-wise
    unigram predictor: a ``(seeds,)`` boolean array."""
    base = results.info["baseline_loss"]
    return ((results.final("layer", "loss") < base - P02_TRIVIAL)
            & (results.final("rms", "loss") < base - P02_TRIVIAL))


__all__ += ["p02_left"]
