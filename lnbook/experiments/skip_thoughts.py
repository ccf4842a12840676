"""Skip-thought vectors with and without layer normalization (paper section 6.3).

Book chapter `06_3_skip_thoughts`. A GRU encoder reads a sentence; two GRU decoders, conditioned
on the encoder's last state, predict the previous and the next sentence word by word (Kiros et
al., 2015). Every GRU is the LN-GRU of paper eqs. 26-28 or the plain GRU of eqs. 23-25. The
frozen sentence vectors are then scored by linear probes.

The paper trains on the BookCorpus (74M sentences) and probes on SICK, MR, CR, SUBJ and MPQA.
Offline we use real English prose that ships with Python: the text of the language reference
topics in :mod:`pydoc_data.topics` (the help pages of ``help("if")`` etc.). It is split into
sentences, in order, inside each topic, so every sentence has neighbours; the last fifth of every
topic is held out. The probes use held-out sentences only: which topic a sentence comes from (a
classification task like MR or SUBJ) and whether two sentences are neighbours (a sentence-pair
task like SICK, with the features ``|u - v|`` and ``u * v`` of Kiros et al.), each scored by a
cross-validated linear (ridge) classifier.
"""

from __future__ import annotations

import collections
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook.device import resolve_device
from lnbook.experiments.protocol import make_config

NAME = "skip_thoughts"
DESCRIPTION = (
    "6.3 skip-thoughts: GRU encoder and two GRU decoders with/without LN on Python's "
    "reference prose (pydoc_data); linear probes on frozen vectors (Figure 3, Table 3), "
    "time per update"
)

__all__ = [
    "NAME",
    "DESCRIPTION",
    "Config",
    "get_config",
    "run",
    "Corpus",
    "split_sentences",
    "tokenize",
    "load_corpus",
    "build_vocab",
    "encode",
    "SkipThoughtData",
    "make_data",
    "SkipThoughts",
    "stratified_folds",
    "probe_accuracy",
    "evaluate",
    "time_per_update",
    "final_table",
]

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
_HEADING = re.compile(r"^[*=\-~^]+$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"*(])")
_WORD = re.compile(r"[a-z_][a-z0-9_]*|\d+")


# ----------------------------------------------------------------------------- corpus


def split_sentences(text: str) -> list[str]:
    """Prose sentences of one help topic, in order.

    Paragraphs are separated by blank lines. Headings (a line underlined with ``*``, ``=`` or
    ``-``) and indented blocks (code, grammar rules, examples) are dropped; a bullet's ``*`` is
    removed. The remaining paragraphs are joined into one line each and cut after ``.``, ``!``
    or ``?`` when the next word starts with a capital, a quote, ``*`` or ``(``.
    """
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
    """Tokenized sentences of the help topics, in reading order.

    ``sentences[k]`` belongs to topic ``topics[topic[k]]``; consecutive entries with the same
    topic are neighbours in the text.
    """

    sentences: list[list[str]]
    topic: list[int]
    topics: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.sentences)


