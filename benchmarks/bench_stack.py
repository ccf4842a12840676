"""The engine's stacked copies against the hand-batched ones it has not replaced yet.

Every experiment is meant to train its seeds through :class:`lnbook.engine.Stack`, which runs
the copies of any ``nn.Module`` as one computation (``torch.func.vmap`` over
``functional_call``). Chapters 6.6 and 6.8 still train hand-batched copies written for one
model (:class:`lnbook.batched.SeedMLP`, weights ``(S, in, out)``, one ``baddbmm`` a layer).
This script measures what replacing them would cost: in each round it times the same update
(Adam on the summed per-copy losses, the same batch for both) both ways, and reports the
median over the rounds of the per-round ratio ``Stack / hand-batched`` (above 1: the engine's
Stack is slower), a ratio measured in one run.

    python benchmarks/bench_stack.py --copies 5 --updates 20 --repeats 5
    python benchmarks/bench_stack.py --device cuda --out ''   # on a GPU, print only
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from common import RESULTS, machine_description, sync

from lnbook import resolve_device
from lnbook.batched import seed_nll
from lnbook.engine import Stack
from lnbook.experiments import mnist

MLP_CASES = tuple((norm, bs) for norm in mnist.NORMS for bs in (128, 4))


Pair = tuple[torch.nn.Module, Callable[[], torch.Tensor], torch.nn.Module,
             Callable[[], torch.Tensor]]  # (stack, its losses, hand-batched, its losses)


def _updates(model: torch.nn.Module, loss: Callable[[], torch.Tensor],
             device: torch.device) -> Callable[[int], float]:
    """``n -> seconds`` of ``n`` Adam updates of ``model`` on ``loss()`` (copies summed),
    timed until the device has done them."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def run(n: int) -> float:
        sync(device)
        start = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            loss().sum().backward()
            opt.step()
        sync(device)
        return time.perf_counter() - start
    return run


def mlp_pair(norm: str, batch_size: int, copies: int, device: torch.device) -> Pair:
    """Chapter 6.6's MLP (the quick preset's widths): ``mnist.seed_model`` (a ``SeedMLP``)
    and a ``Stack`` of the ``mnist.MLP`` of each seed, on one random batch per copy."""
    cfg = mnist.get_config("quick")
    seeds = tuple(range(copies))
    sizes = (784, *cfg.hidden, 10)
    unbiased = batch_size <= cfg.bn_unbiased_max_batch
    hand = mnist.seed_model(cfg, norm, batch_size, seeds).to(device)
    models = []
    for s in seeds:
        torch.manual_seed(s)
        models.append(mnist.MLP(sizes, norm, bn_unbiased=unbiased))
    stack = Stack(models).to(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(copies, batch_size, 784, generator=g).to(device)
    y = torch.randint(10, (copies, batch_size), generator=g).to(device)
    return (stack, lambda: stack.call(lambda m, u, v: F.cross_entropy(m(u), v), x, y),
            hand, lambda: seed_nll(hand(x), y))


def bench(name: str, pair: Pair, updates: int, repeats: int,
          device: torch.device) -> dict[str, Any]:
    """Seconds per update both ways, round by round (one warm-up update each first)."""
    stacked, hand = _updates(*pair[:2], device), _updates(*pair[2:], device)
    stacked(1), hand(1)
    s_stack, s_hand = [], []
    for _ in range(repeats):
        s_stack.append(stacked(updates) / updates)
        s_hand.append(hand(updates) / updates)
    ratios = [a / b for a, b in zip(s_stack, s_hand, strict=True)]
    return {"case": name, "seconds_stack": s_stack, "seconds_hand": s_hand,
            "ratio_per_round": ratios, "ratio": statistics.median(ratios)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, or auto (cuda, then mps)")
    p.add_argument("--copies", type=int, default=5)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--note", default=None)
    p.add_argument("--out", default=str(RESULTS), help="folder for stack.json ('' to skip)")
    a = p.parse_args(argv)
    if min(a.copies, a.updates, a.repeats, a.threads) < 1:
        p.error("--copies, --updates, --repeats and --threads must be >= 1")
    try:
        device = resolve_device(a.device)
    except ValueError as e:
        p.error(f"--device: {e}")
    torch.set_num_threads(a.threads)
    n, k = a.updates, a.repeats
    results = [bench(f"mnist MLP, {norm}, batch {bs}", mlp_pair(norm, bs, a.copies, device),
                     n, k, device) for norm, bs in MLP_CASES]
    out = {"machine": machine_description(device, a.note),
           "config": {"copies": a.copies, "updates": a.updates, "repeats": a.repeats},
           "results": results}
    if a.out:
        path = Path(a.out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "stack.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in results:
        print(f"{r['case']:32s} Stack / hand-batched: {r['ratio']:.2f}")
    return out


if __name__ == "__main__":
    main()
