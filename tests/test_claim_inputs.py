"""The per-seed inputs of claims P02, P12 and P19 (``p02_inputs``, ``p12_inputs``,
``p19_inputs`` of their experiments), on hand-made Results, decided by the declared rules."""

from __future__ import annotations

import numpy as np
import pytest

from lnbook import ledger
from lnbook.engine import History, Results
from lnbook.engine.results import Run
from lnbook.experiments import dyt, peri_ln, placement, qk_norm, removal, rmsnorm


def _results(finals: dict[str, list[float]], metric: str, info: dict, run_info=None):
    runs = []
    for v, values in finals.items():
        for seed, x in enumerate(values):
            h = History(eval_steps=[0, 10], metrics=[{metric: 9.0}, {metric: x}])
            runs.append(Run(v, seed, h, (run_info or {}).get((v, seed), {})))
    return Results("x", {}, "cpu", runs, info)


def test_p02_inputs_read_the_gap_against_layer_norms_loss():
    res = _results({"layer": [0.40, 0.30, 0.35, 0.20, 1.2],
                    "rms": [0.43, 0.35, 0.35, 0.21, 0.4]}, "loss", {"baseline_loss": 1.4})
    got = rmsnorm.p02_inputs(res, cost_ratio=1.3)
    np.testing.assert_allclose(got["values"]["comparable quality"],
                               [0.03, 0.05, 0.0, 0.01, 0.8], atol=1e-12)
    assert got["values"]["lower cost"] == [1.3]
    # seed 4's layer-norm run stayed within 0.5 nats of the unigram predictor
    assert got["trivial_ok"]["comparable quality"].tolist() == [True] * 4 + [False]
    d = ledger.decide_claim("P02", **got)
    # bounds 0.04, 0.03, 0.035, 0.02: seed 1 (0.05 > 0.03) counts against
    assert (d.parts["comparable quality"].n_for, d.parts["comparable quality"].n_against) == (3, 1)
    assert d.parts["lower cost"].outcome == "fails" and d.verdict == ledger.UNDECIDED
    assert rmsnorm.p02_left(res).tolist() == [True] * 4 + [False]


def test_p12_inputs_count_seeds_whose_runs_left_the_trivial_phase():
    chance = float(np.log(8))
    res = _results({"layer": [0.20, 0.10, 0.15], "dyt": [0.21, 0.13, 1.5]}, "val_loss",
                   {"chance": chance})
    got = dyt.p12_inputs(res)
    part = "DyT matches layer norm"
    np.testing.assert_allclose(got["values"][part], [0.01, 0.03, 1.35], atol=1e-12)
    assert got["trivial_ok"][part].tolist() == [True, True, False]  # 1.5 > chance - 1
    assert dyt.left_trivial(res).tolist() == [True, True, False]
    d = ledger.decide_claim("P12", **got)
    # bound a tenth of LN's loss: 0.02 (0.01 for) and 0.01 (0.03 against); seed 2 out
    assert (d.parts[part].n_for, d.parts[part].n_against, d.verdict) == (
        1, 1, ledger.UNDECIDED)


def test_p19_inputs_read_the_cost_against_the_control():
    info = {("r", s): {"original": o, "all_at_once": a, "control": c,
                       "finetuned": [0.5, f]}
            for s, (o, a, c, f) in enumerate([(0.06, 0.35, 0.025, 0.026),
                                             (0.07, 0.30, 0.030, 0.060),
                                             (0.09, 0.40, 0.020, 0.021),
                                             (0.06, 0.33, 0.030, 0.032),
                                             (2.00, 2.50, 0.030, 0.031)])}
    res = _results({"r": [0.0] * 5}, "loss", {"baseline_loss": 1.4}, info)
    got = removal.p19_inputs(res)
    small, needed = "small cost after fine-tuning", "the fine-tuning is needed"
    np.testing.assert_allclose(got["values"][small], [0.001, 0.03, 0.001, 0.002, 0.001])
    np.testing.assert_allclose(got["reference"][small], [0.025, 0.03, 0.02, 0.03, 0.03])
    np.testing.assert_allclose(got["values"][needed], [0.324, 0.24, 0.379, 0.298, 2.469])
    assert got["trivial_ok"][small].tolist() == [True] * 4 + [False]
    d = ledger.decide_claim("P19", **got)
    assert d.parts[small].n_for == 3 and d.parts[small].n_against == 1  # 0.03 > 0.003
    assert d.parts[small].outcome == "undecided" and d.verdict == ledger.UNDECIDED


def test_relative_parts_need_their_reference():
    res = _results({"layer": [0.2] * 3, "dyt": [0.2] * 3}, "val_loss", {"chance": 2.0})
    got = dyt.p12_inputs(res)
    with pytest.raises(ValueError, match="relative to layer norm's final held-out loss"):
        ledger.decide_claim("P12", got["values"], got["trivial_ok"])


