"""lnbook.engine.train: Batches, History, fit, and bit-identical resume from a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lnbook.engine.train import (
    Batches,
    History,
    UnreadableFile,
    fit,
    load_checkpoint,
    progress_enabled,
)
from lnbook.norms import BatchNorm, LayerNorm


def test_batches_are_a_function_of_the_step():
    x, y = torch.arange(10.0).unsqueeze(1), torch.arange(10)
    b = Batches(x, y, batch_size=3, seed=5)
    assert len(b) == 3
    epoch0 = torch.cat([b(s)[1] for s in range(3)])
    assert len(set(epoch0.tolist())) == 9  # one epoch: 9 distinct examples, the 10th dropped
    epoch1 = torch.cat([b(s)[1] for s in range(3, 6)])
    assert not torch.equal(epoch0, epoch1)
    assert torch.equal(b(4)[1], Batches(x, y, batch_size=3, seed=5)(4)[1])  # fresh object, same
    assert torch.equal(b(1)[1], b(1)[1]) and torch.equal(b(4)[0].squeeze(1).long(), b(4)[1])
    assert not torch.equal(b(0)[1], Batches(x, y, batch_size=3, seed=6)(0)[1])


def test_batches_errors():
    with pytest.raises(ValueError, match="first dimension"):
        Batches(torch.zeros(4, 2), torch.zeros(5), batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        Batches(torch.zeros(4, 2), batch_size=5)
    with pytest.raises(TypeError):
        Batches([1, 2, 3], batch_size=1)
    with pytest.raises(ValueError, match="step"):
        Batches(torch.zeros(4), batch_size=2)(-1)


def test_history_json_roundtrip():
    h = History([1, 2], [0.5, 0.25], [0, 2], [{"a": 1.0}, {"a": 0.5}], 1.5, [0.1, 0.2])
    back = History.from_dict(json.loads(json.dumps(h.to_dict())))
    assert back == h and back.metric("a") == [1.0, 0.5]


def _regression(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    w = torch.tensor([[1.0], [-2.0], [0.5]])
    return x, x @ w + 0.3


def _mse(model, batch):
    return F.mse_loss(model(batch[0]), batch[1])


def test_fit_learns_least_squares_and_evaluates_on_schedule():
    x, y = _regression()
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    calls = []

    def eval_fn(m):
        calls.append((m.training, torch.is_grad_enabled()))
        return {"mse": F.mse_loss(m(x), y)}

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = fit(model, Batches(x, y, batch_size=32), opt, steps=150, eval_every=40, eval_fn=eval_fn,
            loss_fn=_mse, device="cpu", progress=False)
    assert h.steps == list(range(1, 151)) and len(h.losses) == 150
    assert h.eval_steps == [0, 40, 80, 120, 150]
    assert calls == [(False, False)] * 5 and model.training  # eval mode, no grad, then back
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.0, -2.0, 0.5]]), atol=1e-3,
                               rtol=0)
    torch.testing.assert_close(model.bias.detach(), torch.tensor([0.3]), atol=1e-3, rtol=0)
    assert h.metric("mse")[-1] < 1e-6 < h.metric("mse")[0]
    assert h.wall_time > 0 and len(h.step_times) == 150


class _Net(nn.Module):
    """Everything resume must restore: dropout (RNG), BN running stats (buffers), LN, Adam."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.ln = nn.Linear(3, 16), BatchNorm(16), LayerNorm(16)
        self.drop, self.fc2 = nn.Dropout(0.3), nn.Linear(16, 1)

    def forward(self, x, y):
        h = self.drop(torch.relu(self.ln(self.bn(self.fc1(x)))))
        return F.mse_loss(self.fc2(h), y)


def _train(steps, checkpoint=None, fail_at=None, init_seed=0):
    x, y = _regression(64)
    batches = Batches(x, y, batch_size=8, seed=3)

    def data(step):
        if step == fail_at:
            raise KeyboardInterrupt
        return batches(step)

    torch.manual_seed(init_seed)
    model = _Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    h = fit(model, data, opt, steps=steps, eval_every=3, device="cpu", seed=7,
            eval_fn=lambda m: {"loss": m(x, y)}, checkpoint=checkpoint, progress=False)
    return h, model


@pytest.mark.parametrize("fail_at", [1, 7, 11])
def test_resume_is_bit_identical(tmp_path, fail_at):
    ref, ref_model = _train(13)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(13, checkpoint=ckpt, fail_at=fail_at)
    # the interrupt saved the last finished update, not only the last evaluation's
    assert torch.load(ckpt, weights_only=True)["step"] == fail_at
    # the resumed process builds its model from another seed: the checkpoint must override it
    h, model = _train(13, checkpoint=ckpt, init_seed=123)
    assert h.steps == ref.steps and h.eval_steps == ref.eval_steps
    assert h.losses == ref.losses and h.metrics == ref.metrics
    for (k, a), (_, b) in zip(ref_model.state_dict().items(), model.state_dict().items(),
                              strict=True):
        assert torch.equal(a, b), k
    assert not list(tmp_path.glob("*.tmp"))


class _StepInterrupted(torch.optim.Adam):
    """Adam that is interrupted inside its 5th step, after changing the first parameter."""

    calls = 0

    def step(self, closure=None):
        type(self).calls += 1
        if type(self).calls == 5:
            with torch.no_grad():
                self.param_groups[0]["params"][0].add_(1.0)  # half an update
            raise KeyboardInterrupt
        return super().step(closure)


