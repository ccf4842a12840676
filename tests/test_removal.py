"""lnbook.removal and lnbook.experiments.removal: fixed scales in place of layer norms."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lnbook import LayerNorm, Transformer
from lnbook.experiments import EXPERIMENTS
from lnbook.experiments import removal as rm
from lnbook.removal import (
    FixedScale,
    norm_input_scales,
    norm_names,
    remove_norms,
    replace_norm,
)


def test_fixed_scale_by_hand():
    m = FixedScale(4, scale=2.0).double()
    with torch.no_grad():
        m.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        m.bias.fill_(0.5)
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64)  # mean 3
    want = torch.tensor([[-1.0 * 1, -0.5 * 2, 0.0 * 3, 1.5 * 4]], dtype=torch.float64) + 0.5
    assert torch.allclose(m(x), want)
    assert "scale=2" in repr(m)
    with pytest.raises(ValueError, match="scale must be > 0"):
        FixedScale(4, scale=0.0)
    with pytest.raises(ValueError, match="last dimension must be 4"):
        m(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError):
        m(torch.ones(2, 4, dtype=torch.long))


def test_fixed_scale_equals_layer_norm_where_every_token_has_that_scale():
    torch.manual_seed(0)
    ln = LayerNorm(8).double()
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(5, 8, dtype=torch.float64)
    x = (x - x.mean(-1, keepdim=True)) / x.std(-1, unbiased=False, keepdim=True) * 3.0
    s = norm_input_scales(ln, x, [""])[""]
    assert s == pytest.approx((9.0 + ln.eps) ** 0.5)
    wrapper = torch.nn.Sequential(ln)
    replace_norm(wrapper, "0", s)
    assert isinstance(wrapper[0], FixedScale)
    assert torch.allclose(wrapper(x), F.layer_norm(x, (8,), ln.weight, ln.bias, ln.eps))


def test_remove_norms_copies_and_replaces_every_norm():
    torch.manual_seed(0)
    model = Transformer(9, 16, 2, 2, 8)
    x = torch.randint(0, 9, (6, 8))
    names = norm_names(model)
    assert len(names) == 5  # two per block and the final norm
    free = remove_norms(model, x)
    assert norm_names(free) == [] and norm_names(model) == names  # the original is kept
    assert all(isinstance(free.get_submodule(n), FixedScale) for n in names)
    assert free(x).shape == model(x).shape
    with pytest.raises(TypeError, match="not a layer norm"):
        replace_norm(free, "head", 1.0)


def test_experiment_presets_order_and_tiny_run():
    assert EXPERIMENTS["removal"] is rm
    quick, paper = rm.get_config("quick"), rm.get_config("paper")
    assert paper.d_model > quick.d_model and quick.seeds == 5
    with pytest.raises(ValueError, match="finetune_steps"):
        rm.get_config("quick", finetune_steps=-1)
    torch.manual_seed(0)
    order = rm.removal_order(Transformer(9, 16, 2, 2, 8))
    assert order == ["blocks.0.norm2", "blocks.1.norm2", "blocks.0.norm1", "blocks.1.norm1",
                     "final_norm"]
    res = rm.run(rm.get_config("quick", steps=3, finetune_steps=1, n_train=64, n_test=16,
                               n_probe=16, seeds=(0,)))
    info = res.runs[0].info
    assert len(info["finetuned"]) == len(info["no_finetune"]) == 5
    assert res.runs[0].history.metrics[-1]["loss"] == info["finetuned"][-1]
    assert quick.task == "sort" and "task" not in vars(quick)  # the one task, not a field
    assert res.info["baseline_loss"] > 0 and res.config["seeds"] == [0]
    with pytest.raises(TypeError, match="removal.Config"):
        rm.run({"steps": 3})
