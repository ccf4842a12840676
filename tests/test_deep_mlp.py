"""The lab's deep-MLP experiment (chapter 3.2): model, probe, trivial baseline, sweep."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lnbook.engine import load_results
from lnbook.experiments import EXPERIMENTS, deep_mlp
from lnbook.norms import LayerNorm

EDGES = np.linspace(-8.0, 2.0, 41)


def test_presets_and_validation():
    quick, paper = deep_mlp.get_config("quick"), deep_mlp.get_config("paper")
    assert quick.depth == paper.depth == 8 and quick.init_scale == paper.init_scale == 0.5
    assert quick.data == "digits" and paper.data == "mnist" and paper.width == 1000
    assert paper.batch_size == 128 and max(paper.probe_updates) <= paper.steps
    assert quick.seeds == 3 and paper.seeds == 5  # how many seeds of the seed set
    assert deep_mlp.get_config("quick", steps=7, probe_updates=(1, 7)).steps == 7
    assert EXPERIMENTS["deep_mlp"] is deep_mlp
    for bad, match in [({"norms": ("weight",)}, "norms"), ({"data": "cifar"}, "data"),
                       ({"init_scale": 0.0}, "init_scale"), ({"batch_size": 1}, "batch_size"),
                       ({"probe_updates": (0,)}, "probe_updates"),
                       ({"probe_updates": (301,)}, "probe_updates"),
                       ({"hist_range": (2.0, -8.0)}, "hist_range")]:
        with pytest.raises(ValueError, match=match):
            deep_mlp.get_config("quick", **bad)
    with pytest.raises(ValueError, match="unknown Config fields"):
        deep_mlp.get_config("quick", widht=3)


def test_model_layout_and_init():
    none = deep_mlp.DeepMLP((16, 32, 32, 10), "none", init_scale=0.5)
    assert all(lin.bias is not None for lin in none.linears)
    assert all(isinstance(n, nn.Identity) for n in none.norms)
    ln = deep_mlp.DeepMLP((16, 32, 32, 10), "layer")
    assert [lin.bias is None for lin in ln.linears] == [True, True, False]  # norms bring biases
    assert all(isinstance(n, LayerNorm) and n.impl == "torch" for n in ln.norms)
    bn = deep_mlp.DeepMLP((16, 32, 32, 10), "batch")
    assert all(isinstance(n, nn.BatchNorm1d) for n in bn.norms)
    assert "init_scale=0.5" in repr(none)
    torch.manual_seed(0)
    big = deep_mlp.DeepMLP((400, 400, 10), "none", init_scale=0.5)
    std = big.linears[0].weight.std().item()
    assert abs(std / (0.5 * math.sqrt(2 / 400)) - 1) < 0.02  # 160,000 draws
    with pytest.raises(ValueError, match=r"\(N, 16\)"):
        none(torch.zeros(2, 15))
    with pytest.raises(ValueError, match="norm"):
        deep_mlp.DeepMLP((4, 4, 2), "group")
    with pytest.raises(ValueError, match="hidden"):
        deep_mlp.DeepMLP((4, 2), "none")


def test_summed_inputs_are_before_the_norm_and_shrink_by_init_scale():
    """With He init times c, each ReLU layer multiplies the RMS of the summed inputs by ~c."""
    torch.manual_seed(0)
    c = 0.5
    model = deep_mlp.DeepMLP((256,) + (1024,) * 4 + (10,), "none", init_scale=c)
    x = torch.randn(512, 256)
    with torch.no_grad():
        logits, summed = model(x, return_summed=True)
    rms = np.array([a.pow(2).mean().sqrt().item() for a in summed])
    np.testing.assert_allclose(rms[1:] / rms[:-1], c, rtol=0.1)
    np.testing.assert_allclose(rms[0], c * math.sqrt(2.0), rtol=0.05)  # E[x^2] = 1
    ln = deep_mlp.DeepMLP((256,) + (1024,) * 4 + (10,), "layer", init_scale=c)
    with torch.no_grad():
        _, a_ln = ln(x, return_summed=True)
        by_hand = ln.linears[1](torch.relu(F.layer_norm(a_ln[0], (1024,), eps=1e-5)))
    torch.testing.assert_close(a_ln[1], by_hand)  # raw W h, not the norm's output
    rms_ln = np.array([a.pow(2).mean().sqrt().item() for a in a_ln])
    np.testing.assert_allclose(rms_ln[1:], c, rtol=0.1)  # LN's ReLU output has E[h^2] = 1/2


def test_probe_records_what_sgd_did():
    torch.manual_seed(1)
    model = deep_mlp.DeepMLP((6, 8, 8, 3), "none")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: update = -lr * grad
    probe = deep_mlp.LayerProbe(model, opt, updates=(2,), edges=EDGES)
    x, y = torch.randn(5, 6), torch.tensor([0, 1, 2, 0, 1])
    for update in (1, 2, 3):
        assert probe.active == (update == 2)
        before = [lin.weight.detach().clone() for lin in model.linears]
        logits = probe.forward(x)
        if update == 2:  # the same summed inputs, by hand, for the gradient check
            _, summed = model(x, return_summed=True)
            for a in summed:
                a.retain_grad()
            F.cross_entropy(model.linears[-1](torch.relu(summed[-1])), y).backward()
            ref_grads = [a.grad.clone() for a in summed]
            opt.zero_grad()
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        grads = [lin.weight.grad.clone() for lin in model.linears]
        opt.step()
        if update == 2:
            want = [(0.1 * g.norm() / w.norm()).item() for g, w in zip(grads, before, strict=True)]
            want_grad = [g.norm().item() for g in grads]
    rec = probe.records
    assert rec["probe_updates"] == [2] and probe.done == 3
    np.testing.assert_allclose(rec["update_ratio"][0], want, rtol=1e-5)
    np.testing.assert_allclose(rec["weight_grad_norm"][0], want_grad, rtol=1e-6)
    np.testing.assert_allclose(rec["grad_rms"][0],
                               [g.pow(2).mean().sqrt().item() for g in ref_grads], rtol=1e-5)
    nonzero = [int((g != 0).sum()) for g in ref_grads]
    assert [sum(h) for h in rec["grad_hist"][0]] == nonzero
    assert [sum(h) for h in rec["act_hist"][0]] == [5 * 8, 5 * 8]
    np.testing.assert_allclose(rec["grad_zero_frac"][0], [1 - n / 40 for n in nonzero])


def test_probe_ignores_eval_forward_passes():
    model = deep_mlp.DeepMLP((4, 8, 3), "layer")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = deep_mlp.LayerProbe(model, opt, updates=(1,), edges=EDGES)
    model.eval()
    with torch.no_grad():
        probe.forward(torch.randn(2, 4))
    assert probe._summed is None
    model.train()
    F.cross_entropy(probe.forward(torch.randn(3, 4)), torch.tensor([0, 1, 2])).backward()
    opt.step()
    assert probe.records["probe_updates"] == [1] and len(probe.records["act_rms"][0]) == 1


def test_prior_nll_and_log_spread():
    from lnbook.engine.metrics import prior_nll

    y_train = torch.tensor([0, 0, 0, 1])  # add-one shares: 4/6 and 2/6
    assert prior_nll(y_train, torch.tensor([0, 1]), classes=2) == pytest.approx(
        -(math.log(4 / 6) + math.log(2 / 6)) / 2)
    assert prior_nll(torch.arange(10), torch.arange(10)) == pytest.approx(math.log(10))
    np.testing.assert_allclose(deep_mlp.log_spread(np.array([[[1.0, 100.0], [2.0, 2.0]]])),
                               [[2.0, 0.0]])
    with pytest.raises(ValueError, match="positive"):
        deep_mlp.log_spread(np.array([0.0, 1.0]))


def test_run_tiny(tmp_path):
    cfg = deep_mlp.get_config("quick", depth=3, width=8, steps=6, eval_every=3,
                              probe_updates=(1, 6), n_eval_train=64, seeds=(0, 1))
    res = deep_mlp.run(cfg, device="cpu", out=tmp_path)
    assert res.variants == ["none", "batch", "layer"] and res.seeds == [0, 1]
    assert res.info["source"] == "sklearn digits" and res.info["sizes"] == [64, 8, 8, 8, 10]
    assert res.info["prior_nll"] == pytest.approx(math.log(10), abs=0.01)  # balanced digits
    assert len(res.info["hist_edges"]) == cfg.hist_bins + 1
    for v in res.variants:
        assert res.info_of(v, "probe_updates") == [[1, 6], [1, 6]]
        assert deep_mlp.probe_array(res, v, "act_rms").shape == (2, 2, 3)
        assert deep_mlp.probe_array(res, v, "update_ratio").shape == (2, 2, 4)
        assert deep_mlp.probe_array(res, v, "act_hist").shape == (2, 2, 3, cfg.hist_bins)
        assert np.all(deep_mlp.probe_array(res, v, "update_ratio") > 0)
        steps, nll = res.curves(v, "test_nll")
        assert steps.tolist() == [0, 3, 6] and np.all((nll > 0) & (nll < 10))
    with pytest.raises(KeyError, match="act_rms"):
        deep_mlp.probe_array(res, "none", "weights")
    back = load_results(tmp_path / "deep_mlp.json")
    assert back.to_dict() == res.to_dict()
    again = deep_mlp.run(dataclasses.replace(cfg, seeds=(0,)), device="cpu")
    assert again.runs[0].history.losses == res.runs[0].history.losses
    assert res.runs[0].history.losses != res.runs[1].history.losses


def test_paper_preset_runs_tiny():
    cfg = deep_mlp.get_config("paper", width=8, depth=2, steps=2, eval_every=2,
                              probe_updates=(1, 2), n_eval_train=32, seeds=(0,),
                              norms=("layer",))
    res = deep_mlp.run(cfg, device="cpu")
    assert res.info["source"].startswith("mnist") and res.info["sizes"] == [784, 8, 8, 10]
    assert len(res.runs) == 1 and res.runs[0].history.steps == [1, 2]
    with pytest.raises(TypeError, match="Config"):
        deep_mlp.run({"steps": 2})
