"""Skip-thought vectors with and without layer normalization (paper section 6.3).

Book chapter `06_3_skip_thoughts`: a GRU encoder and two GRU decoders (Kiros et al., 2015) on
the prose of :mod:`pydoc_data.topics`, the frozen sentence vectors scored by linear probes.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import time
from dataclasses import dataclass
from functools import partial
from pydoc_data.topics import topics as help_topics
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook import GRU
from lnbook.checks import check_config, check_subset
from lnbook.engine import (
    Job,
    Results,
    cpu_threads,
    make_config,
    speedup,
    sweep,
)
from lnbook.engine.config import RunConfig
from lnbook.engine.train import Batches, History, fit, max_updates
from lnbook.experiments._text import median_step_time, pad_ids
from lnbook.table import Table

NAME = "skip_thoughts"
DESCRIPTION = ("6.3 skip-thoughts: GRU encoder and two GRU decoders with/without LN on Python's "
               "reference prose (pydoc_data); linear probes on frozen vectors (Figure 3, "
               "Table 3), time per update")

__all__ = ["NAME", "DESCRIPTION", "PAPER_TABLE3", "VARIANTS", "Config", "get_config", "load_data",
           "run", "train_one", "Corpus", "split_sentences", "tokenize", "load_corpus",
           "build_vocab", "encode",
           "SkipThoughtData", "make_data", "unigram_loss", "bag_of_words", "SkipThoughts",
           "stratified_folds", "probe_accuracy", "heldout_loss", "probe_scores", "time_per_update",
           "c14_quantities", "c14_inputs", "probe_table"]

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
_HEADING = re.compile(r"^[*=\-~^]+$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"*(])")
_WORD = re.compile(r"[a-z_][a-z0-9_]*|\d+")


def split_sentences(text: str) -> list[str]:
    """Prose sentences of one help topic, in order (headings and indented blocks dropped)."""
    sentences: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln for ln in para.split("\n") if ln.strip()]
        if not lines or lines[0][:1].isspace():
            continue
        if len(lines) >= 2 and _HEADING.match(lines[1].strip()):
            continue
        joined = " ".join(ln.strip() for ln in lines)
        if joined.startswith("* "):
            joined = joined[2:]
        sentences.extend(s.strip() for s in _SENTENCE_END.split(joined) if s.strip())
    return sentences


def tokenize(sentence: str) -> list[str]:
    """Lower-cased words and numbers (identifiers such as ``__init__`` stay one word)."""
    return _WORD.findall(sentence.lower())


@dataclass
class Corpus:
    """Tokenized sentences in reading order; ``sentences[k]`` is in ``topics[topic[k]]``."""

    sentences: list[list[str]]
    topic: list[int]
    topics: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.sentences)


def load_corpus(min_tokens: int = 3, max_tokens: int = 20) -> Corpus:
    """All prose sentences of :mod:`pydoc_data.topics` with ``min_tokens`` or more words, cut
    to ``max_tokens``; topics in sorted order."""
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(f"need 1 <= min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
    names = sorted(help_topics)
    sentences, topic = [], []
    for k, name in enumerate(names):
        for s in split_sentences(help_topics[name]):
            words = tokenize(s)
            if len(words) >= min_tokens:
                sentences.append(words[:max_tokens])
                topic.append(k)
    version = ".".join(str(v) for v in sys.version_info[:3])
    return Corpus(sentences, topic, names, f"pydoc_data.topics (Python {version})")


def build_vocab(sentences: list[list[str]], size: int) -> list[str]:
    """The ``size`` most frequent words (ties alphabetical) after ``<pad> <unk> <bos> <eos>``."""
    if size < 1:
        raise ValueError(f"vocabulary size must be >= 1, got {size}")
    counts = collections.Counter(w for s in sentences for w in s)
    words = sorted(counts, key=lambda w: (-counts[w], w))[:size]
    return [PAD, UNK, BOS, EOS, *words]


def encode(sentences: list[list[str]], vocab: list[str], length: int) -> Tensor:
    """Word ids ``(N, length)``, right-padded with 0 (``<pad>``); unknown words -> 1."""
    index = {w: i for i, w in enumerate(vocab)}
    return pad_ids([[index.get(w, 1) for w in s[:length]] for s in sentences], length)


@dataclass
class SkipThoughtData:
    """Triples ``(previous, current, next)`` of sentence ids into ``tokens`` (training ones
    from the first ``1 - heldout`` of each topic) and the probe sets (held-out part only)."""

    vocab: list[str]
    tokens: Tensor  # (N, L) word ids of every sentence, 0 = pad
    topic: Tensor  # (N,)
    heldout: Tensor  # (N,) bool
    train_triples: Tensor  # (Nt, 3)
    test_triples: Tensor  # (Ne, 3)
    topic_ids: Tensor  # (P,) sentences of the topic probe
    topic_labels: Tensor  # (P,) class 0..K-1
    topic_names: list[str]  # the K probed topics
    pairs: Tensor  # (Q, 2) sentence pairs of the neighbour probe
    pair_labels: Tensor  # (Q,) 1 = neighbours, 0 = not


def make_data(corpus: Corpus, vocab_size: int = 1000, heldout: float = 0.2,
              probe_topics: int = 8, seed: int = 0) -> SkipThoughtData:
    """Triples, vocabulary (training part only) and probe sets from a :class:`Corpus`.

    ``heldout``: the fraction at the end of every topic held out; the topic probe classifies
    the ``probe_topics`` topics with the most held-out sentences; ``seed``: the neighbour
    probe's negative pairs.
    """
    if not 0.0 < heldout < 1.0:
        raise ValueError(f"heldout must lie in (0, 1), got {heldout}")
    n = len(corpus)
    topic = torch.tensor(corpus.topic)
    held = torch.zeros(n, dtype=torch.bool)
    g = torch.Generator().manual_seed(seed)
    pos, neg = [], []
    for k in range(len(corpus.topics)):
        idx = torch.nonzero(topic == k).flatten()
        idx = idx[len(idx) - int(round(heldout * len(idx))) :]  # the end of topic k
        held[idx] = True
        # neighbour probe (topics with 4 or more held-out sentences): each held-out sentence
        # with its successor (1) and with a random non-adjacent one of its topic (0)
        for a in range(len(idx) - 1 if len(idx) >= 4 else 0):
            pos.append((int(idx[a]), int(idx[a + 1])))
            b = a
            while abs(b - a) <= 1:
                b = int(torch.randint(len(idx), (1,), generator=g))
            neg.append((int(idx[a]), int(idx[b])))
    train_sents = [s for s, h in zip(corpus.sentences, held.tolist(), strict=True) if not h]
    vocab = build_vocab(train_sents, vocab_size)
    tokens = encode(corpus.sentences, vocab, max(len(s) for s in corpus.sentences))

    mid = torch.arange(1, n - 1)
    triples = torch.stack([mid - 1, mid, mid + 1], dim=1)  # (n - 2, 3)
    same = (topic[triples] == topic[mid, None]).all(1)  # (n - 2,) one topic
    held_3 = held[triples]  # (n - 2, 3)

    # topic probe: held-out sentences of the topics with the most of them
    held_counts = torch.bincount(topic[held], minlength=len(corpus.topics))
    chosen = torch.argsort(held_counts, descending=True, stable=True)[:probe_topics].sort().values
    topic_ids = torch.nonzero(held & torch.isin(topic, chosen)).flatten()
    topic_labels = torch.searchsorted(chosen, topic[topic_ids])  # class 0..K-1

    pairs = torch.tensor(pos + neg, dtype=torch.long).view(-1, 2)
    pair_labels = torch.tensor([1] * len(pos) + [0] * len(neg))
    return SkipThoughtData(vocab, tokens, topic, held, triples[same & ~held_3.any(1)],
                           triples[same & held_3.all(1)], topic_ids, topic_labels,
                           [corpus.topics[t] for t in chosen.tolist()], pairs, pair_labels)


def unigram_loss(data: SkipThoughtData) -> float:
    """Held-out loss (nats per word) of the add-one smoothed unigram predictor of the
    previous and next sentences' words and ``<eos>`` (the trivial predictor)."""
    size = len(data.vocab)

    def counts(triples: Tensor) -> Tensor:
        ids = data.tokens[triples[:, [0, 2]].flatten()]  # (2N, L): previous and next
        c = torch.bincount(ids[ids != 0], minlength=size).double()  # (V,)
        c[3] += ids.shape[0]  # one <eos> per sentence
        return c

    train, held = counts(data.train_triples), counts(data.test_triples)
    allowed = torch.ones(size, dtype=torch.bool)
    allowed[[0, 2]] = False  # <pad>, <bos>
    p = (train + 1.0)[allowed]
    p = p / p.sum()
    return float(-(held[allowed] * p.log()).sum() / held.sum())


