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
    assert "pyyaml" in " ".join(data["project"]["dependencies"])  # claims.yml is YAML
