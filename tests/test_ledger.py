"""The claims ledger: records written by the chapters, and their agreement with claims.yml.

The first half tests :mod:`lnbook.ledger` itself. The second half checks the book: every claim
of ``book/claims.yml`` has a record from the last build (``_build/ledger``, written while
``python3 dev.py book`` executed the chapters), its status equals the verdict the chapter
computed, its ``seen`` sentence types no figure and names only recorded ones, and its ``where``
is a heading of its chapter with an asserting cell under it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest
import yaml

from lnbook import ledger

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CLAIMS = yaml.safe_load((BOOK / "claims.yml").read_text())["claims"]
RECORDS = Path(os.environ.get("LNBOOK_LEDGER", ROOT / "_build" / "ledger"))


# --- lnbook.ledger --------------------------------------------------------------------------


@pytest.fixture
def ledger_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LNBOOK_LEDGER", str(tmp_path))
    return tmp_path


def test_record_writes_json_and_rounds(ledger_env):
    rec = ledger.record("C17", "partially reproduced",
                        {"ln_area": [0.123456, 0.2], "seeds": 3, "faster": True,
                         "nan_seen": float("nan")}, note="LN {ln_area}")
    on_disk = json.loads((ledger_env / "C17.json").read_text())
    assert on_disk["verdict"] == "partially reproduced"
    assert on_disk["figures"] == {"ln_area": [0.1235, 0.2], "seeds": 3, "faster": True,
                                  "nan_seen": "nan"}
    assert ledger.load_records(ledger_env)["C17"] == ledger.ClaimRecord.from_dict(on_disk)
    md = rec._repr_markdown_()
    assert "partially reproduced" in md and "| `seeds` | 3 |" in md and "LN 0.123/0.2" in md


def test_record_accepts_numpy_and_torch(ledger_env):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    rec = ledger.record("P03", "explained", {"gap": np.float64(1e-17), "per_seed":
                                             torch.tensor([1.0, 2.0])})
    assert rec.figures == {"gap": 1e-17, "per_seed": [1.0, 2.0]}


@pytest.mark.parametrize("args, message", [
    (("C7", "reproduced", {"a": 1}), "look like"),
    (("C07", "confirmed", {"a": 1}), "verdict must be one of"),
    (("C07", "reproduced", {}), "none given"),
    (("C07", "reproduced", {"A b": 1}), "lower-case identifiers"),
    (("C07", "reproduced", {"a": object()}), "number, a short string"),
    (("C07", "reproduced", {"a": "x" * 200}), "short labels"),
])
def test_record_rejects_bad_input(ledger_env, args, message):
    with pytest.raises(ValueError, match=message):
        ledger.record(*args)
    assert not list(ledger_env.iterdir())


def test_record_note_must_name_recorded_figures(ledger_env):
    with pytest.raises(KeyError, match="names no recorded figure"):
        ledger.record("C01", "reproduced", {"a": 1.0}, note="{b}")


def test_verdict_from_parts():
    assert ledger.verdict_from({"x": True, "y": True}) == "reproduced"
    assert ledger.verdict_from({"x": True, "y": False}) == "partially reproduced"
    assert ledger.verdict_from({"x": False}) == "not reproduced"
    with pytest.raises(ValueError):
        ledger.verdict_from({})


def test_format_seen():
    figs = {"ln": [0.4781, 0.404], "bn": 0.3333, "k": 3, "ok": False, "tiny": 2.2e-16}
    assert ledger.format_seen("LN {ln} vs BN {bn:.1f}", figs) == "LN 0.478/0.404 vs BN 0.3"
    assert ledger.format_seen("{k} seeds, {ok}, {tiny:.1e}", figs) == "3 seeds, no, 2.2e-16"


def test_ledger_dir_finds_the_book(tmp_path, monkeypatch):
    monkeypatch.delenv("LNBOOK_LEDGER", raising=False)
    (tmp_path / "_toc.yml").write_text("root: x\n")
    (tmp_path / "book").mkdir()
    assert ledger.ledger_dir(tmp_path / "book") == tmp_path / "_build" / "ledger"
    elsewhere = tmp_path.parent / "no-book-here"
    elsewhere.mkdir(exist_ok=True)
    assert ledger.ledger_dir(elsewhere) is None or "_build" in str(ledger.ledger_dir(elsewhere))
    monkeypatch.setenv("LNBOOK_LEDGER", "/some/where")
    assert ledger.ledger_dir() == Path("/some/where")


# --- the book's ledger ----------------------------------------------------------------------


def _records() -> dict[str, ledger.ClaimRecord]:
    recs = ledger.load_records(RECORDS)
    if not recs:
        pytest.fail(f"no claim records in {RECORDS}: they are written while the chapters "
                    "execute; build the book first (python3 dev.py book)")
    return recs


def _heading_level_and_text(line: str) -> tuple[int, str] | None:
    m = re.match(r"^(#+)\s+(.+?)\s*$", line)
    return (len(m.group(1)), m.group(2)) if m else None


def asserting_cells_under(chapter: str, where: str) -> list[str]:
    """The code cells between heading ``where`` and the next heading of its level or above."""
    nb = nbformat.read(BOOK / f"{chapter}.ipynb", as_version=4)
    level, cells = None, []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                h = _heading_level_and_text(line)
                if h is None:
                    continue
                if level is None and h[1] == where:
                    level = h[0]
                elif level is not None and h[0] <= level:
                    return cells
        elif level is not None:
            cells.append(cell.source)
    return cells


CLAIM_IDS = [c["id"] for c in CLAIMS]


def test_claim_ids_are_the_papers_and_part_twos():
    paper = [i for i in CLAIM_IDS if i.startswith("C")]
    assert paper == [f"C{i:02d}" for i in range(1, 23)]
    later = [i for i in CLAIM_IDS if i.startswith("P")]
    assert later == sorted(set(later)) and all(1 <= int(i[1:]) <= 14 for i in later)


@pytest.mark.parametrize("row", CLAIMS, ids=lambda r: r["id"])
def test_row_is_written_by_a_person_with_no_typed_figures(row):
    for field in ("section", "claim", "status", "chapter", "where", "seen"):
        assert str(row.get(field, "")).strip(), f"{row['id']}: field {field!r} is empty"
    assert row["status"] in ledger.VERDICTS
    outside = re.sub(r"\{[^{}]*\}", "", str(row["seen"]))
    assert not re.search(r"\d", outside), (
        f"{row['id']}: 'seen' types a figure by hand ({outside!r}); name a recorded figure "
        "as {placeholder} instead")


@pytest.mark.parametrize("row", CLAIMS, ids=lambda r: r["id"])
def test_where_has_an_asserting_cell_and_the_chapter_records(row):
    path = BOOK / f"{row['chapter']}.ipynb"
    assert path.exists(), f"{row['id']}: no notebook {path.name}"
    cells = asserting_cells_under(row["chapter"], " ".join(str(row["where"]).split()))
    assert cells, f"{row['id']}: no heading {row['where']!r} with code under it in {path.name}"
    assert any(re.search(r"^\s*assert\b", c, re.M) for c in cells), (
        f"{row['id']}: no cell under {row['where']!r} in {path.name} asserts anything")
    text = path.read_text()
    assert re.search(rf"record\(\\?[\"']{row['id']}\\?[\"']", text), (
        f"{row['id']}: {path.name} never calls lnbook.ledger.record({row['id']!r}, ...)")


@pytest.mark.parametrize("row", CLAIMS, ids=lambda r: r["id"])
def test_record_exists_and_agrees_with_the_status(row):
    rec = _records().get(row["id"])
    assert rec is not None, (
        f"{row['id']}: no record in {RECORDS}; {row['chapter']} must call "
        f"lnbook.ledger.record({row['id']!r}, verdict, figures) while it executes")
    assert rec.figures, f"{row['id']}: the record holds no figures"
    assert rec.verdict == row["status"], (
        f"{row['id']}: claims.yml says {row['status']!r} but {row['chapter']} computed "
        f"{rec.verdict!r} from its runs; the runs decide: update claims.yml and the chapter's "
        "text, never the seeds or thresholds")
    ledger.format_seen(" ".join(str(row["seen"]).split()), rec.figures)  # names exist
