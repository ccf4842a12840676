"""The curse-of-depth experiment (Part III, chapter 15): presets, per-block measurements
against direct computations, and a tiny run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lnbook.experiments import EXPERIMENTS, depth
from lnbook.experiments.seq_tasks import make_task
from lnbook.transformer import Transformer, TransformerConfig, sequence_loss


def test_presets_names_and_validation():
    quick, paper = depth.get_config("quick"), depth.get_config("paper")
    assert quick.n_layers == 8 and quick.d_model == 16 and quick.seeds == 5
    assert paper.n_layers == 32 and paper.d_model == 512 and paper.n_dirs == 16
    assert EXPERIMENTS["depth"] is depth
    assert depth.model_config(quick, True, 12).depth_scaling
    with pytest.raises(ValueError, match="n_layers"):
        depth.get_config("quick", n_layers=1)
    with pytest.raises(ValueError, match="lr"):
        depth.get_config("quick", lr=0.0)
    with pytest.raises(TypeError, match="depth.Config"):
        depth.run(object())


def model64(**fields):
    torch.manual_seed(0)
    cfg = TransformerConfig(9, 16, 2, 3, 8, **fields)
    return Transformer(cfg, dtype=torch.float64)


def test_removal_costs_against_a_model_without_the_block():
    model = model64()
    x = torch.randint(0, 9, (6, 8))
    y = torch.randint(0, 8, (6, 8))
    costs = depth.removal_costs(model, x, y)
    with torch.no_grad():
        full = float(sequence_loss(model(x), y))
        del model.blocks[1]  # a model without block 2
        without = float(sequence_loss(model(x), y))
    assert len(costs) == 3
    assert abs(costs[1] - (without - full)) < 1e-12


def test_jacobian_distance_against_the_full_jacobian():
    """||Jv - v|| / ||v|| with the Jacobian built column by column by torch.autograd."""
    model = model64(depth_scaling=True)
    x = torch.randint(0, 9, (1, 4))
    got = depth.jacobian_distance(model, x, n_dirs=3, seed=5)
    h = model.embed(x).detach()  # (1, 4, 16), block 1's input
    jac = torch.autograd.functional.jacobian(model.blocks[0], h).reshape(64, 64)
    g = torch.Generator().manual_seed(5)
    want = []
    for _ in range(3):
        v = torch.randn(h.shape, generator=g, dtype=h.dtype).reshape(64)
        want.append(float((jac @ v - v).norm() / v.norm()))
    assert abs(got[0] - np.mean(want)) < 1e-10
    # a block whose branches output zero is the identity: distance 0
    with torch.no_grad():
        for blk in model.blocks:
            for lin in (blk.attn.out_proj, blk.mlp.fc2):
                lin.weight.zero_()
                lin.bias.zero_()
    assert max(depth.jacobian_distance(model, x, n_dirs=1)) == 0.0


def test_tiny_run_layout_and_halves():
    cfg = depth.get_config("quick", steps=2, eval_every=1, n_train=64, n_test=16, n_eval=8,
                           size=4, n_layers=3, seeds=(0, 1), n_dirs=1)
    res = depth.run(cfg)
    assert res.variants == ["pre", "scaled"] and res.seeds == [0, 1]
    for what in ("variance", "removal", "jacobian"):
        assert depth.per_block(res, "scaled", what).shape == (2, 3)
    with pytest.raises(ValueError, match="what"):
        depth.per_block(res, "pre", "gradient")
    early, deep = depth.halves(np.array([[1.0, 5.0, 3.0], [2.0, 0.0, 4.0]]))
    np.testing.assert_array_equal(early, [1.0, 2.0])
    np.testing.assert_array_equal(deep, [3.0, 4.0])
    # Results.info holds the trivial baseline of the task the runs trained on
    task = make_task(cfg.task, cfg.n_train, cfg.n_test, cfg.size, cfg.symbols)
    assert res.info["baseline_loss"] == task.baseline_loss
