"""lnbook.why: the measurements of chapter 6.8 (why does normalization help?)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lnbook import why
from lnbook.data import load_digits_tensor

TINY = dict(depth=3, width=16, steps=6, eval_every=3, seeds=(0,))


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="variants"):
        why.get_config(variants=("layer", "group"))
    with pytest.raises(ValueError, match="unknown Config fields"):
        why.get_config(width_=3)
    with pytest.raises(ValueError, match="noise"):
        why.get_config(noise=-0.1)


def test_signal_noise_moves_each_unit_by_one_draw_shared_by_the_batch():
    torch.manual_seed(0)
    h = torch.randn(256, 8, dtype=torch.float64) * torch.arange(1, 9)  # (N, H) rms 1..8
    noise = why.SignalNoise(0.5)
    out = noise(h)
    # one affine map per unit, shared by every example: out = s * h + m, column by column
    s = (out[1] - out[0]) / (h[1] - h[0])  # (H,)
    m = out[0] - s * h[0]
    assert torch.allclose(out, h * s + m, atol=1e-10)
    assert bool(((s >= 0.5) & (s <= 1.5)).all())
    # the shift is measured in units of each unit's own rms: never above r (1 + 5 sd) rms
    rms = h.square().mean(0).sqrt()
    assert bool((m.abs() < 0.5 * 6 * rms).all())
    # a fresh draw at the next update, and nothing in evaluation mode
    assert not torch.allclose(noise(h), out)
    assert torch.equal(noise.eval()(h), h)
    with pytest.raises(ValueError, match="size"):
        why.SignalNoise(1.0)


def test_build_puts_the_noise_after_every_norm():
    cfg = why.get_config(**TINY)
    model = why.build("layer+noise", cfg)
    assert len(model.norms) == 3
    assert all(isinstance(n[1], why.SignalNoise) for n in model.norms)
    assert not any(isinstance(m, why.SignalNoise) for m in why.build("batch", cfg).modules())
    with pytest.raises(ValueError, match="variant"):
        why.build("group", cfg)


def test_train_deep_records_a_curve_and_learns():
    cfg = why.get_config(depth=2, width=32, steps=60, eval_every=30, seeds=(0,))
    rec = why.train_deep("layer", 0, cfg)
    assert rec["steps"].tolist() == [0, 30, 60]
    assert rec["test_nll"][0] > math.log(10) - 0.3  # no better than chance at update 0
    assert rec["test_nll"][-1] < rec["test_nll"][0] - 0.5  # and it learned
    assert rec["weight_norms"].shape == (2, 2) and not rec["diverged"]
    assert not rec["model"].training


def test_hidden_lr_reaches_only_the_hidden_weights():
    cfg = why.get_config(**TINY)
    rec = why.train_deep("layer", 0, cfg, momentum=0.0, hidden_lr=0.0)
    torch.manual_seed(0)
    fresh = why.build("layer", cfg)
    for a, b in zip(rec["model"].linears[:-1], fresh.linears[:-1], strict=True):
        assert torch.equal(a.weight, b.weight)  # step size 0: unchanged
    assert not torch.equal(rec["model"].linears[-1].weight, fresh.linears[-1].weight)


def test_norm_growth_step_follows_pythagoras_for_a_weight_before_a_norm():
    x, y = load_digits_tensor("train", flatten=True)
    cfg = why.get_config(depth=3, width=32)
    torch.manual_seed(0)
    model = why.build("layer", cfg).double()
    out = why.norm_growth_step(model, x[:64].double(), y[:64], lr=2.0)
    assert abs(out["cos"]) < 1e-6  # the gradient is orthogonal to W (up to eps)
    assert out["after"] == pytest.approx(out["predicted"], rel=1e-8)
    assert out["after"] > out["before"] * 1.001
    torch.manual_seed(0)
    plain = why.build("none", cfg).double()
    out = why.norm_growth_step(plain, x[:64].double(), y[:64], lr=2.0)
    assert abs(out["cos"]) > 1e-3  # no invariance, no orthogonality
    assert abs(out["after"] - out["predicted"]) > 1e-6 * out["before"]


def test_landscape_scales_with_the_weights_of_a_normalized_network():
    x, y = load_digits_tensor("train", flatten=True)
    cfg = why.get_config(depth=3, width=32, init_scale=1.0)
    torch.manual_seed(0)
    model = why.build("layer", cfg).double()
    x, y = x[:128].double(), y[:128]
    before = [p.detach().clone() for p in model.parameters()]
    a = why.landscape(model, x, y, lr=0.01)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    with torch.no_grad():
        for lin in model.linears[:-1]:
            lin.weight.mul_(2.0)  # the same function
    b = why.landscape(model, x, y, lr=0.01)
    assert a["loss_range"] > 0 and b["beta"] < a["beta"] / 1.5


def test_unit_rates_counts_dead_and_always_on_units():
    cfg = why.get_config(depth=2, width=4)
    torch.manual_seed(0)
    model = why.build("none", cfg)
    with torch.no_grad():
        for lin in model.linears[:-1]:
            lin.weight.zero_()
            lin.bias.copy_(torch.tensor([-1.0, 1.0, -1.0, 1.0]))
    rates = why.unit_rates(model, torch.rand(10, 64))
    assert rates.shape == (2, 4)
    assert np.array_equal(rates, np.tile([0.0, 1.0, 0.0, 1.0], (2, 1)))


def test_run_and_lr_sweep_return_one_record_per_seed():
    cfg = why.get_config(**{**TINY, "seeds": (0, 1)}, variants=("none", "batch"))
    res = why.run(cfg)
    assert set(res) == {"none", "batch"} and all(len(r) == 2 for r in res.values())
    sweep = why.lr_sweep(cfg, (0.01, 0.1), norms=("layer",), seeds=(0,))
    assert set(sweep) == {("layer", 0.01), ("layer", 0.1)}


@pytest.mark.parametrize("variant", ["layer", "batch", "none"])
def test_train_seeds_equals_train_deep_seed_by_seed(variant):
    cfg = why.get_config(depth=3, width=16, steps=20, eval_every=10, seeds=(0, 1))
    together = why.train_seeds(variant, (0, 1), cfg)
    for seed, rec in zip((0, 1), together, strict=True):
        alone = why.train_deep(variant, seed, cfg)
        assert rec["steps"].tolist() == alone["steps"].tolist()
        np.testing.assert_allclose(rec["test_nll"], alone["test_nll"], atol=1e-4)
        np.testing.assert_allclose(rec["weight_norms"], alone["weight_norms"], rtol=1e-5)
        assert rec["train_nll"] == pytest.approx(alone["train_nll"], abs=1e-4)
        for a, b in zip(rec["model"].parameters(), alone["model"].parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_train_seeds_marks_a_diverging_seed_and_keeps_the_others(monkeypatch):
    cfg = why.get_config(depth=3, width=16, steps=30, eval_every=10, seeds=(0, 1))
    make = why.seed_model

    def blown(variant, seeds, config):  # seed 1 starts with infinite logits
        model = make(variant, seeds, config)
        with torch.no_grad():
            model.weights[-1][1].fill_(math.inf)
        return model

    monkeypatch.setattr(why, "seed_model", blown)
    bad = why.train_seeds("none", (0, 1), cfg)
    monkeypatch.setattr(why, "seed_model", make)
    good = why.train_seeds("none", (0, 1), cfg)
    assert bad[1]["diverged"] and bad[1]["train_nll"] == math.inf
    assert bad[1]["steps"].tolist() == [0]  # the curve is cut at the first update
    assert not bad[0]["diverged"]
    np.testing.assert_allclose(bad[0]["test_nll"], good[0]["test_nll"], atol=1e-6)


def test_landscape_seeds_equals_landscape_per_seed():
    x, y = load_digits_tensor("train", flatten=True)
    cfg = why.get_config(depth=3, width=32)
    model = why.seed_model("layer", (0, 1), cfg).double()
    out = why.landscape_seeds(model, x[:128].double(), y[:128], lr=0.05)
    for i, seed in enumerate((0, 1)):
        torch.manual_seed(seed)
        one = why.build("layer", cfg).double()
        ref = why.landscape(one, x[:128].double(), y[:128], lr=0.05)
        assert out["beta"][i] == pytest.approx(ref["beta"], rel=1e-8)
        assert out["loss_range"][i] == pytest.approx(ref["loss_range"], rel=1e-8)


def test_stats_seeds_equals_chapter_13s_run_stats():
    from lnbook.experiments import mistakes

    sc = mistakes.get_stats_config(seeds=(0, 1), steps=20, eval_every=10)
    together = why.stats_seeds(sc)
    alone = mistakes.run_stats(sc)
    for norm in sc.norms:
        np.testing.assert_allclose(together[norm]["val_nll"], alone.final(norm, "val_nll"),
                                   atol=1e-4)
