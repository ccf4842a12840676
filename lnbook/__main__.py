"""The command line: ``python -m lnbook list`` and ``python -m lnbook run NAME``.

    python -m lnbook list
    python -m lnbook run mnist --scale quick --device auto --out results/

``run`` trains one experiment of section 6 (a key of :data:`lnbook.experiments.EXPERIMENTS`) at
the ``quick`` or ``paper`` scale and writes ``OUT/<NAME>.json`` (plus checkpoints at paper scale,
from which an interrupted run resumes). Unknown names and bad options exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lnbook.experiments import EXPERIMENTS, SCALES, load_experiment

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
    run.add_argument("--out", default=None, help="folder for NAME.json and checkpoints")
    run.add_argument("--seeds", type=int, nargs="+", default=None, help="override the seeds")
    return parser


def _list() -> int:
    for name in EXPERIMENTS:
        try:
            description = load_experiment(name).DESCRIPTION
        except Exception as e:  # a module still being written must not hide the others
            description = f"(cannot import: {type(e).__name__}: {e})"
        print(f"{name:16s} {description}")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.name not in EXPERIMENTS:
        known = ", ".join(EXPERIMENTS)
        print(f"lnbook: unknown experiment {args.name!r}; known: {known}", file=sys.stderr)
        return 2
    try:
        from lnbook.device import resolve_device

        device = resolve_device(args.device)
    except ValueError as e:
        print(f"lnbook: bad --device: {e}", file=sys.stderr)
        return 2
    module = load_experiment(args.name)
    config = module.get_config(args.scale)
    print(f"running {args.name} at scale {args.scale} on {device}", flush=True)
    results = module.run(config, device=device, out=args.out, seeds=args.seeds)
    for key, value in results.get("final", {}).items():
        print(f"{key}: {value}")
    if args.out is not None:
        print(f"results written to {args.out}/{module.NAME}.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 usage error)."""
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
