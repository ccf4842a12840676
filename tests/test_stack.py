"""engine.Stack: copies of a model trained as one give the numbers of the copies alone."""

import pytest
import torch
from torch import nn

from lnbook import LayerNorm
from lnbook.engine import History, train_copies
from lnbook.engine.stack import Stack


def _mlp(seed: int, norm: type[nn.Module] = LayerNorm, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    # no bias in front of a batch norm: it would remove it, leaving a gradient of rounding
    # noise that Adam scales up to full steps, different in every computation
    first = nn.Linear(5, 8, bias=norm is not nn.BatchNorm1d)
    return nn.Sequential(first, norm(8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)


def _data(n: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, 5, generator=g, dtype=dtype), torch.randint(3, (n, 6), generator=g)


def _train_alone(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> nn.Module:
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


@pytest.mark.parametrize("norm", [LayerNorm, nn.BatchNorm1d])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_a_stack_trains_each_copy_as_it_would_alone(dtype, tol, norm):
    seeds, steps = (0, 1, 2), 6
    x, y = _data(len(seeds), dtype)
    stack = Stack([_mlp(s, norm=norm, dtype=dtype) for s in seeds])
    assert stack.vectorize and stack.eval()(x).shape == (3, 6, 3)  # eval: averages kept
    stack.train()
    opt = torch.optim.Adam(stack.parameters(), lr=0.05)

    def losses(step: int) -> torch.Tensor:  # (copies,)
        logits = stack(x)  # (copies, 6, 3)
        return torch.stack([nn.functional.cross_entropy(logits[k], y[k]) for k in range(3)])

    hists = train_copies(losses, lambda: [{} for _ in seeds], opt,
                         [History() for _ in seeds], steps, steps)
    assert [len(h.losses) for h in hists] == [steps] * 3
    for k, (s, got) in enumerate(zip(seeds, stack.unstack(), strict=True)):
        alone = _train_alone(_mlp(s, norm=norm, dtype=dtype), x[k], y[k], steps)
        for (name, a), b in zip(alone.state_dict().items(), got.state_dict().values(),
                                strict=True):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=name)
    assert not torch.equal(stack.unstack()[0][0].weight, stack.unstack()[1][0].weight)


def test_shared_inputs_and_other_methods():
    stack = Stack([_mlp(s) for s in (0, 1)])
    x = torch.randn(6, 5)
    out = stack(x, shared=(0,))  # the same batch for every copy
    alone = [m(x) for m in stack.unstack()]
    torch.testing.assert_close(out, torch.stack(alone))
    first = stack.call(lambda m, v: m[0](v), x, shared=(0,))  # one layer only
    torch.testing.assert_close(first, torch.stack([m[0](x) for m in stack.unstack()]))


def test_batch_norm_copies_keep_their_own_running_statistics_under_vmap():
    models = [_mlp(s, norm=nn.BatchNorm1d) for s in (0, 1)]
    twins = [_mlp(s, norm=nn.BatchNorm1d) for s in (0, 1)]
    stack = Stack(models)
    assert stack.vectorize
    g = torch.Generator().manual_seed(2)
    for _ in range(3):  # training mode: batch statistics, running averages updated per copy
        x = torch.randn(2, 16, 5, generator=g)
        out = stack(x)
        for k, twin in enumerate(twins):
            torch.testing.assert_close(out[k], twin(x[k]))
    for k, (got, twin) in enumerate(zip(stack.unstack(), twins, strict=True)):
        for name, want in twin.state_dict().items():  # running mean, var, batches seen
            torch.testing.assert_close(got.state_dict()[name], want, msg=f"copy {k} {name}")
    assert not torch.equal(stack.unstack()[0][1].running_mean, twins[1][1].running_mean)
    x = torch.randn(2, 4, 5, generator=g)
    out = stack.eval()(x)  # evaluation mode reads each copy's own averages
    torch.testing.assert_close(out, torch.stack([t.eval()(x[k]) for k, t in enumerate(twins)]))


def test_a_cumulative_batch_norm_runs_one_by_one():
    def cumulative(n: int) -> nn.Module:
        return nn.BatchNorm1d(n, momentum=None)  # divides by the count of batches seen

    models = [_mlp(s, norm=cumulative) for s in (0, 1)]
    twins = [_mlp(s, norm=cumulative) for s in (0, 1)]
    stack = Stack(models)
    assert not stack.vectorize
    x = torch.randn(2, 16, 5)
    out = stack(x)
    for k, twin in enumerate(twins):
        torch.testing.assert_close(out[k], twin(x[k]), rtol=0, atol=0)
        torch.testing.assert_close(stack.unstack()[k][1].running_mean, twin[1].running_mean)


def test_bad_copies_are_refused():
    with pytest.raises(TypeError, match="non-empty sequence of nn.Module"):
        Stack([])
    with pytest.raises(ValueError, match="same parameters and buffers"):
        Stack([nn.Linear(2, 3), nn.Linear(3, 3)])
    one, two = nn.Linear(2, 3), nn.Linear(2, 3)
    one.bias.requires_grad_(False)
    with pytest.raises(ValueError, match="freeze .* the same parameters"):
        Stack([one, two])


def test_a_frozen_parameter_stays_frozen():
    """A parameter a copy freezes (requires_grad=False, as recurrent BN's input biases) gets no
    gradient and no update in the stack, as it gets none alone."""
    models = [_mlp(s) for s in (0, 1)]
    for m in models:
        m[1].bias.requires_grad_(False)
        with torch.no_grad():
            m[1].bias.fill_(0.25)
    x, y = _data(2)
    stack = Stack(models)
    frozen = stack.named_stacked()["1.bias"]
    assert not frozen.requires_grad
    opt = torch.optim.Adam(stack.parameters(), lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(stack(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
    assert frozen.grad is None and torch.equal(frozen, torch.full((2, 8), 0.25))
    for k, back in enumerate(stack.unstack()):
        alone = _train_alone(models[k], x[k], y[k], 3)
        assert not back[1].bias.requires_grad and torch.equal(back[1].bias, alone[1].bias)
        torch.testing.assert_close(back[0].weight, alone[0].weight)


def test_eval_mode_reaches_the_vectorized_copies():
    models = [nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)) for _ in range(2)]
    stack = Stack(models).eval()
    assert stack.vectorize and not stack._base[0].training
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(stack(x), torch.stack([m[0](x[k]) for k, m in enumerate(models)]))
    assert stack.train()._base[0].training


def test_blocks_are_parameter_groups_and_tuples_come_out_stacked():
    models = [_mlp(s) for s in range(5)]
    stack, whole = Stack(models, blocks=(2, 3)), Stack(models)
    x = torch.randn(5, 4, 5)
    torch.testing.assert_close(stack(x), whole(x), rtol=0, atol=0)  # blocks only split storage
    groups = stack.param_groups(lr=[0.1, 0.2])
    assert [g["lr"] for g in groups] == [0.1, 0.2]
    per_copy = sum(p.numel() for p in models[0].parameters())
    assert [sum(p.numel() for p in g["params"]) for g in groups] == [2 * per_copy, 3 * per_copy]
    assert [v.shape[0] for v in (stack.named_stacked(0)["0.weight"],
                                 stack.named_stacked(1)["0.weight"])] == [2, 3]
    for k, (got, want) in enumerate(zip(stack.unstack(), models, strict=True)):
        torch.testing.assert_close(got[0].weight, want[0].weight, msg=f"copy {k}")
    both = stack.call(lambda m, v: (m(v), m[0](v)), x)  # a tuple: each part stacked
    assert [tuple(t.shape) for t in both] == [(5, 4, 3), (5, 4, 8)]
    bn = Stack([_mlp(s, norm=nn.BatchNorm1d) for s in range(3)], blocks=(1, 2))
    per_copy = sum(p.numel() for p in bn.unstack()[0].parameters())
    assert [sum(p.numel() for p in g["params"]) for g in bn.param_groups()] == [
        per_copy, 2 * per_copy]
    cumulative = [_mlp(s, norm=lambda n: nn.BatchNorm1d(n, momentum=None)) for s in range(3)]
    one_by_one = Stack(cumulative, blocks=(1, 2))  # every copy's own parameters
    assert [len(g["params"]) for g in one_by_one.param_groups()] == [6, 12]
    assert [tuple(t.shape) for t in bn.call(lambda m, v: (m(v), v), x[:3, :, :])] == [
        (3, 4, 3), (3, 4, 5)]
    with pytest.raises(ValueError, match="one value per block"):
        stack.param_groups(lr=[0.1])
    with pytest.raises(ValueError, match="sum to the 5 copies"):
        Stack(models, blocks=(2, 2))


class _Scaled(nn.Module):
    """A module holding a function in an attribute: a lambda cannot be pickled."""

    def __init__(self, scale) -> None:
        super().__init__()
        self.lin, self.scale = nn.Linear(3, 2), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(self.lin(x))


@pytest.mark.parametrize("scale", [torch.tanh, lambda t: 2 * t], ids=["picklable", "lambda"])
def test_unstack_gives_independent_copies_with_the_stacks_values(scale):
    """unstack copies a pickled template (a lambda: deep-copied instead): each copy holds its own
    tensors, equal to the stack's slice, with the module's non-tensor attributes."""
    models = [_Scaled(scale) for _ in range(3)]
    for m in models:
        m.register_buffer("count", torch.randint(9, ()))
    stack = Stack(models)
    assert (stack._template.pickled is None) == (scale is not torch.tanh)  # the path taken
    with torch.no_grad():
        stack.named_stacked()["lin.weight"].add_(1.0)
    copies = stack.unstack()
    x = torch.randn(4, 3)
    for k, (got, want) in enumerate(zip(copies, models, strict=True)):
        assert got is not want and got.scale is scale
        assert got.lin.weight.data_ptr() != copies[k - 1].lin.weight.data_ptr()
        torch.testing.assert_close(got.lin.weight, want.lin.weight + 1.0, rtol=0, atol=0)
        assert torch.equal(got.count, want.count) and got.count.device.type == "cpu"
        torch.testing.assert_close(got(x), scale(x @ got.lin.weight.T + want.lin.bias))
