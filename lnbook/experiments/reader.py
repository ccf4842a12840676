"""The attentive reader on a generated cloze corpus (paper section 6.2, Figure 2, claim C13).

Book chapter `06_2_attentive_reader`: :class:`AttentiveReader` (Hermann et al., 2015) with the
LSTMs of :data:`VARIANTS` (plain, recurrent BN, LN; several gains) on :func:`make_cloze`'s corpus.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lnbook import LSTM, LayerNorm
from lnbook.checks import check_choice, check_config, check_size
from lnbook.engine import Job, Results, Stack, make_config, sweep
from lnbook.engine.config import RunConfig
from lnbook.engine.copies import train_copies
from lnbook.engine.train import Batches, History, fit
from lnbook.recurrent_bn import RecurrentBNLSTM

__all__ = [
    "NAME",
    "DESCRIPTION",
    "VARIANTS",
    "RELATIONS",
    "Config",
    "get_config",
    "ClozeData",
    "make_cloze",
    "describe_example",
    "chance_level",
    "frequency_baseline_accuracy",
    "set_ln_gains",
    "make_lstm",
    "AttentiveReader",
    "evaluate",
    "final_error",
    "gain_spread",
    "LAST_EVALS",
    "TRIVIAL_MARGIN",
    "c13_quantities",
    "c13_inputs",
    "variant_gain",
    "variant_kind",
    "run",
]

NAME = "reader"
DESCRIPTION = (
    "Unidirectional attentive reader on a generated cloze corpus with anonymized, re-permuted "
    "entities: LSTM, recurrent BN and LN-LSTM, each with gains 1.0 and 0.1 "
    "(section 6.2, Figure 2)"
)
VARIANTS: tuple[str, ...] = (
    "lstm", "bn_lstm", "bn_lstm_g0.3", "bn_lstm_g1.0", "ln_lstm", "ln_lstm_g0.3", "ln_lstm_g0.1",
)
RELATIONS: tuple[str, ...] = (
    "praised", "sued", "hired", "visited", "blamed", "thanked", "interviewed", "accused",
    "joined", "defeated", "called", "married", "replaced", "warned", "followed", "met",
)
_SPECIAL = ("<pad>", "@placeholder")
PAD, PLACEHOLDER = 0, 1


@dataclass
class Config(RunConfig):
    """Sizes of the corpus, the model and the training run (presets in :func:`get_config`).

    Attributes:
        scale: ``"quick"`` (a CPU) or ``"paper"`` (larger, for a GPU).
        n_train, n_val, n_entities, sentences, n_relations, blank: the corpus
            (:func:`make_cloze`); ``blank`` is ``"both"`` or ``"object"``.
        embed_size, hidden_size: word embedding and LSTM sizes.
        batch_size, steps, eval_every, lr: Adam training schedule.
        bn_gain_init: initial gain of ``"bn_lstm"`` (0.1, as Cooijmans et al.).
        ln_small_gain: the gain of ``"ln_lstm_g0.1"`` (``"ln_lstm"`` starts at 1).
        variants: which LSTMs to train (from :data:`VARIANTS`).
        data_seed: the corpus's seed (``seeds``, from :class:`~lnbook.engine.RunConfig`,
            seed the models' initialization and batch order).
        checkpoint: checkpoint each job under ``out/`` (a sweep resumes).
        stacked: train the runs of each LSTM family as the copies of one engine
            :class:`~lnbook.engine.Stack`, all in one job of the sweep (False: one job per run).
    """

    n_train: int = 6000
    n_val: int = 300
    n_entities: int = 4
    sentences: int = 3
    n_relations: int = 8
    blank: str = "object"
    embed_size: int = 16
    hidden_size: int = 16
    batch_size: int = 64
    steps: int = 700
    eval_every: int = 25
    lr: float = 1e-2
    bn_gain_init: float = 0.1
    ln_small_gain: float = 0.1
    variants: tuple[str, ...] = ("lstm", "bn_lstm", "bn_lstm_g1.0", "ln_lstm", "ln_lstm_g0.1")
    seeds: int | tuple[int, ...] = 4
    data_seed: int = 1234
    checkpoint: bool = False
    stacked: bool = True


_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "paper": {
        "n_train": 200_000, "n_val": 5_000, "n_entities": 60, "sentences": 4,
        "blank": "both", "embed_size": 200, "hidden_size": 240, "batch_size": 64,
        "steps": 20_000, "eval_every": 500, "lr": 1e-3, "seeds": 5,
        "variants": VARIANTS,
        "checkpoint": True, "threads": None,
    },
}


def get_config(scale: str = "quick", **overrides: Any) -> Config:
    """The ``quick`` or ``paper`` preset, with any field overridden by keyword."""
    cfg = make_config(Config, _PRESETS, scale, overrides)
    for v in cfg.variants:
        variant_gain(v)  # ValueError for a variant not in VARIANTS
    _check_corpus(cfg.n_entities, cfg.sentences, cfg.n_relations, cfg.blank)
    return cfg


def _check_corpus(n_entities: int, sentences: int, n_relations: int, blank: str) -> None:
    """Raise ValueError unless :func:`make_cloze` can write a corpus of these sizes."""
    if not 2 <= sentences <= n_entities:
        raise ValueError(f"sentences must lie in [2, n_entities={n_entities}] (one entity per "
                         f"sentence), got {sentences}")
    if blank not in ("both", "object"):
        raise ValueError(f"blank must be 'both' or 'object', got {blank!r}")
    if not 1 <= sentences <= n_relations <= len(RELATIONS):
        raise ValueError(f"need 1 <= sentences <= n_relations <= {len(RELATIONS)}, "
                         f"got sentences={sentences}, n_relations={n_relations}")


# ----------------------------------------------------------------------------- the corpus


@dataclass
class ClozeData:
    """A generated cloze corpus; row n of every tensor is one example.

    Attributes:
        passages: int64 ``(N, 3 * sentences)`` token ids, facts ``ENT REL ENT``.
        queries: int64 ``(N, 3)`` token ids, one fact with ``@placeholder`` for an entity.
        candidates: bool ``(N, n_entities)``, True for the entity ids that occur in the passage.
        answers: int64 ``(N,)``, the entity id (0 .. n_entities-1) that fills the blank.
        vocab: the token strings, indexed by token id.
        entity_offset: token id of ``@entity0``; entity id k has token ``entity_offset + k``.
    """

    passages: Tensor
    queries: Tensor
    candidates: Tensor
    answers: Tensor
    vocab: list[str]
    entity_offset: int

    def __len__(self) -> int:
        return int(self.answers.shape[0])

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(passages, queries, candidates, answers)``, the batch layout of the model."""
        return self.passages, self.queries, self.candidates, self.answers


