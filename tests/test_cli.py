"""The command line `python -m lnbook list|run`: exit codes, messages, results on disk."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import types

import pytest

import lnbook.__main__ as cli
from lnbook.experiments import (
    EXPERIMENTS,
    Results,
    Run,
    SweepInterrupted,
    draw,
    load_experiment,
    save_results,
)
from lnbook.train import History


def test_list_names_every_experiment(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in EXPERIMENTS:
        assert out.count(f"{name} ") >= 1
    assert "permutation-invariant MNIST" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "no-such-experiment"], "unknown experiment 'no-such-experiment'"),
        (["run", "mnist", "--scale", "huge"], "invalid choice: 'huge'"),
        (["run", "mnist", "--device", "tpu"], "bad --device"),
        (["run", "mnist", "--seeds", "one"], "invalid int value"),
        (["run"], "the following arguments are required: name"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def _fake_experiment(tmp_path, seen, interrupt=False):
    def get_config(scale="quick", **overrides):
        return {"scale": scale}

    def run(config, device="auto", out=None, seeds=None):
        seen.update(config=config, device=str(device), seeds=seeds)
        if interrupt:
            raise SweepInterrupted(["a seed 3"], [("a seed 4", 40, 100)], tmp_path)
        hist = History(steps=[1], losses=[0.5], eval_steps=[0, 1],
                       metrics=[{"acc": 0.1}, {"acc": 1.0}])
        results = Results("tiny", config, str(device), [Run("a", 3, hist)])
        save_results(results, tmp_path / "tiny.json")
        return results

    return types.SimpleNamespace(NAME="tiny", DESCRIPTION="a fake", get_config=get_config,
                                 run=run)


def test_run_writes_results(tmp_path, monkeypatch, capsys):
    seen = {}
    monkeypatch.setitem(EXPERIMENTS, "tiny", _fake_experiment(tmp_path, seen))
    argv = ["run", "tiny", "--scale", "paper", "--device", "cpu", "--out", str(tmp_path),
            "--seeds", "3", "4"]
    assert cli.main(argv) == 0
    assert seen == {"config": {"scale": "paper"}, "device": "cpu", "seeds": [3, 4]}
    out = capsys.readouterr().out
    assert "acc (final)" in out and "1.000" in out and "results written to" in out
    assert json.loads((tmp_path / "tiny.json").read_text())["name"] == "tiny"


def test_interrupt_says_what_is_saved_and_how_to_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(EXPERIMENTS, "tiny", _fake_experiment(tmp_path, {}, interrupt=True))
    argv = ["run", "tiny", "--scale", "paper", "--out", str(tmp_path)]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "a seed 3: finished" in err and "a seed 4: checkpoint at update 40 of 100" in err
    assert f"python -m lnbook run tiny --scale paper --device auto --out {tmp_path}" in err


def test_workers_reach_the_config_and_the_resume_command(tmp_path, monkeypatch, capsys):
    seen = {}

    def run(config, device="auto", out=None, seeds=None):
        seen["config"] = config
        raise SweepInterrupted([], [], tmp_path)

    fake = types.SimpleNamespace(NAME="draw", Config=draw.Config, get_config=draw.get_config,
                                 run=run)
    real = cli.load_experiment
    monkeypatch.setattr(cli, "load_experiment", lambda n: fake if n == "draw" else real(n))
    assert cli.main(["run", "draw", "--out", str(tmp_path), "--workers", "2"]) == 130
    assert seen["config"].workers == 2
    assert "--workers 2" in capsys.readouterr().err
    assert cli.main(["run", "draw", "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err
    assert cli.main(["run", "mnist", "--workers", "2"]) == 2  # mnist trains one at a time
    assert "has no workers" in capsys.readouterr().err


def test_registry_loads_and_rejects():
    for name in ("mnist", "convnet"):
        module = load_experiment(name)
        assert module.NAME == name and module.DESCRIPTION
        assert module.get_config("quick").scale == "quick"
    with pytest.raises(KeyError, match="known experiments"):
        load_experiment("nope")


def test_python_dash_m_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "lnbook", "list"], capture_output=True, text=True)
    assert ok.returncode == 0 and "mnist" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "lnbook", "run", "nope"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown experiment" in bad.stderr


def test_ctrl_c_in_a_real_run_exits_130_and_the_rerun_resumes(tmp_path):
    """As a user meets it: Ctrl-C during `python -m lnbook run`, then the same command again."""
    cmd = [sys.executable, "-m", "lnbook", "run", "mnist", "--device", "cpu", "--out",
           str(tmp_path), "--seeds", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "runs").glob("*.json")):  # wait for the first finished run
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no run finished in 600 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "none/bs128 seed 0: finished" in err and "resume with:" in err
    assert "Traceback" not in err
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "none/bs128 seed 0: finished earlier, read from" in again.stderr
    assert (tmp_path / "mnist.json").exists()


def test_ctrl_c_with_workers_stops_every_process_and_exits_130(tmp_path):
    """A terminal's Ctrl-C reaches the workers too: no traceback from any process, no new run
    started after it, and the message lists what was saved."""
    cmd = [sys.executable, "-m", "lnbook", "run", "qk_norm", "--device", "cpu", "--out",
           str(tmp_path), "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as in a terminal
    try:
        deadline = time.monotonic() + 300
        while not list((tmp_path / "runs").glob("*.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no run finished in 300 s"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "resume with:" in err and "--workers 2" in err, err
    saved = {p.stem for p in (tmp_path / "runs").glob("*.json")}
    listed = set(re.findall(r"(\S+) seed (\d+): finished", err))
    assert {f"{v.replace('/', '_')}-seed{s}" for v, s in listed} == saved, err
    cfg = load_experiment("qk_norm").get_config()
    total = len(cfg.qk_norms) * len(cfg.lrs) * len(cfg.seeds)  # 24 runs in the sweep
    assert 1 <= len(saved) < total, err  # it stopped: not every run was trained
