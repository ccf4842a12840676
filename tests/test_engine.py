"""The experiment protocol: sweep (variants x seeds -> fit), Results, shared curve metrics,
and what an interrupted sweep leaves on disk."""

from __future__ import annotations

import errno
import functools
import json
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import lnbook.engine as P
from lnbook.engine import workers
from lnbook.engine.store import config_digest
from lnbook.engine.train import Batches, History, fit


def _history(values: list[float], steps: list[int] | None = None) -> History:
    steps = steps or [10 * i for i in range(len(values))]
    return History(steps=list(range(1, steps[-1] + 1)), losses=[1.0] * steps[-1],
                   eval_steps=steps, metrics=[{"err": v} for v in values])


def _results() -> P.Results:
    runs = [P.Run("a", 0, _history([0.9, 0.5, 0.4])), P.Run("a", 1, _history([0.8, 0.6, 0.2])),
            P.Run("b", 0, _history([0.9, 0.7, 0.6]), {"k": 3}),
            P.Run("b", 1, _history([0.9, 0.8, 0.7]), {"k": 4})]
    return P.Results("toy", {"lr": 0.1}, "cpu", runs, {"source": "made up"})


def test_updates_to_reach_both_directions():
    assert P.updates_to_reach([0, 10, 20], [200.0, 150.0, 140.0], 150.0) == 10
    assert P.updates_to_reach([0, 10, 20], [200.0, 150.0, 140.0], 100.0) == math.inf
    assert P.updates_to_reach([0, 5, 9], [0.1, 0.4, 0.9], 0.4, mode="max") == 5
    # one row per seed, each against the target or its own: inf where never
    rows = np.array([[3.0, 2.0, 1.0], [3.0, 3.0, 2.0], [3.0, 3.0, 3.0]])
    np.testing.assert_array_equal(P.updates_to_reach([0, 5, 9], rows, 2.0), [5.0, 9.0, np.inf])
    np.testing.assert_array_equal(P.updates_to_reach([0, 5, 9], rows, [1.0, 3.0, 2.5]),
                                  [9.0, 0.0, np.inf])
    with pytest.raises(ValueError):
        P.updates_to_reach([0, 5, 9], rows, [1.0, 2.0])  # one target per row, or one
    with pytest.raises(ValueError, match="differ in length"):
        P.updates_to_reach([0, 1], [1.0], 0.5)
    with pytest.raises(ValueError, match="mode"):
        P.updates_to_reach([0], [1.0], 0.5, mode="down")


def test_updates_to_reach_interpolates_between_evaluations():
    # the loss falls from 2.0 at update 10 to 1.0 at update 20: 1.75 is a quarter of the way
    assert P.updates_to_reach([0, 10, 20], [3.0, 2.0, 1.0], 1.75) == 12.5
    assert P.updates_to_reach([0, 10, 20], [0.0, 0.2, 0.6], 0.5, mode="max") == 17.5
    # a line through the two evaluations crosses the target where the formula says
    s = P.updates_to_reach([0, 40, 50], [9.0, 4.0, 1.5], 3.0)
    assert 4.0 + (1.5 - 4.0) * (s - 40) / 10 == pytest.approx(3.0)
    # reached at the first evaluation, or right after a loss that is not finite: that step
    assert P.updates_to_reach([5, 10], [1.0, 0.5], 2.0) == 5.0
    assert P.updates_to_reach([0, 10, 20], [3.0, math.nan, 1.0], 2.0) == 20.0
    # finer evaluations of a straight line give the same answer as coarse ones
    steps = np.arange(0, 101)
    line = 10.0 - 0.07 * steps
    assert P.updates_to_reach(steps, line, 5.1) == pytest.approx(70.0)
    assert P.updates_to_reach(steps[::20], line[::20], 5.1) == pytest.approx(70.0)


def test_speedup_of_updates_to_a_target():
    inf = math.inf
    got = P.speedup([300.0, inf, 100.0, inf, 30.0], [200.0, 50.0, inf, inf, 0.0])
    np.testing.assert_array_equal(got, [1.5, inf, 0.0, np.nan, 30.0])  # 0 updates count as 1
    assert P.speedup([[90.0]], [[60.0]]).shape == (1, 1)
    with pytest.raises(ValueError, match="shape"):
        P.speedup([1.0, 2.0], [1.0])


