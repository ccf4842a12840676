"""Every experiment's paper-scale preset on one device: does it build and step, how big is it,
and how long does an update take?

For each registered experiment this script runs, in a process of its own, what a user runs:
``python -m lnbook run NAME --scale paper --device D --max-updates K`` (a smoke run: every
model at its full size, each training loop cut to ``K`` updates), and stores its exit status,
the smoke run's own line (training loops, parameters, seconds per update with the first,
warm-up update left out, the process's peak resident memory), the accelerator's peak memory
and the process's wall seconds, start-up and data included. ``--full NAME`` then runs one
preset to the end (no cap) and stores its wall seconds: the time a reader waits for it.

    python benchmarks/paper_scale.py --device cuda --max-updates 10
    python benchmarks/paper_scale.py --device cuda --only why,mnist --full why

Results go to ``<out>/paper_scale-<device type>.json`` (default: the current folder; ``--out ''``:
print only; the book's performance page shows one GPU's, stored as
``lnbook/benchmark_results/h200/paper_scale.json``), written
again after every experiment, so that a run stopped by a time limit keeps what it measured;
``--budget S`` starts no experiment after ``S`` seconds (those left are stored as not run).
``updates_bound`` is ``loops x steps``, the preset's updates if every loop runs the preset's
``steps`` (an upper bound where some loops are shorter, such as a fine-tuning stage).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import machine_description

from lnbook import resolve_device
from lnbook.experiments import EXPERIMENTS, load_experiment

SMOKE = re.compile(r"smoke run of (\d+) updates: (\d+) loops, up to ([\d,]+) parameters, "
                   r"([\d.e+-]+) s per update, peak memory ([\d,]+) MiB")
CHILD = "--child"  # this script, run as one experiment's process
ACCELERATOR_PEAK = "accelerator peak memory MiB:"


def child(argv: list[str]) -> int:
    """Run ``python -m lnbook`` with ``argv`` in this process, then print the accelerator's
    peak memory (the smoke line reports the process's resident memory only)."""
    import lnbook.__main__ as cli

    status = cli.main(argv)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        print(f"{ACCELERATOR_PEAK} {torch.cuda.max_memory_allocated() / 2**20:.0f}")
    return status


def _process(argv: list[str], timeout: float) -> tuple[int | None, str, str, float]:
    """Exit status (None: stopped at ``timeout``), stdout, stderr, wall seconds."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, CHILD, *argv], capture_output=True,
                              text=True, timeout=timeout)
        status, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        status = None
        out, err = (t.decode() if isinstance(t, bytes) else (t or "") for t in (e.stdout,
                                                                               e.stderr))
    return status, out, err, time.perf_counter() - start


def smoke(name: str, device: str, updates: int, timeout: float) -> dict[str, Any]:
    """One experiment's smoke run at paper scale, as stored."""
    cfg = load_experiment(name).get_config("paper")
    status, out, err, seconds = _process(["run", name, "--scale", "paper", "--device", device,
                                          "--max-updates", str(updates)], timeout)
    row: dict[str, Any] = {"experiment": name, "exit_status": status,
                           "wall_seconds": round(seconds, 1), "steps": cfg.steps}
    m = SMOKE.search(out)
    if m:
        loops = int(m.group(2))
        row.update(loops=loops, parameters=int(m.group(3).replace(",", "")),
                   seconds_per_update=float(m.group(4)),
                   peak_resident_mib=int(m.group(5).replace(",", "")),
                   updates_bound=loops * cfg.steps)
    peak = re.search(rf"{ACCELERATOR_PEAK} (\d+)", out)
    if peak:
        row["peak_accelerator_mib"] = int(peak.group(1))
    if status != 0 or not m:
        row["error"] = _error(status, err, timeout)
    return row


def _error(status: int | None, err: str, timeout: float) -> str:
    """Why a process did not do its work: stopped at the timeout, or its last stderr line."""
    if status is None:
        return f"stopped after --timeout {timeout:g} s"
    return (err.strip().splitlines() or ["(no message)"])[-1][:300]


def full(name: str, device: str, out: str, timeout: float) -> dict[str, Any]:
    """One preset run to the end, its runs saved in ``out``."""
    status, stdout, err, seconds = _process(["run", name, "--scale", "paper", "--device",
                                             device, "--out", out], timeout)
    row = {"experiment": name, "exit_status": status, "wall_seconds": round(seconds, 1),
           "table": stdout.strip().splitlines()[-12:]}
    if status != 0:
        row["error"] = _error(status, err, timeout)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda, then mps)")
    p.add_argument("--max-updates", type=int, default=10, help="updates per training loop")
    p.add_argument("--only", default="", help="comma-separated experiments (default: all)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per experiment")
    p.add_argument("--budget", type=float, default=None, help="start none after S seconds")
    p.add_argument("--full", default="", help="an experiment to run to the end afterwards")
    p.add_argument("--runs", default="paper-runs", help="--out folder of the --full run")
    p.add_argument("--note", default=None)
    p.add_argument("--out", default=".", help="folder for the JSON ('' to skip)")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(EXPERIMENTS)
    unknown = [n for n in [*names, *([a.full] if a.full else [])] if n not in EXPERIMENTS]
    if unknown:
        p.error(f"unknown experiments {unknown}; known: {', '.join(EXPERIMENTS)}")
    if a.max_updates < 2:
        p.error("--max-updates must be >= 2 (the first update warms up and is not timed)")
    try:
        device = resolve_device(a.device)
    except ValueError as e:
        p.error(f"--device: {e}")
    record: dict[str, Any] = {
        "machine": machine_description(device, a.note),
        "config": {"max_updates": a.max_updates, "timeout": a.timeout, "budget": a.budget},
        "results": [], "full": None}
    path = Path(a.out) / f"paper_scale-{device.type}.json" if a.out else None

    def save() -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1) + "\n")

    start = time.perf_counter()
    for name in names:
        if a.budget is not None and time.perf_counter() - start >= a.budget:
            record["results"].append({"experiment": name, "exit_status": None,
                                      "error": "not run: --budget spent"})
            continue
        row = smoke(name, str(device), a.max_updates, a.timeout)
        record["results"].append(row)
        save()
        per = row.get("seconds_per_update")
        print(f"{name:20s} exit {row['exit_status']}, {row['wall_seconds']:6.1f} s, "
              + (f"{row['parameters']:,} parameters, {per:.3g} s per update"
                 if per is not None else row.get("error", "")), flush=True)
    if a.full:
        record["full"] = full(a.full, str(device), a.runs, a.timeout)
        print(f"{a.full} at paper scale, to the end: exit {record['full']['exit_status']}, "
              f"{record['full']['wall_seconds']:.1f} s", flush=True)
    save()
    if path is not None:
        print(f"wrote {path}")
    return record


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        sys.exit(child(sys.argv[2:]))
    main()
