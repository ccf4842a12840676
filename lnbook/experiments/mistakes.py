"""Common mistakes in layer normalization (Part II, chapter `13_common_mistakes`, claim P10):
:func:`layer_norm_variant` (eq. 3 right or in a common wrong way), loading weights trained with
the unbiased variance (:class:`UnbiasedLayerNorm`, :func:`to_biased`) and DeepNorm's constant
(:func:`residual_placements`, :func:`run`: the model update of deep Post-LN stacks). The
chapter's ablation of the statistics' gradients and the gain and bias (Xu et al. 2019) is the
experiment :mod:`lnbook.experiments.norm_ablation`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_config
from lnbook.data import load_digits_tensor, sort_task
from lnbook.engine import (
    Batches,
    History,
    Job,
    Results,
    fit,
    make_config,
    max_updates,
    resolve_seeds,
    sweep,
)
from lnbook.engine.config import RunConfig
from lnbook.functional import (
    normalize,
    normalize_detached,
    normalize_eps_outside,
    normalize_in_input_dtype,
    normalize_one_pass,
    normalize_unbiased,
)
from lnbook.mlp import DetachNorm
from lnbook.norms import LayerNorm, layer_norm
from lnbook.transformer import Transformer, sequence_loss

__all__ = ["NAME", "DESCRIPTION", "KINDS", "Config", "get_config", "layer_norm_variant",
           "UnbiasedLayerNorm", "DigitsMLP", "train_digits_mlp", "to_biased",
           "residual_placements", "variant_name", "run", "DetachNorm", "p10_inputs"]

NAME = "mistakes"
DESCRIPTION = ("size of the first model updates of deep Post-LN Transformers, plain and with "
               "DeepNorm (Wang et al. 2022), at several depths")
KINDS = ("post", "deepnorm")


def layer_norm_variant(x: Tensor, eps: float = 1e-5, *, unbiased: bool = False,
                       one_pass: bool = False, eps_inside: bool = True,
                       stats_dtype: torch.dtype | None = None, detach: bool = False) -> Tensor:
    """Eq. 3 over the last dimension ``(*, H)``, no gain and bias, right or in a common wrong way.

    Right (every option at its default): ``(x - mu) / sqrt(var + eps)``, biased two-pass variance,
    float32 statistics for half inputs. Each option, one at a time, picks a variant of
    :func:`lnbook.functional.normalize`: ``unbiased`` (divide by ``H - 1``), ``one_pass``
    (``E[x^2] - E[x]^2``), ``eps_inside=False`` (``(x - mu) / (sqrt(var) + eps)``), ``stats_dtype``
    (``torch.float16``: ``x ** 2`` overflows from ``|x| >= 256``), ``detach`` (:class:`DetachNorm`).
    """
    if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= 1):
        raise TypeError("x must be a floating-point tensor of shape (*, H)")
    h = x.shape[-1]
    if unbiased and h < 2:
        raise ValueError(f"the unbiased variance needs H >= 2 values, got H={h}")
    picked = [f for on, f in ((unbiased, normalize_unbiased), (one_pass, normalize_one_pass),
                              (not eps_inside, normalize_eps_outside),
                              (stats_dtype is not None, normalize_in_input_dtype),
                              (detach, normalize_detached)) if on]
    if len(picked) > 1:
        raise ValueError("layer_norm_variant makes one mistake at a time")
    rows = x.reshape(-1, h) if stats_dtype is None else x.reshape(-1, h).to(stats_dtype)
    x_hat, _ = (picked[0] if picked else normalize)(rows, eps)
    return x_hat.reshape(x.shape).to(x.dtype)


class UnbiasedLayerNorm(nn.Module):
    """Layer norm with the *unbiased* variance: the mistake, as a module
    (:class:`lnbook.LayerNorm`'s parameters and state dict; outputs ``sqrt((H - 1) / H)``
    times LN's before the bias).
    """

    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.hidden, self.eps = int(hidden), float(eps)
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_variant(x, self.eps, unbiased=True) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.hidden}, eps={self.eps}, unbiased variance"


class DigitsMLP(nn.Module):
    """``Linear -> norm -> ReLU -> Linear -> norm -> ReLU -> Linear`` on 8x8 digits ``(N, 64)``;
    ``norm`` ``"biased"`` (:class:`lnbook.LayerNorm`) or ``"unbiased"``
    (:class:`UnbiasedLayerNorm`).
    """

    def __init__(self, norm: str = "biased", hidden: int = 8, eps: float = 1e-5) -> None:
        super().__init__()
        if norm not in ("biased", "unbiased"):
            raise ValueError(f"norm must be 'biased' or 'unbiased', got {norm!r}")
        self.norm_kind, self.hidden = norm, int(hidden)
        norm_cls = LayerNorm if norm == "biased" else UnbiasedLayerNorm
        self.fc1, self.norm1 = nn.Linear(64, hidden), norm_cls(hidden, eps=eps)
        self.fc2, self.norm2 = nn.Linear(hidden, hidden), norm_cls(hidden, eps=eps)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.norm1(self.fc1(x)))  # (N, H)
        h = F.relu(self.norm2(self.fc2(h)))  # (N, H)
        return self.head(h)  # (N, 10)


def train_digits_mlp(norm: str = "unbiased", hidden: int = 8, steps: int = 300,
                     seed: int = 0, lr: float = 1e-2) -> DigitsMLP:
    """A :class:`DigitsMLP` trained with Adam on the 1,438 training digits (batch 32)."""
    x, y = load_digits_tensor("train", flatten=True)  # (1438, 64), (1438,)
    torch.manual_seed(seed)
    model = DigitsMLP(norm, hidden)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    fit(model, Batches(x, y, batch_size=32, seed=seed), opt, steps=steps, eval_every=steps,
        device="cpu", seed=seed, loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]),
        progress=False)
    return model.eval()


def to_biased(model: DigitsMLP) -> DigitsMLP:
    """The :class:`DigitsMLP` with biased layer norms that computes what ``model`` computes:
    ``g' = g * sqrt((H - 1) / H)`` and ``eps' = eps * (H - 1) / H``, all else kept.
    """
    if model.norm_kind != "unbiased":
        raise ValueError("to_biased converts a model built with norm='unbiased'")
    h = model.hidden
    c = (h - 1) / h
    new = DigitsMLP("biased", h, eps=model.norm1.eps * c)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for name in ("norm1", "norm2"):
        state[f"{name}.weight"] = state[f"{name}.weight"] * math.sqrt(c)
    new.load_state_dict(state)
    return new.eval()


def residual_placements(x: Tensor, branch: Tensor, alpha: float) -> dict[str, Tensor]:
    """A Post-LN residual with DeepNorm's ``alpha`` in three places: ``"residual"`` ``LN(alpha x +
    G(x))`` (Wang et al., 2022), ``"branch"`` ``LN(x + alpha G(x))``, ``"output"`` ``alpha LN(x +
    G(x))``; ``branch`` is ``G(x)``, LN without gain and bias.
    """
    if x.shape != branch.shape:
        raise ValueError(f"x and branch must have the same shape, got {tuple(x.shape)} and "
                         f"{tuple(branch.shape)}")
    d = x.shape[-1]
    return {"residual": layer_norm(alpha * x + branch, d),
            "branch": layer_norm(x + alpha * branch, d),
            "output": alpha * layer_norm(x + branch, d)}


@dataclass
class Config(RunConfig):
    """Settings of the DeepNorm update-size experiment (:func:`get_config` gives the presets):
    a stack of each of ``depths`` blocks and ``kinds``, on the sort task (``length``,
    ``vocab_size``), ``steps`` Adam updates (the update size measured after each) and
    ``n_probe`` held-out sequences on which the logits are compared."""

    depths: tuple[int, ...] = (2, 6, 18)
    kinds: tuple[str, ...] = KINDS
    d_model: int = 16
    n_heads: int = 2
    length: int = 6
    vocab_size: int = 8
    batch_size: int = 16
    steps: int = 1
    lr: float = 1e-3
    n_probe: int = 64
    seeds: int | tuple[int, ...] = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if any(k not in KINDS for k in self.kinds) or not self.kinds:
            raise ValueError(f"kinds must be drawn from {KINDS}, got {self.kinds}")
        if not self.depths or any(d < 1 for d in self.depths):
            raise ValueError(f"depths must be positive, got {self.depths}")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {"threads": None, "depths": (6, 18, 50, 100, 200), "d_model": 128, "n_heads": 4,
              "length": 16, "vocab_size": 32, "batch_size": 64, "steps": 100, "lr": 5e-4,
              "n_probe": 256},
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset (200 blocks; wants a GPU), with ``overrides``."""
    return make_config(Config, _PRESETS, scale, overrides)