def test_mean_after_start_and_best_step():
    v = np.array([[9.0, 1.0, 3.0], [9.0, 2.0, 2.0]])
    np.testing.assert_allclose(P.mean_after_start(v), [2.0, 2.0])
    assert P.best_step([0, 10, 20], [0.5, 0.2, 0.2]) == 10
    assert P.best_step([0, 10, 20], [0.5, 0.2, 0.7], mode="max") == 20
    with pytest.raises(ValueError, match="evaluations"):
        P.mean_after_start(np.array([1.0, 2.0]))


def test_results_select_curves_final_best_and_round_trip(tmp_path):
    r = _results()
    assert r.variants == ["a", "b"] and r.seeds == [0, 1]
    steps, vals = r.curves("a", "err")
    np.testing.assert_array_equal(steps, [0, 10, 20])
    np.testing.assert_allclose(vals, [[0.9, 0.5, 0.4], [0.8, 0.6, 0.2]])
    np.testing.assert_allclose(r.final("b", "err"), [0.6, 0.7])
    np.testing.assert_allclose(r.best("a", "err"), [0.4, 0.2])
    np.testing.assert_allclose(r.best("b", "err", "max"), [0.9, 0.9])
    assert r.info_of("b", "k") == [3, 4]
    steps, losses = r.curves("a", "loss")
    assert steps[0] == 1 and losses.shape == (2, 20)
    with pytest.raises(KeyError, match="variants"):
        r.select("c")
    with pytest.raises(KeyError, match="recorded"):
        r.curves("a", "acc")
    back = P.load_results(P.save_results(r, tmp_path / "toy.json"))
    assert back.to_dict() == r.to_dict()


def test_table_shows_values_per_seed():
    t = _results().table(["err"], fmt=".2f")
    text = str(t)
    assert "a" in text and "0.40 / 0.20" in text and "0.60 / 0.70" in text
    assert "| a | 0.40 / 0.20 |" in t._repr_markdown_()
    best = str(_results().table(["err"], stat="min", fmt=".1f"))
    assert "0.4 / 0.2" in best


def _regression_data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 3, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5]])