def load_corpus(min_tokens: int = 3, max_tokens: int = 20) -> Corpus:
    """All prose sentences of :mod:`pydoc_data.topics` with ``min_tokens`` or more words.

    Sentences longer than ``max_tokens`` words are cut to their first ``max_tokens``. Topics are
    taken in sorted order. The text depends on the Python version (recorded in ``source``).
    """
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(f"need 1 <= min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
    from pydoc_data.topics import topics as help_topics

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
    out = torch.zeros(len(sentences), length, dtype=torch.long)
    for n, s in enumerate(sentences):
        ids = [index.get(w, 1) for w in s[:length]]
        out[n, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


@dataclass
class SkipThoughtData:
    """Training triples, held-out triples and the probe sets.

    Triples hold sentence ids into ``tokens``: ``(previous, current, next)``. Every sentence of a
    training triple lies in the first ``1 - heldout`` of its topic, every sentence of a held-out
    triple and of a probe in the last part, so the encoder never trains on a probed sentence.
    """

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


def make_data(
    corpus: Corpus,
    vocab_size: int = 1000,
    heldout: float = 0.2,
    probe_topics: int = 8,
    seed: int = 0,
) -> SkipThoughtData:
    """Triples, vocabulary (training part only) and probe sets from a :class:`Corpus`.

    Args:
        corpus: from :func:`load_corpus`.
        vocab_size: words kept besides the four special tokens.
        heldout: fraction of every topic (its end) held out from training.
        probe_topics: the topic probe classifies among this many topics, those with the most
            held-out sentences.
        seed: seed of the negative pairs of the neighbour probe.
    """
    if not 0.0 < heldout < 1.0:
        raise ValueError(f"heldout must lie in (0, 1), got {heldout}")
    n = len(corpus)
    topic = torch.tensor(corpus.topic)
    held = torch.zeros(n, dtype=torch.bool)
    for k in range(len(corpus.topics)):
        idx = torch.nonzero(topic == k).flatten()
        n_held = int(round(heldout * len(idx)))
        if n_held:
            held[idx[len(idx) - n_held :]] = True
    train_sents = [s for s, h in zip(corpus.sentences, held.tolist(), strict=True) if not h]
    vocab = build_vocab(train_sents, vocab_size)
    length = max(len(s) for s in corpus.sentences)
    tokens = encode(corpus.sentences, vocab, length)

    mid = torch.arange(1, n - 1)
    same = (topic[mid - 1] == topic[mid]) & (topic[mid + 1] == topic[mid])
    all_train = ~held[mid - 1] & ~held[mid] & ~held[mid + 1]
    all_held = held[mid - 1] & held[mid] & held[mid + 1]
    triples = torch.stack([mid - 1, mid, mid + 1], dim=1)  # (n - 2, 3)

    # topic probe: held-out sentences of the topics with the most of them
    held_counts = torch.bincount(topic[held], minlength=len(corpus.topics))
    order = torch.argsort(held_counts, descending=True, stable=True)
    chosen = sorted(order[:probe_topics].tolist())
    topic_ids = torch.nonzero(held & torch.isin(topic, torch.tensor(chosen))).flatten()
    remap = {t: c for c, t in enumerate(chosen)}
    topic_labels = torch.tensor([remap[int(t)] for t in topic[topic_ids]])

    # neighbour probe: each held-out sentence with its successor (1) and with a random
    # held-out sentence of the same topic that is not adjacent (0)
    g = torch.Generator().manual_seed(seed)
    pos, neg = [], []
    for k in range(len(corpus.topics)):
        idx = torch.nonzero(held & (topic == k)).flatten()
        if len(idx) < 4:
            continue
        for a in range(len(idx) - 1):
            pos.append((int(idx[a]), int(idx[a + 1])))
            while True:
                b = int(torch.randint(len(idx), (1,), generator=g))
                if abs(b - a) > 1:
                    break
            neg.append((int(idx[a]), int(idx[b])))
    pairs = torch.tensor(pos + neg, dtype=torch.long).view(-1, 2)
    pair_labels = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))]).long()
    return SkipThoughtData(
        vocab=vocab,
        tokens=tokens,
        topic=topic,
        heldout=held,
        train_triples=triples[same & all_train],
        test_triples=triples[same & all_held],
        topic_ids=topic_ids,
        topic_labels=topic_labels,
        topic_names=[corpus.topics[t] for t in chosen],
        pairs=pairs,
        pair_labels=pair_labels,
    )


# ----------------------------------------------------------------------------- model


def _lengths(tokens: Tensor) -> Tensor:
    return (tokens != 0).sum(dim=1).clamp(min=1)  # (B,)


