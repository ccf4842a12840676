"""The command line `python -m lnbook list|run`: exit codes, messages, results on disk."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

import lnbook.__main__ as cli
from lnbook.experiments import EXPERIMENTS, load_experiment


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


def test_run_writes_results(tmp_path, monkeypatch, capsys):
    seen = {}

    def get_config(scale="quick", **overrides):
        return {"scale": scale}

    def run(config, device="auto", out=None, seeds=None):
        seen.update(config=config, device=str(device), seeds=seeds)
        results = {"name": "tiny", "final": {"acc": [1.0]}}
        (tmp_path / "tiny.json").write_text(json.dumps(results))
        return results

    fake = types.SimpleNamespace(NAME="tiny", DESCRIPTION="a fake", get_config=get_config, run=run)
    monkeypatch.setitem(EXPERIMENTS, "tiny", "unused")
    monkeypatch.setattr(cli, "load_experiment", lambda name: fake)
    argv = ["run", "tiny", "--scale", "paper", "--device", "cpu", "--out", str(tmp_path),
            "--seeds", "3", "4"]
    assert cli.main(argv) == 0
    assert seen == {"config": {"scale": "paper"}, "device": "cpu", "seeds": [3, 4]}
    assert "acc: [1.0]" in capsys.readouterr().out
    assert json.loads((tmp_path / "tiny.json").read_text())["name"] == "tiny"


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
