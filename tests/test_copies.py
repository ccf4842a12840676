"""The copies' loop (:func:`lnbook.engine.train_copies`): checkpoint and resume of a stacked
run give the numbers of an uninterrupted one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lnbook.engine import History, train_copies
from lnbook.engine.train import load_checkpoint

M, D = 3, 4


class _Copies(nn.Module):
    """``M`` linear regressions as one module, with a buffer that training moves."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(M, D, generator=g))
        self.register_buffer("seen", torch.zeros(M))


def _train(steps, checkpoint=None, stop_at=None):
    """Train fresh copies for ``steps`` updates; each copy draws its batch from its own
    generator; ``stop_at``: Ctrl-C while computing that update's loss."""
    torch.manual_seed(123)
    model = _Copies()
    gens = [torch.Generator().manual_seed(10 + k) for k in range(M)]
    truth = torch.arange(D, dtype=torch.float32)

    def losses(step):
        if step == stop_at:
            raise KeyboardInterrupt
        x = torch.stack([torch.randn(8, D, generator=g) for g in gens])  # (M, 8, D)
        noise = 0.01 * torch.randn(M, 8)  # torch's global generator
        with torch.no_grad():
            model.seen += 1
        pred = torch.einsum("mbd,md->mb", x, model.w)
        return ((pred - x @ truth - noise) ** 2).mean(1)  # (M,)

    def evaluate():
        err = (model.w.detach() - truth).square().sum(1)
        return [{"err": float(e), "seen": float(s)} for e, s in zip(err, model.seen, strict=True)]

    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    hists = [History() for _ in range(M)]
    train_copies(losses, evaluate, opt, hists, steps, 3, state=model, generators=gens,
                 checkpoint=checkpoint)
    return hists, model


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        assert (x.steps, x.losses, x.eval_steps, x.metrics) == (
            y.steps, y.losses, y.eval_steps, y.metrics)


def test_a_resumed_stacked_run_ends_as_an_uninterrupted_one(tmp_path):
    whole, model = _train(8)
    assert whole[0].eval_steps == [0, 3, 6, 8] and len(whole[2].losses) == 8
    assert whole[0].losses != whole[1].losses  # each copy its own data
    ckpt = tmp_path / "stack.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(8, ckpt, stop_at=4)  # updates 1-4 done; Ctrl-C in the fifth
    saved = load_checkpoint(ckpt)
    assert (saved["step"], saved["steps"], saved["copies"]) == (4, 8, M)
    resumed, again = _train(8, ckpt)
    _same(whole, resumed)
    assert torch.equal(model.w, again.w) and torch.equal(model.seen, again.seen)
    assert load_checkpoint(ckpt)["step"] == 8


def test_a_stacked_run_trains_longer_from_its_checkpoint(tmp_path):
    ckpt = tmp_path / "stack.pt"
    short, _ = _train(6, ckpt)
    assert short[0].eval_steps == [0, 3, 6]
    longer, _ = _train(8, ckpt)
    _same(_train(8)[0], longer)
    with pytest.raises(ValueError, match="beyond steps=5"):
        _train(5, ckpt)
    with pytest.raises(ValueError, match="needs the copies' state"):
        train_copies(lambda s: torch.zeros(1), lambda: [{}], torch.optim.SGD(
            [nn.Parameter(torch.zeros(1))], lr=1.0), [History()], 1, 1, checkpoint=ckpt)