class SkipThoughts(nn.Module):
    """Skip-thought model: a GRU encoder and two conditioned GRU decoders (Kiros et al., 2015).

    The sentence vector s is the encoder's last state. Each decoder reads ``<bos>`` and the
    target sentence shifted by one word, with s appended to every input word vector (Kiros et
    al. add C s to the decoder's gate pre-activations, which a slice of W_x [x; s] is), and
    predicts the next word through an output layer shared by the two decoders. All three GRUs
    follow eqs. 26-28 with ``layer_norm`` and eqs. 23-25 without.

    Args:
        vocab_size: word ids (0 = pad, 2 = ``<bos>``, 3 = ``<eos>``).
        word_dim: size of the (shared) word embeddings.
        hidden_size: state size of the three GRUs = size of a sentence vector.
        layer_norm: LN-GRUs.

    Shape:
        ``forward(prev (B, L), cur (B, L), next (B, L)) -> scalar``: the mean cross entropy per
        predicted word (nats) over both decoders.

    Example::

        >>> m = SkipThoughts(100, 16, 32, layer_norm=True)
        >>> t = torch.randint(4, 100, (3, 3, 7))
        >>> loss = m(t[:, 0], t[:, 1], t[:, 2])
    """

    def __init__(
        self, vocab_size: int, word_dim: int, hidden_size: int, layer_norm: bool = False
    ) -> None:
        super().__init__()
        from lnbook.rnn import GRU

        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.encoder = GRU(word_dim, hidden_size, layer_norm=layer_norm, batch_first=True)
        self.dec_prev = GRU(word_dim + hidden_size, hidden_size, layer_norm=layer_norm,
                            batch_first=True)
        self.dec_next = GRU(word_dim + hidden_size, hidden_size, layer_norm=layer_norm,
                            batch_first=True)
        self.out = nn.Linear(hidden_size, vocab_size)

    def encode(self, tokens: Tensor) -> Tensor:
        """Sentence vectors ``(B, H)`` of right-padded word ids ``(B, L)``."""
        lengths = _lengths(tokens)
        tokens = tokens[:, : int(lengths.max())]
        _, h_n = self.encoder(self.embed(tokens), lengths=lengths)  # (1, B, H)
        return h_n[-1]

    def _decode_loss(self, decoder: nn.Module, s: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """Summed cross entropy of ``target`` (B, L) given s (B, H), and the word count."""
        n_words = _lengths(target)  # (B,) words; +1 for <eos>
        L = int(n_words.max()) + 1
        tgt = torch.cat([target, torch.zeros_like(target[:, :1])], dim=1)[:, :L]  # (B, L)
        tgt = tgt.scatter(1, n_words.view(-1, 1), 3)  # <eos> right after the last word
        inp = torch.cat([torch.full_like(tgt[:, :1], 2), tgt[:, :-1]], dim=1)  # <bos> + shift
        x = self.embed(inp)  # (B, L, E)
        x = torch.cat([x, s.unsqueeze(1).expand(-1, L, -1)], dim=2)  # (B, L, E + H)
        out, _ = decoder(x, lengths=n_words + 1)  # (B, L, H)
        logits = self.out(out)  # (B, L, V)
        ce = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=0, reduction="sum")
        return ce, (n_words + 1).sum()

    def forward(self, prev: Tensor, cur: Tensor, nxt: Tensor) -> Tensor:
        s = self.encode(cur)  # (B, H)
        ce_p, n_p = self._decode_loss(self.dec_prev, s, prev)
        ce_n, n_n = self._decode_loss(self.dec_next, s, nxt)
        return (ce_p + ce_n) / (n_p + n_n)


# ----------------------------------------------------------------------------- probes


def stratified_folds(labels: Tensor, folds: int, seed: int = 0) -> Tensor:
    """Fold id ``(N,)`` of every example: each class shuffled (seeded), then dealt round-robin.

    Every fold gets each class in proportion, as scikit-learn's ``StratifiedKFold`` does.
    """
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


def probe_accuracy(
    features: Tensor, labels: Tensor, folds: int = 5, ridge: float = 1.0, seed: int = 0
) -> float:
    r"""Cross-validated accuracy (percent) of a linear probe on frozen ``features``.

    The probe is a ridge-regression classifier (as scikit-learn's ``RidgeClassifier``):
    features standardized with the training folds' mean and deviation, one-hot targets in
    {-1, 1}, weights :math:`W = (X^\top X + \lambda I)^{-1} X^\top Y` with an unpenalized
    intercept, prediction by the largest output. Closed form in float64, so a probe costs
    milliseconds and can run at every checkpoint. Stratified ``folds``-fold cross-validation;
    the mean accuracy over folds.

    Args:
        features: ``(N, F)``.
        labels: ``(N,)`` class ids.
        folds: number of cross-validation folds (>= 2).
        ridge: lambda (>= 0).
        seed: seed of the fold assignment.
    """
    if features.dim() != 2 or labels.shape != (features.shape[0],):
        raise ValueError(
            f"features must be (N, F) and labels (N,), got {tuple(features.shape)} and "
            f"{tuple(labels.shape)}"
        )
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
        a = xs_tr.T @ xs_tr + ridge * torch.eye(x.shape[1], dtype=torch.float64)  # (F, F)
        w = torch.linalg.solve(a, xs_tr.T @ (targets[tr] - t_mean))  # (F, K)
        pred = (xs_te @ w + t_mean).argmax(1)  # (n,)
        correct.append((pred == y[te]).double().mean())
    return 100.0 * torch.stack(correct).mean().item()