def bag_of_words(tokens: Tensor, vocab_size: int) -> Tensor:
    """Word counts of each sentence, padding not counted: ``(N, L)`` -> ``(N, vocab_size)``."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (N, L) word ids, got shape {tuple(tokens.shape)}")
    counts = torch.zeros(tokens.shape[0], vocab_size)
    counts.scatter_add_(1, tokens, torch.ones(tokens.shape, dtype=counts.dtype))  # (N, V)
    counts[:, 0] = 0.0
    return counts


def _batches(data: SkipThoughtData, batch_size: int, seed: int) -> Batches:
    # (3, Nt, L): previous, current, next
    return Batches(*data.tokens[data.train_triples.T], batch_size=batch_size, seed=seed)


def _lengths(tokens: Tensor) -> Tensor:
    return (tokens != 0).sum(dim=1).clamp(min=1)  # (B,)


class SkipThoughts(nn.Module):
    """Skip-thought model: a GRU encoder and two conditioned GRU decoders (Kiros et al., 2015).

    The sentence vector s is the encoder's last state; each decoder reads ``<bos>`` and the
    shifted target with s appended to every word vector, and predicts the next word through a
    shared output layer. GRUs of eqs. 26-28 with ``layer_norm``, eqs. 23-25 without.

    Shape:
        ``forward(prev (B, L), cur (B, L), next (B, L)) -> scalar``: mean cross entropy per
        predicted word (nats) over both decoders.
    """

    def __init__(self, vocab_size: int, word_dim: int, hidden_size: int,
                 layer_norm: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.encoder = GRU(word_dim, hidden_size, layer_norm=layer_norm, batch_first=True)
        self.dec_prev, self.dec_next = (GRU(word_dim + hidden_size, hidden_size,
                                            layer_norm=layer_norm, batch_first=True)
                                        for _ in range(2))
        self.out = nn.Linear(hidden_size, vocab_size)

    def encode(self, tokens: Tensor) -> Tensor:
        """Sentence vectors ``(B, H)`` of right-padded word ids ``(B, L)``."""
        lengths = _lengths(tokens)  # (B,)
        out, _ = self.encoder(self.embed(tokens[:, : int(lengths.max())]))  # (B, L, H)
        return out[torch.arange(out.shape[0], device=out.device), lengths - 1]  # (B, H)

    def _decode_loss(self, decoder: nn.Module, s: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """Summed cross entropy of ``target`` (B, L) given s (B, H), and the word count."""
        n_words = _lengths(target)  # (B,) words; +1 for <eos>
        L = int(n_words.max()) + 1
        tgt = torch.cat([target, torch.zeros_like(target[:, :1])], dim=1)[:, :L]  # (B, L)
        tgt = tgt.scatter(1, n_words.view(-1, 1), 3)  # <eos> right after the last word
        inp = torch.cat([torch.full_like(tgt[:, :1], 2), tgt[:, :-1]], dim=1)  # <bos> + shift
        x = self.embed(inp)  # (B, L, E)
        x = torch.cat([x, s.unsqueeze(1).expand(-1, L, -1)], dim=2)  # (B, L, E + H)
        out, _ = decoder(x)  # (B, L, H)
        logits = self.out(out)  # (B, L, V)
        ce = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=0, reduction="sum")
        return ce, (n_words + 1).sum()

    def forward(self, prev: Tensor, cur: Tensor, nxt: Tensor) -> Tensor:
        s = self.encode(cur)  # (B, H)
        ce_p, n_p = self._decode_loss(self.dec_prev, s, prev)
        ce_n, n_n = self._decode_loss(self.dec_next, s, nxt)
        return (ce_p + ce_n) / (n_p + n_n)


def stratified_folds(labels: Tensor, folds: int, seed: int = 0) -> Tensor:
    """Fold id ``(N,)`` of every example: each class shuffled (seeded), then dealt round-robin."""
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    g = torch.Generator().manual_seed(seed)
    fold = torch.empty(labels.shape[0], dtype=torch.long)
    offset = 0
    for c in torch.unique(labels):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        fold[idx] = (torch.arange(len(idx)) + offset) % folds
        offset += len(idx)
    return fold


def probe_accuracy(features: Tensor, labels: Tensor, folds: int = 5, ridge: float = 1.0,
                   seed: int = 0) -> float:
    r"""Cross-validated accuracy (percent) of a linear probe on frozen ``features``.

    A ridge classifier on standardized ``features (N, F)``, one-hot targets in {-1, 1},
    :math:`W = (X^\top X + \lambda I)^{-1} X^\top Y` (``ridge`` = lambda) with an unpenalized
    intercept, in float64; the mean accuracy over stratified ``folds``-fold cross-validation.
    """
    if features.dim() != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"features must be (N, F) and labels (N,), got "
                         f"{tuple(features.shape)} and {tuple(labels.shape)}")
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    x = features.detach().double().cpu()  # (N, F)
    classes, y = torch.unique(labels.cpu(), return_inverse=True)
    targets = 2.0 * F.one_hot(y, len(classes)).double() - 1.0  # (N, K)
    fold = stratified_folds(y, folds, seed)
    correct = []
    for k in range(folds):
        tr, te = fold != k, fold == k
        mu, sd = x[tr].mean(0), x[tr].std(0, unbiased=False)
        sd = torch.where(sd > 0, sd, torch.ones_like(sd))
        xs_tr, xs_te = (x[tr] - mu) / sd, (x[te] - mu) / sd  # (n, F)
        t_mean = targets[tr].mean(0)  # the intercept absorbs the means
        t_c = targets[tr] - t_mean
        if ridge > 0 and xs_tr.shape[0] < x.shape[1]:  # fewer examples than features: the
            # same W from the (n, n) system, W = X^T (X X^T + lambda I)^-1 Y
            a = xs_tr @ xs_tr.T + ridge * torch.eye(xs_tr.shape[0], dtype=torch.float64)
            w = xs_tr.T @ torch.linalg.solve(a, t_c)  # (F, K)
        else:
            a = xs_tr.T @ xs_tr + ridge * torch.eye(x.shape[1], dtype=torch.float64)  # (F, F)
            w = torch.linalg.solve(a, xs_tr.T @ t_c)  # (F, K)
        pred = (xs_te @ w + t_mean).argmax(1)  # (n,)
        correct.append((pred == y[te]).double().mean())
    return 100.0 * torch.stack(correct).mean().item()


def heldout_loss(model: SkipThoughts, data: SkipThoughtData) -> float:
    """The skip-thought objective (nats per predicted word) on the held-out triples."""
    device = next(model.parameters()).device
    with torch.no_grad():  # previous, current, next: (3, Ne, L)
        return model(*data.tokens[data.test_triples.T].to(device)).item()


@torch.no_grad()
def probe_scores(model: SkipThoughts, data: SkipThoughtData, folds: int = 5) -> dict[str, float]:
    """Accuracy (percent) of the ``topic`` and the ``neighbour`` probe (features
    ``[|u - v|, u * v]``) on the frozen sentence vectors."""
    device = next(model.parameters()).device
    need = torch.unique(torch.cat([data.topic_ids, data.pairs.flatten()]))
    vec = torch.zeros(data.tokens.shape[0], model.out.in_features)
    vec[need] = model.encode(data.tokens[need].to(device)).cpu()  # (N, H), the probed rows
    u, v = vec[data.pairs[:, 0]], vec[data.pairs[:, 1]]
    return {"topic": probe_accuracy(vec[data.topic_ids], data.topic_labels, folds),
            "neighbour": probe_accuracy(torch.cat([(u - v).abs(), u * v], 1), data.pair_labels,
                                        folds)}


class _Clocked:
    """Batches that note the process's CPU time at each request: :func:`~lnbook.engine.train.fit`
    asks for the next batch as soon as an update is done, so two requests time one update."""

    def __init__(self, batches: Batches) -> None:
        self.batches, self.marks = batches, []

    def __call__(self, step: int) -> tuple[Tensor, ...]:
        self.marks.append(time.process_time())
        return self.batches(step)


def time_per_update(data: SkipThoughtData, word_dim: int, hidden_size: int, batch_size: int,
                    updates: int = 10, device: str | torch.device = "cpu",
                    seed: int = 0) -> dict[str, float]:
    """Median seconds per update of the baseline and the LN model, each trained by the
    engine's :func:`~lnbook.engine.train.fit` on the same batches, ``updates`` timed updates after
    one untimed warm-up: CPU time on a CPU (a busy machine stretches it much less than the
    wall clock), on a GPU the wall clock of ``History.step_times`` (synchronized by the loss).

    Returns ``{"baseline": s, "layer_norm": s, "ratio": r}``, r the median over updates of
    the LN update's time over the baseline's update of the same step.
    """
    if updates < 1:
        raise ValueError(f"updates must be >= 1, got {updates}")
    dev = torch.device(device)
    times = {}
    for v, layer_norm in VARIANTS.items():
        torch.manual_seed(seed)
        model = SkipThoughts(len(data.vocab), word_dim, hidden_size, layer_norm)
        batches = _Clocked(_batches(data, batch_size, seed))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        hist = fit(model, batches, opt, updates + 2,
                   updates + 2, device=dev, seed=seed, progress=False, label=f"timing {v}")
        t = np.diff(batches.marks).tolist() if dev.type == "cpu" else hist.step_times
        times[v] = t[1 : updates + 1] or t  # the first update warms up (all under a cap)
    out = {v: sorted(t)[len(t) // 2] for v, t in times.items()}
    pair = sorted(a / b for a, b in zip(times["layer_norm"], times["baseline"], strict=True))
    out["ratio"] = pair[len(pair) // 2]  # median over pairs: robust to a busy machine
    return out


#: Table 3 of the paper: SICK (Pearson r, Spearman rho, MSE), then accuracy (percent) on MR,
#: CR, SUBJ and MPQA; the dagger row trained for a month (about 1.7M updates), the others 1M.
PAPER_TABLE3: dict[str, dict[str, float]] = {
    "Original (Kiros et al.)": {"SICK r": 0.848, "SICK rho": 0.778, "SICK MSE": 0.287,
                                "MR": 75.5, "CR": 79.3, "SUBJ": 92.1, "MPQA": 86.9},
    "Ours": {"SICK r": 0.842, "SICK rho": 0.767, "SICK MSE": 0.298,
             "MR": 77.3, "CR": 81.8, "SUBJ": 92.6, "MPQA": 87.9},
    "Ours + LN": {"SICK r": 0.854, "SICK rho": 0.785, "SICK MSE": 0.277,
                  "MR": 79.5, "CR": 82.6, "SUBJ": 93.4, "MPQA": 89.0},
    "Ours + LN (1 month)": {"SICK r": 0.858, "SICK rho": 0.788, "SICK MSE": 0.270,
                           "MR": 79.4, "CR": 83.1, "SUBJ": 93.7, "MPQA": 89.3},
}
VARIANTS: dict[str, bool] = {"baseline": False, "layer_norm": True}  # name -> layer_norm


@dataclass
class Config(RunConfig):
    """Sizes and schedule of the skip-thought experiment; :func:`get_config` gives presets.

    ``margin``: both runs of a seed must end this many nats per word below the word-frequency
    predictor for the seed to count (the trivial phase); ``target_below``: the target loss of
    "trains faster", this many nats per word below it. ``timing_hidden``: state sizes at which
    :func:`time_per_update` runs ``timing_updates`` updates per variant; ``checkpoint``:
    checkpoint every run under ``out`` and resume from it.
    """

    vocab_size: int = 300
    max_tokens: int = 6
    heldout: float = 0.2
    probe_topics: int = 8
    probe_folds: int = 5
    word_dim: int = 32
    hidden_size: int = 32
    batch_size: int = 32
    lr: float = 1e-2
    steps: int = 120
    eval_every: int = 5
    margin: float = 0.1
    target_below: float = 0.5
    timing_hidden: tuple[int, ...] = (32, 256)
    timing_updates: int = 5
    seeds: int | tuple[int, ...] = 5
    variants: tuple[str, ...] = ("baseline", "layer_norm")
    checkpoint: bool = False

    def __post_init__(self) -> None:
        check_subset("variants", self.variants, tuple(VARIANTS))


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        # Kiros et al.: 20k words, 620-d word vectors, 2400-d GRUs, batch 128, Adam, sentences
        # up to 30 words; the paper trains for 1M updates and evaluates every 50,000.
        "vocab_size": 20_000, "max_tokens": 30, "word_dim": 620, "hidden_size": 2400,
        "batch_size": 128, "lr": 1e-3, "steps": 1_000_000, "eval_every": 50_000,
        "probe_folds": 10, "timing_hidden": (2400,), "timing_updates": 20,
        "seeds": 1, "threads": None, "checkpoint": True,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` (CPU, seconds) or ``paper`` (GPU, the paper's sizes) preset, with overrides."""
    return make_config(Config, _PRESETS, scale, overrides)


