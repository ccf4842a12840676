"""The qk-norm experiment (Part II, chapter 11): presets, learning-rate sensitivity, the
logit bound of qk-normalized attention, and a tiny sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from seq_reference import train_transformer

from lnbook.engine import Job, Results, Run
from lnbook.engine.train import History
from lnbook.experiments import qk_norm
from lnbook.experiments.seq_tasks import make_task
from lnbook.transformer import Transformer


def test_presets_names_and_validation():
    quick, paper = qk_norm.get_config("quick"), qk_norm.get_config("paper")
    assert quick.qk_norms == (False, True) and quick.warmup == 0
    assert max(paper.lrs) == 0.3 and paper.warmup > 0 and paper.checkpoint
    assert qk_norm.variant_name(True, 0.01) == "qk/lr0.01"
    assert qk_norm.variant_name(False, 3e-4) == "plain/lr0.0003"
    with pytest.raises(ValueError, match="increasing"):
        qk_norm.get_config("quick", lrs=(0.1, 0.01))
    with pytest.raises(ValueError, match="qk_norms"):
        qk_norm.get_config("quick", qk_norms=(0, 1))
    assert qk_norm.model_config(quick, True, 16).qk_norm


def test_lr_sensitivity_clips_at_the_initial_loss():
    final = np.array([[1.0, 2.0, 9.0], [0.5, 0.5, 0.5]])
    init = np.array([[3.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    # row 0: clipped (1, 2, 3) - 1 -> mean 1; row 1: flat -> 0
    np.testing.assert_allclose(qk_norm.lr_sensitivity(final, init), [1.0, 0.0])
    with pytest.raises(ValueError, match="seeds, rates"):
        qk_norm.lr_sensitivity(final[0], init[0])


def test_by_lr_orders_seeds_by_rate():
    def hist(loss0, loss1):
        return History(steps=[1], losses=[1.0], eval_steps=[0, 1],
                       metrics=[{"loss": loss0}, {"loss": loss1}])

    runs = [Run(qk_norm.variant_name(q, lr), s, hist(10 + s, lr * 10 + s + q))
            for q in (False, True) for lr in (0.1, 0.3) for s in (0, 1)]
    res = Results("qk_norm", {"lrs": [0.1, 0.3]}, "cpu", runs)
    np.testing.assert_allclose(qk_norm.by_lr(res, False, "loss"), [[1, 3], [2, 4]])
    np.testing.assert_allclose(qk_norm.by_lr(res, True, "loss", "initial"), [[10, 10], [11, 11]])
    np.testing.assert_allclose(qk_norm.by_lr(res, True, "loss", "max"), [[10, 10], [11, 11]])
    with pytest.raises(ValueError, match="stat"):
        qk_norm.by_lr(res, True, "loss", "median")


def test_compare_within_rounding_has_three_outcomes():
    f = qk_norm.compare_within_rounding
    assert f(np.array([0.031, 0.089, -0.007]), 0.027) == "undecided"  # chapter 11's case
    assert f(np.array([0.05, 0.09, 0.04]), 0.027) == "lower on every seed"
    assert f(np.array([0.05, -0.03, 0.04]), 0.027) == "higher on some seed"
    assert f(np.array([0.01]), 0.0) == "lower on every seed"
    assert f(np.array([0.0]), 0.0) == "undecided"  # a tie decides nothing
    with pytest.raises(ValueError, match="band must be"):
        f(np.array([0.1]), -0.1)
    with pytest.raises(ValueError, match="margin must be"):
        f(np.array([np.nan]), 0.1)


def test_qk_logit_bound_holds_for_any_gains():
    torch.manual_seed(0)
    model = Transformer(9, 16, 2, 2, 12, qk_norm=True)
    assert qk_norm.qk_logit_bound(model) == pytest.approx(math.sqrt(8), rel=1e-6)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # gains and biases of the q/k norms too
        model(torch.randint(0, 9, (4, 12)))
    seen = max(float(b.attn.last_max_logit) for b in model.blocks)
    assert math.sqrt(8) < seen <= qk_norm.qk_logit_bound(model)
    with pytest.raises(ValueError, match="qk_norm"):
        qk_norm.qk_logit_bound(Transformer(9, 16, 2, 1, 12))


def test_tiny_sweep_and_tiny_paper_run():
    cfg = qk_norm.get_config("quick", lrs=(0.01, 0.1), steps=2, eval_every=1, n_train=64,
                             n_test=16, size=4, d_model=16, n_heads=2, n_layers=1, seeds=(0,))
    res = qk_norm.run(cfg, device="cpu")
    assert res.variants == ["plain/lr0.01", "plain/lr0.1", "qk/lr0.01", "qk/lr0.1"]
    assert "logit_bound" in res.select("qk/lr0.1")[0].info
    assert "logit_bound" not in res.select("plain/lr0.1")[0].info
    assert qk_norm.by_lr(res, True, "max_logit").shape == (1, 2)
    paper = qk_norm.get_config("paper", lrs=(1e-3,), steps=2, warmup=1, eval_every=1,
                               n_train=32, n_test=8, batch_size=8, d_model=16, n_heads=2,
                               n_layers=1, checkpoint=False, seeds=(0,))
    assert len(qk_norm.run(paper, device="cpu").runs) == 2


def test_ln_impl_moves_the_runs_by_rounding_only():
    """ln_impl="autograd" (chapter 3's code) reaches the models; at a stable rate the runs
    agree with torch's kernel to rounding (chapter 11 uses it to measure what rounding moves)."""
    kw = dict(lrs=(0.01,), steps=3, eval_every=3, n_train=64, n_test=16, size=4, d_model=16,
              n_heads=2, n_layers=1, seeds=(0,), qk_norms=(True,))
    assert qk_norm.get_config("quick").ln_impl == "torch"
    taught = qk_norm.get_config("quick", ln_impl="autograd", **kw)
    assert qk_norm.model_config(taught, True, 8).ln_impl == "autograd"
    with pytest.raises(ValueError, match="ln_impl must be one of"):
        qk_norm.get_config("quick", ln_impl="fused")
    a = qk_norm.by_lr(qk_norm.run(taught, device="cpu"), True, "loss")
    b = qk_norm.by_lr(qk_norm.run(qk_norm.get_config("quick", **kw), device="cpu"), True, "loss")
    np.testing.assert_allclose(a, b, rtol=1e-5)


def _alone(cfg, run, model_config, lr, warmup=0, measure=None):
    """The run that seq_reference.train_transformer trains by itself, for one stacked copy."""
    task = make_task(cfg.task, cfg.n_train, cfg.n_test, cfg.size, cfg.symbols)
    job = Job.one(run.variant, None, run.seed)
    return train_transformer(job, model_config(task.seq_len), task, lr=lr, steps=cfg.steps,
                             batch_size=cfg.batch_size, eval_every=cfg.eval_every,
                             warmup=warmup, measure=measure)


def test_a_stacked_copy_is_the_run_trained_alone():
    """run trains every seed and rate at once; each copy starts from the model of its seed and
    follows the losses and evaluations of the run trained alone, to rounding."""
    cfg = qk_norm.get_config("quick", lrs=(0.01, 0.1), steps=4, eval_every=2, n_train=64,
                             n_test=16, size=4, d_model=16, n_heads=2, n_layers=1,
                             seeds=(0, 3))
    res = qk_norm.run(cfg, device="cpu")
    assert [r.seed for r in res.select("qk/lr0.1")] == [0, 3]
    for r in res.runs:
        qk, lr = r.variant.startswith("qk"), float(r.variant.split("/lr")[1])
        hist, info = _alone(cfg, r, lambda t, q=qk: qk_norm.model_config(cfg, q, t), lr)
        assert r.history.eval_steps == hist.eval_steps == [0, 2, 4]
        np.testing.assert_allclose(r.history.losses, hist.losses, rtol=0, atol=1e-5)
        for key in ("loss", "accuracy"):
            np.testing.assert_allclose(r.history.metric(key), hist.metric(key), atol=1e-5)
        # at initialization the models are the same: the same largest logit
        assert r.history.metric("max_logit")[0] == pytest.approx(
            hist.metric("max_logit")[0], rel=1e-5)
        assert r.info["diverged"] is info["diverged"] is False


def test_a_diverged_copy_is_reported_and_leaves_the_others_alone():
    """At an absurd rate the copies diverge: they are marked, their later evaluations repeat
    the model at initialization (the largest logit keeps its last value), and the copies at a
    sane rate train as they do without them."""
    kw = dict(steps=4, eval_every=2, n_train=64, n_test=16, size=4, d_model=16, n_heads=2,
              n_layers=1, seeds=(0, 1), qk_norms=(False,))
    both = qk_norm.run(qk_norm.get_config("quick", lrs=(0.01, 1e30), **kw), device="cpu")
    sane = qk_norm.run(qk_norm.get_config("quick", lrs=(0.01,), **kw), device="cpu")
    for a, b in zip(both.select("plain/lr0.01"), sane.select("plain/lr0.01"), strict=True):
        assert not a.info["diverged"]
        np.testing.assert_allclose(a.history.losses, b.history.losses, rtol=1e-6)
        np.testing.assert_allclose(a.history.metric("loss"), b.history.metric("loss"),
                                   rtol=1e-6)
    for r in both.select("plain/lr1e+30"):
        h = r.history
        assert r.info["diverged"] and r.info["diverged_at"] == len(h.losses) + 1
        assert all(math.isfinite(v) for v in h.losses)
        after = [m for s, m in zip(h.eval_steps, h.metrics, strict=True)
                 if s >= r.info["diverged_at"]]
        assert after and all(m["loss"] == h.metrics[0]["loss"] for m in after)
    sens = qk_norm.lr_sensitivity(qk_norm.by_lr(both, False, "loss"),
                                  qk_norm.by_lr(both, False, "loss", "initial"))
    assert np.all(np.isfinite(sens))


def test_p09_inputs_read_logits_sensitivity_and_rounding():
    from lnbook import ledger

    lrs = (0.01, 0.1)

    def results(rows: dict, lrs: tuple = lrs) -> Results:
        # rows[(qk, lr)]: per seed ((loss, max_logit) at the start, at the end)
        runs = [Run(qk_norm.variant_name(q, lr), s, History(eval_steps=[0, 9], metrics=[
            {"loss": a[0], "max_logit": a[1]}, {"loss": b[0], "max_logit": b[1]}]),
            {"diverged": False}) for (q, lr), per in rows.items()
            for s, (a, b) in enumerate(per)]
        return Results("qk_norm", {"lrs": list(lrs)}, "cpu", runs, {"baseline_loss": 3.0})

    res = results({
        (False, 0.01): [((4, 1), (2.0, 4)), ((4, 1), (2.0, 2))],
        (False, 0.1): [((4, 1), (3.0, 8)), ((4, 1), (2.2, 6))],
        (True, 0.01): [((4, 2), (2.0, 2)), ((4, 2), (2.0, 4))],
        (True, 0.1): [((4, 2), (2.2, 4)), ((4, 2), (2.6, 3))]})
    redo = results({(False, 0.1): [((4, 1), (2.8, 8)), ((4, 1), (2.2, 6))]}, (0.1,))
    got = qk_norm.p09_inputs(res, redo)
    v = got["values"]
    # qk over plain final logit: seed 0 max(2/4, 4/8) = 0.5; seed 1 max(4/2, 3/6) = 2
    np.testing.assert_allclose(v["lower logits"], [0.5, 2.0])
    # qk growth from 2 at the start: seed 0 max(1, 2) = 2; seed 1 max(2, 1.5) = 2
    np.testing.assert_allclose(v["bounded"], [2.0, 2.0])
    # sensitivity, mean over rates of loss minus the best: plain 0.5, 0.1; qk 0.1, 0.3;
    # the redo moves plain's seed 0 to 0.4: delta 0.1; (plain - qk) / delta = 4, -2
    np.testing.assert_allclose(v["less sensitive"], [4.0, -2.0])
    # both models end below 3.0 - 0.5 at the lowest rate on both seeds
    assert got["trivial_ok"]["bounded"].tolist() == [True, True]
    d = ledger.decide_claim("P09", **got)
    assert (d.parts["lower logits"].n_for, d.parts["lower logits"].n_against) == (1, 1)