def _train_one(job: P.Job, steps: int = 12, stop_at: int | None = None,
               sleep: float = 0.0) -> History:
    torch.manual_seed(job.seed)
    model = nn.Linear(3, 1, bias=False) if job.params == "linear" else nn.Sequential(
        nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x, y = _regression_data()
    batches = Batches(x, y, batch_size=8, seed=job.seed)

    def data(step: int):
        if stop_at is not None and step == stop_at:
            raise KeyboardInterrupt
        time.sleep(sleep)
        return batches(step)

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mse = lambda m, b: ((m(b[0]) - b[1]) ** 2).mean()  # noqa: E731
    return fit(model, data, opt, steps=steps, eval_every=4, loss_fn=mse,
               eval_fn=lambda m: {"mse": float(mse(m, (x, y)))}, device=job.device,
               seed=job.seed, checkpoint=job.checkpoint, bar=job.bar, label=job.label)


def test_sweep_trains_every_pair_in_order_and_seeds_matter():
    r = P.sweep("toy", {"linear": "linear", "mlp": "mlp"}, [0, 1], _train_one, config={"x": 1},
                device="cpu", steps=12)
    assert [(x.variant, x.seed) for x in r.runs] == [("linear", 0), ("linear", 1), ("mlp", 0),
                                                   ("mlp", 1)]
    assert r.name == "toy" and r.config == {"x": 1} and r.device == "cpu"
    _, mse = r.curves("linear", "mse")
    assert mse.shape == (2, 4) and np.all(mse[:, -1] < mse[:, 0])  # it learned
    assert not np.allclose(r.final("mlp", "mse")[0], r.final("mlp", "mse")[1])
    with pytest.raises(ValueError, match="variants is empty"):
        P.sweep("toy", {}, [0], _train_one, config=None)
    with pytest.raises(ValueError, match="seeds is empty"):
        P.sweep("toy", {"a": 1}, [], _train_one, config=None)


def test_sweep_info_from_train_one_and_files(tmp_path):
    def train_one(job):
        return _train_one(job), {"param": job.params, "seed_twice": 2 * job.seed}

    r = P.sweep("toy", {"linear": "linear"}, [3], train_one, config={"x": 1}, device="cpu",
                out=tmp_path, info={"source": "synthetic"})
    assert r.runs[0].info == {"param": "linear", "seed_twice": 6}
    assert r.info == {"source": "synthetic"}
    stem = f"toy-{config_digest(r.config)}"  # files name the experiment and its config
    on_disk = json.loads((tmp_path / f"{stem}.json").read_text())
    assert on_disk["runs"][0]["info"]["seed_twice"] == 6
    assert (tmp_path / "runs" / stem / "linear-seed3.json").exists()
    assert P.load_results(tmp_path / "toy.json").to_dict() == r.to_dict()  # the one config


def test_interrupted_sweep_resumes_to_the_same_results(tmp_path, capsys):
    variants, seeds = {"linear": "linear", "mlp": "mlp"}, [0, 1]
    clean = P.sweep("toy", variants, seeds, _train_one, config={"x": 1}, device="cpu")
    calls = {"n": 0}

    def stops_in_third_run(job):
        calls["n"] += 1
        return _train_one(job, stop_at=10 if calls["n"] == 3 else None)

    with pytest.raises(P.SweepInterrupted) as stop:
        P.sweep("toy", variants, seeds, stops_in_third_run, config={"x": 1}, device="cpu",
                out=tmp_path, checkpoint=True, steps=12)
    assert isinstance(stop.value, KeyboardInterrupt)
    assert stop.value.finished == ["linear seed 0", "linear seed 1"]
    assert stop.value.saved == [("mlp seed 0", 10, 12)]  # saved at the interrupt, not at 8
    text = stop.value.describe()
    assert "mlp seed 0: checkpoint at update 10 of its 12 updates" in text
    assert "linear seed 1: finished" in text
    # the sweep's count, as its bar shows it: 2 runs of 12 and 10 updates of the third
    assert stop.value.progress == (34, 48) and "at update 34 of 48 of the sweep" in text
    resumed = P.sweep("toy", variants, seeds, _train_one, config={"x": 1}, device="cpu",
                      out=tmp_path, checkpoint=True)
    err = capsys.readouterr().err
    assert "linear seed 0: finished earlier" in err
    assert "mlp seed 0: resuming from update 10 of 12" in err
    for a, b in zip(clean.runs, resumed.runs, strict=True):
        assert a.history.losses == b.history.losses
        assert a.history.metrics == b.history.metrics


def test_configs_and_experiments_share_one_out_and_nothing_is_overwritten(tmp_path, capsys):
    """Another config, or another experiment, writes its own files beside the first; asking
    fewer updates than a finished run made is refused, with every file kept."""
    first = P.sweep("toy", {"linear": "linear"}, [0], _train_one, config={"lr": 1, "steps": 12},
                    device="cpu", out=tmp_path)
    kept = {p: p.read_bytes() for p in tmp_path.glob("**/*.json")}
    assert len(kept) == 2  # the results and the run
    other = P.sweep("toy", {"linear": "linear"}, [0], _train_one, config={"lr": 2, "steps": 12},
                    device="cpu", out=tmp_path)
    again = P.sweep("toy2", {"linear": "linear"}, [0], _train_one,
                    config={"lr": 1, "steps": 12}, device="cpu", out=tmp_path)
    assert "finished earlier" not in capsys.readouterr().err  # each trained its own run
    assert {p: p.read_bytes() for p in kept} == kept
    assert len(list(tmp_path.glob("**/*.json"))) == 6
    for r in (first, other, again):
        assert P.results_file(tmp_path, r.name, r.config).exists()
    with pytest.raises(P.UnreadableFile, match="2 configs of toy"):
        P.load_results(tmp_path / "toy.json")  # which one? the message lists both
    calls = []
    with pytest.raises(P.OutConflict, match="another folder") as conflict:
        P.sweep("toy", {"linear": "linear", "mlp": "mlp"}, [0], lambda j: calls.append(j),
                config={"lr": 1, "steps": 8}, device="cpu", out=tmp_path)
    assert isinstance(conflict.value, FileExistsError) and calls == []  # nothing trained
    assert len(conflict.value.files) == 1  # the run of 12 updates
    assert {p: p.read_bytes() for p in kept} == kept
    saved = json.loads(conflict.value.files[0].read_text())
    assert saved["digest"] == config_digest({"lr": 1, "steps": 12}) != config_digest({"lr": 2})


def test_checkpoints_are_resumed_under_their_own_config_only(tmp_path, capsys):
    """A finished run's checkpoint is kept; another config (here the learning rate that
    train_one reads from it) must start afresh, not resume it and return the old run as its
    own. Changing only steps, threads or workers continues the run."""
    def train_one(job, cfg):
        torch.manual_seed(job.seed)
        model = nn.Linear(3, 1, bias=False)
        x, y = _regression_data()
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
        mse = lambda m, b: ((m(b[0]) - b[1]) ** 2).mean()  # noqa: E731
        return fit(model, Batches(x, y, batch_size=8, seed=job.seed), opt, steps=cfg["steps"],
                   eval_every=4, loss_fn=mse, eval_fn=lambda m: {"mse": float(mse(m, (x, y)))},
                   device=job.device, seed=job.seed, checkpoint=job.checkpoint, bar=job.bar,
                   label=job.label)

    def losses(cfg, out):
        r = P.sweep("toy", {"linear": "linear"}, [0], lambda j: train_one(j, cfg), config=cfg,
                    device="cpu", out=out, checkpoint=True)
        return r.runs[0].history.losses

    slow, fast = {"lr": 0.01, "steps": 8}, {"lr": 0.05, "steps": 8}
    first = losses(slow, tmp_path)
    for finished in tmp_path.glob("**/*.json"):
        finished.unlink()  # the checkpoint alone is left
    assert losses(fast, tmp_path) == losses(fast, tmp_path / "fresh") != first
    assert "resuming" not in capsys.readouterr().err
    for finished in tmp_path.glob("runs/*/*.json"):
        finished.unlink()
    longer = losses({**fast, "steps": 12, "workers": 2, "threads": 1}, tmp_path)
    assert "linear seed 0: resuming from update 8 of 12" in capsys.readouterr().err
    assert longer[:8] == losses(fast, tmp_path / "fresh") and len(longer) == 12
    ckpts = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("checkpoints/**/*.pt"))
    assert ckpts == sorted(f"checkpoints/toy-{config_digest(c)}/linear-seed0.pt"
                           for c in (slow, fast))


