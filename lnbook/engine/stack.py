"""Many copies of one model trained as one: :class:`Stack`.

At the book's sizes an update of a small model is mostly Python overhead, so the engine trains
the seeds of a variant as one model with a leading copy dimension. :class:`Stack` does it for
any :class:`torch.nn.Module`: the copies' parameters are stacked along a new first dimension
(:func:`torch.func.stack_module_state`) and one forward runs every copy on its own inputs
(:func:`torch.func.vmap` over :func:`torch.func.functional_call`). Copy ``k``'s loss depends
only on its own slice of the parameters, so the gradient of the summed losses is each copy's
own, and an elementwise optimizer (SGD, Adam) updates each copy as it would alone.

Buffers are stacked like parameters, so a module that updates its buffers in place in its
forward (batch norm's running averages) updates each copy's own slice under ``vmap``. A module
that cannot run under ``vmap`` (one that turns a tensor into a Python number, such as torch's
batch norm with ``momentum=None``, whose cumulative average divides by the count of batches
seen) is kept as it is and its copies run one after the other (``vectorize=False``, chosen by
default for that batch norm), with the same interface and the numbers of the copies run alone.

Copies that train with settings of their own (a learning rate, a warm-up) are given in
``blocks`` of consecutive copies: each block's parameters are tensors of their own, so that
:meth:`Stack.param_groups` makes each block a parameter group of any torch optimizer. A block
keeps its parameters in one flat tensor per kind (trained or frozen, and dtype), so that an
optimizer steps a few tensors, not one per name (the same numbers: it works element by element);
:meth:`Stack.named_stacked` gives them by name, each a view ``(copies, *shape)`` of its slice.

Example::

    >>> models = [nn.Linear(3, 2) for _ in range(4)]
    >>> stack = Stack(models, blocks=(2, 2))  # two settings, two copies each
    >>> stack(torch.randn(4, 8, 3)).shape  # (copies, batch, out)
    torch.Size([4, 8, 2])
    >>> opt = torch.optim.Adam(stack.param_groups(lr=[1e-3, 1e-2]))
    >>> [g["lr"] for g in opt.param_groups]
    [0.001, 0.01]
"""

from __future__ import annotations

import copy
import itertools
import math
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

__all__ = ["Stack"]

_SEP = "|"  # stands for "." in a stacked parameter's name (module names may not hold dots)


def _needs_one_by_one(model: nn.Module) -> bool:
    """True if ``model`` cannot run under ``vmap``: a torch batch norm that tracks a cumulative
    average (``momentum=None``) reads its count of batches as a Python number."""
    return any(isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats
               and m.momentum is None for m in model.modules())


