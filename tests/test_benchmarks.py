"""The benchmark scripts run, write what the Performance page reads, and measure what they say."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_layernorm  # noqa: E402
import bench_lstm  # noqa: E402


def test_layernorm_benchmark_writes_consistent_results(tmp_path):
    out = bench_layernorm.main(["--device", "cpu", "--shapes", "16x32,8x64", "--repeats", "2",
                                "--inner", "1", "--warmup", "0", "--heap", "glibc",
                                "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "layernorm.json").read_text())
    assert stored["results"] == out["results"] and stored["machine"]["heap"] == "glibc default"
    for r in stored["results"]:
        assert set(r["seconds"]) == {"torch", "autograd", "lnbook_torch"}
        assert all(t > 0 for t in r["seconds"].values())
        assert set(r["ratio_to_torch"]) == {"autograd", "torch"}
    for impl, target in stored["targets"].items():
        met = all(r["ratio_to_torch"][impl] <= target for r in stored["results"])
        assert stored["meets_targets"][impl] == met


def test_layernorm_benchmark_rejects_bad_settings():
    with pytest.raises(ValueError, match="repeats"):
        bench_layernorm.run(bench_layernorm.BenchConfig(repeats=0))
    with pytest.raises(ValueError, match="heap"):
        bench_layernorm.run(bench_layernorm.BenchConfig(heap="jemalloc"))
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
        pairs = zip(t[bench_lstm.LN_HAND], t["torch.nn.LSTM"], strict=True)
        ours = [a / b for a, b in pairs]
        assert r["ratio_ln_lstm_vs_torch"] == sorted(ours)[1]  # the median of 3 rounds
        assert r["seconds"]["torch.nn.LSTM"] == sorted(t["torch.nn.LSTM"])[1]
        assert r["meets_target"] == (r["ratio_ln_lstm_vs_torch"] <= r["target"])
    assert stored["meets_targets"] == all(r["meets_target"] for r in stored["rows"])
    with pytest.raises(ValueError, match="rounds"):
        bench_lstm.main(["--quick", "--rounds", "0", "--out", ""])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_heap_and_fault_counter_on_linux():
    # a fresh process: in this one, glibc may already hold freed pages that a new tensor reuses
    # (its mmap threshold grows with every large block freed), and mallopt is process-wide
    code = ("import common, torch; f0 = common.minor_faults(); x = torch.ones(4_000_000); "
            "print(common.minor_faults() - f0, int(x[-1]), common.steady_heap())")
    run = subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True,
                         check=True)
    faults, last, steady = run.stdout.split()
    assert int(faults) >= 1000 and last == "1"  # 16 MB of fresh pages, counted
    assert steady == "True"  # glibc took both settings
