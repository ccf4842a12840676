"""Printed output that fits the book's column: :func:`wrap` and :func:`pformat` make text at
most :data:`WIDTH` characters a line, and :func:`show` prints with them.

The book sets code at 13 px (``book/_static/lnbook.css``), where 88 characters fill the column
at 1280 pixels; a longer printed line scrolls sideways in its box. ``tests/test_site_links.py``
checks every printed output of the built book against :data:`WIDTH`.

Example::

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Config:
    ...     steps: int = 100
    ...     seeds: tuple[int, ...] = (0, 1, 2)
    >>> show(Config(), width=30)
    Config(steps=100,
           seeds=(0, 1, 2))
"""

from __future__ import annotations

import dataclasses
import pprint
import textwrap
from typing import Any

__all__ = ["WIDTH", "wrap", "pformat", "show"]

WIDTH = 88
"""The longest line, in characters, that fits the book's column at 1280 pixels."""

_INDENT = "  "  # the extra indent of a wrapped line's continuation


_OPEN, _CLOSE = "([{", ")]}"
_KEEP = "\x00"  # stands for a space that must not break while a line is wrapped


def _keep_groups(line: str, room: int) -> str:
    """``line`` with the spaces inside each outermost bracket group of at most ``room``
    characters (an array, a tuple, a call, a parenthesis) replaced by :data:`_KEEP`."""
    chars, stack = list(line), []
    for i, c in enumerate(line):
        if c in _OPEN:
            stack.append((c, i))
        elif c in _CLOSE and stack:
            opener, start = stack.pop()
            if _OPEN.index(opener) != _CLOSE.index(c):
                stack.clear()  # unbalanced: protect nothing that spans it
            elif not stack and i + 1 - start <= room:
                chars[start:i + 1] = [_KEEP if ch == " " else ch for ch in chars[start:i + 1]]
    return "".join(chars)


def wrap(text: str, width: int = WIDTH) -> str:
    """``text`` with every line longer than ``width`` broken at spaces; the continuation keeps
    the line's own indent plus two spaces. A bracketed group that fits on a line (an array,
    a tuple, a code expression) is not broken inside. Only white space changes (no word is
    split, so a word longer than ``width`` stays whole); lines that fit are left as they are."""
    if not isinstance(text, str):
        raise TypeError(f"wrap takes a str, got {type(text).__name__}")
    if not isinstance(width, int) or isinstance(width, bool) or width < 8:
        raise ValueError(f"width must be an int of at least 8, got {width!r}")
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip(" "))] + _INDENT
        kept = _keep_groups(line, width - len(indent))
        out.extend(part.replace(_KEEP, " ") for part in textwrap.wrap(
            kept, width, subsequent_indent=indent, break_long_words=False,
            break_on_hyphens=False, replace_whitespace=False) or [""])
    return "\n".join(out)


def _generated_repr(cls: type) -> bool:
    """Whether ``cls.__repr__`` is the one ``dataclasses.dataclass`` wrote (as pprint
    tells)."""
    wrapped = getattr(cls.__repr__, "__wrapped__", None)
    return wrapped is not None and "__create_fn__" in wrapped.__qualname__


def _fill(head: str, parts: list[str], width: int) -> str:
    """``head(part, part, ...)`` with as many parts a line as fit in ``width``; continuation
    lines are aligned under the first part."""
    pad, lines, line = " " * (len(head) + 1), [], head + "("
    for i, part in enumerate(parts):
        piece = part + (", " if i < len(parts) - 1 else ")")
        if len(line) + len(piece.rstrip()) > width and line.strip() not in (head + "(", ""):
            lines.append(line.rstrip())
            line = pad
        line += piece
    return "\n".join([*lines, line.rstrip() if parts else head + "()"])


def pformat(obj: Any, width: int = WIDTH) -> str:
    """``obj`` as text of at most ``width`` characters a line where its parts allow: a string
    wrapped with :func:`wrap`; a dataclass (an experiment's ``Config``) as its repr with as many
    ``field=value`` a line as fit; a dict, a list or a tuple laid out by :mod:`pprint`; anything
    else (a tensor, an array) its ``str``, wrapped. A single part longer than ``width`` stays
    whole."""
    if isinstance(obj, str):
        return wrap(obj, width)
    if hasattr(obj, "__dataclass_fields__") and not isinstance(obj, type):
        one_line = repr(obj)
        if len(one_line) <= width or not _generated_repr(type(obj)):
            return wrap(one_line, width)
        fields = [f"{f.name}={getattr(obj, f.name)!r}" for f in dataclasses.fields(obj) if f.repr]
        return _fill(type(obj).__qualname__, fields, width)
    if isinstance(obj, (dict, list, tuple, set, frozenset)):
        return wrap(pprint.pformat(obj, width=width, sort_dicts=False, compact=True), width)
    return wrap(str(obj), width)


def show(*values: Any, sep: str = " ", width: int = WIDTH) -> None:
    """Print ``values`` as ``print`` does, wrapped at ``width`` characters: a dataclass, a
    dict, a list or a tuple laid out on several lines by :func:`pformat` gets lines of its own;
    everything else (text, numbers, arrays) is joined by ``sep`` as print joins it."""
    blocks: list[str] = []
    run: list[str] = []
    for v in values:
        text = str(v) if isinstance(v, str) else pformat(v, width)
        if "\n" in text and not isinstance(v, str):
            blocks += [sep.join(run)] if run else []
            blocks.append(text)
            run = []
        else:
            run.append(text)
    blocks += [sep.join(run)] if run else []
    print(wrap("\n".join(blocks), width))
