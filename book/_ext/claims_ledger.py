"""The claims ledger page, built from the records the chapters wrote while they executed.

``book/claims.md`` holds the directive ``{claims-ledger}`` (once per part: ``:part: paper`` for
C01-C22, ``:part: after-2016`` for P01-P14, ``:part: today`` for Part III's P15-P22,
``:part: arguments`` for Part IV's P23-P29) and ``{claims-questions}``. Every chapter that checks
a claim calls :func:`lnbook.ledger.record` after its asserting cell; the records land in
``$LNBOOK_LEDGER/<ID>.json``, which :func:`setup` sets to ``_build/ledger`` unless it is set
already (the kernels the build starts inherit it; a chapter executed outside the build writes
no record). Notebooks are executed while Sphinx *reads*
the sources, so by the time pages are *written* every record of this build exists: the
directive leaves a placeholder, and the ``doctree-resolved`` handler fills it with a table
that joins ``lnbook/claims.yml`` (what a person wrote: paraphrase, chapter, heading, a ``seen``
sentence with ``{figure}`` placeholders) with the records (the figures and the verdict).

A claim without a record, a status in ``claims.yml`` that differs from the recorded verdict, a
placeholder that names no recorded figure, or a ``where`` that is no heading of its chapter is a
build warning, so the book's ``--warningiserror`` build fails on it (``tests/test_ledger.py``
checks the same things without a build). The page is re-read at every build, since its content
depends on other pages' execution.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from lnbook.ledger import (
    VERDICTS,
    agreement,
    agreement_text,
    claims_file,
    format_seen,
    load_claims,
    load_replication,
    load_rules,
    parts_text,
    pooled_shares,
    verdict_odds,
)
from lnbook.seeds import seed_set

logger = logging.getLogger(__name__)

PARTS = {"paper": ("C", 1, 22), "after-2016": ("P", 1, 14), "today": ("P", 15, 22),
         "arguments": ("P", 23, 29)}


def in_part(claim_id: str, part: str) -> bool:
    """Whether a claim ID (``C07``, ``P18``) belongs to a part of the ledger."""
    prefix, first, last = PARTS[part]
    cid = str(claim_id)
    return cid.startswith(prefix) and cid[1:].isdigit() and first <= int(cid[1:]) <= last


class ledger_placeholder(nodes.General, nodes.Element):
    """Replaced by the ledger table (or the questions list) once every page is read."""


class ClaimsLedger(SphinxDirective):
    option_spec = {"part": lambda s: s.strip()}

    def run(self) -> list[nodes.Node]:
        part = self.options.get("part", "paper")
        if part not in PARTS:
            raise self.error(f"claims-ledger :part: must be one of {sorted(PARTS)}, got {part!r}")
        self.env.note_dependency(str(_ledger_file(self.env.app)))
        return [ledger_placeholder(kind="table", part=part)]


class ClaimsQuestions(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        return [ledger_placeholder(kind="questions", part="paper")]


class ClaimsStability(SphinxDirective):
    """How many of the book's verdicts a fresh seed set is expected to change (a paragraph)."""

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(_ledger_file(self.env.app)))
        for name in ("replication.json", "confirmation.json"):
            self.env.note_dependency(str(Path(self.env.app.srcdir) / "book" / name))
        return [ledger_placeholder(kind="stability", part="paper")]


def _ledger_file(app) -> Path:
    """``claims.yml`` of the package the build imports (``lnbook/claims.yml``)."""
    return claims_file()


def _records_dir(app) -> Path:
    env = os.environ.get("LNBOOK_LEDGER")
    return Path(env) if env else Path(app.srcdir) / "_build" / "ledger"


def _records(app) -> dict[str, dict]:
    folder = _records_dir(app)
    out = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        rec = json.loads(path.read_text())
        out[rec["id"]] = rec
    return out


def _plain(text: str) -> str:
    """``text`` with runs of white space as one space and Sphinx's curly quotes made straight."""
    text = text.translate(str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"',
                                         "\u201d": '"'}))
    return " ".join(text.split())


