"""Speed of RMSNorm against layer norm (forward + backward), lnbook's and torch's (claim P02).

Zhang and Sennrich (2019) report that dropping the mean cuts running time (7% to 64% across
their models). This script measures what the saving is for the normalization alone, on this
machine: ``lnbook.rms_norm`` against ``lnbook.layer_norm`` (lnbook's own code: plain torch
operations for RMSNorm, the hand-derived autograd Function of chapter 3 for layer norm) and
``torch.nn.functional.rms_norm`` against ``torch.nn.functional.layer_norm`` (torch's kernels).
Each layer norm has a gain and a bias, each RMSNorm a gain only, as the two are used.

All four are timed in ONE run, interleaved round by round in every order (a busy machine slows
all of them alike, and none always runs after the same other), after a warm-up; each figure is
the median over rounds, each ratio the median of the per-round ratios. The allocator is left as
a user gets it (see benchmarks/common.py on page faults).

    python benchmarks/bench_rmsnorm.py                        # current device ("auto")
    python benchmarks/bench_rmsnorm.py --device cpu --repeats 30 --threads 1
    python benchmarks/bench_rmsnorm.py --out ''               # print only

Results go to ``<out>/rmsnorm.json`` with a description of the machine. A ratio below 1 means
RMSNorm is faster; ``saving`` is ``1 - ratio``.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import common
import torch
import torch.nn.functional as F

import lnbook

DEFAULT_SHAPES = ((1024, 64), (4096, 256), (1024, 1024), (256, 4096), (64, 16384))
NAMES = ("lnbook_rms", "lnbook_ln", "torch_rms", "torch_ln")


@dataclass
class BenchConfig:
    """What to measure: shapes (rows, features), rounds, calls per round, dtype and device."""

    shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES
    repeats: int = 40
    inner: int = 5
    warmup: int = 3
    dtype: str = "float32"
    device: str = "auto"
    seed: int = 0
    note: str | None = None  # free text stored with the machine description


@dataclass
class ShapeResult:
    """Median seconds per forward+backward of each implementation, and the RMS / LN ratios."""

    rows: int
    features: int
    seconds: dict[str, float] = field(default_factory=dict)
    ratio_rms_to_ln: dict[str, float] = field(default_factory=dict)
    saving: dict[str, float] = field(default_factory=dict)
    ratio_lnbook_rms_to_torch_rms: float = 0.0


def _step_fns(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, gy: torch.Tensor
) -> dict[str, Callable[[], None]]:
    """One forward + backward per implementation (gradients for x and the parameters)."""
    d = x.shape[-1]

    def make(fn: Callable[[], torch.Tensor], wrt: tuple[torch.Tensor, ...]) -> Callable[[], None]:
        def step() -> None:
            torch.autograd.grad(fn(), wrt, gy)  # (rows, features) output

        return step

    return {
        "lnbook_rms": make(lambda: lnbook.rms_norm(x, d, w, 1e-5), (x, w)),
        "lnbook_ln": make(lambda: lnbook.layer_norm(x, d, w, b, 1e-5), (x, w, b)),
        "torch_rms": make(lambda: F.rms_norm(x, (d,), w, 1e-5), (x, w)),
        "torch_ln": make(lambda: F.layer_norm(x, (d,), w, b, 1e-5), (x, w, b)),
    }


def bench_shape(rows: int, features: int, cfg: BenchConfig, device: torch.device) -> ShapeResult:
    """Time the four implementations at one shape, interleaved round by round."""
    dtype = getattr(torch, cfg.dtype)
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(rows, features, generator=gen).to(device, dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(features, generator=gen)).to(device, dtype).requires_grad_()
    b = (0.1 * torch.randn(features, generator=gen)).to(device, dtype).requires_grad_()
    gy = torch.randn(rows, features, generator=gen).to(device, dtype)
    fns = _step_fns(x, w, b, gy)
    for _ in range(cfg.warmup):
        for name in NAMES:
            fns[name]()
    common.sync(device)
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    orders = list(itertools.permutations(NAMES))  # each runs after each other equally often
    for r in range(cfg.repeats):
        for name in orders[r % len(orders)]:
            common.sync(device)
            t0 = time.perf_counter()
            for _ in range(cfg.inner):
                fns[name]()
            common.sync(device)
            times[name].append((time.perf_counter() - t0) / cfg.inner)
    res = ShapeResult(rows, features)
    for name in NAMES:
        res.seconds[name] = statistics.median(times[name])

    def ratio(a: str, c: str) -> float:
        return statistics.median(p / q for p, q in zip(times[a], times[c], strict=True))

    res.ratio_rms_to_ln["lnbook"] = ratio("lnbook_rms", "lnbook_ln")
    res.ratio_rms_to_ln["torch"] = ratio("torch_rms", "torch_ln")
    res.saving = {k: 1.0 - v for k, v in res.ratio_rms_to_ln.items()}
    res.ratio_lnbook_rms_to_torch_rms = ratio("lnbook_rms", "torch_rms")
    return res


def run(cfg: BenchConfig) -> dict[str, object]:
    """Benchmark every shape of ``cfg``; return the JSON-serializable results."""
    common.check_timing(cfg)
    device = lnbook.resolve_device(cfg.device)
    results = [bench_shape(r, f, cfg, device) for r, f in cfg.shapes]
    return {
        "benchmark": "rms_norm vs layer_norm forward+backward, median seconds per call, ratios "
                     "RMSNorm / LayerNorm measured in one interleaved run",
        "machine": common.machine_description(device, cfg.note),
        "config": asdict(cfg),
        "results": [asdict(r) for r in results],
        "median_ratio_rms_to_ln": {
            k: statistics.median(r.ratio_rms_to_ln[k] for r in results)
            for k in ("lnbook", "torch")
        },
    }


def format_table(out: dict[str, object]) -> str:
    """A plain-text table: one row per shape, times in microseconds, ratios RMS / LN."""
    lines = [
        f"{'rows x features':>17} {'lnbook rms':>11} {'lnbook ln':>10} {'ratio':>6} "
        f"{'torch rms':>10} {'torch ln':>9} {'ratio':>6} {'lnbook/torch rms':>17}"
    ]
    for r in out["results"]:  # type: ignore[union-attr]
        s, q = r["seconds"], r["ratio_rms_to_ln"]
        lines.append(
            f"{r['rows']:>8} x {r['features']:<6} {s['lnbook_rms'] * 1e6:>11.1f} "
            f"{s['lnbook_ln'] * 1e6:>10.1f} {q['lnbook']:>6.2f} {s['torch_rms'] * 1e6:>10.1f} "
            f"{s['torch_ln'] * 1e6:>9.1f} {q['torch']:>6.2f} "
            f"{r['ratio_lnbook_rms_to_torch_rms']:>17.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = common.norm_parser(__doc__.split("\n", 1)[0], DEFAULT_SHAPES, BenchConfig,
                           "rmsnorm.json")
    args = common.parse_norm_args(p, argv)
    cfg = BenchConfig(shapes=args.shapes, repeats=args.repeats, inner=args.inner,
                      warmup=args.warmup, dtype=args.dtype, device=args.device, note=args.note)
    out = run(cfg)
    common.report(out, [format_table(out), "median ratio RMSNorm / LayerNorm: "
                        f"{out['median_ratio_rms_to_ln']}"], args.out, "rmsnorm.json")
    return out


if __name__ == "__main__":
    main()
