"""Tests of lnbook.experiments.first_sign (chapter 7, claim C22)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lnbook.experiments import EXPERIMENTS
from lnbook.experiments import first_sign as E


def test_first_sign_targets_are_the_sign_of_the_first_input():
    x, y = E.first_sign_batch(6, 5, torch.Generator().manual_seed(0))
    assert x.shape == (5, 6, 1) and y.shape == (5, 6)
    for b in range(6):
        assert torch.all(y[:, b] == float(x[0, b, 0] > 0))


@pytest.mark.parametrize("layer_norm", [True, False])
def test_first_sign_rnn_is_lnbook_rnn_with_a_readout(layer_norm):
    from lnbook import RNN
    model = E.FirstSignRNN(layer_norm, hidden=5, seed=3).double()
    if layer_norm:
        with torch.no_grad():
            model.gain.uniform_(0.5, 1.5)  # a trained gain, not the initial 1
    x = torch.randn(7, 4, dtype=torch.float64)
    rnn = RNN(1, 5, layer_norm=layer_norm, dtype=torch.float64)
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(model.w_ih[:, None])
        rnn.weight_hh_l0.copy_(model.w_hh)
        rnn.bias_ih_l0.copy_(model.bias)
        rnn.bias_hh_l0.zero_()
        if layer_norm:
            rnn.ln_l0.weight.copy_(model.gain)
            rnn.ln_l0.bias.zero_()
    h, _ = rnn(x[..., None])  # (T, B, H)
    torch.testing.assert_close(model(x), h @ model.w_out + model.b_out, rtol=1e-10, atol=1e-10)


def test_first_sign_rnn_variants_of_one_seed_start_from_the_same_weights():
    ln, plain, other = (E.FirstSignRNN(True, 4, 0), E.FirstSignRNN(False, 4, 0),
                        E.FirstSignRNN(False, 4, 1))
    for name in ("w_ih", "w_hh", "bias", "w_out", "b_out"):
        assert torch.equal(getattr(ln, name), getattr(plain, name)), name
        assert getattr(ln, name).abs().max() <= 0.5  # uniform in +-1/sqrt(4)
    assert not torch.equal(plain.w_hh, other.w_hh) and torch.equal(ln.gain, torch.ones(4))
    assert not hasattr(plain, "gain")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_first_sign_stack_trains_each_copy_as_alone(dtype, tol):
    """The engine's Stack and train_copies give each seed the numbers it gets alone."""
    from lnbook.engine import History, Stack, train_copies
    seeds, length, bs = (0, 1, 2), 6, 4

    def batches(k):  # copy k's data stream
        g = torch.Generator().manual_seed(10 + seeds[k])
        return [E.first_sign_batch(bs, length, g) for _ in range(5)]

    def trained(ks):
        stack = Stack([E.FirstSignRNN(True, 4, seeds[k]) for k in ks]).to(dtype)
        opt = torch.optim.Adam(stack.parameters(), lr=1e-2)
        data = [batches(k) for k in ks]

        def losses(step):
            x = torch.stack([d[step][0][..., 0] for d in data]).to(dtype)  # (M, T, B)
            y = torch.stack([d[step][1] for d in data]).to(dtype)
            return stack.call(E._loss, x, y)

        hist = train_copies(losses, lambda: [{} for _ in ks], opt,
                            [History() for _ in ks], 5, 5)
        return [h.losses for h in hist], stack.unstack()

    together, models = trained([0, 1, 2])
    for k in range(3):
        alone, (model,) = trained([k])
        np.testing.assert_allclose(together[k], alone[0], rtol=tol, atol=tol)
        for a, b in zip(models[k].parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_run_curves_and_pairing():
    cfg = E.get_config(lengths=(3, 5), batch_sizes=(2, 4), hidden_size=4, steps=4,
                       eval_every=2, n_eval=16, seeds=(0, 1, 2))
    res = E.curves(E.run(cfg, device="cpu"))
    assert list(res.steps) == [0, 2, 4] and res.seeds == (0, 1, 2)
    assert (res.lengths, res.batch_sizes) == ((3, 5), (2, 4))
    assert set(res.error) == {(v, L, b) for v in ("ln", "plain") for L in (3, 5)
                              for b in (2, 4)}
    e = res.curves("ln", 5, 2)
    assert e.shape == (3, 3) and np.all((0 <= e) & (e <= 1))
    # at step 0 nothing is trained yet: the error is that of the initial weights, the
    # same at both batch sizes (the same seeds give the same start)
    assert np.array_equal(res.curves("plain", 3, 2)[:, 0], res.curves("plain", 3, 4)[:, 0])
    again = E.curves(E.run(cfg, device="cpu"))  # a function of the seeds alone
    assert np.array_equal(again.curves("plain", 5, 4), res.curves("plain", 5, 4))
    one = E.curves(E.run(E.get_config(lengths=(5,), batch_sizes=(4,), hidden_size=4,
                                      steps=4, eval_every=2, n_eval=16, seeds=(1,)),
                         device="cpu"))
    np.testing.assert_allclose(one.curves("ln", 5, 4)[0], res.curves("ln", 5, 4)[1])
    with pytest.raises(TypeError, match="first_sign.Config"):
        E.run({"steps": 1})


def test_registered_with_presets_that_differ():
    q, p = E.get_config("quick"), E.get_config("paper")
    assert EXPERIMENTS["first_sign"] is E
    assert (q.lengths, q.batch_sizes) == (p.lengths, p.batch_sizes) == ((20, 60), (4, 64))
    assert p.hidden_size > q.hidden_size and p.steps > q.steps and p.threads is None


@pytest.mark.parametrize("call, match", [
    (lambda: E.get_config(lengths=(0,)), "lengths"),
    (lambda: E.get_config(batch_sizes=()), "batch_sizes"),
    (lambda: E.get_config(hidden_size=0), "hidden_size"),
    (lambda: E.get_config(variants=("bn",)), "variants"),
    (lambda: E.get_config(steps=0), "steps"),
    (lambda: E.FirstSignRNN(True, 0), "hidden"),
])
def test_bad_arguments_name_what_was_expected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_two_workers_give_the_numbers_of_one_process():
    kw = dict(lengths=(3,), batch_sizes=(2, 4), hidden_size=3, steps=2, eval_every=1,
              n_eval=4, seeds=(0, 1))
    one = E.run(E.get_config(**kw), device="cpu")
    two = E.run(E.get_config(workers=2, **kw), device="cpu")
    assert two.config["workers"] == 2
    for a, b in zip(one.runs, two.runs, strict=True):
        assert (a.variant, a.seed) == (b.variant, b.seed)
        assert a.history.losses == b.history.losses and a.history.metrics == b.history.metrics


def test_c22_inputs_combine_the_gains_of_the_four_settings():
    from lnbook import ledger

    # (seeds, 3 evaluations) held-out error at the last step; the start is left out
    curves = {("plain", 20, 4): [[0.5, 0.4, 0.2], [0.5, 0.5, 0.5]],
              ("ln", 20, 4): [[0.5, 0.2, 0.2], [0.5, 0.3, 0.1]],
              ("plain", 20, 64): [[0.5, 0.3, 0.3], [0.5, 0.4, 0.2]],
              ("ln", 20, 64): [[0.5, 0.3, 0.1], [0.5, 0.2, 0.2]],
              ("plain", 60, 4): [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]],
              ("ln", 60, 4): [[0.5, 0.1, 0.1], [0.5, 0.4, 0.3]],
              ("plain", 60, 64): [[0.5, 0.5, 0.5], [0.5, 0.4, 0.4]],
              ("ln", 60, 64): [[0.5, 0.3, 0.2], [0.5, 0.2, 0.2]]}
    res = E.Curves((20, 60), (4, 64), (0, 1), np.arange(3),
                   {k: np.array(v) for k, v in curves.items()})
    got = E.c22_inputs(res)
    v, ok = got["values"], got["trivial_ok"]
    # d = plain's mean after the start minus LN's: (20,4) 0.1, 0.3; (20,64) 0.1, 0.1;
    # (60,4) 0.4, 0.15; (60,64) 0.25, 0.2
    np.testing.assert_allclose(v["LN helps (length 60, batch 4)"], [0.4, 0.15])
    np.testing.assert_allclose(v["longer sequences, larger gain (batch 4)"], [0.3, -0.15])
    np.testing.assert_allclose(v["longer sequences, larger gain (batch 64)"], [0.15, 0.1])
    np.testing.assert_allclose(v["smaller batches, larger gain (length 20)"], [0.0, 0.2],
                               atol=1e-12)
    np.testing.assert_allclose(v["smaller batches, larger gain (length 60)"], [0.15, -0.05])
    # seed 1's LN ends at 0.3 > 0.25 at length 60, batch 4: it counts only at length 20
    assert ok["LN helps (length 60, batch 4)"].tolist() == [True, False]
    assert ok["smaller batches, larger gain (length 20)"].tolist() == [True, True]
    d = ledger.decide_claim("C22", **got)
    assert d.parts["LN helps (length 60, batch 4)"].n_for == 1
    assert d.parts["smaller batches, larger gain (length 20)"].n_for == 1


def test_curves_read_back_from_the_results_file_are_the_run_s(tmp_path):
    from lnbook.engine import load_results, results_file

    cfg = E.get_config(lengths=(3,), batch_sizes=(2,), hidden_size=3, steps=2, eval_every=1,
                       n_eval=4, seeds=(0, 1))
    res = E.run(cfg, device="cpu", out=tmp_path)
    back = E.curves(load_results(results_file(tmp_path, res.name, res.config)))
    here = E.curves(res)
    assert (back.lengths, back.batch_sizes, back.seeds) == ((3,), (2,), (0, 1))
    assert list(back.steps) == [0, 1, 2]
    for key in here.error:
        np.testing.assert_array_equal(back.error[key], here.error[key])
