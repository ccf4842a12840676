"""Speed of lnbook.layer_norm against torch.nn.functional.layer_norm (forward + backward).

Chapter 3 (`03_layer_norm`) derives the backward pass that ``impl="autograd"`` runs; this script
measures what that hand-written autograd Function, a dozen separate torch operations, costs next
to torch's fused kernel, and checks that the fast path ``impl="torch"`` costs nothing extra. It
also times the opt-in route to speed that keeps code a reader can read: ``torch.compile`` of the
plain four-line layer norm below (:func:`taught_layer_norm`), and of ``lnbook.layer_norm``
itself with its hand-derived backward. All are timed in ONE run, interleaved round by round in
a rotating order (so that a busy machine slows all of them alike), after a warm-up that also
compiles; each figure is the median over rounds, each ratio the median of the per-round ratios.
Minor page faults per call are recorded beside the times (``benchmarks/common.py`` says why).

    python benchmarks/bench_layernorm.py                      # current device ("auto")
    python benchmarks/bench_layernorm.py --device cpu --threads 1 --note "shared machine"
    python benchmarks/bench_layernorm.py --impls torch,autograd,lnbook_torch   # no compiling

Targets (issue 13): autograd <= 3x torch, impl="torch" <= 1.1x torch; the compiled variants are
reported without a target. ``torch.compile`` needs a C++ compiler on the CPU; where it fails, the
result says so and the other columns stand. Results go to ``<out>/layernorm.json`` with a
description of the machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from common import (
    check_timing,
    load_average,
    machine_description,
    minor_faults,
    norm_parser,
    parse_norm_args,
    report,
    sync,
)

import lnbook

DEFAULT_SHAPES = ((4096, 256), (1024, 1024), (256, 4096), (64, 16384))
IMPLS = ("torch", "autograd", "lnbook_torch", "compiled_plain", "compiled_autograd")
RATIO_KEYS = {  # implementation -> its key in ratio_to_torch and targets
    "autograd": "autograd",
    "lnbook_torch": "torch",
    "compiled_plain": "compiled_plain",
    "compiled_autograd": "compiled_autograd",
}
TARGETS = {"autograd": 3.0, "torch": 1.1}


def taught_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5):
    """Eq. 3 over the last dimension in four lines of torch operations (autograd's backward)."""
    mu = x.mean(-1, keepdim=True)  # (rows, 1)
    var = (x - mu).pow(2).mean(-1, keepdim=True)  # (rows, 1) biased, as in eq. 3
    return (x - mu) / torch.sqrt(var + eps) * w + b  # (rows, features)


@dataclass
class BenchConfig:
    """What to measure: shapes (rows, features), implementations, rounds, calls per round."""

    shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES
    impls: tuple[str, ...] = IMPLS
    repeats: int = 60
    inner: int = 5
    warmup: int = 3
    dtype: str = "float32"
    device: str = "auto"
    seed: int = 0
    note: str = ""


@dataclass
class ShapeResult:
    """Median seconds per forward+backward for each implementation, and the ratios to torch."""

    rows: int
    features: int
    seconds: dict[str, float] = field(default_factory=dict)
    ratio_to_torch: dict[str, float] = field(default_factory=dict)
    page_faults_per_call: dict[str, float | None] = field(default_factory=dict)
    warmup_seconds: dict[str, float] = field(default_factory=dict)  # includes compiling
    unavailable: dict[str, str] = field(default_factory=dict)  # implementation -> why


def _forward_fns(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, impls: tuple[str, ...]
) -> dict[str, Callable[[], torch.Tensor]]:
    """One forward per implementation (fresh compiled functions: each shape compiles anew)."""
    d = x.shape[-1]
    fns: dict[str, Callable[[], torch.Tensor]] = {
        "torch": lambda: F.layer_norm(x, (d,), w, b, 1e-5),
        "autograd": lambda: lnbook.layer_norm(x, d, w, b, 1e-5, impl="autograd"),
        "lnbook_torch": lambda: lnbook.layer_norm(x, d, w, b, 1e-5, impl="torch"),
    }
    if "compiled_plain" in impls:
        plain = torch.compile(taught_layer_norm, fullgraph=True, dynamic=False)
        fns["compiled_plain"] = lambda: plain(x, w, b)
    if "compiled_autograd" in impls:
        ours = torch.compile(lnbook.layer_norm, fullgraph=True, dynamic=False)
        fns["compiled_autograd"] = lambda: ours(x, d, w, b, 1e-5)
    return {k: fns[k] for k in impls}


def bench_shape(rows: int, features: int, cfg: BenchConfig, device: torch.device) -> ShapeResult:
    """Time the implementations at one shape, interleaved round by round."""
    dtype = getattr(torch, cfg.dtype)
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(rows, features, generator=gen).to(device, dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(features, generator=gen)).to(device, dtype).requires_grad_()
    b = (0.1 * torch.randn(features, generator=gen)).to(device, dtype).requires_grad_()
    gy = torch.randn(rows, features, generator=gen).to(device, dtype)
    res = ShapeResult(rows, features)
    steps: dict[str, Callable[[], None]] = {}
    for name, fn in _forward_fns(x, w, b, cfg.impls).items():

        def step(fn: Callable[[], torch.Tensor] = fn) -> None:
            torch.autograd.grad(fn(), (x, w, b), gy)  # forward + backward for x, weight, bias

        t0 = time.perf_counter()
        try:
            for _ in range(max(cfg.warmup, 1)):
                step()
        except Exception as e:  # torch.compile without a working C++ compiler, for one
            if not name.startswith("compiled"):
                raise
            res.unavailable[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            continue
        sync(device)
        res.warmup_seconds[name] = time.perf_counter() - t0
        steps[name] = step
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    faults: dict[str, list[int]] = {name: [] for name in names}
    for r in range(cfg.repeats):
        k = r % len(names)
        order = names[k:] + names[:k]  # each one first in turn, and
        for name in order if r % 2 == 0 else order[::-1]:  # after each other one, both ways
            sync(device)
            f0, t0 = minor_faults(), time.perf_counter()
            for _ in range(cfg.inner):
                steps[name]()
            sync(device)
            times[name].append((time.perf_counter() - t0) / cfg.inner)
            if f0 is not None:
                faults[name].append(minor_faults() - f0)
    for name in names:
        res.seconds[name] = statistics.median(times[name])
        res.page_faults_per_call[name] = (
            statistics.median(faults[name]) / cfg.inner if faults[name] else None)
        if name != "torch":
            per_round = [a / t for a, t in zip(times[name], times["torch"], strict=True)]
            res.ratio_to_torch[RATIO_KEYS[name]] = statistics.median(per_round)
    return res


def run(cfg: BenchConfig) -> dict[str, object]:
    """Benchmark every shape of ``cfg``; return the JSON-serializable results."""
    check_timing(cfg)
    bad = [i for i in cfg.impls if i not in IMPLS]
    if bad or "torch" not in cfg.impls:
        raise ValueError(f"impls must include 'torch' and be drawn from {IMPLS}, got {cfg.impls}")
    device = lnbook.resolve_device(cfg.device)
    machine = machine_description(device, cfg.note or None)
    t0 = time.perf_counter()
    results = [bench_shape(r, f, cfg, device) for r, f in cfg.shapes]
    machine["load_average_1min_at_end"] = load_average()
    targets = {k: v for k, v in TARGETS.items() if k in results[0].ratio_to_torch}
    return {
        "benchmark": "layer_norm forward+backward, median seconds per call and ratio to torch",
        "machine": machine,
        "config": asdict(cfg),
        "wall_seconds": time.perf_counter() - t0,
        "taught_layer_norm": [
            "mu = x.mean(-1, keepdim=True)",
            "var = (x - mu).pow(2).mean(-1, keepdim=True)",
            "return (x - mu) / torch.sqrt(var + eps) * w + b",
        ],
        "targets": targets,
        "results": [asdict(r) for r in results],
        "meets_targets": {
            key: all(r.ratio_to_torch[key] <= limit for r in results)
            for key, limit in targets.items()
        },
    }


def format_table(out: dict[str, object]) -> str:
    """A plain-text table: one row per shape, torch's time in microseconds, the ratio of every
    other implementation to torch, and the page faults per call of each."""
    results: list[dict] = out["results"]  # type: ignore[assignment]
    keys = list(dict.fromkeys(k for r in results for k in r["ratio_to_torch"]))
    lines = [f"{'rows x features':>17} {'torch us':>10} " + " ".join(f"{k:>17}" for k in keys)
             + "   faults/call"]
    for r in results:
        q = r["ratio_to_torch"]
        ratios = " ".join(f"{q[k]:>17.2f}" if k in q else f"{'n/a':>17}" for k in keys)
        pf = ", ".join("?" if v is None else f"{v:.0f}" for v in r["page_faults_per_call"].values())
        lines.append(f"{r['rows']:>8} x {r['features']:<6} {r['seconds']['torch'] * 1e6:>10.1f} "
                     f"{ratios}   {pf}")
        for name, why in r["unavailable"].items():
            lines.append(f"{'':>19}{name} unavailable: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = norm_parser(__doc__.split("\n", 1)[0], DEFAULT_SHAPES, BenchConfig, "layernorm.json",
                    note="")
    p.add_argument("--impls", default=",".join(IMPLS),
                   help=f"comma-separated, from {', '.join(IMPLS)} ('torch' is the baseline)")
    args = parse_norm_args(p, argv)
    cfg = BenchConfig(shapes=args.shapes, impls=tuple(args.impls.split(",")),
                      repeats=args.repeats, inner=args.inner, warmup=args.warmup,
                      dtype=args.dtype, device=args.device, note=args.note)
    out = run(cfg)
    report(out, [format_table(out), "meets targets (autograd <= 3x, impl='torch' <= 1.1x): "
                 f"{out['meets_targets']}"], args.out, "layernorm.json")
    return out


if __name__ == "__main__":
    main()