def make_cloze(n: int, seed: int, n_entities: int = 16, sentences: int = 4, n_relations: int = 16,
               blank: str = "both") -> ClozeData:
    """Generate ``n`` cloze examples, deterministically from ``seed`` (numpy's generator).

    Each example draws ``sentences`` distinct entity ids and writes ``sentences`` facts
    ``ENT_a REL ENT_b`` with distinct relations, every entity mentioned exactly twice, never
    twice in one fact; the answer is uniform over the passage's entities and the query is one
    of its facts with the answer's mention (``blank``: subject or object, or object only)
    replaced by ``@placeholder``. Counting mentions cannot betray the answer.
    """
    check_size("n", n)
    _check_corpus(n_entities, sentences, n_relations, blank)
    rel_offset = len(_SPECIAL)
    ent_offset = rel_offset + n_relations
    vocab = list(_SPECIAL) + list(RELATIONS[:n_relations]) + [
        f"@entity{k}" for k in range(n_entities)
    ]
    rng = np.random.default_rng(seed)
    passages = np.zeros((n, 3 * sentences), dtype=np.int64)
    queries = np.zeros((n, 3), dtype=np.int64)
    candidates = np.zeros((n, n_entities), dtype=bool)
    answers = np.zeros(n, dtype=np.int64)
    k_ent = sentences  # entities per passage, each mentioned exactly twice
    for k in range(n):
        ents = rng.choice(n_entities, size=k_ent, replace=False)  # fresh anonymization
        rels = rng.choice(n_relations, size=sentences, replace=False)
        while True:  # pair the 2 * sentences mentions into facts with two different entities
            slots = rng.permutation(np.repeat(np.arange(k_ent), 2)).reshape(sentences, 2)
            if np.all(slots[:, 0] != slots[:, 1]):
                break
        facts = [(int(ents[a]), int(rels[j]), int(ents[b])) for j, (a, b) in enumerate(slots)]
        passages[k] = (np.array(facts) + (ent_offset, rel_offset, ent_offset)).ravel()  # tokens
        answer = int(ents[rng.integers(k_ent)])  # uniform over the passage's entities
        roles = (2,) if blank == "object" else (0, 2)
        mentions = [(j, r) for j, f in enumerate(facts) for r in roles if f[r] == answer]
        if not mentions:  # blank == "object" and the answer is only ever a subject
            answer = facts[rng.integers(sentences)][2]
            mentions = [(j, 2) for j, f in enumerate(facts) if f[2] == answer]
        j, role = mentions[rng.integers(len(mentions))]
        queries[k] = passages[k, 3 * j : 3 * j + 3]  # fact j, then its subject or object blanked
        queries[k, role] = PLACEHOLDER
        answers[k] = answer
        candidates[k, ents] = True
    return ClozeData(
        torch.from_numpy(passages), torch.from_numpy(queries), torch.from_numpy(candidates),
        torch.from_numpy(answers), vocab, ent_offset,
    )


