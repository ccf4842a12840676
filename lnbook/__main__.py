"""The command line: ``python -m lnbook list`` and ``python -m lnbook run NAME``.

    python -m lnbook list
    python -m lnbook run mnist --scale paper --device auto --out runs/

``run`` trains one experiment (a key of :data:`lnbook.experiments.EXPERIMENTS`) at the
``quick`` or ``paper`` scale. With ``--out`` it writes ``OUT/<NAME>.json``, keeps every finished
run in ``OUT/runs/`` and, at paper scale, checkpoints in ``OUT/checkpoints/``: run the same
command again after an interruption (Ctrl-C, a crash) and it goes on where it stopped. Ctrl-C
prints what is saved and the command that resumes, and exits with status 130; unknown names and
bad options exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Sequence

from lnbook.device import resolve_device
from lnbook.experiments import EXPERIMENTS, SCALES, Results, SweepInterrupted, load_experiment

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m lnbook``."""
    parser = argparse.ArgumentParser(
        prog="lnbook", description="Run the experiments of Layer Normalization (Ba et al., 2016)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{list,run}")
    sub.add_parser("list", help="list the experiments")
    run = sub.add_parser("run", help="run one experiment and save its results as JSON")
    run.add_argument("name", help="experiment name (see `python -m lnbook list`)")
    run.add_argument("--scale", choices=SCALES, default="quick", help="preset (default: quick)")
    run.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda or mps")
    run.add_argument("--out", default=None,
                     help="folder for NAME.json, finished runs and checkpoints (resumable)")
    run.add_argument("--seeds", type=int, nargs="+", default=None, help="override the seeds")
    run.add_argument("--workers", type=int, default=None,
                     help="train this many runs at once, one process each, on a CPU "
                          "(experiments whose config has `workers`; same results)")
    return parser


def _list() -> int:
    for name, module in EXPERIMENTS.items():
        print(f"{name:18s} {module.DESCRIPTION}")
    return 0


def _resume_command(args: argparse.Namespace) -> str:
    cmd = ["python", "-m", "lnbook", "run", args.name, "--scale", args.scale,
           "--device", args.device, "--out", args.out]
    if args.seeds:
        cmd += ["--seeds", *map(str, args.seeds)]
    if args.workers is not None:
        cmd += ["--workers", str(args.workers)]
    return shlex.join(cmd)


def _summary(results: Results) -> str:
    first = results.runs[0].history
    metrics = sorted(first.metrics[-1]) if first.metrics else []
    return str(results.table(metrics)) if metrics else f"{len(results.runs)} runs"


def _run(args: argparse.Namespace) -> int:
    if args.name not in EXPERIMENTS:
        print(f"lnbook: unknown experiment {args.name!r}; known: {', '.join(EXPERIMENTS)}",
              file=sys.stderr)
        return 2
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        print(f"lnbook: bad --device: {e}", file=sys.stderr)
        return 2
    module = load_experiment(args.name)
    overrides = {}
    if args.workers is not None:
        if "workers" not in {f.name for f in dataclasses.fields(module.Config)}:
            print(f"lnbook: {args.name} trains one run at a time (its config has no workers)",
                  file=sys.stderr)
            return 2
        if args.workers < 1:
            print(f"lnbook: --workers must be >= 1, got {args.workers}", file=sys.stderr)
            return 2
        overrides["workers"] = args.workers
    config = module.get_config(args.scale, **overrides)
    where = f", saving to {args.out}" if args.out else " (nothing saved: no --out)"
    print(f"running {args.name} at scale {args.scale} on {device}{where}", flush=True)
    try:
        results = module.run(config, device=device, out=args.out, seeds=args.seeds)
    except SweepInterrupted as stop:
        print(f"\nlnbook: {stop.describe()}", file=sys.stderr)
        if args.out is not None:
            print(f"resume with:\n  {_resume_command(args)}", file=sys.stderr)
        return 130
    print(_summary(results))
    if args.out is not None:
        print(f"results written to {args.out}/{module.NAME}.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 usage error, 130 interrupted)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad options, 0 on --help
        return int(e.code) if isinstance(e.code, int) else 2
    if args.command == "list":
        return _list()
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
