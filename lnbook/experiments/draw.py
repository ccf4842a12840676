"""DRAW on binarized MNIST, with and without layer normalization (paper section 6.4, Figure 4).

Book chapter `06_4_draw`: :class:`DRAW` (Gregor et al., 2015) with :class:`lnbook.DRAWLSTMCell`
cells (eqs. 29-31), trained on the negative variational bound ``L = L^x + L^z`` (nats per image).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook import DRAWLSTMCell
from lnbook.checks import check_choice, check_config, check_size, check_subset
from lnbook.data import binarize, load_mnist, warn_if_subset
from lnbook.device import resolve_device
from lnbook.engine.config import RunConfig, make_config
from lnbook.engine.copies import train_copies
from lnbook.engine.job import Job
from lnbook.engine.results import Results
from lnbook.engine.runner import sweep
from lnbook.engine.stack import Stack
from lnbook.engine.train import Batches, History, fit

__all__ = [
    "NAME",
    "DESCRIPTION",
    "VARIANTS",
    "Config",
    "get_config",
    "attention_params",
    "filterbank",
    "read_glimpse",
    "write_patch",
    "gaussian_kl",
    "held_out_terms",
    "DRAW",
    "mean_image_nll",
    "load_data",
    "build_model",
    "model_path",
    "load_trained",
    "plot_canvas",
    "run",
    "TARGET_BELOW",
    "c15_inputs",
]

NAME = "draw"
DESCRIPTION = (
    "DRAW with read/write attention on binarized MNIST, LSTM cells with and without layer "
    "normalization on the cell state (section 6.4, Figure 4, eqs. 29-31)"
)
VARIANTS = ("baseline", "layer_norm")
#: nats below the mean-image level (:func:`mean_image_nll`): C15's target of "converges
#: faster", and how far below it both runs of a seed must end for the seed to count
TARGET_BELOW = 3.0


@dataclass
class Config(RunConfig):
    """Settings of the DRAW experiment; :func:`get_config` gives the presets.

    Attributes:
        scale: ``"quick"`` (a CPU) or ``"paper"`` (section 6.4's sizes).
        image_size: side of the square images: 28 (the paper), 14 or 7 (block means).
        binarize_threshold: pixels above it become 1; None draws each pixel once from
            Bernoulli(intensity) with ``binarize_seed`` (Larochelle and Murray, 2011).
        glimpses: DRAW steps T; enc_size, dec_size: LSTM units; z_size: latent units per step.
        read_n, write_n: side of the read and write filter grids (Gregor et al.: 2 and 5).
        batch_size, lr, steps, eval_every: Adam training schedule.
        eval_images: held-out images scored at each evaluation (None: the whole test split).
        binarize_seed: seed of the stochastic binarization (training split; test: + 1).
        data_source: passed to :func:`lnbook.data.load_mnist`.
        variants: the runs (``"baseline"``: eqs. 29-30, ``"layer_norm"``: eq. 31).
        checkpoint: checkpoint each job under ``out/`` (a sweep resumes).
        stacked: train the seeds of each variant as one engine
            :class:`~lnbook.engine.Stack` (one job of the sweep per variant).
    """

    image_size: int = 14
    binarize_threshold: float | None = 0.5
    glimpses: int = 2
    enc_size: int = 64
    dec_size: int = 64
    z_size: int = 16
    read_n: int = 14
    write_n: int = 14
    batch_size: int = 64
    lr: float = 3e-3
    steps: int = 600
    eval_every: int = 25
    eval_images: int | None = 300
    binarize_seed: int = 0
    data_source: str = "auto"
    seeds: int | tuple[int, ...] = 3
    variants: tuple[str, ...] = field(default=VARIANTS)
    checkpoint: bool = False
    stacked: bool = True


_PRESETS: dict[str, dict] = {
    "quick": {},
    "paper": dict(
        image_size=28, binarize_threshold=None, glimpses=64, enc_size=256, dec_size=256,
        z_size=100, read_n=2, write_n=5, batch_size=128, lr=1e-3, steps=40_000,
        eval_every=1_000, eval_images=None, checkpoint=True, threads=None, stacked=False,
    ),  # 40,000 updates of 128 are about the 100 epochs of 50,000 images in Figure 4
}


def get_config(scale: str = "quick", **overrides) -> Config:
    """The ``quick`` or ``paper`` preset, with any field replaced by a keyword argument."""
    cfg = make_config(Config, _PRESETS, scale, overrides)
    check_subset("variants", cfg.variants, VARIANTS)
    check_choice("image_size", cfg.image_size, (28, 14, 7))  # the divisors of 28 we pool to
    t = cfg.binarize_threshold
    if t is not None and not 0.0 <= t < 1.0:
        raise ValueError(f"binarize_threshold must be None or lie in [0, 1), got {t!r}")
    return cfg


# ----------------------------------------------------------------------------------------------
# Filterbank attention (Gregor et al., 2015, section 3.2)


def attention_params(raw: Tensor, n: int, width: int,
                     height: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Turn the 5 numbers a linear layer emits into the grid's centre, stride, blur and gain.

    ``raw = (g~x, g~y, log sigma^2, log delta~, log gamma)`` as in Gregor et al.:
    ``gx = (A + 1) / 2 * (g~x + 1)``, ``gy = (B + 1) / 2 * (g~y + 1)`` and
    ``delta = (max(A, B) - 1) / (N - 1) * delta~``, so ``g~ = 0`` is the middle of the image and
    ``delta~ = 1`` stretches the grid over the whole image.

    Args:
        raw: ``(B, 5)``; n: side N of the filter grid; width, height: image size A x B.

    Returns:
        ``gx, gy, sigma2, delta, gamma``, each ``(B, 1)``; pixel coordinates run from 1.
    """
    if raw.dim() != 2 or raw.shape[1] != 5:
        raise ValueError(f"raw attention parameters must have shape (B, 5), got {tuple(raw.shape)}")
    centre = (raw[:, :2] + 1) * raw.new_tensor([(width + 1) / 2, (height + 1) / 2])  # gx, gy
    pos = torch.exp(raw[:, 2:])  # (B, 3) = (sigma^2, delta~, gamma)
    delta = pos[:, 1:2] * ((max(width, height) - 1) / max(n - 1, 1))
    return centre[:, :1], centre[:, 1:], pos[:, :1], delta, pos[:, 2:]


def filterbank(gx: Tensor, gy: Tensor, sigma2: Tensor, delta: Tensor, n: int, width: int,
               height: int, eps: float = 1e-8) -> tuple[Tensor, Tensor]:
    """The horizontal and vertical Gaussian filterbank matrices F_X and F_Y.

    Filter i of the grid is centred at ``mu_i = g + (i - N/2 - 0.5) * delta`` (i = 1..N), and
    ``F[i, a] = exp(-(a - mu_i)^2 / (2 sigma^2)) / Z_i`` over the pixel coordinates a = 1..A,
    each row normalized to sum to 1.

    Args:
        gx, gy, sigma2, delta: ``(B, 1)`` grid centre, variance and stride, in pixels.
        eps: keeps the row sums away from 0 when a grid lies far outside the image.

    Returns:
        ``F_X`` of shape ``(B, N, width)`` and ``F_Y`` of shape ``(B, N, height)``.
    """
    for name, t in (("gx", gx), ("gy", gy), ("sigma2", sigma2), ("delta", delta)):
        if t.dim() != 2 or t.shape[1] != 1:
            raise ValueError(f"{name} must have shape (B, 1), got {tuple(t.shape)}")
    grid = torch.arange(1, n + 1, dtype=gx.dtype, device=gx.device) - (n / 2 + 0.5)  # (N,)
    coords = torch.arange(1, max(width, height) + 1, dtype=gx.dtype, device=gx.device)  # (L,)
    mu = torch.cat([gx, gy], 1).unsqueeze(-1) + (delta * grid).unsqueeze(1)  # (B, 2, N) centres
    f = torch.exp((coords - mu.unsqueeze(-1)).pow(2) * (-0.5 / sigma2).view(-1, 1, 1, 1))
    f = f / (f.sum(-1, keepdim=True) + eps)  # (B, 2, N, max(A, B))
    if width == height:
        return f[:, 0], f[:, 1]  # (B, N, A), (B, N, B_img)
    fx, fy = f[:, 0, :, :width], f[:, 1, :, :height]  # a shorter axis is cut and renormalized
    return fx / (fx.sum(-1, keepdim=True) + eps), fy / (fy.sum(-1, keepdim=True) + eps)


def read_glimpse(images: Tensor, fx: Tensor, fy: Tensor, gamma: Tensor) -> Tensor:
    """Read an N x N glimpse: ``gamma * F_Y x F_X^T`` for each image of the batch.

    Shape:
        - images ``(B, height, width)`` or ``(B, C, height, width)`` (C channels read with the
          same filters); fx ``(B, N, width)``; fy ``(B, N, height)``; gamma ``(B, 1)``.
        - output ``(B, N, N)`` or ``(B, C, N, N)``.
    """
    if images.dim() not in (3, 4):
        raise ValueError(f"images must be (B, H, W) or (B, C, H, W), got {tuple(images.shape)}")
    if images.dim() == 3:
        return gamma.view(-1, 1, 1) * (fy @ images @ fx.transpose(-1, -2))  # (B, N, N)
    bsz, c, h, w = images.shape
    n = fx.shape[1]
    t = images.reshape(bsz, c * h, w) @ fx.transpose(1, 2)  # (B, C*H, N): filter the columns
    t = t.view(bsz, c, h, n).transpose(1, 2).reshape(bsz, h, c * n)  # (B, H, C*N)
    glimpse = (fy @ t).view(bsz, n, c, n).transpose(1, 2)  # (B, C, N, N): then the rows
    return gamma.view(-1, 1, 1, 1) * glimpse


def write_patch(patch: Tensor, fx: Tensor, fy: Tensor, gamma: Tensor) -> Tensor:
    """Spread an N x N patch over the canvas: ``F_Y^T w F_X / gamma``.

    Shape:
        - patch ``(B, N, N)``; fx ``(B, N, width)``; fy ``(B, N, height)``; gamma ``(B, 1)``.
        - output ``(B, height, width)``.
    """
    return (fy.transpose(-1, -2) @ patch @ fx) / gamma.view(-1, 1, 1)  # (B, H, W)


def gaussian_kl(mu: Tensor, log_sigma: Tensor) -> Tensor:
    """KL(N(mu, sigma^2) || N(0, 1)) = ``0.5 * sum(mu^2 + sigma^2 - log sigma^2 - 1)`` (nats),
    summed over the last dimension (the DRAW latent loss); ``(*, Z) -> (*)``."""
    if mu.shape != log_sigma.shape:
        raise ValueError(f"mu and log_sigma must have the same shape, got {tuple(mu.shape)} "
                         f"and {tuple(log_sigma.shape)}")
    return 0.5 * (mu.pow(2) + torch.exp(2 * log_sigma) - 2 * log_sigma - 1).sum(-1)


# ----------------------------------------------------------------------------------------------
# The model


def held_out_terms(bound: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], x: Tensor,
                   glimpses: int, z_size: int, batch_size: int = 500,
                   seed: int = 0) -> list[dict[str, float]]:
    """Held-out ``bound``, ``nll_x`` and ``kl`` in nats per image of ``x`` (N, H*W), one dict
    per copy: ``bound(images, noise)`` gives the two terms ``(..., B)`` of ``B`` images (one
    model: ``(B,)``; a stack of copies: ``(copies, B)``) with the posterior noise ``noise``
    ``(T, B, Z)``, drawn chunk by chunk (``batch_size`` images) from a generator seeded with
    ``seed``, so every copy sees the same noise as one model evaluated alone."""
    gen = torch.Generator(device=x.device).manual_seed(seed)
    nll = kl = torch.zeros((), dtype=torch.float64)
    for chunk in x.split(batch_size):
        noise = torch.stack([torch.randn(chunk.shape[0], z_size, generator=gen, device=x.device,
                                         dtype=x.dtype) for _ in range(glimpses)])  # (T, B, Z)
        nll_x, kl_ = bound(chunk, noise)
        nll = nll + nll_x.sum(-1).double().cpu()  # float32 sums of a chunk, added in float64
        kl = kl + kl_.sum(-1).double().cpu()
    n = x.shape[0]
    return [{"bound": (a + b) / n, "nll_x": a / n, "kl": b / n}
            for a, b in zip(nll.reshape(-1).tolist(), kl.reshape(-1).tolist(), strict=True)]