#: A smoke run's corpus (:func:`~lnbook.engine.train.capped`): at most this many sentences, of at
#: most this many words (an update of the paper's 2400-unit GRUs costs tens of CPU seconds
#: per 30-word batch, and every evaluation encodes the held-out and probed sentences).
SMOKE_SENTENCES, SMOKE_TOKENS = 512, 8


def load_data(config: Config) -> tuple[Corpus, SkipThoughtData]:
    """The corpus and the triples and probe sets ``config`` asks for; in a smoke run, the
    first :data:`SMOKE_SENTENCES` sentences cut to :data:`SMOKE_TOKENS` words (said in one
    line)."""
    corpus = load_corpus(max_tokens=config.max_tokens)
    if max_updates() is not None and (len(corpus) > SMOKE_SENTENCES
                                      or config.max_tokens > SMOKE_TOKENS):
        n, words = min(len(corpus), SMOKE_SENTENCES), min(config.max_tokens, SMOKE_TOKENS)
        corpus = Corpus([w[:words] for w in corpus.sentences[:n]], corpus.topic[:n],
                        corpus.topics, corpus.source)
        print(f"{NAME}: smoke run on the first {n:,} sentences, at most {words} words each",
              flush=True)
    return corpus, make_data(corpus, config.vocab_size, config.heldout, config.probe_topics)


