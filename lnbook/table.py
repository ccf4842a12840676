"""A small table of text that every chapter prints: Markdown in a notebook, columns in a terminal.

All the chapters show their numbers this way, those that run no experiment too, so it lives at
the top of the package: ``from lnbook import Table``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Table"]


class Table:
    """Rows of text shown as a Markdown table in a notebook and aligned columns in a terminal.

    Args:
        header: the column names.
        rows: one sequence of cells per row (each cell shown with ``str``), as long as
            ``header``.
        caption: a line shown under the table, or None.

    Example::

        >>> print(Table(["norm", "error"], [["layer", 0.031], ["none", 0.042]]))
        norm   error
        -----  -----
        layer  0.031
        none   0.042
    """

    def __init__(self, header: Sequence[str], rows: Iterable[Sequence[Any]],
                 caption: str | None = None) -> None:
        self.header = [str(h) for h in header]
        self.rows = [[str(c) for c in row] for row in rows]
        self.caption = caption

    def __str__(self) -> str:
        cols = list(zip(self.header, *self.rows, strict=True))
        widths = [max(len(c) for c in col) for col in cols]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                 for row in [self.header, *self.rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines + ([f"({self.caption})"] if self.caption else []))

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        def esc(s: str) -> str:
            return s.replace("|", "\\|")

        md = ["| " + " | ".join(esc(h) for h in self.header) + " |",
              "|" + "---|" * len(self.header)]
        md += ["| " + " | ".join(esc(c) for c in row) + " |" for row in self.rows]
        return "\n".join(md + ([f"\n*{self.caption}*"] if self.caption else []))
