"""The claims ledger, recorded from the runs: each chapter writes the figures its verdicts rest on.

Book page "Claims ledger" (`book/claims.md`). A chapter that checks a claim of the paper (C01-C22)
or of a later paper (P01-P14) computes its verdict from its own runs, asserts it in a cell, and
then calls :func:`record` with the same numbers. The record is written as JSON to the build's
ledger folder; the ledger page renders every record next to the paraphrase that
``book/claims.yml`` keeps, and ``tests/test_ledger.py`` fails when a claim has no record or when
the status a person wrote in ``claims.yml`` differs from the verdict the chapter computed. No
figure of the ledger is typed by hand.

Where the records go: the folder named by the environment variable ``LNBOOK_LEDGER``, else
``_build/ledger`` of the book that contains the current directory (the folder holding
``_toc.yml``), else nowhere (a reader running one notebook on its own still sees the record).
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "VERDICTS",
    "ClaimRecord",
    "format_seen",
    "ledger_dir",
    "load_records",
    "record",
    "verdict_from",
]

VERDICTS: tuple[str, ...] = (
    "reproduced",
    "explained",
    "partially reproduced",
    "not reproduced",
    "not reproducible offline",
)
_ID = re.compile(r"^[CP]\d{2}$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

Figure = int | float | str | bool | list[Any]


@dataclass
class ClaimRecord:
    """What one chapter recorded about one claim.

    Attributes:
        id: the claim's ID, ``C01``-``C22`` or ``P01``-``P14``.
        verdict: one of :data:`VERDICTS`, computed by the chapter from ``figures``.
        figures: the numbers the verdict rests on, by name (numbers, short strings, or lists
            of them, e.g. one value per seed).
        note: an optional sentence, written in the chapter, with ``{name}`` placeholders.
        scale: the experiment scale the chapter ran at (``"quick"`` or ``"paper"``).
    """

    id: str
    verdict: str
    figures: dict[str, Figure] = field(default_factory=dict)
    note: str | None = None
    scale: str = "quick"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClaimRecord:
        return cls(id=d["id"], verdict=d["verdict"], figures=dict(d["figures"]),
                   note=d.get("note"), scale=d.get("scale", "quick"))

    def _repr_markdown_(self) -> str:
        rows = [f"**{self.id}**: recorded verdict **{self.verdict}** ({self.scale} scale)", "",
                "| figure | value |", "|---|---|"]
        rows += [f"| `{k}` | {_format(v)} |" for k, v in self.figures.items()]
        if self.note:
            rows += ["", format_seen(self.note, self.figures)]
        return "\n".join(rows)

    def __str__(self) -> str:
        figs = "; ".join(f"{k} = {_format(v)}" for k, v in self.figures.items())
        return f"{self.id}: {self.verdict} ({figs})"


def _check_figure(name: str, value: Any) -> Figure:
    """``value`` as plain JSON (floats rounded to 4 significant digits), or ``ValueError``."""
    if hasattr(value, "tolist"):  # numpy array or scalar, torch tensor
        value = value.tolist()
    if isinstance(value, bool | str):
        if isinstance(value, str) and len(value) > 120:
            raise ValueError(f"figure {name!r}: strings are short labels (<= 120 characters)")
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # "nan" / "inf" are findings too; strict JSON has no NaN
        return float(f"{value:.4g}")
    if isinstance(value, list | tuple):
        return [_check_figure(name, v) for v in value]
    raise ValueError(
        f"figure {name!r} must be a number, a short string or a list of them, "
        f"got {type(value).__name__}"
    )


def verdict_from(parts: Mapping[str, bool]) -> str:
    """One verdict from the outcomes of a claim's parts: all held, some held, or none held.

    Example::

        >>> verdict_from({"faster than BN": True, "robust to batch size": False})
        'partially reproduced'
    """
    if not parts:
        raise ValueError("verdict_from needs at least one part, e.g. {'LN faster': True}")
    held = [bool(v) for v in parts.values()]
    if all(held):
        return "reproduced"
    return "partially reproduced" if any(held) else "not reproduced"


def ledger_dir(start: str | os.PathLike | None = None) -> Path | None:
    """The folder records go to: ``$LNBOOK_LEDGER``, else ``<book>/_build/ledger``, else None.

    ``<book>`` is the nearest folder at or above ``start`` (default: the current directory)
    that holds ``_toc.yml``; a notebook executed by the build or by nbval runs inside ``book/``.
    """
    env = os.environ.get("LNBOOK_LEDGER")
    if env:
        return Path(env)
    here = Path(start if start is not None else os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file():
            return folder / "_build" / "ledger"
    return None


def record(
    claim_id: str,
    verdict: str,
    figures: Mapping[str, Any],
    note: str | None = None,
    scale: str = "quick",
) -> ClaimRecord:
    """Record the verdict a chapter computed for one claim, with the figures it rests on.

    Call it after the cell that asserts the claim, with the same numbers. Writes
    ``<ledger_dir()>/<claim_id>.json`` (replacing an older record) and returns the record,
    which a notebook shows as a small table.

    Args:
        claim_id: ``"C01"``-``"C22"`` (the paper) or ``"P01"``-``"P14"`` (Part II).
        verdict: one of :data:`VERDICTS` (see :func:`verdict_from`).
        figures: name -> number, short string, or list of them (e.g. one value per seed).
            Names are lower-case identifiers; ``claims.yml``'s ``seen`` sentence refers to
            them as ``{name}``. Floats are kept to 4 significant digits.
        note: an optional sentence with ``{name}`` placeholders, shown under the table.
        scale: the scale the chapter ran at.

    Example::

        >>> rec = record("C17", "reproduced", {"ln_area": [0.21, 0.2]})  # doctest: +SKIP
    """
    if not (isinstance(claim_id, str) and _ID.match(claim_id)):
        raise ValueError(f"claim_id must look like 'C07' or 'P03', got {claim_id!r}")
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    if not figures:
        raise ValueError(f"{claim_id}: record the figures the verdict rests on (none given)")
    clean: dict[str, Figure] = {}
    for name, value in figures.items():
        if not (isinstance(name, str) and _NAME.match(name)):
            raise ValueError(f"{claim_id}: figure names are lower-case identifiers, got {name!r}")
        clean[name] = _check_figure(name, value)
    if note is not None:
        format_seen(note, clean)  # every placeholder must name a figure
    rec = ClaimRecord(claim_id, verdict, clean, note, scale)
    folder = ledger_dir()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{claim_id}.json.tmp"
        tmp.write_text(json.dumps(rec.to_dict(), indent=1))
        os.replace(tmp, folder / f"{claim_id}.json")
    return rec


def load_records(folder: str | os.PathLike | None = None) -> dict[str, ClaimRecord]:
    """Every record in ``folder`` (default :func:`ledger_dir`), by claim ID."""
    folder = Path(folder) if folder is not None else ledger_dir()
    if folder is None or not folder.is_dir():
        return {}
    out = {}
    for path in sorted(folder.glob("*.json")):
        rec = ClaimRecord.from_dict(json.loads(path.read_text()))
        out[rec.id] = rec
    return out


def _format(value: Any, spec: str = "") -> str:
    """A figure as text: floats to 3 significant digits (or ``spec``), lists joined by '/'."""
    if isinstance(value, list):
        return "/".join(_format(v, spec) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, spec or ".3g")
    if isinstance(value, int) and spec:
        return format(value, spec)
    return str(value)


class _Figures(string.Formatter):
    def __init__(self, figures: Mapping[str, Any]) -> None:
        self.figures = figures

    def get_value(self, key: int | str, args: Any, kwargs: Any) -> Any:
        if key not in self.figures:
            raise KeyError(f"placeholder {{{key}}} names no recorded figure; "
                           f"recorded: {sorted(self.figures)}")
        return self.figures[key]

    def format_field(self, value: Any, format_spec: str) -> str:
        return _format(value, format_spec)


def format_seen(text: str, figures: Mapping[str, Any]) -> str:
    """Fill the ``{name}`` / ``{name:.2f}`` placeholders of ``text`` with recorded figures.

    Example::

        >>> format_seen("LN {ln} vs BN {bn:.1f}", {"ln": [0.21, 0.2], "bn": 0.33})
        'LN 0.21/0.2 vs BN 0.3'
    """
    return _Figures(figures).format(text)
