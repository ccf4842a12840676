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

from lnbook.pacing import exercise_labels

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
