"""Every registered experiment keeps the command line's promises, met as a user meets them
(issue 34): a real `python -m lnbook run` process, its exit status and messages, the files
in --out. Runs are smoke runs (`--max-updates`), so that the registry fits in a few minutes.

- Ctrl-C (here after the first update, through the engine's test hook) exits 130, says what
  was saved and prints the command that resumes; that command finishes (exit 0) with the
  numbers of an uninterrupted run; run again, it retrains nothing ("finished earlier");
- an uninterrupted run goes into a folder that other experiments' results share;
- `--seeds 0 0` is refused in one line (exit 2);
- every paper-scale preset builds and takes two updates on the CPU, printing its parameters,
  seconds per update and peak memory (`test_paper_scale_smoke`, set `LNBOOK_PAPER_SMOKE=1`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lnbook.__main__ as cli
from lnbook.engine.runner import INTERRUPT_ENV
from lnbook.experiments import EXPERIMENTS

CAP = "2"  # updates per training loop in every run of this file
TIMEOUT = 300  # seconds one process may take (a smoke run takes a few)
# a paper-scale preset's two updates on the CPU: sphere's 24-block, width-512 models, five seeds
# stacked (378 million parameters), took 307 s and 14 GiB on 2 cores
PAPER_TIMEOUT = 1200
_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1"}  # one thread, as the tests in-process


@pytest.fixture(scope="module")
def shared_out(tmp_path_factory) -> Path:
    """One --out for every experiment of the registry."""
    return tmp_path_factory.mktemp("shared")


def _numbers(path: Path) -> list[tuple]:
    """What a run learned, from a results file: no times."""
    def untimed(d: dict) -> dict:
        return {k: v for k, v in d.items()
                if not any(w in k for w in ("time", "second", "sec_per"))}

    results = json.loads(path.read_text())
    return [(r["variant"], r["seed"], r["history"]["steps"], r["history"]["losses"],
             r["history"]["eval_steps"], r["history"]["metrics"], untimed(r["info"]))
            for r in results["runs"]]


def _written(stdout: str) -> Path:
    found = re.findall(r"^results written to (.+)$", stdout, re.M)
    assert len(found) == 1, stdout
    return Path(found[0])


def _files(folder: Path) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.glob("runs/**/*.json")}


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_the_contract(name, tmp_path, shared_out, capsys):
    out = tmp_path / "out"
    assert cli.main(["run", name, "--seeds", "0", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "lnbook: --seeds must differ: 0 given more than once\n", err

    cmd = [sys.executable, "-m", "lnbook", "run", name, "--device", "cpu", "--out", str(out),
           "--max-updates", CAP]
    stopped = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                             env={**_ENV, INTERRUPT_ENV: "1"})
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and f"saved under {out}" in stopped.stderr
    resume = shlex.split(stopped.stderr.split("resume with:\n", 1)[1].splitlines()[0])
    assert resume[:4] == [sys.executable, "-m", "lnbook", "run"], resume

    assert cli.main(resume[3:]) == 0  # the resume command, as printed
    resumed = _numbers(_written(capsys.readouterr().out))
    trained = _files(out)
    assert len(trained) == len(resumed)  # one file per run

    assert cli.main(resume[3:]) == 0  # again: nothing to train
    again = capsys.readouterr()
    assert again.err.count("finished earlier") == len(resumed), again.err
    assert _files(out) == trained  # no run file written again
    assert _numbers(_written(again.out)) == resumed

    others = list(shared_out.glob("*.json"))  # other experiments' results, if any ran before
    argv = ["run", name, "--device", "cpu", "--out", str(shared_out), "--max-updates", CAP]
    assert cli.main(argv) == 0
    alone = _written(capsys.readouterr().out)
    assert _numbers(alone) == resumed  # the interrupted and resumed run learned the same
    assert alone.name.startswith(f"{name}-") and alone not in others
    assert all(p.exists() for p in others)


_SMOKE = re.compile(r"smoke run of \d+ updates: .*")


@pytest.mark.skipif(not os.environ.get("LNBOOK_PAPER_SMOKE"),
                    reason="builds every paper-scale model (minutes): set LNBOOK_PAPER_SMOKE=1")
@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_paper_scale_smoke(name, tmp_path):
    """The paper-scale preset builds and takes two updates on the CPU."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lnbook", "run", name, "--scale", "paper",
                           "--device", "cpu", "--max-updates", "2"], capture_output=True,
                          text=True, timeout=PAPER_TIMEOUT, env=_ENV)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    line = _SMOKE.search(done.stdout)
    assert line, done.stdout[-2000:]
    print(f"{name} at paper scale: {line.group(0)}; {seconds:.0f} s in all")
