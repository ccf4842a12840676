"""Checks on the book's sources that need no build: the claims ledger, the notebooks, the toc.

- every row of `book/claims.yml` points at a chapter in `_toc.yml`, and so do the reader
  questions (the ledger's records and verdicts are checked in `test_ledger.py`).
- Every notebook in `book/` is committed without outputs or execution counts, starts with the
  Colab cell of CONTRIBUTING.md (tagged `remove-input`) and is listed in `_toc.yml`.
- Every equation label `(eq-N)=` is defined once, and every `{ref}` to one and every `{cite}` key
  has a target.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
LEDGER = BOOK / "claims.yml"
TOC = ROOT / "_toc.yml"

COLAB_CELL = """\
# On Google Colab, install lnbook first; anywhere else this cell does nothing.
import sys
if "google.colab" in sys.modules:
    %pip install -q git+https://github.com/lnbook/lnbook"""


def toc_files() -> list[str]:
    """Every document of `_toc.yml` as a path relative to the repository root, without suffix."""
    toc = yaml.safe_load(TOC.read_text())
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(f).with_suffix("")) if Path(f).suffix in {".md", ".ipynb"} else f
            for f in files]


def load_ledger() -> dict:
    return yaml.safe_load(LEDGER.read_text())


NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
SOURCES = sorted(BOOK.glob("*.md")) + NOTEBOOKS


def markdown_text(path: Path) -> str:
    """The markdown of a MyST page, or of all markdown cells of a notebook."""
    if path.suffix == ".md":
        return path.read_text()
    nb = nbformat.read(path, as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


# --- the claims ledger ---------------------------------------------------------------------


@pytest.mark.parametrize("row", load_ledger()["claims"], ids=lambda r: r["id"])
def test_ledger_row_points_at_a_chapter_of_the_book(row):
    """The rest of the ledger's checks (records, verdicts, headings) are in test_ledger.py."""
    assert f"book/{row['chapter']}" in toc_files(), (
        f"{row['id']}: chapter {row['chapter']!r} is not in _toc.yml"
    )


def test_ledger_reader_questions_point_into_the_book():
    questions = load_ledger()["questions"]
    assert len(questions) == 4
    for q in questions:
        assert q["question"].strip()
        assert f"book/{q['chapter']}" in toc_files(), f"{q['chapter']!r} is not in _toc.yml"


def test_ledger_questions_name_a_heading_of_their_chapter():
    """A question's `where` is a heading that exists in the chapter (so the ledger links it)."""
    ledger = load_ledger()
    for row in ledger["questions"]:
        where = str(row.get("where", "pending")).strip()
        chapter = next(BOOK.glob(f"{row['chapter']}.*"), None)
        if where == "pending" or chapter is None:
            continue
        headings = re.findall(r"^#+\s+(.+?)\s*$", markdown_text(chapter), flags=re.M)
        assert where in headings, f"{row.get('id', 'question')}: no heading {where!r} in {chapter}"


# --- notebooks and the table of contents ---------------------------------------------------


def test_toc_documents_exist():
    for f in toc_files():
        assert (ROOT / f"{f}.ipynb").exists() or (ROOT / f"{f}.md").exists(), f"{f} is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_colab_cell(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    # blank lines are ignored: ruff's import sorting wants one after `import sys`
    source = "\n".join(line.rstrip() for line in code[0].source.splitlines() if line.strip())
    assert source == COLAB_CELL, f"{path.name}: first code cell is not the Colab cell"
    assert "remove-input" in code[0].metadata.get("tags", []), f"{path.name}: tag remove-input"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_in_toc(path):
    assert f"book/{path.stem}" in toc_files(), f"{path.name} is not in _toc.yml"


# --- cross references ----------------------------------------------------------------------


def test_equation_labels_defined_once_and_resolved():
    defined: dict[str, list[str]] = {}
    referenced: dict[str, set[str]] = {}
    for path in SOURCES:
        text = markdown_text(path)
        for label in re.findall(r"^\((eq-\d+)\)=\s*$", text, flags=re.M):
            defined.setdefault(label, []).append(path.name)
        for label in re.findall(r"<(eq-\d+)>`", text):
            referenced.setdefault(label, set()).add(path.name)
    twice = {k: v for k, v in defined.items() if len(v) > 1}
    assert not twice, f"equation labels defined more than once: {twice}"
    missing = {k: sorted(v) for k, v in referenced.items() if k not in defined}
    assert not missing, f"equation references without a target: {missing}"


def test_cite_keys_exist_in_bibliography():
    keys = set(re.findall(r"^@\w+\{([^,\s]+),", (BOOK / "references.bib").read_text(), re.M))
    for path in SOURCES:
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", markdown_text(path)):
            for key in (k.strip() for k in group.split(",")):
                assert key in keys, f"{path.name}: cite key {key!r} not in references.bib"
