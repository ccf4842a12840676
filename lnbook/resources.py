"""The files a chapter reads at run time, shipped inside the package: the claims' decision
rules (``lnbook/claims.yml``) and the stored results of the benchmarks
(``lnbook/benchmark_results/*.json``, written by the scripts of ``benchmarks/``).

They are read with :mod:`importlib.resources`, so a chapter finds them wherever lnbook is
installed: in the book's checkout, on Colab or Binder, or in a reader's empty folder.
"""

from __future__ import annotations

import json
import re
import statistics
from importlib import resources
from typing import Any

__all__ = ["BENCHMARK_RESULTS", "CLAIMS", "LAYER_NORM_LABELS", "benchmark_headlines",
           "benchmark_machines", "benchmark_result", "benchmark_results", "claims_text"]

#: The claims' rules, paraphrases and statuses, in the package folder.
CLAIMS = "claims.yml"
#: The folder of the package that holds one ``NAME.json`` per benchmark script.
BENCHMARK_RESULTS = "benchmark_results"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: What ``benchmarks/bench_layernorm.py`` times against ``F.layer_norm``, by its key there.
LAYER_NORM_LABELS = {"autograd": 'impl="autograd" (hand-derived backward)',
                     "torch": 'impl="torch"',
                     "compiled_plain": "torch.compile of the plain four-line layer norm",
                     "compiled_autograd": "torch.compile(lnbook.layer_norm)"}


def _package() -> Any:
    return resources.files("lnbook")


def claims_text() -> str:
    """The text of ``claims.yml`` as the installed package holds it."""
    return _package().joinpath(CLAIMS).read_text(encoding="utf-8")


def _folder(machine: str | None) -> Any:
    """The folder of the stored results: the book's machine (None), or one named machine's."""
    folder = _package().joinpath(BENCHMARK_RESULTS)
    if machine is None:
        return folder
    if not isinstance(machine, str):
        raise TypeError(f"machine must be None or a str such as 'h200', got "
                        f"{type(machine).__name__}")
    if not _NAME.match(machine) or not folder.joinpath(machine).is_dir():
        raise ValueError(f"machine must be one whose results are stored: {benchmark_machines()}"
                         f", or None for the book's own; got {machine!r}")
    return folder.joinpath(machine)


def benchmark_machines() -> list[str]:
    """The other machines whose benchmark results are stored, each in a folder of its own
    (``benchmark_results/h200/`` for one NVIDIA H200), sorted."""
    folder = _package().joinpath(BENCHMARK_RESULTS)
    if not folder.is_dir():
        return []
    return sorted(f.name for f in folder.iterdir() if f.is_dir() and _NAME.match(f.name))


def benchmark_results(machine: str | None = None) -> dict[str, dict[str, Any]]:
    """Every stored benchmark result, by name (``"layernorm"``, ``"lstm"``, ``"rmsnorm"``,
    ``"seeds"``, ``"stack"``): the JSON its script in ``benchmarks/`` last wrote, sorted by
    name. ``machine``: None for the runs the book shows first, or one of
    :func:`benchmark_machines` (``"h200"``) for that machine's.

    Example::

        >>> sorted(benchmark_results())
        ['layernorm', 'lstm', 'rmsnorm', 'seeds', 'stack']

    Raises:
        TypeError: ``machine`` is neither None nor a string.
        ValueError: no results of that machine are stored; the message names those that are.
    """
    folder = _folder(machine)
    if not folder.is_dir():
        return {}
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".json")),
                   key=lambda f: f.name)
    return {f.name.removesuffix(".json"): json.loads(f.read_text(encoding="utf-8"))
            for f in files}


def benchmark_result(name: str, machine: str | None = None) -> dict[str, Any]:
    """The stored result of one benchmark (``"rmsnorm"`` for ``benchmarks/bench_rmsnorm.py``),
    of the book's machine or of ``machine`` (see :func:`benchmark_results`).

    Raises:
        TypeError: ``name`` is not a string, or ``machine`` neither None nor one.
        ValueError: ``name`` is not a lower-case name (such as ``"rmsnorm"``), or no results
            of ``machine`` are stored.
        FileNotFoundError: no result of that name is stored; the message names those that are.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str such as 'rmsnorm', got {type(name).__name__}")
    if not _NAME.match(name):
        raise ValueError(f"name must be a benchmark's lower-case name such as 'rmsnorm', "
                         f"got {name!r}")
    path = _folder(machine).joinpath(f"{name}.json")
    if not path.is_file():
        raise FileNotFoundError(
            f"no stored benchmark result {name!r}; stored: {sorted(benchmark_results(machine))} "
            f"(run benchmarks/bench_{name}.py in the book's checkout to make it)")
    return json.loads(path.read_text(encoding="utf-8"))


def benchmark_headlines(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each stored benchmark's headline time ratios, by a label that says what is divided by
    what, from :func:`benchmark_results` of one machine: layer norm's implementations against
    ``F.layer_norm`` and the engine's Stack against the hand-batched MLP copies (medians over
    shapes or cases), RMSNorm against LayerNorm (each library's median), the LN-LSTM against
    torch's LSTM (per size) and ten seeds trained one at a time against together.

    Raises:
        KeyError: one of those five benchmarks (or a field the scripts write) is missing.
    """
    med = statistics.median
    ln = results["layernorm"]["results"]
    out = {f"{label} / torch": med(r["ratio_to_torch"][k] for r in ln)
           for k, label in LAYER_NORM_LABELS.items()
           if all(k in r["ratio_to_torch"] for r in ln)}
    for lib, ratio in results["rmsnorm"]["median_ratio_rms_to_ln"].items():
        out[f"{lib}: RMSNorm / LayerNorm"] = ratio
    for r in results["lstm"]["rows"]:
        out[f"LN-LSTM / torch LSTM, B={r['B']}, H={r['hidden']}"] = r["ratio_ln_lstm_vs_torch"]
    mlp = [r["ratio"] for r in results["stack"]["results"] if r["case"].startswith("mnist MLP")]
    out["engine Stack / hand-batched MLP seeds"] = med(mlp)
    out["10 seeds: one at a time / together"] = results["seeds"]["results"][0]["speedup"]
    return out
