"""lnbook.batched: many seeds trained as one, checked against the per-seed networks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lnbook.batched import SeedMLP, seed_batches, seed_nll, seed_sq_norm
from lnbook.engine.train import Batches
from lnbook.experiments.deep_mlp import DeepMLP
from lnbook.mlp import NormMLP

SIZES = (64, 32, 32, 10)


def _models(norm: str, seeds=(0, 1, 2)) -> list[DeepMLP]:
    out = []
    for s in seeds:
        torch.manual_seed(s)
        out.append(DeepMLP(SIZES, norm).double())
    return out


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
def test_outputs_and_gradients_equal_the_per_seed_networks(norm):
    models = _models(norm)
    batched = SeedMLP.from_models(models, SIZES, norm).double()
    torch.manual_seed(5)
    x, y = torch.randn(3, 16, 64, dtype=torch.float64), torch.randint(0, 10, (3, 16))
    out_b = batched(x)  # (3, 16, 10); one training pass, as for each per-seed network
    seed_nll(out_b, y).sum().backward()  # the sum: each seed gets its own gradient
    for s, m in enumerate(models):
        out = m(x[s])
        F.cross_entropy(out, y[s]).backward()
        torch.testing.assert_close(out_b[s], out, rtol=0, atol=1e-12)
        for k, lin in enumerate(m.linears):
            torch.testing.assert_close(batched.weights[k].grad[s], lin.weight.grad.t(),
                                       rtol=0, atol=1e-12)
    if norm == "batch":  # running averages per seed, as BatchNorm1d keeps them
        torch.testing.assert_close(batched.running_var1[2], models[2].norms[1].running_var)
        batched.eval()
        torch.testing.assert_close(batched(x)[1], models[1].eval()(x[1]), rtol=0, atol=1e-12)


def test_seeds_do_not_mix():
    batched = SeedMLP(3, SIZES, "batch")
    x = torch.randn(3, 8, 64)
    before = batched(x)[0].detach()
    x2 = x.clone()
    x2[1:] = 1e3 * torch.randn(2, 8, 64)  # other seeds' data changes, seed 0's does not
    torch.testing.assert_close(batched(x2)[0], before)


@pytest.mark.parametrize("optim", ["sgd", "adam"])
def test_training_equals_seed_at_a_time_training(optim):
    x, y = torch.randn(200, 64, dtype=torch.float64), torch.randint(0, 10, (200,))
    seeds = (3, 4)
    models = _models("layer", seeds)
    batched = SeedMLP.from_models(models, SIZES, "layer").double()

    def opt(params):
        if optim == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return torch.optim.Adam(params, lr=1e-2)

    ob, batches = opt(batched.parameters()), seed_batches(x, y, 32, seeds)
    for step in range(10):
        xb, yb = batches(step)
        ob.zero_grad()
        seed_nll(batched(xb), yb).sum().backward()
        ob.step()
    for s, (seed, m) in enumerate(zip(seeds, models, strict=True)):
        om, data = opt(m.parameters()), Batches(x, y, batch_size=32, seed=seed)
        for step in range(10):
            xb, yb = data(step)
            om.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            om.step()
        one = batched.copy_to(_models("layer", (0,))[0], s)
        for a, b in zip(one.parameters(), m.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_norm_mlp_layouts_and_detached_statistics():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64, dtype=torch.float64)
    for norm in ("simple", "detach"):
        models = []
        for s in (0, 1):
            torch.manual_seed(s)
            models.append(NormMLP(norm, 32, 2).double())
        b = SeedMLP.from_models(models, (64, 32, 32, 10), "layer", hidden_bias=True,
                                affine=False, detach=norm == "detach").double()
        xs = x.clone().requires_grad_()
        b(xs).square().sum().backward()
        for s, m in enumerate(models):
            xm = x[s].clone().requires_grad_()
            m(xm).square().sum().backward()
            torch.testing.assert_close(xs.grad[s], xm.grad, rtol=0, atol=1e-10)


def test_helpers_and_bad_arguments():
    logits, y = torch.randn(2, 5, 10), torch.randint(0, 10, (5,))
    torch.testing.assert_close(seed_nll(logits, y)[1], F.cross_entropy(logits[1], y))
    t = [torch.ones(2, 3), 2 * torch.ones(2, 1, 4)]
    assert seed_sq_norm(t).tolist() == [19.0, 19.0]
    with pytest.raises(ValueError, match="norm"):
        SeedMLP(2, SIZES, "group")
    with pytest.raises(ValueError, match="detach"):
        SeedMLP(2, SIZES, "batch", detach=True)
    with pytest.raises(ValueError, match=r"\(S=2, N, 64\)"):
        SeedMLP(2, SIZES)(torch.randn(3, 4, 64))
    with pytest.raises(ValueError, match="Linear layers"):
        SeedMLP.from_models([DeepMLP((64, 8, 10))], SIZES)


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
def test_section_6_6_mlp_layouts(norm):
    """Section 6.6's MLP: LN on the hidden layers only, BN on the logits too (unbiased)."""
    from lnbook.experiments.mnist import MLP

    sizes = (784, 32, 32, 10)
    models = []
    for s in (0, 1):
        torch.manual_seed(s)
        models.append(MLP(sizes, norm, bn_unbiased=True).double())
    b = SeedMLP.from_models(models, sizes, norm, out_bias=norm != "batch",
                            norm_logits=norm == "batch", bn_unbiased=True).double()
    x = torch.rand(2, 8, 784, dtype=torch.float64)
    out = b(x)
    for s, m in enumerate(models):
        torch.testing.assert_close(out[s], m(x[s]), rtol=0, atol=1e-10)


def test_recalibrated_statistics_are_those_of_the_data():
    """Recalibration: each layer's mean and unbiased variance over the data, layer by layer."""
    from lnbook.batched import train_mode_logits

    torch.manual_seed(0)
    b = SeedMLP(2, (20, 8, 6), "batch", norm_logits=True, out_bias=False,
                bn_unbiased=True).double()
    x = torch.randn(50, 20, dtype=torch.float64)
    r = b.recalibrated(x)
    assert not r.training and b.momentum == r.momentum == 0.1
    assert torch.all(b.running_mean0 == 0)  # the original is untouched
    a = torch.einsum("nd,sdh->snh", x, b.weights[0])  # (2, 50, 8) summed inputs, layer 0
    torch.testing.assert_close(r.running_mean0, a.mean(1))
    torch.testing.assert_close(r.running_var0, a.var(1, unbiased=True))
    # evaluation mode with these statistics = training mode on the whole set as one batch
    # (both with the unbiased variance)
    b.train()
    with torch.no_grad():
        torch.testing.assert_close(r(x), b(x))
    ln = SeedMLP(2, (20, 8, 6), "layer").double()
    torch.testing.assert_close(ln.recalibrated(x)(x), ln.eval()(x))
    # training mode read in blocks: each block of 4 with its own statistics, averages kept
    saved = b.running_var1.clone()
    got = train_mode_logits(b, x, 4)  # (2, 48, 6): the last 2 examples left out
    with torch.no_grad():
        want = torch.cat([b(x[i:i + 4]) for i in range(0, 48, 4)], 1)
    torch.testing.assert_close(got, want)
    b.running_var1.copy_(saved)
    with pytest.raises(ValueError, match="at least one batch"):
        train_mode_logits(b, x[:3], 4)
