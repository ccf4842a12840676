"""How long a chapter takes to work through, estimated from its text: the reading times of the
introduction's tables.

The method, stated once: a chapter takes its words of prose at 200 words a minute, plus
10 minutes for each exercise. Prose is the text of the notebook's markdown cells without code
(fenced or indented code blocks), display equations (``$$ ... $$``), directive options
(``:class: dropdown``) and HTML comments; an inline formula ``$...$`` counts as one word. An
exercise is a numbered heading, bold lead or admonition title ``Exercise N.n`` (the book's
numbering; ``Exercise S.n`` in the supplement), counted once however often the chapter refers
to it. The time to run the code is left out: a chapter runs in under a minute.

Only the standard library is used, so that the book's build can call it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WORDS_PER_MINUTE", "MINUTES_PER_EXERCISE", "Pace", "prose", "prose_words",
           "exercise_labels", "reading_minutes", "pace", "reading_table"]

WORDS_PER_MINUTE = 200
MINUTES_PER_EXERCISE = 10

# "Exercise 3.1", "Exercise 6.1.2", the supplement's "Exercise S.1" (and a bare "Exercise 1")
# where an exercise starts: a heading, a bold lead or the title of an admonition
EXERCISE = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]+|\*\*|(?:`{3,}|:{3,})\{admonition\}[ \t]+)"
    r"Exercise[ \t]+((?:S\.)?\d+(?:\.\d+)*)", re.M)
_FENCE = re.compile(r"^[ \t]*(`{3,}|:{3,})[ \t]*(\S*)(.*)$")
_CODE_DIRECTIVES = {"{code-cell}", "{code-block}", "{code}", "{sourcecode}",
                    "{eval-rst}", "{bibliography}", "{math}"}
_WORD = re.compile(r"[^\W_]+(?:['’.-][^\W_]+)*")


def _markdown_cells(path: str | Path) -> list[str]:
    """The source of every markdown cell of a notebook, or the text of a ``.md`` page."""
    path = Path(path)
    if path.suffix == ".md":
        return [path.read_text(encoding="utf-8")]
    if path.suffix != ".ipynb":
        raise ValueError(f"expected a notebook (.ipynb) or a MyST page (.md), got {path}")
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "markdown"]


def prose(markdown: str) -> str:
    """``markdown`` without code blocks, display equations, directive options and comments;
    each inline formula is replaced by one word, and a directive's title is kept."""
    text = re.sub(r"<!--.*?-->", " ", markdown, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    kept: list[str] = []
    stack: list[tuple[str, bool]] = []  # open fences: (marker, is code)
    for line in text.splitlines():
        fence = _FENCE.match(line)
        in_code = any(code for _, code in stack)
        if fence:
            marker, name, rest = fence.groups()
            if stack and marker[0] == stack[-1][0][0] and len(marker) >= len(stack[-1][0]) \
                    and not name and not rest.strip():
                stack.pop()
                continue
            if not in_code:
                is_code = not name.startswith("{") or name in _CODE_DIRECTIVES
                stack.append((marker, is_code))
                if not is_code:
                    kept.append(rest)  # a directive's title, e.g. "Exercise 7.1"
                continue
        if in_code or re.match(r"^[ \t]*:[\w-]+:", line) or re.match(r"^( {4}|\t)", line):
            continue
        kept.append(line)
    return re.sub(r"\$[^$]+\$", " formula ", "\n".join(kept))


def prose_words(path: str | Path) -> int:
    """The number of words of prose in a chapter (see :func:`prose`)."""
    return sum(len(_WORD.findall(prose(cell))) for cell in _markdown_cells(path))


def exercise_labels(path: str | Path) -> list[str]:
    """The exercises of a chapter by their numbers ("3.1", "6.1.2"), in order, each once."""
    labels: list[str] = []
    for cell in _markdown_cells(path):
        labels += [m for m in EXERCISE.findall(cell) if m not in labels]
    return labels


@dataclass(frozen=True)
class Pace:
    """A chapter's words of prose, its exercises and the minutes they take."""

    words: int
    exercises: int

    @property
    def minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE + MINUTES_PER_EXERCISE * self.exercises


def pace(path: str | Path) -> Pace:
    """The words and exercises of the chapter at ``path`` (a notebook or a ``.md`` page)."""
    return Pace(prose_words(path), len(exercise_labels(path)))


def reading_minutes(notebook_path: str | Path) -> float:
    """Minutes to work through a chapter: its words of prose at :data:`WORDS_PER_MINUTE`
    plus :data:`MINUTES_PER_EXERCISE` for each exercise.

    Example::

        >>> round(reading_minutes("book/03_layer_norm.ipynb"))  # doctest: +SKIP
        95
    """
    return pace(notebook_path).minutes


def _duration(minutes: float) -> str:
    """Minutes rounded to the nearest 5 (at least 5), written as "45 min" or "2 h 15 min"."""
    m = max(5, 5 * math.floor(minutes / 5 + 0.5))
    return f"{m} min" if m < 60 else f"{m // 60} h" + (f" {m % 60} min" if m % 60 else "")


def reading_table(book: str | Path, rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of reading times: one row per ``(name, what it teaches)``, where
    ``name`` is a document of ``book`` without its suffix, then a row with the totals.
    Times are rounded to 5 minutes; the total is the sum before rounding."""
    book = Path(book)
    lines = ["| | chapter | what it teaches | words | exercises | time |",
             "|---|---|---|---|---|---|"]
    total = Pace(0, 0)
    for i, (name, teaches) in enumerate(rows, 1):
        found = [p for p in (book / f"{name}.ipynb", book / f"{name}.md") if p.exists()]
        if not found:
            raise FileNotFoundError(f"no chapter {name!r} (.ipynb or .md) in {book}")
        p = pace(found[0])
        total = Pace(total.words + p.words, total.exercises + p.exercises)
        cell = " ".join(str(teaches).split()).replace("|", "\\|")
        lines.append(f"| {i} | {{doc}}`{name}` | {cell} | {p.words:,} | {p.exercises} | "
                     f"{_duration(p.minutes)} |")
    if len(lines) == 2:
        raise ValueError("expected at least one chapter")
    lines.append(f"| | **all** | | {total.words:,} | {total.exercises} | "
                 f"**{_duration(total.minutes)}** |")
    return "\n".join(lines)
