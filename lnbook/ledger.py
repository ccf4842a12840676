"""The claims ledger (`book/claims.md`): each chapter records the verdict it computed for a
claim (C01-C22, P01-P22) and the figures it rests on, as JSON in :func:`ledger_dir`
(``$LNBOOK_LEDGER``, which the book's build sets to ``_build/ledger``; elsewhere nowhere: a
chapter run on Colab, Binder or in a reader's folder decides and shows its verdicts and writes
no file). Verdicts come from the decision rules declared in ``lnbook/claims.yml``
(:func:`decide_claim`), which ships inside the package.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from lnbook.resources import CLAIMS, claims_text

__all__ = [
    "UNDECIDED", "VERDICTS", "ClaimDecision", "ClaimRecord", "Decision", "Rule", "agreement",
    "agreement_text", "combine", "decide", "decide_claim", "format_seen", "ledger_dir",
    "load_claims", "load_records", "load_replication", "claims_file", "load_rules", "record",
    "verdict_from",
]

VERDICTS: tuple[str, ...] = (
    "reproduced",
    "explained",
    "partially reproduced",
    "not reproduced",
    "not reproducible offline",
    "undecided at this scale",
)
#: The verdict of a claim whose declared majority of seeds is reached in neither direction.
UNDECIDED = "undecided at this scale"
_ID = re.compile(r"^[CP]\d{2}$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

Figure = int | float | str | bool | list[Any]


@dataclass
class ClaimRecord:
    """What one chapter recorded about one claim: ``id``, ``verdict`` (of :data:`VERDICTS`),
    ``figures`` (name -> number, short string or list), an optional ``note`` with ``{name}``
    placeholders, and the ``scale`` it ran at."""

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
    if isinstance(value, str) and len(value) > 120:
        raise ValueError(f"figure {name!r}: strings are short labels (<= 120 characters)")
    if isinstance(value, bool | int | str):
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
    """One verdict from the outcomes of a claim's parts (name -> held): all held
    ("reproduced"), some held ("partially reproduced"), or none held ("not reproduced")."""
    if not parts:
        raise ValueError("verdict_from needs at least one part, e.g. {'LN faster': True}")
    return combine({k: "holds" if v else "fails" for k, v in parts.items()})


# --- decision rules, declared in lnbook/claims.yml before the runs --------------------------

_MAJORITY = re.compile(r"^\s*(\d+)\s+of\s+(\d+)\s*$")
DIRECTIONS = ("below", "above", "yes")


@dataclass(frozen=True)
class Rule:
    """One part of a claim's decision rule, as ``lnbook/claims.yml`` declares it.

    Per seed, ``quantity`` counts *for* the part when it lies beyond ``at`` in ``direction``
    (``"below"``, ``"above"``; ``"yes"`` for yes/no outcomes) by more than ``margin``,
    *against* it when beyond on the other side by more than ``margin``, else (or when the
    seed failed the ``trivial`` bar) for neither. The part holds when ``agree`` of ``of``
    seeds count for it, fails when as many count against, and is undecided otherwise.
    """

    quantity: str
    direction: str
    agree: int
    of: int
    at: float = 0.0
    margin: float = 0.0
    trivial: str | None = None

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"rule direction must be one of {DIRECTIONS}, "
                             f"got {self.direction!r}")
        if not 1 <= self.of or not self.of / 2 < self.agree <= self.of:
            raise ValueError(f"rule majority must be more than half of the seeds and at most "
                             f"all of them, e.g. '4 of 5', got '{self.agree} of {self.of}'")
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"rule margin must be a finite number >= 0, got {self.margin!r}")
        if not math.isfinite(self.at):
            raise ValueError(f"rule 'at' must be a finite number, got {self.at!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rule:
        """A rule from its ``claims.yml`` mapping (``majority: "4 of 5"``)."""
        unknown = set(d) - {"quantity", "direction", "at", "margin", "majority", "trivial"}
        if unknown:
            raise ValueError(f"rule has unknown fields {sorted(unknown)}; expected quantity, "
                             "direction, at, margin, majority, trivial")
        m = _MAJORITY.match(str(d.get("majority", "")))
        if m is None:
            raise ValueError(f"rule majority must read like '4 of 5', got {d.get('majority')!r}")
        if not str(d.get("quantity", "")).strip():
            raise ValueError("rule needs a 'quantity': what is measured on each seed")
        return cls(quantity=" ".join(str(d["quantity"]).split()),
                   direction=str(d.get("direction", "")), agree=int(m.group(1)),
                   of=int(m.group(2)), at=float(d.get("at", 0.0)),
                   margin=float(d.get("margin", 0.0)),
                   trivial=" ".join(str(d["trivial"]).split()) if d.get("trivial") else None)

    def describe(self) -> str:
        """The rule in one sentence, for the page "How the verdicts are made"."""
        if self.direction == "yes":
            test = "yes"
        else:
            band = f" by more than {self.margin:g}" if self.margin else ""
            test = f"{self.direction} {self.at:g}{band}"
        seeds = ("(one computation)" if self.of == 1
                 else f"on at least {self.agree} of {self.of} seeds")
        text = f"{self.quantity}: {test} {seeds}"
        return text + (f"; trivial-phase bar: {self.trivial}" if self.trivial else "")


@dataclass(frozen=True)
class Decision:
    """One part's outcome (``"holds"``, ``"fails"``, ``"undecided"``): ``n_for``,
    ``n_against`` of ``n`` seeds; ``need`` must agree (the majority scaled to ``n``)."""

    outcome: str
    n_for: int
    n_against: int
    n: int
    need: int

    def __str__(self) -> str:
        return (f"{self.outcome} ({self.n_for} of {self.n} seeds for, {self.n_against} "
                f"against; {self.need} must agree)")


def _side(rule: Rule, value: Any) -> int:
    """+1 when ``value`` counts for the rule, -1 against, 0 for neither."""
    if rule.direction == "yes":
        if not isinstance(value, bool | int) or value not in (0, 1):
            raise ValueError(f"rule {rule.quantity!r} takes yes/no values per seed, "
                             f"got {value!r}")
        return 1 if value else -1
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"rule {rule.quantity!r} takes a number per seed, got {value!r}")
    v = float(value)
    if math.isnan(v):
        return 0
    d = v - rule.at if rule.direction == "above" else rule.at - v
    return 1 if d > rule.margin else -1 if d < -rule.margin else 0


def decide(rule: Rule | Mapping[str, Any], values: Any, trivial_ok: Any = None) -> Decision:
    """Apply a declared rule (a :class:`Rule` or its mapping) to per-seed ``values``;
    ``trivial_ok`` (one yes/no per seed) makes a seed that failed the trivial bar count for
    neither side.

    Example::

        >>> r = Rule("LN's final error minus BN's", "below", agree=4, of=5, margin=0.01)
        >>> str(decide(r, [-0.05, -0.03, -0.002, -0.04, -0.06]))
        'holds (4 of 5 seeds for, 0 against; 4 must agree)'
        >>> decide(r, [-0.05, 0.03, -0.002, -0.04, -0.06]).outcome
        'undecided'
    """
    if not isinstance(rule, Rule):
        rule = Rule.from_dict(rule)
    if hasattr(values, "tolist"):
        values = values.tolist()
    values = list(values) if isinstance(values, list | tuple) else [values]
    if not values:
        raise ValueError(f"rule {rule.quantity!r}: no per-seed values given")
    sides = [_side(rule, v) for v in values]
    if trivial_ok is not None:
        ok = trivial_ok.tolist() if hasattr(trivial_ok, "tolist") else list(trivial_ok)
        if len(ok) != len(values):
            raise ValueError(f"trivial_ok has {len(ok)} entries for {len(values)} seeds")
        sides = [s if bool(k) else 0 for s, k in zip(sides, ok, strict=True)]
    n = len(values)
    need = rule.agree if n == rule.of else max(n // 2 + 1, math.ceil(rule.agree * n / rule.of))
    n_for, n_against = sides.count(1), sides.count(-1)
    outcome = "holds" if n_for >= need else "fails" if n_against >= need else "undecided"
    return Decision(outcome, n_for, n_against, n, need)


def combine(parts: Mapping[str, Decision | str], held: str = "reproduced") -> str:
    """A claim's verdict from its parts: all hold: ``held`` ("reproduced", or "explained");
    some hold: "partially reproduced"; none holds, some fail: "not reproduced"; all
    undecided: :data:`UNDECIDED`."""
    if not parts:
        raise ValueError("combine needs at least one part, e.g. {'LN faster': decision}")
    if held not in VERDICTS or held == UNDECIDED:
        raise ValueError(f"held must be a verdict of VERDICTS, got {held!r}")
    outcomes = [p.outcome if isinstance(p, Decision) else p for p in parts.values()]
    bad = [o for o in outcomes if o not in ("holds", "fails", "undecided")]
    if bad:
        raise ValueError(f"part outcomes are 'holds', 'fails' or 'undecided', got {bad}")
    if all(o == "holds" for o in outcomes):
        return held
    if "holds" in outcomes:
        return "partially reproduced"
    return "not reproduced" if "fails" in outcomes else UNDECIDED


def claims_file() -> Path:
    """The path of ``claims.yml`` inside the installed package (``lnbook/claims.yml``): the
    claims' paraphrases, statuses and decision rules. Read it with :func:`load_claims`."""
    return Path(str(resources.files("lnbook").joinpath(CLAIMS)))


