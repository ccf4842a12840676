"""What the benchmark scripts share: the machine's description, device sync, page faults, and
the options and output of the two norm benchmarks (:func:`norm_parser`, :func:`report`).

Timing on a CPU has one trap that has nothing to do with the arithmetic being timed: a fresh
tensor's memory has to be mapped in by the operating system, page by page, the first time it is
touched (a minor page fault, about a microsecond each on a virtual machine, several times the
cost of the arithmetic on that page). Whether a new tensor gets fresh pages or reuses memory its
process freed a moment ago is up to the C library's allocator and the heap's layout, so code
that makes more full-size tensors per call pays more, and unevenly from one call to the next.
The scripts leave the allocator as it is (what a user gets) and count the faults per call
beside each time (:func:`minor_faults`, from the standard library's :mod:`resource`), so that
a reader can see how much of a ratio is memory traffic.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

try:
    import resource
except ImportError:  # Windows has no resource module
    resource = None  # type: ignore[assignment]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else from :mod:`platform`."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The one-minute load average (runnable processes), or None where the OS does not say."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_description(device: torch.device, note: str | None = None) -> dict[str, object]:
    """CPU model, core count, torch version and threads, the accelerator, the load average at
    the time of the call, and a free-text ``note`` (e.g. "shared by other jobs")."""
    desc: dict[str, object] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "load_average_1min": load_average(),
        # OpenMP workers that sleep between parallel regions (the default) wake up late after
        # the gaps of a Python time loop; OMP_WAIT_POLICY=ACTIVE keeps them spinning
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
    }
    if device.type == "cuda":
        desc["gpu"] = torch.cuda.get_device_name(device)
    if note:
        desc["note"] = note
    return desc


def sync(device: torch.device) -> None:
    """Wait for the accelerator, so that a timer stops after the work, not after its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def minor_faults() -> int | None:
    """Minor page faults this process has taken so far (None where the OS does not say)."""
    if resource is None:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """``"4096x256,1024x1024"`` as ``((4096, 256), (1024, 1024))``: the ``--shapes`` option."""
    try:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shapes must look like 4096x256,1024x1024, got {text!r}"
        ) from None
    if any(len(s) != 2 or min(s) <= 0 for s in shapes):
        raise argparse.ArgumentTypeError(f"each shape must be ROWSxFEATURES > 0, got {text!r}")
    return shapes  # type: ignore[return-value]


def check_timing(cfg: Any) -> None:
    """``cfg.repeats`` and ``cfg.inner`` >= 1, ``cfg.warmup`` >= 0, ``cfg.dtype`` a float
    type's name; else ``ValueError``."""
    if cfg.repeats < 1 or cfg.inner < 1 or cfg.warmup < 0:
        raise ValueError(
            f"repeats and inner must be >= 1 and warmup >= 0, got {cfg.repeats}, {cfg.inner}, "
            f"{cfg.warmup}"
        )
    if cfg.dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float64, float16 or bfloat16, got {cfg.dtype!r}")


# where the chapters read them: inside the package (lnbook.resources.benchmark_results), so
# that the results ship with it and a chapter shows them outside the checkout too
RESULTS = Path(__file__).resolve().parents[1] / "lnbook" / "benchmark_results"


def norm_parser(description: str, default_shapes: tuple[tuple[int, int], ...], config: Any,
                file_name: str, note: str | None = None) -> argparse.ArgumentParser:
    """The options of a benchmark of norms over ``(rows, features)`` shapes: ``--device``,
    ``--shapes``, ``--repeats``, ``--inner``, ``--warmup`` (defaults from the ``config``
    dataclass), ``--dtype``, ``--threads``, ``--note`` and ``--out`` (a folder for
    ``file_name``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, else cpu), cpu, cuda")
    p.add_argument("--shapes", type=parse_shapes, default=default_shapes,
                   help="comma-separated ROWSxFEATURES, e.g. 4096x256,64x16384")
    p.add_argument("--repeats", type=int, default=config.repeats, help="interleaved rounds")
    p.add_argument("--inner", type=int, default=config.inner, help="calls per round")
    p.add_argument("--warmup", type=int, default=config.warmup, help="untimed rounds")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--note", default=note, help="a note on the machine, stored with the results")
    p.add_argument("--out", default=str(RESULTS),
                   help=f"folder for {file_name} ('' to skip writing)")
    return p


def parse_norm_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``, and set torch's CPU threads when ``--threads`` is given."""
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return args


def report(out: dict[str, Any], lines: list[str], folder: str, file_name: str) -> None:
    """Print the machine and ``lines`` (the table, the verdict), then write ``out`` as JSON
    to ``folder/file_name`` unless ``folder`` is empty."""
    print(json.dumps(out["machine"], indent=None))
    for line in lines:
        print(line)
    if folder:
        path = Path(folder) / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")
