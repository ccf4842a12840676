"""The RMSNorm experiment (Part II, chapter 8): presets, the RMS layer of Table 1, the
Pre-LN -> Pre-RMSNorm gaps, and a tiny sweep."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from seq_reference import train_transformer

from lnbook.analysis import PAPER_TABLE_1, invariance_changes, invariance_table
from lnbook.engine import Job
from lnbook.experiments import rmsnorm
from lnbook.experiments.seq_tasks import make_task


def test_presets_and_validation():
    quick, paper = rmsnorm.get_config("quick"), rmsnorm.get_config("paper")
    assert quick.norms == paper.norms == ("layer", "rms")
    assert paper.d_model == 512 and paper.n_layers == 6 and paper.checkpoint
    assert quick.seeds == 5  # the first five of the seed set in force when a run starts
    assert rmsnorm.get_config("quick", steps=3).steps == 3
    with pytest.raises(ValueError, match="norms"):
        rmsnorm.get_config("quick", norms=("batch",))
    with pytest.raises(ValueError, match="task"):
        rmsnorm.get_config("quick", task="copy")
    with pytest.raises(ValueError, match="unknown Config fields"):
        rmsnorm.get_config("quick", stepz=3)
    cfg = rmsnorm.model_config(quick, "rms", 16)
    assert cfg.norm == "rms" and cfg.position == "pre" and cfg.vocab_size == quick.symbols + 1


def test_rms_layer_is_the_formula_and_its_table_row():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(4, 5, generator=g,
                                                                            dtype=torch.float64)
    gain, bias = torch.rand(4, dtype=torch.float64) + 0.5, torch.randn(4, dtype=torch.float64)
    a = x @ w.T
    expected = gain * a / a.square().mean(1, keepdim=True).sqrt() + bias
    torch.testing.assert_close(rmsnorm.rms_normalized_layer(x, w, gain, bias), expected)
    row = invariance_table(seed=1, layers={"rms": rmsnorm.rms_normalized_layer})["rms"]
    assert row == {**PAPER_TABLE_1["layer"], "weight_matrix_recentering": False}
    changes = invariance_changes(seed=1, layers={"rms": rmsnorm.rms_normalized_layer})["rms"]
    assert changes["dataset_recentering"] > 0.05 and changes["single_case_rescaling"] < 1e-12


def test_prermsnorm_gaps_exact_in_float64_and_naive_swap_far():
    gaps = rmsnorm.prermsnorm_gaps(seed=2, d_model=16, n_heads=2, n_layers=2, seq_len=8)
    assert gaps["converted"] < 1e-12 and gaps["centred_logits"] < 1e-12
    assert gaps["mean_after"] < 1e-12 < 0.1 < gaps["mean_before"]
    assert gaps["naive"] > 1e-2
    g32 = rmsnorm.prermsnorm_gaps(seed=2, d_model=16, n_heads=2, n_layers=2, seq_len=8,
                                  dtype=torch.float32)
    assert g32["converted"] < 1e-5


def test_tiny_sweep_and_tiny_paper_run():
    cfg = rmsnorm.get_config("quick", steps=2, eval_every=1, n_train=64, n_test=16, size=4,
                             d_model=16, n_heads=2, n_layers=1, seeds=(0, 1))
    res = rmsnorm.run(cfg, device="cpu")
    assert res.variants == ["layer", "rms"] and res.seeds == [0, 1]
    assert res.final("rms", "loss").shape == (2,)
    assert res.info["baseline_loss"] < res.info["uniform_loss"]
    paper = rmsnorm.get_config("paper", steps=1, eval_every=1, n_train=32, n_test=8,
                               batch_size=8, d_model=16, n_heads=2, n_layers=1,
                               checkpoint=False, seeds=(0,))
    res = rmsnorm.run(paper, device="cpu")
    assert res.config["symbols"] == 64 and len(res.runs) == 2
    with pytest.raises(TypeError, match="rmsnorm.Config"):
        rmsnorm.run({"steps": 1})


def test_a_stacked_copy_is_the_run_trained_alone():
    """run trains every seed of a norm at once; each copy is the run that train_transformer
    trains alone (the same model of its seed, the same batches), to rounding."""
    cfg = rmsnorm.get_config("quick", steps=4, eval_every=2, n_train=64, n_test=16, size=4,
                             d_model=16, n_heads=2, n_layers=1, seeds=(0, 4))
    res = rmsnorm.run(cfg, device="cpu")
    task = make_task(cfg.task, cfg.n_train, cfg.n_test, cfg.size, cfg.symbols)
    for r in res.runs:
        job = Job.one(r.variant, None, r.seed)
        hist, _ = train_transformer(job, rmsnorm.model_config(cfg, r.variant, task.seq_len),
                                    task, lr=cfg.lr, steps=cfg.steps,
                                    batch_size=cfg.batch_size, eval_every=cfg.eval_every)
        assert r.history.eval_steps == hist.eval_steps == [0, 2, 4]
        np.testing.assert_allclose(r.history.losses, hist.losses, rtol=0, atol=1e-5)
        np.testing.assert_allclose(r.history.metric("loss"), hist.metric("loss"), atol=1e-5)
