"""The batch-noise experiment of chapter 2 (claim C03's fourth part) and C03's inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lnbook import ledger
from lnbook.engine import History, Results
from lnbook.engine.results import Run
from lnbook.experiments import batch_noise as BN
from lnbook.functional import batch_normalize


def test_batch_normalize_is_torch_batch_norm_and_reads_the_reference_rows():
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(16, 5, generator=g, dtype=torch.float64) + 2  # (16, 5)
    want = torch.nn.functional.batch_norm(x, None, None, training=True, eps=1e-5)
    torch.testing.assert_close(batch_normalize(x), want, rtol=0, atol=1e-12)
    ref = torch.randn(40, 5, generator=g, dtype=torch.float64) - 1  # (40, 5)
    mu = ref.sum(0) / 40  # float64 reference, written out
    var = ((ref - mu) ** 2).sum(0) / 40
    torch.testing.assert_close(batch_normalize(x, ref), (x - mu) / (var + 1e-5).sqrt(),
                               rtol=0, atol=1e-12)


def test_stats_mlp_with_a_reference_forgets_the_batch_mates():
    torch.manual_seed(0)
    model = BN.StatsMLP(6, 8, 2, 3).double()
    x, ref = torch.randn(5, 6, dtype=torch.float64), torch.randn(30, 6, dtype=torch.float64)
    torch.testing.assert_close(model(x[:1], ref), model(x, ref)[:1], rtol=0, atol=1e-12)
    alone, mates = model(x[:2]), model(x)  # mini-batch statistics: the batch-mates matter
    assert (alone - mates[:2]).abs().max() > 1e-3
    assert model(x).shape == (5, 3)


def test_teacher_task_noisy_training_labels_clean_test_labels():
    cfg = BN.get_config(n_train=2000, n_test=500, label_noise=0.3)
    task = BN.teacher_task(cfg)
    assert task["x"].shape == (2000, 16) and task["x_test"].shape == (500, 16)
    clean = BN.teacher_task(BN.get_config(n_train=2000, n_test=500, label_noise=0.0))
    torch.testing.assert_close(task["x"], clean["x"])
    assert torch.equal(task["y_test"], clean["y_test"])
    changed = float((task["y"] != clean["y"]).double().mean())
    assert 0.18 < changed < 0.27  # 30% redrawn, a quarter of them to the same class


def test_the_stacked_seeds_train_as_each_seed_alone():
    cfg = BN.get_config(steps=12, eval_every=6, n_test=64, seeds=(3, 7))
    both = BN.run(cfg, device="cpu")
    alone = BN.run(BN.get_config(steps=12, eval_every=6, n_test=64, seeds=(7,)), device="cpu")
    for arm in BN.ARMS:
        b, a = both.select(arm)[1].history, alone.select(arm)[0].history
        np.testing.assert_allclose(b.losses, a.losses, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b.metric("test_error"), a.metric("test_error"), atol=1e-6)
    assert both.info["majority_error"] > 0.3 and both.info["prior_nll"] > 1.0


def test_config_refuses_what_cannot_train():
    with pytest.raises(ValueError, match="arms"):
        BN.get_config(arms=("batch", "ghost"))
    with pytest.raises(ValueError, match="label_noise"):
        BN.get_config(label_noise=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        BN.get_config(batch_size=1)


def test_c03_inputs_from_measurements_and_a_hand_built_run():
    sizes = [2, 4, 8, 16, 64, 256]
    spreads = [[0.9, 0.5, 0.3, 0.2, 0.1, 0.05],  # falls, 10-fold from B=4 to 256: for
               [0.9, 0.5, 0.6, 0.2, 0.1, 0.05],  # rises at B=8: against
               [0.9, 0.5, 0.3, 0.2, 0.16, 0.15]]  # falls, 3.3-fold only: against
    # final held-out errors; the majority class errs 0.7, so the bar is 0.6
    final = {"batch": [0.30, 0.33, 0.40, 0.30, 0.65], "full": [0.34, 0.33, 0.30, 0.31, 0.30]}
    runs = [Run(a, s, History(eval_steps=[0, 9], metrics=[{"test_error": 0.7},
                                                           {"test_error": e}]), {})
            for a, errs in final.items() for s, e in enumerate(errs)]
    res = Results("batch_noise", {}, "cpu", runs, {"majority_error": 0.7})
    assert BN.left_trivial(res).tolist() == [True, True, True, True, False]
    got = BN.c03_inputs(spreads, sizes, [0.2, 0.3, 0.0001], True, [1.0, 0.9995, 0.99], res)
    v = got["values"]
    assert v["depends on batch-mates, less as B grows"] == [True, False, False]
    assert v["breaks down at tiny batches"] == [True, True, False]
    np.testing.assert_allclose(v["batch noise regularizes"], [0.04, 0.0, -0.10, 0.01, -0.35])
    d = ledger.decide_claim("C03", **got)
    # relative margin 5% of the full arm's error: 0.04 > 0.017 for; 0.0 and 0.01 within
    # (0.0165, 0.0155); -0.10 against; seed 4 masked (batch arm at 0.65 > 0.6)
    part = d.parts["batch noise regularizes"]
    assert (part.n_for, part.n_against, part.outcome) == (1, 1, "undecided")
    assert d.parts["needs running averages"].n_for == 2  # 0.0001 is not above 0.001


def test_c03_reads_both_arms_and_names_a_missing_one():
    runs = [Run("batch", 0, History(eval_steps=[0], metrics=[{"test_error": 0.3}]), {})]
    res = Results("batch_noise", {}, "cpu", runs, {"majority_error": 0.7})
    with pytest.raises(ValueError, match=r"lack \['full'\]"):
        BN.left_trivial(res)
    with pytest.raises(ValueError, match="run with arms"):
        BN.c03_inputs([[0.9, 0.1]], [4, 256], [0.2], True, [1.0], res)