def test_interrupt_without_out_says_nothing_was_saved():
    with pytest.raises(P.SweepInterrupted, match="nothing was saved"):
        P.sweep("toy", {"linear": "linear"}, [0], lambda j: _train_one(j, stop_at=3),
                config=None, device="cpu")


def _ctrl_c_interrupts(job: P.Job) -> tuple[History, dict]:
    """A run that reports whether Ctrl-C would interrupt it where it trains."""
    raises = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    return _train_one(job, steps=4), {"ctrl_c_interrupts": raises}


def test_workers_ignore_ctrl_c_between_runs_and_not_during_them():
    """A terminal's Ctrl-C reaches every worker. One that is waiting for (or unpickling) its
    next run must go on serving, without a KeyboardInterrupt traceback; one that is training
    must be interrupted, so that its run saves a checkpoint."""
    spawn = multiprocessing.get_context("spawn")
    ignore = workers._worker_ignores_ctrl_c
    with ProcessPoolExecutor(1, mp_context=spawn, initializer=ignore) as pool:
        pid = pool.submit(os.getpid).result()
        os.kill(pid, signal.SIGINT)  # the worker is idle, between runs
        time.sleep(0.5)
        assert pool.submit(os.getpid).result() == pid  # the same worker, still serving
    r = P.sweep("toy", {"linear": "linear", "mlp": "mlp"}, [0], _ctrl_c_interrupts,
                config=None, device="cpu", workers=2)
    assert [run.info["ctrl_c_interrupts"] for run in r.runs] == [True, True]


