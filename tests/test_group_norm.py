"""lnbook.experiments.group_norm: ghost batch norm against torch, the four sets, the sweep."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lnbook import GroupNorm, layer_norm
from lnbook.experiments import EXPERIMENTS
from lnbook.experiments import group_norm as gn


def test_registered_with_presets():
    assert EXPERIMENTS["group_norm"] is gn
    quick, paper = gn.get_config("quick"), gn.get_config("paper")
    assert quick.norms == ("batch", "group") and quick.bn_batches == (2, 8, 32)
    assert paper.norms == gn.NORMS and paper.bn_batches == (2, 4, 8, 16, 32)
    assert paper.groups == 32 and paper.channels % paper.groups == 0
    assert gn.get_config("quick", steps=7).steps == 7
    with pytest.raises(ValueError, match="divide batch"):
        gn.get_config("quick", bn_batches=(3,))
    with pytest.raises(ValueError, match="include 'batch'"):
        gn.get_config("quick", norms=("group",))
    with pytest.raises(ValueError, match="groups=5"):
        gn.get_config("quick", groups=5)
    with pytest.raises(ValueError, match="unknown Config fields"):
        gn.get_config("quick", stepz=3)


def _pair(num_features: int = 3):
    torch.manual_seed(0)
    ours = gn.GhostBatchNorm(num_features, batch_size=4).double()
    theirs = torch.nn.BatchNorm2d(num_features).double()
    with torch.no_grad():
        w, b = torch.randn(num_features).double(), torch.randn(num_features).double()
        ours.weight.copy_(w), ours.bias.copy_(b), theirs.weight.copy_(w), theirs.bias.copy_(b)
    return ours, theirs


def test_ghost_batch_norm_over_the_whole_batch_is_torch_batch_norm():
    ours, theirs = _pair()
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64) * 2 + 1
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(ours.running_mean, theirs.running_mean)
    torch.testing.assert_close(ours.running_var, theirs.running_var)
    ours.eval(), theirs.eval()
    torch.testing.assert_close(ours(x), theirs(x))


def test_ghost_batch_norm_normalizes_each_group_on_its_own():
    ours, _ = _pair()
    ours.batch_size = 2
    x = torch.randn(6, 3, 4, 4, dtype=torch.float64)
    y = ours(x)
    for k in range(3):
        chunk = x[2 * k : 2 * k + 2]
        ref = F.batch_norm(chunk, None, None, ours.weight, ours.bias, training=True, eps=1e-5)
        torch.testing.assert_close(y[2 * k : 2 * k + 2], ref)
    # the running averages move towards the mean over the groups of their statistics
    xg = x.view(3, 2, 3, 4, 4)
    mean = xg.mean(dim=(1, 3, 4)).mean(0)
    var = (xg.var(dim=(1, 3, 4), unbiased=True)).mean(0)
    torch.testing.assert_close(ours.running_mean, 0.1 * mean)
    torch.testing.assert_close(ours.running_var, 0.9 + 0.1 * var)


def test_ghost_batch_norm_errors():
    with pytest.raises(ValueError, match="batch_size"):
        gn.GhostBatchNorm(3, batch_size=1)
    bn = gn.GhostBatchNorm(3, batch_size=4)
    with pytest.raises(ValueError, match="groups of batch_size=4"):
        bn(torch.randn(6, 3, 2, 2))
    with pytest.raises(ValueError, match=r"\(N, 3, H, W\)"):
        bn(torch.randn(4, 5, 2, 2))
    assert "batch_size=4" in repr(bn)


def test_convnet_norms_and_shapes():
    x = torch.rand(8, 1, 8, 8)
    for norm in gn.NORMS:
        net = gn.ConvNet(norm, channels=8, groups=2, bn_batch=4)
        assert net(x).shape == (8, 10)
    layer, inst = gn.ConvNet("layer", 8, 2), gn.ConvNet("instance", 8, 2)
    assert isinstance(layer.norm1, GroupNorm) and layer.norm1.num_groups == 1
    assert inst.norm2.num_groups == 8
    assert gn.ConvNet("batch", 8, 2, bn_batch=2).norm1.batch_size == 2
    with pytest.raises(ValueError, match="norm must be"):
        gn.ConvNet("weight")
    with pytest.raises(ValueError, match="groups=3"):
        gn.ConvNet("group", channels=8, groups=3)
    with pytest.raises(ValueError, match=r"\(N, 1, 8, 8\)"):
        gn.ConvNet("group", 8, 2)(torch.rand(2, 64))


def test_normalize_matches_torch_and_lnbook():
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(gn.normalize("batch", x),
                               F.batch_norm(x, None, None, training=True, eps=1e-5))
    torch.testing.assert_close(gn.normalize("layer", x), layer_norm(x, (4, 5, 5)))
    torch.testing.assert_close(gn.normalize("instance", x), F.instance_norm(x, eps=1e-5))
    torch.testing.assert_close(gn.normalize("group", x, groups=2), F.group_norm(x, 2, eps=1e-5))
    with pytest.raises(ValueError, match="kind"):
        gn.normalize("weight", x)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        gn.normalize("layer", x[0])


@pytest.mark.parametrize("kind, expected", [
    ("batch", lambda s: s[:, 2].all() and s.sum() == 3 * 2 * 2),
    ("layer", lambda s: s[1].all() and s.sum() == 6 * 2 * 2),
    ("instance", lambda s: s[1, 2].all() and s.sum() == 2 * 2),
    ("group", lambda s: s[1, 2:4].all() and s.sum() == 2 * 2 * 2),
])
def test_statistics_set_is_the_definition(kind, expected):
    s = gn.statistics_set(kind, (3, 6, 2, 2), (1, 2, 0, 0), groups=3)
    assert s.dtype == torch.bool and s.shape == (3, 6, 2, 2)
    assert expected(s)


def test_run_tiny_and_paper_override():
    cfg = gn.get_config("quick", steps=2, eval_every=1, batch_size=4, bn_batches=(2, 4),
                        seeds=(0,), channels=8, groups=2)
    res = gn.run(cfg, device="cpu")
    assert res.variants == ["batch/bs2", "batch/bs4", "group"]
    assert res.runs[0].history.eval_steps == [0, 1, 2]
    assert 0.8 < res.info["majority_error"] < 0.95 and res.info["n_test"] == 359
    for v in res.variants:
        err = res.final(v, "test_error")
        assert err.shape == (1,) and 0 <= err[0] <= 1
        assert math.isfinite(res.final(v, "test_nll")[0])
    paper = gn.get_config("paper", steps=1, eval_every=1, batch_size=4, bn_batches=(2,),
                          seeds=(0,))
    res = gn.run(paper, device="cpu")
    assert res.variants == ["batch/bs2", "group", "layer", "instance"]
    with pytest.raises(TypeError, match="group_norm.Config"):
        gn.run({"scale": "quick"})


def test_p07_inputs_read_the_final_test_errors():
    import numpy as np

    from lnbook import ledger
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run
    from lnbook.experiments import group_norm as G

    # final test errors of seeds 0-2; the majority class errs 0.9, so the bar is 0.4
    final = {"batch/bs2": [0.30, 0.20, 0.35], "batch/bs32": [0.10, 0.25, 0.10],
             "group": [0.15, 0.10, 0.45]}
    runs = [Run(v, s, History(eval_steps=[0, 9], metrics=[{"test_error": 0.9},
                                                           {"test_error": e}]), {})
            for v, errs in final.items() for s, e in enumerate(errs)]
    res = Results("group_norm", {}, "cpu", runs, {"majority_error": 0.9})
    assert G.p07_left(res).tolist() == [True, True, False]  # seed 2's GN errs 0.45
    got = G.p07_inputs(res, 3e-16)
    v = got["values"]
    assert v["batch independence"] == [3e-16]
    np.testing.assert_allclose(v["BN falls at small batches"], [0.20, -0.05, 0.25])
    np.testing.assert_allclose(v["GN beats BN at batch 2"], [-0.15, -0.10, 0.10])
    d = ledger.decide_claim("P07", **got)
    # seed 2 is masked on both seed parts (margin 0.003): GN lower on seeds 0 and 1, BN
    # falls on seed 0 and rises on seed 1
    assert (d.parts["GN beats BN at batch 2"].n_for,
            d.parts["GN beats BN at batch 2"].n_against) == (2, 0)
    assert (d.parts["BN falls at small batches"].n_for,
            d.parts["BN falls at small batches"].n_against) == (1, 1)
    assert d.parts["batch independence"].outcome == "holds"
