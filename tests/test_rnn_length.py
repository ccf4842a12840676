"""Tests of lnbook.experiments.rnn_length (chapter 3.1, claim C04)."""

from __future__ import annotations

import json

import pytest
import torch

from lnbook.experiments import rnn_length as E


def test_get_config_presets_and_validation():
    q, p = E.get_config("quick"), E.get_config("paper")
    assert q.scale == "quick" and p.scale == "paper" and p.test_len > q.test_len
    assert E.get_config("quick", steps=3).steps == 3
    with pytest.raises(ValueError, match="scale"):
        E.get_config("huge")
    with pytest.raises(ValueError, match="unknown Config field"):
        E.get_config("quick", nope=1)


def test_running_sum_targets_are_the_sign_of_the_cumulative_sum():
    x, y = E.running_sum_batch(5, 7, torch.Generator().manual_seed(0))
    assert x.shape == (7, 5, 1) and y.shape == (7, 5)
    s = 0.0
    for t in range(7):
        s = s + x[t, 2, 0].item()
        assert y[t, 2].item() == float(s > 0)


@pytest.mark.parametrize("variant", E.VARIANTS)
def test_sign_model_loss_and_error(variant):
    torch.manual_seed(0)
    m = E.SignModel(variant, hidden=4, train_len=5)
    x, y = E.running_sum_batch(6, 5, torch.Generator().manual_seed(1))
    loss = m(x, y)
    assert loss.dim() == 0 and loss.item() > 0
    loss.backward()
    err = E.error_per_step(m, *E.running_sum_batch(6, 9, torch.Generator().manual_seed(2)))
    assert err.shape == (9,) and 0 <= err.min() and err.max() <= 1
    assert m.training  # mode restored
    with pytest.raises(ValueError, match="variant"):
        E.SignModel("wn", 4, 5)


def test_run_tiny_writes_json_and_restores_threads(tmp_path):
    n = torch.get_num_threads()
    cfg = E.get_config("quick", hidden=4, train_len=4, test_len=6, steps=2, batch_size=8,
                       test_batch=8, seeds=[0])
    res = E.run(cfg, device="cpu", out=tmp_path)
    assert torch.get_num_threads() == n
    saved = json.loads((tmp_path / f"{E.NAME}.json").read_text())
    for v in E.VARIANTS:
        assert len(saved["error"][v]["0"]) == 6
        assert saved["histories"][v]["0"]["steps"][-1] == 2
    assert res["config"]["hidden"] == 4