def test_workers_train_in_processes_to_the_same_results(tmp_path):
    variants, seeds = {"linear": "linear", "mlp": "mlp"}, [0, 1, 2]
    one = P.sweep("toy", variants, seeds, _train_one, config={"x": 1}, device="cpu", steps=12)
    two = P.sweep("toy", variants, seeds, _train_one, config={"x": 1}, device="cpu", steps=12,
                  out=tmp_path, workers=2, threads=1)
    assert [(r.variant, r.seed) for r in two.runs] == [(r.variant, r.seed) for r in one.runs]
    for a, b in zip(one.runs, two.runs, strict=True):
        assert a.history.losses == b.history.losses and a.history.metrics == b.history.metrics
    assert len(list(tmp_path.glob("runs/toy-*/*.json"))) == 6  # each worker kept its run
    with pytest.raises(TypeError, match="must be picklable"):
        P.sweep("toy", variants, seeds, lambda job: _train_one(job), config=None,
                device="cpu", workers=2)
    with pytest.raises(ValueError, match="workers must be a positive int"):
        P.sweep("toy", variants, seeds, _train_one, config=None, workers=0)


def test_an_interrupt_in_a_worker_stops_the_sweep(tmp_path):
    with pytest.raises(P.SweepInterrupted) as stop:
        P.sweep("toy", {"linear": "linear"}, [0, 1],
                functools.partial(_train_one, stop_at=3), config=None, device="cpu",
                out=tmp_path, checkpoint=True, workers=2)
    assert stop.value.out == tmp_path and stop.value.finished == []


def test_workers_from_an_unguarded_script_get_a_clear_error(tmp_path):
    """Worker processes import the main module: a script must guard its sweep."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_engine import P, _train_one\n"
        "P.sweep('toy', {'linear': 'linear'}, [0, 1], _train_one, config=None,\n"
        "        device='cpu', workers=2)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr and "workers=1" in done.stderr


@dataclass
class C:
    scale: str = "quick"
    steps: int = 5


def test_make_config_and_check_scale():
    assert P.make_config(C, {"quick": {}, "paper": {"steps": 50}}, "paper", {}).steps == 50
    assert P.make_config(C, {"quick": {}, "paper": {}}, "quick", {"steps": 7}).steps == 7
    with pytest.raises(ValueError, match="unknown Config fields"):
        P.make_config(C, {"quick": {}}, "quick", {"stepz": 1})
    with pytest.raises(ValueError, match="scale must be one of"):
        P.check_scale("huge")


def test_cpu_threads_sets_and_restores():
    before = torch.get_num_threads()
    with P.cpu_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with P.cpu_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="positive int"):
        with P.cpu_threads(0):
            pass


def test_sweep_trains_with_the_threads_it_is_given():
    seen = []

    def train_one(job):
        seen.append(torch.get_num_threads())
        return _train_one(job)

    before = torch.get_num_threads()
    P.sweep("toy", {"linear": "linear"}, [0], train_one, config=None, device="cpu", threads=2)
    assert seen == [2] and torch.get_num_threads() == before


def test_the_engine_is_one_package_and_the_old_addresses_are_gone():
    """Every name of the engine is importable from ``lnbook.engine``; the compatibility shim
    ``lnbook.experiments.protocol`` and the engine names on ``lnbook.experiments`` are gone."""
    import importlib

    import lnbook.experiments as E
    from lnbook.engine import config, job, metrics, results, runner, store, train

    moved = {"sweep": runner, "Job": job, "SweepInterrupted": job, "cpu_threads": job,
             "Run": results, "Results": results, "save_results": results,
             "load_results": results, "updates_to_reach": metrics, "best_step": metrics,
             "mean_after_start": metrics, "classification_metrics": metrics,
             "SCALES": config, "check_scale": config, "make_config": config,
             "RunConfig": config,
             "OutConflict": store, "fit": train, "History": train, "Batches": train}
    for name, module in moved.items():
        assert getattr(P, name) is getattr(module, name), name
        assert not hasattr(E, name), name
    assert set(P.__all__) >= set(moved)
    for old in ("lnbook.experiments.protocol", "lnbook.experiments.runner", "lnbook.train",
                "lnbook.engine.presets"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_every_optimizer_in_the_package_updates_its_tensors_in_one_call():
    """Each ``torch.optim`` optimizer built in ``lnbook/`` is given ``foreach=True`` or
    ``fused=...``. On a CPU torch otherwise loops over the tensors in Python (its default
    ``foreach`` is for CUDA), about 3x slower for Adam at the stacked sizes and bit-identical
    to ``foreach`` (checked here on a step of a stacked MLP's shapes)."""
    import ast

    root = Path(P.__file__).resolve().parents[1]
    missing = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and ast.unparse(node.func.value) == "torch.optim"
                    and not {"foreach", "fused"} & {k.arg for k in node.keywords}):
                missing.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not missing, missing
    shapes = [(5, 784, 64), (5, 64), (5, 64, 10)]
    finals = []
    for foreach in (False, True):
        g = torch.Generator().manual_seed(0)
        params = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
        opt = torch.optim.Adam(params, lr=1e-2, foreach=foreach)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        finals.append(params)
    assert all(torch.equal(a, b) for a, b in zip(*finals, strict=True))
    assert not torch.equal(finals[0][0], torch.randn(shapes[0], generator=torch.Generator()
                                                     .manual_seed(0)))  # it did update