def describe_example(data: ClozeData, i: int) -> str:
    """Example ``i`` as text: the passage (facts separated by ``|``, not a token), query, answer."""
    words = data.vocab
    toks = [words[t] for t in data.passages[i].tolist()]
    passage = " | ".join(" ".join(toks[j : j + 3]) for j in range(0, len(toks), 3))
    query = " ".join(words[t] for t in data.queries[i].tolist())
    answer = words[data.entity_offset + int(data.answers[i])]
    return f"passage: {passage}\nquery:   {query}\nanswer:  {answer}"


def chance_level(data: ClozeData) -> float:
    """Expected accuracy of guessing uniformly among the entities of the passage."""
    return float((1.0 / data.candidates.sum(dim=1).double()).mean())


def frequency_baseline_accuracy(data: ClozeData) -> float:
    """Expected accuracy of guessing uniformly among the passage's most frequent entities,
    the one named in the query excluded (a stronger floor than :func:`chance_level`)."""
    n_ent = data.candidates.shape[1]
    ent = data.passages - data.entity_offset  # (N, Tp), entity ids or negative
    is_ent = (ent >= 0) & (ent < n_ent)
    counts = torch.zeros(len(data), n_ent, dtype=torch.long)
    counts.scatter_add_(1, ent.clamp(min=0), is_ent.long())  # (N, n_entities)
    q = data.queries - data.entity_offset  # (N, 3)
    named = torch.zeros_like(counts).scatter_add_(1, q.clamp(0, n_ent - 1),
                                                  ((q >= 0) & (q < n_ent)).long())
    counts[named > 0] = 0  # the entity named in the query is not the answer
    best = counts == counts.max(dim=1, keepdim=True).values  # (N, n_entities) ties
    hit = best.gather(1, data.answers[:, None]).squeeze(1).double()
    return float((hit / best.sum(dim=1).double()).mean())


# ----------------------------------------------------------------------------- the model


def set_ln_gains(module: nn.Module, value: float) -> int:
    """Set the gain of every :class:`lnbook.LayerNorm` inside ``module`` to ``value`` (how
    ``"ln_lstm_g0.1"`` is made); returns how many layer norms were changed."""
    count = 0
    for m in module.modules():
        if isinstance(m, (LayerNorm, nn.LayerNorm)) and m.weight is not None:
            with torch.no_grad():
                m.weight.fill_(value)
            count += 1
    return count


def make_lstm(
    variant: str, input_size: int, hidden_size: int, max_steps: int,
    bn_gain_init: float = 0.1, ln_small_gain: float = 0.1,
) -> nn.Module:
    """A one-layer LSTM of ``variant``: ``(T, B, input_size) -> (output (T, B, H), (h_n, c_n))``;
    ``max_steps``: the steps recurrent batch normalization keeps statistics for."""
    kind, gain = variant_gain(variant, bn_gain_init, ln_small_gain)
    if kind == "lstm":
        return LSTM(input_size, hidden_size, layer_norm=False)
    if kind == "ln":
        lstm = LSTM(input_size, hidden_size, layer_norm=True)
        if gain != 1.0 and set_ln_gains(lstm, gain) == 0:
            raise RuntimeError("lnbook.LSTM(layer_norm=True) holds no LayerNorm to rescale")
        return lstm
    return RecurrentBNLSTM(input_size, hidden_size, max_steps, gain_init=gain)


