"""lnbook.experiments.why: the experiment of chapter 6.8 (why does normalization help?)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lnbook.batched import seed_batches, seed_nll
from lnbook.data import load_digits_tensor
from lnbook.engine.train import Batches
from lnbook.exercises import digits_split
from lnbook.experiments import why

TINY = dict(depth=3, width=16, steps=6, eval_every=3, seeds=(0,))


def _alone(variant, seed, config, momentum=None, hidden_lr=None):
    """The reference: one network of ``variant`` trained alone by a plain SGD loop (the same
    batches and groups as the experiment); test NLL at every eval_every updates."""
    x, y, xt, yt = digits_split()
    torch.manual_seed(seed)
    model = why.build(variant, config)
    hidden = [lin.weight for lin in model.linears[:-1]]
    ids = {id(w) for w in hidden}
    opt = torch.optim.SGD(
        [{"params": hidden, "lr": config.lr if hidden_lr is None else hidden_lr},
         {"params": [p for p in model.parameters() if id(p) not in ids]}], lr=config.lr,
        momentum=config.momentum if momentum is None else momentum)
    batches = Batches(x, y, batch_size=config.batch_size, seed=seed)
    norms0 = [float(w.detach().norm()) for w in hidden]

    def nll(xs, ys):
        model.eval()
        with torch.no_grad():
            out = float(F.cross_entropy(model(xs), ys))
        model.train()
        return out

    steps, test = [0], [nll(xt, yt)]
    for step in range(1, config.steps + 1):
        xb, yb = batches(step - 1)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        if step % config.eval_every == 0:
            steps.append(step)
            test.append(nll(xt, yt))
    return {"steps": steps, "test_nll": np.array(test), "train_nll": nll(x, y),
            "weight_norms": np.array([norms0, [float(w.detach().norm()) for w in hidden]]),
            "model": model.eval()}


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


def test_run_records_a_curve_and_learns():
    cfg = why.get_config(depth=2, width=32, steps=60, eval_every=30, seeds=(0,),
                         variants=("layer",))
    res = why.run(cfg, device="cpu")
    assert res.name == "why" and res.seeds == [0]
    (run,) = res.select("layer")
    test = run.history.metric("test_nll")
    assert run.history.eval_steps == [0, 30, 60]
    assert test[0] > math.log(10) - 0.3  # no better than chance at update 0
    assert test[-1] < test[0] - 0.5  # and it learned
    assert np.array(run.info["weight_norms"]).shape == (2, 2) and not run.info["diverged"]
    assert np.array(run.info["unit_rates"]).shape == (2, 32)


def test_hidden_lr_reaches_only_the_hidden_weights():
    cfg = why.get_config(**TINY)
    model = why.seed_model("layer", (0,), cfg)
    why.train_stack(model, (0,), cfg, momentum=0.0, hidden_lr=0.0)
    fresh = why.seed_model("layer", (0,), cfg)
    for a, b in zip(model.hidden_weights, fresh.hidden_weights, strict=True):
        assert torch.equal(a, b)  # step size 0: unchanged
    assert not torch.equal(model.weights[-1], fresh.weights[-1])


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
    res = why.run(cfg, device="cpu")
    assert res.variants == ["none", "batch"] and all(len(res.select(v)) == 2
                                                     for v in res.variants)
    sweep = why.lr_sweep(cfg, (0.01, 0.1), norms=("layer",), seeds=(0,))
    assert set(sweep) == {("layer", 0.01), ("layer", 0.1)}


@pytest.mark.parametrize("variant", ["layer", "batch", "none"])
def test_run_equals_each_seed_trained_alone(variant):
    cfg = why.get_config(depth=3, width=16, steps=20, eval_every=10, seeds=(0, 1),
                         variants=(variant,))
    res = why.run(cfg, device="cpu")
    for seed, run in zip((0, 1), res.select(variant), strict=True):
        alone = _alone(variant, seed, cfg)
        assert run.history.eval_steps == alone["steps"]
        np.testing.assert_allclose(run.history.metric("test_nll"), alone["test_nll"],
                                   atol=1e-5)
        np.testing.assert_allclose(run.info["weight_norms"], alone["weight_norms"],
                                   rtol=1e-5)
        assert run.info["train_nll"] == pytest.approx(alone["train_nll"], abs=1e-5)
        rates = why.unit_rates(alone["model"], digits_split()[2])
        assert np.abs(np.array(run.info["unit_rates"]) - rates).max() < 0.01


def test_run_marks_a_diverging_seed_and_keeps_the_others(monkeypatch):
    cfg = why.get_config(depth=3, width=16, steps=30, eval_every=10, seeds=(0, 1),
                         variants=("none",))
    make = why.seed_model

    def blown(variant, seeds, config):  # seed 1 starts with infinite logits
        model = make(variant, seeds, config)
        with torch.no_grad():
            model.weights[-1][1].fill_(math.inf)
        return model

    monkeypatch.setattr(why, "seed_model", blown)
    bad = why.run(cfg, device="cpu")
    monkeypatch.undo()
    good = why.run(cfg, device="cpu")
    b0, b1 = bad.select("none")
    assert b1.info["diverged"] and b1.info["train_nll"] == math.inf
    assert b1.info["diverged_at"] == 1
    assert b1.history.eval_steps == [0]  # the curve is cut at the first update
    assert why.final_nll(bad, "none")[1][1] == math.inf
    assert not b0.info["diverged"]
    np.testing.assert_allclose(b0.history.metric("test_nll"),
                               good.select("none")[0].history.metric("test_nll"), atol=1e-6)


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


# -- Santurkar et al.'s noise, the watched runs, weight decay, the evidence table --------------


def test_example_noise_draws_every_activation_from_a_distribution_drawn_per_update():
    torch.manual_seed(0)
    r, n, h = 0.3, 4096, 1024
    x = torch.ones(n, h, dtype=torch.float64) * torch.linspace(0.5, 2.0, h)  # rms_i = x_i
    rms = x[0]
    noise = why.ExampleNoise(r)
    out = noise(x)
    # not one affine map per unit: examples with the same input get different outputs
    assert float((out[0] - out[1]).abs().min()) > 0
    mu = (out - x).mean(0) / rms  # (H,) each unit's mean shift in units of its rms
    assert float(mu.mean()) == pytest.approx(r, abs=0.03)  # mean r rms ...
    assert float(mu.std()) == pytest.approx(r, rel=0.1)  # ... spread r rms, drawn per unit
    # variance per unit: factor r^2 rms^2 / 3 plus a spread ~ U(0, 2r) rms: 5 r^2 / 3 on average
    var = (out / rms).var(0)
    assert float(var.mean()) == pytest.approx(5 * r**2 / 3, rel=0.05)
    assert float(var.min()) < r**2 / 3 + 0.02 < 1.5 * r**2 < float(var.max())
    assert not torch.allclose(noise(x).mean(0), out.mean(0))  # a new distribution per update
    assert torch.equal(noise.eval()(x), x)
    with pytest.raises(ValueError, match="size"):
        why.ExampleNoise(1.0)


def test_noise_model_checks_and_equals_seed_model_without_noise():
    cfg = why.get_config(**TINY)
    x = torch.rand(32, 64)
    clean = why.seed_model("layer", (0, 1), cfg)
    for kind in why.NOISES:
        model = why.noise_model("layer", [(kind, 0.0, 0), (kind, 0.0, 1)], cfg)
        torch.testing.assert_close(model(x), clean(x), rtol=0, atol=0)
        noisy = why.noise_model("layer", [(kind, 0.3, 0), (kind, 0.3, 1)], cfg)
        torch.testing.assert_close(noisy.eval()(x), clean.eval()(x), rtol=0, atol=0)
        assert not torch.allclose(noisy.train()(x), clean.train()(x))
    with pytest.raises(ValueError, match="kind"):
        why.noise_model("layer", [("gauss", 0.1, 0)], cfg)
    with pytest.raises(ValueError, match="size"):
        why.noise_model("layer", [("example", 1.5, 0)], cfg)


def test_noise_model_gives_each_copy_its_own_kind_and_size():
    cfg = why.get_config(**TINY)
    model = why.noise_model("none", [("shared", 0.3, 0), ("example", 0.3, 0),
                                     ("example", 0.0, 0)], cfg).train()
    torch.manual_seed(0)
    h = torch.randn(1, 256, 8, dtype=torch.float64).expand(3, 256, 8) * 2
    out = model._noise(h)
    # the shared copy: one affine map per unit, the same for every example
    s = (out[0, 1] - out[0, 0]) / (h[0, 1] - h[0, 0])
    torch.testing.assert_close(out[0], h[0] * s + (out[0, 0] - s * h[0, 0]))
    # the per-example copy: no such map; the copy of size 0: untouched
    s = (out[1, 1] - out[1, 0]) / (h[1, 1] - h[1, 0])
    assert (out[1] - (h[1] * s + out[1, 0] - s * h[1, 0])).abs().max() > 0.1
    assert torch.equal(out[2], h[2])


def test_noise_runs_trains_every_kind_of_a_norm_together():
    cfg = why.get_config(depth=3, width=16, steps=20, eval_every=20, seeds=(0, 1))
    out = why.noise_runs(cfg, 0.0, norms=("layer",), seeds=(0, 1))  # no noise: plain runs
    ref = [_alone("layer", s, cfg) for s in (0, 1)]
    assert set(out) == set(why.NOISES) and set(out["example"]) == {"layer"}
    for kind in why.NOISES:
        np.testing.assert_allclose(out[kind]["layer"]["train_nll"],
                                   [r["train_nll"] for r in ref], atol=1e-5)
        assert out[kind]["layer"]["diverged_at"].shape == (2,)


@pytest.mark.parametrize("variant", ["none", "layer+noise", "batch+noise"])
def test_train_stack_equals_run(variant):
    cfg = why.get_config(depth=3, width=16, steps=20, eval_every=20, seeds=(0, 1),
                         variants=(variant,))
    norm, _, noisy = variant.partition("+")
    size = cfg.noise if noisy else 0.0
    model = why.noise_model(norm, [("shared", size, 0), ("shared", size, 1)], cfg)
    out = why.train_stack(model, (0, 1), cfg)
    res = why.run(cfg, device="cpu")
    ref = [{"train_nll": r.info["train_nll"], "test_nll": r.history.metric("test_nll")}
           for r in res.select(variant)]
    np.testing.assert_allclose(out["train_nll"], [r["train_nll"] for r in ref], atol=1e-5)
    np.testing.assert_allclose(out["test_nll"], [r["test_nll"][-1] for r in ref], atol=1e-5)
    assert np.isinf(out["diverged_at"]).all()


def test_train_stack_marks_a_diverging_seed_and_keeps_the_others():
    cfg = why.get_config(depth=3, width=16, steps=10, eval_every=10, seeds=(0, 1))
    good = why.train_stack(why.seed_model("none", (0, 1), cfg), (0, 1), cfg)
    model = why.seed_model("none", (0, 1), cfg)
    with torch.no_grad():
        model.weights[-1][1].fill_(math.inf)  # seed 1: infinite logits from the start
    bad = why.train_stack(model, (0, 1), cfg, watch=True)
    assert bad["diverged_at"][1] == 1 and np.isinf(bad["diverged_at"][0])
    assert bad["train_nll"][1] == math.inf and bad["test_nll"][1] == math.inf
    assert bad["train_nll"][0] == pytest.approx(good["train_nll"][0], abs=1e-6)
    assert bad["rms"].shape == (2, 10, 3) and bad["norm"].shape == (2, 11, 3)


def test_train_stack_weight_decay_follows_the_identity_with_decay():
    cfg = why.get_config(depth=3, width=16, steps=1, eval_every=1, seeds=(0, 1))
    lr, wd = 0.5, 0.1
    # the first update's gradient, computed here on the first batch
    x, y, _, _ = digits_split()
    ref = why.seed_model("layer", (0, 1), cfg).double()
    xb, yb = seed_batches(x, y, cfg.batch_size, (0, 1))(0)
    seed_nll(ref(xb.double()), yb).sum().backward()
    w0 = [w.detach() for w in ref.hidden_weights]
    g = [w.grad for w in ref.hidden_weights]
    out = why.train_stack(why.seed_model("layer", (0, 1), cfg), (0, 1), cfg, hidden_lr=lr,
                          momentum=0.0, weight_decay=wd, watch=True)
    for k, (w, gk) in enumerate(zip(w0, g, strict=True)):
        n0, gn = w.norm(dim=(1, 2)), gk.norm(dim=(1, 2))  # (S,)
        assert float((w * gk).sum() / (w.norm() * gk.norm())) == pytest.approx(0, abs=1e-4)
        want = torch.sqrt((1 - lr * wd) ** 2 * n0**2 + lr**2 * gn**2)
        np.testing.assert_allclose(out["norm"][:, 0, k], n0.numpy(), rtol=1e-6)
        np.testing.assert_allclose(out["norm"][:, 1, k], want.numpy(), rtol=1e-5)
        turn = torch.atan(lr * gn / ((1 - lr * wd) * n0))  # g is orthogonal to W
        np.testing.assert_allclose(out["turn"][:, 0, k], turn.numpy(), rtol=1e-3)


def test_decay_runs_and_summary():
    cfg = why.get_config(depth=2, width=16, steps=40, eval_every=40, seeds=(0, 1))
    runs = why.decay_runs(cfg, ((1.0, 0.0), (1.0, 0.1)), seeds=(0, 1))
    no, wd = (why.decay_summary(runs[k], *k, last=10) for k in ((1.0, 0.0), (1.0, 0.1)))
    assert (no["norm_end"] > no["norm_start"]).all()  # without decay: only growth
    assert (wd["norm_end"] < no["norm_end"]).all()
    assert wd["predicted"][0] == pytest.approx(math.sqrt(0.2)) and no["predicted"][0] == 0
    rec = {"norm": np.ones((1, 5, 2)) * np.array([1, 1, 2, 2, 4])[None, :, None],
           "turn": np.arange(4.0)[None, :, None].repeat(2, 2), "train_nll": np.array([0.5])}
    s = why.decay_summary(rec, 0.5, 0.01, last=2)
    assert s["change_first"][0] == pytest.approx(1.0)  # 2 / 1 - 1
    assert s["settle"][0] == pytest.approx(1.0)  # mean(2, 4) / mean(1, 2) - 1
    assert s["turn_first"][0] == 0.5 and s["turn_end"][0] == 2.5
    assert s["predicted"][0] == pytest.approx(0.1) and s["norm_end"][0] == 4
    with pytest.raises(ValueError, match="last"):
        why.decay_summary(rec, 0.5, 0.01, last=3)


def test_largest_safe_and_pilot_noise():
    def rec(div, nll):
        return {"diverged_at": np.array(div, float), "train_nll": np.array(nll, float)}

    pilot = {("shared", 0.1): rec([np.inf, np.inf], [0.5, 0.6]),
             ("example", 0.1): rec([np.inf, np.inf], [0.4, 0.5]),
             ("shared", 0.2): rec([np.inf, np.inf], [1.0, 2.5]),
             ("example", 0.2): rec([np.inf, np.inf], [0.9, 1.1]),
             ("shared", 0.3): rec([np.inf, 50], [1.0, np.inf]),
             ("example", 0.3): rec([np.inf, np.inf], [0.9, 1.1])}
    assert why.largest_safe(pilot) == 0.2
    assert why.largest_safe(pilot, below=math.log(10)) == 0.1
    with pytest.raises(ValueError, match="every size"):
        why.largest_safe(pilot, below=0.1)
    cfg = why.get_config(**TINY)
    out = why.pilot_noise(cfg, (0.05,), (7, 8))
    assert set(out) == {("shared", 0.05), ("example", 0.05)}
    assert out[("example", 0.05)]["train_nll"].shape == (2,)


def test_blowup_rows_reads_the_updates_before_the_blow_up():
    rms = np.arange(2 * 50 * 3, dtype=float).reshape(2, 50, 3)
    noisy = {"diverged_at": np.array([np.inf, 40.0]), "rms": rms}
    clean = {"rms": -rms}
    rows = why.blowup_rows(noisy, clean, before=10)
    assert len(rows) == 1  # only the seed that diverged
    i, at, *vals = rows[0]
    assert (i, at) == (1, 40)
    idx = [0, 29, 38]  # the first update, 10 before update 40, and the one before it
    assert vals == [*rms[1, idx, 0], *rms[1, idx, -1], *(-rms[1, idx, -1])]


def test_blowup_watches_the_plain_network_with_the_shared_noise():
    cfg = why.get_config(depth=3, width=16, steps=12, eval_every=12, seeds=(0, 1),
                         variants=("none+noise",))
    out = why.blowup(cfg)
    ref = why.final_nll(why.run(cfg, device="cpu"), "none+noise")[1]  # the same updates
    np.testing.assert_allclose(out["train_nll"], ref, atol=1e-5)
    assert out["rms"].shape == (2, 12, 3) and (out["rms"] > 0).all()


MEASURED = dict(
    n=10, majority=8, shared_cost={"none": 10, "layer": 10, "batch": 10}, shared_blown=6,
    ex_size=0.05, ex_cost={"none": 4, "layer": 3, "batch": 2}, ex_blown=0,
    ex_better={"layer": 6, "batch": 10}, cos_max=5.3e-18, identity_err=2e-16,
    growth_ordered=10, none5_diverged=10, ln5_diverged=0, ln5_above_chance=10,
    ln5_median=2.324, ln5_worse=10, settled=10, turn_ratio=[0.86, 0.85], decay_fail=10,
    detach_worse_simple=10, detach_worse_none=10, beta_less={"layer": 3, "batch": 3},
    x2_ratio=2.4, bn_train_better=10, bn_test_better=10)


def _row(rows, start):
    hits = [r for r in rows if r[0].startswith(start)]
    assert len(hits) == 1, start
    return hits[0]


def test_evidence_rows_say_what_the_run_showed():
    rows = why.evidence_rows(MEASURED)
    assert len(rows) == 9 and all(len(r) == 3 for r in rows)
    step = _row(rows, "at a step size where the plain network diverges")
    assert "does not train there" in step[0] and step[1] == "**known**"
    assert "2.324" in step[2] and "above chance (2.303) on 10 of 10 seeds" in step[2]
    assert "section 2, table 6.8.6" in step[2]
    det = _row(rows, "dropping the gradients")
    assert "not that the projection is where" in det[0]
    assert "worse than no normalization" in det[0]
    decay = _row(rows, "with weight decay a normalized layer's length and direction part")
    assert "figure 6.8.1" in decay[2] and "0.86 and 0.85" in decay[2]
    assert _row(rows, "with normalization the learning rate")[1] == "**folklore**, as stated"
    assert all("section" in r[2] for r in rows)


def test_evidence_rows_say_less_when_the_counts_fall_short():
    trains = why.evidence_rows({**MEASURED, "ln5_above_chance": 1})
    assert _row(trains, "normalization lets a network train")[1] == "**known**"
    weak = why.evidence_rows({**MEASURED, "growth_ordered": 7, "detach_worse_none": 5,
                              "turn_ratio": [0.5, 0.9], "none5_diverged": 3,
                              "ln5_worse": 2, "decay_fail": 1, "bn_test_better": 4})
    inv = _row(weak, "a normalized layer's weights are orthogonal")
    assert "larger step" not in inv[0]
    det = _row(weak, "dropping the gradients")
    assert "worse than no normalization" not in det[0]
    assert _row(weak, "with weight decay the length")[1] == "not shown here"
    assert _row(weak, "normalization keeps a network")[1] == "not shown here"
    assert _row(weak, "with normalization the learning rate")[1] == "not contradicted here"
    assert _row(weak, "layer norm is always")[1] == "not contradicted here"
    with pytest.raises(KeyError, match="x2_ratio"):
        why.evidence_rows({k: v for k, v in MEASURED.items() if k != "x2_ratio"})
