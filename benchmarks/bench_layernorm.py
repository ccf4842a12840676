"""Speed of lnbook.layer_norm against torch.nn.functional.layer_norm (forward + backward).

Chapter 3 (`03_layer_norm`) derives the backward pass that ``impl="autograd"`` runs; this script
measures what that hand-written autograd Function costs next to torch's fused kernel, and checks
that the documented fast path ``impl="torch"`` costs nothing extra. All three are timed in ONE run,
interleaved round by round in every order (so a busy machine slows all of them alike, and none
always runs after the same other), after a warm-up; each figure is the median over rounds, each
ratio the median of the per-round ratios. Page faults per call are recorded beside the times,
and by default the heap is kept steady (``benchmarks/common.py`` says why).

    python benchmarks/bench_layernorm.py                      # current device ("auto")
    python benchmarks/bench_layernorm.py --device cpu --repeats 30 --out benchmarks/results
    python benchmarks/bench_layernorm.py --heap glibc --out ''   # with glibc's page-fault luck

Targets (issue 2): autograd <= 3x torch, impl="torch" <= 1.1x torch. Results go to
``<out>/layernorm.json`` with a description of the machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from common import machine_description, minor_faults, steady_heap, sync

import lnbook

DEFAULT_SHAPES = ((4096, 256), (1024, 1024), (256, 4096), (64, 16384))
TARGETS = {"autograd": 3.0, "torch": 1.1}


@dataclass
class BenchConfig:
    """What to measure: shapes (rows, features), rounds, calls per round, dtype and device."""

    shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES
    repeats: int = 60
    inner: int = 5
    warmup: int = 3
    dtype: str = "float32"
    device: str = "auto"
    seed: int = 0
    heap: str = "steady"  # "steady": glibc keeps freed memory (benchmarks/common.py); "glibc"


@dataclass
class ShapeResult:
    """Median seconds per forward+backward for each implementation, and the ratios to torch."""

    rows: int
    features: int
    seconds: dict[str, float] = field(default_factory=dict)
    ratio_to_torch: dict[str, float] = field(default_factory=dict)
    page_faults_per_call: dict[str, float | None] = field(default_factory=dict)


def _step_fns(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, gy: torch.Tensor
) -> dict[str, Callable[[], None]]:
    """One forward + backward (gradients for x, weight and bias) per implementation."""
    d = x.shape[-1]

    def make(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            y = fn()  # (rows, features)
            torch.autograd.grad(y, (x, w, b), gy)

        return step

    return {
        "torch": make(lambda: F.layer_norm(x, (d,), w, b, 1e-5)),
        "autograd": make(lambda: lnbook.layer_norm(x, d, w, b, 1e-5, impl="autograd")),
        "lnbook_torch": make(lambda: lnbook.layer_norm(x, d, w, b, 1e-5, impl="torch")),
    }


def bench_shape(rows: int, features: int, cfg: BenchConfig, device: torch.device) -> ShapeResult:
    """Time the three implementations at one shape, interleaved round by round."""
    dtype = getattr(torch, cfg.dtype)
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(rows, features, generator=gen).to(device, dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(features, generator=gen)).to(device, dtype).requires_grad_()
    b = (0.1 * torch.randn(features, generator=gen)).to(device, dtype).requires_grad_()
    gy = torch.randn(rows, features, generator=gen).to(device, dtype)
    fns = _step_fns(x, w, b, gy)
    names = list(fns)
    for _ in range(cfg.warmup):
        for name in names:
            fns[name]()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    faults: dict[str, list[int]] = {name: [] for name in names}
    orders = list(itertools.permutations(names))  # each one runs after each other equally often
    for r in range(cfg.repeats):
        for name in orders[r % len(orders)]:
            sync(device)
            f0, t0 = minor_faults(), time.perf_counter()
            for _ in range(cfg.inner):
                fns[name]()
            sync(device)
            times[name].append((time.perf_counter() - t0) / cfg.inner)
            if f0 is not None:
                faults[name].append(minor_faults() - f0)
    res = ShapeResult(rows, features)
    for name in names:
        res.seconds[name] = statistics.median(times[name])
        res.page_faults_per_call[name] = (
            statistics.median(faults[name]) / cfg.inner if faults[name] else None)
    for name, key in (("autograd", "autograd"), ("lnbook_torch", "torch")):
        per_round = [a / t for a, t in zip(times[name], times["torch"], strict=True)]
        res.ratio_to_torch[key] = statistics.median(per_round)
    return res


def run(cfg: BenchConfig) -> dict[str, object]:
    """Benchmark every shape of ``cfg``; return the JSON-serializable results."""
    if cfg.repeats < 1 or cfg.inner < 1 or cfg.warmup < 0:
        raise ValueError(
            f"repeats and inner must be >= 1 and warmup >= 0, got {cfg.repeats}, {cfg.inner}, "
            f"{cfg.warmup}"
        )
    if cfg.dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float64, float16 or bfloat16, got {cfg.dtype!r}")
    if cfg.heap not in ("steady", "glibc"):
        raise ValueError(f"heap must be 'steady' or 'glibc', got {cfg.heap!r}")
    heap = "glibc default"
    if cfg.heap == "steady":
        heap = "steady (freed memory kept)" if steady_heap() else "default (no glibc)"
    device = lnbook.resolve_device(cfg.device)
    results = [bench_shape(r, f, cfg, device) for r, f in cfg.shapes]
    return {
        "benchmark": "layer_norm forward+backward, median seconds per call and ratio to torch",
        "machine": machine_description(device, heap),
        "config": asdict(cfg),
        "targets": TARGETS,
        "results": [asdict(r) for r in results],
        "meets_targets": {
            key: all(r.ratio_to_torch[key] <= limit for r in results)
            for key, limit in TARGETS.items()
        },
    }


def format_table(out: dict[str, object]) -> str:
    """A plain-text table: one row per shape, times in microseconds, ratios to torch, and the
    page faults per call of torch and of the autograd path."""
    lines = [
        f"{'rows x features':>17} {'torch us':>10} {'autograd us':>12} {'ratio':>6} "
        f"{'impl=torch us':>14} {'ratio':>6} {'faults/call torch, autograd':>28}"
    ]
    for r in out["results"]:  # type: ignore[union-attr]
        s, q, pf = r["seconds"], r["ratio_to_torch"], r["page_faults_per_call"]
        faults = "?" if pf["torch"] is None else f"{pf['torch']:.0f}, {pf['autograd']:.0f}"
        lines.append(
            f"{r['rows']:>8} x {r['features']:<6} {s['torch'] * 1e6:>10.1f} "
            f"{s['autograd'] * 1e6:>12.1f} {q['autograd']:>6.2f} "
            f"{s['lnbook_torch'] * 1e6:>14.1f} {q['torch']:>6.2f} {faults:>28}"
        )
    return "\n".join(lines)


def _parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shapes must look like 4096x256,1024x1024, got {text!r}"
        ) from None
    if any(len(s) != 2 or min(s) <= 0 for s in shapes):
        raise argparse.ArgumentTypeError(f"each shape must be ROWSxFEATURES > 0, got {text!r}")
    return shapes  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, else cpu), cpu, cuda")
    p.add_argument("--shapes", type=_parse_shapes, default=DEFAULT_SHAPES,
                   help="comma-separated ROWSxFEATURES, e.g. 4096x256,64x16384")
    p.add_argument("--repeats", type=int, default=BenchConfig.repeats, help="interleaved rounds")
    p.add_argument("--inner", type=int, default=BenchConfig.inner, help="calls per round")
    p.add_argument("--warmup", type=int, default=BenchConfig.warmup, help="untimed rounds")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--heap", choices=("steady", "glibc"), default="steady",
                   help="steady: keep freed memory in the heap (see benchmarks/common.py)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"),
                   help="folder for layernorm.json ('' to skip writing)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cfg = BenchConfig(shapes=args.shapes, repeats=args.repeats, inner=args.inner,
                      warmup=args.warmup, dtype=args.dtype, device=args.device,
                      heap=args.heap)
    out = run(cfg)
    print(json.dumps(out["machine"], indent=None))
    print(format_table(out))
    print("meets targets (autograd <= 3x, impl='torch' <= 1.1x):", out["meets_targets"])
    if args.out:
        path = Path(args.out) / "layernorm.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