_SMOKE_PROBE = 8  # probe sequences of a smoke run of the paper preset


def variant_name(kind: str, depth: int) -> str:
    """``"post/L18"``, ``"deepnorm/L18"``."""
    return f"{kind}/L{depth}"


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every (kind, depth) stack for ``steps`` Adam updates, with every seed; each evaluation
    records ``val_loss`` and ``update``, the RMS change of the logits on ``n_probe`` held-out
    sequences since initialization (Wang et al.'s ``||F(x, theta_t) - F(x, theta_0)||``).
    """
    check_config(config, Config)
    seeds, n_probe = config.seeds, config.n_probe
    if max_updates() is not None and config.scale == "paper":
        # a smoke run of the paper preset (lnbook.engine.capped): every model at full size,
        # but one seed and a few probe sequences, so that stacks of 200 blocks step within
        # minutes on a CPU (a probe pass of 256 sequences through one takes 10-20 s there)
        seeds, n_probe = resolve_seeds(seeds)[:1], min(n_probe, _SMOKE_PROBE)
    x, y = sort_task(4096, config.length, config.vocab_size, seed=0)  # (n, T)
    xp, yp = sort_task(n_probe, config.length, config.vocab_size, seed=1)
    variants = {variant_name(k, d): (k, d) for d in config.depths for k in config.kinds}
    return sweep(NAME, variants, seeds, partial(train_one, config, (x, y, xp, yp)),
                 config=config, device=device, out=out, steps=config.steps, threads=config.threads,
                 workers=config.workers)


def train_one(config: Config, data: tuple[Tensor, ...], job: Job) -> History:
    """One run of :func:`run`: the Post-LN (or DeepNorm) stack of ``job.params`` (kind, depth)
    trained on ``data`` (``x, y`` and the probe ``xp, yp``) with seed ``job.seed``."""
    x, y, xp, yp = data
    kind, depth = job.params
    torch.manual_seed(job.seed)
    model = Transformer(config.vocab_size + 1, config.d_model, config.n_heads, depth,
                        x.shape[1], norm="layer", position="post",
                        deepnorm=(kind == "deepnorm")).to(job.device)
    probe, targets = xp.to(job.device), yp.to(job.device)
    with torch.no_grad():
        start = model(probe)  # (n_probe, T, V) logits at initialization

    def eval_fn(m: nn.Module) -> dict[str, float]:
        logits = m(probe)  # (n_probe, T, V)
        return {"update": float((logits - start).square().mean().sqrt()),
                "val_loss": float(sequence_loss(logits, targets))}

    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    return fit(model, Batches(x, y, batch_size=config.batch_size, seed=job.seed), opt,
               steps=config.steps, eval_every=1, eval_fn=eval_fn, device=job.device,
               seed=job.seed, loss_fn=lambda m, b: sequence_loss(m(b[0]), b[1]),
               bar=job.bar, label=job.label)


# --- claim P10: per-seed inputs to lnbook.ledger.decide_claim (chapter 13) -------------------

def p10_inputs(results: Results) -> dict[str, dict[str, Any]]:
    """P10's ``values`` for :func:`lnbook.ledger.decide_claim` from a :func:`run`, per seed on
    the final ``update`` (the RMS change of the logits): DeepNorm's over Post-LN's at the
    largest depth, and DeepNorm's growth from the smallest depth to the largest over Post-LN's
    (growth: the update at the largest depth over the one at the smallest)."""
    depths = sorted({int(v.rsplit("/L", 1)[1]) for v in results.variants})
    deep, shallow = depths[-1], depths[0]

    def update(kind: str, depth: int) -> Any:
        return results.final(variant_name(kind, depth), "update")  # (seeds,)

    growth = {k: update(k, deep) / update(k, shallow) for k in ("post", "deepnorm")}
    return {"values": {
        "smaller update at depth": update("deepnorm", deep) / update("post", deep),
        "grows less with depth": growth["deepnorm"] / growth["post"]}}

