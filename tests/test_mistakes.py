"""lnbook.experiments.mistakes: each wrong version against the right one, weight conversion,
DeepNorm's placements and the update-size sweep (the norm ablation: test_norm_ablation.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lnbook import LayerNorm, layer_norm
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
