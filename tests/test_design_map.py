"""The design map (Part IV): seven designs over depth x peak rate x warm-up, and the per-seed
quantities its claims (P23, P29) read."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from lnbook.engine import History, Results, Run
from lnbook.experiments import EXPERIMENTS, design_map, stacked
from lnbook.experiments.seq_tasks import make_task
from lnbook.transformer import Transformer, sequence_loss


def test_presets_designs_and_validation():
    quick, paper = design_map.get_config("quick"), design_map.get_config("paper")
    assert EXPERIMENTS["design_map"] is design_map
    assert quick.designs == tuple(design_map.DESIGNS) and len(quick.designs) == 7
    assert quick.seeds == 5 and quick.steps < paper.steps == 5_000
    assert paper.depths == (4, 8, 16) and paper.d_model == 32 and paper.lrs[0] == 1e-3
    assert quick.stack == "all" and quick.depths == (1, 5) and quick.lrs == (0.01, 0.1)
    assert design_map.variant_name("pre", 4, 0.03, 0) == "pre/L4/lr0.03/w0"
    for bad, match in (({"designs": ("pre", "batch")}, "designs"),
                       ({"depths": (4, 2)}, "depths"), ({"lrs": (0.1, 0.01)}, "increasing"),
                       ({"warmups": (0, 1000)}, "warmups"), ({"n_eval": 0}, "n_eval"),
                       ({"stack": "none"}, "stack")):
        with pytest.raises(ValueError, match=match):
            design_map.get_config("quick", **bad)
    with pytest.raises(TypeError, match="design_map.Config"):
        design_map.run(object())
    with pytest.raises(ValueError, match="design must be one of"):
        design_map.model_config(quick, "sandwich", 2, 12)


def test_each_design_builds_its_blocks():
    cfg = design_map.get_config("quick")
    built = {d: Transformer(design_map.model_config(cfg, d, 2, 12)) for d in design_map.DESIGNS}
    assert all(len(m.blocks) == 2 for m in built.values())
    x = torch.randn(3, 5, cfg.d_model)
    gate = built["rezero"].blocks[0]  # starts as the identity
    torch.testing.assert_close(gate(x), x, rtol=0, atol=0)
    assert built["olmo2"].config.qk_norm and built["olmo2"].config.position == "output"
    assert not built["pre"].config.qk_norm
    assert isinstance(built["none"].final_norm, torch.nn.Identity)
    assert not built["post"].config.has_final_norm()
    assert type(built["dyt"].final_norm).__name__ == "DyT"


def test_a_tiny_run_is_each_copy_trained_alone():
    """Two cells (one design, one rate, warm-up 0 and 2) on two seeds: every copy's training
    losses and final held-out loss equal a plain torch loop's (torch.optim.Adam, the same
    batches, the rate ramped by hand)."""
    cfg = design_map.get_config("quick", designs=("rezero",), depths=(2,), lrs=(0.05,),
                                warmups=(0, 2), steps=4, eval_every=2, n_train=32, n_test=8,
                                n_eval=8, size=3, seeds=(0, 1))
    res = design_map.run(cfg, device="cpu")
    per_cell = design_map.run(dataclasses.replace(cfg, stack="seeds"), device="cpu")
    for a, b in zip(res.runs, per_cell.runs, strict=True):  # the same copies, grouped apart
        np.testing.assert_allclose(a.history.losses, b.history.losses, rtol=1e-5)
    task = make_task("sort", 32, 8, 3, cfg.symbols)
    assert len(res.runs) == 4 and res.info["baseline_loss"] == pytest.approx(task.baseline_loss)
    for w in (0, 2):
        name = design_map.variant_name("rezero", 2, 0.05, w)
        for run in res.select(name):
            torch.manual_seed(run.seed)
            model = Transformer(design_map.model_config(cfg, "rezero", 2, task.seq_len))
            opt = torch.optim.Adam(model.parameters(), lr=0.05)
            rows = stacked.batch_indices(run.seed, 32, 4, cfg.batch_size)
            losses = []
            for t in range(1, 5):
                for g in opt.param_groups:
                    g["lr"] = 0.05 * (min(1.0, t / w) if w else 1.0)
                loss = sequence_loss(model(task.x[rows[t - 1]]), task.y[rows[t - 1]])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            np.testing.assert_allclose(run.history.losses, losses, rtol=2e-4)
            with torch.no_grad():
                held = sequence_loss(model(task.x_test), task.y_test).item()
            assert run.history.metrics[-1]["loss"] == pytest.approx(held, rel=2e-4)
            assert run.info["warmup"] == w and not run.info["diverged"]
    gates = [b.alpha_attn.item() for b in model.blocks]
    assert all(g != 0 for g in gates)  # the ReZero gates trained away from 0


def _results(finals: dict[str, list[float]], diverged: dict[str, list[bool]] | None = None,
             losses: dict[str, list[list[float]]] | None = None) -> Results:
    """Known results on a grid of designs ``pre``, ``post``, depth 2, rates 0.01 and 0.1,
    warm-up 0, three seeds, baseline 2.0; ``finals[variant]`` the final held-out loss."""
    runs = []
    for v, values in finals.items():
        for k, value in enumerate(values):
            h = History(steps=[1, 2], losses=(losses or {}).get(v, [[3.0, 2.5]] * 3)[k],
                        eval_steps=[0, 2], metrics=[{"loss": 3.0}, {"loss": value}])
            info = {"diverged": bool((diverged or {}).get(v, [False] * 3)[k])}
            runs.append(Run(v, k, h, info))
    config = {"designs": ["pre", "post"], "depths": [2], "lrs": [0.01, 0.1], "warmups": [0]}
    return Results("design_map", config, "cpu", runs, {"baseline_loss": 2.0,
                                                        "uniform_loss": 2.1})


def test_per_seed_quantities_on_known_results():
    v = design_map.variant_name
    res = _results({v("pre", 2, 0.01, 0): [1.0, 1.5, 1.9],
                    v("pre", 2, 0.1, 0): [0.5, 0.6, 0.8],
                    v("post", 2, 0.01, 0): [0.8, 1.9, 1.0],
                    v("post", 2, 0.1, 0): [0.4, 0.9, 0.4]},
                   diverged={v("post", 2, 0.1, 0): [False, False, True]})
    np.testing.assert_array_equal(design_map.final_loss(res, v("post", 2, 0.1, 0)),
                                  [0.4, 0.9, math.inf])  # a diverged run ends at inf
    np.testing.assert_array_equal(design_map.left_trivial(res, v("pre", 2, 0.01, 0)),
                                  [True, True, False])  # 1.9 is not 0.2 below 2.0
    np.testing.assert_allclose(design_map.cells_trained(res, "pre"), [1, 1, 0.5])
    np.testing.assert_allclose(design_map.cells_trained(res, "post"), [1, 0.5, 0.5])
    # where both left: seed 0 both rates, seed 1 the high rate, seed 2 the low rate only
    lower = design_map.ends_lower(res, "post", "pre")
    want0 = np.median([(1.0 - 0.8) / (2.0 - 0.8), (0.5 - 0.4) / (2.0 - 0.4)])
    want2 = np.nan  # seed 2: pre's low-rate run did not leave, post's high-rate one diverged
    np.testing.assert_allclose(lower, [want0, (0.6 - 0.9) / (2.0 - 0.6), want2])
    m = design_map.design_map(res)
    assert m[("post", 2, 0.1, 0)] == design_map.Cell(2, 3, 2 / 3, 0.9, 0.4, math.inf)
    assert m[("pre", 2, 0.01, 0)].median == 1.5


def test_spikes_count_rises_over_the_recent_minimum():
    assert design_map.loss_spikes([2.0, 1.5, 1.4, 2.2, 1.3, 1.2], window=2, rise=0.5) == 1
    assert design_map.loss_spikes([2.0, 1.5, 1.4, 2.2, 1.3, 1.2], window=2, rise=0.9) == 0
    assert design_map.loss_spikes([1.0, 1.2, 1.4, 1.6], window=3, rise=0.5) == 1  # drift
    assert design_map.loss_spikes([1.0]) == 0
    v = design_map.variant_name("pre", 2, 0.01, 0)
    res = _results({v: [1.0, 1.0, 1.0]}, diverged={v: [False, False, True]},
                   losses={v: [[1.0, 2.0, 1.0], [1.0, 1.1, 1.0], [1.0, 1.1]]})
    np.testing.assert_array_equal(design_map.spikes(res, v, window=1), [1, 0, 1])
    with pytest.raises(ValueError, match="window"):
        design_map.loss_spikes([1.0, 2.0], window=0)


def test_median_interval_is_the_binomial_order_statistic_interval():
    assert design_map.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)
    # n = 10: k = 2 covers 1 - 2 * 11 / 1024 = 0.979, k = 3 only 0.891
    x = np.arange(10.0)
    assert design_map.median_interval(x) == (4.5, 1.0, 8.0)
    assert design_map.median_interval(x, level=0.8) == (4.5, 2.0, 7.0)
    assert design_map.median_interval([1.0, math.inf, 2.0]) == (2.0, 1.0, math.inf)
    assert design_map.median_interval([7.0]) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError, match="non-NaN"):
        design_map.median_interval([1.0, math.nan])
    with pytest.raises(ValueError, match="level"):
        design_map.median_interval([1.0], level=1.0)


def test_plot_map_labels_every_cell():
    import matplotlib

    matplotlib.use("Agg")
    v = design_map.variant_name
    res = _results({v("pre", 2, 0.01, 0): [1.0, 1.5, 1.9], v("pre", 2, 0.1, 0): [0.5] * 3,
                    v("post", 2, 0.01, 0): [0.8] * 3, v("post", 2, 0.1, 0): [3e8] * 3})
    ax = design_map.plot_map(res)
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["2/3  1.50", "3/3  0.50", "3/3  0.80", "0/3  3e+08"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["pre, 2 blocks", "post, 2 blocks"]


def test_claim_values_and_the_pilot_summary():
    v = design_map.variant_name
    finals = {v(d, 2, lr, 0): [1.0, 1.0, 1.0] for d in ("pre", "post", "olmo2")
              for lr in (0.01, 0.1)}
    finals[v("pre", 2, 0.1, 0)] = [1.0, 1.95, 1.95]  # pre fails at the high rate on 2 seeds
    finals[v("post", 2, 0.1, 0)] = [0.5, 1.95, 1.0]
    spiky = [[1.0, 2.0, 1.0]] * 3  # one spike per run (window 5, rise 0.5)
    flat = [[1.0, 1.1, 1.0]] * 3
    res = _results(finals, losses={v("pre", 2, 0.01, 0): spiky, v("pre", 2, 0.1, 0): spiky,
                                   v("olmo2", 2, 0.01, 0): spiky,
                                   v("olmo2", 2, 0.1, 0): flat})
    res.config["designs"] = ["pre", "post", "olmo2"]
    amp = {"post": np.array([[0.1, 0.4]] * 3), "pre": np.array([[0.1, 0.2], [0.1, 0.4],
                                                                 [0.1, 0.8]])}
    values = design_map.claim_values(res, amp)
    p23, p29 = values["P23"], values["P29"]
    np.testing.assert_allclose(p23["Post-LN amplifies a small update"],
                               np.log10([2.0, 1.0, 0.5]))  # the deepest depth, post over pre
    # seed 0: post ties pre at the low rate, ends 0.5 lower at the high one: median of 0, 0.5/1.5
    np.testing.assert_allclose(p23["Post-LN ends lower where it trains"],
                               [np.median([0.0, 0.5 / 1.5]), 0.0, 0.0])
    np.testing.assert_allclose(p23["Post-LN fails where Pre-LN trains"], [0.0, 0.0, -0.5])
    np.testing.assert_allclose(p29["trains where Pre-LN does not"], [0.0, 0.5, 0.5])
    np.testing.assert_allclose(p29["fewer loss spikes"], [1 / 3] * 3)  # 2 spikes against 1
    np.testing.assert_array_equal(design_map.total_spikes(res, "pre"), [2, 2, 2])
    np.testing.assert_array_equal(design_map.both_trained(res, "pre", "post"), [True] * 3)
    rec = design_map.pilot_summary(res, amp, "P29", "a note")
    assert rec["amplification"]["pre"] == pytest.approx([0.1, 1.4 / 3])
    assert rec["per_seed"]["trains where Pre-LN does not"] == [0.0, 0.5, 0.5]
    assert rec["seeds"] == [0, 1, 2] and rec["note"] == "a note"
    assert rec["map"][v("pre", 2, 0.1, 0)]["left"] == 1
    import json

    json.dumps(rec, allow_nan=False)  # strict JSON: no inf or NaN


def test_output_change_is_the_relative_change_of_the_logits_after_a_sign_update():
    cfg = design_map.get_config("quick", probe_depths=(1, 3), probe_step=0.02)
    task = make_task("sort", 16, 8, 3, cfg.symbols)
    idx = task.x_test
    got = design_map.output_change(cfg, "post", 3, 7, idx)
    torch.manual_seed(7)
    model = Transformer(design_map.model_config(cfg, "post", 3, idx.shape[1]))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        y0 = model(idx)
        for p in model.parameters():
            p.add_(0.02 * (2 * torch.randint(0, 2, p.shape, generator=g).float() - 1))
        want = float((model(idx) - y0).norm() / y0.norm())
    assert got == pytest.approx(want, rel=1e-6) and got > 0
    assert design_map.output_change(cfg, "pre", 3, 7, idx, step=1e-12) < 1e-8
    amp = design_map.amplification(cfg, idx, seeds=(0, 1))
    assert set(amp) == set(cfg.designs) and amp["rezero"].shape == (2, 2)
    assert amp["pre"][1, 1] == pytest.approx(design_map.output_change(cfg, "pre", 3, 1, idx))
    with pytest.raises(ValueError, match="probe_depths"):
        design_map.get_config("quick", probe_depths=(4, 2))


def test_course_reports_name_the_cells_that_give_each_report():
    v = design_map.variant_name
    down = [[3.0] + [1.5] * 5]  # training losses that went 0.5 below the baseline (2.0)
    res = _results({v("pre", 2, 0.01, 0): [1.0, 1.1, 1.2],
                    v("pre", 2, 0.1, 0): [0.5, 5.0, 0.6],  # seed 1 learnt, then collapsed
                    v("post", 2, 0.01, 0): [1.05, 1.15, 1.3],
                    v("post", 2, 0.1, 0): [1.9, 1.95, 1.0]},  # fails on 2 of 3, never learnt
                   losses={v("pre", 2, 0.1, 0): down * 3})
    np.testing.assert_array_equal(design_map.collapsed(res, v("pre", 2, 0.1, 0)),
                                  [False, True, False])
    assert not design_map.collapsed(res, v("post", 2, 0.1, 0)).any()
    got = design_map.course_reports(res)
    assert got["learnt, then collapsed"] == [("pre", 2, 0.1, 0)]
    assert got["fails at every rate"] == []
    assert got["no instability, Post-LN close to Pre-LN"] == [(2, 0.01, 0)]
    res = _results({v("pre", 2, 0.01, 0): [1.0] * 3, v("pre", 2, 0.1, 0): [1.0] * 3,
                    v("post", 2, 0.01, 0): [1.95, 1.0, 3.0], v("post", 2, 0.1, 0): [3.0] * 3},
                   diverged={v("post", 2, 0.1, 0): [False, True, False]},
                   losses={v("post", 2, 0.1, 0): [[3.0, 3.0], [3.0, 1.0], [3.0, 3.0]]})
    got = design_map.course_reports(res)
    assert got["fails at every rate"] == [("post", 2, 0)]
    # seed 1 learnt (a run shorter than the window is read loss by loss), then diverged
    assert got["learnt, then collapsed"] == [("post", 2, 0.1, 0)]
    assert got["no instability, Post-LN close to Pre-LN"] == []
    np.testing.assert_array_equal(design_map.collapsed(res, v("post", 2, 0.1, 0), window=1),
                                  [False, True, False])


def test_the_low_precision_column_config_and_its_reading():
    cfg = design_map.get_config("quick")
    low = design_map.low_precision_config(cfg)
    assert (low.designs, low.depths, low.lrs, low.warmups, low.seeds, low.autocast) == (
        ("none", "post", "pre"), (max(cfg.depths),), (min(cfg.lrs),), (max(cfg.warmups),),
        3, "bfloat16")
    assert design_map.low_precision_config(dataclasses.replace(cfg, seeds=(7, 8, 9, 10))
                                           ).seeds == (7, 8, 9)
    with pytest.raises(ValueError, match="autocast"):
        design_map.get_config("quick", autocast="float64")
    # the chapter's text: at the deepest depth of the pilot's grid, this is the cell with the
    # most runs out of the trivial phase, over every design
    from lnbook import ledger

    rec = ledger.pilot_record("P23")
    left = {}
    for variant, c in rec["map"].items():
        d, n, lr, w = variant.split("/")
        if int(n[1:]) == max(rec["config"]["depths"]):
            left[(float(lr[2:]), int(w[1:]))] = left.get((float(lr[2:]), int(w[1:])), 0) + c["left"]
    assert max(left, key=left.get) == (low.lrs[0], low.warmups[0])
    assert rec["config"]["depths"] == list(cfg.depths)


def test_precision_column_pairs_each_seed_with_its_float32_run():
    v = design_map.variant_name
    grid = _results({v("pre", 2, 0.01, 0): [1.0, 1.5, 1.9], v("post", 2, 0.01, 0): [0.8, 1.9, 1.0],
                     v("pre", 2, 0.1, 0): [0.5, 0.6, 0.8], v("post", 2, 0.1, 0): [0.4, 0.9, 0.4]})
    runs = []
    for name, values in ((v("pre", 2, 0.01, 0), [1.1, 1.5]), (v("post", 2, 0.01, 0), [0.9, 1.7])):
        for seed, value in zip((2, 1), values, strict=True):  # the grid's seeds 2 and 1
            h = History(steps=[1, 2], losses=[3.0, 2.5], eval_steps=[0, 2],
                        metrics=[{"loss": 3.0}, {"loss": value}])
            runs.append(Run(name, seed, h, {"diverged": name.startswith("post") and seed == 1}))
    low = Results("design_map", {"designs": ["pre", "post"], "depths": [2], "lrs": [0.01],
                                 "warmups": [0]}, "cpu", runs, {"baseline_loss": 2.0})
    col = design_map.precision_column(grid, low)
    np.testing.assert_array_equal(col["pre"].float32, [1.9, 1.5])
    np.testing.assert_array_equal(col["pre"].low, [1.1, 1.5])
    assert (col["pre"].left_float32, col["pre"].left_low) == (1, 2)  # 1.9 is not below 1.8
    assert col["pre"].median_change == pytest.approx(np.median([1.1 - 1.9, 0.0]))
    np.testing.assert_array_equal(col["post"].low, [0.9, math.inf])  # seed 1 diverged
    assert col["post"].median_change == pytest.approx(0.9 - 1.0)  # the finite pair only
    with pytest.raises(ValueError, match="one cell"):
        design_map.precision_column(grid, grid)
