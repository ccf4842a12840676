"""The page "How the verdicts are made": the declared decision rules and the replication table.

``book/verdicts.md`` holds two directives:

- ``{decision-rules}``: one row per part of every rule that ``lnbook/claims.yml`` declares,
  written by :meth:`lnbook.ledger.Rule.describe`, so the page shows exactly what
  :func:`lnbook.ledger.decide_claim` applies;
- ``{replication-table}``: from ``book/replication.json`` (written by
  ``python3 dev.py replicate --sets N``), per claim the book's verdict, the verdict on each
  design seed set (1-4), and how many sets agree; then when, where and on what code the record
  was made;
- ``{confirmation-table}``: the same from ``book/confirmation.json`` (``python3 dev.py
  confirm``), the blind confirmation on the never-used seed sets of ``book/confirmation.yml``;
  a claim whose chapter code or rule changed after its confirmation is marked void.

The files are read when the page is read, and the page is rebuilt when one changes.
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from lnbook.ledger import (
    agreement,
    claims_file,
    detectable_share,
    load_claims,
    load_replication,
    load_rules,
)


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


class DecisionRules(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(claims_file()))
        rules = load_rules()
        if not rules:
            return self.parse_text_to_nodes("No claim declares a rule yet.")
        lines = ["| claim | part | per seed, the part holds when ... | found 4 times in 5 "
                 "when at least this share of seeds counts for it | all parts hold |",
                 "|---|---|---|---|---|"]
        for cid, r in rules.items():
            for i, (name, rule) in enumerate(r["parts"].items()):
                label = f"**{_cell(name)}** (primary)" if name == r["primary"] else _cell(name)
                power = detectable_share(rule.agree, rule.of)
                lines.append(f"| {cid if i == 0 else ''} | {label} | "
                             f"{_cell(rule.describe())} | {power:.2f} | "
                             f"{r['held'] if i == 0 else ''} |")
        return self.parse_text_to_nodes("\n".join(lines))


class ReplicationTable(SphinxDirective):
    record = "replication.json"
    command = "python3 dev.py replicate --sets 4"
    kind = "design seed set"

    def run(self) -> list[nodes.Node]:
        src = Path(self.env.srcdir) / "book"
        self.env.note_dependency(str(src / self.record))
        self.env.note_dependency(str(claims_file()))
        rep = load_replication(src / self.record)
        if not rep.get("claims"):
            return self.parse_text_to_nodes(f"No record yet: run `{self.command}`.")
        void = self.void(rep)
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
            if cid in void:
                flag += " (void: its chapter's code or rule changed since)"
            unstable += [cid] if same < n else []
            lines.append(f"| {cid} | {book} | " + " | ".join(verdicts) + f" | {same}/{n}{flag} |")
        made = rep.get("made", {})
        digest = rep.get("digest", {})
        runs = rep.get("notebooks", {})
        secs = [r["seconds"] for nb in runs.values() for r in nb.values()]
        failed = sorted(f"{nb} (set {k})" for nb, rr in runs.items() for k, r in rr.items()
                        if not r["ok"])
        lines += ["", f"{len(rep['claims']) - len(unstable)} of {len(rep['claims'])} claims "
                      f"give the book's verdict on every {self.kind}; unstable across seed "
                      f"sets: {', '.join(unstable) or 'none'}"
                      + (f"; void: {', '.join(sorted(void))}." if void else "."),
                  "", f"Made {made.get('date', '?')} on {made.get('machine', '?')} "
                      f"(Python {made.get('python', '?')}, torch {made.get('torch', '?')}): "
                      f"{len(runs)} notebooks on seed sets {', '.join(sets)}, "
                      f"{len(secs)} executions, the longest {max(secs, default=0):.0f} s; "
                      f"failed: {', '.join(failed) or 'none'}. Digest of lnbook's code "
                      f"`{digest.get('lnbook', '?')}`."]
        if rep.get("spent"):
            lines += ["", "Seed sets of earlier confirmations, seen and never drawn again: "
                          f"{', '.join(str(k) for k in rep['spent'])}."]
        return self.parse_text_to_nodes("\n".join(lines))


    def void(self, rep: dict) -> set[str]:
        return set()


class ConfirmationTable(ReplicationTable):
    """The blind confirmation: a claim is void when the digest of its chapter (code cells and
    rules) or of lnbook's code is no longer the one the manifest froze."""

    record = "confirmation.json"
    command = "python3 dev.py confirm"
    kind = "confirmation seed set"

    def void(self, rep: dict) -> set[str]:
        import importlib.util
        import sys

        path = Path(self.env.srcdir) / "dev.py"
        spec = importlib.util.spec_from_file_location("lnbook_dev_digests", path)
        dev = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("lnbook_dev_digests", dev)
        spec.loader.exec_module(dev)
        return dev.void_claims(rep)


def setup(app):
    app.add_directive("decision-rules", DecisionRules)
    app.add_directive("replication-table", ReplicationTable)
    app.add_directive("confirmation-table", ConfirmationTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
