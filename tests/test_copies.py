"""The copies' loop (:func:`lnbook.engine.train_copies`): checkpoint and resume of a stacked
run give the numbers of an uninterrupted one; a diverged copy is left behind while the others
train on; the warm-up of each parameter group (:func:`lnbook.engine.linear_warmup`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lnbook.engine import History, Stack, linear_warmup, train_copies
from lnbook.engine.train import UnreadableFile, load_checkpoint, restore

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


@pytest.mark.parametrize("misfit", ["renamed", "reshaped", "optimizer"])
def test_a_checkpoint_that_does_not_fit_is_named_with_what_to_do(tmp_path, misfit):
    """A checkpoint of another model, or one an older lnbook wrote in another layout (a
    stack's parameters under other names): one line naming it, not torch's multi-line error."""
    ckpt = tmp_path / "stack.pt"
    _train(6, ckpt)
    saved = load_checkpoint(ckpt)
    if misfit == "renamed":  # the layout of an earlier version
        saved["model"] = {f"stacked.{k}": v for k, v in saved["model"].items()}
    elif misfit == "reshaped":
        saved["model"]["w"] = torch.zeros(M, D + 1)
    else:
        saved["optimizer"]["param_groups"].append(dict(saved["optimizer"]["param_groups"][0]))
    torch.save(saved, ckpt)
    with pytest.raises(UnreadableFile) as unreadable:
        _train(8, ckpt)
    text = str(unreadable.value)
    assert text.startswith(f"cannot read {ckpt}: written for another model or lnbook version (")
    assert text.endswith("move it away to train that run from the start") and "\n" not in text
    assert len(text) < 300 + len(str(ckpt))
    assert load_checkpoint(ckpt)["step"] == 6  # left as it was


def test_restore_copies_a_mapping_in_place_and_names_a_missing_tensor(tmp_path):
    """Copies kept as a mapping of tensors (not a module): a fitting checkpoint is copied into
    them in place; one without a name they hold is one line naming the file and the name."""
    w = nn.Parameter(torch.zeros(M, D))
    opt = torch.optim.Adam([w], lr=0.1)
    saved = {"model": {"w": torch.ones(M, D)}, "optimizer": opt.state_dict()}
    restore(tmp_path / "a.pt", saved, {"w": w}, opt)
    assert torch.equal(w.detach(), torch.ones(M, D))
    with pytest.raises(UnreadableFile) as unreadable:
        restore(tmp_path / "a.pt", saved, {"v": w}, opt)
    text = str(unreadable.value)
    assert text.startswith(f"cannot read {tmp_path / 'a.pt'}: written for another model")
    assert "('v')" in text and text.endswith("move it away to train that run from the start")


def test_linear_warmup_ramps_then_holds_and_resumes():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = linear_warmup(torch.optim.Adam([p], lr=0.4), warmup=4)
    used = []
    for _ in range(6):
        p.grad = torch.ones(3)
        opt.step()
        used.append(opt.param_groups[0]["lr"])
    np.testing.assert_allclose(used, [0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    # a resumed optimizer continues the ramp from its saved step count
    q = torch.nn.Parameter(torch.zeros(3))
    first = linear_warmup(torch.optim.Adam([q], lr=0.4), warmup=4)
    q.grad = torch.ones(3)
    first.step()
    second = torch.optim.Adam([q], lr=0.4)
    second.load_state_dict(first.state_dict())
    linear_warmup(second, warmup=4)
    q.grad = torch.ones(3)
    second.step()
    assert second.param_groups[0]["lr"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="warmup"):
        linear_warmup(torch.optim.Adam([p], lr=0.1), warmup=0)
    with pytest.raises(ValueError, match="one int >= 0 per parameter group"):
        linear_warmup(torch.optim.Adam([p], lr=0.1), warmup=[2, 3])


def test_each_group_warms_up_on_its_own_as_an_optimizer_alone():
    """Two blocks of a Stack, each a group with its own rate and warm-up (0: none), update
    each copy as torch.optim.Adam of that rate and warm-up would update it alone."""
    g = torch.Generator().manual_seed(0)
    start = [nn.Linear(3, 2) for _ in range(4)]
    stack = Stack(start, blocks=(2, 2))
    opt = linear_warmup(torch.optim.Adam(stack.param_groups(lr=[0.1, 0.01])), [3, 0])
    alone = [nn.Linear(3, 2) for _ in range(4)]
    for a, s in zip(alone, start, strict=True):
        a.load_state_dict(s.state_dict())
    opts = [linear_warmup(torch.optim.Adam(a.parameters(), lr=lr), w) if w else
            torch.optim.Adam(a.parameters(), lr=lr)
            for a, lr, w in zip(alone, (0.1, 0.1, 0.01, 0.01), (3, 3, 0, 0), strict=True)]
    for _ in range(5):
        x = torch.randn(4, 6, 3, generator=g)
        opt.zero_grad()
        stack(x).square().mean((1, 2)).sum().backward()
        opt.step()
        for k, (a, o) in enumerate(zip(alone, opts, strict=True)):
            o.zero_grad()
            a(x[k]).square().mean().backward()
            o.step()
    assert [grp["lr"] for grp in opt.param_groups] == [0.1, 0.01]
    for got, want in zip(stack.unstack(), alone, strict=True):
        for a, b in zip(got.parameters(), want.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_a_diverged_copy_is_left_behind_and_resumed_as_such(tmp_path):
    """With ``diverged``, a copy whose loss is not finite gets the update's number and no more
    losses; the other copies train as they would alone; a checkpoint keeps it."""

    def train(steps, checkpoint=None):
        w = nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        opt = torch.optim.SGD([w], lr=0.1)
        hists, diverged = [History() for _ in range(3)], [None] * 3

        def losses(step):  # copy 1 blows up at its third update
            loss = (w - 0.5) ** 2
            return torch.where(torch.tensor([False, step >= 2, False]), np.inf, loss)

        train_copies(losses, lambda: [{"w": float(v)} for v in w.detach()], opt, hists, steps,
                     2, diverged=diverged, state={"w": w}, checkpoint=checkpoint)
        return hists, diverged, w.detach()

    hists, diverged, w = train(4)
    assert diverged == [None, 3, None]
    assert hists[1].steps == [1, 2] and hists[0].steps == [1, 2, 3, 4]
    assert math.isfinite(w[0]) and math.isfinite(w[2])
    assert float(w[0]) == pytest.approx(0.5 + 0.5 * 0.8 ** 4)  # SGD on (w - 0.5)^2 alone
    ckpt = tmp_path / "c.pt"
    train(3, ckpt)
    resumed, again, _ = train(4, ckpt)
    assert again == diverged and [h.losses for h in resumed] == [h.losses for h in hists]
    with pytest.raises(FloatingPointError, match="not finite|losses are"):
        train_copies(lambda s: torch.tensor([np.inf], requires_grad=True), lambda: [{}],
                     torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), [History()], 1, 1)


def test_autocast_trains_in_low_precision_and_keeps_float32_state():
    """Under ``autocast=torch.bfloat16`` the losses are computed by bfloat16 matrix products
    (so they differ from float32's by bfloat16 rounding, not more), while the parameters and
    Adam's moments stay float32; a dtype autocast cannot train in is refused by name."""
    def run(autocast):
        torch.manual_seed(0)
        layer = nn.Linear(16, 1)
        x, y = torch.randn(3, 32, 16), torch.randn(3, 32, 1)
        opt = torch.optim.Adam(layer.parameters(), lr=0.01, foreach=True)
        seen = []

        def losses(step):
            out = layer(x)  # (3, 32, 1): one "copy" per leading index
            seen.append(out.dtype)
            return ((out.float() - y) ** 2).mean((1, 2))

        hists = [History() for _ in range(3)]
        train_copies(losses, lambda: [{} for _ in range(3)], opt, hists, 5, 5,
                     autocast=autocast)
        return hists, layer, opt, seen

    h32, l32, _, dt32 = run(None)
    h16, l16, opt16, dt16 = run(torch.bfloat16)
    assert set(dt32) == {torch.float32} and set(dt16) == {torch.bfloat16}
    assert l16.weight.dtype == torch.float32
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt16.state.values())
    first32, first16 = h32[0].losses[0], h16[0].losses[0]
    assert first16 != first32 and first16 == pytest.approx(first32, rel=2 ** -6)
    with pytest.raises(ValueError, match="autocast must be None or one of"):
        train_copies(lambda s: torch.zeros(1, requires_grad=True), lambda: [{}],
                     torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), [History()],
                     1, 1, autocast=torch.float64)
