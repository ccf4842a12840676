"""The benchmark scripts run, write what the Performance page reads, and measure what they say."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_layernorm  # noqa: E402
import bench_lstm  # noqa: E402
import bench_rmsnorm  # noqa: E402
import common  # noqa: E402


def test_layernorm_benchmark_writes_consistent_results(tmp_path):
    out = bench_layernorm.main(["--device", "cpu", "--shapes", "16x32,8x64", "--repeats", "3",
                                "--inner", "1", "--warmup", "0", "--impls",
                                "torch,autograd,lnbook_torch", "--note", "a test run",
                                "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "layernorm.json").read_text())
    assert stored["results"] == out["results"] and stored["machine"]["note"] == "a test run"
    assert "heap" not in stored["machine"] and "heap" not in stored["config"]
    for r in stored["results"]:
        assert set(r["seconds"]) == {"torch", "autograd", "lnbook_torch"}
        assert all(t > 0 for t in r["seconds"].values())
        assert set(r["ratio_to_torch"]) == {"autograd", "torch"}
        assert r["unavailable"] == {}
    assert stored["targets"] == {"autograd": 3.0, "torch": 1.1}
    for impl, target in stored["targets"].items():
        met = all(r["ratio_to_torch"][impl] <= target for r in stored["results"])
        assert stored["meets_targets"][impl] == met


def test_layernorm_benchmark_ratio_is_the_median_of_per_round_ratios(monkeypatch):
    # a clock that charges torch 1 unit and lnbook 2 or 5 units per call, round by round
    clock = {"t": 0.0}
    cost = {"torch": [1.0, 1.0, 1.0], "autograd": [2.0, 5.0, 2.0]}
    calls = {k: 0 for k in cost}

    def fake_fns(x, w, b, impls):
        def make(name):
            def fn():
                clock["t"] += cost[name][calls[name] % 3]
                calls[name] += 1
                return F.layer_norm(x, x.shape[-1:], w, b)
            return fn
        return {k: make(k) for k in impls}

    monkeypatch.setattr(bench_layernorm, "_forward_fns", fake_fns)
    monkeypatch.setattr(bench_layernorm.time, "perf_counter", lambda: clock["t"])
    cfg = bench_layernorm.BenchConfig(shapes=((4, 8),), impls=("torch", "autograd"), repeats=3,
                                      inner=1, warmup=0)
    res = bench_layernorm.bench_shape(4, 8, cfg, torch.device("cpu"))
    # the warm-up call took cost[0] from each; the rounds then see 5, 2, 2 against 1, 1, 1
    assert res.seconds == {"torch": 1.0, "autograd": 2.0}
    assert res.ratio_to_torch == {"autograd": 2.0}


def test_layernorm_benchmark_times_the_compiled_taught_code():
    # torch.compile of the plain four-line layer norm: the same numbers as torch, and a ratio
    x = torch.randn(6, 16, requires_grad=True)
    w, b = torch.rand(16) + 0.5, torch.randn(16)
    torch.testing.assert_close(bench_layernorm.taught_layer_norm(x, w, b),
                               F.layer_norm(x, (16,), w, b), atol=1e-5, rtol=0)
    out = bench_layernorm.run(bench_layernorm.BenchConfig(
        shapes=((8, 16),), impls=("torch", "compiled_plain"), repeats=2, inner=1, warmup=1,
        device="cpu"))
    r = out["results"][0]
    if r["unavailable"]:  # no C++ compiler here: the result must say why, not crash
        assert "compiled_plain" in r["unavailable"] and "compiled_plain" not in r["seconds"]
        return
    assert r["ratio_to_torch"]["compiled_plain"] > 0 and r["warmup_seconds"]["compiled_plain"] > 0
    assert out["targets"] == {}  # the compiled variants are reported, not held to a target


def test_layernorm_benchmark_rejects_bad_settings():
    with pytest.raises(ValueError, match="repeats"):
        bench_layernorm.run(bench_layernorm.BenchConfig(repeats=0))
    with pytest.raises(ValueError, match="impls"):
        bench_layernorm.run(bench_layernorm.BenchConfig(impls=("autograd",)))
    with pytest.raises(ValueError, match="impls"):
        bench_layernorm.run(bench_layernorm.BenchConfig(impls=("torch", "triton")))
    with pytest.raises(SystemExit):
        bench_layernorm.main(["--shapes", "16by32"])


def test_lstm_benchmark_quick_run(tmp_path):
    path = tmp_path / "lstm.json"
    out = bench_lstm.main(["--device", "cpu", "--quick", "--rounds", "3", "--clock", "cpu",
                           "--threads", "1", "--out", str(path)])
    stored = json.loads(path.read_text())
    assert stored["rows"] == out["rows"] and stored["machine"]["clock"] == "cpu"
    for r in stored["rows"]:
        t = r["all_seconds"]
        assert len(t["torch.nn.LSTM"]) == 3
        pairs = zip(t[bench_lstm.LN_LOOP], t["torch.nn.LSTM"], strict=True)  # the default
        ours = [a / b for a, b in pairs]
        assert r["ratio_ln_lstm_vs_torch"] == sorted(ours)[1]  # the median of 3 rounds
        assert r["seconds"]["torch.nn.LSTM"] == sorted(t["torch.nn.LSTM"])[1]
        assert r["meets_target"] == (r["ratio_ln_lstm_vs_torch"] <= r["target"])
    assert stored["meets_targets"] == all(r["meets_target"] for r in stored["rows"])
    with pytest.raises(ValueError, match="rounds"):
        bench_lstm.main(["--quick", "--rounds", "0", "--out", ""])


@pytest.mark.skipif(common.minor_faults() is None, reason="the OS does not count page faults")
def test_fault_counter_counts_fresh_pages():
    # a fresh process: in this one, the allocator may already hold freed pages a new tensor reuses
    code = ("import common, torch; f0 = common.minor_faults(); x = torch.ones(4_000_000); "
            "print(common.minor_faults() - f0, int(x[-1]))")
    run = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True,
                         check=True)
    faults, last = run.stdout.split()
    assert int(faults) >= 1000 and last == "1"  # 16 MB of fresh pages, counted


def test_rmsnorm_benchmark_writes_consistent_ratios(tmp_path):
    out = bench_rmsnorm.main(["--device", "cpu", "--shapes", "16x32,8x64", "--repeats", "3",
                              "--inner", "1", "--warmup", "0",
                              "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "rmsnorm.json").read_text())
    assert stored["results"] == out["results"] and [r["rows"] for r in stored["results"]] == [16, 8]
    for r in stored["results"]:
        assert set(r["seconds"]) == set(bench_rmsnorm.NAMES)
        assert all(t > 0 for t in r["seconds"].values())
        assert r["saving"]["torch"] == pytest.approx(1 - r["ratio_rms_to_ln"]["torch"])
        assert r["ratio_lnbook_rms_to_torch_rms"] > 0
    median = sorted(r["ratio_rms_to_ln"]["lnbook"] for r in stored["results"])
    assert stored["median_ratio_rms_to_ln"]["lnbook"] == pytest.approx(sum(median) / 2)
    with pytest.raises(ValueError, match="repeats"):
        bench_rmsnorm.run(bench_rmsnorm.BenchConfig(repeats=0))


def test_common_has_no_allocator_tuning():
    src = "".join((BENCH / f).read_text() for f in ("common.py", "bench_layernorm.py",
                                                     "bench_lstm.py", "bench_rmsnorm.py"))
    assert "mallopt" not in src and "ctypes" not in src


def test_seeds_benchmark_measures_a_ratio_of_the_same_runs(tmp_path):
    import bench_seeds

    out = bench_seeds.main(["--seeds", "2", "--steps", "2", "--repeats", "2",
                            "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "seeds.json").read_text())
    r = stored["results"][0]
    assert r == out["results"][0] and len(r["ratio_per_round"]) == 2
    assert r["ratio_per_round"] == pytest.approx(
        [a / b for a, b in zip(r["seconds_one_at_a_time"], r["seconds_together"], strict=True)])
    assert r["speedup"] == pytest.approx(sorted(r["ratio_per_round"])[0] * 0.5
                                         + sorted(r["ratio_per_round"])[1] * 0.5)


def test_stack_benchmark_measures_ratios_of_the_same_updates(tmp_path):
    import bench_stack

    out = bench_stack.main(["--copies", "2", "--updates", "1", "--repeats", "3",
                            "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "stack.json").read_text())
    assert stored["results"] == out["results"]
    names = [r["case"] for r in stored["results"]]
    assert len(names) == len(bench_stack.MLP_CASES)
    for r in stored["results"]:
        assert r["ratio_per_round"] == pytest.approx(
            [a / b for a, b in zip(r["seconds_stack"], r["seconds_hand"], strict=True)])
        assert r["ratio"] == pytest.approx(sorted(r["ratio_per_round"])[1])  # the median


@pytest.mark.parametrize("pair", [("mlp", "layer", 4), ("mlp", "batch", 128)])
def test_stack_benchmark_times_the_same_computation_both_ways(pair):
    import bench_stack

    make = getattr(bench_stack, f"{pair[0]}_pair")
    _, stack_losses, _, hand_losses = make(*pair[1:], 3, torch.device("cpu"))
    got, want = stack_losses(), hand_losses()  # (copies,): the same models on the same batch
    assert got.shape == (3,) and not torch.equal(got[0], got[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_scripts_write_where_the_chapters_read():
    """The results ship inside the package (one copy): each script's default output is the
    file `lnbook.resources.benchmark_result` reads, and each stored file is one script's."""
    import bench_seeds

    from lnbook import resources

    folder = Path(resources.__file__).parent / resources.BENCHMARK_RESULTS
    assert common.RESULTS == folder
    parser = common.norm_parser("x", ((1, 1),), bench_layernorm.BenchConfig(), "layernorm.json")
    assert parser.get_default("out") == str(folder)  # layernorm and rmsnorm: <out>/NAME.json
    assert bench_lstm.RESULTS is common.RESULTS and bench_seeds.RESULTS is common.RESULTS
    scripts = {p.stem.removeprefix("bench_") for p in BENCH.glob("bench_*.py")}
    assert set(resources.benchmark_results()) == scripts
    for name in scripts:
        assert resources.benchmark_result(name) == json.loads((folder / f"{name}.json").read_text())
    assert not (BENCH / "results").exists(), "one copy of the results, in lnbook/"


