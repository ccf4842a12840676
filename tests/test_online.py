"""lnbook.experiments.online (chapter 3, claim C02): presets, a run against a plain SGD loop
written here, the number of updates per batch size, and C02's per-seed quantities."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lnbook import ledger
from lnbook.data import load_digits_tensor
from lnbook.engine import Batches, History, Results, Run
from lnbook.experiments import EXPERIMENTS, online


def test_registered_with_presets_and_checked():
    assert EXPERIMENTS["online"] is online
    quick, paper = online.get_config("quick"), online.get_config("paper")
    assert (quick.steps, quick.batch_sizes, quick.hidden, quick.seeds) == (44, (1, 32), 64, 3)
    assert (paper.steps, paper.hidden, paper.threads) == (440, 1000, None)  # ten passes
    with pytest.raises(ValueError, match="divide the largest"):
        online.get_config("quick", batch_sizes=(3, 32))
    with pytest.raises(ValueError, match="divide the largest"):
        online.get_config("quick", batch_sizes=())
    with pytest.raises(ValueError, match="lr_per_example"):
        online.get_config("quick", lr_per_example=0.0)
    with pytest.raises(ValueError, match="hidden"):
        online.get_config("quick", hidden=0)


def test_a_run_is_plain_sgd_on_the_same_examples_at_every_batch_size(tmp_path):
    """Each run sees ``steps x max(batch_sizes)`` examples; the final held-out NLL of the run
    at batch size 1 and at 4 equals a plain SGD loop over the same batches, written here."""
    cfg = online.get_config("quick", steps=3, batch_sizes=(1, 4), hidden=8, seeds=(5,))
    res = online.run(cfg, device="cpu", out=tmp_path)
    assert res.variants == ["batch 1", "batch 4"] and res.seeds == [5]
    x, y = load_digits_tensor("train", flatten=True)
    xt, yt = load_digits_tensor("test", flatten=True)
    for bs, updates in ((1, 12), (4, 3)):
        (run,) = res.select(online.variant_name(bs))
        assert run.history.steps[-1] == updates and run.history.eval_steps == [0, updates]
        torch.manual_seed(5)
        model = online.build(cfg)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr_per_example * bs)
        batches = Batches(x, y, batch_size=bs, seed=5)
        for step in range(updates):
            xb, yb = batches(step)
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
        with torch.no_grad():
            nll = F.cross_entropy(model(xt), yt).item()
        assert res.final(online.variant_name(bs), "nll")[0] == pytest.approx(nll, rel=1e-6)
    counts = torch.bincount(y, minlength=10).double() + 1
    assert res.info["trivial_nll"] == pytest.approx(
        -(counts / counts.sum()).log()[yt].mean().item(), rel=1e-12)


def _results(online_nll: list[float], ref_nll: list[float], trivial: float) -> Results:
    runs = [Run(variant, seed, History(eval_steps=[1], metrics=[{"nll": v, "error": 0.1}]))
            for variant, values in (("batch 1", online_nll), ("batch 32", ref_nll))
            for seed, v in enumerate(values)]
    return Results("online", {}, "cpu", runs, {"trivial_nll": trivial, "majority_error": 0.9})


def test_c02_inputs_and_the_verdict():
    res = _results([0.2, 0.9, 0.3], [0.25, 0.5, 1.2], trivial=2.0)
    inputs = online.c02_inputs(res)
    within = "online within the margin of batch 32"
    np.testing.assert_allclose(inputs["values"]["online leaves the trivial phase"],
                               [0.1, 0.45, 0.15])
    np.testing.assert_allclose(inputs["values"][within], [-0.05, 0.4, -0.9])
    # a seed counts when both runs end below half the trivial NLL (1.0): not seed 2 (1.2)
    assert inputs["trivial_ok"][within].tolist() == [True, True, False]
    d = ledger.decide_claim("C02", **inputs)
    assert d.parts["online leaves the trivial phase"].n_for == 3  # all below 0.5
    assert (d.parts[within].n_for, d.parts[within].n_against) == (1, 1)  # seed 1: 0.4 > 0.1
