"""What both benchmark scripts share: the machine's description, device sync, and the heap.

Timing on CPU has one trap that has nothing to do with the code being timed: glibc hands freed
memory back to the operating system once enough of it sits free at the top of the heap, and the
next large tensor then pays a page fault for every 4 KiB it touches (about 1 us each on the
virtual machine these figures come from, several times the cost of the arithmetic). Whether
that happens between two calls depends on the heap's layout, not on the code, so two runs of
the same benchmark can differ by 3x. :func:`steady_heap` turns the return off for the
benchmark's own process (``mallopt``), so that the ratios compare computation; the page faults
per call are counted either way (:func:`minor_faults`), and ``--heap glibc`` keeps glibc's
default behaviour.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


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


def machine_description(device: torch.device, heap: str) -> dict[str, object]:
    """CPU model, core count, torch version and threads, the heap mode and the accelerator."""
    desc: dict[str, object] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "heap": heap,
        # OpenMP workers that sleep between parallel regions (the default) wake up late after
        # the gaps of a Python time loop; OMP_WAIT_POLICY=ACTIVE keeps them spinning
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
    }
    if device.type == "cuda":
        desc["gpu"] = torch.cuda.get_device_name(device)
    return desc


def sync(device: torch.device) -> None:
    """Wait for the accelerator, so that a timer stops after the work, not after its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def steady_heap() -> bool:
    """Keep freed memory in this process's heap (glibc only); True if glibc accepted it.

    Sets the trim threshold to 1 GiB and the mmap threshold to glibc's maximum (32 MiB), so
    that freed tensors of the benchmarks' sizes are mostly reused from the heap instead of
    being returned to the OS and faulted in again (the faults that remain are counted). Other
    C libraries (macOS, Windows, musl) are left alone.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, 1 << 30)) and bool(mallopt(M_MMAP_THRESHOLD, 32 << 20))


def minor_faults() -> int | None:
    """Page faults this process has taken so far (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