def _section_anchor(app, chapter: str, where: str) -> str | None:
    """The HTML id of the section titled ``where`` in ``book/<chapter>``, if there is one."""
    docname = f"book/{chapter}"
    if docname not in app.env.all_docs:
        return None
    doctree = app.env.get_doctree(docname)
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        if title is not None and _plain(title.astext()) == _plain(where) and section["ids"]:
            return section["ids"][0]
    return None


def _para(*children: nodes.Node | str) -> nodes.paragraph:
    p = nodes.paragraph()
    for c in children:
        p += nodes.Text(c) if isinstance(c, str) else c
    return p


def _link(app, fromdoc: str, chapter: str, anchor: str | None, text: str) -> nodes.Node:
    docname = f"book/{chapter}"
    if docname not in app.env.all_docs:
        return nodes.literal(text=chapter)
    uri = app.builder.get_relative_uri(fromdoc, docname) + (f"#{anchor}" if anchor else "")
    return nodes.reference("", text, internal=True, refuri=uri)


def _row(cells: list[list[nodes.Node]]) -> nodes.row:
    row = nodes.row()
    for content in cells:
        entry = nodes.entry()
        for c in content:
            entry += c
        row += entry
    return row


def _table(app, fromdoc: str, part: str) -> list[nodes.Node]:
    ledger = load_claims()
    records = _records(app)
    replication = load_replication(Path(app.srcdir) / "book" / "replication.json")
    confirmation = load_replication(Path(app.srcdir) / "book" / "confirmation.json")
    rules = load_rules()
    claims = [c for c in ledger["claims"] if in_part(c["id"], part)]
    if not claims:
        return [_para("No claim of this part is checked yet.")]
    widths = (34, 14, 22, 30)
    table, tgroup = nodes.table(classes=["claims-ledger"]), nodes.tgroup(cols=len(widths))
    table += tgroup
    for w in widths:
        tgroup += nodes.colspec(colwidth=w)
    head = nodes.thead()
    head += _row([[_para(h)] for h in ("Claim (paraphrased)", "Verdict", "Checked in",
                                          "Seen when the book was built")])
    tgroup += head
    body = nodes.tbody()
    counts: Counter[str] = Counter()
    for c in claims:
        cid, chapter, where = c["id"], c["chapter"], " ".join(str(c["where"]).split())
        rec = records.get(cid)
        anchor = _section_anchor(app, chapter, where)
        if anchor is None:
            logger.warning(f"claims ledger: {cid} points at '{where}', no heading of {chapter}",
                           location=fromdoc)
        if rec is None:
            logger.warning(f"claims ledger: no record for {cid}; the chapter {chapter} must call "
                           f"lnbook.ledger.record({cid!r}, ...)", location=fromdoc)
            verdict, seen = "no record", "(the chapter recorded nothing in this build)"
        else:
            verdict = rec["verdict"]
            if verdict != c["status"]:
                # claims.yml holds the verdict of the book's own seeds (set 0): there a different
                # verdict is an error; on a fresh seed set it is what the replication measures
                report = logger.warning if seed_set() == 0 else logger.info
                report(f"claims ledger: {cid} status in claims.yml is {c['status']!r} but "
                       f"{chapter} computed {verdict!r} (seed set {seed_set()})", location=fromdoc)
            try:
                seen = format_seen(" ".join(str(c["seen"]).split()), rec["figures"])
            except (KeyError, ValueError, IndexError) as err:
                logger.warning(f"claims ledger: {cid} 'seen' cannot be filled: {err!r}",
                               location=fromdoc)
                seen = str(c["seen"])
        counts[verdict] += 1
        claim = _para(nodes.strong(text=cid), f" (§ {c['section']}) ",
                      " ".join(str(c["claim"]).split()))
        checked = _para(_link(app, fromdoc, chapter, None, chapter), ", section ",
                        _link(app, fromdoc, chapter, anchor, where))
        across = agreement_text(replication, cid, verdict)  # e.g. "same on 4/4 seed sets"
        same, n = agreement(replication, cid, verdict)
        if same < n:  # said plainly: this verdict is not the claim's on every seed set
            across = f"unstable across seed sets: {across}"
        verdict_cell = [_para(nodes.strong(text=verdict))] + ([_para(across)] if across else [])
        confirmed = agreement_text(confirmation, cid, verdict)
        if confirmed:  # the blind confirmation on never-used seed sets (book/verdicts.md)
            same_c, n_c = agreement(confirmation, cid, verdict)
            verdict_cell.append(_para(("" if same_c == n_c else "unstable: ")
                                      + confirmed.replace("fresh", "confirmation")))
            if same_c < n_c or same < n:
                verdict_cell.append(_para(_odds_text(rules, cid, verdict,
                                                     [replication, confirmation])))
        elif same < n:
            verdict_cell.append(_para(_odds_text(rules, cid, verdict, [replication])))
        seen_cell: list[nodes.Node] = [_para(seen)]
        if rec is not None and cid in rules:  # each part's outcome and per-seed effect
            items = nodes.bullet_list()
            for line in parts_text(rules[cid], rec["figures"]):
                item = nodes.list_item()
                item += _para(line)
                items += item
            seen_cell.append(items)
        body += _row([[claim], verdict_cell, [checked], seen_cell])
    tgroup += body
    summary = ", ".join(f"{counts[v]} {v}" for v in (*VERDICTS, "no record") if counts[v])
    return [_para(f"{len(claims)} claims: {summary}."), table]