def _train_stack(job: P.Job) -> list[History]:
    """A stacked job: one result per (variant, seed) of the job, as if trained one by one."""
    return [_train_one(P.Job.one(v, job.variants[v], s)) for v, s in job.pairs]


@pytest.mark.parametrize("stack", ["seeds", "all"])
def test_a_stacked_sweep_gives_the_runs_of_one_at_a_time_and_resumes(tmp_path, stack):
    variants = {"linear": "linear", "mlp": "mlp"}
    alone = P.sweep("toy", variants, [0, 1], _train_one, config={"x": 1}, device="cpu")
    calls = []

    def counted(job):
        calls.append(job.pairs)
        return _train_stack(job)

    r = P.sweep("toy", variants, [0, 1], counted, config={"x": 1}, device="cpu",
                out=tmp_path, stack=stack)
    assert len(calls) == (2 if stack == "seeds" else 1)
    assert [(x.variant, x.seed) for x in r.runs] == [(x.variant, x.seed) for x in alone.runs]
    for a, b in zip(alone.runs, r.runs, strict=True):
        assert a.history.losses == b.history.losses
    again = P.sweep("toy", variants, [0, 1], counted, config={"x": 1}, device="cpu",
                    out=tmp_path, stack=stack)
    assert len(calls) == (2 if stack == "seeds" else 1)  # every run was read back, none retrained
    assert [x.history.losses for x in again.runs] == [x.history.losses for x in r.runs]
    with pytest.raises(ValueError, match="returned 1 results for a job of 4 runs"):
        P.sweep("toy", variants, [0, 1], lambda job: [_train_one(P.Job.one("linear", "linear", 0))],
                config={"x": 1}, device="cpu", stack="all")


def test_seeds_are_resolved_when_the_sweep_starts_and_recorded_as_trained(monkeypatch):
    monkeypatch.setenv("LNBOOK_SEED_SET", "2")
    r = P.sweep("toy", {"linear": "linear"}, 2, _train_one, config={"seeds": 2}, device="cpu")
    assert r.seeds == [2000, 2001] and r.config["seeds"] == [2000, 2001]
    r = P.sweep("toy", {"linear": "linear"}, (7, 9), _train_one, config={"seeds": 2},
                device="cpu")
    assert r.config["seeds"] == [7, 9]  # the seeds trained, not the config's default
    with pytest.raises(ValueError, match=r"seeds must differ: \[3\] given more than once"):
        P.resolve_seeds([3, 4, 3])
    with pytest.raises(TypeError, match="seeds must be ints"):
        P.resolve_seeds([1.5])
    assert P.resolve_seeds(3) == (2000, 2001, 2002)