def variant_gain(
    variant: str, bn_gain_init: float = 0.1, ln_small_gain: float = 0.1
) -> tuple[str, float]:
    """``(family, initial gain)`` of a variant name: ``"lstm"``, ``"bn"`` or ``"ln"``.

    ``"bn_lstm"`` starts at ``bn_gain_init`` and ``"ln_lstm"`` at 1; a suffix ``_g<gain>``
    names the gain (``"bn_lstm_g1.0"``, ``"ln_lstm_g0.3"``), except that ``"ln_lstm_g0.1"``
    takes ``ln_small_gain``.
    """
    check_choice("variant", variant, VARIANTS)
    if variant == "lstm":
        return "lstm", 1.0
    kind = variant[:2]
    if variant == "ln_lstm_g0.1":
        return kind, float(ln_small_gain)
    if "_g" in variant:
        return kind, float(variant.rsplit("_g", 1)[1])
    return kind, float(bn_gain_init) if kind == "bn" else 1.0


class AttentiveReader(nn.Module):
    """The unidirectional attentive reader of Hermann et al. (2015), as used in section 6.2.

    With ``y_t`` the passage LSTM's output at position t and ``u`` the query LSTM's last output:

        m_t = tanh(W_ym y_t + W_um u),   s = softmax_t(w_ms^T m_t),   r = sum_t s_t y_t,
        g = tanh(W_rg r + W_ug u),       p(a | passage, query) = softmax over candidates of W_a g.

    The softmax over answers is restricted to the entities that occur in the passage.

    Args:
        vocab_size, n_entities: numbers of token ids and of entity ids (the answer classes).
        passage_len, query_len: sequence lengths (used by recurrent batch normalization).
        variant: the LSTM, one of :data:`VARIANTS`; bn_gain_init, ln_small_gain: as in Config.

    Shape:
        - passages ``(B, Tp)``, queries ``(B, Tq)`` int64; candidates ``(B, n_entities)`` bool;
          answers ``(B,)`` int64.
        - :meth:`logits` returns ``(B, n_entities)``; ``forward`` returns the mean cross-entropy.

    Example::

        >>> data = make_cloze(8, seed=0)
        >>> model = AttentiveReader(len(data.vocab), 16, 16, 4, variant="ln_lstm")
        >>> loss = model(*data.tensors())
    """

    def __init__(
        self, vocab_size: int, n_entities: int, passage_len: int, query_len: int,
        embed_size: int = 32, hidden_size: int = 64, variant: str = "lstm",
        bn_gain_init: float = 0.1, ln_small_gain: float = 0.1,
    ) -> None:
        super().__init__()
        self.variant, self.n_entities = variant, n_entities
        self.embed = nn.Embedding(vocab_size, embed_size)
        kw = {"bn_gain_init": bn_gain_init, "ln_small_gain": ln_small_gain}
        self.passage_lstm = make_lstm(variant, embed_size, hidden_size, passage_len, **kw)
        self.query_lstm = make_lstm(variant, embed_size, hidden_size, query_len, **kw)
        self.w_ym = nn.Linear(hidden_size, hidden_size, bias=False)
        self.w_um = nn.Linear(hidden_size, hidden_size)
        self.w_ms = nn.Linear(hidden_size, 1, bias=False)
        self.w_rg = nn.Linear(hidden_size, hidden_size, bias=False)
        self.w_ug = nn.Linear(hidden_size, hidden_size)
        self.w_a = nn.Linear(hidden_size, n_entities)

    def logits(self, passages: Tensor, queries: Tensor, candidates: Tensor) -> Tensor:
        """Answer scores ``(B, n_entities)``; entities absent from the passage get -inf."""
        if passages.dtype != torch.long or queries.dtype != torch.long:
            raise TypeError("passages and queries must be int64 token ids")
        if candidates.dtype != torch.bool or candidates.shape[-1] != self.n_entities:
            raise ValueError(f"candidates must be a bool tensor (B, {self.n_entities}), "
                             f"got {candidates.dtype} {tuple(candidates.shape)}")
        y, _ = self.passage_lstm(self.embed(passages.t()))  # (Tp, B, H)
        uq, _ = self.query_lstm(self.embed(queries.t()))  # (Tq, B, H)
        u = uq[-1]  # (B, H)
        m = torch.tanh(self.w_ym(y) + self.w_um(u))  # (Tp, B, H)
        s = torch.softmax(self.w_ms(m).squeeze(-1), dim=0)  # (Tp, B) attention over positions
        r = (s.unsqueeze(-1) * y).sum(dim=0)  # (B, H)
        g = torch.tanh(self.w_rg(r) + self.w_ug(u))  # (B, H)
        return self.w_a(g).masked_fill(~candidates, float("-inf"))  # (B, n_entities)

    def forward(
        self, passages: Tensor, queries: Tensor, candidates: Tensor, answers: Tensor
    ) -> Tensor:
        return F.cross_entropy(self.logits(passages, queries, candidates), answers)