@torch.no_grad()
def evaluate(model: SkipThoughts, data: SkipThoughtData, folds: int = 5) -> dict[str, float]:
    """Held-out loss (nats per word) and the two probe accuracies (percent).

    ``heldout_loss``: the skip-thought objective on the held-out triples; ``topic``: the topic
    probe on held-out sentences; ``neighbour``: the neighbour probe on pairs of held-out
    sentences, features ``[|u - v|, u * v]``.
    """
    device = next(model.parameters()).device
    tri = data.test_triples
    toks = data.tokens.to(device)
    loss = model(toks[tri[:, 0]], toks[tri[:, 1]], toks[tri[:, 2]]).item()
    need = torch.unique(torch.cat([data.topic_ids, data.pairs.flatten()]))
    vec = torch.zeros(data.tokens.shape[0], model.out.in_features)
    vec[need] = model.encode(toks[need]).cpu()  # (N, H), only the probed rows are filled
    u, v = vec[data.pairs[:, 0]], vec[data.pairs[:, 1]]
    return {
        "heldout_loss": loss,
        "topic": probe_accuracy(vec[data.topic_ids], data.topic_labels, folds),
        "neighbour": probe_accuracy(torch.cat([(u - v).abs(), u * v], 1), data.pair_labels, folds),
    }


