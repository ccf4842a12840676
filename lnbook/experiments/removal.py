"""Removing layer norm from a trained Transformer, one norm at a time (claim P19).

Part III, chapter `16_removing_ln`: a small Pre-LN Transformer learns the sort task; its norms
are replaced one at a time by fixed scales (:func:`lnbook.removal.replace_norm`) with a few
fine-tuning updates after each, against the original model and all norms removed at once.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from lnbook.checks import check_config
from lnbook.engine import (
    History,
    Job,
    Results,
    fit,
    make_config,
    max_updates,
    sweep,
)
from lnbook.engine.config import RunConfig
from lnbook.experiments.seq_tasks import (  # noqa: F401 (make_task: ch. 16)
    SMOKE_BATCH,
    SequenceTask,
    make_task,
    task_of,
)
from lnbook.removal import norm_input_scales, norm_names, remove_norms, replace_norm
from lnbook.transformer import Transformer, TransformerConfig, sequence_loss

__all__ = ["NAME", "DESCRIPTION", "Config", "get_config", "removal_order", "held_out_loss",
           "adam_updates", "run", "train"]

NAME = "removal"
DESCRIPTION = ("small Pre-LN Transformer on the sort task; its layer norms replaced one at a "
               "time by fixed scales with short fine-tuning (Heimersheim 2024)")


@dataclass
class Config(RunConfig):
    """Settings of the removal experiment; :func:`get_config` gives the presets.

    Attributes:
        size, symbols: the sort task.
        n_train, n_test: training and held-out sequences. d_model, n_heads, n_layers: the model.
        batch_size, steps, lr: Adam's batch, updates and rate of the original training.
        finetune_steps, finetune_lr: Adam updates after each replacement, and their rate.
        n_probe: training sequences on which each fixed scale is measured.
        scale, seeds, threads, workers: :class:`~lnbook.engine.RunConfig`'s.
    """

    size: int = 6
    symbols: int = 8
    n_train: int = 4096
    n_test: int = 128
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    batch_size: int = 32
    steps: int = 150
    lr: float = 3e-3
    finetune_steps: int = 8
    finetune_lr: float = 1e-3
    n_probe: int = 256
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.size, self.n_train, self.n_test, self.batch_size,
               self.n_probe) < 1 or self.finetune_steps < 0:
            raise ValueError("size, n_train, n_test, batch_size and n_probe must be >= 1, "
                             "finetune_steps >= 0")

    @property
    def task(self) -> str:
        """The task, always ``"sort"``."""
        return "sort"


_PRESETS: dict[str, dict[str, Any]] = {"quick": {}, "paper": {
    "threads": None, "size": 16, "symbols": 32, "n_train": 100_000, "n_test": 2048,
    "d_model": 256, "n_heads": 8, "n_layers": 6, "batch_size": 64, "steps": 10_000, "lr": 1e-3,
    "finetune_steps": 300, "finetune_lr": 3e-4, "n_probe": 1024}}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset with fields replaced by ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


def removal_order(model: Transformer) -> list[str]:
    """The feed-forward norms (``norm2``) of every block, then the attention norms, then the final
    norm (Heimersheim's order for GPT-2).
    """
    return sorted(norm_names(model),  # stable: the model's order within each group
                  key=lambda n: 0 if n.endswith("norm2") else 1 if n.endswith("norm1") else 2)


def held_out_loss(model: torch.nn.Module, task: SequenceTask) -> float:
    """``model``'s loss on the task's held-out set (nats per scored token), in eval mode."""
    model.eval()
    with torch.no_grad():
        return float(sequence_loss(model(task.x_test), task.y_test))


def adam_updates(model: torch.nn.Module, task: SequenceTask, steps: int, lr: float,
                 batch: int, gen: torch.Generator, bar: Any = None) -> None:
    """``steps`` updates of a fresh Adam (rate ``lr``) on ``model`` through
    :func:`lnbook.fit`, each on ``batch`` training sequences drawn with replacement by
    ``gen`` (which advances); none for ``steps == 0``. ``bar``: a sweep job's bar."""
    if steps == 0:
        return

    def draw(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(task.x), (batch,), generator=gen)  # (batch,)
        return task.x[idx], task.y[idx]

    fit(model, draw, torch.optim.Adam(model.parameters(), lr=lr, foreach=True), steps=steps,
        eval_every=steps, device=task.x.device, loss_fn=_batch_loss, progress=False, bar=bar)


def _batch_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return sequence_loss(model(batch[0]), batch[1])


def run(config: Config, device: str | torch.device = "auto", out: str | os.PathLike | None = None
        ) -> Results:
    """Train, then remove the norms one at a time with fine-tuning, for every seed (one job of
    :func:`lnbook.engine.runner.sweep` per seed, :func:`train`).

    Each run's ``info``: ``original``, ``all_at_once`` (no fine-tuning), ``control`` (fine-tuned
    as long, norms kept) held-out losses, and per removal step (``order``) ``no_finetune`` and
    ``finetuned``. ``Results.info`` holds the task's (``baseline_loss`` among them). With
    ``out``, also writes ``out/removal.json`` (finished runs under it are kept).
    """
    check_config(config, Config)
    task = task_of(config)
    n_norms = 2 * config.n_layers + 1  # the Pre-LN model's: two per block and the final one
    return sweep(NAME, {NAME: None}, config.seeds, partial(train, config, task), config=config,
                 device=device, out=out, threads=config.threads,
                 steps=config.steps + 2 * config.finetune_steps * n_norms,
                 workers=config.workers, info=task.info)


def train(config: Config, task: SequenceTask, job: Job) -> tuple[History, dict[str, Any]]:
    """The run of one seed of :func:`run`: train, remove the norms all at once (no
    fine-tuning) and one at a time (each followed by fine-tuning), and fine-tune a control
    with the norms kept; the history holds the final loss, ``info`` the rest."""
    task, seed = task.to(job.device), job.seed
    if max_updates() is not None:  # a smoke run: short batches and probe (minutes otherwise)
        config = replace(config, batch_size=min(config.batch_size, SMOKE_BATCH),
                         n_probe=min(config.n_probe, SMOKE_BATCH))
    probe = task.x[: config.n_probe]
    torch.manual_seed(seed)
    model = Transformer.from_config(TransformerConfig(
        vocab_size=task.vocab_size, d_model=config.d_model, n_heads=config.n_heads,
        n_layers=config.n_layers, max_len=task.seq_len)).to(task.x.device)
    gen = torch.Generator().manual_seed(seed)
    adam_updates(model, task, config.steps, config.lr, config.batch_size, gen, job.bar)
    original = held_out_loss(model, task)
    at_once = held_out_loss(remove_norms(model, probe), task)
    order = removal_order(model)
    control = copy.deepcopy(model)
    adam_updates(control, task, config.finetune_steps * len(order), config.finetune_lr,
                 config.batch_size, torch.Generator().manual_seed(seed + 1), job.bar)
    no_ft, ft = [], []
    for name in order:
        replace_norm(model, name, norm_input_scales(model, probe, [name])[name])
        no_ft.append(held_out_loss(model, task))
        adam_updates(model, task, config.finetune_steps, config.finetune_lr, config.batch_size, gen,
                     job.bar)
        ft.append(held_out_loss(model, task))
    info = {"original": original, "all_at_once": at_once,
            "control": held_out_loss(control, task), "order": order, "no_finetune": no_ft,
            "finetuned": ft}
    return History(eval_steps=[0], metrics=[{"loss": ft[-1]}]), info


# --- claim P19's per-seed inputs to lnbook.ledger.decide_claim (chapter 16) ------------------

#: Nats below the position-wise unigram predictor the original model must end (P19's bar).
P19_TRIVIAL = 0.5


def p19_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P19's ``values``, ``trivial_ok`` and ``reference`` for :func:`lnbook.ledger.decide_claim`
    from a run of :func:`run`, per seed: the cost of removal, the held-out loss with every norm
    replaced and fine-tuned minus the control's (the original fine-tuned as long with its
    norms), read against the control's loss (the rule is relative); the loss of removing all
    at once without fine-tuning minus with it; whether the original cleared
    :data:`P19_TRIVIAL`."""
    import numpy as np

    info = {k: np.array([r.info[k] for r in results.runs])
            for k in ("original", "all_at_once", "control", "finetuned")}
    done = info["finetuned"][:, -1]
    ok = info["original"] <= results.info["baseline_loss"] - P19_TRIVIAL
    small, needed = "small cost after fine-tuning", "the fine-tuning is needed"
    return {"values": {small: done - info["control"], needed: info["all_at_once"] - done},
            "trivial_ok": {small: ok, needed: ok}, "reference": {small: info["control"]}}


__all__ += ["P19_TRIVIAL", "p19_inputs"]