def _claim_odds(rules: dict, cid: str, records: list[dict]) -> dict[str, float] | None:
    """:func:`lnbook.ledger.verdict_odds` of ``cid`` from its parts' per-seed shares pooled
    over ``records``; None without a rule or without counts for every part."""
    rule = rules.get(cid)
    shares = pooled_shares(records, cid, rule) if rule else {}
    if not rule or set(shares) != set(rule["parts"]):
        return None
    return verdict_odds(rule, shares)


def _odds_text(rules: dict, cid: str, verdict: str, records: list[dict]) -> str:
    """Why an unstable verdict moves: the chance that a fresh seed set gives ``verdict``, and
    the likeliest verdict (:func:`_claim_odds`)."""
    odds = _claim_odds(rules, cid, records)
    if odds is None:
        return "(no per-seed counts recorded to estimate how often)"
    likeliest = max(odds, key=odds.get)
    n_sets = sum(len(r.get("claims", {}).get(cid, {}).get("sets", {})) for r in records)
    text = (f"from the seeds of these {n_sets} sets, a fresh set gives this verdict with "
            f"chance {odds.get(verdict, 0.0):.2f}")
    if likeliest != verdict:
        text += f"; likeliest: {likeliest} ({odds[likeliest]:.2f})"
    return text


def expected_moves(rules: dict, claims: list[dict], records: list[dict]) -> dict[str, float]:
    """Per claim of ``claims`` (``claims.yml`` rows) whose rule has per-seed counts for every
    part in ``records`` (replication records), the chance that a fresh seed set gives another
    verdict than its ``status`` (:func:`lnbook.ledger.verdict_odds`); their sum is the number
    of verdicts a fresh set is expected to change."""
    odds = {c["id"]: (c["status"], _claim_odds(rules, c["id"], records)) for c in claims}
    return {cid: 1.0 - o.get(status, 0.0) for cid, (status, o) in odds.items() if o is not None}


def moves_distribution(moves: dict[str, float]) -> list[float]:
    """The chance that a fresh seed set changes exactly ``k`` verdicts, ``k = 0 ..
    len(moves)``, from each claim's chance of another verdict (:func:`expected_moves`), the
    claims taken as independent (a Poisson binomial distribution)."""
    dist = [1.0]
    for p in moves.values():
        dist = [a * (1 - p) + b * p for a, b in zip([*dist, 0.0], [0.0, *dist], strict=True)]
    return dist


def stability_text(moves: dict[str, float], top: int = 5, at_most: int = 3) -> str:
    """Two sentences on :func:`expected_moves`: the expected number and the largest terms,
    and the chance that a fresh set changes at most ``at_most`` verdicts."""
    if not moves:
        return "No seed set is recorded yet to estimate how many verdicts would move."
    largest = sorted(moves.items(), key=lambda kv: -kv[1])[:top]
    few = sum(moves_distribution(moves)[:at_most + 1])
    return (f"From the seeds of the recorded sets, a fresh seed set is expected to give "
            f"another verdict than the book's on {sum(moves.values()):.1f} of the "
            f"{len(moves)} claims with recorded counts. The largest chances: "
            + ", ".join(f"{cid} {p:.2f}" for cid, p in largest) + ". Taking the claims as "
            f"independent, a fresh set changes at most {at_most} verdicts with chance "
            f"{few:.2f}.")