def evaluate(model: AttentiveReader, data: ClozeData, batch_size: int = 1000) -> dict[str, float]:
    """Mean cross-entropy ``xent`` (nats) and ``error`` (1 - accuracy) of ``model`` on ``data``."""
    dev = next(model.parameters()).device
    loss, wrong = 0.0, 0
    for i in range(0, len(data), batch_size):
        p, q, c, a = (t[i : i + batch_size].to(dev) for t in data.tensors())
        logits = model.logits(p, q, c)  # (b, n_entities)
        loss += float(F.cross_entropy(logits, a, reduction="sum"))
        wrong += int((logits.argmax(dim=1) != a).sum())
    return {"xent": loss / len(data), "error": wrong / len(data)}


# ----------------------------------------------------------------------------- reading the runs


def final_error(results: Results, variant: str, last: int = 1) -> np.ndarray:
    """Per seed, the mean validation error of the ``last`` evaluations (1: the final one)."""
    return np.array([float(np.mean(r.history.metric("error")[-last:]))
                     for r in results.select(variant)])


def gain_spread(results: Results, variants: list[str] | tuple[str, ...],
                last: int = 1) -> np.ndarray:
    """Per seed, the spread (max - min) of :func:`final_error` over ``variants``, one LSTM
    started at several gains."""
    errs = np.stack([final_error(results, v, last) for v in variants])  # (gains, seeds)
    return errs.max(axis=0) - errs.min(axis=0)


#: C13's final error: a run's mean validation error over its last ``LAST_EVALS`` evaluations.
LAST_EVALS = 4
#: C13's trivial-phase bar: a run has left the frequency plateau when its final error is at
#: least this much below the frequency heuristic's validation error.
TRIVIAL_MARGIN = 0.1


def c13_quantities(results: Results) -> dict[str, Any]:
    """What C13's rule reads, from a run of :func:`run` with the variants ``"lstm"``,
    ``"bn_lstm"``, ``"bn_lstm_g1.0"``, ``"ln_lstm"`` and ``"ln_lstm_g0.1"``.

    Numbers: ``frequency_error`` (the frequency heuristic's validation error), ``bar`` (that
    minus :data:`TRIVIAL_MARGIN`), ``target`` (the target error of "trains faster": halfway
    between ``frequency_error`` and the LSTM's final error, its mean over seeds). Per variant,
    ``(seeds,)`` each: ``final`` (the mean validation error of the last :data:`LAST_EVALS`
    evaluations, :func:`final_error`), ``left`` (``final`` at most ``bar``: the run left the
    frequency plateau), ``updates`` (updates to ``target``, interpolated; inf: never). Per seed:
    ``ln_gap`` and ``bn_gap``, the change of LN's and recurrent BN's final error between gains
    0.1 and 1 (:func:`gain_spread`).
    """
    frequency_error = 1 - float(results.info["frequency_baseline"])
    bar = frequency_error - TRIVIAL_MARGIN
    final = {v: final_error(results, v, LAST_EVALS) for v in results.variants}
    target = 0.5 * (frequency_error + final["lstm"].mean())
    return {
        "frequency_error": frequency_error, "bar": bar, "target": target, "final": final,
        "left": {v: final[v] <= bar for v in results.variants},
        "updates": {v: results.updates_to(v, "error", target) for v in results.variants},
        "ln_gap": gain_spread(results, ["ln_lstm_g0.1", "ln_lstm"], LAST_EVALS),
        "bn_gap": gain_spread(results, ["bn_lstm", "bn_lstm_g1.0"], LAST_EVALS)}


