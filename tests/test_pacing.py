"""`lnbook.pacing`: a chapter's time is its words of prose at 200 a minute plus 10 minutes an
exercise, with words and exercises counted from the notebook itself."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from lnbook import pacing

BOOK = Path(__file__).resolve().parents[1] / "book"


def write_notebook(path: Path, *markdown: str, code: str = "x = 1") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(m) for m in markdown]
    nb.cells.append(nbformat.v4.new_code_cell(code))
    nbformat.write(nb, path)
    return path


def test_words_are_prose_only(tmp_path):
    text = ("# One two\n\nthree four five $a + b = c$ six.\n\n$$\nx = y + z\n$$\n\n"
            "```python\nnot counted at all\n```\n\n```{admonition} Exercise 9.1\n"
            ":class: dropdown\nseven eight\n```\n\n    indented code here\n<!-- no -->")
    nb = write_notebook(tmp_path / "a.ipynb", text, code="words in code do not count")
    # one two three four five (formula) six Exercise 9.1 seven eight
    assert pacing.prose_words(nb) == 11


def test_exercises_counted_once_by_their_numbers(tmp_path):
    nb = write_notebook(
        tmp_path / "b.ipynb",
        "## Exercises\n\n**Exercise 4.1 (by hand).** Do it.\n\nSee Exercise 4.1 again.",
        "```{admonition} Exercise 4.2\nDo that.\n```\n\n```{admonition} Solution\n"
        ":class: dropdown\nIt is done, as in Exercise 4.2.\n```",
        "### Exercise 4.3: a heading\n\nThird.",
        "```{admonition} Exercise S.1\nThe supplement's.\n```\n\n**Exercise S.** No number.")
    assert pacing.exercise_labels(nb) == ["4.1", "4.2", "4.3", "S.1"]


def test_minutes_are_words_over_200_plus_10_per_exercise(tmp_path):
    words = " ".join(["word"] * 400)
    nb = write_notebook(tmp_path / "c.ipynb", words, "**Exercise 1.1.** " + words)
    p = pacing.pace(nb)
    assert (p.words, p.exercises) == (802, 1)  # 800 words, "Exercise 1.1"
    assert pacing.reading_minutes(nb) == pytest.approx(802 / 200 + 10)


def test_chapter_3_estimate_comes_from_its_words_and_exercises():
    """Counted another way: every whitespace-separated token of the markdown cells, and every
    "Exercise 3.n" heading; the estimate must be within 25 % of words/200 + 10 per exercise."""
    path = BOOK / "03_layer_norm.ipynb"
    nb = nbformat.read(path, as_version=4)
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    raw_words = sum(len(m.split()) for m in md)
    title = re.compile(r"^`+\{admonition\} Exercise (3\.\d)\b", re.M)
    exercises = {x for m in md for x in title.findall(m)}
    assert len(exercises) >= 3
    expected = raw_words / 200 + 10 * len(exercises)
    minutes = pacing.reading_minutes(path)
    assert abs(minutes - expected) <= 0.25 * expected, (minutes, expected)
    assert pacing.pace(path).exercises == len(exercises)


def test_reading_table_rows_and_total(tmp_path):
    write_notebook(tmp_path / "one.ipynb", " ".join(["w"] * 1000), "**Exercise 1.1.** x")
    (tmp_path / "two.md").write_text(" ".join(["w"] * 2000))
    table = pacing.reading_table(tmp_path, [("one", "first"), ("two", "second")])
    lines = table.splitlines()
    assert lines[2] == "| 1 | {doc}`one` | first | 1,003 | 1 | 15 min |"  # 15.015 min
    assert lines[3] == "| 2 | {doc}`two` | second | 2,000 | 0 | 10 min |"
    assert lines[4] == "| | **all** | | 3,003 | 1 | **25 min** |"
    piped = pacing.reading_table(tmp_path, [("two", "a | b")]).splitlines()[2]
    assert piped == "| 1 | {doc}`two` | a \\| b | 2,000 | 0 | 10 min |"
    many = pacing.reading_table(tmp_path, [("one", "a")] * 9).splitlines()[-1]
    assert many.endswith("| 9,027 | 9 | **2 h 15 min** |")  # 135.1 min
    with pytest.raises(FileNotFoundError, match="no chapter 'three'"):
        pacing.reading_table(tmp_path, [("three", "x")])
    with pytest.raises(ValueError, match="at least one chapter"):
        pacing.reading_table(tmp_path, [])


def load_reading_times():
    """`book/_ext/reading_times.py`, the Sphinx directive that writes the intro's tables."""
    spec = importlib.util.spec_from_file_location("reading_times",
                                                  BOOK / "_ext" / "reading_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_intro_times_are_computed_from_every_chapter():
    intro = (BOOK / "intro.md").read_text()
    blocks = re.findall(r"^```\{reading-times\}\n(.*?)^```", intro, flags=re.S | re.M)
    parse_rows = load_reading_times().parse_rows
    listed = [name for b in blocks for name, _ in parse_rows(b.splitlines())]
    chapters = sorted(p.stem for p in BOOK.glob("*.ipynb") if p.stem != "performance")
    assert sorted(listed) == chapters  # every chapter once, in one of the tables
    for b in blocks:
        rows = parse_rows(b.splitlines())
        table = pacing.reading_table(BOOK, rows).splitlines()
        assert len(table) == len(rows) + 3  # header, rule, one row each, the totals
    # the method is stated with the module's constants, and no time is typed by hand
    rest = " ".join(re.sub(r"^```\{reading-times\}\n.*?^```", "", intro,
                           flags=re.S | re.M).split())
    method = (f"words of prose at {pacing.WORDS_PER_MINUTE} words a minute, plus "
              f"{pacing.MINUTES_PER_EXERCISE} minutes for each exercise")
    assert method in rest
    rest = rest.replace(method, "").replace("rounded to 5 minutes", "")
    typed = re.findall(r"\b\d+\s*(?:min|minutes|hours?)\b|\b\w+ to \w+ hours\b", rest)
    assert not typed, typed


def test_reading_times_rows_must_name_a_chapter():
    parse_rows = load_reading_times().parse_rows
    assert parse_rows(["a | b c", "", " d |e "]) == [("a", "b c"), ("d", "e")]
    with pytest.raises(ValueError, match="expected 'name | what it teaches'"):
        parse_rows(["no separator"])
