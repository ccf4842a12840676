"""Helpers shared by the text experiments of chapter 6 (order embeddings, skip-thoughts)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lnbook.engine.train import History


def pad_ids(seqs: Sequence[Sequence[int]], length: int) -> Tensor:
    """Word ids ``(N, length)``: each sequence cut to ``length``, right-padded with 0."""
    out = torch.zeros(len(seqs), length, dtype=torch.long)
    for n, s in enumerate(seqs):
        out[n, : len(s[:length])] = torch.tensor(s[:length], dtype=torch.long)
    return out


def median_step_time(hist: History, steps: int) -> float:
    """Median seconds of one update of ``hist`` (robust to a busy machine)."""
    times = sorted(hist.step_times or [hist.wall_time / steps])
    return times[len(times) // 2]

