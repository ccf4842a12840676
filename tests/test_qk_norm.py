"""The qk-norm experiment (Part II, chapter 11): presets, learning-rate sensitivity, the
logit bound of qk-normalized attention, and a tiny sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import assert_same_runs

from lnbook.experiments import qk_norm
from lnbook.experiments.protocol import Results, Run
from lnbook.train import History
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
                               n_layers=1, checkpoint=False)
    assert len(qk_norm.run(paper, device="cpu", seeds=[0]).runs) == 2


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


def test_two_workers_give_the_same_runs():
    """workers=2 trains the runs in two processes; every run seeds itself, so nothing changes."""
    kw = dict(lrs=(0.1,), steps=2, eval_every=1, n_train=64, n_test=16, size=4, d_model=16,
              n_heads=2, n_layers=1, seeds=(0, 1))
    one = qk_norm.run(qk_norm.get_config("quick", **kw), device="cpu")
    two = qk_norm.run(qk_norm.get_config("quick", **kw, workers=2), device="cpu")
    assert_same_runs(one, two)
