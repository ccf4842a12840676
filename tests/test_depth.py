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


def _depth_results():
    """Two seeds of both variants, four blocks: the stream's variance after each block (the
    embeddings' first), the removal cost and the Jacobian distance of each block, final loss."""
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run

    per_seed = {  # variant -> seed -> (variances, removal, jacobian, final loss)
        "pre": [([1.0, 2.0, 3.0, 4.0, 30.0], [0.9, 0.3, 0.02, 0.04], [0.5, 0.3, 0.1, 0.1], 0.5),
                ([1.0, 2.0, 4.0, 5.0, 4.0], [0.8, 0.2, 0.3, 0.3], [0.4, 0.2, 0.3, 0.1], 1.7)],
        "scaled": [([1.0, 2.0, 2.5, 2.8, 3.0], [0.9, 0.1, 0.0, 0.0], [0.6, 0.2, 0.2, 0.0], 0.4),
                   ([1.0, 1.5, 2.0, 2.0, 0.4], [0.7, 0.1, 0.1, 0.1], [0.5, 0.1, 0.1, 0.3], 0.6)]}
    runs = []
    for v, seeds in per_seed.items():
        for s, (var, removal, jac, loss) in enumerate(seeds):
            last = {"loss": loss, **{f"var_{k}": x for k, x in enumerate(var)}}
            h = History(eval_steps=[0, 60], metrics=[{"loss": 2.0, **{
                f"var_{k}": 1.0 for k in range(5)}}, last])
            runs.append(Run(v, s, h, {"removal": removal, "jacobian": jac}))
    return Results("depth", {}, "cpu", runs, {"baseline_loss": 1.8})


def test_p17_inputs_read_the_pre_ln_model_by_halves():
    from lnbook import ledger

    res = _depth_results()
    got = depth.p17_inputs(res)
    v = got["values"]
    # last block over block L // 2 = 2 (column 1 of the blocks): 30 / 3 and 4 / 4
    np.testing.assert_allclose(v["variance grows with depth"], [1.0, 0.0], atol=1e-12)
    # deep half minus early half: (0.03 - 0.6), (0.3 - 0.5); Jacobians (0.1 - 0.4), (0.2 - 0.3)
    np.testing.assert_allclose(v["deep blocks cost less to remove"], [-0.57, -0.2], atol=1e-12)
    np.testing.assert_allclose(v["deep Jacobians nearer the identity"], [-0.3, -0.1],
                               atol=1e-12)
    # seed 1's Pre-LN model ends at 1.7, within 0.2 of the unigram's 1.8
    for part in v:
        assert got["trivial_ok"][part].tolist() == [True, False]
    assert depth.left_trivial(res)["scaled"].tolist() == [True, True]
    d = ledger.decide_claim("P17", **got)
    # seed 0 counts for every part; seed 1 is out, so none reaches its majority
    assert all((p.n_for, p.n_against, p.outcome) == (1, 0, "undecided")
               for p in d.parts.values())


def test_p18_inputs_compare_the_scaled_model_seed_by_seed():
    res = _depth_results()
    got = depth.p18_inputs(res)
    v = got["values"]
    np.testing.assert_allclose(v["limits the growth"], [1.0, 1.0], atol=1e-12)  # 30/3, 4/0.4
    # deep half's Jacobian distance, scaled minus Pre-LN: 0.1 - 0.1, 0.2 - 0.2
    np.testing.assert_allclose(v["deep blocks contribute more"], [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(v["lower loss"], [-0.1, -1.1], atol=1e-12)
    for part in v:  # both models must leave the trivial phase
        assert got["trivial_ok"][part].tolist() == [True, False]
