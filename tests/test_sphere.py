"""The sphere experiment (lnbook.experiments.sphere): designs, stacking, targets, speed-ups."""

import numpy as np
import pytest
import torch

from lnbook.engine import History, Results, Run
from lnbook.experiments import sphere as S


def tiny(**kw):
    base = dict(designs=("pre", "ngpt"), depths=(1,), steps=6, eval_every=3, n_train=64,
                n_test=16, n_eval=16, batch_size=8, d_model=8, n_heads=2, size=3, symbols=4,
                seeds=(0, 1))
    return S.get_config(**{**base, **kw})


def test_presets_and_bad_configs():
    quick, paper = S.get_config(), S.get_config("paper")
    assert quick.depths == (2, 6) and paper.depths == (6, 24) and paper.steps == 10_000
    assert set(dict(quick.lrs)) == set(S.DESIGNS)
    with pytest.raises(ValueError, match="designs"):
        S.get_config(designs=("pre", "layer"))
    with pytest.raises(ValueError, match="fractions"):
        S.get_config(fractions=(0.9, 0.5))
    with pytest.raises(ValueError, match="lrs"):
        S.get_config(lrs=(("pre", 1e-3),))
    with pytest.raises(ValueError, match="depths"):
        S.get_config(depths=(0,))


@pytest.mark.parametrize("design", S.DESIGNS)
def test_stacked_seeds_train_as_each_seed_alone(design):
    """Two seeds trained as one stack give each seed's numbers trained alone (float32)."""
    both = S.run(tiny(designs=(design,), seeds=(0, 1)), device="cpu")
    alone = S.run(tiny(designs=(design,), seeds=(1,)), device="cpu")
    v = S.variant_name(design, 1)
    a = both.select(v)[1].history.metric("test_loss")
    b = alone.select(v)[0].history.metric("test_loss")
    assert np.allclose(a, b, atol=1e-5), (a, b)
    assert a[-1] < a[0]  # six updates lower the held-out loss


def test_ngpt_weights_stay_on_the_sphere_through_training(tmp_path):
    """The projection runs inside the engine's loop: the checkpointed stack's weights (saved
    after the last update and its evaluation) are unit vectors along the model dimension."""
    from lnbook.engine import Job, Stack
    from lnbook.experiments.seq_tasks import task_of
    from lnbook.ngpt import NGPT

    cfg = tiny(designs=("ngpt",), seeds=(0, 1))
    job = Job({"ngpt/L1": ("ngpt", 1)}, (0, 1), torch.device("cpu"), tmp_path / "c.pt", None,
              "ngpt/L1")
    out = S.train(cfg, task_of(cfg), job)
    assert [len(h.eval_steps) for h, _ in out] == [3, 3]
    assert [info["diverged_at"] for _, info in out] == [None, None]
    stack = Stack([S.build(cfg, "ngpt", 1, task_of(cfg).seq_len) for _ in range(2)])
    stack.load_state_dict(torch.load(tmp_path / "c.pt")["model"])
    names = NGPT(5, 8, 2, 1, 6).matrices()
    assert len(names) == 10
    for name, dim in names:
        w = stack.named_stacked()[name]  # (copies, *shape), one block
        assert w.shape[0] == 2
        assert torch.allclose(w.norm(dim=dim), torch.ones(()), atol=1e-5), name


def result(curves, baseline=1.0, fractions=(0.5, 0.75), trivial=0.25):
    runs = [Run(v, s, History(eval_steps=[0, 10, 20, 30],
                              metrics=[{"test_loss": x} for x in c]))
            for v, cs in curves.items() for s, c in enumerate(cs)]
    return Results("sphere", {"fractions": list(fractions), "trivial_fraction": trivial,
                              "designs": ["pre", "ngpt"]}, "cpu", runs,
                   {"baseline_loss": baseline})


