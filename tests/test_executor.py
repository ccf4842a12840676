"""Sweeps on any concurrent.futures.Executor: a thread pool, and a real local Dask cluster
started here (the same resume and never-overwrite rules as in one process)."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tiny_experiment as tiny
from helpers import assert_same_runs

import lnbook.__main__ as cli
from lnbook.engine import OutConflict, WorkersLost, load_results, sweep, using_executor
from lnbook.experiments import EXPERIMENTS


def _sweep(config, **kwargs):
    return sweep("tiny", {"a": "a", "b": "b"}, [0, 1],
                 functools.partial(tiny.train_one, config=config), config=config,
                 device="cpu", steps=config.steps, **kwargs)


def test_a_sweep_on_an_executor_keeps_the_rules_of_one_process(tmp_path, capsys):
    config = tiny.get_config()
    one = _sweep(config)
    with ThreadPoolExecutor(2) as pool, using_executor(pool):
        pooled = _sweep(config, out=tmp_path)
        assert_same_runs(one, pooled)
        assert len(list(tmp_path.glob("runs/tiny-*/*.json"))) == 4  # written by this process
        again = _sweep(config, out=tmp_path, executor=pool)
        assert capsys.readouterr().err.count("finished earlier") == 4
        assert_same_runs(one, again)
        shorter = tiny.get_config(steps=8)  # fewer updates than the runs on disk made
        with pytest.raises(OutConflict):
            _sweep(shorter, out=tmp_path)
    with pytest.raises(TypeError, match="concurrent.futures.Executor"):
        _sweep(config, executor="dask")


@pytest.fixture(scope="module")
def dask_cluster():
    """Two worker processes of one thread each, on this machine's loopback only."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        yield cluster, client


def test_a_sweep_on_a_local_dask_cluster_gives_the_numbers_of_one_process(tmp_path,
                                                                           dask_cluster):
    _, client = dask_cluster
    config = tiny.get_config()
    one = _sweep(config)
    on_dask = _sweep(config, out=tmp_path, executor=client.get_executor())
    workers = client.run(lambda: __import__("os").getpid())
    assert len(set(workers.values())) == 2  # two worker processes
    assert_same_runs(one, on_dask)
    assert len(list(tmp_path.glob("runs/tiny-*/*.json"))) == 4


def test_the_command_line_names_a_dask_cluster(tmp_path, dask_cluster):
    cluster, _ = dask_cluster
    cli = subprocess.run([sys.executable, str(Path(tiny.__file__)), "run", "tiny",
                          "--executor", f"dask:{cluster.scheduler_address}",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert_same_runs(_sweep(tiny.get_config()), load_results(tmp_path / "tiny.json"))


def test_a_cluster_whose_workers_all_died_fails_in_one_line(tmp_path, monkeypatch, capsys):
    """Every worker of the cluster gone: the sweep stops after the configured wait (here 1 s)
    with one line, instead of waiting for ever; the command line exits 1."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("LNBOOK_NO_WORKERS_SECONDS", "1")
    monkeypatch.setitem(EXPERIMENTS, "tiny", tiny)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  protocol="tcp", host="127.0.0.1",
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        cluster.scale(0)  # close the only worker
        deadline = time.monotonic() + 60
        while client.nthreads():
            assert time.monotonic() < deadline, "the worker did not close in 60 s"
            time.sleep(0.1)
        start = time.monotonic()
        with pytest.raises(WorkersLost, match="the executor has no live workers"):
            _sweep(tiny.get_config(), out=tmp_path, executor=client.get_executor())
        assert time.monotonic() - start < 30
        argv = ["run", "tiny", "--executor", f"dask:{cluster.scheduler_address}"]
        assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lnbook: the executor has no live workers")
    assert "run without --executor" in err