def _stability(app) -> list[nodes.Node]:
    records = [load_replication(Path(app.srcdir) / "book" / name)
               for name in ("replication.json", "confirmation.json")]
    moves = expected_moves(load_rules(), load_claims()["claims"], records)
    return [_para(stability_text(moves))]


def _questions(app, fromdoc: str) -> list[nodes.Node]:
    ledger = load_claims()
    items = nodes.enumerated_list()
    for q in ledger.get("questions", []):
        where = " ".join(str(q["where"]).split())
        anchor = _section_anchor(app, q["chapter"], where)
        if anchor is None:
            logger.warning(f"claims ledger: a question points at '{where}', no heading of "
                           f"{q['chapter']}", location=fromdoc)
        item = nodes.list_item()
        item += _para(" ".join(str(q["question"]).split()), " Answered in ",
                      _link(app, fromdoc, q["chapter"], anchor, f"{q['chapter']}, {where}"), ".")
        items += item
    return [items]


SEEN = "Seen when the book was built"


def _on_own_row(nodes_: list[nodes.Node], title: str = SEEN) -> list[nodes.Node]:
    """The ledger's tables with the column headed ``title`` moved to a full-width row of its own.

    Each claim becomes two rows: the short columns (claim, verdict, where it is checked) side
    by side, then the long ``seen`` sentence across the whole table, opened by ``title`` in
    bold. The table then fits the page's column at any width (its narrow columns wrap) and no
    column is cut off. The table is made first and laid out here, so that a column added to
    ``_table`` stays a column.
    """
    for table in (n for n in nodes_ if isinstance(n, nodes.table)):
        tgroup = table.next_node(nodes.tgroup)
        (head,) = tgroup.findall(nodes.thead)
        names = [entry.astext() for entry in head.next_node(nodes.row).children]
        if title not in names:
            continue
        k = names.index(title)
        tgroup.remove([c for c in tgroup.children if isinstance(c, nodes.colspec)][k])
        tgroup["cols"] -= 1
        for row in head.findall(nodes.row):
            row.remove(row.children[k])
        (body,) = tgroup.findall(nodes.tbody)
        for row in list(body.children):
            entry = row.children[k]
            row.remove(entry)
            row["classes"].append("claim")
            full = nodes.entry(morecols=tgroup["cols"] - 1)
            label = nodes.strong(text=f"{title}: ")
            children = list(entry.children)
            if children and isinstance(children[0], nodes.paragraph):
                children[0].insert(0, label)
            else:
                children.insert(0, _para(label))
            full.extend(children)
            seen = nodes.row(classes=["claim-seen"])
            seen += full
            body.insert(body.index(row) + 1, seen)
        # fixed column widths, in proportion to the colspecs, so long words wrap in place
        table["classes"].append("colwidths-given")
    return nodes_


def _fill(app, doctree, docname: str) -> None:
    for node in list(doctree.findall(ledger_placeholder)):
        if node["kind"] == "table":
            node.replace_self(_on_own_row(_table(app, docname, node["part"])))
        elif node["kind"] == "stability":
            node.replace_self(_stability(app))
        else:
            node.replace_self(_questions(app, docname))


def _always_reread(app, env, added, changed, removed) -> list[str]:
    """The ledger page depends on every chapter's execution: read it again at every build."""
    return [d for d in env.all_docs if d.endswith("claims") and d not in removed]


def setup(app):
    # the chapters this build executes write their records here (lnbook.ledger.ledger_dir);
    # `python3 dev.py book` sets the same folder before it executes them into the cache
    os.environ.setdefault("LNBOOK_LEDGER", str(Path(app.srcdir) / "_build" / "ledger"))
    app.add_node(ledger_placeholder)
    app.add_directive("claims-ledger", ClaimsLedger)
    app.add_directive("claims-questions", ClaimsQuestions)
    app.add_directive("claims-stability", ClaimsStability)
    app.connect("doctree-resolved", _fill)
    app.connect("env-get-outdated", _always_reread)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
