"""How every chapter shows its numbers: :class:`Table` (Markdown in a notebook, columns in a
terminal) and :func:`glue`, which hands a value to the chapter's prose."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Table", "glue"]

# the MIME prefix under which MyST-NB finds a glued value that is not shown in the cell
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value: Any, display: bool = True) -> None:
    """Hand ``value`` to the page's prose as ``name`` (MyST's ``glue:text`` role): the output
    ``myst_nb.glue`` writes (under ``GLUE_PREFIX`` when ``display=False``), without importing
    MyST-NB's Sphinx extension into the kernel (about 1.4 s of CPU per chapter). A NumPy or
    torch scalar is glued as the Python number it holds: its text is then ``0.25``, not
    ``np.float64(0.25)``, which a format such as ``{glue:text}`name:.2f``` could not read."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display as show

    if type(value).__module__ in ("numpy", "torch") and getattr(value, "ndim", None) == 0:
        value = value.item()  # a 0-d array, NumPy scalar or 0-d tensor: its Python number
    data, metadata = format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    show({prefix + k: v for k, v in data.items()}, raw=True, metadata=metadata)


class Table:
    """Rows of text (``header``, ``rows`` of cells shown with ``str``, an optional
    ``caption``) shown as a Markdown table in a notebook and aligned columns in a terminal.

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
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        md = [line(self.header), "|" + "---|" * len(self.header), *map(line, self.rows)]
        return "\n".join(md + ([f"\n*{self.caption}*"] if self.caption else []))