def test_a_capped_sweep_stops_every_loop_and_is_saved_apart(tmp_path):
    """A smoke run (``engine.capped``): fit and train_copies stop after the cap and evaluate
    there; its files carry the cap in their digest, so the full run trains afresh."""
    with P.capped(5) as measured:
        assert P.max_updates() == 5 and P.max_updates(12) == 5 and P.max_updates(3) == 3
        smoke = P.sweep("toy", {"linear": "linear"}, [0], _train_one, config={"x": 1},
                        device="cpu", out=tmp_path, checkpoint=True, steps=12)
        copies = [History(), History()]
        w = torch.zeros(2, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        P.train_copies(lambda s: (w - 1.0) ** 2, lambda: [{"w": float(v)} for v in w.detach()], opt,
                       copies, steps=12, eval_every=4)
    assert P.max_updates() is None
    h = smoke.runs[0].history
    assert h.steps == [1, 2, 3, 4, 5] and h.eval_steps == [0, 4, 5]
    assert smoke.config == {"x": 1, "max_updates": 5}
    assert copies[0].steps == [1, 2, 3, 4, 5] and copies[0].eval_steps == [0, 4, 5]
    assert [m["parameters"] for m in measured] == [3, 2]  # the linear model, the two copies
    assert all(m["seconds_per_update"] > 0 for m in measured)
    full = P.sweep("toy", {"linear": "linear"}, [0], _train_one, config={"x": 1}, device="cpu",
                   out=tmp_path, checkpoint=True, steps=12)
    assert len(full.runs[0].history.steps) == 12  # not the smoke run read back, nor resumed
    assert full.runs[0].history.losses[:5] == h.losses
    assert len(list(tmp_path.glob("runs/toy-*/linear-seed0.json"))) == 2
    with pytest.raises(ValueError, match="max_updates must be a positive int"):
        with P.capped(0):
            pass


def test_a_stacked_job_checkpoints_under_its_own_name(tmp_path):
    seen = []

    def record(job):
        seen.append(job.checkpoint.relative_to(tmp_path).as_posix())
        return _train_stack(job)

    for stack in ("seeds", "all"):
        P.sweep("toy", {"linear": "linear", "mlp": "mlp"}, [0, 1], record,
                config={"stack": stack}, device="cpu", out=tmp_path, stack=stack,
                checkpoint=True)
    d1, d2 = (config_digest({"stack": s}) for s in ("seeds", "all"))
    assert seen == [f"checkpoints/toy-{d1}/linear-seeds.pt", f"checkpoints/toy-{d1}/mlp-seeds.pt",
                    f"checkpoints/toy-{d2}/all.pt"]


def test_an_option_that_cannot_apply_says_so_once(capsys):
    P.sweep("toy", {"linear": "linear", "mlp": "mlp"}, [0], _train_stack, config=None,
            device="cpu", stack="all", workers=4)
    err = capsys.readouterr().err
    assert err.count("lnbook: toy trains all its runs as one model: workers 4 has 1 job to "
                     "spread\n") == 1, err
    P.sweep("toy", {"linear": "linear"}, [0, 1], _train_one, config=None, device="cpu",
            workers=3)
    assert "lnbook: toy: workers 3 has 2 jobs to spread" in capsys.readouterr().err
    P.sweep("toy", {"linear": "linear"}, [0, 1], _train_stack, config=None, device="cpu",
            stack="seeds", executor=ThreadPoolExecutor(1))
    assert ("toy trains the seeds of a variant as one model: the executor has 1 job to run"
            in capsys.readouterr().err)
    P.sweep("toy", {"linear": "linear"}, [0, 1], _train_one, config=None, device="cpu")
    assert capsys.readouterr().err == ""  # nothing asked that cannot apply


def test_paper_scale_on_a_cpu_estimates_its_time_and_logs_its_progress(capsys):
    def slow(job):  # 0.05 s an update: the estimate of 35 updates left is under a minute
        return _train_one(job, steps=40, sleep=0.05)

    P.sweep("toy", {"linear": "linear"}, [0], slow, config={"scale": "paper"}, device="cpu",
            steps=40, progress=False)
    err = capsys.readouterr().err
    assert err.count("a GPU is advised") == 1, err
    assert re.search(r"toy: under a minute on this CPU \(0\.\d+ s per update, 35 "
                     r"updates to go\); a GPU is advised", err), err
    lines = re.findall(r"toy: update (\d+) of 40 \((\d+)%\)", err)
    assert lines == [(str(4 * k), str(10 * k)) for k in range(1, 11)], err
    P.sweep("toy", {"linear": "linear"}, [0], slow, config={"scale": "quick"}, device="cpu",
            steps=40, progress=False)
    assert capsys.readouterr().err == ""  # quick scale: neither


def test_the_test_interrupt_stops_after_that_many_updates(tmp_path, monkeypatch):
    monkeypatch.setenv("LNBOOK_TEST_INTERRUPT_AFTER_UPDATES", "15")
    with pytest.raises(P.SweepInterrupted) as stop:
        P.sweep("toy", {"linear": "linear"}, [0, 1], _train_one, config={"x": 1},
                device="cpu", out=tmp_path, checkpoint=True, steps=12)
    assert stop.value.finished == ["linear seed 0"]
    assert stop.value.saved == [("linear seed 1", 3, 12)] and stop.value.progress == (15, 24)


def test_a_full_disk_leaves_no_stray_file(tmp_path, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(P.CannotWrite) as err:
        P.save_results({"a": 1}, tmp_path / "r.json")
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
    assert str(err.value).startswith(f"cannot write {tmp_path / 'r.json'}: No space left")
    assert list(tmp_path.iterdir()) == []  # no .tmp left
    monkeypatch.undo()

    def half_then_full(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"
                           "\nPytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", half_then_full)
    with pytest.raises(P.CannotWrite, match="file write failed"):
        P.sweep("toy", {"linear": "linear"}, [0], _train_one, config={"x": 1}, device="cpu",
                out=tmp_path, checkpoint=True)
    assert list(tmp_path.glob("**/*.tmp")) == [] and list(tmp_path.glob("**/*.pt")) == []


def test_the_standard_library_process_pool_gives_the_numbers_of_one_process(tmp_path):
    variants = {"linear": "linear", "mlp": "mlp"}
    one = P.sweep("toy", variants, [0, 1], _train_one, config={"x": 1}, device="cpu", steps=12)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=spawn) as pool:
        pooled = P.sweep("toy", variants, [0, 1], _train_one, config={"x": 1}, device="cpu",
                         steps=12, out=tmp_path, executor=pool)
        stacked = P.sweep("toy", variants, [0, 1], _train_stack, config={"x": 1},
                          device="cpu", stack="seeds", executor=pool)
    for r in (pooled, stacked):
        assert [x.history.losses for x in r.runs] == [x.history.losses for x in one.runs]
        assert [x.history.metrics for x in r.runs] == [x.history.metrics for x in one.runs]
    assert len(list(tmp_path.glob("runs/toy-*/*.json"))) == 4


@pytest.mark.parametrize("field, value, error", [
    ("scale", "huge", ValueError), ("steps", 0, ValueError), ("steps", 2.5, TypeError),
    ("workers", 0, ValueError), ("threads", 0, ValueError), ("threads", True, TypeError),
    ("seeds", 0, ValueError), ("seeds", "0 1", TypeError), ("seeds", True, TypeError)])
def test_run_config_refuses_a_bad_shared_field_by_name(field, value, error):
    """A value of the wrong type is a TypeError, a value out of range a ValueError (as torch)."""
    with pytest.raises(error, match=field):
        P.RunConfig(**{field: value})


def test_run_config_keeps_good_fields_and_reads_no_seed_set():
    c = P.RunConfig(seeds=3, steps=7, threads=None, workers=2)
    assert (c.scale, c.seeds, c.steps, c.threads, c.workers) == ("quick", 3, 7, None, 2)
    assert P.RunConfig(seeds=(4, 9)).seeds == (4, 9)  # an int is resolved when a run starts


def test_every_experiment_config_is_a_run_config_with_one_name_per_idea():
    """Every registered experiment's config extends :class:`RunConfig`, and no config keeps an
    old spelling of a shared idea (``batch`` for ``batch_size``, ``n_valid`` for ``n_val``)."""
    import dataclasses

    from lnbook.experiments import EXPERIMENTS

    for name, module in EXPERIMENTS.items():
        for scale in P.SCALES:  # a preset naming an old spelling would raise here
            cfg = module.get_config(scale)
            assert isinstance(cfg, P.RunConfig) and cfg.scale == scale, name
        fields = {f.name for f in dataclasses.fields(cfg)}
        assert not fields & {"batch", "n_valid"}, name