def load_claims(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """``claims.yml`` as a mapping (``claims``, ``questions``): the package's own, or the file
    at ``path``."""
    import yaml

    text = claims_text() if path is None else Path(path).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def load_rules(path: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """Every declared rule of ``claims.yml`` (the package's own, or the file at ``path``):
    claim ID -> ``{"parts": {name: Rule}, "held"}``."""
    claims = load_claims(path)["claims"]
    out = {}
    for c in claims:
        r = c.get("rule")
        if r is None:
            continue
        if not r.get("parts"):
            raise ValueError(f"{c['id']}: a rule needs 'parts' (name -> quantity, direction, "
                             "majority, ...)")
        try:
            parts = {str(k): Rule.from_dict(v) for k, v in r["parts"].items()}
        except ValueError as err:
            raise ValueError(f"{c['id']}: {err}") from None
        held = r.get("held", "reproduced")
        if held not in ("reproduced", "explained"):
            raise ValueError(f"{c['id']}: rule 'held' is 'reproduced' or 'explained', "
                             f"got {held!r}")
        out[str(c["id"])] = {"parts": parts, "held": held}
    return out


@dataclass(frozen=True)
class ClaimDecision:
    """A claim's verdict by its declared rule, with the decision of every part."""

    id: str
    verdict: str
    parts: dict[str, Decision]

    def figures(self) -> dict[str, str]:
        """Per part, ``"<n_for>/<n> for, <n_against> against"``, for :func:`record`."""
        return {f"agree_{_slug(k)}": f"{d.n_for}/{d.n} for, {d.n_against} against"
                for k, d in self.parts.items()}

    def _repr_markdown_(self) -> str:
        rows = [f"**{self.id}** by its declared rule: **{self.verdict}**", "",
                "| part | outcome | seeds for | against | must agree |", "|---|---|---|---|---|"]
        rows += [f"| {k} | {d.outcome} | {d.n_for} of {d.n} | {d.n_against} | {d.need} |"
                 for k, d in self.parts.items()]
        return "\n".join(rows)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def decide_claim(claim_id: str, values: Mapping[str, Any],
                 trivial_ok: Mapping[str, Any] | None = None,
                 rules: Mapping[str, Mapping[str, Any]] | None = None) -> ClaimDecision:
    """A claim's verdict from per-seed ``values`` (part name -> values, every declared part)
    by the rule ``claims.yml`` declares for ``claim_id``; ``trivial_ok`` as in :func:`decide`,
    ``rules`` default :func:`load_rules`."""
    rules = load_rules() if rules is None else rules
    if claim_id not in rules:
        raise KeyError(f"{claim_id} declares no rule in claims.yml; add 'rule: parts: ...' "
                       "next to the claim")
    declared = rules[claim_id]["parts"]
    if set(values) != set(declared):
        raise ValueError(f"{claim_id}: values for parts {sorted(values)}, but the rule "
                         f"declares {sorted(declared)}")
    trivial_ok = trivial_ok or {}
    parts = {k: decide(declared[k], values[k], trivial_ok.get(k)) for k in declared}
    return ClaimDecision(claim_id, combine(parts, rules[claim_id]["held"]), parts)


def ledger_dir() -> Path | None:
    """The folder records go to: ``$LNBOOK_LEDGER``, else None (no file is written).

    The book's build sets it (``python3 dev.py book`` and the claims ledger's Sphinx extension:
    ``_build/ledger`` of the checkout; ``dev.py replicate``: one folder per seed set). A chapter
    executed anywhere else, in the checkout too (JupyterLab, nbval, Binder), writes nothing."""
    env = os.environ.get("LNBOOK_LEDGER")
    return Path(env) if env else None


def record(claim_id: str, verdict: str, figures: Mapping[str, Any], note: str | None = None,
           scale: str = "quick") -> ClaimRecord:
    """Record the verdict a chapter computed for one claim, with the figures it rests on.

    Inside the book's build writes ``<ledger_dir()>/<claim_id>.json`` (replacing an older
    record); anywhere else writes nothing. Returns the record either way: a notebook shows it
    (the verdict and its figures) as the cell's result.

    Args:
        claim_id: ``"C01"``-``"C22"`` or ``"P01"``-``"P22"``.
        verdict: one of :data:`VERDICTS`.
        figures: lower-case name -> number, short string, or list of them; floats kept to 4
            significant digits. ``claims.yml``'s ``seen`` refers to them as ``{name}``.
        note: an optional sentence with ``{name}`` placeholders.
        scale: the scale the chapter ran at.
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
    recs = [ClaimRecord.from_dict(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]
    return {rec.id: rec for rec in recs}


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


# --- replication: the verdicts on fresh seed sets (python3 dev.py replicate) -----------------


def load_replication(path: str | os.PathLike) -> dict[str, Any]:
    """The replication record ``book/replication.json``, or an empty one if there is none."""
    path = Path(path)
    if not path.is_file():
        return {"sets": [], "claims": {}}
    return json.loads(path.read_text())


def agreement(replication: Mapping[str, Any], claim_id: str, verdict: str) -> tuple[int, int]:
    """On how many of the record's fresh seed sets ``claim_id`` got ``verdict``: ``(same, n)``
    (the record's ``claims[claim_id]["sets"][k]["verdict"]``)."""
    sets = replication.get("claims", {}).get(claim_id, {}).get("sets", {})
    return sum(s.get("verdict") == verdict for s in sets.values()), len(sets)


def agreement_text(replication: Mapping[str, Any], claim_id: str, verdict: str) -> str | None:
    """``"same on 4/4 fresh seed sets"`` for the claims page, or None if the claim was not
    replicated."""
    same, n = agreement(replication, claim_id, verdict)
    return f"same on {same}/{n} fresh seed sets" if n else None
