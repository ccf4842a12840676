"""lnbook.experiments.attention_geometry: projection, scaling, un-selectable keys, majority."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import linprog

from lnbook.experiments import EXPERIMENTS
from lnbook.experiments import attention_geometry as ag
from lnbook.seeds import verdict_seeds


def _lp_selectable(k: np.ndarray, i: int) -> bool:
    """Independent reference: a query q with q.(k_i - k_j) >= t > 0 for all j != i exists."""
    diff = k[i] - np.delete(k, i, axis=0)
    n, d = diff.shape
    res = linprog(np.r_[np.zeros(d), -1.0], A_ub=np.hstack([-diff, np.ones((n, 1))]),
                  b_ub=np.zeros(n), bounds=[(-1, 1)] * d + [(None, 1e3)], method="highs")
    return -res.fun > 1e-7


def test_registered_with_presets():
    assert EXPERIMENTS["attention_geometry"] is ag
    quick, paper = ag.get_config("quick"), ag.get_config("paper")
    assert quick.norms == ("layer", "projection", "none") and quick.seeds == 60
    assert paper.d_model > quick.d_model and paper.steps > quick.steps
    with pytest.raises(ValueError, match="norms must be drawn from"):
        ag.get_config("quick", norms=("batch",))
    with pytest.raises(ValueError, match="symbols >= 2"):
        ag.get_config("quick", symbols=1)
    with pytest.raises(ValueError, match="unknown Config fields"):
        ag.get_config("quick", width=3)


def test_projection_and_scaling_make_layer_norm():
    x = torch.randn(5, 7, dtype=torch.float64) * 3 + 2
    p = ag.project(x)
    assert p.sum(-1).abs().max() < 1e-12  # orthogonal to the all-ones vector
    s = ag.scale(p)
    assert torch.allclose(s.norm(dim=-1), torch.full((5,), math.sqrt(7), dtype=torch.float64))
    assert torch.allclose(ag.normalize(x, "layer", eps=0.0), F.layer_norm(x, (7,), eps=0.0))
    assert torch.allclose(ag.normalize(x, "layer"), F.layer_norm(x, (7,), eps=1e-5))
    assert ag.normalize(x, "none") is x
    with pytest.raises(ValueError, match="norm must be one of"):
        ag.normalize(x, "rms")


def test_unselectable_by_hand_and_against_a_linear_programme():
    k = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, 0.2], [0.5, 0.1]])
    # (0, 0.2) and (0.5, 0.1) lie inside the triangle of the first three
    assert ag.unselectable(k).tolist() == [False, False, False, True, True]
    assert ag.unselectable(torch.tensor([[1.0, 2.0], [1.0, 2.0]])).tolist() == [True, True]
    g = torch.Generator().manual_seed(3)
    keys = ag.random_keys(40, 4, g)["none"].numpy()
    mask = ag.unselectable(keys)
    assert 0 < mask.sum() < 40
    assert [not _lp_selectable(keys, i) for i in range(40)] == mask.tolist()
    with pytest.raises(ValueError, match="n >= 2"):
        ag.unselectable(torch.ones(1, 3))


def test_keys_on_a_sphere_are_all_selectable():
    g = torch.Generator().manual_seed(0)
    keys = ag.random_keys(64, 6, g)
    assert not ag.unselectable(keys["layer"]).any()  # an ellipsoid: every point extreme
    assert ag.unselectable(keys["projection"]).any()


def test_majority_task_targets_are_unique_majorities():
    x, y = ag.majority_task(200, 9, 4, seed=5)
    assert x.shape == (200, 9) and y.shape == (200,)
    counts = F.one_hot(x, 4).sum(1)
    top = counts.topk(2, dim=1).values
    assert bool((top[:, 0] > top[:, 1]).all()) and torch.equal(counts.argmax(1), y)
    x2, y2 = ag.majority_task(200, 9, 4, seed=5)
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_model_by_hand():
    torch.manual_seed(0)
    m = ag.MajorityAttention(2, symbols=3, length=4, d_model=5, norm="projection").double()
    x = torch.randint(3, (2, 6, 4))
    out = m(x)
    assert out.shape == (2, 6, 3)
    s, b = 1, 2  # model 1, sequence 2, written out
    ids = list(x[s, b]) + [3]
    h = torch.stack([m.tok[s, t] + m.pos[s, j] for j, t in enumerate(ids)])  # (5, d)
    z = h - h.mean(-1, keepdim=True)
    att = torch.softmax((z[-1] @ m.w_q[s]) @ (z @ m.w_k[s]).T / math.sqrt(5), dim=-1)
    assert torch.allclose(out[s, b], (att @ (z @ m.w_v[s])) @ m.w_o[s])
    assert "norm='projection'" in repr(m)


def test_tiny_run_matches_a_single_seed_run():
    cfg = ag.get_config("quick", steps=6, eval_every=3, n_train=64, n_test=32, seeds=(0, 1),
                        norms=("layer", "none"))
    res = ag.run(cfg)
    assert res.variants == ["layer", "none"] and res.seeds == [0, 1]
    alone = ag.run(ag.get_config("quick", steps=6, eval_every=3, n_train=64, n_test=32,
                                 seeds=(1,), norms=("layer",)))
    a = res.select("layer")[1].history
    b = alone.select("layer")[0].history
    assert a.eval_steps == [0, 3, 6] and np.allclose(a.losses, b.losses, atol=1e-5)
    assert res.final("none", "accuracy").shape == (2,)
    assert ag.learning_speed(res, "layer").shape == (2,)
    speed = ag.learning_speed(res, "layer")
    assert ag.learning_speed(res, "layer", 2) == pytest.approx(speed.mean())  # one group
    assert res.select("layer")[0].info["n_keys"] == cfg.symbols * cfg.length
    with pytest.raises(TypeError, match="attention_geometry.Config"):
        ag.run({"steps": 3})


def test_a_run_goes_through_the_sweep_and_continues_from_its_checkpoints(tmp_path):
    kw = dict(eval_every=3, n_train=64, n_test=32, seeds=2, norms=("layer", "none"))
    whole = ag.run(ag.get_config("quick", steps=6, **kw), device="cpu")
    assert whole.seeds == list(verdict_seeds(2)) and whole.config["seeds"] == whole.seeds
    ag.run(ag.get_config("quick", steps=3, checkpoint=True, **kw), device="cpu", out=tmp_path)
    assert len(list((tmp_path / "checkpoints").rglob("*.pt"))) == 2  # one stack per norm
    longer = ag.run(ag.get_config("quick", steps=6, checkpoint=True, **kw), device="cpu",
                    out=tmp_path)
    for a, b in zip(whole.runs, longer.runs, strict=True):
        assert (a.variant, a.seed, a.info) == (b.variant, b.seed, b.info)
        assert a.history.losses == b.history.losses and a.history.metrics == b.history.metrics
    two = ag.run(ag.get_config("quick", steps=6, workers=2, **kw), device="cpu")
    assert [r.history.losses for r in two.runs] == [r.history.losses for r in whole.runs]


def test_p20_inputs_compare_groups_of_seeds_with_no_norm():
    from lnbook import ledger
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run

    # per variant, the accuracy curves (start, middle, end) of four seeds: two groups of two
    curves = {"layer": [(0.1, 0.7, 0.9), (0.1, 0.5, 0.9), (0.1, 0.6, 0.8), (0.1, 0.6, 0.8)],
              "projection": [(0.1, 0.5, 0.9), (0.1, 0.5, 0.9), (0.1, 0.2, 0.3), (0.1, 0.2, 0.3)],
              "none": [(0.1, 0.4, 0.9), (0.1, 0.4, 0.9), (0.1, 0.5, 0.7), (0.1, 0.5, 0.9)]}
    runs = [Run(v, s, History(eval_steps=[0, 5, 10], metrics=[{"accuracy": a} for a in c]), {})
            for v, cs in curves.items() for s, c in enumerate(cs)]
    res = Results("attention_geometry", {}, "cpu", runs, {"chance": 0.3})
    got = ag.p20_inputs(res, group=2)
    ln, pr = "LN learns majority faster", "the projection alone learns it faster"
    # speed: mean of the evaluations after the start, then over each group of two seeds
    # layer 0.75, 0.7; projection 0.7, 0.25; none 0.65, 0.65
    np.testing.assert_allclose(got["values"][ln], [0.1, 0.05], atol=1e-12)
    np.testing.assert_allclose(got["values"][pr], [0.05, -0.4], atol=1e-12)
    # the projection's second group ends at 0.3, not 0.2 above the chance of 0.3
    assert ag.left_trivial(res, 2)["projection"].tolist() == [True, False]
    assert got["trivial_ok"][ln].tolist() == [True, True]
    assert got["trivial_ok"][pr].tolist() == [True, False]
    d = ledger.decide_claim("P20", **got)
    assert (d.parts[ln].n_for, d.parts[pr].n_for, d.parts[pr].n) == (2, 1, 2)


def test_unselectable_counts_and_p21_inputs():
    counts = ag.unselectable_counts([3, 4], n=64, d=8, spread=0.5)
    for k, seed in enumerate((3, 4)):  # one draw per seed, as random_keys gives it
        keys = ag.random_keys(64, 8, torch.Generator().manual_seed(seed), 0.5)
        for v in ag.NORMS:
            assert counts[v][k] == int(ag.unselectable(keys[v]).sum())
    assert counts["layer"] == [0, 0] and min(counts["projection"]) > 0
    got = ag.p21_inputs({"layer": [0, 0, 1], "projection": [3, 0, 2], "none": [1, 1, 1]})
    assert got["values"]["no key un-selectable with LN"].tolist() == [0, 0, 1]
    assert got["values"]["some un-selectable without the scaling"].tolist() == [3, 0, 2]