def c13_inputs(results: Results) -> dict[str, dict[str, np.ndarray]]:
    """C13's ``values`` and ``trivial_ok`` for :func:`lnbook.ledger.decide_claim`, from
    :func:`c13_quantities`, per seed: "LN faster than the LSTM" (than recurrent BN) is the
    LSTM's (the BN-LSTM's at gain 0.1) updates to the target error minus the LN-LSTM's (inf:
    never reached; NaN, counting for neither side, when neither reached it); "LN ends below
    the LSTM" (recurrent BN) is the LN-LSTM's final error minus the LSTM's (the BN-LSTM's at
    gain 0.1); "LN insensitive to its gain, unlike BN" is ``ln_gap - bn_gap``. A seed counts
    for a comparison where both compared models left the frequency plateau (``left``), for the
    gain part where LN at both gains and the BN-LSTM at gain 0.1 did."""
    q = c13_quantities(results)
    ups, fin, left = q["updates"], q["final"], q["left"]
    ln, ln01, bn = "ln_lstm", "ln_lstm_g0.1", "bn_lstm"
    with np.errstate(invalid="ignore"):  # inf - inf (neither reached the target): NaN
        values = {
            "LN faster than the LSTM": ups["lstm"] - ups[ln],
            "LN faster than recurrent BN": ups[bn] - ups[ln],
            "LN ends below the LSTM": fin[ln] - fin["lstm"],
            "LN ends below recurrent BN": fin[ln] - fin[bn],
            "LN insensitive to its gain, unlike BN": q["ln_gap"] - q["bn_gap"]}
    vs_lstm, vs_bn = left[ln] & left["lstm"], left[ln] & left[bn]
    return {"values": values, "trivial_ok": {
        "LN faster than the LSTM": vs_lstm, "LN faster than recurrent BN": vs_bn,
        "LN ends below the LSTM": vs_lstm, "LN ends below recurrent BN": vs_bn,
        "LN insensitive to its gain, unlike BN": left[ln] & left[ln01] & left[bn]}}


# ----------------------------------------------------------------------------- the experiment


def run(config: Config, device: str | torch.device = "auto",
        out: str | os.PathLike | None = None) -> Results:
    """Train every variant under every seed through :func:`lnbook.engine.runner.sweep` (stacked: one
    job, each LSTM family one engine :class:`~lnbook.engine.Stack`; else one job per run).

    Every run evaluates the validation ``xent`` (nats) and ``error`` before training and every
    ``eval_every`` updates. ``out``: folder for ``reader.json``, the runs and checkpoints.
    ``info``: the accuracy of ``chance`` and of ``frequency_baseline``.
    """
    check_config(config, Config)
    kw = {"n_entities": config.n_entities, "sentences": config.sentences,
          "n_relations": config.n_relations, "blank": config.blank}
    train = make_cloze(config.n_train, seed=config.data_seed, **kw)
    valid = make_cloze(config.n_val, seed=config.data_seed + 1, **kw)
    info = {"chance": chance_level(valid), "frequency_baseline": frequency_baseline_accuracy(valid),
            "n_train": len(train), "n_val": len(valid)}
    fn = partial(_train_stack if config.stacked else _train_one, config=config, train=train,
                 valid=valid)
    return sweep(NAME, {v: v for v in config.variants}, config.seeds, fn, config=config,
                 stack="all" if config.stacked else None, device=device, out=out,
                 checkpoint=config.checkpoint, steps=config.steps, info=info,
                 threads=config.threads, workers=config.workers)


