"""The claims ledger (`book/claims.md`): each chapter records the verdict it computed for a
claim (C01-C22, P01-P22) and the figures it rests on, as JSON in :func:`ledger_dir`
(``$LNBOOK_LEDGER``, which the book's build sets to ``_build/ledger``; elsewhere nowhere: a
chapter run on Colab, Binder or in a reader's folder decides and shows its verdicts and writes
no file). Verdicts come from the decision rules declared in ``lnbook/claims.yml``
(:func:`decide_claim`), which ships inside the package.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from lnbook.resources import CLAIMS, claims_text

__all__ = [
    "UNDECIDED", "VERDICTS", "ClaimDecision", "ClaimRecord", "Decision", "Effect", "Rule",
    "agreement", "agreement_text", "combine", "decide", "decide_claim", "declared",
    "detectable_share", "outcome_odds", "pooled_shares", "verdict_odds",
    "effect", "format_seen", "ledger_dir", "load_claims", "load_records", "load_replication",
    "claims_file", "load_pilots", "load_rules", "parts_text", "Pilot", "pilot_from",
    "pilot_markdown", "pilot_record", "record", "verdict_from",
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


def verdict_from(parts: Mapping[str, bool], primary: str | None = None) -> str:
    """One verdict from the outcomes of a claim's parts (name -> held), by :func:`combine`:
    all held ("reproduced"), the ``primary`` part held and another not ("partially
    reproduced"), the primary part failed ("not reproduced")."""
    if not parts:
        raise ValueError("verdict_from needs at least one part, e.g. {'LN faster': True}")
    return combine({k: "holds" if v else "fails" for k, v in parts.items()}, primary=primary)


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

    With ``relative`` (the name of the compared quantity, for example "layer norm's final
    loss"), ``at`` and ``margin`` are fractions of that quantity's value on the same seed,
    which :func:`decide` takes as ``reference``: a margin that scales with what is compared.
    """

    quantity: str
    direction: str
    agree: int
    of: int
    at: float = 0.0
    margin: float = 0.0
    trivial: str | None = None
    relative: str | None = None

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
        unknown = set(d) - {"quantity", "direction", "at", "margin", "majority", "trivial",
                            "relative"}
        if unknown:
            raise ValueError(f"rule has unknown fields {sorted(unknown)}; expected quantity, "
                             "direction, at, margin, majority, trivial, relative")
        if "relative" in d and not (isinstance(d["relative"], str) and d["relative"].strip()):
            raise ValueError("rule 'relative' names the compared quantity the margin is a "
                             f"fraction of, e.g. 'layer norm's final loss', got {d['relative']!r}")
        m = _MAJORITY.match(str(d.get("majority", "")))
        if m is None:
            raise ValueError(f"rule majority must read like '4 of 5', got {d.get('majority')!r}")
        if not str(d.get("quantity", "")).strip():
            raise ValueError("rule needs a 'quantity': what is measured on each seed")
        return cls(quantity=" ".join(str(d["quantity"]).split()),
                   direction=str(d.get("direction", "")), agree=int(m.group(1)),
                   of=int(m.group(2)), at=float(d.get("at", 0.0)),
                   margin=float(d.get("margin", 0.0)),
                   trivial=" ".join(str(d["trivial"]).split()) if d.get("trivial") else None,
                   relative=" ".join(d["relative"].split()) if d.get("relative") else None)

    def describe(self) -> str:
        """The rule in one sentence, for the page "How the verdicts are made"."""
        if self.direction == "yes":
            test = "yes"
        else:
            band = f" by more than {self.margin:g}" if self.margin else ""
            test = f"{self.direction} {self.at:g}{band}"
            if self.relative:
                test += f" (fractions of {self.relative}, on the same seed)"
        seeds = ("(one computation)" if self.of == 1
                 else f"on at least {self.agree} of {self.of} seeds")
        text = f"{self.quantity}: {test} {seeds}"
        return text + (f"; trivial-phase bar: {self.trivial}" if self.trivial else "")


@dataclass(frozen=True)
class Effect:
    """The per-seed effect of one part: the ``median`` of the seeds' values with a
    distribution-free interval ``[low, high]`` for it (two order statistics of the values,
    :func:`effect`), which covers the true median with probability ``level`` whatever the
    values' distribution; ``n`` values (NaN left out), ``unit`` what they measure."""

    median: float
    low: float
    high: float
    level: float
    n: int
    unit: str = ""

    def __str__(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return (f"median {self.median:.3g}{unit}, {self.level:.0%} interval "
                f"[{self.low:.3g}, {self.high:.3g}] over {self.n} seeds")


def _binom_cdf(k: int, n: int, p: float = 0.5) -> float:
    """P(Binomial(n, p) <= k)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))


def effect(values: Any, level: float = 0.9, unit: str = "") -> Effect:
    """The median of per-seed ``values`` with an exact interval for the true median.

    The interval is ``[x_(k), x_(n+1-k)]`` of the sorted values, with the largest ``k`` whose
    coverage ``1 - 2 P(Binomial(n, 1/2) <= k - 1)`` is at least ``level`` (the sign test's
    interval: no assumption on the distribution, no random draw, the same on every run). With
    few seeds no ``k`` reaches ``level``; then it is the range of the values, with the lower
    coverage it has (0.75 for 3 seeds, 0.94 for 5). NaN values are left out; infinite ones
    (a target never reached) are kept as the order statistics they are.

    Example::

        >>> str(effect([1.33, 1.13, 1.23]))
        'median 1.23, 75% interval [1.13, 1.33] over 3 seeds'
        >>> e = effect(range(10))
        >>> (e.low, e.high, round(e.level, 3))
        (1.0, 8.0, 0.979)
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie between 0 and 1, e.g. 0.9, got {level!r}")
    if hasattr(values, "tolist"):
        values = values.tolist()
    values = list(values) if isinstance(values, list | tuple | range) else [values]
    xs = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"effect takes a number per seed, got {v!r}")
        if not math.isnan(v):
            xs.append(float(v))
    if not xs:
        raise ValueError("effect needs at least one value that is not NaN")
    xs.sort()
    n = len(xs)
    mid = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    k, cover = 1, 1 - 2 * _binom_cdf(0, n)
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _binom_cdf(k, n) >= level:
        k += 1
        cover = 1 - 2 * _binom_cdf(k - 1, n)
    return Effect(mid, xs[k - 1], xs[n - k], cover, n, unit)


def detectable_share(need: int, n: int, power: float = 0.8) -> float:
    """The power line of a majority rule: the smallest share ``p`` of seeds counting for a
    part (each seed independently) at which ``need`` of ``n`` seeds agree with probability at
    least ``power``. A part whose true share lies below it is likely to come out undecided.

    Example::

        >>> round(detectable_share(4, 5), 2), round(detectable_share(16, 20), 2)
        (0.83, 0.84)
    """
    if not 1 <= need <= n:
        raise ValueError(f"need must be from 1 to n = {n}, got {need}")
    if not 0 < power < 1:
        raise ValueError(f"power must lie between 0 and 1, got {power!r}")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: P(at least need of n) rises with p
        p = (lo + hi) / 2
        lo, hi = (p, hi) if 1 - _binom_cdf(need - 1, n, p) < power else (lo, p)
    return hi


@dataclass(frozen=True)
class Decision:
    """One part's outcome (``"holds"``, ``"fails"``, ``"undecided"``): ``n_for``,
    ``n_against`` of ``n`` seeds; ``need`` must agree (the majority scaled to ``n``);
    ``effect`` the median and interval of the seeds that passed the trivial bar (None for
    yes/no parts); ``power`` the share of seeds the part needs to be found 4 times in 5
    (:func:`detectable_share`)."""

    outcome: str
    n_for: int
    n_against: int
    n: int
    need: int
    effect: Effect | None = None
    power: float | None = None

    def __str__(self) -> str:
        return (f"{self.outcome} ({self.n_for} of {self.n} seeds for, {self.n_against} "
                f"against; {self.need} must agree)")


def _side(rule: Rule, value: Any, ref: float | None = None) -> int:
    """+1 when ``value`` counts for the rule, -1 against, 0 for neither (``ref``: the compared
    quantity's value on the seed, for a relative rule)."""
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
    scale = 1.0 if ref is None else abs(ref)
    at, margin = rule.at * scale, rule.margin * scale
    d = v - at if rule.direction == "above" else at - v
    return 1 if d > margin else -1 if d < -margin else 0


def _as_list(x: Any) -> list:
    if hasattr(x, "tolist"):
        x = x.tolist()
    return list(x) if isinstance(x, list | tuple) else [x]


def decide(rule: Rule | Mapping[str, Any], values: Any, trivial_ok: Any = None,
           reference: Any = None) -> Decision:
    """Apply a declared rule (a :class:`Rule` or its mapping) to per-seed ``values``;
    ``trivial_ok`` (one yes/no per seed) makes a seed that failed the trivial bar count for
    neither side; ``reference`` (one value per seed) is the compared quantity a ``relative``
    rule's ``at`` and ``margin`` are fractions of.

    Example::

        >>> r = Rule("LN's final error minus BN's", "below", agree=4, of=5, margin=0.01)
        >>> str(decide(r, [-0.05, -0.03, -0.002, -0.04, -0.06]))
        'holds (4 of 5 seeds for, 0 against; 4 must agree)'
        >>> decide(r, [-0.05, 0.03, -0.002, -0.04, -0.06]).outcome
        'undecided'
        >>> rel = Rule("DyT's loss minus LN's", "below", agree=2, of=3, at=0.1,
        ...            relative="LN's loss")
        >>> decide(rel, [0.01, 0.03, 0.01], reference=[0.2, 0.2, 0.05]).n_for
        1
    """
    if not isinstance(rule, Rule):
        rule = Rule.from_dict(rule)
    values = _as_list(values)
    if not values:
        raise ValueError(f"rule {rule.quantity!r}: no per-seed values given")
    refs: list = [None] * len(values)
    if rule.relative:
        if reference is None:
            raise ValueError(f"rule {rule.quantity!r} is relative to {rule.relative}: give "
                             "its value per seed as reference=")
        refs = [float(r) for r in _as_list(reference)]
        if len(refs) != len(values):
            raise ValueError(f"reference has {len(refs)} entries for {len(values)} seeds")
    elif reference is not None:
        raise ValueError(f"rule {rule.quantity!r} is not relative; declare 'relative:' in "
                         "claims.yml to read it against a reference")
    sides = [_side(rule, v, r) for v, r in zip(values, refs, strict=True)]
    ok = [True] * len(values)
    if trivial_ok is not None:
        ok = [bool(k) for k in _as_list(trivial_ok)]
        if len(ok) != len(values):
            raise ValueError(f"trivial_ok has {len(ok)} entries for {len(values)} seeds")
        sides = [s if k else 0 for s, k in zip(sides, ok, strict=True)]
    n = len(values)
    need = rule.agree if n == rule.of else max(n // 2 + 1, math.ceil(rule.agree * n / rule.of))
    n_for, n_against = sides.count(1), sides.count(-1)
    outcome = "holds" if n_for >= need else "fails" if n_against >= need else "undecided"
    eff = None
    if rule.direction != "yes":
        kept = [v / abs(r) if r is not None and r != 0 else v if r is None else math.nan
                for v, r, k in zip(values, refs, ok, strict=True) if k]
        kept = [v for v in kept if not math.isnan(v)]
        if len(kept) > 1:  # one computation has a value, not an interval
            eff = effect(kept, unit=f"(fraction of {rule.relative})" if rule.relative else "")
    return Decision(outcome, n_for, n_against, n, need, eff, detectable_share(need, n))


def combine(parts: Mapping[str, Decision | str], held: str = "reproduced",
            primary: str | None = None) -> str:
    """A claim's verdict from its parts, led by its ``primary`` part (the claim's headline;
    it may be left out only when there is one part):

    - every part holds: ``held`` ("reproduced", or "explained");
    - the primary part holds and another does not: "partially reproduced";
    - the primary part fails: "not reproduced", whatever the other parts do;
    - the primary part is undecided: :data:`UNDECIDED`, whatever the other parts do.
    """
    if not parts:
        raise ValueError("combine needs at least one part, e.g. {'LN faster': decision}")
    if held not in VERDICTS or held == UNDECIDED:
        raise ValueError(f"held must be a verdict of VERDICTS, got {held!r}")
    outcomes = {k: p.outcome if isinstance(p, Decision) else p for k, p in parts.items()}
    bad = [o for o in outcomes.values() if o not in ("holds", "fails", "undecided")]
    if bad:
        raise ValueError(f"part outcomes are 'holds', 'fails' or 'undecided', got {bad}")
    if primary is None:
        if len(parts) > 1:
            raise ValueError(f"combine needs primary= (the part that is the claim's headline) "
                             f"when there are several parts: {sorted(parts)}")
        primary = next(iter(parts))
    if primary not in outcomes:
        raise ValueError(f"primary part {primary!r} is not one of the parts {sorted(parts)}")
    if all(o == "holds" for o in outcomes.values()):
        return held
    return {"holds": "partially reproduced", "fails": "not reproduced",
            "undecided": UNDECIDED}[outcomes[primary]]


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


def declared(claim_id: str) -> str:
    """The verdict ``claims.yml`` states for ``claim_id`` (its ``status``): what a chapter's
    record on the book's own seeds (set 0) must give. ``ValueError`` naming the known IDs."""
    if not isinstance(claim_id, str):
        raise TypeError(f"claim_id must be a str such as 'C17', got {type(claim_id).__name__}")
    status = {c["id"]: c["status"] for c in load_claims()["claims"]}
    if claim_id not in status:
        raise ValueError(f"no claim {claim_id!r} in claims.yml; known: {', '.join(status)}")
    return status[claim_id]


def load_rules(path: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """Every declared rule of ``claims.yml`` (the package's own, or the file at ``path``):
    claim ID -> ``{"parts": {name: Rule}, "held", "primary"}``. A rule with several parts
    names its ``primary`` part, the claim's headline (:func:`combine`)."""
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
        primary = r.get("primary")
        if primary is None and len(parts) == 1:
            primary = next(iter(parts))
        if primary not in parts:
            raise ValueError(f"{c['id']}: rule 'primary' names the part that is the claim's "
                             f"headline, one of {sorted(parts)}; got {primary!r}")
        out[str(c["id"])] = {"parts": parts, "held": held, "primary": str(primary)}
    return out


@dataclass(frozen=True)
class ClaimDecision:
    """A claim's verdict by its declared rule, with the decision of every part."""

    id: str
    verdict: str
    parts: dict[str, Decision]
    primary: str = ""

    def figures(self) -> dict[str, str]:
        """For :func:`record`, per part: ``agree_<part>``, ``"<n_for>/<n> for, <n_against>
        against"``; ``outcome_<part>`` (``"holds"``, and ``", primary"`` on the primary part);
        ``effect_<part>``, the median and interval of :class:`Effect` (parts with numbers)."""
        out: dict[str, str] = {}
        for k, d in self.parts.items():
            slug = _slug(k)
            out[f"agree_{slug}"] = f"{d.n_for}/{d.n} for, {d.n_against} against"
            out[f"outcome_{slug}"] = d.outcome + (", primary" if k == self.primary else "")
            if d.effect is not None:
                e = d.effect
                out[f"effect_{slug}"] = (f"{e.median:.3g} [{e.low:.3g}, {e.high:.3g}] "
                                         f"({e.level:.0%}, {e.n} seeds)")
        return out

    def _repr_markdown_(self) -> str:
        rows = [f"**{self.id}** by its declared rule: **{self.verdict}**", "",
                "| part | outcome | seeds for | against | must agree | median [interval] |",
                "|---|---|---|---|---|---|"]
        for k, d in self.parts.items():
            name = f"{k} (primary)" if k == self.primary else k
            e = d.effect
            eff = (f"{e.median:.3g} [{e.low:.3g}, {e.high:.3g}] ({e.level:.0%})" if e
                   else "")
            rows.append(f"| {name} | {d.outcome} | {d.n_for} of {d.n} | {d.n_against} | "
                        f"{d.need} | {eff} |")
        return "\n".join(rows)


def parts_text(rule: Mapping[str, Any], figures: Mapping[str, Any]) -> list[str]:
    """One line per part of a claim's rule (a :func:`load_rules` entry), from a record's
    figures (:meth:`ClaimDecision.figures`), for the ledger page: ``"faster (primary): holds,
    2/3 for, 0 against; median 1.2 [1.01, 1.3] (75%, 3 seeds)"``. A part the record does not
    report shows its name only."""
    lines = []
    for name in rule["parts"]:
        slug = _slug(name)
        label = f"{name} (primary)" if name == rule.get("primary") else name
        outcome = str(figures.get(f"outcome_{slug}", "")).replace(", primary", "")
        bits = [b for b in (outcome, figures.get(f"agree_{slug}")) if b]
        text = f"{label}: {', '.join(map(str, bits))}" if bits else label
        if f"effect_{slug}" in figures:
            text += f"; median {figures[f'effect_{slug}']}"
        lines.append(text)
    return lines


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def decide_claim(claim_id: str, values: Mapping[str, Any],
                 trivial_ok: Mapping[str, Any] | None = None,
                 rules: Mapping[str, Mapping[str, Any]] | None = None,
                 reference: Mapping[str, Any] | None = None) -> ClaimDecision:
    """A claim's verdict from per-seed ``values`` (part name -> values, every declared part)
    by the rule ``claims.yml`` declares for ``claim_id``, led by its primary part
    (:func:`combine`); ``trivial_ok`` and ``reference`` (for relative parts) as in
    :func:`decide`, by part; ``rules`` default :func:`load_rules`."""
    rules = load_rules() if rules is None else rules
    if claim_id not in rules:
        raise KeyError(f"{claim_id} declares no rule in claims.yml; add 'rule: parts: ...' "
                       "next to the claim")
    declared = rules[claim_id]["parts"]
    if set(values) != set(declared):
        raise ValueError(f"{claim_id}: values for parts {sorted(values)}, but the rule "
                         f"declares {sorted(declared)}")
    trivial_ok, reference = trivial_ok or {}, reference or {}
    parts = {k: decide(declared[k], values[k], trivial_ok.get(k), reference.get(k))
             for k in declared}
    rule = rules[claim_id]
    primary = rule.get("primary") or next(iter(declared))
    return ClaimDecision(claim_id, combine(parts, rule["held"], primary), parts, primary)


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


# --- pilots: the design runs a claim declares (python3 dev.py pilot CLAIM) -------------------

_PILOT_FIELDS = {"experiment", "seeds", "config", "tried", "chose", "quantities", "measure"}


@dataclass(frozen=True)
class Pilot:
    """A claim's declared pilot (``pilot:`` in ``claims.yml``): ``experiment`` (a registered
    name), ``seeds`` (how many of :func:`lnbook.seeds.pilot_seeds`), ``config`` (overrides of
    its quick preset), ``tried`` (the design variants: each a mapping of further overrides; one
    empty variant when absent), ``chose`` (what was chosen, in words), ``quantities`` (the
    name of a function of the experiment module, ``f(results) -> {name: per-seed values}``,
    or None: each variant's final metrics per seed) and ``measure`` (the name of a function
    ``f(config) -> quantities`` that measures untrained models instead of running the
    experiment, for a design read at initialization; None: the experiment is run)."""

    experiment: str
    seeds: int
    config: dict[str, Any] = field(default_factory=dict)
    tried: tuple[dict[str, Any], ...] = ({},)
    chose: str = ""
    quantities: str | None = None
    measure: str | None = None


def pilot_from(claim_id: str, d: Mapping[str, Any]) -> Pilot:
    """A :class:`Pilot` from its ``claims.yml`` mapping, or ``ValueError`` naming the claim."""
    unknown = set(d) - _PILOT_FIELDS
    if unknown:
        raise ValueError(f"{claim_id}: pilot has unknown fields {sorted(unknown)}; expected "
                         f"{sorted(_PILOT_FIELDS)}")
    if not str(d.get("experiment", "")).strip():
        raise ValueError(f"{claim_id}: a pilot names its 'experiment'")
    n = d.get("seeds")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1000:
        raise ValueError(f"{claim_id}: pilot 'seeds' is how many pilot seeds (1 to 1000), "
                         f"got {n!r}")
    config, tried = d.get("config", {}) or {}, d.get("tried", [{}]) or [{}]
    if not isinstance(config, Mapping) or "seeds" in config:
        raise ValueError(f"{claim_id}: pilot 'config' maps config fields to values (the seeds "
                         "are the pilot's own)")
    if not isinstance(tried, list) or not all(isinstance(t, Mapping) for t in tried):
        raise ValueError(f"{claim_id}: pilot 'tried' is a list of config overrides")
    if d.get("quantities") and d.get("measure"):
        raise ValueError(f"{claim_id}: a pilot either runs the experiment ('quantities' of its "
                         "results) or measures untrained models ('measure'), not both")
    return Pilot(str(d["experiment"]), n, dict(config), tuple(dict(t) for t in tried),
                 " ".join(str(d.get("chose", "")).split()), d.get("quantities"),
                 d.get("measure"))


def load_pilots(path: str | os.PathLike | None = None) -> dict[str, Pilot]:
    """Every declared pilot of ``claims.yml`` (the package's own, or the file at ``path``),
    by claim ID."""
    return {str(c["id"]): pilot_from(str(c["id"]), c["pilot"])
            for c in load_claims(path)["claims"] if c.get("pilot")}


# --- pilot records: what a pilot tried, rendered for a chapter's design dropdown -------------

#: The package folder that holds the pilot records (``lnbook/pilots/*.json``, their only copy),
#: so that a chapter renders its record from a plain install, outside the checkout.
PILOT_RECORDS = "pilots"


def pilot_record(name: str) -> dict[str, Any]:
    """The pilot record ``name`` (a claim ID such as ``"P16"``, or a record's own name such as
    ``"sphere"``) as the installed package holds it (``lnbook/pilots/NAME.json``).

    Raises:
        TypeError: ``name`` is not a string.
        FileNotFoundError: there is no record of that name; the message names the claim and
            the records that exist (a design chosen without one says "chosen without a pilot").
    """
    if not isinstance(name, str):
        raise TypeError(f"pilot_record(): name must be a claim ID or a record name (str), "
                        f"got {type(name).__name__}")
    folder = resources.files("lnbook").joinpath(PILOT_RECORDS)
    file = folder.joinpath(f"{name}.json")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name) or not file.is_file():
        have = sorted(f.name.removesuffix(".json") for f in folder.iterdir()
                      if f.name.endswith(".json")) if folder.is_dir() else []
        raise FileNotFoundError(f"{name}: no pilot record (lnbook/pilots/{name}.json); "
                                f"records: {have}. A design chosen without one says "
                                "'chosen without a pilot'")
    return json.loads(file.read_text(encoding="utf-8"))


def _num(v: Any) -> float | None:
    """A per-seed value as a float; None when absent; a non-finite value (a diverged run,
    stored as ``"nan"`` or ``NaN``) as +inf, so that it ranks above every finite one."""
    if v is None or isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) or x == -math.inf else math.inf


def _median(values: list[Any]) -> str:
    """The median over seeds of ``values`` (numbers, or equal-length lists of them: the median
    of each position, in brackets), to 3 significant digits; ``–`` where no seed has a value;
    the seeds without one are left out."""
    if values and all(isinstance(v, list) for v in values):
        width = max(len(v) for v in values)
        return "[" + ", ".join(_median([v[k] if k < len(v) else None for v in values])
                               for k in range(width)) + "]"
    xs = sorted(x for x in map(_num, values) if x is not None)
    if not xs:
        return "–"
    n = len(xs)
    m = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return "∞" if m == math.inf else f"{m:.3g}"


def _summary(quantities: Mapping[str, Any]) -> str:
    """``name value`` for every quantity of one arm, per-seed lists by their median (a list of
    bools as ``k of n``), a single float to 3 significant digits, and a run of indexed names
    (``var_0``, ``var_1``, ...) as one entry (``var_0…8 [a, b, ...]``)."""

    def shown(v: Any) -> str:
        if isinstance(v, list) and v and all(isinstance(x, bool) for x in v):
            return f"{sum(v)} of {len(v)}"  # a per-seed mask: how many seeds it holds for
        if isinstance(v, float):
            v = [v]  # one value: its own median
        return _median(v) if isinstance(v, list) else str(v)

    parts, done = [], set()
    for name, vals in quantities.items():
        if name in done:
            continue
        m = re.fullmatch(r"(.+)_0", name)
        run: list[str] = []
        while m and f"{m.group(1)}_{len(run)}" in quantities:
            run.append(f"{m.group(1)}_{len(run)}")
        if len(run) > 1:
            done.update(run)
            meds = ", ".join(shown(quantities[k]) for k in run)
            parts.append(f"{m.group(1)}_0…{len(run) - 1} [{meds}]")
            continue
        parts.append(f"{name} {shown(vals)}")
    return ", ".join(parts)


def _overrides(config: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    diff = {k: v for k, v in config.items() if k != "seeds" and base.get(k) != v}
    return ", ".join(f"{k}={v}" for k, v in diff.items()) or "the declared config"


def _pilot_layout(rec: Mapping[str, Any], name: str) -> dict[str, Any]:
    """One record, whatever its layout, as ``{"tried": [{"label", "arms": {arm: {quantity:
    per-seed values or a shown value}}, "claims": {claim: {part: per-seed values}}}], "chosen",
    "notes"}``. Four layouts: ``dev.py pilot`` (``tried`` with ``overrides``), the design map's
    grids (``map``, ``per_seed``), the outliers' run (``runs``, ``claim_values``) and the
    sphere's rates (``runs`` by rate, ``chosen`` rate per design)."""
    claim = rec.get("claim", name)
    if isinstance(rec.get("tried"), list) and all("overrides" in t for t in rec["tried"]):
        tried = []
        for t in rec["tried"]:
            q = t.get("quantities", {})
            if set(q) == {"values", "trivial_ok"}:  # a claim's inputs (``*_inputs(results)``)
                q = {"per-seed values (median)": q["values"],
                     "seeds out of the trivial phase": q["trivial_ok"]}
            arms = q if all(isinstance(v, Mapping) for v in q.values()) else {"": q}
            label = ", ".join(f"{k}={v}" for k, v in t["overrides"].items()) or \
                "the declared config"
            tried.append({"label": f"{label} ({t['seconds']} s)" if "seconds" in t else label,
                          "arms": arms, "claims": {}})
        return {"tried": tried, "chosen": rec.get("chose", ""), "notes": []}
    if "map" in rec and "per_seed" in rec:
        base = rec["config"]

        def grid(g: Mapping[str, Any], label: str) -> dict[str, Any]:
            arms: dict[str, dict[str, Any]] = {}
            for cell, s in g["map"].items():
                d = arms.setdefault(cell.split("/")[0], {"left": 0, "n": 0})
                d["left"] += s["left"]
                d["n"] += s["n"]
            shown = {a: {"runs out of the trivial phase": f"{d['left']} of {d['n']}"}
                     for a, d in arms.items()}
            return {"label": label, "arms": shown, "claims": {claim: dict(g["per_seed"])}}

        tried = [grid(g, _overrides(g["config"], base)) for g in rec.get("tried", [])]
        chosen = grid(rec, ", ".join(f"{k}={base[k]}" for k in ("depths", "lrs", "warmups")
                                     if k in base) + " (chosen)")
        notes = [rec["note"]] if rec.get("note") else []
        if rec.get("amplification"):
            depths = "/".join(str(d) for d in rec.get("probe", {}).get("depths", []))
            amp = ", ".join(f"{d} [{', '.join(f'{x:.3g}' for x in v)}]"
                            for d, v in rec["amplification"].items())
            notes.append(f"Amplification probe (untrained, at {depths} blocks): {amp}.")
        return {"tried": [*tried, chosen], "chosen": "", "notes": notes}
    if "runs" in rec and "claim_values" in rec:
        values = rec["claim_values"].get(claim, {})
        return {"tried": [{"label": "the declared config", "arms": rec["runs"],
                           "claims": {claim: values} if values else {}}],
                "chosen": rec.get("chosen", ""), "notes": []}
    if "runs" in rec and "lrs" in rec and isinstance(rec.get("chosen"), Mapping):
        def reached(arm: Mapping[str, Any]) -> dict[str, Any]:
            # a target a seed did not reach (None) took more updates than the run had
            return {q: [[math.inf if u is None else u for u in s] for s in v]
                    if q == "updates_to_targets" else v for q, v in arm.items()}

        tried = [{"label": f"lr={lr}", "claims": {},
                  "arms": {a: reached(q) for a, q in rec["runs"][str(lr)].items()}}
                 for lr in rec["lrs"]]
        chosen = "the rate of each design: " + ", ".join(
            f"{d} {lr}" for d, lr in rec["chosen"].items())
        notes = [rec["note"]] if rec.get("note") else []
        if rec.get("targets"):
            notes.insert(0, "Targets (held-out loss): "
                         + "/".join(f"{t:.3g}" for t in rec["targets"])
                         + "; ∞: the median seed did not reach the target within the run.")
        return {"tried": tried, "chosen": chosen, "notes": notes}
    raise ValueError(f"{name}: pilot record of an unknown layout (keys {sorted(rec)})")


def _seeds_text(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def pilot_markdown(*names: str) -> str:
    """The pilot records ``names`` (claim IDs, or a record's name such as ``"sphere"``) as
    Markdown for a chapter's "How this experiment was designed" dropdown: the experiment, the
    pilot seeds, each variant tried with the median over the pilot seeds of every per-seed
    quantity of each arm, the per-seed values of each claim's parts (medians), what was chosen
    and when the record was made. Several names must be records of one run (as P24, P25 and
    P26 are): it is shown once, with each claim's values.

    Raises:
        TypeError, FileNotFoundError: as :func:`pilot_record` (the error names the claim).
        ValueError: no name, or records of different runs.
    """
    if not names:
        raise ValueError("pilot_markdown() takes at least one claim ID or record name")
    recs = [pilot_record(n) for n in names]
    layouts = [_pilot_layout(r, n) for r, n in zip(recs, names, strict=True)]
    first, lay = recs[0], layouts[0]
    for n, r, other in zip(names[1:], recs[1:], layouts[1:], strict=True):
        same = [(t["label"], t["arms"]) for t in other["tried"]] == \
               [(t["label"], t["arms"]) for t in lay["tried"]]
        if r.get("seeds") != first.get("seeds") or not same:
            raise ValueError(f"{n}: not the same pilot run as {names[0]}; render it apart")
        for t, o in zip(lay["tried"], other["tried"], strict=True):
            t["claims"].update(o["claims"])
    seeds = list(first.get("seeds", []))
    from lnbook.seeds import pilot_seeds

    made = f"made {first['made']}" if first.get("made") else "its date is not in the file"
    which = (f"`lnbook.seeds.pilot_seeds({len(seeds)})`, which no verdict uses"
             if seeds and tuple(seeds) == pilot_seeds(len(seeds)) else "not the pilot seeds")
    lines = [f"**Pilot record {', '.join(names)}**: experiment `{first.get('experiment')}`, "
             f"{made}.", "",
             f"Pilot seeds {_seeds_text(seeds)} ({len(seeds)} seeds, {which}).", "",
             "Tried (a per-seed figure is shown as its median over the pilot seeds):", ""]
    for k, t in enumerate(lay["tried"], 1):
        lines.append(f"{k}. {t['label']}")
        for arm, q in t["arms"].items():
            lines.append(f"   - {f'`{arm}`: ' if arm else ''}{_summary(q)}")
        for cid, parts in t["claims"].items():
            for part, vals in parts.items():
                lines.append(f"   - {cid}, *{part}*: {_median(vals)}")
    chosen = [c for c in dict.fromkeys(x["chosen"] for x in layouts) if c]
    if chosen:
        lines += ["", "Chosen: " + " ".join(chosen)]
    for note in dict.fromkeys(n for x in layouts for n in x["notes"]):
        lines += ["", note]
    return "\n".join(lines) + "\n"


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


# --- how often a fresh seed set gives each verdict, from the recorded sets ---------------------

_AGREE = re.compile(r"^(\d+)/(\d+) for, (\d+) against$")


def pooled_shares(records: Sequence[Mapping[str, Any]], claim_id: str,
                  rule: Mapping[str, Any]) -> dict[str, tuple[float, float, int]]:
    """Per part of ``claim_id``'s ``rule`` (a :func:`load_rules` entry), the share of seeds that
    counted for it and against it, pooled over every seed set of ``records`` (replication
    records, :func:`load_replication`), and the number of seeds pooled: ``(for, against,
    seeds)``. Each set's ``agree_<part>`` figure (``"3/5 for, 1 against"``) is read; a part no
    set reports is left out."""
    counts = {name: [0, 0, 0] for name in rule["parts"]}
    for rec in records:
        for s in rec.get("claims", {}).get(claim_id, {}).get("sets", {}).values():
            figures = s.get("figures", {})
            for name, c in counts.items():
                m = _AGREE.match(str(figures.get(f"agree_{_slug(name)}", "")))
                if m:
                    c[0] += int(m[1])
                    c[1] += int(m[3])
                    c[2] += int(m[2])
    return {k: (f / n, a / n, n) for k, (f, a, n) in counts.items() if n}


def outcome_odds(share_for: float, share_against: float, n: int, need: int
                 ) -> dict[str, float]:
    """The chance of each outcome of a part decided by ``need`` of ``n`` seeds (:func:`decide`)
    when each seed counts for it with probability ``share_for``, against it with
    ``share_against`` and for neither otherwise, independently: ``{"holds", "fails",
    "undecided"}``, summing to 1.

    Example::

        >>> {k: round(v, 3) for k, v in outcome_odds(0.5, 0.5, 5, 4).items()}
        {'holds': 0.188, 'fails': 0.188, 'undecided': 0.625}
    """
    if not (0 <= share_for <= 1 and 0 <= share_against <= 1
            and share_for + share_against <= 1 + 1e-12):
        raise ValueError(f"shares must lie in [0, 1] and sum to at most 1, got {share_for!r} "
                         f"and {share_against!r}")
    if not n / 2 < need <= n:
        raise ValueError(f"need must be more than half of n = {n} and at most n, got {need}")
    neither = max(0.0, 1 - share_for - share_against)
    holds = fails = 0.0
    for f in range(n + 1):
        for a in range(n + 1 - f):
            p = (math.comb(n, f) * math.comb(n - f, a)  # multinomial: f for, a against
                 * share_for ** f * share_against ** a * neither ** (n - f - a))
            if f >= need:
                holds += p
            elif a >= need:
                fails += p
    return {"holds": holds, "fails": fails, "undecided": max(0.0, 1 - holds - fails)}


def verdict_odds(rule: Mapping[str, Any], shares: Mapping[str, tuple[float, float, int]]
                 ) -> dict[str, float]:
    """The chance of each verdict that a fresh seed set gives a claim, under its ``rule`` (a
    :func:`load_rules` entry, its declared seeds and majorities) and per-seed ``shares`` of
    each part (:func:`pooled_shares`), taking the parts as independent: each combination of
    the parts' outcomes (:func:`outcome_odds`) weighted and combined (:func:`combine`).
    Verdicts of zero chance are left out. Raises ``KeyError`` when a part has no shares."""
    names = list(rule["parts"])
    per_part = []
    for name in names:
        r = rule["parts"][name]
        f, a, _ = shares[name]
        per_part.append(outcome_odds(f, a, r.of, r.agree))
    out: dict[str, float] = {}
    for combo in itertools.product(("holds", "fails", "undecided"), repeat=len(names)):
        p = math.prod(odds[o] for odds, o in zip(per_part, combo, strict=True))
        if p > 0:
            v = combine(dict(zip(names, combo, strict=True)), held=rule["held"],
                        primary=rule["primary"])
            out[v] = out.get(v, 0.0) + p
    return out
