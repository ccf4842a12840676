"""lnbook.experiments.norm_ablation: Xu et al.'s ablation on the digits MLP (chapter 13, P13 and
P14): the four norms of NormMLP, the run's layout and determinism, the bias-after-the-norm arms
and the claims' per-seed quantities."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lnbook.data import load_digits_tensor
from lnbook.experiments import mistakes as mk
from lnbook.experiments import norm_ablation as na
from lnbook.mlp import STATS_NORMS, NormMLP


def _x(*shape, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return offset + torch.randn(*shape, generator=g)


def test_norm_mlp_variants():
    x = torch.rand(5, 64)
    n_linear = (64 * 16 + 16) + 2 * (16 * 16 + 16) + (16 * 10 + 10)
    for norm in STATS_NORMS:
        model = NormMLP(norm, hidden=16, depth=3)
        assert model(x).shape == (5, 10)
        n = sum(p.numel() for p in model.parameters())
        assert n == n_linear + (3 * 2 * 16 if norm == "layer" else 0)
    simple = NormMLP("simple", hidden=16).norms[0]
    assert list(simple.parameters()) == []  # LayerNorm-simple: no gain, no bias
    z = _x(6, 16, offset=3.0)
    torch.testing.assert_close(simple(z), F.layer_norm(z, (16,), weight=None, bias=None))
    assert isinstance(NormMLP("none").norms[0], torch.nn.Identity)
    with pytest.raises(ValueError, match="norm must be one of"):
        NormMLP("batch")
    with pytest.raises(ValueError, match="depth"):
        NormMLP("layer", depth=0)


def _tiny_stats(**kw):
    return na.get_config("quick", **{"hidden_size": 8, "depth": 2, "steps": 4,
                                    "eval_every": 2, "seeds": (0, 1), **kw})


def test_run_tiny_layout_and_determinism():
    cfg = _tiny_stats()
    res = na.run(cfg, device="cpu")
    assert res.variants == list(STATS_NORMS) and res.seeds == [0, 1]
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
    again = na.run(_tiny_stats(norms=("detach",), seeds=(1,)), device="cpu")
    assert again.final("detach", "val_nll")[0] == res.final("detach", "val_nll")[1]


def test_config_validation_and_paper_preset():
    paper = na.get_config("paper")
    assert paper.threads is None and paper.seeds == 10 and paper.hidden_size == 256
    assert na.get_config("quick").threads == 1
    tiny = na.get_config("paper", hidden_size=8, depth=1, steps=1, eval_every=1, seeds=(0,),
                         norms=("simple",))
    assert len(na.run(tiny, device="cpu").runs) == 1
    for bad, match in ((dict(norms=("batch",)), "norms"), (dict(norms=()), "norms"),
                       (dict(steps=0), "steps"), (dict(depth=0), "depth"),
                       (dict(lr=0.0), "lr"), (dict(seeds=()), "seeds"),
                       (dict(width=3), "unknown Config fields")):
        with pytest.raises(ValueError, match=match):
            na.get_config("quick", **bad)
    with pytest.raises(TypeError, match=r"norm_ablation\.Config \(make one with get_config\)"):
        na.run(mk.get_config("quick"))


def test_bias_after_mlp_is_the_equation_with_each_bias_after_the_norm():
    """Both arms built under one seed start alike; each is `depth` times Linear (no bias) ->
    norm -> + b -> ReLU, then Linear, against a float64 reference written out."""
    torch.manual_seed(4)
    layer = na.BiasAfterMLP("layer", hidden=8, depth=2)
    torch.manual_seed(4)
    simple = na.BiasAfterMLP("simple", hidden=8, depth=2)
    for w, v in zip(layer.weights, simple.weights, strict=True):
        torch.testing.assert_close(w, v, rtol=0, atol=0)
    assert len(layer.gains) == 2 and len(simple.gains) == 0  # LayerNorm-simple: no gain
    with torch.no_grad():
        for k in range(2):
            layer.gains[k].uniform_(0.5, 1.5)
            layer.biases[k].normal_()
            simple.biases[k].normal_()
    x = _x(5, 64)
    for net in (layer, simple):
        h = x.double()
        for k in range(2):
            a = h @ net.weights[k].double()
            a = (a - a.mean(-1, keepdim=True)) / torch.sqrt(a.var(-1, unbiased=False,
                                                                 keepdim=True) + 1e-5)
            g = net.gains[k].double() if len(net.gains) else 1.0
            h = torch.relu(g * a + net.biases[k].double())
        ref = h @ net.weights[2].double() + net.out_bias.double()
        torch.testing.assert_close(net(x).double(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="norm must be one of"):
        na.BiasAfterMLP("detach")


def test_run_with_bias_after_norm_trains_both_arms_as_alone():
    cfg = _tiny_stats(norms=na.AFFINE_NORMS, bias_after_norm=True)
    out = na.run(cfg, device="cpu")
    assert out.variants == list(na.AFFINE_NORMS) and out.seeds == [0, 1]
    assert out.final("layer", "val_nll").shape == (2,)
    again = na.run(dataclasses.replace(cfg, seeds=(1,)), device="cpu")  # a seed alone
    for arm in na.AFFINE_NORMS:
        assert again.final(arm, "val_nll")[0] == pytest.approx(
            out.final(arm, "val_nll")[1], abs=1e-5)
    with pytest.raises(ValueError, match=r"norms must be drawn from \('layer', 'simple'\)"):
        na.get_config("quick", norms=("detach",), bias_after_norm=True)
    with pytest.raises(TypeError, match="bias_after_norm must be a bool"):
        na.get_config("quick", bias_after_norm="yes")


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
    res = Results("norm_ablation", {}, "cpu", runs, {"majority_error": 0.9})
    got = na.p13_inputs(res)
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


def test_p14_inputs_compare_the_arms_of_the_bias_after_norm_run():
    import numpy as np

    from lnbook import ledger
    from lnbook.engine import History, Results
    from lnbook.engine.results import Run

    # final (held-out loss, training loss, held-out error) of seeds 0-2 per arm
    final = {"layer": [(0.40, 0.10, 0.10), (0.50, 0.20, 0.12), (0.20, 0.10, 0.05)],
             "simple": [(0.41, 0.15, 0.10), (0.45, 0.20, 0.11), (0.30, 0.10, 0.45)]}
    runs = [Run(arm, s, History(eval_steps=[0, 9], metrics=[
        {"val_nll": 2.3, "train_nll": 2.3, "val_error": 0.9},
        {"val_nll": v, "train_nll": t, "val_error": e}]), {})
        for arm, rows in final.items() for s, (v, t, e) in enumerate(rows)]
    got = na.p14_inputs(Results("norm_ablation", {}, "cpu", runs, {"majority_error": 0.9}))
    v = got["values"]
    np.testing.assert_allclose(v["does not hurt"], [0.025, -0.1, 0.5], atol=1e-12)
    np.testing.assert_allclose(v["helps"], [0.01, -0.05, 0.10], atol=1e-12)
    # gaps: LN 0.30, 0.30, 0.10; LN-simple 0.26, 0.25, 0.20
    np.testing.assert_allclose(v["over-fits less"], [-0.04, -0.05, 0.10], atol=1e-12)
    for part in v:  # seed 2's LayerNorm-simple errs 0.45: not 0.5 below 0.9
        assert got["trivial_ok"][part].tolist() == [True, True, False]
    d = ledger.decide_claim("P14", **got)
    assert d.parts["does not hurt"].n_for == 2 and d.parts["does not hurt"].n_against == 0


def test_stacked_seeds_give_the_numbers_of_runs_trained_alone():
    """run trains the seeds of a norm as one stacked model; each copy ends where the same
    network, trained alone by lnbook.fit on the same batches, ends (float32, to 1e-5)."""
    from lnbook.engine import Batches, classification_metrics, fit

    cfg = _tiny_stats(steps=12, eval_every=6, norms=("layer", "detach"), seeds=(3, 5))
    res = na.run(cfg, device="cpu")
    x, y = load_digits_tensor("train", flatten=True)
    xv, yv = load_digits_tensor("test", flatten=True)
    for norm in cfg.norms:
        for k, seed in enumerate(cfg.seeds):
            torch.manual_seed(seed)
            model = NormMLP(norm, cfg.hidden_size, cfg.depth)
            opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, foreach=True)
            fit(model, Batches(x, y, batch_size=cfg.batch_size, seed=seed), opt,
                steps=cfg.steps, eval_every=cfg.steps, device="cpu", seed=seed,
                loss_fn=lambda m, b: F.cross_entropy(m(b[0]), b[1]), progress=False)
            alone = classification_metrics(model, xv, yv)
            assert res.final(norm, "val_nll")[k] == pytest.approx(alone["nll"], abs=1e-5)
            assert res.final(norm, "val_error")[k] == pytest.approx(alone["error"], abs=1e-6)


def test_the_module_bounds_are_the_declared_rules():
    """HURT (P14's "does not hurt") is the rule's bound in claims.yml, which the chapter and
    the pilot record read through the module."""
    from lnbook import ledger
    from lnbook.experiments import norm_ablation

    assert ledger.load_rules()["P14"]["parts"]["does not hurt"].at == norm_ablation.HURT