def test_p05_inputs_pair_each_placement_with_its_warm_up():
    res = _results({"post/warmup0": [1.5, 0.9, 0.5], "post/warmup20": [0.6, 0.7, 0.5],
                    "pre/warmup0": [0.55, 1.2, 0.4], "pre/warmup20": [0.5, 0.6, 1.3]},
                   "loss", {"baseline_loss": 1.6})
    got = placement.p05_inputs(res)
    pre, post = "Pre-LN trains without warm-up", "Post-LN worse without warm-up"
    np.testing.assert_allclose(got["values"][post], [0.9, 0.2, 0.0], atol=1e-12)
    np.testing.assert_allclose(got["values"][pre], [0.05, 0.6, -0.9], atol=1e-12)
    # seed 2's warmed-up Pre-LN run sits 0.3 below the unigram predictor: out of both parts;
    # seed 1's Pre-LN run without warm-up too: out of Pre-LN's part only
    assert got["trivial_ok"][post].tolist() == [True, True, False]
    assert got["trivial_ok"][pre].tolist() == [True, False, False]
    d = ledger.decide_claim("P05", **got)
    assert (d.parts[post].n_for, d.parts[pre].n_for) == (2, 1)


def test_p08_inputs_read_the_top_rate_against_the_sweep():
    lrs = (0.01, 0.1, 0.3)
    runs = []
    # per model and rate: final loss and (initial, final) largest logit of seeds 0 and 1
    loss = {(False, 0.01): [0.5, 0.6], (False, 0.1): [0.4, 0.5], (False, 0.3): [1.6, 0.9],
            (True, 0.01): [0.5, 1.5], (True, 0.1): [0.45, 0.4], (True, 0.3): [0.5, 0.6]}
    for (q, lr), values in loss.items():
        for seed, x in enumerate(values):
            h = History(eval_steps=[0, 10], metrics=[
                {"loss": 2.0, "max_logit": 2.0}, {"loss": x, "max_logit": 30.0 if lr == 0.3
                                                  else 4.0}])
            diverged = (q, lr, seed) == (False, 0.3, 1)
            runs.append(Run(qk_norm.variant_name(q, lr), seed, h, {"diverged": diverged}))
    res = Results("qk_norm", {"lrs": lrs}, "cpu", runs, {"baseline_loss": 1.6})
    got = qk_norm.p08_inputs(res)
    np.testing.assert_allclose(got["values"]["logit growth"], [15.0, 15.0])
    np.testing.assert_allclose(got["values"]["failure at high rates"], [4.0, np.inf])
    np.testing.assert_allclose(got["values"]["qk-norm trains there"], [1.0 / 0.9, 1.5])
    # seed 1's qk-norm model ends at 1.5 at the lowest rate, within 0.5 of the unigram's 1.6
    assert got["trivial_ok"]["logit growth"].tolist() == [True, False]


def test_p15_and_p16_inputs_compare_the_placements_seed_by_seed():
    lrs = (0.01, 0.03, 0.1)
    # per (placement, rate): final loss of seeds 0, 1; last-block variance at 0 and at the end
    loss = {("pre", 0.01): [0.9, 0.8], ("pre", 0.03): [0.5, 1.5], ("pre", 0.1): [1.4, 0.9],
            ("peri", 0.01): [0.8, 0.7], ("peri", 0.03): [0.4, 0.6], ("peri", 0.1): [0.6, 0.5]}
    var = {"pre": (2.0, 200.0), "peri": (1.0, 4.0)}
    runs = []
    for (pos, lr), values in loss.items():
        for seed, x in enumerate(values):
            v0, v1 = var[pos]
            h = History(eval_steps=[0, 10], metrics=[
                {"loss": 2.0, "var_0": 1.0, "var_1": v0},
                {"loss": x, "var_0": 1.0, "var_1": v1 * (seed + 1)}])
            runs.append(Run(peri_ln.variant_name(pos, lr), seed, h, {}))
    res = Results("peri_ln", {"lrs": lrs}, "cpu", runs, {"baseline_loss": 1.6})
    p15 = peri_ln.p15_inputs(res)
    np.testing.assert_allclose(p15["values"]["larger stream after training"], [np.log10(50)] * 2)
    np.testing.assert_allclose(p15["values"]["grows more over training"],
                               [np.log10(25)] * 2)  # growths 100x and 4x
    # seed 1's Pre-LN run at the middle rate ends at 1.5, within 0.2 of the unigram's 1.6
    assert p15["trivial_ok"]["larger stream after training"].tolist() == [True, False]
    p16 = peri_ln.p16_inputs(res)
    # rises from the best rate to the highest: Pre-LN 0.9 and 0.1, Peri-LN 0.2 and 0.0
    np.testing.assert_allclose(p16["values"]["steadier at a high rate"], [0.7, 0.1])
    np.testing.assert_allclose(p16["values"]["lower loss"], [-0.1, -0.3])
    assert p16["trivial_ok"]["lower loss"].tolist() == [True, True]
    d = ledger.decide_claim("P16", **p16)
    assert d.parts["steadier at a high rate"].n_for == 1  # 0.1 is inside the 0.1 margin