def train_one(config: Config, data: SkipThoughtData, job: Job
              ) -> tuple[History, dict[str, Any]]:
    """One (variant, seed): probe the untrained encoder, train, probe again."""
    torch.manual_seed(job.seed)
    model = SkipThoughts(len(data.vocab), config.word_dim, config.hidden_size, job.params)
    start = probe_scores(model, data, config.probe_folds)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    hist = fit(model, _batches(data, config.batch_size, job.seed), opt, config.steps,
               config.eval_every, eval_fn=lambda m: {"heldout_loss": heldout_loss(m, data)},
               device=job.device, seed=job.seed, checkpoint=job.checkpoint, bar=job.bar,
               label=job.label)
    model.eval()
    final = probe_scores(model, data, config.probe_folds)
    return hist, {"probe_start": start, "probe_final": final,
                  "sec_per_update": median_step_time(hist, config.steps)}


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None,
        data: tuple[Corpus, SkipThoughtData] | None = None) -> Results:
    """Train the baseline and the LN skip-thought models for every seed; probe before and after.

    Curves: ``heldout_loss``. Per seed: ``probe_start``, ``probe_final`` (:func:`probe_scores`)
    and ``sec_per_update``. ``Results.info``: ``corpus`` sizes, ``unigram``, ``majority_topic``
    and ``timing`` (:func:`time_per_update` per size of ``timing_hidden``, keys as strings).
    ``data``: what :func:`load_data` returns, if already loaded.
    """
    check_config(config, Config)
    corpus, data = load_data(config) if data is None else data
    with cpu_threads(config.threads):
        timing = {str(h): time_per_update(data, config.word_dim, h, config.batch_size,
                                          config.timing_updates)
                  for h in config.timing_hidden}
        corpus_info = {"source": corpus.source, "topics": len(corpus.topics),
                       "sentences": len(corpus), "words": sum(len(s) for s in corpus.sentences),
                       "train_triples": int(data.train_triples.shape[0]),
                       "test_triples": int(data.test_triples.shape[0]),
                       "vocab": len(data.vocab), "probe_topics": data.topic_names,
                       "topic_probe_sentences": int(data.topic_ids.numel()),
                       "neighbour_probe_pairs": int(data.pairs.shape[0])}
        info = {"corpus": corpus_info, "unigram": unigram_loss(data),
                "majority_topic": 100.0 * torch.bincount(data.topic_labels).max().item()
                / len(data.topic_labels), "timing": timing}
        return sweep(NAME, {v: VARIANTS[v] for v in config.variants}, config.seeds,
                     partial(train_one, config, data), config=config, device=device,
                     out=out, checkpoint=config.checkpoint, steps=config.steps, info=info,
                     threads=config.threads, workers=config.workers)


