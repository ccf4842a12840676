"""The Peri-LN experiment (Part III, chapter 14) and the stacked training it runs on."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lnbook.experiments import EXPERIMENTS, peri_ln, stacked
from lnbook.experiments.seq_tasks import make_task
from lnbook.transformer import Transformer, TransformerConfig, residual_stream, sequence_loss


def tiny_task():
    return make_task("sort", 64, 16, 4, 8)


def test_presets_names_and_validation():
    quick, paper = peri_ln.get_config("quick"), peri_ln.get_config("paper")
    assert quick.n_layers == 6 and quick.lrs == (1e-2, 3e-2, 1e-1) and quick.seeds == 5
    assert paper.n_layers == 24 and paper.d_model == 512 and paper.steps == 10_000
    assert peri_ln.variant_name("peri", 0.03) == "peri/lr0.03"
    assert EXPERIMENTS["peri_ln"] is peri_ln
    with pytest.raises(ValueError, match="increasing"):
        peri_ln.get_config("quick", lrs=(0.1, 0.01))
    with pytest.raises(ValueError, match="post_lr"):
        peri_ln.get_config("quick", post_lr=0.0)
    with pytest.raises(TypeError, match="peri_ln.Config"):
        peri_ln.run(object())
    tiny = peri_ln.get_config("quick", steps=1, eval_every=1, lrs=(1e-2,), n_train=16,
                              n_test=4, n_eval=4, size=2, n_layers=1, seeds=(0,))
    assert peri_ln.run(tiny, device="cpu").device == "cpu"
    if not torch.cuda.is_available():  # the copies train on the device asked for, if it exists
        with pytest.raises(ValueError, match="no CUDA GPU"):
            peri_ln.run(tiny, device="cuda")
    post = peri_ln.model_config(quick, "post", 12)
    assert post.position == "post" and not post.has_final_norm()


def test_stream_forward_is_the_model_and_its_residual_stream():
    torch.manual_seed(0)
    cfg = TransformerConfig(9, 16, 2, 3, 8, position="peri")
    model = Transformer(cfg, dtype=torch.float64)
    idx = torch.randint(0, 9, (4, 8))
    with torch.no_grad():
        logits, var = stacked.stream_forward(model, idx)
    torch.testing.assert_close(logits, model(idx).detach(), rtol=0, atol=0)
    want = torch.stack([x.var() for x in residual_stream(model, idx)])  # (L + 1,)
    torch.testing.assert_close(var, want, rtol=1e-12, atol=0)


def test_train_stacked_equals_one_model_trained_alone_in_float64():
    task = tiny_task()
    cfg = TransformerConfig(9, 16, 2, 2, task.seq_len, position="peri")
    torch.set_default_dtype(torch.float64)
    try:
        runs = stacked.train_stacked(cfg, task, [0, 1], [1e-2, 3e-2], steps=4, batch_size=8,
                                     eval_every=2)
        torch.manual_seed(1)
        model = Transformer.from_config(cfg)
        opt = torch.optim.Adam(model.parameters(), lr=3e-2)
        rows = stacked.batch_indices(1, len(task.x), 4, 8)
        for s in range(4):
            loss = sequence_loss(model(task.x[rows[s]]), task.y[rows[s]])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_default_dtype(torch.float32)
    run = runs[3]  # rate 3e-2, seed 1 (rates first)
    assert run.info == {"seed": 1, "lr": 3e-2, "diverged": False, "diverged_at": None}
    assert run.history.eval_steps == [0, 2, 4] and run.history.steps == [1, 2, 3, 4]
    assert math.isclose(run.history.losses[-1], float(loss.detach()), rel_tol=1e-10)
    for a, b in zip(run.model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a.double(), b.detach(), rtol=0, atol=1e-10)
    with torch.no_grad():
        held = float(sequence_loss(model(task.x_test), task.y_test))
    assert math.isclose(run.history.metrics[-1]["loss"], held, rel_tol=1e-6)


def test_train_stacked_marks_a_diverged_copy_and_keeps_the_others():
    task = tiny_task()
    cfg = TransformerConfig(9, 16, 2, 1, task.seq_len)
    runs = stacked.train_stacked(cfg, task, [0], [1e-3, 1e30], steps=3, batch_size=8,
                                 eval_every=1)
    assert not runs[0].info["diverged"] and runs[1].info["diverged"]
    assert runs[1].history.metrics[-1] == runs[1].history.metrics[0]  # counted at its start
    with pytest.raises(ValueError, match="learning rates"):
        stacked.train_stacked(cfg, task, [0], [-1.0], steps=1, batch_size=2, eval_every=1)


def test_tiny_run_layout_and_stream_variance():
    cfg = peri_ln.get_config("quick", steps=2, eval_every=1, lrs=(1e-2, 3e-2), n_train=64,
                             n_test=16, n_eval=16, size=4, n_layers=2, seeds=(0, 1))
    res = peri_ln.run(cfg)
    assert res.variants == ["pre/lr0.01", "pre/lr0.03", "peri/lr0.01", "peri/lr0.03",
                            "post/lr0.01"]
    assert peri_ln.final_by_lr(res, "pre").shape == (2, 2)
    v0 = peri_ln.stream_variance(res, "post/lr0.01", step=0)  # (seeds, L + 1)
    assert v0.shape == (2, 3)
    np.testing.assert_allclose(v0[:, 1:], 1.0, atol=0.05)  # Post-LN: each block ends in a norm
    # Peri-LN at initialization: each sublayer adds a unit-variance norm output
    vp = peri_ln.stream_variance(res, "peri/lr0.01", step=0)
    # (about 4 in expectation; 16 short sequences give a rough estimate)
    assert np.all((vp[:, 2] - vp[:, 0] > 2) & (vp[:, 2] - vp[:, 0] < 6))


def test_rise_to_top():
    loss = np.array([[0.5, 0.7, 1.4], [0.9, 0.6, 0.6], [0.4, np.inf, np.nan], [np.nan] * 3])
    rise = peri_ln.rise_to_top(loss)
    np.testing.assert_allclose(rise[:2], [0.9, 0.0])
    assert rise[2] == np.inf and np.isnan(rise[3])
    with pytest.raises(ValueError, match="seeds, rates"):
        peri_ln.rise_to_top(np.zeros(3))
