"""Helpers shared by several test files (not tests themselves)."""

from __future__ import annotations

import torch
from torch import nn

import lnbook
from lnbook.engine import Results


def randomize_ln(module: nn.Module, seed: int = 1) -> None:
    """Give every LayerNorm inside ``module`` a random gain in [0.5, 1.5) and a random bias.

    At initialization they are 1 and 0, which would let a check against the paper's equations
    pass with the gains or biases in the wrong place.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, lnbook.LayerNorm):
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g, dtype=m.weight.dtype))
                if m.bias is not None:
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g, dtype=m.bias.dtype))


def assert_same_runs(one: Results, two: Results) -> None:
    """The two sweeps trained the same runs, in the same order, to the same numbers."""
    assert [(r.variant, r.seed) for r in two.runs] == [(r.variant, r.seed) for r in one.runs]
    for a, b in zip(one.runs, two.runs, strict=True):
        assert a.history.losses == b.history.losses and a.history.metrics == b.history.metrics
        assert a.info == b.info