def c14_quantities(results: Results) -> dict[str, np.ndarray]:
    """The per-seed quantities of C14's rule, ``(seeds,)`` each, from a run of :func:`run`:
    each variant's final held-out loss (``final_<variant>``) and updates to the target loss
    (``reach_<variant>``, interpolated, inf when never), the baseline's updates over LN's
    (``speedup``, :func:`lnbook.engine.metrics.speedup`), whether both runs ended ``margin``
    below the word-frequency predictor (``left``), whether both runs' trained vectors beat their own
    untrained encoder on the topic probe (``probe_ok``), and LN's topic-probe accuracy minus
    the baseline's in points (``topic_diff``)."""
    unigram, cfg = results.info["unigram"], results.config
    out = {}
    for v in ("baseline", "layer_norm"):
        out[f"final_{v}"] = results.final(v, "heldout_loss")
        out[f"reach_{v}"] = results.updates_to(v, "heldout_loss", unigram - cfg["target_below"])
    out["speedup"] = speedup(out["reach_baseline"], out["reach_layer_norm"])
    out["left"] = ((out["final_baseline"] <= unigram - cfg["margin"])
                   & (out["final_layer_norm"] <= unigram - cfg["margin"]))
    topic = {(v, w): np.array([p["topic"] for p in results.info_of(v, w)])
             for v in ("baseline", "layer_norm") for w in ("probe_start", "probe_final")}
    out["probe_ok"] = np.all([topic[v, "probe_final"] > topic[v, "probe_start"]
                              for v in ("baseline", "layer_norm")], axis=0)
    out["topic_diff"] = topic["layer_norm", "probe_final"] - topic["baseline", "probe_final"]
    return out


