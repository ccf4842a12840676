"""What the chapters read at run time ships inside the package: the claims' rules and the
stored benchmark results, read through importlib.resources from any folder."""

import json
from pathlib import Path

import pytest
import yaml

from lnbook import resources

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lnbook"


def test_claims_text_is_the_packaged_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing depends on the working folder
    text = resources.claims_text()
    assert text == (PACKAGE / "claims.yml").read_text()
    ids = [c["id"] for c in yaml.safe_load(text)["claims"]]
    assert ids[0] == "C01" and "P02" in ids


def test_benchmark_results_are_the_stored_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stored = {p.stem: json.loads(p.read_text())
              for p in sorted((PACKAGE / "benchmark_results").glob("*.json"))}
    assert sorted(stored) == ["layernorm", "lstm", "rmsnorm", "seeds", "stack"]
    assert resources.benchmark_results() == stored
    rms = resources.benchmark_result("rmsnorm")
    assert rms == stored["rmsnorm"] and rms["machine"]["cpu"]  # chapter 8 shows both


def test_another_machines_results_are_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folders = sorted(p.name for p in (PACKAGE / "benchmark_results").iterdir() if p.is_dir())
    assert resources.benchmark_machines() == folders and "h200" in folders
    stored = {p.stem: json.loads(p.read_text())
              for p in sorted((PACKAGE / "benchmark_results" / "h200").glob("*.json"))}
    h200 = resources.benchmark_results("h200")
    assert h200 == stored and "paper_scale" in h200 and "paper_scale" not in (
        resources.benchmark_results())
    assert all(r["machine"]["gpu"] == "NVIDIA H200" for r in h200.values())
    assert resources.benchmark_result("stack", "h200") == stored["stack"]


@pytest.mark.parametrize("machine, error, message", [
    (200, TypeError, "machine must be None or a str"),
    ("a100", ValueError, r"whose results are stored: \['h200'\].*got 'a100'"),
    ("../lnbook", ValueError, "whose results are stored"),
])
def test_benchmark_machine_names_what_it_expected(machine, error, message):
    with pytest.raises(error, match=message):
        resources.benchmark_results(machine)
    with pytest.raises(error, match=message):
        resources.benchmark_result("stack", machine)


@pytest.mark.parametrize("name, error, message", [
    (3, TypeError, "must be a str"),
    ("../claims", ValueError, "lower-case name"),
    ("RMSNorm", ValueError, "lower-case name"),
    ("gelu", FileNotFoundError, r"no stored benchmark result 'gelu'; stored: \['layernorm'"),
])
def test_benchmark_result_names_what_it_expected(name, error, message):
    with pytest.raises(error, match=message):
        resources.benchmark_result(name)


def test_package_data_is_declared_for_every_file_read():
    """pyproject.toml ships what `lnbook.resources` reads (the routes check installs a wheel)."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = data["tool"]["setuptools"]["package-data"]["lnbook"]
    assert resources.CLAIMS in shipped and f"{resources.BENCHMARK_RESULTS}/*.json" in shipped
    assert f"{resources.BENCHMARK_RESULTS}/*/*.json" in shipped  # another machine's folder
    assert "pyyaml" in " ".join(data["project"]["dependencies"])  # claims.yml is YAML


def test_benchmark_headlines_are_the_medians_of_the_stored_ratios():
    """Golden values from a hand-made set of results: medians over shapes and MLP cases (the
    reader's rows, from before its hand-batched copies went, do not count)."""
    res = {
        "layernorm": {"results": [{"ratio_to_torch": {"autograd": a, "torch": t}}
                                  for a, t in ((4.0, 1.0), (3.0, 0.9), (5.0, 1.3))]},
        "rmsnorm": {"median_ratio_rms_to_ln": {"lnbook": 1.25, "torch": 0.5}},
        "lstm": {"rows": [{"B": 32, "hidden": 256, "ratio_ln_lstm_vs_torch": 1.8}]},
        "stack": {"results": [{"case": "mnist MLP, layer, batch 4", "ratio": 3.0},
                              {"case": "mnist MLP, none, batch 4", "ratio": 2.0},
                              {"case": "attentive reader, lstm", "ratio": 9.0}]},
        "seeds": {"results": [{"speedup": 2.5}]},
    }
    assert resources.benchmark_headlines(res) == {
        'impl="autograd" (hand-derived backward) / torch': 4.0, 'impl="torch" / torch': 1.0,
        "lnbook: RMSNorm / LayerNorm": 1.25, "torch: RMSNorm / LayerNorm": 0.5,
        "LN-LSTM / torch LSTM, B=32, H=256": 1.8,
        "engine Stack / hand-batched MLP seeds": 2.5, "10 seeds: one at a time / together": 2.5}
    stored = resources.benchmark_headlines(resources.benchmark_results())
    assert stored["10 seeds: one at a time / together"] > 1  # the stored files have each field
