"""Tests of lnbook.experiments.rnn_length (chapter 3.1, claims C04 and C05)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from lnbook.engine import Results, load_results
from lnbook.experiments import EXPERIMENTS
from lnbook.experiments import rnn_length as E


def test_registered_and_presets_and_validation():
    assert EXPERIMENTS["rnn_length"] is E
    q, p = E.get_config("quick"), E.get_config("paper")
    assert q.scale == "quick" and p.scale == "paper"
    assert p.test_len > q.test_len and p.hidden_size > q.hidden_size and p.steps > q.steps
    assert E.get_config("quick", steps=3).steps == 3
    assert E.get_config("quick", train_lens=[5, 7]).train_lens == (5, 7)
    with pytest.raises(ValueError, match="scale"):
        E.get_config("huge")
    with pytest.raises(ValueError, match="unknown Config field"):
        E.get_config("quick", nope=1)
    with pytest.raises(ValueError, match="variants"):
        E.get_config("quick", variants=("wn",))
    with pytest.raises(ValueError, match="batch_sizes"):
        E.get_config("quick", batch_sizes=(1,))
    with pytest.raises(ValueError, match="train_lens"):
        E.get_config("quick", train_lens=(0,))
    with pytest.raises(TypeError, match="rnn_length.Config"):
        E.run({"steps": 1})


def test_running_sum_targets_are_the_sign_of_the_cumulative_sum():
    x, y = E.running_sum_batch(5, 7, torch.Generator().manual_seed(0))
    assert x.shape == (7, 5, 1) and y.shape == (7, 5)
    s = 0.0
    for t in range(7):
        s = s + x[t, 2, 0].item()
        assert y[t, 2].item() == float(s > 0)


def test_trivial_errors_against_counting():
    x, y = E.running_sum_batch(400, 6, torch.Generator().manual_seed(3))
    tr = E.trivial_errors(x, y)
    assert len(tr["majority"]) == len(tr["last_input"]) == 6
    assert tr["last_input"][0] == 0.0  # at t = 1 the sum is the input
    for t in range(6):
        pos = float(y[t].mean())
        assert tr["majority"][t] == pytest.approx(min(pos, 1 - pos))
        wrong = sum(float(x[t, b, 0] > 0) != float(y[t, b]) for b in range(400)) / 400
        assert tr["last_input"][t] == pytest.approx(wrong)
    # P(sign x_t != sign S_t) = 1/2 - asin(1/sqrt(t)) / pi for Gaussian inputs
    assert tr["last_input"][3] == pytest.approx(0.5 - math.asin(0.5) / math.pi, abs=0.06)


@pytest.mark.parametrize("variant", E.VARIANTS)
def test_sign_model_loss_and_error(variant):
    torch.manual_seed(0)
    m = E.SignModel(variant, hidden=4, train_len=5)
    x, y = E.running_sum_batch(6, 5, torch.Generator().manual_seed(1))
    loss = m(x, y)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(m.logits(x), y)
    assert loss.dim() == 0 and torch.allclose(loss, expected)
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())
    err = E.error_per_step(m, *E.running_sum_batch(6, 9, torch.Generator().manual_seed(2)))
    assert err.shape == (9,) and 0 <= err.min() and err.max() <= 1
    assert m.training  # mode restored
    with pytest.raises(ValueError, match="variant"):
        E.SignModel("wn", 4, 5)


def test_error_with_batch_statistics_leaves_the_model_alone():
    torch.manual_seed(0)
    m = E.SignModel("bn", hidden=6, train_len=5)
    x, y = E.running_sum_batch(64, 5, torch.Generator().manual_seed(4))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    batch = E.error_per_step(m, x, y, batch_stats=True)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k  # running averages untouched
    # the same numbers by hand: training mode on a fresh copy
    m2 = E.SignModel("bn", hidden=6, train_len=5)
    m2.load_state_dict(before)
    with torch.no_grad():
        train_logits = m2.logits(x)  # (T, B) with batch statistics
        by_hand = ((train_logits > 0).float() != y).float().mean(1)
        m2.load_state_dict(before)
        m2.eval()
        eval_logits = m2.logits(x)  # untrained running averages (0, 1)
    assert torch.equal(batch, by_hand)
    assert (train_logits - eval_logits).abs().max() > 1e-3  # the two modes differ


def test_input_sensitivity_of_a_memoryless_rnn_is_the_last_input_only():
    torch.manual_seed(0)
    m = E.SignModel("plain", hidden=5, train_len=4)
    with torch.no_grad():
        m.rnn.weight_hh_l0.zero_()  # no recurrence: logit_T depends on x_T alone
    x, _ = E.running_sum_batch(8, 4, torch.Generator().manual_seed(0))
    sens = E.input_sensitivity(m, x)
    assert sens.shape == (4,) and torch.all(sens[:-1] == 0)
    b = m.rnn.bias_ih_l0 + m.rnn.bias_hh_l0
    w_ih, w_out = m.rnn.weight_ih_l0[:, 0], m.out.weight[0]
    h = torch.tanh(x[-1] @ m.rnn.weight_ih_l0.T + b)  # (B, H)
    expected = ((1 - h**2) * w_ih * w_out).sum(1).abs().mean()
    assert sens[-1].item() == pytest.approx(expected.item(), rel=1e-5)
    assert m.training


def test_state_sum_corr_of_a_linear_integrator_is_one():
    m = E.SignModel("plain", hidden=4, train_len=6)
    with torch.no_grad():
        for p in m.rnn.parameters():
            p.zero_()
        m.rnn.weight_hh_l0.copy_(torch.eye(4))
        m.rnn.weight_ih_l0.fill_(1e-3)  # h_t ~ 1e-3 * S_t * (1, 1, 1, 1): tanh is linear there
    x, _ = E.running_sum_batch(50, 6, torch.Generator().manual_seed(1))
    assert E.state_sum_corr(m, x) > 0.999
    with torch.no_grad():
        m.rnn.weight_hh_l0.zero_()  # memoryless: ||h_t|| follows |x_t|, not |S_t|
    assert E.state_sum_corr(m, x) < 0.8


def test_run_tiny_grid_results_and_json(tmp_path):
    n = torch.get_num_threads()
    cfg = E.get_config("quick", hidden_size=4, train_lens=(3, 4), batch_sizes=(2, 5), test_len=6,
                       steps=2, eval_every=1, n_eval=8, test_batch=8, seeds=(0, 1))
    res = E.run(cfg, device="cpu", out=tmp_path)
    assert torch.get_num_threads() == n
    assert isinstance(res, Results) and res.seeds == [0, 1]
    assert len(res.variants) == 3 * 2 * 2 and "ln/len4/bs2" in res.variants
    steps, nll = res.curves("plain/len3/bs5", "nll")
    assert list(steps) == [0, 1, 2] and nll.shape == (2, 3) and np.all(nll > 0)
    assert E.per_step(res, "bn", 4, 2).shape == (2, 6)
    assert E.per_step(res, "bn", 4, 2, "error_batch_stats").shape == (2, 4)
    assert E.per_step(res, "ln", 3, 2, "sensitivity").shape == (2, 6)
    assert all(-1 <= c <= 1 for c in res.info_of("ln/len3/bs5", "state_sum_corr"))
    assert set(res.info["trivial"]) == {"6"}
    assert res.info["trivial"]["6"]["constant_nll"] == pytest.approx(math.log(2))
    (path,) = tmp_path.glob(f"{E.NAME}-*.json")  # named by the config's digest
    saved = load_results(path)
    assert saved.info_of("ln/len4/bs5", "error") == res.info_of("ln/len4/bs5", "error")
    assert json.loads(path.read_text())["config"]["hidden_size"] == 4


def test_same_seed_same_data_for_every_variant_and_test_at_training_length():
    cfg = E.get_config("quick", hidden_size=3, train_lens=(3,), batch_sizes=(4,), test_len=None,
                       steps=1, eval_every=1, n_eval=4, test_batch=4, seeds=(7,),
                       variants=("ln", "plain"))
    res = E.run(cfg, device="cpu")
    assert set(res.info["trivial"]) == {"3"}
    assert len(res.info_of("ln/len3/bs4", "error")[0]) == 3
    # a rerun reproduces the numbers exactly (data and init are functions of the seed)
    again = E.run(cfg, device="cpu")
    assert again.info_of("ln/len3/bs4", "error") == res.info_of("ln/len3/bs4", "error")
    assert again.runs[0].history.losses == res.runs[0].history.losses


def test_paper_preset_constructs_and_a_tiny_override_runs():
    p = E.get_config("paper")
    assert p.hidden_size == 128 and p.train_lens == (50,) and p.test_len == 500
    tiny = E.get_config("paper", hidden_size=3, train_lens=(2,), test_len=3, steps=1,
                        eval_every=1, n_eval=4, test_batch=4, seeds=(0,), threads=1)
    res = E.run(tiny, device="cpu")
    assert len(res.runs) == 3 and len(res.runs[0].info["error"]) == 3


@pytest.mark.parametrize("call, match", [
    (lambda: E.Config(steps=0), "steps must be a positive int"),
    (lambda: E.Config(test_len=0), "test_len"),
])
def test_bad_arguments_name_what_was_expected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_two_workers_give_the_numbers_of_one_process():
    kw = dict(hidden_size=3, train_lens=(3,), batch_sizes=(4,), steps=2, eval_every=1, n_eval=4,
              test_len=4, test_batch=4, seeds=(0, 1), variants=("ln", "plain"))
    one = E.run(E.get_config("quick", **kw), device="cpu")
    two = E.run(E.get_config("quick", workers=2, **kw), device="cpu")  # --workers 2
    assert two.config["workers"] == 2
    for a, b in zip(one.runs, two.runs, strict=True):
        assert (a.variant, a.seed, a.info) == (b.variant, b.seed, b.info)
        assert a.history.losses == b.history.losses and a.history.metrics == b.history.metrics


def test_c04_inputs_read_the_errors_within_and_past_the_training_length():
    import dataclasses

    from lnbook import ledger
    from lnbook.engine import History
    from lnbook.engine.results import Run

    cfg = E.get_config("quick", train_lens=(2,), batch_sizes=(4,), test_len=4, seeds=2)
    # per-step test errors (4 steps) of seeds 0 and 1: within = steps 1-2, past = steps 3-4
    errors = {"ln": [[0.2, 0.2, 0.3, 0.3], [0.1, 0.1, 0.2, 0.2]],
              "bn": [[0.1, 0.1, 0.4, 0.4], [0.2, 0.2, 0.2, 0.2]],
              "plain": [[0.1, 0.1, 0.5, 0.5], [0.4, 0.4, 0.4, 0.4]]}
    runs = [Run(E.variant_name(v, 2, 4), s, History(), {"error": e})
            for v, rows in errors.items() for s, e in enumerate(rows)]
    trivial = {"4": {"majority": [0.5, 0.45, 0.5, 0.5], "last_input": [0.4, 0.5, 0.3, 0.3]}}
    res = Results("rnn_length", dataclasses.asdict(cfg), "cpu", runs, {"trivial": trivial})
    q = E.c04_quantities(res)
    # best trivial within t <= 2: min(mean(0.5, 0.45), mean(0.4, 0.5)) = 0.45; bar 0.35
    assert q["best_trivial"] == pytest.approx(0.45)
    assert q["left"].tolist() == [True, False]  # seed 1's plain RNN errs 0.4 within
    np.testing.assert_allclose(q["ratio"]["bn"], [4.0, 1.0])
    got = E.c04_inputs(res)
    v = got["values"]
    np.testing.assert_allclose(v["BN degrades more than LN"], [4.0 - 1.5, 1.0 - 2.0])
    np.testing.assert_allclose(v["BN worse than LN past the training length"], [0.1, 0.0],
                               atol=1e-12)
    np.testing.assert_allclose(v["LN degrades no more than the plain RNN"], [1.5 - 5.0, 1.0])
    d = ledger.decide_claim("C04", **got)
    # seed 1 is masked: one seed counts, for each part (BN's past error 0.1 > margin 0.01)
    assert [(p.n_for, p.n_against) for p in d.parts.values()] == [(1, 0), (1, 0), (1, 0)]


def test_c05_inputs_from_hand_built_spans_and_drifts():
    from lnbook import ledger
    from lnbook.experiments import rnn_length as E

    gains, seeds = (0.5, 1.0, 3.0), (0, 1)
    # seed 0: the plain RNN's span moves 4 decades each way and its drift rises with the
    # gain; the LN-RNN's span stays within 0.2 of its value at gain 1 and drifts 0.01
    # seed 1: the plain span at gain 3 only 2 decades above; LN drifts 0.03 > log10 1.05
    span = {(0.5, False, 0): -4.0, (1.0, False, 0): 0.0, (3.0, False, 0): 4.0,
            (0.5, True, 0): 0.5, (1.0, True, 0): 0.4, (3.0, True, 0): 0.6,
            (0.5, False, 1): -4.0, (1.0, False, 1): 0.5, (3.0, False, 1): 2.5,
            (0.5, True, 1): 0.1, (1.0, True, 1): 0.1, (3.0, True, 1): 0.1}
    drift = {(0.5, False, 0): -1.0, (1.0, False, 0): 0.1, (3.0, False, 0): 2.0,
             (0.5, True, 0): 0.01, (1.0, True, 0): -0.01, (3.0, True, 0): 0.0,
             (0.5, False, 1): -1.0, (1.0, False, 1): -0.2, (3.0, False, 1): 2.0,
             (0.5, True, 1): 0.03, (1.0, True, 1): 0.0, (3.0, True, 1): 0.0}
    v = E.c05_inputs(span, drift, seeds, gains)["values"]
    assert v["plain RNN drifts with the scale"] == [True, False]
    assert v["LN removes the scale"] == [True, False]
    # largest |LN value| over the gains minus |plain value at gain 1|
    np.testing.assert_allclose(v["LN inputs steadier than plain at gamma 1"],
                               [0.01 - 0.1, 0.03 - 0.2])
    np.testing.assert_allclose(v["LN gradient steadier than plain at gamma 1"],
                               [0.6 - 0.0, 0.1 - 0.5])
    d = ledger.decide_claim("C05", values=v)
    assert d.parts["LN removes the scale"].n_for == 1


def test_impulse_dynamics_leaves_torch_rng_and_layer_norm_removes_the_scale():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    plain = {g: E.impulse_dynamics(g, False, 0, steps=30, hidden=16) for g in E.GAINS}
    assert torch.equal(torch.rand(3), expected)  # the global random state is untouched
    ln = {g: E.impulse_dynamics(g, True, 0, steps=30, hidden=16) for g in E.GAINS}
    # the same seed draws the same cell and input: at gain gamma the plain RNN's first summed
    # inputs are a_1 = W_ih x_1 (no state yet), identical across gamma; later ones scale
    first = {g: d.summed_input_rms[0].item() for g, d in plain.items()}
    assert first[0.5] == first[1.0] == first[3.0]
    # LN removes gamma: a_t = gamma Q h_{t-1} with no input after t = 0 (eps aside)
    for g in (0.5, 3.0):
        assert abs(E.span(ln[g]) - E.span(ln[1.0])) < 1e-3
    assert E.span(plain[0.5]) < E.span(plain[1.0]) - 3 < E.span(plain[3.0]) - 6
    d = plain[1.0]
    assert E.span(d) == pytest.approx(math.log10(d.grad_norm[0] / d.grad_norm[-1]))
    assert E.drift(d) == pytest.approx(
        math.log10(d.summed_input_rms[-1] / d.summed_input_rms[1]))
    # an input at every step: LN can no longer remove gamma
    every = [E.span(E.impulse_dynamics(g, True, 0, steps=30, hidden=16, every_step=True))
             for g in (0.5, 3.0)]
    assert abs(every[0] - every[1]) > 0.1


def test_c05_pilot_measures_the_quick_sizes_on_the_config_seeds():
    cfg = E.get_config("quick", seeds=(3, 4))
    out = E.c05_pilot(cfg)
    _, span, drift = E.c05_measure((3, 4), E.GAINS, *E.IMPULSE_SIZES["quick"])
    assert out == E.c05_inputs(span, drift, (3, 4), E.GAINS)
    assert [len(v) for v in out["values"].values()] == [2, 2, 2, 2]
    dyn, _, _ = E.c05_measure((3,), (1.0,), steps=11, hidden=8)
    assert set(dyn) == {(1.0, False, 3), (1.0, True, 3)}
    assert dyn[(1.0, True, 3)].grad_norm.shape == (11,)