def _seeded_model(config: Config, data: ClozeData, variant: str, seed: int) -> AttentiveReader:
    """The :class:`AttentiveReader` of ``variant`` initialized under ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return AttentiveReader(len(data.vocab), config.n_entities, data.passages.shape[1],
                           data.queries.shape[1], config.embed_size, config.hidden_size, variant,
                           config.bn_gain_init, config.ln_small_gain)


def _train_one(job: Job, config: Config, train: ClozeData, valid: ClozeData) -> History:
    """Train one (variant, seed) of :func:`run` (module level, so a worker process can)."""
    model = _seeded_model(config, train, job.variant, job.seed)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    return fit(model, Batches(*train.tensors(), batch_size=config.batch_size, seed=job.seed),
               opt, steps=config.steps, eval_every=config.eval_every,
               eval_fn=partial(evaluate, data=valid), device=job.device, seed=job.seed,
               checkpoint=job.checkpoint, bar=job.bar, label=job.label)


def _train_stack(job: Job, config: Config, train: ClozeData, valid: ClozeData
                 ) -> list[History]:
    """Every (variant, seed) of the job, each LSTM family (the variants whose models have the
    same parameters and buffers) as the copies of one engine :class:`~lnbook.engine.Stack`,
    checkpointed in a file of its own beside ``job.checkpoint``."""
    hists = {}
    for kind in ("lstm", "bn", "ln"):
        pairs = [(v, s) for v in job.variants if variant_kind(v) == kind for s in job.seeds]
        if pairs:
            ckpt = job.checkpoint
            if ckpt is not None:
                ckpt = ckpt.with_name(f"{ckpt.stem}-{kind}{ckpt.suffix}")
            runs = _train_family(config, train, valid, pairs, job, ckpt, f"{job.label} ({kind})")
            hists.update(zip(pairs, runs, strict=True))
    return [hists[pair] for pair in job.pairs]


def _train_family(config: Config, train: ClozeData, valid: ClozeData,
                  pairs: list[tuple[str, int]], job: Job, checkpoint: Path | None,
                  label: str) -> list[History]:
    """The (variant, seed) ``pairs`` of one LSTM family as one :class:`~lnbook.engine.Stack`;
    each copy reads its batches as its run alone reads them."""
    dev = torch.device(job.device)
    stack = Stack([_seeded_model(config, train, v, s) for v, s in pairs]).to(dev)
    order = [Batches(torch.arange(len(train)), batch_size=config.batch_size, seed=s)
             for _, s in pairs]
    rows_of = tuple(t.to(dev) for t in train.tensors())
    held_out = tuple(t.to(dev) for t in valid.tensors())

    def losses(step: int) -> Tensor:
        rows = torch.stack([batch(step)[0] for batch in order]).to(dev)  # (M, B)
        return stack(*(t[rows] for t in rows_of))  # (M,)

    @torch.no_grad()
    def evaluate_all() -> list[dict[str, float]]:
        was, n = stack.training, len(valid)
        stack.eval()
        xent, wrong = torch.zeros(len(pairs), dtype=torch.float64), 0
        for i in range(0, n, 1000):  # in slices of evaluate's size, for the memory
            x, w = stack.call(_scores, *(t[i : i + 1000] for t in held_out),
                              shared=(0, 1, 2, 3))  # (M,) each
            xent, wrong = xent + x.double().cpu(), wrong + w.cpu()
        stack.train(was)
        return [{"xent": float(x) / n, "error": int(w) / n}
                for x, w in zip(xent.tolist(), wrong.tolist(), strict=True)]

    opt = torch.optim.Adam(stack.parameters(), lr=config.lr, foreach=True)
    return train_copies(losses, evaluate_all, opt, [History(step_times=[]) for _ in pairs],
                        config.steps, config.eval_every, state=stack, checkpoint=checkpoint,
                        bar=job.bar, label=label)


def _scores(model: AttentiveReader, passages: Tensor, queries: Tensor, candidates: Tensor,
            answers: Tensor) -> tuple[Tensor, Tensor]:
    """One copy's summed cross-entropy and count of wrong answers on a held-out set."""
    logits = model.logits(passages, queries, candidates)  # (N, n_entities)
    return (F.cross_entropy(logits, answers, reduction="sum"),
            (logits.argmax(dim=-1) != answers).sum())


def variant_kind(variant: str) -> str:
    """The LSTM family of a variant: ``"lstm"``, ``"bn"`` or ``"ln"``."""
    return variant_gain(variant)[0]
