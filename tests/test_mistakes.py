"""lnbook.experiments.mistakes: each wrong version against the right one, weight conversion,
DeepNorm's placements and the update-size sweep."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from lnbook import LayerNorm, layer_norm
from lnbook.data import load_digits_tensor
from lnbook.experiments import EXPERIMENTS
from lnbook.experiments import mistakes as mk


def _x(*shape, scale=1.0, offset=0.0, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (offset + scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def test_right_version_is_torch_layer_norm():
    x = _x(5, 12)
    torch.testing.assert_close(mk.layer_norm_variant(x), F.layer_norm(x, (12,)))
    h = _x(5, 12, scale=300, dtype=torch.float16)  # statistics in float32
    torch.testing.assert_close(mk.layer_norm_variant(h), F.layer_norm(h.float(), (12,)).half())


def test_unbiased_variance_shrinks_by_sqrt_h_minus_1_over_h():
    x = _x(5, 6)
    ratio = mk.layer_norm_variant(x, eps=1e-12, unbiased=True) / mk.layer_norm_variant(
        x, eps=1e-12)
    torch.testing.assert_close(ratio, torch.full_like(ratio, math.sqrt(5 / 6)))
    with pytest.raises(ValueError, match="H >= 2"):
        mk.layer_norm_variant(_x(3, 1), unbiased=True)


def test_one_pass_variance_cancels_at_large_means():
    x = _x(4, 256, offset=1e4)
    ref = mk.layer_norm_variant(x)
    torch.testing.assert_close(mk.layer_norm_variant(x, one_pass=True), ref)  # float64: fine
    one = mk.layer_norm_variant(x.float(), one_pass=True).double()
    two = mk.layer_norm_variant(x.float()).double()
    assert (two - ref).abs().max() < 1e-2
    assert not (one - ref).abs().max() < 0.1  # wrong, or NaN


def test_eps_outside_the_root():
    x = _x(3, 8, scale=3e-3)
    mu, sd = x.mean(-1, keepdim=True), x.std(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(mk.layer_norm_variant(x, eps_inside=False), (x - mu) / (sd + 1e-5))
    const = torch.ones(2, 8, dtype=torch.float64, requires_grad=True)
    (g_in,) = torch.autograd.grad(mk.layer_norm_variant(const).sum(), const)
    (g_out,) = torch.autograd.grad(mk.layer_norm_variant(const, eps_inside=False).sum(), const)
    assert g_in.isfinite().all() and g_out.isnan().any()


def test_float16_statistics_overflow():
    h = _x(2, 16, scale=300, dtype=torch.float16)
    assert torch.isinf(h.square()).any()  # the premise: x ** 2 overflows in float16
    wrong = mk.layer_norm_variant(h, stats_dtype=torch.float16).double()
    ref = mk.layer_norm_variant(h.double())
    assert not (wrong - ref).abs().max() < 0.1
    with pytest.raises(TypeError, match="floating-point"):
        mk.layer_norm_variant(torch.ones(2, 3, dtype=torch.long))


def test_unbiased_layer_norm_shares_lnbooks_state_dict():
    ours, theirs = mk.UnbiasedLayerNorm(6), LayerNorm(6)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict())
    x = _x(3, 6, dtype=torch.float32)
    torch.testing.assert_close(ours(x), mk.layer_norm_variant(x, unbiased=True))
    assert "unbiased" in repr(ours)


def _perturbed_unbiased_mlp() -> mk.DigitsMLP:
    torch.manual_seed(0)
    model = mk.DigitsMLP("unbiased", hidden=5).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def test_to_biased_is_exact_and_naive_loading_is_not():
    model = _perturbed_unbiased_mlp()
    x = torch.rand(7, 64)
    conv = mk.to_biased(model)
    assert isinstance(conv.norm1, LayerNorm) and conv.norm1.eps == pytest.approx(1e-5 * 4 / 5)
    torch.testing.assert_close(conv(x), model(x), atol=1e-5, rtol=1e-5)
    naive = mk.DigitsMLP("biased", hidden=5).eval()
    naive.load_state_dict(model.state_dict())
    assert (naive(x) - model(x)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="norm='unbiased'"):
        mk.to_biased(naive)
    with pytest.raises(ValueError, match="norm must be"):
        mk.DigitsMLP("rms")


def test_train_digits_mlp_returns_an_eval_model():
    model = mk.train_digits_mlp("biased", hidden=4, steps=3)
    assert not model.training and model(torch.rand(2, 64)).shape == (2, 10)


def test_residual_placements():
    x, b = _x(4, 10), _x(4, 10, seed=1)
    out = mk.residual_placements(x, b, alpha=3.0)
    torch.testing.assert_close(out["residual"], layer_norm(x + b / 3.0, 10), atol=1e-4,
                               rtol=0)
    torch.testing.assert_close(out["branch"], layer_norm(x + 3.0 * b, 10))
    torch.testing.assert_close(out["output"], 3.0 * layer_norm(x + b, 10))
    with pytest.raises(ValueError, match="same shape"):
        mk.residual_placements(x, b[:, :5], 2.0)


def test_run_tiny_and_paper_override():
    assert EXPERIMENTS["mistakes"] is mk
    cfg = mk.get_config("quick", depths=(1, 3), seeds=(0,), n_probe=4, batch_size=4)
    res = mk.run(cfg, device="cpu")
    assert res.variants == ["post/L1", "deepnorm/L1", "post/L3", "deepnorm/L3"]
    for v in res.variants:
        steps, upd = res.curves(v, "update")
        assert list(steps) == [0, 1] and upd[0, 0] == 0 and upd[0, 1] > 0
    paper = mk.get_config("paper")
    assert max(paper.depths) == 200 and paper.steps == 100
    tiny = mk.get_config("paper", depths=(2,), d_model=16, n_heads=2, length=4, steps=1,
                         batch_size=4, n_probe=4, seeds=(0,))
    assert len(mk.run(tiny, device="cpu").runs) == 2
    with pytest.raises(ValueError, match="kinds"):
        mk.get_config("quick", kinds=("pre",))
    with pytest.raises(TypeError, match="mistakes.Config"):
        mk.run({"scale": "quick"})


# ---------------------------------------------------------------------------------------------
# the statistics' gradients and the gain and bias (Xu et al., 2019)


def test_detach_norm_forward_is_layer_norm_and_backward_treats_statistics_as_constants():
    x = _x(4, 12, scale=2.0, offset=0.5).requires_grad_()
    up = _x(4, 12, seed=1)  # gradient from above
    norm = mk.DetachNorm(12)
    out = norm(x)
    torch.testing.assert_close(out, F.layer_norm(x, (12,), eps=1e-5))
    (g_det,) = torch.autograd.grad((out * up).sum(), x)
    (g_ln,) = torch.autograd.grad((F.layer_norm(x, (12,), eps=1e-5) * up).sum(), x)
    assert (g_det - g_ln).abs().max() > 0.1  # the statistics' gradients are missing
    var = x.detach().var(-1, unbiased=False, keepdim=True)  # (4, 1)
    torch.testing.assert_close(g_det, up / torch.sqrt(var + 1e-5))  # by hand
    # autograd on mean and variance made constants gives the same
    mu_c, sd_c = x.detach().mean(-1, keepdim=True), torch.sqrt(var + 1e-5)
    (g_const,) = torch.autograd.grad((((x - mu_c) / sd_c) * up).sum(), x)
    torch.testing.assert_close(g_det, g_const)
    # the true gradient sums to 0 per row (invariance to shifts); the detached one does not
    assert g_ln.sum(-1).abs().max() < 1e-10 and g_det.sum(-1).abs().min() > 1e-3


def test_detach_norm_checks_input_and_keeps_half_precision():
    norm = mk.DetachNorm(8)
    assert list(norm.parameters()) == [] and "statistics detached" in repr(norm)
    h = _x(3, 8, scale=300, dtype=torch.float16)
    out = norm(h)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, F.layer_norm(h.float(), (8,)).half())
    with pytest.raises(ValueError, match=r"\(\*, 8\)"):
        norm(torch.ones(3, 5))
    with pytest.raises(ValueError, match=r"\(\*, 8\)"):
        norm(torch.ones(3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="positive int"):
        mk.DetachNorm(0)
    with pytest.raises(ValueError, match="eps"):
        mk.DetachNorm(4, eps=0.0)


def test_norm_mlp_variants():
    x = torch.rand(5, 64)
    n_linear = (64 * 16 + 16) + 2 * (16 * 16 + 16) + (16 * 10 + 10)
    for norm in mk.STATS_NORMS:
        model = mk.NormMLP(norm, hidden=16, depth=3)
        assert model(x).shape == (5, 10)
        n = sum(p.numel() for p in model.parameters())
        assert n == n_linear + (3 * 2 * 16 if norm == "layer" else 0)
    simple = mk.NormMLP("simple", hidden=16).norms[0]
    assert list(simple.parameters()) == []  # LayerNorm-simple: no gain, no bias
    z = _x(6, 16, offset=3.0, dtype=torch.float32)
    torch.testing.assert_close(simple(z), F.layer_norm(z, (16,), weight=None, bias=None))
    assert isinstance(mk.NormMLP("none").norms[0], torch.nn.Identity)
    with pytest.raises(ValueError, match="norm must be one of"):
        mk.NormMLP("batch")
    with pytest.raises(ValueError, match="depth"):
        mk.NormMLP("layer", depth=0)


def _tiny_stats(**kw):
    return mk.get_stats_config("quick", **{"hidden_size": 8, "depth": 2, "steps": 4,
                                           "eval_every": 2, "seeds": (0, 1), **kw})


def test_run_stats_tiny_layout_and_determinism():
    cfg = _tiny_stats()
    res = mk.run_stats(cfg, device="cpu")
    assert res.variants == list(mk.STATS_NORMS) and res.seeds == [0, 1]
    _, yv = load_digits_tensor("test", flatten=True)
    _, y = load_digits_tensor("train", flatten=True)
    maj = int(torch.bincount(y).argmax())
    assert res.info["majority_class"] == maj
    assert res.info["majority_error"] == pytest.approx(float((yv != maj).float().mean()))
    for v in res.variants:
        for metric in ("val_nll", "val_error", "train_nll", "train_error"):
            steps, vals = res.curves(v, metric)
            assert list(steps) == [0, 2, 4] and vals.shape == (2, 3)
        assert all(len(g) == 2 for g in res.info_of(v, "weight_growth"))
    _, nll = res.curves("layer", "val_nll")
    assert nll[0, 0] > nll[0, -1]  # it learns
    assert nll[0, -1] != nll[1, -1]  # seeds differ
    again = mk.run_stats(_tiny_stats(norms=("detach",), seeds=(1,)), device="cpu")
    assert again.final("detach", "val_nll")[0] == res.final("detach", "val_nll")[1]


def test_stats_config_validation_and_paper_preset():
    paper = mk.get_stats_config("paper")
    assert paper.threads is None and paper.seeds == 10 and paper.hidden_size == 256
    assert mk.get_stats_config("quick").threads == 1
    tiny = mk.get_stats_config("paper", hidden_size=8, depth=1, steps=1, eval_every=1, seeds=(0,),
                               norms=("simple",))
    assert len(mk.run_stats(tiny, device="cpu").runs) == 1
    for bad, match in ((dict(norms=("batch",)), "norms"), (dict(norms=()), "norms"),
                       (dict(steps=0), "steps"), (dict(depth=0), "depth"),
                       (dict(lr=0.0), "lr"), (dict(seeds=()), "seeds"),
                       (dict(width=3), "unknown Config fields")):
        with pytest.raises(ValueError, match=match):
            mk.get_stats_config("quick", **bad)
    with pytest.raises(TypeError, match="StatsConfig"):
        mk.run_stats(mk.get_config("quick"))


def test_run_affine_arms_start_alike_and_simple_gains_stay_one():
    cfg = _tiny_stats()
    model = mk.affine_mlp((0, 1), hidden=8, depth=2)  # slices: layer 0, 1; simple 0, 1
    for p in model.parameters():
        torch.testing.assert_close(p[:2], p[2:])
    torch.manual_seed(0)
    one = mk.affine_mlp((0,), hidden=8, depth=2)
    torch.testing.assert_close(one.weights[0][0], model.weights[0][0])
    out = mk.run_affine(cfg)
    assert set(out) == {"layer", "simple", "info"}
    assert out["layer"]["val_nll"].shape == (2,) and out["simple"]["train_nll"].shape == (2,)
    again = mk.run_affine(dataclasses.replace(cfg, seeds=(1,)))  # a seed alone: the same
    for arm in ("layer", "simple"):
        assert again[arm]["val_nll"][0] == pytest.approx(out[arm]["val_nll"][1], rel=1e-5)
    with pytest.raises(TypeError, match="StatsConfig"):
        mk.run_affine(mk.get_config("quick"))


def test_affine_mlp_simple_gains_get_no_gradient():
    model = mk.affine_mlp((0, 1), hidden=8, depth=2)
    x = torch.randn(4, 3, 64)
    model(x).square().sum().backward()
    for g in model.gains:
        assert g.grad[2:].abs().max() == 0 and g.grad[:2].abs().max() > 0


def test_p10_inputs_compare_deepnorm_with_post_ln_at_depth():
    import numpy as np

    from lnbook import ledger
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run

    # final logit update of seeds 0-2 per (kind, depth)
    final = {("post", 2): [0.1, 0.2, 0.1], ("post", 18): [0.8, 0.4, 0.3],
             ("deepnorm", 2): [0.1, 0.1, 0.2], ("deepnorm", 18): [0.2, 0.3, 0.4]}
    runs = [Run(mk.variant_name(k, d), s, History(eval_steps=[0, 1], metrics=[
        {"val_loss": 2.0, "update": 0.0}, {"val_loss": 1.9, "update": u}]), {})
        for (k, d), us in final.items() for s, u in enumerate(us)]
    got = mk.p10_inputs(Results("mistakes", {}, "cpu", runs, {}))["values"]
    np.testing.assert_allclose(got["smaller update at depth"], [0.25, 0.75, 4 / 3])
    # growth post 8, 2, 3; DeepNorm 2, 3, 2
    np.testing.assert_allclose(got["grows less with depth"], [0.25, 1.5, 2 / 3])
    d = ledger.decide_claim("P10", **mk.p10_inputs(Results("mistakes", {}, "cpu", runs, {})))
    assert set(d.parts) == set(got)


def test_p13_inputs_take_the_held_out_loss_apart():
    import numpy as np

    from lnbook import ledger
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run

    # final (held-out loss, held-out error) of seeds 0-4 per variant; majority class errs 0.9
    final = {"layer": [(0.20, 0.05)] * 4 + [(1.9, 0.6)],
             "simple": [(0.25, 0.06), (0.30, 0.07), (0.25, 0.06), (0.40, 0.1), (1.9, 0.6)],
             "detach": [(0.45, 0.1), (0.35, 0.08), (0.30, 0.07), (0.35, 0.1), (2.0, 0.7)],
             "none": [(0.50, 0.1), (0.50, 0.1), (0.50, 0.1), (0.50, 0.1), (2.1, 0.8)]}
    runs = [Run(v, s, History(eval_steps=[0, 9], metrics=[
        {"val_nll": 2.3, "val_error": 0.9}, {"val_nll": nll, "val_error": err}]), {})
        for v, rows in final.items() for s, (nll, err) in enumerate(rows)]
    res = Results("mistakes_stats", {}, "cpu", runs, {"majority_error": 0.9})
    got = mk.p13_inputs(res)
    help_, more = "statistics' gradients help", "more than the forward normalization"
    np.testing.assert_allclose(got["values"][help_], [0.20, 0.05, 0.05, -0.05, 0.1],
                               atol=1e-12)
    # backward minus forward (none - detach: 0.05, 0.15, 0.2, 0.15, 0.1)
    np.testing.assert_allclose(got["values"][more], [0.15, -0.10, -0.15, -0.20, 0.0],
                               atol=1e-12)
    # seed 4's LayerNorm errs 0.6, not 0.5 below the majority class's 0.9
    for part in (help_, more):
        assert got["trivial_ok"][part].tolist() == [True] * 4 + [False]
    d = ledger.decide_claim("P13", **got)
    assert (d.parts[help_].n_for, d.parts[help_].n_against) == (3, 1)
    assert (d.parts[more].n_for, d.parts[more].n_against) == (1, 3)


def test_p14_inputs_compare_the_arms_of_run_affine():
    import numpy as np

    from lnbook import ledger

    aff = {"layer": {"val_nll": np.array([0.40, 0.50, 0.20]),
                     "train_nll": np.array([0.10, 0.20, 0.10]),
                     "val_error": np.array([0.10, 0.12, 0.05])},
           "simple": {"val_nll": np.array([0.41, 0.45, 0.30]),
                      "train_nll": np.array([0.15, 0.20, 0.10]),
                      "val_error": np.array([0.10, 0.11, 0.45])},
           "info": {"majority_error": 0.9}}
    got = mk.p14_inputs(aff)
    v = got["values"]
    np.testing.assert_allclose(v["does not hurt"], [0.025, -0.1, 0.5], atol=1e-12)
    np.testing.assert_allclose(v["helps"], [0.01, -0.05, 0.10], atol=1e-12)
    # gaps: LN 0.30, 0.30, 0.10; LN-simple 0.26, 0.25, 0.20
    np.testing.assert_allclose(v["over-fits less"], [-0.04, -0.05, 0.10], atol=1e-12)
    for part in v:  # seed 2's LayerNorm-simple errs 0.45: not 0.5 below 0.9
        assert got["trivial_ok"][part].tolist() == [True, True, False]
    d = ledger.decide_claim("P14", **got)
    assert d.parts["does not hurt"].n_for == 2 and d.parts["does not hurt"].n_against == 0