def c14_inputs(results: Results) -> dict[str, dict[str, np.ndarray]]:
    """C14's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, from
    :func:`c14_quantities`: "trains faster" reads the speed-up of seeds whose runs both left
    the trivial phase, "better downstream" the topic probe of those whose trained vectors also
    beat their untrained encoders."""
    q = c14_quantities(results)
    return {"values": {"trains faster": q["speedup"], "better downstream": q["topic_diff"]},
            "trivial_ok": {"trains faster": q["left"],
                           "better downstream": q["left"] & q["probe_ok"]}}


def probe_table(results: Results, fmt: str = ".1f") -> Table:
    """Probe accuracies (percent) of the untrained and the trained encoders, one value per seed."""
    rows = [[v, *(" / ".join(format(p[probe], fmt) for p in results.info_of(v, when))
                  for when in ("probe_start", "probe_final") for probe in ("topic", "neighbour"))]
            for v in results.variants]
    seeds = ", ".join(str(s) for s in results.seeds)
    return Table(["variant", "topic (untrained)", "neighbour (untrained)", "topic (trained)",
                  "neighbour (trained)"], rows, caption=f"percent; one value per seed ({seeds})")


def paper_table3() -> Table:
    """The paper's Table 3 as a small table."""
    cols = list(next(iter(PAPER_TABLE3.values())))
    return Table(["model", *cols], [[k, *(f"{v[c]:g}" for c in cols)]
                                    for k, v in PAPER_TABLE3.items()],
                 caption="Ba et al. (2016), Table 3: SICK correlations and MSE, accuracies in %")