def time_per_update(
    data: SkipThoughtData,
    word_dim: int,
    hidden_size: int,
    batch_size: int,
    updates: int = 10,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, float]:
    """Median seconds per training update of the baseline and the LN model, interleaved.

    Both models (same sizes, same batches) take turns, one update each, so a change in the
    machine's load touches both alike; one warm-up update each is not timed. On a CPU the clock
    is the process's CPU time (``time.process_time``), which other jobs on a shared machine
    disturb far less than the wall clock (with one torch thread it is the update's own time);
    on a GPU it is the wall clock, after waiting for the device (``torch.cuda.synchronize``).

    Returns:
        ``{"baseline": s, "layer_norm": s, "ratio": r}``: the median seconds per update of each
        model and the median over updates of the ratio of the LN update's time to the time of
        the baseline update just before it.
    """
    from lnbook.train import Batches

    dev = torch.device(device)
    tri = data.train_triples
    batches = Batches(data.tokens[tri[:, 0]], data.tokens[tri[:, 1]], data.tokens[tri[:, 2]],
                      batch_size=batch_size, seed=seed)
    models, opts, times = {}, {}, {"baseline": [], "layer_norm": []}
    for v in times:
        torch.manual_seed(seed)
        models[v] = SkipThoughts(len(data.vocab), word_dim, hidden_size, v == "layer_norm").to(dev)
        opts[v] = torch.optim.Adam(models[v].parameters(), lr=1e-3)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    clock = time.process_time if dev.type == "cpu" else time.perf_counter

    for step in range(updates + 1):
        batch = tuple(t.to(dev) for t in batches(step))
        for v in times:
            sync()
            t0 = clock()
            loss = models[v](*batch)
            opts[v].zero_grad(set_to_none=True)
            loss.backward()
            opts[v].step()
            sync()
            if step > 0:
                times[v].append(clock() - t0)
    out = {v: sorted(t)[len(t) // 2] for v, t in times.items()}
    pair = sorted(a / b for a, b in zip(times["layer_norm"], times["baseline"], strict=True))
    out["ratio"] = pair[len(pair) // 2]  # median over back-to-back pairs: robust to load drift
    return out


# ----------------------------------------------------------------------------- experiment


@dataclass
class Config:
    """Sizes and schedule of the skip-thought experiment (``quick`` or ``paper``)."""

    scale: str = "quick"
    vocab_size: int = 500
    max_tokens: int = 12
    heldout: float = 0.2
    probe_topics: int = 8
    probe_folds: int = 5
    word_dim: int = 32
    hidden_size: int = 48
    batch_size: int = 64
    lr: float = 3e-3
    steps: int = 48
    eval_every: int = 16
    timing_updates: int = 10  # updates per variant for the interleaved timing (C14)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    variants: list[str] = field(default_factory=lambda: ["baseline", "layer_norm"])
    num_threads: int | None = 1  # torch CPU threads during the run (None: leave as is)


_PRESETS: dict[str, dict] = {
    "quick": {},
    "paper": {
        # Kiros et al.: 20k words, 620-d word vectors, 2400-d GRUs, batch 128, Adam, sentences
        # up to 30 words; checkpoints evaluated every 50,000 updates of 1M in the paper.
        "vocab_size": 20_000,
        "max_tokens": 30,
        "word_dim": 620,
        "hidden_size": 2400,
        "batch_size": 128,
        "lr": 1e-3,
        "steps": 20_000,
        "eval_every": 1000,
        "probe_folds": 10,
        "timing_updates": 20,
        "seeds": [0],
        "num_threads": None,
    },
}


def get_config(scale: str = "quick", **overrides) -> Config:
    """The ``quick`` (CPU, seconds) or ``paper`` (GPU, the paper's sizes) preset, with overrides."""
    return make_config(Config, _PRESETS, scale, overrides)


def run(
    config: Config, device: str = "auto", out: str | Path | None = None, seeds=None
) -> dict:
    """Train the baseline and the LN skip-thought models for every seed; probe as they train.

    Every ``eval_every`` updates (and before the first) the held-out loss and both probe
    accuracies are recorded. Returns ``{"name", "config", "corpus", "timing", "runs": {variant:
    {seed: {"history", "final", "sec_per_update"}}}}``; ``sec_per_update`` is the median time
    of one update in that run (evaluation excluded), ``timing`` the interleaved measurement of
    :func:`time_per_update`. Written to ``out/skip_thoughts.json`` when ``out`` is given;
    at paper scale each run checkpoints to ``out/`` and resumes from there.
    """
    from lnbook.experiments.protocol import save_results
    from lnbook.train import Batches, fit

    dev = resolve_device(device)
    seeds = list(config.seeds if seeds is None else seeds)
    outdir = Path(out) if out is not None else None
    if outdir is not None:
        outdir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    try:
        t0 = time.perf_counter()
        corpus = load_corpus(max_tokens=config.max_tokens)
        data = make_data(corpus, config.vocab_size, config.heldout, config.probe_topics)
        tri = data.train_triples
        runs: dict[str, dict[str, dict]] = {}
        for variant in config.variants:
            if variant not in ("baseline", "layer_norm"):
                raise ValueError(f"variants must be 'baseline' or 'layer_norm', got {variant!r}")
            runs[variant] = {}
            for seed in seeds:
                torch.manual_seed(seed)
                model = SkipThoughts(len(data.vocab), config.word_dim, config.hidden_size,
                                     layer_norm=variant == "layer_norm")
                opt = torch.optim.Adam(model.parameters(), lr=config.lr)
                batches = Batches(data.tokens[tri[:, 0]], data.tokens[tri[:, 1]],
                                  data.tokens[tri[:, 2]], batch_size=config.batch_size, seed=seed)
                ckpt = None
                if outdir is not None and config.scale == "paper":
                    ckpt = str(outdir / f"{NAME}_{variant}_seed{seed}.pt")
                hist = fit(
                    model, batches, opt, config.steps, config.eval_every,
                    eval_fn=lambda m: evaluate(m, data, config.probe_folds),  # noqa: B023
                    device=dev, seed=seed, checkpoint=ckpt,
                ).to_dict()
                times = sorted(hist["step_times"] or [hist["wall_time"] / config.steps])
                runs[variant][str(seed)] = {
                    "history": hist,
                    "final": hist["metrics"][-1],
                    "sec_per_update": times[len(times) // 2],
                }
        timing = time_per_update(data, config.word_dim, config.hidden_size, config.batch_size,
                                 config.timing_updates, dev)
        results = {
            "name": NAME,
            "config": asdict(config),
            "device": str(dev),
            "timing": timing,
            "corpus": {
                "source": corpus.source,
                "topics": len(corpus.topics),
                "sentences": len(corpus),
                "words": sum(len(s) for s in corpus.sentences),
                "train_triples": int(tri.shape[0]),
                "test_triples": int(data.test_triples.shape[0]),
                "vocab": len(data.vocab),
                "probe_topics": data.topic_names,
                "topic_probe_sentences": int(data.topic_ids.numel()),
                "neighbour_probe_pairs": int(data.pairs.shape[0]),
            },
            "runs": runs,
            "wall_time": time.perf_counter() - t0,
        }
    finally:
        torch.set_num_threads(threads)
    if outdir is not None:
        save_results(results, outdir / f"{NAME}.json")
    return results


def final_table(results: dict) -> dict[str, dict[str, tuple[float, float]]]:
    """Mean and standard deviation over seeds of every final metric, per variant (Table 3)."""
    table = {}
    for variant, runs in results["runs"].items():
        finals = [r["final"] | {"sec_per_update": r["sec_per_update"]} for r in runs.values()]
        table[variant] = {}
        for k in finals[0]:
            x = torch.tensor([f[k] for f in finals], dtype=torch.float64)
            sd = x.std().item() if len(x) > 1 else math.nan
            table[variant][k] = (x.mean().item(), sd)
    return table