def test_interrupt_inside_optimizer_step_keeps_the_last_checkpoint(tmp_path, capsys):
    x, y = _regression(64)
    torch.manual_seed(0)
    model = _Net()
    _StepInterrupted.calls = 0
    opt = _StepInterrupted(model.parameters(), lr=1e-2)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        fit(model, Batches(x, y, batch_size=8, seed=3), opt, steps=13, eval_every=3,
            device="cpu", seed=7, checkpoint=ckpt, progress=False)
    assert torch.load(ckpt, weights_only=True)["step"] == 3  # not the half-applied update 5
    assert "interrupted" not in capsys.readouterr().err
    ref, _ = _train(13)
    h, _ = _train(13, checkpoint=ckpt, init_seed=123)
    assert h.losses == ref.losses
    assert "resuming from update 3 of 13" in capsys.readouterr().err


def test_resume_of_a_finished_run_and_longer_runs(tmp_path):
    ckpt = tmp_path / "run.pt"
    short, _ = _train(6, checkpoint=ckpt)
    again, _ = _train(6, checkpoint=ckpt, init_seed=9)  # nothing left to do
    assert again.losses == short.losses
    longer, _ = _train(9, checkpoint=ckpt)  # extends the finished run
    ref, _ = _train(9)
    assert longer.losses == ref.losses
    with pytest.raises(ValueError, match="beyond steps"):
        _train(4, checkpoint=ckpt)


@pytest.mark.parametrize("damage", ["truncated", "empty", "not a checkpoint"])
def test_an_unreadable_checkpoint_is_named_with_what_to_do(tmp_path, damage):
    ckpt = tmp_path / "run.pt"
    _train(6, checkpoint=ckpt)
    good = ckpt.read_bytes()
    if damage == "truncated":  # the disk filled up, a copy was cut short
        ckpt.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:
        torch.save({"weights": torch.zeros(2)}, ckpt)
    with pytest.raises(UnreadableFile) as unreadable:
        _train(9, checkpoint=ckpt)
    assert isinstance(unreadable.value, RuntimeError)  # what torch raised for a truncated one
    assert unreadable.value.path == ckpt
    text = str(unreadable.value)
    assert text.startswith(f"cannot read {ckpt}: ") and "\n" not in text
    assert "delete it to train that run from the start" in text
    ckpt.write_bytes(good)
    assert load_checkpoint(ckpt)["step"] == 6


def test_a_checkpoint_of_another_model_is_named_with_what_to_do(tmp_path):
    ckpt = tmp_path / "run.pt"
    _train(6, checkpoint=ckpt)
    saved = load_checkpoint(ckpt)
    saved["model"] = {"old." + k: v for k, v in saved["model"].items()}  # another layout
    torch.save(saved, ckpt)
    with pytest.raises(UnreadableFile) as unreadable:
        _train(9, checkpoint=ckpt)
    text = str(unreadable.value)
    assert text.startswith(f"cannot read {ckpt}: written for another model or lnbook version")
    assert "Missing key(s)" in text and "\n" not in text
    assert text.endswith("move it away to train that run from the start")


def test_same_seed_same_run_other_seed_other_run():
    a, _ = _train(6)
    b, _ = _train(6)
    assert a.losses == b.losses
    x, y = _regression(64)
    torch.manual_seed(0)
    model = _Net()
    c = fit(model, Batches(x, y, batch_size=8, seed=3), torch.optim.Adam(model.parameters(), 1e-2),
            steps=6, eval_every=3, device="cpu", seed=8, progress=False)
    assert c.losses != a.losses  # only the dropout masks differ


def test_fit_errors():
    model = nn.Linear(3, 1)
    x, y = _regression(16)
    data = Batches(x, y, batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="steps"):
        fit(model, data, opt, steps=0, eval_every=1, loss_fn=_mse)
    with pytest.raises(ValueError, match="eval_every"):
        fit(model, data, opt, steps=1, eval_every=0, loss_fn=_mse)
    with pytest.raises(TypeError, match="scalar"):
        fit(model, data, opt, steps=1, eval_every=1, loss_fn=lambda m, b: m(b[0]), device="cpu")
    with pytest.raises(TypeError, match="callable"):
        fit(model, [(x, y)], opt, steps=1, eval_every=1)
    with pytest.raises(TypeError, match=r"eval_fn must return a dict\[str, float\], got list"):
        fit(model, data, opt, steps=1, eval_every=1, loss_fn=_mse, device="cpu",
            eval_fn=lambda m: [0.0])


def test_progress_enabled(monkeypatch):
    assert progress_enabled(True) and not progress_enabled(False)
    monkeypatch.setenv("CI", "1")
    assert not progress_enabled(None)


def test_fit_stops_with_a_clear_error_when_the_loss_is_not_finite():
    model = nn.Linear(2, 1)
    x = torch.randn(8, 2)
    x[3] = float("inf")
    data = Batches(x, batch_size=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(FloatingPointError, match="update 1"):
        fit(model, data, opt, steps=3, eval_every=1, device="cpu",
            loss_fn=lambda m, b: m(b[0]).pow(2).mean())
