"""Seeds trained together against seeds trained one at a time (chapter 6.8's deep MLP).

Chapter 6.8 trains its ten seeds as one batched network (:class:`lnbook.batched.SeedMLP`,
weights ``(S, in, out)``) instead of one network per seed. This script measures what that
buys: in each round it trains the same ``S`` seeds of one variant both ways, with the same
updates (``lnbook.experiments.why.run`` once per seed, and once for all of them together),
and reports the median over the rounds of the per-round ratio ``one at a time / together``
(a ratio measured in one run, so that a shared machine's load cancels as far as it can).

    python benchmarks/bench_seeds.py --seeds 10 --steps 60 --repeats 3
    python benchmarks/bench_seeds.py --device cuda --out ''   # on a GPU, print only
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, machine_description

from lnbook import resolve_device
from lnbook.experiments import why


def bench(seeds: int, steps: int, repeats: int, variant: str = "layer",
          device: str = "cpu") -> dict[str, Any]:
    """Seconds per round both ways and their ratios; every run makes ``steps`` updates."""
    cfg = why.get_config("quick", steps=steps, eval_every=steps, seeds=tuple(range(seeds)),
                         variants=(variant,), threads=None)
    alone, together = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for s in cfg.seeds:
            why.run(why.get_config(**{**vars(cfg), "seeds": (s,)}), device=device)
        alone.append(time.perf_counter() - t)
        t = time.perf_counter()
        why.run(cfg, device=device)
        together.append(time.perf_counter() - t)
    ratios = [a / b for a, b in zip(alone, together, strict=True)]
    return {"variant": variant, "seeds": seeds, "steps": steps,
            "seconds_one_at_a_time": alone, "seconds_together": together,
            "ratio_per_round": ratios, "speedup": statistics.median(ratios)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, or auto (cuda, then mps)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variant", default="layer", choices=why.VARIANTS)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--note", default=None)
    p.add_argument("--out", default=str(RESULTS), help="folder for seeds.json ('' to skip)")
    a = p.parse_args(argv)
    if a.seeds < 1 or a.steps < 1 or a.repeats < 1:
        p.error("--seeds, --steps and --repeats must be >= 1")
    try:
        device = resolve_device(a.device)
    except ValueError as e:
        p.error(f"--device: {e}")
    torch.set_num_threads(a.threads)
    out = {"machine": machine_description(device, a.note),
           "results": [bench(a.seeds, a.steps, a.repeats, a.variant, str(device))]}
    if a.out:
        path = Path(a.out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "seeds.json").write_text(json.dumps(out, indent=1) + "\n")
    r = out["results"][0]
    print(f"{r['seeds']} seeds x {r['steps']} updates ({r['variant']}): together is "
          f"{r['speedup']:.2f}x faster than one at a time")
    return out


if __name__ == "__main__":
    main()