def test_paper_scale_script_records_each_preset_s_smoke_run(tmp_path):
    import paper_scale

    from lnbook.experiments import load_experiment

    out = paper_scale.main(["--device", "cpu", "--only", "online", "--max-updates", "2",
                            "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "paper_scale-cpu.json").read_text())
    assert stored["results"] == out["results"] and stored["machine"]["device"] == "cpu"
    (row,) = stored["results"]
    steps = load_experiment("online").get_config("paper").steps
    assert row["experiment"] == "online" and row["exit_status"] == 0 and "error" not in row
    assert row["steps"] == steps and row["updates_bound"] == row["loops"] * steps
    assert row["loops"] >= 1 and row["parameters"] > 1000 and row["seconds_per_update"] > 0
    assert "peak_accelerator_mib" not in row  # on the CPU there is none to report


def test_paper_scale_script_refuses_bad_options_and_keeps_to_its_budget(tmp_path, capsys):
    import paper_scale

    for argv in (["--only", "no_such"], ["--max-updates", "1"], ["--full", "no_such"]):
        with pytest.raises(SystemExit) as stop:
            paper_scale.main([*argv, "--device", "cpu", "--out", ""])
        assert stop.value.code == 2
    assert "unknown experiments ['no_such']" in capsys.readouterr().err
    out = paper_scale.main(["--device", "cpu", "--only", "online,mnist", "--budget", "0",
                            "--out", str(tmp_path)])
    assert [(r["experiment"], r["error"]) for r in out["results"]] == [
        ("online", "not run: --budget spent"), ("mnist", "not run: --budget spent")]


def test_paper_scale_script_says_which_runs_its_timeout_stopped(tmp_path):
    import paper_scale

    out = paper_scale.main(["--device", "cpu", "--only", "online", "--timeout", "0.5",
                            "--full", "online", "--runs", str(tmp_path / "runs"),
                            "--out", ""])
    (row,) = out["results"]
    assert row["exit_status"] is None and "seconds_per_update" not in row
    assert row["error"] == "stopped after --timeout 0.5 s"
    assert out["full"]["exit_status"] is None
    assert out["full"]["error"] == "stopped after --timeout 0.5 s"
