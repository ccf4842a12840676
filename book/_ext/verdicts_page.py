"""The page "How the verdicts are made": the declared decision rules and the replication table.

``book/verdicts.md`` holds two directives:

- ``{decision-rules}``: one row per part of every rule that ``lnbook/claims.yml`` declares,
  written by :meth:`lnbook.ledger.Rule.describe`, so the page shows exactly what
  :func:`lnbook.ledger.decide_claim` applies;
- ``{replication-table}``: from ``book/replication.json`` (written by
  ``python3 dev.py replicate --sets N``), per claim the book's verdict, the verdict on each fresh
  seed set, and how many sets agree; then when, where and on what code the record was made.

Both files are read when the page is read, and the page is rebuilt when either changes.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from lnbook.ledger import agreement, claims_file, load_claims, load_replication, load_rules


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


class DecisionRules(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(claims_file()))
        rules = load_rules()
        if not rules:
            return self.parse_text_to_nodes("No claim declares a rule yet.")
        lines = ["| claim | part | per seed, the part holds when ... | all parts hold |",
                 "|---|---|---|---|"]
        for cid, r in rules.items():
            for i, (name, rule) in enumerate(r["parts"].items()):
                lines.append(f"| {cid if i == 0 else ''} | {_cell(name)} | "
                             f"{_cell(rule.describe())} | {r['held'] if i == 0 else ''} |")
        return self.parse_text_to_nodes("\n".join(lines))


class ReplicationTable(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        src = Path(self.env.srcdir) / "book"
        self.env.note_dependency(str(src / "replication.json"))
        self.env.note_dependency(str(claims_file()))
        rep = load_replication(src / "replication.json")
        if not rep.get("claims"):
            return self.parse_text_to_nodes(
                "No replication record yet: run `python3 dev.py replicate --sets 4`.")
        status = {c["id"]: c["status"]
                  for c in load_claims()["claims"]}
        sets = [str(k) for k in rep["sets"]]
        lines = ["| claim | the book's verdict | " + " | ".join(f"set {k}" for k in sets)
                 + " | agree |", "|---" * (len(sets) + 3) + "|"]
        unstable = []
        for cid, entry in sorted(rep["claims"].items()):
            book = status.get(cid, entry["book"])
            same, n = agreement(rep, cid, book)
            verdicts = [entry["sets"].get(k, {}).get("verdict", "not run") for k in sets]
            flag = "" if same == n else " (unstable across seed sets)"
            unstable += [cid] if same < n else []
            lines.append(f"| {cid} | {book} | " + " | ".join(verdicts) + f" | {same}/{n}{flag} |")
        made = rep.get("made", {})
        digest = rep.get("digest", {})
        runs = rep.get("notebooks", {})
        secs = [r["seconds"] for nb in runs.values() for r in nb.values()]
        failed = sorted(f"{nb} (set {k})" for nb, rr in runs.items() for k, r in rr.items()
                        if not r["ok"])
        lines += ["", f"{len(rep['claims']) - len(unstable)} of {len(rep['claims'])} claims "
                      "give the book's verdict on every fresh seed set; unstable across seed "
                      f"sets: {', '.join(unstable) or 'none'}.",
                  "", f"Made {made.get('date', '?')} on {made.get('machine', '?')} "
                      f"(Python {made.get('python', '?')}, torch {made.get('torch', '?')}): "
                      f"{len(runs)} notebooks on seed sets {', '.join(sets)}, "
                      f"{len(secs)} executions, the longest {max(secs, default=0):.0f} s; "
                      f"failed: {', '.join(failed) or 'none'}. Digest of lnbook's code "
                      f"`{digest.get('lnbook', '?')}`."]
        return self.parse_text_to_nodes("\n".join(lines))


def setup(app):
    app.add_directive("decision-rules", DecisionRules)
    app.add_directive("replication-table", ReplicationTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