class DRAW(nn.Module):
    """DRAW with read and write attention (Gregor et al., 2015), LSTM cells of eqs. 29-31.

    At each of the T glimpses: ``x_hat = x - sigmoid(c_{t-1})``;
    ``r_t = read(x, x_hat, h_dec_{t-1})``; ``h_enc_t = LSTM_enc([r_t, h_dec_{t-1}])``;
    ``z_t ~ N(mu_t, sigma_t)`` from ``h_enc_t``; ``h_dec_t = LSTM_dec(z_t)``;
    ``c_t = c_{t-1} + write(h_dec_t)``.

    Args:
        width, height: image size in pixels; glimpses: number of steps T.
        enc_size, dec_size, z_size: LSTM units and latent units per step.
        read_n, write_n: side of the read and write filter grids.
        layer_norm: normalize the LSTM cell state inside ``tanh`` (eq. 31) in both LSTMs.

    Shape:
        - Input: ``(B, height * width)`` binary images; output of ``forward``: a scalar, the
          negative variational bound averaged over the batch (nats per image).

    Example::

        >>> model = DRAW(glimpses=4, enc_size=32, dec_size=32, z_size=8)
        >>> loss = model(torch.bernoulli(torch.full((16, 784), 0.3)))
    """

    def __init__(self, width: int = 28, height: int = 28, glimpses: int = 64,
                 enc_size: int = 256, dec_size: int = 256, z_size: int = 100, read_n: int = 2,
                 write_n: int = 5, layer_norm: bool = False) -> None:
        super().__init__()
        for name, v in (("width", width), ("height", height), ("glimpses", glimpses),
                        ("enc_size", enc_size), ("dec_size", dec_size), ("z_size", z_size),
                        ("read_n", read_n), ("write_n", write_n)):
            check_size(name, v)
        self.width, self.height, self.glimpses = width, height, glimpses
        self.z_size, self.read_n, self.write_n = z_size, read_n, write_n
        self.layer_norm = layer_norm
        self.encoder = DRAWLSTMCell(2 * read_n * read_n + dec_size, enc_size, layer_norm=layer_norm)
        self.decoder = DRAWLSTMCell(z_size, dec_size, layer_norm=layer_norm)
        self.read_attn = nn.Linear(dec_size, 5)
        self.write_attn = nn.Linear(dec_size, 5)
        self.write_w = nn.Linear(dec_size, write_n * write_n)
        self.to_q = nn.Linear(enc_size, 2 * z_size)  # mu and log sigma

    def _attend_raw(self, raw: Tensor, n: int) -> tuple[Tensor, ...]:
        """``fx, fy, gamma`` of an N x N grid from the head's 5 outputs ``raw`` (B, 5)."""
        gx, gy, sigma2, delta, gamma = attention_params(raw, n, self.width, self.height)
        return (*filterbank(gx, gy, sigma2, delta, n, self.width, self.height), gamma)

    def _write_raw(self, raw: Tensor, w: Tensor) -> Tensor:
        """The canvas increment (B, H, W) from the write head's ``raw`` (B, 5) and patch ``w``."""
        fx, fy, gamma = self._attend_raw(raw, self.write_n)
        w = w.reshape(-1, self.write_n, self.write_n)  # (B, Nw, Nw)
        return write_patch(w, fx, fy, gamma)  # (B, H, W)

    def _heads(self, h_dec: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The read head, the write head and the write patch of ``h_dec``."""
        write_raw, w = self.write_attn(h_dec), self.write_w(h_dec)  # order fixes the gradients
        return self.read_attn(h_dec), write_raw, w

    def bound_terms(self, x: Tensor, canvases: list[Tensor] | None = None,
                    noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The two parts of the negative variational bound for each image, in nats.

        Args:
            x: ``(B, height * width)`` binary images.
            canvases: a list to append the canvas logits ``c_t`` (B, H, W) of every step to.
            noise: ``(T, B, z_size)`` standard normal draws, glimpse ``t``'s posterior sample
                being ``z_t = mu_t + sigma_t * noise[t]``; default: drawn from torch's global
                generator (give it under ``vmap``, which draws none).

        Returns:
            ``(nll_x, kl)``, each ``(B,)``: ``-log D(x | sigmoid(c_T))`` and ``sum_t KL_t``.
        """
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError("images must be a floating-point torch.Tensor of 0s and 1s")
        if x.dim() != 2 or x.shape[1] != self.width * self.height:
            raise ValueError(f"images must have shape (B, {self.width * self.height}) (flattened "
                             f"{self.height}x{self.width}), got {tuple(x.shape)}")
        if noise is not None and tuple(noise.shape) != (self.glimpses, x.shape[0], self.z_size):
            raise ValueError(f"noise must have shape ({self.glimpses}, {x.shape[0]}, "
                             f"{self.z_size}) (glimpses, B, z_size), got {tuple(noise.shape)}")
        img = x.view(-1, self.height, self.width)  # (B, H, W)
        canvas = torch.zeros_like(img)  # logits c_0
        h_dec = x.new_zeros(x.shape[0], self.decoder.hidden_size)  # (B, Hd)
        read_raw = self.read_attn(h_dec)  # the read head of h_dec = 0
        enc = dec = None
        kl = x.new_zeros(x.shape[0])  # (B,)
        for step in range(self.glimpses):
            x_hat = img - torch.sigmoid(canvas)  # (B, H, W) error image
            fx, fy, gamma = self._attend_raw(read_raw, self.read_n)
            r = read_glimpse(torch.stack([img, x_hat], 1), fx, fy, gamma).flatten(1)
            enc = self.encoder(torch.cat([r, h_dec], -1), enc)  # r: (B, 2 Nr^2)
            mu, log_sigma = self.to_q(enc[0]).chunk(2, -1)  # (B, Z) each
            eps = torch.randn_like(mu) if noise is None else noise[step]
            z = mu + torch.exp(log_sigma) * eps
            kl = kl + gaussian_kl(mu, log_sigma)
            dec = self.decoder(z, dec)
            h_dec = dec[0]  # (B, Hd)
            read_raw, write_raw, w = self._heads(h_dec)
            canvas = canvas + self._write_raw(write_raw, w)
            if canvases is not None:
                canvases.append(canvas)
        nll_x = F.binary_cross_entropy_with_logits(canvas, img, reduction="none").sum((-2, -1))
        return nll_x, kl

    def forward(self, x: Tensor) -> Tensor:
        """Negative variational bound ``L^x + L^z`` averaged over the batch (nats per image)."""
        nll_x, kl = self.bound_terms(x)
        return (nll_x + kl).mean()

    @torch.no_grad()
    def generate(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Draw ``n`` images from the prior: ``sigmoid(c_t)`` after each step, (T, n, H, W)."""
        dev = self.write_w.weight.device
        canvas = torch.zeros(n, self.height, self.width, device=dev)
        dec_state, frames = None, []
        for _ in range(self.glimpses):
            z = torch.randn(n, self.z_size, generator=generator, device=dev)  # (n, Z)
            dec_state = self.decoder(z, dec_state)
            h_dec = dec_state[0]
            canvas = canvas + self._write_raw(self.write_attn(h_dec), self.write_w(h_dec))
            frames.append(torch.sigmoid(canvas))
        return torch.stack(frames)  # (T, n, H, W)

    @torch.no_grad()
    def reconstruct(self, x: Tensor, seed: int = 0) -> Tensor:
        """The canvases ``sigmoid(c_t)`` (T, B, H, W) while the model redraws ``x`` (B, H*W);
        ``seed`` seeds the posterior samples (the global RNG is restored afterwards)."""
        canvases: list[Tensor] = []
        with torch.random.fork_rng():  # the global RNG is restored afterwards
            torch.manual_seed(seed)
            self.bound_terms(x, canvases)
        return torch.sigmoid(torch.stack(canvases))

    @torch.no_grad()
    def evaluate_terms(self, x: Tensor, batch_size: int = 500, seed: int = 0) -> dict[str, float]:
        """Held-out ``bound`` = ``nll_x`` + ``kl``, nats per image (one posterior sample each),
        the noise drawn from a generator seeded with ``seed`` (:func:`held_out_terms`; torch's
        global generator is not touched: training is unchanged)."""
        return held_out_terms(lambda xs, noise: self.bound_terms(xs, noise=noise), x,
                              self.glimpses, self.z_size, batch_size, seed)[0]

    @torch.no_grad()
    def evaluate(self, x: Tensor, batch_size: int = 500, seed: int = 0) -> float:
        """Held-out negative bound in nats per image; see :meth:`evaluate_terms`."""
        return self.evaluate_terms(x, batch_size, seed)["bound"]


# ----------------------------------------------------------------------------------------------
# Reading the results


def mean_image_nll(x_train: Tensor, x_test: Tensor, eps: float = 1e-3) -> float:
    """Nats per test image when every pixel is an independent Bernoulli with its training mean
    (the trivial level), the means clipped to ``[eps, 1 - eps]``."""
    if x_train.dim() != 2 or x_test.dim() != 2 or x_train.shape[1] != x_test.shape[1]:
        raise ValueError(f"x_train and x_test must be (N, D) and (M, D), got "
                         f"{tuple(x_train.shape)} and {tuple(x_test.shape)}")
    p = x_train.double().mean(0).clamp(eps, 1 - eps)  # (D,)
    x = x_test.double()
    return float(-(x * p.log() + (1 - x) * (1 - p).log()).sum(1).mean())


# ----------------------------------------------------------------------------------------------
# The experiment


def load_data(config: Config) -> tuple[Tensor, Tensor, str]:
    """``(x_train (N, S*S), x_test (M, S*S), source)``: block means down to S = ``image_size``,
    binarized once (seeds ``binarize_seed`` and ``+ 1``); M is ``config.eval_images`` if set."""
    train = load_mnist(split="train", source=config.data_source)
    warn_if_subset(train, config.scale, "draw")
    test = load_mnist(split="test", source=config.data_source)
    xs = []
    for images, seed in ((train.images, config.binarize_seed),
                         (test.images, config.binarize_seed + 1)):
        grey = F.avg_pool2d(images.view(-1, 1, 28, 28), 28 // config.image_size)  # (N,1,S,S)
        xs.append(binarize(grey.flatten(1), config.binarize_threshold, seed=seed))  # (N, S*S)
    x_train, x_test = xs
    if config.eval_images is not None:
        x_test = x_test[: config.eval_images]
    return x_train, x_test, train.source


def build_model(config: Config, layer_norm: bool) -> DRAW:
    """The DRAW model of ``config``, with or without layer norm on the cell state (eq. 31)."""
    s = config.image_size
    return DRAW(s, s, config.glimpses, config.enc_size, config.dec_size, config.z_size,
                config.read_n, config.write_n, layer_norm=layer_norm)


def model_path(out: str | os.PathLike, variant: str, seed: int) -> Path:
    """Where :func:`run` (given ``out``) keeps the trained weights of one run."""
    return Path(out) / "models" / f"{NAME}-{variant}-seed{seed}.pt"


def load_trained(config: Config, out: str | os.PathLike, variant: str, seed: int,
                 device: str = "cpu") -> DRAW:
    """Rebuild a model that :func:`run` trained (with ``out`` given) from its saved weights."""
    path = model_path(out, check_choice("variant", variant, VARIANTS), seed)
    if not path.exists():
        raise FileNotFoundError(f"no trained model {path}; run(config, out=...) writes it")
    dev = resolve_device(device)
    model = build_model(config, layer_norm=(variant == "layer_norm"))
    model.load_state_dict(torch.load(path, map_location=dev, weights_only=True))
    return model.to(dev).eval()


def plot_canvas(models: dict[str, DRAW], images: Tensor, prior_seed: int = 0) -> plt.Figure:
    """The canvas after each glimpse (at most 8, spread evenly), one row per digit of
    ``images`` (B, H*W) and one prior sample, for each model of ``models`` (label -> DRAW)."""
    first = next(iter(models.values()))
    h, w = first.height, first.width
    if images.dim() != 2 or images.shape[1] != h * w:
        raise ValueError(f"images must have shape (B, {h * w}), got {tuple(images.shape)}")
    frames = []
    for model in models.values():
        dev = next(model.parameters()).device
        recon = model.reconstruct(images.to(dev))  # (T, B, H, W)
        gen = torch.Generator(device=dev).manual_seed(prior_seed)
        prior = model.generate(1, generator=gen)  # (T, 1, H, W)
        frames.append(torch.cat([recon, prior], 1).cpu().numpy())  # (T, B + 1, H, W)
    steps = frames[0].shape[0]
    cols = np.unique(np.linspace(0, steps - 1, min(steps, 8)).round().astype(int))
    rows = [(label, f[:, b], b) for label, f in zip(models, frames, strict=True)
            for b in range(f.shape[1])]  # one row per digit and prior sample of each model
    fig, axes = plt.subplots(len(rows), len(cols) + 1, squeeze=False,
                             figsize=(1.3 * (len(cols) + 1), 1.3 * len(rows)))
    for r, (label, canvas, b) in enumerate(rows):
        for j, t in enumerate(cols):
            axes[r, j].imshow(canvas[t], cmap="gray_r", vmin=0, vmax=1)
        is_digit = b < images.shape[0]
        target = images[b].view(h, w).cpu().numpy() if is_digit else np.zeros((h, w))
        axes[r, -1].imshow(target, cmap="gray_r", vmin=0, vmax=1)
        axes[r, 0].set_ylabel(f"{label} {'digit' if is_digit else 'prior'}", fontsize=8)
    for j, t in enumerate(cols):
        axes[0, j].set_title(f"glimpse {t + 1}", fontsize=8)
    axes[0, -1].set_title("input", fontsize=8)
    for ax in axes.flat:
        ax.set(xticks=[], yticks=[])
    fig.suptitle(f"Canvas after each glimpse ({h}x{w} px): {', '.join(models)}", fontsize=10)
    fig.tight_layout()
    return fig


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train DRAW with and without layer norm for each seed; held-out bound against updates.

    The seeds of each variant train as one engine :class:`~lnbook.engine.Stack`
    (``config.stacked``: one job of the sweep per variant) or one at a time (the same numbers),
    and are evaluated (:meth:`DRAW.evaluate_terms`) every ``eval_every`` updates. ``out``:
    folder for ``draw.json``, the runs, the weights (:func:`model_path`) and checkpoints.
    ``info``: ``data_source``, ``n_train``,
    ``n_test``, ``n_pixels``, ``mean_image_nll``.
    """
    check_config(config, Config)
    x_train, x_test, source = load_data(config)
    info = {"data_source": source, "n_train": int(x_train.shape[0]),
            "n_test": int(x_test.shape[0]), "n_pixels": int(x_train.shape[1]),
            "mean_image_nll": mean_image_nll(x_train, x_test)}
    train = partial(_train_stack if config.stacked else _train_one, config=config,
                    x_train=x_train, x_test=x_test, out=out)
    return sweep(NAME, {v: v for v in config.variants}, config.seeds, train, config=config,
                 stack="seeds" if config.stacked else None, device=device, out=out,
                 checkpoint=config.checkpoint, steps=config.steps, info=info,
                 threads=config.threads, workers=config.workers)


def c15_inputs(results: Results) -> dict[str, dict[str, np.ndarray]]:
    """C15's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, from a run
    of :func:`run` with both :data:`VARIANTS`, per seed, ``(seeds,)`` each.

    "converges faster" and "almost twice as fast": the baseline's updates to the target
    (:data:`TARGET_BELOW` nats below the mean-image level, ``info["mean_image_nll"]``; read
    between evaluations by :meth:`~lnbook.engine.results.Results.updates_to`, inf when never)
    over LN's; "ends better": the baseline's final held-out bound minus LN's, in nats. The mask,
    the same for every part: both runs of the seed end at least :data:`TARGET_BELOW` nats below
    the mean-image level.
    """
    level = results.info["mean_image_nll"]
    ups = {v: results.updates_to(v, "bound", level - TARGET_BELOW) for v in VARIANTS}
    final = {v: results.final(v, "bound") for v in VARIANTS}
    with np.errstate(invalid="ignore", divide="ignore"):  # inf / inf: neither reached it
        ratio = ups["baseline"] / ups["layer_norm"]  # > 1: LN got there first
    left = np.all([level - final[v] >= TARGET_BELOW for v in VARIANTS], axis=0)
    parts = ("converges faster", "almost twice as fast", "ends better")
    return {"values": dict(zip(parts, (ratio, ratio, final["baseline"] - final["layer_norm"]),
                               strict=True)),
            "trivial_ok": dict.fromkeys(parts, left)}


def _save_model(out: str | os.PathLike | None, variant: str, seed: int,
                weights: dict[str, Tensor]) -> None:
    if out is not None:
        path = model_path(out, variant, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(weights, path)


def _train_one(job: Job, config: Config, x_train: Tensor, x_test: Tensor,
               out: str | os.PathLike | None) -> History:
    """Train one (variant, seed) of :func:`run` (module level, so a worker process can)."""
    torch.manual_seed(job.seed)
    model = build_model(config, layer_norm=(job.variant == "layer_norm"))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    history = fit(model, Batches(x_train, batch_size=config.batch_size, seed=job.seed),
                  optimizer, steps=config.steps, eval_every=config.eval_every,
                  eval_fn=partial(DRAW.evaluate_terms, x=x_test.to(job.device)), device=job.device,
                  seed=job.seed, checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    _save_model(out, job.variant, job.seed, model.state_dict())
    return history


def _bound(model: DRAW, x: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """One copy's :meth:`DRAW.bound_terms` under the engine's ``vmap`` (the noise an input)."""
    return model.bound_terms(x, noise=noise)


def _train_stack(job: Job, config: Config, x_train: Tensor, x_test: Tensor,
                 out: str | os.PathLike | None) -> list[History]:
    """Every seed of the job's variant as one copy of an engine :class:`~lnbook.engine.Stack`;
    each copy draws its batches and posterior noise as its run alone draws them."""
    seeds, dev = job.seeds, job.device
    batches = [Batches(x_train.to(dev), batch_size=config.batch_size, seed=s) for s in seeds]
    gens = [torch.Generator(device=dev).manual_seed(s) for s in seeds]
    shape = (config.batch_size, config.z_size)

    def losses(step: int) -> Tensor:
        x = torch.stack([b(step)[0] for b in batches])  # (S, B, D)
        noise = torch.stack([torch.stack([torch.randn(shape, generator=g, device=dev)
                                          for _ in range(config.glimpses)])
                             for g in gens])  # (S, T, B, Z)
        nll_x, kl = stack.call(_bound, x, noise)  # (S, B) each
        return (nll_x + kl).mean(1)  # (S,)

    @torch.no_grad()
    def evaluate() -> list[dict[str, float]]:
        return held_out_terms(partial(stack.call, _bound, shared=(0, 1)), x_test.to(dev),
                              config.glimpses, config.z_size)

    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(build_model(config, layer_norm=(job.variant == "layer_norm")))
    stack = Stack(models).to(dev)
    # Adam is elementwise: each copy keeps its own moments (fused: one pass over all)
    adam = torch.optim.Adam(stack.parameters(), lr=config.lr, fused=dev.type in ("cpu", "cuda"))
    histories = train_copies(losses, evaluate, adam, [History() for _ in seeds], config.steps,
                             config.eval_every, state=stack, generators=gens,
                             checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    for s, model in zip(seeds, stack.unstack(), strict=True):
        _save_model(out, job.variant, s, model.state_dict())
    return histories
