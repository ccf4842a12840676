"""Tests of lnbook.experiments.skip_thoughts (paper section 6.3, chapter 06_3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lnbook.engine import History, Results, Run
from lnbook.experiments import load_experiment
from lnbook.experiments import skip_thoughts as st

TEXT = """The "if" statement
******************

The "if" statement is used for conditional execution.  It selects
exactly one suite. If all expressions are false, the "else" suite
runs (see e.g. the manual) and that is all!

   if_stmt ::= "if" expression ":" suite

* a bullet item is kept. Another sentence follows it.

Subsection
==========

Last words here?
"""


def test_split_sentences_drops_headings_and_code():
    got = st.split_sentences(TEXT)
    assert got == [
        'The "if" statement is used for conditional execution.',
        "It selects exactly one suite.",
        'If all expressions are false, the "else" suite runs (see e.g. the manual) and that '
        "is all!",
        "a bullet item is kept.",
        "Another sentence follows it.",
        "Last words here?",
    ]


def test_tokenize():
    assert st.tokenize('Calls "__init__()" 3 times, e.g. x.y') == [
        "calls", "__init__", "3", "times", "e", "g", "x", "y"
    ]


def test_vocab_and_encode():
    sents = [["b", "a", "a"], ["c", "b", "a"]]
    vocab = st.build_vocab(sents, size=2)
    assert vocab == ["<pad>", "<unk>", "<bos>", "<eos>", "a", "b"]  # a: 3, b: 2, c: 1
    assert st.encode([["a", "c"], ["b"]], vocab, 3).tolist() == [[4, 1, 0], [5, 0, 0]]
    with pytest.raises(ValueError):
        st.build_vocab(sents, 0)


@pytest.fixture(scope="module")
def corpus():
    return st.load_corpus(max_tokens=12)


@pytest.fixture(scope="module")
def data(corpus):
    return st.make_data(corpus, vocab_size=300, probe_topics=4)


def test_corpus(corpus):
    assert len(corpus) > 1000 and len(corpus.topics) > 20
    assert corpus.topics == sorted(corpus.topics)
    assert all(3 <= len(s) <= 12 for s in corpus.sentences)
    assert corpus.topic == sorted(corpus.topic)  # topics in order, sentences in reading order
    assert "Python" in corpus.source
    again = st.load_corpus(max_tokens=12)
    assert again.sentences == corpus.sentences


def test_make_data_has_no_leakage(corpus, data):
    held = data.heldout
    tr, te = data.train_triples, data.test_triples
    assert tr.shape[1] == 3 and len(tr) > 5 * len(te) > 0
    assert not held[tr].any() and held[te].all()
    assert held[data.topic_ids].all() and held[data.pairs].all()
    for t in (tr, te):  # consecutive sentences of one topic
        assert torch.equal(t[:, 1] - t[:, 0], torch.ones(len(t), dtype=torch.long))
        assert torch.equal(t[:, 2] - t[:, 1], torch.ones(len(t), dtype=torch.long))
        assert (data.topic[t] == data.topic[t[:, :1]]).all()
    # the vocabulary comes from training sentences only
    train_words = {w for s, h in zip(corpus.sentences, held.tolist(), strict=True) if not h
                   for w in s}
    assert set(data.vocab[4:]) <= train_words
    # each held-out part is the end of its topic
    for k in range(len(corpus.topics)):
        h = held[data.topic == k].tolist()
        assert h == sorted(h)


def test_probe_sets(data):
    assert data.topic_labels.unique().tolist() == [0, 1, 2, 3] and len(data.topic_names) == 4
    assert len(data.topic_ids) == len(data.topic_labels)
    lab = data.pair_labels
    assert lab.sum() * 2 == len(lab)  # balanced
    p = data.pairs
    assert (p[lab == 1, 1] - p[lab == 1, 0] == 1).all()
    assert ((p[lab == 0, 1] - p[lab == 0, 0]).abs() > 1).all()
    assert (data.topic[p[:, 0]] == data.topic[p[:, 1]]).all()


def test_stratified_folds():
    labels = torch.tensor([0] * 10 + [1] * 5)
    fold = st.stratified_folds(labels, 5, seed=2)
    for k in range(5):
        assert (labels[fold == k] == 0).sum() == 2 and (labels[fold == k] == 1).sum() == 1
    assert torch.equal(fold, st.stratified_folds(labels, 5, seed=2))


def test_probe_matches_sklearn_ridge_classifier():
    from sklearn.linear_model import RidgeClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    g = torch.Generator().manual_seed(0)
    for k_classes in (2, 3):
        x = torch.randn(120, 6, generator=g) * torch.tensor([1.0, 5.0, 0.1, 1.0, 1.0, 2.0])
        y = torch.bucketize(x[:, 0] + 0.3 * x[:, 1] + torch.randn(120, generator=g),
                            torch.linspace(-1.5, 1.5, k_classes - 1))
        fold = st.stratified_folds(y, 4, seed=1)
        acc = []
        for k in range(4):
            tr, te = (fold != k).numpy(), (fold == k).numpy()
            clf = make_pipeline(StandardScaler(), RidgeClassifier(alpha=3.0))
            clf.fit(x.numpy()[tr], y.numpy()[tr])
            acc.append(np.mean(clf.predict(x.numpy()[te]) == y.numpy()[te]))
        assert st.probe_accuracy(x, y, folds=4, ridge=3.0, seed=1) == pytest.approx(
            100 * np.mean(acc), abs=1e-9
        )
    # more features than examples (the paper's 4800-d neighbour features): the same answer
    x, y = torch.randn(40, 90, generator=g), torch.arange(40) % 2
    x[:, :3] += 1.5 * y[:, None]
    fold = st.stratified_folds(y, 4, seed=1)
    acc = []
    for k in range(4):
        tr, te = (fold != k).numpy(), (fold == k).numpy()
        clf = make_pipeline(StandardScaler(), RidgeClassifier(alpha=3.0)).fit(x.numpy()[tr],
                                                                             y.numpy()[tr])
        acc.append(np.mean(clf.predict(x.numpy()[te]) == y.numpy()[te]))
    assert st.probe_accuracy(x, y, folds=4, ridge=3.0, seed=1) == pytest.approx(
        100 * np.mean(acc), abs=1e-9) and 50 < 100 * np.mean(acc) < 100


def test_probe_finds_a_linear_signal_and_not_noise():
    g = torch.Generator().manual_seed(3)
    y = torch.arange(200) % 2
    signal = torch.randn(200, 5, generator=g) + 2.0 * y.view(-1, 1)
    assert st.probe_accuracy(signal, y) > 90
    assert 35 < st.probe_accuracy(torch.randn(200, 5, generator=g), y) < 65
    with pytest.raises(ValueError, match=r"\(N, F\)"):
        st.probe_accuracy(torch.randn(5), y[:5])


@pytest.mark.parametrize("layer_norm", [False, True])
def test_model_loss_and_encoder(layer_norm):
    torch.manual_seed(0)
    v = 40
    m = st.SkipThoughts(v, 8, 16, layer_norm=layer_norm)
    t = torch.randint(4, v, (3, 5, 6))
    t[:, 1, 4:] = 0  # padding
    loss = m(t[0], t[1], t[2])
    assert abs(loss.item() - math.log(v)) < 0.5  # about uniform over the words at the start
    # extra padding columns change neither the loss nor the sentence vectors
    pad = torch.cat([t, torch.zeros(3, 5, 3, dtype=torch.long)], dim=2)
    assert torch.allclose(m(pad[0], pad[1], pad[2]), loss, atol=1e-6)
    s = m.encode(t[1])
    assert s.shape == (5, 16)
    assert torch.allclose(m.encode(t[1, 1:2]), s[1:2], atol=1e-6)  # batch-independent
    loss.backward()
    assert m.dec_prev.weight_ih_l0.grad.abs().sum() > 0 and m.encoder.weight_hh_l0.grad is not None
    assert any("ln_" in n for n, _ in m.named_parameters()) == layer_norm


def test_decoder_targets_end_with_eos():
    # a decoder that must predict a fixed sentence: the loss is the cross entropy of
    # [w1, w2, <eos>] given [<bos>, w1, w2]; check against a manual computation
    torch.manual_seed(1)
    m = st.SkipThoughts(12, 4, 6, layer_norm=False)
    s = torch.randn(1, 6)
    target = torch.tensor([[7, 9, 0]])
    ce, n = m._decode_loss(m.dec_next, s, target)
    inp = torch.tensor([[2, 7, 9]])
    x = torch.cat([m.embed(inp), s.unsqueeze(1).expand(-1, 3, -1)], dim=2)
    out, _ = m.dec_next(x)
    logits = m.out(out)[0]  # (3, V)
    want = torch.nn.functional.cross_entropy(logits, torch.tensor([7, 9, 3]), reduction="sum")
    assert n.item() == 3 and torch.allclose(ce, want, atol=1e-5)


def _tiny_data() -> st.SkipThoughtData:
    """Six sentences of one topic: triples (0,1,2), (1,2,3) train; (3,4,5) is held out."""
    vocab = ["<pad>", "<unk>", "<bos>", "<eos>", "a", "b"]
    tokens = torch.tensor([[4, 4, 0], [5, 0, 0], [4, 5, 0], [4, 0, 0], [5, 5, 5], [5, 4, 0]])
    z = torch.zeros(0, dtype=torch.long)
    return st.SkipThoughtData(
        vocab=vocab, tokens=tokens, topic=torch.zeros(6, dtype=torch.long),
        heldout=torch.tensor([False] * 4 + [True] * 2),
        train_triples=torch.tensor([[0, 1, 2], [1, 2, 3]]), test_triples=torch.tensor([[3, 4, 5]]),
        topic_ids=z, topic_labels=z, topic_names=[], pairs=z.view(0, 2), pair_labels=z)


def test_unigram_loss_hand_computed():
    data = _tiny_data()
    # training targets: sentences 0, 2 (triple 0,1,2) and 1, 3 (triple 1,2,3):
    # a a <eos> | a b <eos> | b <eos> | a <eos>: a 4, b 2, <eos> 4, <unk> 0
    # add-one over the 4 words a decoder can emit (<unk>, <eos>, a, b): total 10 + 4 = 14
    p = {"<unk>": 1 / 14, "<eos>": 5 / 14, "a": 5 / 14, "b": 3 / 14}
    # held-out targets: sentences 3 and 5: a <eos> | b a <eos>
    held = ["a", "<eos>", "b", "a", "<eos>"]
    want = -sum(math.log(p[w]) for w in held) / len(held)
    assert st.unigram_loss(data) == pytest.approx(want, rel=1e-12)


def test_unigram_loss_is_what_a_model_must_beat(data):
    # the word-frequency predictor beats a uniform guess over the words a decoder can emit
    u = st.unigram_loss(data)
    assert u < math.log(len(data.vocab) - 2)
    # and a model whose output layer knows only the word frequencies (zero weights, log-
    # frequency biases) scores it, up to the smoothing, on the held-out triples
    torch.manual_seed(0)
    m = st.SkipThoughts(len(data.vocab), 4, 8, layer_norm=False)
    tri = data.train_triples
    ids = data.tokens[tri[:, [0, 2]].flatten()]
    counts = torch.bincount(ids[ids != 0], minlength=len(data.vocab)).double()
    counts[3] += ids.shape[0]
    with torch.no_grad():
        m.out.weight.zero_()
        m.out.bias.copy_((counts + 1.0).log().float())
        m.out.bias[[0, 2]] = -1e9
    assert st.heldout_loss(m, data) == pytest.approx(u, abs=1e-4)


def test_bag_of_words():
    bow = st.bag_of_words(torch.tensor([[4, 5, 4, 0], [1, 0, 0, 0]]), 6)
    assert bow.tolist() == [[0, 0, 0, 0, 2, 1], [0, 1, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"\(N, L\)"):
        st.bag_of_words(torch.tensor([4, 5]), 6)


def test_time_per_update(data):
    t = st.time_per_update(data, word_dim=4, hidden_size=8, batch_size=8, updates=2)
    assert t["baseline"] > 0 and t["layer_norm"] > 0
    assert 0 < t["ratio"] < 100
    with pytest.raises(ValueError, match="updates"):
        st.time_per_update(data, word_dim=4, hidden_size=8, batch_size=8, updates=0)


def test_configs_and_registry():
    p = st.get_config("paper")
    assert p.hidden_size == 2400 and p.word_dim == 620 and p.probe_folds == 10
    assert p.batch_size == 128 and p.timing_hidden == (2400,) and p.checkpoint
    assert p.steps == 1_000_000 and p.eval_every == 50_000
    q = st.get_config("quick")
    assert q.timing_hidden[0] == q.hidden_size
    assert st.get_config("quick", steps=5).steps == 5
    with pytest.raises(ValueError, match="scale"):
        st.get_config("tiny")
    with pytest.raises(ValueError, match="unknown"):
        st.get_config("quick", hidden=3)
    with pytest.raises(ValueError, match="variants"):
        st.get_config("quick", variants=("batch_norm",))
    assert load_experiment("skip_thoughts") is st


TINY = dict(vocab_size=100, hidden_size=8, word_dim=4, batch_size=8, steps=2, eval_every=1,
            seeds=(0,), timing_hidden=(8,), timing_updates=1, probe_folds=2)


def test_run_tiny(tmp_path):
    cfg = st.get_config("quick", **TINY)
    res = st.run(cfg, device="cpu", out=tmp_path)
    assert len(list(tmp_path.glob("skip_thoughts-*.json"))) == 1  # named by its digest
    assert res.info["corpus"]["sentences"] > 1000 and res.info["corpus"]["vocab"] == 104
    assert res.info["timing"]["8"]["ratio"] > 0
    corpus, data = st.load_data(cfg)
    assert res.info["unigram"] == pytest.approx(st.unigram_loss(data))
    again = st.run(st.get_config("quick", **{**TINY, "variants": ("baseline",)}), device="cpu",
                   data=(corpus, data))  # the same data, passed in
    assert again.select("baseline")[0].history.losses == res.select("baseline")[0].history.losses
    for v in ("baseline", "layer_norm"):
        steps, loss = res.curves(v, "heldout_loss")
        assert steps.tolist() == [0, 1, 2] and loss.shape == (1, 3)
        run = res.select(v)[0]
        assert set(run.info["probe_start"]) == set(run.info["probe_final"]) == {"topic",
                                                                              "neighbour"}
        assert run.info["sec_per_update"] > 0
    # the untrained encoder of each run is the one fit started from (same seed)
    torch.manual_seed(0)
    m = st.SkipThoughts(len(data.vocab), 4, 8, layer_norm=True)
    assert res.select("layer_norm")[0].info["probe_start"] == pytest.approx(
        st.probe_scores(m, data, 2))
    table = st.probe_table(res)
    assert [r[0] for r in table.rows] == ["baseline", "layer_norm"] and len(table.header) == 5
    assert res.updates_to("baseline", "heldout_loss", 1e9).tolist() == [0.0]  # at once
    assert np.isinf(res.updates_to("layer_norm", "heldout_loss", 0.0)).all()  # never


def test_paper_table3():
    t = st.paper_table3()
    assert t.header == ["model", "SICK r", "SICK rho", "SICK MSE", "MR", "CR", "SUBJ", "MPQA"]
    assert t.rows[2] == ["Ours + LN", "0.854", "0.785", "0.277", "79.5", "82.6", "93.4", "89"]


def test_paper_preset_tiny_override_checkpoints_and_resumes(tmp_path):
    kw = {**TINY, "max_tokens": 12, "variants": ("baseline",), "threads": 1}
    first = st.run(st.get_config("paper", **kw), device="cpu", out=tmp_path)
    assert len(list((tmp_path / "checkpoints").glob("skip_thoughts-*/baseline-seed0.pt"))) == 1
    longer = st.run(st.get_config("paper", **{**kw, "steps": 3}), device="cpu", out=tmp_path)
    a, b = first.select("baseline")[0].history, longer.select("baseline")[0].history
    assert b.losses[:2] == a.losses and len(b.losses) == 3  # resumed, not restarted


@pytest.mark.parametrize("call, match", [
    (lambda: st.load_corpus(min_tokens=5, max_tokens=4), "min_tokens"),
    (lambda: st.stratified_folds(torch.zeros(6, dtype=torch.long), 1), "folds"),
    (lambda: st.probe_accuracy(torch.zeros(6, 2), torch.zeros(6, dtype=torch.long), ridge=-1.0),
     "ridge"),
])
def test_bad_arguments_name_what_was_expected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_smoke_run_builds_a_short_corpus_and_a_real_run_the_whole(capsys):
    from lnbook.engine import capped
    cfg = st.get_config("paper")
    full, _ = st.load_data(cfg)  # a real run: every sentence, up to 30 words
    assert len(full) > st.SMOKE_SENTENCES and max(map(len, full.sentences)) == 30
    with capped(2):
        corpus, data = st.load_data(cfg)
    assert len(corpus) == st.SMOKE_SENTENCES and max(map(len, corpus.sentences)) == 8
    assert corpus.sentences[5] == full.sentences[5][:8] and corpus.topic == full.topic[:512]
    assert data.train_triples.shape[0] >= cfg.batch_size and len(data.pairs) > 0
    assert "smoke run on the first 512 sentences, at most 8 words each" in (
        capsys.readouterr().out)


def _c14_results(curves, probes, unigram=4.0):
    """A Results of two variants: held-out loss curves (evaluations 10 updates apart) and the
    topic probe before and after, one entry per seed."""
    runs = []
    for v in ("baseline", "layer_norm"):
        for seed, (curve, (start, final)) in enumerate(zip(curves[v], probes[v], strict=True)):
            h = History(eval_steps=[10 * k for k in range(len(curve))],
                        metrics=[{"heldout_loss": x} for x in curve])
            runs.append(Run(v, seed, h, {"probe_start": {"topic": start, "neighbour": 50.0},
                                         "probe_final": {"topic": final, "neighbour": 50.0}}))
    return Results("skip_thoughts", {"margin": 0.1, "target_below": 0.5}, "cpu", runs,
                   {"unigram": unigram})


def test_c14_quantities_and_inputs_read_the_declared_rule():
    res = _c14_results(
        {"baseline": [[4.0, 3.8, 3.6, 3.4], [4.0, 3.95, 3.92, 3.91], [4.0, 3.7, 3.5, 3.3]],
         "layer_norm": [[4.0, 3.6, 3.3, 3.2], [4.0, 3.6, 3.5, 3.4], [4.0, 3.7, 3.5, 3.3]]},
        {"baseline": [(30, 40), (30, 40), (30, 35)], "layer_norm": [(30, 45), (30, 31), (30, 20)]})
    q = st.c14_quantities(res)
    # target 3.5: the baseline crosses it halfway from update 20 to 30 on seed 0
    np.testing.assert_allclose(q["reach_baseline"], [25.0, np.inf, 20.0])
    np.testing.assert_allclose(q["reach_layer_norm"], [10 + 10 * 0.1 / 0.3, 20.0, 20.0])
    np.testing.assert_allclose(q["speedup"], [25.0 / (10 + 10 / 3), np.inf, 1.0])
    assert q["left"].tolist() == [True, False, True]  # seed 1's baseline ends at 3.91 > 3.9
    assert q["probe_ok"].tolist() == [True, True, False]  # seed 2's LN probe fell
    np.testing.assert_allclose(q["topic_diff"], [5.0, -9.0, -15.0])
    inputs = st.c14_inputs(res)
    assert inputs["trivial_ok"]["trains faster"].tolist() == [True, False, True]
    assert inputs["trivial_ok"]["better downstream"].tolist() == [True, False, False]
    np.testing.assert_allclose(inputs["values"]["trains faster"], q["speedup"])
    np.testing.assert_allclose(inputs["values"]["better downstream"], [5.0, -9.0, -15.0])
