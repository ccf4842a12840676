"""The placement experiment (Part II, chapter 9): presets, gradient profiles at
initialization, and a tiny warm-up sweep."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from seq_reference import train_transformer

from lnbook.engine import Job, load_results, results_file
from lnbook.engine.train import Batches
from lnbook.experiments import placement
from lnbook.experiments.seq_tasks import make_task
from lnbook.transformer import Transformer, layer_gradient_norms


def test_presets_names_and_validation():
    quick, paper = placement.get_config("quick"), placement.get_config("paper")
    assert quick.positions == ("post", "pre") and 0 in quick.warmups
    assert paper.warmups == (0, 4000) and paper.n_layers == 6 and paper.checkpoint
    assert placement.variant_name("post", 20) == "post/warmup20"
    with pytest.raises(ValueError, match="positions"):
        placement.get_config("quick", positions=("middle",))
    with pytest.raises(ValueError, match="warmups"):
        placement.get_config("quick", warmups=(0, 1000))
    post = placement.model_config(quick, "post", 3, 16)
    pre = placement.model_config(quick, "pre", 3, 16)
    assert not post.has_final_norm() and pre.has_final_norm() and post.n_layers == 3


def test_gradient_profiles_are_layer_gradient_norms_of_fresh_models():
    cfg = placement.get_config("quick", grad_depths=(2, 3), grad_seeds=(0, 1), grad_batch=8,
                               d_model=16, n_heads=2)
    prof = placement.gradient_profiles(cfg)
    assert set(prof) == {"post", "pre"} and prof["post"][3].shape == (2, 3)
    task = make_task(cfg.task, 8, 1, cfg.size, cfg.symbols)
    torch.manual_seed(1)
    model = Transformer.from_config(placement.model_config(cfg, "pre", 2, task.seq_len))
    direct = [b["mlp.fc2.weight"] for b in layer_gradient_norms(model, task.x, task.y)]
    np.testing.assert_allclose(prof["pre"][2][1], direct, rtol=1e-6)
    block = placement.gradient_profiles(cfg, param="block")
    assert np.all(block["post"][2] > prof["post"][2])  # a block holds more than fc2


def test_tiny_sweep_and_tiny_paper_run(tmp_path):
    cfg = placement.get_config("quick", steps=3, eval_every=3, warmups=(0, 2), n_train=64,
                               n_test=16, size=4, d_model=16, n_heads=2, seeds=(0,))
    res = placement.run(cfg, device="cpu", out=tmp_path)
    other = placement.run(replace(cfg, d_model=8), device="cpu", out=tmp_path)
    # another config's results go beside, never over, the first's
    for r in (res, other):
        assert load_results(results_file(tmp_path, r.name, r.config)).to_dict() == r.to_dict()
    assert other.runs[0].history.losses != res.runs[0].history.losses
    assert res.variants == ["post/warmup0", "post/warmup2", "pre/warmup0", "pre/warmup2"]
    # the same seed and data: the warm-up is the only difference, and it changes the run
    assert res.final("pre/warmup0", "loss") != res.final("pre/warmup2", "loss")
    paper = placement.get_config("paper", steps=1, eval_every=1, warmups=(0, 1), n_train=32,
                                 n_test=8, batch_size=8, d_model=16, n_heads=2, n_layers=1,
                                 checkpoint=False, seeds=(0,))
    assert len(placement.run(paper, device="cpu").runs) == 4


def test_a_stacked_copy_is_the_run_trained_alone():
    """run trains every seed and warm-up of a placement at once; each copy is the run that
    train_transformer trains alone (the same model, batches and warm-up), to rounding."""
    cfg = placement.get_config("quick", steps=4, eval_every=2, warmups=(0, 3), n_train=64,
                               n_test=16, size=4, d_model=16, n_heads=2, seeds=(0, 2))
    res = placement.run(cfg, device="cpu")
    task = make_task(cfg.task, cfg.n_train, cfg.n_test, cfg.size, cfg.symbols)
    for r in res.runs:
        position, warmup = r.variant.split("/warmup")
        job = Job.one(r.variant, None, r.seed)
        hist, _ = train_transformer(
            job, placement.model_config(cfg, position, cfg.n_layers, task.seq_len), task,
            lr=cfg.lr, steps=cfg.steps, batch_size=cfg.batch_size,
            eval_every=cfg.eval_every, warmup=int(warmup))
        assert r.info["warmup"] == int(warmup) and r.history.eval_steps == hist.eval_steps
        np.testing.assert_allclose(r.history.losses, hist.losses, rtol=0, atol=1e-5)
        np.testing.assert_allclose(r.history.metric("loss"), hist.metric("loss"), atol=1e-5)


def test_gradient_profiles_of_one_placement():
    cfg = placement.get_config("quick", grad_depths=(2,), grad_seeds=(0,), grad_batch=4)
    assert list(placement.gradient_profiles(cfg, positions=("post",))) == ["post"]
    with pytest.raises(ValueError, match="positions must be drawn"):
        placement.gradient_profiles(cfg, positions=("peri",))


def test_train_stacked_keywords_of_the_part_ii_experiments():
    """warm-up per rate, fit's batch order, max_logit and stream_var (the keywords the Part II
    experiments use) are checked and do what they say."""
    from lnbook.experiments import stacked

    cfg = placement.get_config("quick", n_train=32, n_test=8, size=4, d_model=16, n_heads=2)
    task = make_task(cfg.task, cfg.n_train, cfg.n_test, cfg.size, cfg.symbols)
    model = placement.model_config(cfg, "pre", 1, task.seq_len)
    kw = dict(steps=2, batch_size=8, eval_every=1)
    with pytest.raises(ValueError, match="order must be one of"):
        stacked.train_stacked(model, task, [0], [0.01], order="random", **kw)
    with pytest.raises(ValueError, match="warmup must be"):
        stacked.train_stacked(model, task, [0], [0.01], warmup=[0, 2], **kw)
    runs = stacked.train_stacked(model, task, [0], [0.01, 0.01], warmup=[0, 2], order="fit",
                                 max_logit=True, stream_var=False, **kw)
    assert [r.info["warmup"] for r in runs] == [0, 2]
    assert set(runs[0].history.metrics[0]) == {"loss", "accuracy", "max_logit"}
    assert runs[0].history.losses[0] == runs[1].history.losses[0]  # same model and batch
    assert runs[0].history.losses[1] != runs[1].history.losses[1]  # half the rate at step 1
    rows = stacked.fit_batch_indices(3, 32, 5, 8)  # (steps, batch): lnbook.fit's order
    batches = Batches(torch.arange(32), batch_size=8, seed=3)
    assert all(torch.equal(rows[s], batches(s)[0]) for s in range(5))
    plain = stacked.train_stacked(model, task, [0], [0.01], **kw)[0]
    assert "var_1" in plain.history.metrics[0] and "max_logit" not in plain.history.metrics[0]


def test_p04_inputs_read_the_gradient_profiles():
    import numpy as np

    from lnbook import ledger
    from lnbook.experiments import placement as P

    # {position: {depth: (seeds, depth)}} gradient norms, block 1 first; two seeds
    prof = {"pre": {2: np.array([[1.0, 1.5], [2.0, 1.0]]),
                    3: np.array([[1.0, 1.0, 0.8], [1.0, 1.0, 1.2]])},
            "post": {2: np.array([[0.5, 3.0], [1.0, 2.0]]),
                     3: np.array([[0.1, 1.0, 4.0], [0.2, 1.0, 2.4]])}}
    more = {"post": {3: np.array([[0.3, 1.0, 2.0]])}}
    v = P.p04_inputs(prof, more)["values"]
    # Pre-LN last / first, largest over depths: seed 0 max(1.5, 0.8), seed 1 max(0.5, 1.2)
    np.testing.assert_allclose(v["Pre-LN does not grow"], [1.5, 1.2])
    # Post-LN last / Pre-LN last, smallest over depths: min(2, 5), min(2, 2)
    np.testing.assert_allclose(v["Post-LN larger near the output"], [2.0, 2.0])
    # depth 3, three seeds: rms of block 1 sqrt(0.14 / 3), of block 3 sqrt(25.76 / 3)
    assert v["Post-LN grows in expectation"] == [pytest.approx((25.76 / 0.14) ** 0.5)]
    d = ledger.decide_claim("P04", values=v)
    assert set(d.parts) == set(v)


def test_p04_pilot_measures_the_expectation_over_groups_and_the_parts():
    """P04's pilot: the Post-LN root mean square ratio over all seeds and over disjoint groups
    (as the ratio of :func:`placement.gradient_profiles` computed here), and the other two
    parts on the first seeds as :func:`placement.p04_inputs` gives them."""
    cfg = placement.get_config("quick", seeds=(3, 4, 5, 6, 7), grad_depths=(1, 2),
                               grad_batch=16)
    got = placement.p04_pilot(cfg, groups=(2,), part_seeds=2)
    deep = placement.gradient_profiles(replace(cfg, grad_depths=(2,), grad_seeds=cfg.seeds),
                                       positions=("post",))["post"][2]  # (5, 2)

    def ratio(g):
        return np.sqrt((g[:, 1] ** 2).mean() / (g[:, 0] ** 2).mean())

    exp = got["Post-LN, 2 blocks, last over first (root mean square)"]
    assert exp["over all 5 seeds"] == pytest.approx(ratio(deep), rel=1e-12)
    below = sum(ratio(deep[k:k + 2]) < 1 for k in (0, 2))  # two groups of 2, seed 7 left out
    assert exp["below 1 in groups of 2"] == f"({below} of 2)"
    parts = placement.p04_inputs(
        placement.gradient_profiles(replace(cfg, grad_seeds=(3, 4))),
        {"post": {2: deep[2:]}})["values"]
    mine = got["P04 on the first 2 seeds"]
    assert set(mine) == {"Pre-LN does not grow", "Post-LN larger near the output"}
    for k, v in mine.items():
        np.testing.assert_allclose(v, parts[k], rtol=1e-12)