def test_targets_updates_and_speedups_on_known_curves():
    r = result({"pre/L2": [[1.0, 0.6, 0.4, 0.2], [1.0, 0.9, 0.8, 0.7]],
                "ngpt/L2": [[1.0, 0.4, 0.2, 0.1], [1.0, 0.9, 0.9, 0.9]]})
    assert S.targets(r).tolist() == pytest.approx([0.5, 0.25])
    # read between evaluations: 0.5 lies a quarter of the way from pre's 0.6 (update 10) to
    # its 0.4 (update 20), 0.25 three quarters of the way from 0.4 to 0.2
    assert S.updates_to_targets(r, "pre/L2").tolist() == [[15, 27.5], [np.inf, np.inf]]
    ngpt = S.updates_to_targets(r, "ngpt/L2")
    np.testing.assert_allclose(ngpt[0], [10 * 0.5 / 0.6, 17.5])
    assert np.isinf(ngpt[1]).all()
    sp = S.speedups(r, "ngpt/L2", "pre/L2")
    np.testing.assert_allclose(sp[0], [15 / (10 * 0.5 / 0.6), 27.5 / 17.5])
    assert np.isnan(sp[1]).all()
    assert S.left_trivial(r, "pre/L2").tolist() == [True, True]
    assert S.left_trivial(r, "ngpt/L2").tolist() == [True, False]  # 0.9 > 0.75


def test_choose_lrs_picks_the_fastest_rate_to_the_last_target():
    slow = result({"pre/L2": [[1.0, 0.6, 0.4, 0.2]] * 2, "ngpt/L2": [[1.0, 0.9, 0.9, 0.9]] * 2})
    fast = result({"pre/L2": [[1.0, 0.2, 0.2, 0.2]] * 2, "ngpt/L2": [[1.0, 0.9, 0.3, 0.2]] * 2})
    assert S.choose_lrs({1e-3: slow, 1e-2: fast}) == {"pre": 1e-2, "ngpt": 1e-2}
    tie = result({"pre/L2": [[1.0, 0.2, 0.1, 0.05]] * 2, "ngpt/L2": [[1.0, 0.9, 0.3, 0.2]] * 2})
    assert S.choose_lrs({1e-3: tie, 1e-2: fast})["pre"] == 1e-3  # same speed, lower loss


def test_claim_values_read_the_last_target_at_the_deepest_depth():
    fast, slow, flat = [1.0, 0.4, 0.05, 0.05], [1.0, 0.6, 0.4, 0.05], [1.0, 1.0, 1.0, 1.0]
    curves = {f"{d}/L{n}": [c, c] for n in (2, 6) for d, c in
              (("pre", slow), ("post", slow), ("ngpt", fast), ("rezero", fast))}
    curves["rezero/L6"] = [fast, flat]
    r = result(curves, fractions=(0.5, 0.9))
    r.config["depths"] = [2, 6]
    values, ok = S.claim_values(r, "P27")
    # the target 0.1 lies 0.3 / 0.35 of the way into the interval that brackets it: from
    # update 20 for the slow curve, from 10 for the fast one
    ratio = (20 + 10 * 0.3 / 0.35) / (10 + 10 * 0.3 / 0.35)
    np.testing.assert_allclose(values["fewer updates"], [ratio, ratio])
    np.testing.assert_allclose(values["fewer updates when shallow"], [ratio, ratio])
    assert ok["fewer updates"].tolist() == [True, True]
    values, ok = S.claim_values(r, "P28")
    assert values["trains deep without a norm"].tolist() == [True, False]
    assert values["faster than Pre-LN"][0] == pytest.approx(ratio)
    assert values["faster than Pre-LN"][1] == 0.0
    assert ok["faster than Pre-LN"].tolist() == [True, False]  # seed 1's gate never learnt
    with pytest.raises(ValueError, match="P27"):
        S.claim_values(r, "P26")


def test_a_copy_that_diverges_stops_and_reaches_no_target():
    cfg = tiny(designs=("rezero",), lrs=tuple((d, 1e8) for d in S.DESIGNS), steps=30,
               eval_every=10)
    r = S.run(cfg, device="cpu")
    v = S.variant_name("rezero", 1)
    at = r.info_of(v, "diverged_at")
    assert all(a is not None and a < 30 for a in at), at  # no norm, steps of 1e8
    for a, ok, upd in zip(at, S.left_trivial(r, v), S.updates_to_targets(r, v), strict=True):
        if a is not None:
            assert not ok and np.isinf(upd).all()
