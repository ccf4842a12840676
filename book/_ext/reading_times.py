"""The reading-time tables of the introduction, computed from the chapters when the book is built.

``book/intro.md`` lists the chapters of a track in a ``{reading-times}`` directive, one line
each, ``name | what it teaches``::

    ```{reading-times}
    01_introduction | what normalization is for
    02_background | batch normalization built from its equations
    ```

and the directive writes the table of :func:`lnbook.pacing.reading_table`: each chapter's words
of prose, its exercises and its time (words / 200 per minute + 10 minutes per exercise), then
the totals. The page is rebuilt when a chapter it lists changes.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from lnbook.pacing import reading_table


def parse_rows(lines: list[str]) -> list[tuple[str, str]]:
    """``name | what it teaches`` lines (blank lines skipped) as ``(name, teaches)`` pairs."""
    rows = []
    for line in lines:
        if not line.strip():
            continue
        name, sep, teaches = line.partition("|")
        if not sep or not name.strip():
            raise ValueError(f"expected 'name | what it teaches', got {line!r}")
        rows.append((name.strip(), teaches.strip()))
    return rows


class ReadingTimes(SphinxDirective):
    has_content = True

    def run(self) -> list[nodes.Node]:
        book = Path(self.env.srcdir) / "book"
        rows = parse_rows(list(self.content))
        for name, _ in rows:
            for path in (book / f"{name}.ipynb", book / f"{name}.md"):
                if path.exists():
                    self.env.note_dependency(str(path))
        return self.parse_text_to_nodes(reading_table(book, rows))


def setup(app):
    app.add_directive("reading-times", ReadingTimes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
