"""Checks on the book's text that need no build.

- No markdown of the book holds a control character other than a newline: in a notebook's JSON,
  a LaTeX command written with one backslash (``"$q^\\top k$"``) is read as an escape
  (``\\t``, a TAB, then ``op``) and renders as a broken formula.
- Every exercise is numbered ``Exercise <chapter>.<n>``, and no number is used twice in the book.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from lnbook.pacing import EXERCISE, exercise_labels

BOOK = Path(__file__).resolve().parents[1] / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
PAGES = sorted(BOOK.glob("*.md"))
# chapters whose exercises are still numbered 1, 2, ... (none left)
BARE_NUMBERS: set[str] = set()


def control_characters(text: str) -> list[str]:
    """The control characters of ``text`` (Unicode category Cc), a newline excepted."""
    return [ch for ch in text if ch != "\n" and (ord(ch) < 32 or 127 <= ord(ch) < 160)]


def markdown_cells(path: Path) -> list[tuple[int, str]]:
    nb = nbformat.read(path, as_version=4)
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]


def test_control_characters_found_where_a_backslash_was_lost():
    assert control_characters(json.loads(r'"$q^\top k$"')) == ["\t"]  # the old chapter 11
    assert control_characters(json.loads(r'"$q^\\top k$ \\\\ \n"')) == []
    assert control_characters("a\rb\x0cc\x7f") == ["\r", "\x0c", "\x7f"]


@pytest.mark.parametrize("path", NOTEBOOKS + PAGES, ids=lambda p: p.name)
def test_markdown_has_no_control_characters(path):
    cells = markdown_cells(path) if path.suffix == ".ipynb" else [(0, path.read_text())]
    bad = {i: sorted(set(control_characters(s))) for i, s in cells if control_characters(s)}
    assert not bad, (f"{path.name}: control characters {bad} in markdown cells (a LaTeX "
                     "command with a single backslash in the JSON? write \\\\top, \\\\frac)")


def test_exercise_numbers_name_their_chapter_and_are_unique():
    seen: dict[str, str] = {}
    for path in NOTEBOOKS:
        chapter = re.match(r"(\d+)(?:_(\d)(?=_))?", path.stem)
        for label in exercise_labels(path):
            assert label not in seen, f"Exercise {label} in {path.name} and {seen[label]}"
            seen[label] = path.name
            if path.stem in BARE_NUMBERS or chapter is None:
                continue
            number = str(int(chapter.group(1)))
            prefix = f"{number}.{chapter.group(2)}." if chapter.group(2) else f"{number}."
            # chapter 3's own exercises are 3.n; its sections 3.1 and 3.2 are 3.1.n, 3.2.n
            assert label.startswith(prefix) and label.count(".") == prefix.count("."), (
                f"{path.name}: Exercise {label}, expected Exercise {prefix}n")


# --- the lesson first, the evidence after ----------------------------------------------------

CLAIMS_YML = Path(__file__).resolve().parents[1] / "lnbook" / "claims.yml"
EVIDENCE = re.compile(r"^## Evidence\b", re.M)
# chapters with claims whose apparatus is not yet gathered into an Evidence part
EVIDENCE_PENDING: set[str] = set()


def claims_by_chapter() -> dict[str, list[dict]]:
    import yaml

    rows = yaml.safe_load(CLAIMS_YML.read_text())
    rows = rows.get("claims", rows) if isinstance(rows, dict) else rows
    out: dict[str, list[dict]] = {}
    for row in rows:
        if isinstance(row, dict) and row.get("chapter") and row.get("where"):
            out.setdefault(str(row["chapter"]), []).append(row)
    return out


def lesson_and_evidence(path: Path) -> dict[str, int | None]:
    """Cell indices of the objectives, the first exercise, the Evidence heading, and the first
    and last cell of the claim apparatus (a rule's decision or a ledger record)."""
    nb = nbformat.read(path, as_version=4)
    found: dict[str, int | None] = dict.fromkeys(
        ("objectives", "exercise", "evidence", "apparatus_first"), None)
    for i, cell in enumerate(nb.cells):
        src = cell.source
        if cell.cell_type == "markdown":
            if found["objectives"] is None and "What you will be able to do" in src:
                found["objectives"] = i
            if found["exercise"] is None and EXERCISE.search(src):
                found["exercise"] = i
            if found["evidence"] is None and EVIDENCE.search(src):
                found["evidence"] = i
        elif found["apparatus_first"] is None and re.search(
                r"ledger\.(decide_claim|record)\(", src):
            found["apparatus_first"] = i
    return found


def heading_cell(path: Path, text: str) -> int | None:
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and any(
                re.match(r"^#+\s+(.+?)\s*$", line) and
                re.match(r"^#+\s+(.+?)\s*$", line).group(1) == text
                for line in cell.source.splitlines()):
            return i
    return None


def test_lesson_order_is_read_from_the_cells(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 9 X\n\n**What you will be able to do**"),
                nbformat.v4.new_code_cell("d = ledger.decide_claim('C01', {})"),
                nbformat.v4.new_markdown_cell("```{admonition} Exercise 9.1\nQ\n```"),
                nbformat.v4.new_markdown_cell("## Evidence: the claim of chapter 9")]
    path = tmp_path / "09_x.ipynb"
    nbformat.write(nb, path)
    assert lesson_and_evidence(path) == {
        "objectives": 0, "exercise": 2, "evidence": 3, "apparatus_first": 1}
    assert heading_cell(path, "Evidence: the claim of chapter 9") == 3


@pytest.mark.parametrize("chapter", sorted(set(claims_by_chapter()) - EVIDENCE_PENDING))
def test_evidence_part_comes_after_the_lesson(chapter):
    """A chapter with claims teaches first: its objectives, its lesson and its first exercise
    come before one part headed "## Evidence ...", which holds every claim's decision and
    record. (A claim's `where` may stay in the lesson when the cell that asserts its measurement
    teaches; the decision that turns it into a verdict is in the Evidence part.)"""
    path = BOOK / f"{chapter}.ipynb"
    if not path.exists():
        pytest.skip(f"{chapter} is not in this checkout")
    at = lesson_and_evidence(path)
    assert at["evidence"] is not None, f"{chapter}: no '## Evidence ...' heading"
    for part in ("objectives", "exercise"):
        assert at[part] is not None and at[part] < at["evidence"], (
            f"{chapter}: the Evidence part must come after the lesson's {part}")
    assert at["apparatus_first"] is None or at["apparatus_first"] > at["evidence"], (
        f"{chapter}: a claim decision or record (cell {at['apparatus_first']}) comes before "
        "the Evidence part")


def test_pending_chapters_exist_and_lack_an_evidence_part():
    """A chapter leaves EVIDENCE_PENDING as soon as it has its Evidence part."""
    for chapter in EVIDENCE_PENDING:
        path = BOOK / f"{chapter}.ipynb"
        if path.exists():
            assert lesson_and_evidence(path)["evidence"] is None, (
                f"{chapter} has an Evidence part: take it out of EVIDENCE_PENDING")


GATE = "seed_set() != 0 or"


def majority_helpers(source: str) -> set[str]:
    """The functions a notebook defines that compare a count of seeds with a majority constant
    without the gate ``seed_set() != 0 or`` (an assert on their result holds on every set)."""
    names = set()
    for m in re.finditer(r"^def (\w+)\(.*?(?=^\S|\Z)", source, flags=re.M | re.S):
        if re.search(r"\b\w*MAJORITY\b", m.group(0)) and GATE not in m.group(0):
            names.add(m.group(1))
    return names


def majority_asserts_on_every_set(source: str, helpers: set[str] = frozenset()) -> list[str]:
    """The ``assert`` lines of a code cell that compare a count of seeds with a majority
    constant (``MAJORITY``, ``LEN_MAJORITY``, ...) on every seed set, directly or through one of
    ``helpers`` (``majority_helpers``). Such a count is what the seeds drew; the chapter's text
    reads it on the book's seeds, so the assert holds there only (``assert seed_set() != 0 or
    ...``, or a helper that returns ``seed_set() != 0 or ...``), and on another set the chapter
    goes on to its records.
    """
    counts = r"\b\w*MAJORITY\b" + "".join(rf"|\b{re.escape(h)}\(" for h in sorted(helpers))
    return [line.strip() for line in source.splitlines()
            if re.match(r"\s*assert\b", line) and re.search(counts, line)
            and GATE not in line]


def test_majority_asserts_found_where_a_seed_set_would_stop_the_chapter():
    cell = ("n = count(a > b)\nassert n >= MAJORITY\n"
            "assert seed_set() != 0 or n >= LEN_MAJORITY  # set 0\nassert same < 1e-5\n")
    assert majority_asserts_on_every_set(cell) == ["assert n >= MAJORITY"]


def test_majority_helpers_found_unless_they_carry_the_gate():
    cell = ("def holds(mask):  # a count\n    return int(np.sum(mask)) >= MAJORITY\n\n\n"
            "def fails(mask):\n    return seed_set() != 0 or np.sum(mask) < MAJORITY\n\n\n"
            "def spread(a):\n    return np.median(a)\n\n\n"
            "assert holds(a > b)\nassert fails(a > b)\nassert spread(a) > 0\n")
    helpers = majority_helpers(cell)
    assert helpers == {"holds"}
    assert majority_asserts_on_every_set(cell, helpers) == ["assert holds(a > b)"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_majority_assert_on_every_seed_set(path):
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    helpers = majority_helpers("\n\n".join(code))
    found = [line for cell in code for line in majority_asserts_on_every_set(cell, helpers)]
    assert not found, f"{path.name}: write these as assert seed_set() != 0 or ...: {found}"