class Stack(nn.Module):
    """``n`` copies of one architecture as one module (see the module's docstring).

    Args:
        models: the copies, each an ``nn.Module`` of the same architecture (the same parameter
            and buffer names and shapes); their current values are the stack's start.
        vectorize: run the copies as one computation (``vmap``); default: unless a copy is a
            torch batch norm with ``momentum=None`` (then the copies run one after the other).
        blocks: the sizes of consecutive blocks of copies whose parameters are tensors of their
            own (default: one block of all), for :meth:`param_groups`; they sum to ``n``.

    Shape:
        forward: every input ``(n, *)``, copy ``k`` gets ``input[k]``; inputs named in
        ``shared`` are given to every copy whole. The output (each output, for a tuple) gets a
        leading ``n``.
    """

    def __init__(self, models: Sequence[nn.Module], vectorize: bool | None = None,
                 blocks: Sequence[int] | None = None) -> None:
        super().__init__()
        models = list(models)
        if not models or not all(isinstance(m, nn.Module) for m in models):
            raise TypeError(f"models must be a non-empty sequence of nn.Module, got {models!r}")
        shapes = [{k: tuple(v.shape) for k, v in m.state_dict().items()} for m in models]
        if any(s != shapes[0] for s in shapes[1:]):
            raise ValueError("every copy must have the same parameters and buffers (names and "
                             "shapes) as the first")
        frozen = [{k for k, v in m.named_parameters() if not v.requires_grad} for m in models]
        if any(f != frozen[0] for f in frozen[1:]):
            raise ValueError("every copy must freeze (requires_grad=False) the same parameters "
                             "as the first")
        self.n = len(models)
        self.blocks = (self.n,) if blocks is None else tuple(blocks)
        if (not self.blocks or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                   for b in self.blocks) or sum(self.blocks) != self.n):
            raise ValueError(f"blocks must be ints >= 1 that sum to the {self.n} copies, got "
                             f"{blocks!r}")
        self._ends = list(itertools.accumulate(self.blocks))
        self.vectorize = (not any(map(_needs_one_by_one, models)) if vectorize is None
                          else bool(vectorize))
        if not self.vectorize:
            self.copies = nn.ModuleList(models)
            return
        params, buffers = stack_module_state(models)  # {name: (n, *shape)}
        # each block keeps its parameters in one flat tensor per (dtype, frozen) kind: an
        # optimizer then steps a few tensors instead of one per name (elementwise, the same
        # numbers); a name is a view of its slice, (copies, *shape)
        self._kinds: dict[str, list[str]] = {}
        for k, v in params.items():
            kind = f"{'frozen' if k in frozen[0] else 'trained'}{_SEP}{v.dtype}".replace(".", "_")
            self._kinds.setdefault(kind, []).append(k)
        self._shapes = {k: tuple(v.shape[1:]) for k, v in params.items()}
        self.stacked = nn.ModuleList(
            nn.ParameterDict({kind: nn.Parameter(torch.cat([params[k][a:b].reshape(-1)
                                                            for k in names]),
                                                 kind.startswith("trained"))
                              for kind, names in self._kinds.items()})
            for a, b in zip([0, *self._ends], self._ends, strict=False))
        for k, v in buffers.items():
            self.register_buffer("buffer" + _SEP + k.replace(".", _SEP), v.clone())
        # a list: not a submodule; it runs every call. The template (never run, so it holds no
        # value a forward under vmap left in it) is what unstack copies
        self._base = [copy.deepcopy(models[0]).to("meta")]
        self._template = _Template(self._base[0])

    def named_stacked(self, block: int = 0, grad: bool = False) -> dict[str, Tensor]:
        """Block ``block``'s parameters by name, each ``(copies of the block, *shape)``: views
        of the stack's storage (writing into one writes the parameter); ``grad``: views of
        their gradients (a name whose gradient is None is left out)."""
        out = {}
        n = self.blocks[block]
        for kind, names in self._kinds.items():
            flat = self.stacked[block][kind]
            if grad:
                flat = flat.grad
                if flat is None:
                    continue
            sizes = [n * math.prod(self._shapes[k]) for k in names]
            for k, piece in zip(names, flat.split(sizes), strict=True):
                out[k] = piece.view(n, *self._shapes[k])
        return out

    def _state(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        blocks = [self.named_stacked(b) for b in range(len(self.blocks))]
        params = blocks[0] if len(blocks) == 1 else {
            k: torch.cat([block[k] for block in blocks]) for k in blocks[0]}
        buffers = {k[len("buffer" + _SEP):].replace(_SEP, "."): v
                   for k, v in self.named_buffers() if k.startswith("buffer" + _SEP)}
        return params, buffers

    def param_groups(self, **options: Sequence[Any]) -> list[dict[str, Any]]:
        """One parameter group per block, for a torch optimizer; each option (``lr=[...]``,
        ``weight_decay=[...]``) gives one value per block.

        Raises:
            ValueError: an option without one value per block.
        """
        for name, values in options.items():
            if len(values) != len(self.blocks):
                raise ValueError(f"{name} needs one value per block ({len(self.blocks)}), "
                                 f"got {values!r}")
        if self.vectorize:
            params = [list(block.values()) for block in self.stacked]
        else:
            params = [[p for m in self.copies[a:b] for p in m.parameters()]
                      for a, b in zip([0, *self._ends], self._ends, strict=False)]
        return [{"params": p, **{k: v[i] for k, v in options.items()}}
                for i, p in enumerate(params)]

    def _one_by_one(self, fn: Callable[..., Any], inputs: Sequence[Tensor],
                    shared: Sequence[int]) -> Any:
        """``fn(copy k, its inputs)`` for every copy, stacked (each output of a tuple)."""
        outs = [fn(m, *(x if i in shared else x[k] for i, x in enumerate(inputs)))
                for k, m in enumerate(self.copies)]
        if isinstance(outs[0], tuple):
            return tuple(torch.stack(o) for o in zip(*outs, strict=True))
        return torch.stack(outs)

    def forward(self, *inputs: Tensor, shared: Sequence[int] = ()) -> Any:
        """Every copy on its own inputs; ``shared``: the positions of inputs given whole."""
        if not self.vectorize:
            return self._one_by_one(lambda m, *xs: m(*xs), inputs, shared)
        base = self._base[0]

        def one(p: dict[str, Tensor], b: dict[str, Tensor], *xs: Tensor) -> Tensor:
            return functional_call(base, (p, b), xs)

        dims = tuple(None if i in shared else 0 for i in range(len(inputs)))
        return vmap(one, in_dims=(0, 0, *dims))(*self._state(), *inputs)

    def call(self, fn: Callable[..., Any], *inputs: Tensor, shared: Sequence[int] = ()) -> Any:
        """``fn(model, *inputs)`` for every copy (for a method other than ``forward``, or a
        loss), stacked: a tensor, or a tuple of them."""
        if not self.vectorize:
            return self._one_by_one(fn, inputs, shared)
        base = self._base[0]

        wrapped = _Call(base, fn)

        def one(p: dict[str, Tensor], b: dict[str, Tensor], *xs: Tensor) -> Tensor:
            p = {f"model.{k}": v for k, v in p.items()}
            b = {f"model.{k}": v for k, v in b.items()}
            return functional_call(wrapped, (p, b), xs)

        dims = tuple(None if i in shared else 0 for i in range(len(inputs)))
        return vmap(one, in_dims=(0, 0, *dims))(*self._state(), *inputs)

    def train(self, mode: bool = True) -> Stack:
        """Training or evaluation mode for the stack and every copy it runs (under ``vmap`` the
        copies run through one module kept outside the stack's submodules)."""
        super().train(mode)
        if self.vectorize:
            self._base[0].train(mode)
        return self

    def unstack(self) -> list[nn.Module]:
        """The copies as separate modules on the CPU, with the stack's current values."""
        if not self.vectorize:
            return [copy.deepcopy(m).cpu() for m in self.copies]
        params, buffers = self._state()
        out = []
        for k in range(self.n):
            model = self._template.new().to_empty(device="cpu")
            own = {**dict(model.named_parameters()), **dict(model.named_buffers())}
            with torch.no_grad():
                for n, t in itertools.chain(params.items(), buffers.items()):
                    own[n].copy_(t[k])
            out.append(model)
        return out

    def extra_repr(self) -> str:
        return f"n={self.n}, vectorize={self.vectorize}" + (
            f", blocks={self.blocks}" if len(self.blocks) > 1 else "")


class _Template:
    """Fresh copies of a module on the meta device: unpickled from one pickle (a tenth of the
    time of :func:`copy.deepcopy`, which a stack's :meth:`Stack.unstack` pays once per copy),
    or deep-copied where the module cannot be pickled (a lambda in an attribute)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = copy.deepcopy(model)  # never run, so it holds no value a forward left
        try:
            self.pickled: bytes | None = pickle.dumps(self.model)
        except Exception:  # noqa: BLE001 (whatever pickle refuses, the deep copy still works)
            self.pickled = None

    def new(self) -> nn.Module:
        return (copy.deepcopy(self.model) if self.pickled is None
                else pickle.loads(self.pickled))  # noqa: S301 (our own bytes)


class _Call(nn.Module):
    """``fn(model, *xs)`` as a module's forward, for :func:`torch.func.functional_call`."""

    def __init__(self, model: nn.Module, fn: Callable[..., Tensor]) -> None:
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, *xs: Tensor) -> Tensor:
        return self.fn(self.model, *xs)
