"""Many seeds trained as one: a ReLU MLP with a leading seed dimension.

:class:`SeedMLP` holds ``S`` networks in tensors ``(S, in, out)`` (one ``baddbmm`` per layer),
every norm per seed; the loss is the sum over seeds of each seed's mean loss, so each slice gets
exactly its own gradient and an elementwise optimizer its own update. ``tests/test_batched.py``
checks it against per-seed networks; ``benchmarks/bench_seeds.py`` measures the speed-up.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.checks import check_choice, check_size
from lnbook.engine.train import Batches

__all__ = ["NORMS", "SeedMLP", "seed_batches", "seed_nll", "seed_sq_norm",
           "train_mode_logits"]

NORMS = ("none", "layer", "batch")


class SeedMLP(nn.Module):
    r"""``S`` ReLU MLPs ``[Linear -> norm (-> noise) -> ReLU] * L -> Linear (-> BN)`` as one.

    Layer ``l`` of seed ``s``: :math:`a = h W_{s,l} + b_{s,l}`, then layer norm (eq. 3) per example
    or batch norm (eq. 2) over seed ``s``'s batch (running averages per seed, as
    :class:`torch.nn.BatchNorm1d`), then seed ``s``'s gain and bias.

    Args:
        seeds: ``S``. sizes: widths, input first. norm: ``"none"``, ``"layer"`` or ``"batch"``.
        hidden_bias: hidden layers' bias (default: only without a norm). out_bias: last layer's.
        affine: norms with gain and bias. detach: DetachNorm (chapter 13).
        norm_logits: batch norm of the logits too (section 6.6). bn_unbiased: unbiased variance.
        noise: :class:`lnbook.experiments.why.SignalNoise`'s ``r`` after every hidden norm.
        init_scale: He-normal std times this. eps, momentum: the norms'.

    Shape: ``(S, N, sizes[0])`` or ``(N, sizes[0])`` -> ``(S, N, sizes[-1])``.
    """

    def __init__(self, seeds: int, sizes: Sequence[int], norm: str = "none", *,
                 hidden_bias: bool | None = None, out_bias: bool = True, affine: bool = True,
                 detach: bool = False, norm_logits: bool = False, bn_unbiased: bool = False,
                 noise: float = 0.0, init_scale: float = 1.0, eps: float = 1e-5,
                 momentum: float = 0.1) -> None:
        super().__init__()
        check_choice("norm", norm, NORMS)
        check_size("seeds", seeds)
        if len(sizes) < 2:
            raise ValueError(f"sizes needs an input and an output width, got {tuple(sizes)}")
        if detach and norm != "layer":
            raise ValueError("detach applies to layer normalization only")
        if norm_logits and norm != "batch":
            raise ValueError("norm_logits applies to batch normalization only")
        if not 0 <= noise < 1:
            raise ValueError(f"noise must lie in [0, 1), got {noise!r}")
        self.seeds, self.sizes, self.norm = seeds, tuple(int(s) for s in sizes), norm
        self.affine, self.detach, self.norm_logits = affine, detach, norm_logits
        self.bn_unbiased, self.noise, self.init_scale = bn_unbiased, float(noise), init_scale
        self.eps, self.momentum = float(eps), float(momentum)
        self._blocks = 0  # > 0 only inside train_mode_logits
        hidden_bias = norm == "none" if hidden_bias is None else hidden_bias
        pairs = list(zip(self.sizes[:-1], self.sizes[1:], strict=True))
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(seeds, i, o)) for i, o in pairs)
        self._has_bias = [hidden_bias] * (len(pairs) - 1) + [out_bias]
        self.biases = nn.ParameterList(
            nn.Parameter(torch.zeros(seeds, 1, o))
            for (_, o), b in zip(pairs, self._has_bias, strict=True) if b)
        normed = [o for _, o in pairs[:-1]] if norm != "none" else []
        if norm_logits:
            normed.append(self.sizes[-1])
        self.n_norms = len(normed)
        self.gains = nn.ParameterList(
            nn.Parameter(torch.ones(seeds, 1, h)) for h in (normed if affine else []))
        self.shifts = nn.ParameterList(
            nn.Parameter(torch.zeros(seeds, 1, h)) for h in (normed if affine else []))
        for k, h in enumerate(normed if norm == "batch" else []):
            self.register_buffer(f"running_mean{k}", torch.zeros(seeds, h))
            self.register_buffer(f"running_var{k}", torch.ones(seeds, h))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He-normal weights times ``init_scale``, zero biases, unit gains, fresh averages."""
        for w in self.weights:
            nn.init.normal_(w, std=self.init_scale * math.sqrt(2.0 / w.shape[1]))
        for p in (*self.biases, *self.shifts):
            nn.init.zeros_(p)
        for g in self.gains:
            nn.init.ones_(g)
        for k in range(self.n_norms if self.norm == "batch" else 0):
            getattr(self, f"running_mean{k}").zero_()
            getattr(self, f"running_var{k}").fill_(1.0)

    @property
    def hidden_weights(self) -> list[nn.Parameter]:
        """The weight matrices of the hidden layers (those in front of a hidden norm)."""
        return list(self.weights[:-1])

    def _normalize(self, a: Tensor, k: int) -> Tensor:
        if self.norm == "layer":
            if self.detach:
                mu = a.detach().mean(-1, keepdim=True)  # (S, N, 1)
                var = a.detach().var(-1, unbiased=False, keepdim=True)
                out = (a - mu) / torch.sqrt(var + self.eps)
            else:
                out = F.layer_norm(a, a.shape[-1:], eps=self.eps)  # per example
        else:
            rm, rv = getattr(self, f"running_mean{k}"), getattr(self, f"running_var{k}")
            if self.training and self._blocks:
                # training mode read block by block: each block of examples with its own
                # statistics, the running averages left alone (train_mode_logits)
                s, n, h = a.shape
                ab = a.view(s, n // self._blocks, self._blocks, h)  # (S, G, B, H)
                mu = ab.mean(2, keepdim=True)
                var = ab.var(2, unbiased=self.bn_unbiased, keepdim=True)
                out = ((ab - mu) / torch.sqrt(var + self.eps)).view(s, n, h)
            elif self.training:
                n = a.shape[1]
                mu = a.mean(1)  # (S, H): over this seed's examples
                var_b = a.var(1, unbiased=False)  # (S, H)
                with torch.no_grad():
                    m = self.momentum
                    rm.mul_(1 - m).add_(m * mu.detach())
                    rv.mul_(1 - m).add_(m * var_b.detach() * n / max(n - 1, 1))
                var = var_b * n / (n - 1) if self.bn_unbiased else var_b
                out = (a - mu[:, None]) / torch.sqrt(var[:, None] + self.eps)
            else:
                out = (a - rm[:, None]) / torch.sqrt(rv[:, None] + self.eps)
        if self.affine:
            out = torch.addcmul(self.shifts[k], out, self.gains[k])  # (S, 1, H) per seed
        return out

    def _noise(self, h: Tensor) -> Tensor:
        if not self.training or self.noise == 0:
            return h
        r = self.noise
        rms = h.detach().square().mean(1, keepdim=True).sqrt()  # (S, 1, H)
        scale = 1 + r * (2 * torch.rand_like(rms) - 1)
        shift = r * (1 + torch.randn_like(rms)) * rms
        return h * scale + shift

    def forward(self, x: Tensor, return_summed: bool = False) -> Tensor | tuple[Tensor, list]:
        if x.dim() == 2:
            x = x.expand(self.seeds, *x.shape)
        if x.dim() != 3 or x.shape[0] != self.seeds or x.shape[2] != self.sizes[0]:
            raise ValueError(f"SeedMLP expects (S={self.seeds}, N, {self.sizes[0]}) or "
                             f"(N, {self.sizes[0]}) inputs, got {tuple(x.shape)}")
        h, summed, biases = x, [], iter(self.biases)
        last = len(self.weights) - 1
        for k, w in enumerate(self.weights):
            b = next(biases) if self._has_bias[k] else None
            a = torch.bmm(h, w) if b is None else torch.baddbmm(b, h, w)  # (S, N, out)
            if k < last:
                summed.append(a)
                if self.norm != "none":
                    a = self._normalize(a, k)
                h = torch.relu(self._noise(a))
            else:
                h = self._normalize(a, self.n_norms - 1) if self.norm_logits else a
        return (h, summed) if return_summed else h

    def extra_repr(self) -> str:
        return (f"seeds={self.seeds}, sizes={self.sizes}, norm={self.norm!r}, "
                f"affine={self.affine}, detach={self.detach}, noise={self.noise}")

    def recalibrated(self, x: Tensor) -> SeedMLP:
        """A copy whose batch-norm running averages are ``x``'s statistics under the present
        weights, layer by layer (this network is untouched)."""
        probe = copy.deepcopy(self)
        if self.norm != "batch":
            return probe.eval()
        probe.momentum, probe.noise = 1.0, 0.0  # the average is this one batch, no noise
        with torch.no_grad():
            probe.train()(x)
        probe.momentum, probe.noise = self.momentum, self.noise
        return probe.eval()

    # -- per-seed networks in and out ------------------------------------------------------
    def _pairs(self, model: nn.Module) -> list[tuple[Tensor, Tensor]]:
        """``(batched, per-seed)`` for every parameter and average (Linear weights transposed)."""
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        norms = [m for m in model.modules()
                 if m is not model and not isinstance(m, nn.Linear)
                 and (hasattr(m, "running_mean") or getattr(m, "weight", None) is not None)]
        if len(linears) != len(self.weights):
            raise ValueError(f"expected a network with {len(self.weights)} Linear layers, "
                             f"got {len(linears)}")
        out: list[tuple[Tensor, Tensor]] = []
        biases = iter(self.biases)
        for k, lin in enumerate(linears):
            out.append((self.weights[k], lin.weight.t()))
            if self._has_bias[k] != (lin.bias is not None):
                raise ValueError(f"layer {k}: bias {lin.bias is not None} in the network, "
                                 f"{self._has_bias[k]} here")
            if lin.bias is not None:
                out.append((next(biases), lin.bias))
        if self.affine:
            if len(norms) != self.n_norms:
                raise ValueError(f"expected {self.n_norms} norms with parameters, got "
                                 f"{len(norms)}")
            for k, n in enumerate(norms):
                out += [(self.gains[k], n.weight), (self.shifts[k], n.bias)]
        if self.norm == "batch":
            for k, n in enumerate(norms):
                out += [(getattr(self, f"running_mean{k}"), n.running_mean),
                        (getattr(self, f"running_var{k}"), n.running_var)]
        return out

    @classmethod
    def from_models(cls, models: Sequence[nn.Module], sizes: Sequence[int],
                    norm: str = "none", **kwargs) -> SeedMLP:
        """One :class:`SeedMLP` holding ``models`` (per-seed networks of the same layout,
        their ``Linear`` layers and norms in order), with their weights and averages."""
        batched = cls(len(models), sizes, norm, **kwargs)
        with torch.no_grad():
            for s, model in enumerate(models):
                for big, small in batched._pairs(model):
                    big[s].copy_(small.reshape(big[s].shape))
        return batched

    def copy_to(self, model: nn.Module, seed: int) -> nn.Module:
        """Write seed ``seed``'s weights (and averages) into ``model`` (per-seed layout)."""
        with torch.no_grad():
            for big, small in self._pairs(model):
                small.copy_(big[seed].reshape(small.shape))
        return model


def seed_batches(x: Tensor, y: Tensor, batch_size: int,
                 seeds: Sequence[int]) -> Callable[[int], tuple[Tensor, Tensor]]:
    """``step -> (x (S, B, D), y (S, B))``: each seed's mini-batch, in the order
    :class:`lnbook.engine.train.Batches` gives that seed, so a batched run sees the same data."""
    orders = [Batches(torch.arange(len(y)), batch_size=batch_size, seed=s) for s in seeds]

    def batch(step: int) -> tuple[Tensor, Tensor]:
        idx = torch.stack([o(step)[0] for o in orders]).flatten().to(x.device)  # (S * B,)
        return (x.index_select(0, idx).view(len(seeds), batch_size, *x.shape[1:]),
                y.index_select(0, idx).view(len(seeds), batch_size, *y.shape[1:]))

    return batch


def seed_nll(logits: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy of each seed: logits ``(S, N, C)``, labels ``(S, N)`` or ``(N,)``
    -> ``(S,)`` nats."""
    s, n, c = logits.shape
    y = y.expand(s, n) if y.dim() == 1 else y
    return F.cross_entropy(logits.reshape(s * n, c), y.reshape(-1),
                           reduction="none").view(s, n).mean(1)


def seed_sq_norm(tensors: Sequence[Tensor]) -> Tensor:
    """The squared norm of each seed's slice of ``tensors`` together: ``(S,)``."""
    return sum(t.detach().square().flatten(1).sum(1) for t in tensors)


def train_mode_logits(model: SeedMLP, x: Tensor, batch_size: int) -> Tensor:
    """Logits in training mode, each block of ``batch_size`` examples normalized by itself
    (``(S, (N // batch_size) * batch_size, C)``); the model's averages and mode are kept."""
    n = (x.shape[-2] // batch_size) * batch_size
    if n == 0:
        raise ValueError(f"need at least one batch of {batch_size} examples, got "
                         f"{x.shape[-2]}")
    was_training = model.training
    model.train()
    model._blocks = batch_size
    try:
        with torch.no_grad():
            out = model(x[..., :n, :])  # (S, n, C), every block normalized by itself
    finally:
        model._blocks = 0
        model.train(was_training)
    return out
