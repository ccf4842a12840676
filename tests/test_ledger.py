"""The claims ledger: records written by the chapters, and their agreement with claims.yml.

The first half tests :mod:`lnbook.ledger` itself. The second half checks the book: every claim
of ``lnbook/claims.yml`` has a record from the last build (``_build/ledger``, written while
``python3 dev.py book`` executed the chapters), its status equals the verdict the chapter
computed, its ``seen`` sentence types no figure and names only recorded ones, and its ``where``
is a heading of its chapter with an asserting cell under it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from lnbook import ledger

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CLAIMS_YML = ROOT / "lnbook" / "claims.yml"
CLAIMS = yaml.safe_load(CLAIMS_YML.read_text())["claims"]
RECORDS = Path(os.environ.get("LNBOOK_LEDGER", ROOT / "_build" / "ledger"))
REPLICATION = BOOK / "replication.json"
CLAIM_IDS_ALL = {c["id"] for c in CLAIMS}


# --- lnbook.ledger --------------------------------------------------------------------------


@pytest.fixture
def ledger_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LNBOOK_LEDGER", str(tmp_path))
    return tmp_path


def test_record_writes_json_and_rounds(ledger_env):
    rec = ledger.record("C17", "partially reproduced",
                        {"ln_area": [0.123456, 0.2], "seeds": 3, "faster": True,
                         "nan_seen": float("nan")}, note="LN {ln_area}")
    on_disk = json.loads((ledger_env / "C17.json").read_text())
    assert on_disk["verdict"] == "partially reproduced"
    assert on_disk["figures"] == {"ln_area": [0.1235, 0.2], "seeds": 3, "faster": True,
                                  "nan_seen": "nan"}
    assert ledger.load_records(ledger_env)["C17"] == ledger.ClaimRecord.from_dict(on_disk)
    md = rec._repr_markdown_()
    assert "partially reproduced" in md and "| `seeds` | 3 |" in md and "LN 0.123/0.2" in md


def test_record_accepts_numpy_and_torch(ledger_env):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    rec = ledger.record("P03", "explained", {"gap": np.float64(1e-17), "per_seed":
                                             torch.tensor([1.0, 2.0])})
    assert rec.figures == {"gap": 1e-17, "per_seed": [1.0, 2.0]}


@pytest.mark.parametrize("args, message", [
    (("C7", "reproduced", {"a": 1}), "look like"),
    (("C07", "confirmed", {"a": 1}), "verdict must be one of"),
    (("C07", "reproduced", {}), "none given"),
    (("C07", "reproduced", {"A b": 1}), "lower-case identifiers"),
    (("C07", "reproduced", {"a": object()}), "number, a short string"),
    (("C07", "reproduced", {"a": "x" * 200}), "short labels"),
])
def test_record_rejects_bad_input(ledger_env, args, message):
    with pytest.raises(ValueError, match=message):
        ledger.record(*args)
    assert not list(ledger_env.iterdir())


def test_record_note_must_name_recorded_figures(ledger_env):
    with pytest.raises(KeyError, match="names no recorded figure"):
        ledger.record("C01", "reproduced", {"a": 1.0}, note="{b}")


def test_verdict_from_parts():
    assert ledger.verdict_from({"x": True, "y": True}, primary="x") == "reproduced"
    assert ledger.verdict_from({"x": True, "y": False}, primary="x") == "partially reproduced"
    assert ledger.verdict_from({"x": True, "y": False}, primary="y") == "not reproduced"
    assert ledger.verdict_from({"x": False}) == "not reproduced"
    with pytest.raises(ValueError):
        ledger.verdict_from({})


def test_format_seen():
    figs = {"ln": [0.4781, 0.404], "bn": 0.3333, "k": 3, "ok": False, "tiny": 2.2e-16}
    assert ledger.format_seen("LN {ln} vs BN {bn:.1f}", figs) == "LN 0.478/0.404 vs BN 0.3"
    assert ledger.format_seen("{k} seeds, {ok}, {tiny:.1e}", figs) == "3 seeds, no, 2.2e-16"


def test_ledger_dir_is_the_builds_folder_or_none(tmp_path, monkeypatch):
    monkeypatch.setenv("LNBOOK_LEDGER", "/some/where")
    assert ledger.ledger_dir() == Path("/some/where")
    # outside the build: none, even in a checkout of the book (its _toc.yml above the cwd)
    monkeypatch.delenv("LNBOOK_LEDGER")
    (tmp_path / "_toc.yml").write_text("root: x\n")
    (tmp_path / "book").mkdir()
    monkeypatch.chdir(tmp_path / "book")
    assert ledger.ledger_dir() is None


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if "__pycache__" not in p.parts}


def test_outside_the_build_the_verdict_is_decided_and_shown_and_nothing_written(
        tmp_path, monkeypatch):
    """A chapter run on Colab, Binder or in a reader's folder: the rules come from the package,
    the record is the cell's result, and no file appears in the folder, in a checkout above it
    or next to the package."""
    monkeypatch.delenv("LNBOOK_LEDGER", raising=False)
    (tmp_path / "_toc.yml").write_text("root: x\n")  # as on Binder: inside a checkout
    work = tmp_path / "book"
    work.mkdir()
    monkeypatch.chdir(work)
    package = Path(ledger.__file__).parent
    before_package, before_parent = _files(package), set(package.parent.iterdir())
    parts = {k: [r.at + r.margin + 1.0 if r.direction == "above"
                 else r.at - r.margin - 1.0 if r.direction == "below" else True] * r.of
             for k, r in ledger.load_rules()["C17"]["parts"].items()}
    decision = ledger.decide_claim("C17", parts)
    assert decision.verdict == "reproduced"  # every seed far on the claimed side of every part
    rec = ledger.record("C17", decision.verdict, decision.figures())
    assert rec.verdict == "reproduced" and "**reproduced**" in rec._repr_markdown_()
    assert _files(tmp_path) == {tmp_path / "_toc.yml", work}
    assert _files(package) == before_package and set(package.parent.iterdir()) == before_parent


def test_the_books_build_and_only_it_records(tmp_path, monkeypatch):
    """`dev.py book` and the claims ledger's Sphinx extension (whose kernels inherit the
    variable) point the ledger at `_build/ledger`; a folder already named is kept."""
    monkeypatch.setenv("LNBOOK_LEDGER", "restored after the test")
    monkeypatch.delenv("LNBOOK_LEDGER")
    sys.path.insert(0, str(BOOK / "_ext"))
    try:
        import claims_ledger
    finally:
        sys.path.pop(0)

    class App:
        srcdir = str(tmp_path)

        def __getattr__(self, name):  # add_node, add_directive, connect: nothing to record
            return lambda *args, **kwargs: None

    claims_ledger.setup(App())
    assert ledger.ledger_dir() == tmp_path / "_build" / "ledger"
    monkeypatch.setenv("LNBOOK_LEDGER", str(tmp_path / "set-1"))  # dev.py replicate's
    claims_ledger.setup(App())
    load_dev().record_claims()
    assert ledger.ledger_dir() == tmp_path / "set-1"
    monkeypatch.delenv("LNBOOK_LEDGER")
    load_dev().record_claims()
    assert ledger.ledger_dir() == ROOT / "_build" / "ledger"


def test_the_rules_ship_inside_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # read from anywhere, through importlib.resources
    assert ledger.claims_file() == CLAIMS_YML.resolve()
    assert ledger.load_claims() == yaml.safe_load(CLAIMS_YML.read_text())
    assert ledger.load_rules() == ledger.load_rules(CLAIMS_YML)
    assert not (ROOT / "book" / "claims.yml").exists(), "one copy of claims.yml, in lnbook/"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"claims.yml"' in pyproject, "claims.yml must be package data in pyproject.toml"


# --- decision rules: decide, combine, decide_claim ------------------------------------------

# C15-like: baseline updates over LN updates to the target, 5 seeds, LN claimed faster
FASTER = ledger.Rule("baseline's updates over LN's", "above", agree=4, of=5, at=1.0,
                     margin=0.05, trivial="both arms reach the target")


@pytest.mark.parametrize("values, outcome, n_for, n_against", [
    ([1.31, 1.25, 1.4, 1.12, 1.6], "holds", 5, 0),
    ([1.31, 1.25, 0.98, 1.12, 1.6], "holds", 4, 0),          # one tie inside the band
    ([1.31, 1.25, 0.9, 1.12, 0.8], "undecided", 3, 2),       # 3 of 5 is below the majority
    ([0.7, 0.85, 0.66, 1.2, 0.9], "fails", 1, 4),
    ([1.04, 0.97, 1.0, 1.02, 0.99], "undecided", 0, 0),      # every seed inside the band
    ([1.31, float("nan"), 1.4, 1.12, float("inf")], "holds", 4, 0),  # nan decides nothing
])
def test_decide_counts_seeds_for_and_against(values, outcome, n_for, n_against):
    d = ledger.decide(FASTER, values)
    assert (d.outcome, d.n_for, d.n_against, d.n, d.need) == (outcome, n_for, n_against, 5, 4)


def test_decide_below_with_margin_and_arrays():
    np = pytest.importorskip("numpy")
    lower = ledger.Rule("LN's final error minus BN's", "below", agree=8, of=10, margin=0.01)
    gaps = np.array([-0.03, -0.05, -0.012, -0.02, -0.04, -0.009, -0.06, -0.02, -0.03, -0.05])
    assert ledger.decide(lower, gaps).outcome == "holds"  # 9 beyond the margin, one tie
    gaps[[0, 2]] = [0.02, 0.0]
    assert ledger.decide(lower, gaps).outcome == "undecided"  # 7 for, 1 against
    assert str(ledger.decide(lower, -gaps)) == (
        "undecided (1 of 10 seeds for, 7 against; 8 must agree)")


def test_decide_trivial_phase_bar_takes_seeds_out():
    values = [1.31, 1.25, 1.4, 1.12, 1.6]
    d = ledger.decide(FASTER, values, trivial_ok=[True, True, False, True, False])
    assert (d.outcome, d.n_for) == ("undecided", 3)
    with pytest.raises(ValueError, match="trivial_ok has 2 entries for 5 seeds"):
        ledger.decide(FASTER, values, trivial_ok=[True, True])


def test_decide_yes_no_parts_and_other_seed_counts():
    every = ledger.Rule("LN's output unchanged", "yes", agree=3, of=3)
    assert ledger.decide(every, [True, True, True]).outcome == "holds"
    assert ledger.decide(every, [True, False, True]).outcome == "undecided"
    assert ledger.decide(every, [False] * 3).outcome == "fails"
    # ten seeds where the rule declares five: the same fraction, 8 of 10
    d = ledger.decide(FASTER, [1.3] * 8 + [0.5] * 2)
    assert (d.outcome, d.need) == ("holds", 8)
    assert ledger.decide(FASTER, [1.3] * 7 + [0.5] * 3).outcome == "undecided"
    with pytest.raises(ValueError, match="yes/no"):
        ledger.decide(every, [0.5, 1, 1])
    with pytest.raises(ValueError, match="a number per seed"):
        ledger.decide(FASTER, ["fast"] * 5)


@pytest.mark.parametrize("fields, message", [
    ({"quantity": "x", "direction": "up", "majority": "4 of 5"}, "direction must be one of"),
    ({"quantity": "x", "direction": "below", "majority": "2 of 5"}, "more than half"),
    ({"quantity": "x", "direction": "below", "majority": "6 of 5"}, "more than half"),
    ({"quantity": "x", "direction": "below", "majority": "most"}, "read like '4 of 5'"),
    ({"quantity": "", "direction": "below", "majority": "4 of 5"}, "needs a 'quantity'"),
    ({"quantity": "x", "direction": "below", "majority": "4 of 5", "margin": -1},
     "margin must be"),
    ({"quantity": "x", "direction": "below", "majority": "4 of 5", "seeds": 5}, "unknown"),
])
def test_rule_from_dict_rejects_bad_rules(fields, message):
    with pytest.raises(ValueError, match=message):
        ledger.Rule.from_dict(fields)


def test_rule_describes_itself():
    assert FASTER.describe() == ("baseline's updates over LN's: above 1 by more than 0.05 on "
                                 "at least 4 of 5 seeds; trivial-phase bar: both arms reach "
                                 "the target")


# the first part is the primary one (the claim's headline)
@pytest.mark.parametrize("outcomes, held, verdict", [
    (["holds", "holds"], "reproduced", "reproduced"),
    (["holds"], "explained", "explained"),
    (["holds", "holds", "holds"], "explained", "explained"),
    (["holds", "fails"], "reproduced", "partially reproduced"),
    (["holds", "undecided"], "reproduced", "partially reproduced"),
    (["holds", "fails", "holds"], "explained", "partially reproduced"),
    (["fails", "undecided"], "reproduced", "not reproduced"),
    (["fails", "holds"], "reproduced", "not reproduced"),      # C15: "ends better" cannot save it
    (["fails", "holds", "holds"], "reproduced", "not reproduced"),
    (["fails", "fails"], "reproduced", "not reproduced"),
    (["fails"], "reproduced", "not reproduced"),
    (["undecided", "holds"], "reproduced", ledger.UNDECIDED),  # whatever the others do
    (["undecided", "fails"], "reproduced", ledger.UNDECIDED),
    (["undecided", "undecided"], "reproduced", ledger.UNDECIDED),
    (["undecided"], "explained", ledger.UNDECIDED),
])
def test_combine_every_branch(outcomes, held, verdict):
    parts = {f"p{i}": o for i, o in enumerate(outcomes)}
    assert ledger.combine(parts, held, primary="p0") == verdict
    # the primary part is named, not taken from the order
    assert ledger.combine(dict(reversed(parts.items())), held, primary="p0") == verdict


def test_combine_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one part"):
        ledger.combine({})
    with pytest.raises(ValueError, match="holds', 'fails' or 'undecided"):
        ledger.combine({"a": "yes"})
    with pytest.raises(ValueError, match="held must be"):
        ledger.combine({"a": "holds"}, held="confirmed")
    with pytest.raises(ValueError, match="needs primary="):
        ledger.combine({"a": "holds", "b": "fails"})
    with pytest.raises(ValueError, match="primary part 'c' is not one of"):
        ledger.combine({"a": "holds", "b": "fails"}, primary="c")
    assert ledger.combine({"a": "fails"}) == "not reproduced"  # one part: it is the primary


def test_decide_relative_margin_scales_with_the_compared_value():
    # DyT minus LN in nats, "within 20% of LN's loss": the bound moves with LN's loss
    rel = ledger.Rule("DyT's loss minus LN's", "below", agree=2, of=3, at=0.2,
                      relative="LN's loss")
    gaps, ln = [0.03, 0.03, 0.15], [0.1, 0.2, 1.0]
    d = ledger.decide(rel, gaps, reference=ln)  # bounds 0.02, 0.04, 0.2
    assert (d.outcome, d.n_for, d.n_against) == ("holds", 2, 1)
    d = ledger.decide(rel, gaps, reference=[0.1, 0.1, 0.5])  # bounds 0.02, 0.02, 0.1
    assert (d.outcome, d.n_for, d.n_against) == ("fails", 0, 3)
    # the margin is relative too: inside 0.2 +- 0.05 of the reference counts for neither
    band = ledger.Rule("gap", "below", agree=2, of=3, at=0.2, margin=0.05, relative="LN")
    assert ledger.decide(band, [0.0, 0.22, 0.5], reference=[1.0, 1.0, 1.0]).n_for == 1
    assert ledger.decide(band, [0.0, 0.22, 0.5], reference=[1.0, 1.0, 1.0]).n_against == 1
    assert d.effect.median == pytest.approx(0.3)  # gaps as fractions of the reference
    with pytest.raises(ValueError, match="give its value per seed as reference="):
        ledger.decide(rel, gaps)
    with pytest.raises(ValueError, match="reference has 2 entries for 3 seeds"):
        ledger.decide(rel, gaps, reference=[1.0, 1.0])
    with pytest.raises(ValueError, match="is not relative"):
        ledger.decide(FASTER, [1.2] * 5, reference=[1.0] * 5)
    r = ledger.Rule.from_dict({"quantity": "gap", "direction": "below", "at": 0.2,
                               "majority": "2 of 3", "relative": "LN's loss"})
    assert r.relative == "LN's loss"
    assert "fractions of LN's loss" in r.describe()
    with pytest.raises(ValueError, match="names the compared quantity"):
        ledger.Rule.from_dict({"quantity": "gap", "direction": "below", "majority": "2 of 3",
                               "relative": True})


def test_effect_is_the_median_with_an_exact_interval():
    e = ledger.effect([1.333, 1.133, 1.231])
    assert (e.median, e.low, e.high, e.n) == (1.231, 1.133, 1.333, 3)
    assert e.level == pytest.approx(0.75)  # the range of 3 values: 1 - 2 / 2**3
    e = ledger.effect([5, 1, 4, 2, 3, 6, 8, 7, 9, 0])
    assert (e.median, e.low, e.high) == (4.5, 1.0, 8.0)  # k = 2 of 10
    assert e.level == pytest.approx(1 - 2 * 11 / 1024)
    e = ledger.effect(list(range(20)), level=0.95)
    # the sign test's interval for n = 20 at 95%: the 6th and 15th order statistics
    assert (e.low, e.high) == (5.0, 14.0) and e.level == pytest.approx(0.9586, abs=1e-4)
    assert ledger.effect([1.0, float("nan"), 3.0, float("inf")]).n == 3
    assert ledger.effect([2.0, float("inf"), float("inf")]).median == float("inf")
    assert ledger.effect([1.0, 2.0, 3.0]) == ledger.effect([3.0, 1.0, 2.0])  # deterministic
    with pytest.raises(ValueError, match="not NaN"):
        ledger.effect([float("nan")])
    with pytest.raises(ValueError, match="a number per seed"):
        ledger.effect([True, False])
    with pytest.raises(ValueError, match="level must lie"):
        ledger.effect([1.0], level=1.0)


def test_detectable_share_is_the_power_line_of_a_majority():
    from math import comb
    for need, n in [(2, 3), (4, 5), (8, 10), (16, 20)]:
        p = ledger.detectable_share(need, n)
        reach = sum(comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(need, n + 1))
        assert reach == pytest.approx(0.8, abs=1e-9)
    assert ledger.detectable_share(1, 1) == pytest.approx(0.8)
    assert ledger.detectable_share(16, 20) > ledger.detectable_share(8, 10) * 0.99
    with pytest.raises(ValueError, match="need must be from 1"):
        ledger.detectable_share(6, 5)
    d = ledger.decide(FASTER, [1.3] * 5)
    assert d.power == pytest.approx(ledger.detectable_share(4, 5))


def test_outcome_odds_equal_the_decisions_of_every_seed_pattern():
    """Exact: every assignment of for / against / neither to n seeds, weighted, decided."""
    import itertools
    import math

    rule = ledger.Rule("q", "above", agree=3, of=4)
    for f, a in [(0.5, 0.3), (0.9, 0.0), (0.2, 0.7), (0.0, 0.0), (0.4, 0.6)]:
        p = {1: f, -1: a, 0: 1 - f - a}
        want = {"holds": 0.0, "fails": 0.0, "undecided": 0.0}
        for sides in itertools.product((1, -1, 0), repeat=4):
            values = [{1: 1.0, -1: -1.0, 0: 0.0}[s] for s in sides]
            ok = [s != 0 for s in sides]  # a seed for neither: out of the trivial phase
            want[ledger.decide(rule, values, trivial_ok=ok).outcome] += math.prod(
                p[s] for s in sides)
        got = ledger.outcome_odds(f, a, 4, 3)
        assert got == pytest.approx(want, abs=1e-12)
        assert sum(got.values()) == pytest.approx(1)
    with pytest.raises(ValueError, match="shares"):
        ledger.outcome_odds(0.7, 0.5, 5, 4)
    with pytest.raises(ValueError, match="more than half"):
        ledger.outcome_odds(0.5, 0.5, 4, 2)


def test_pooled_shares_and_verdict_odds_from_recorded_sets():
    rules = {"parts": {"fast": ledger.Rule("q", "above", agree=2, of=3),
                       "low": ledger.Rule("r", "below", agree=2, of=3)},
             "held": "reproduced", "primary": "fast"}
    sets = {"1": {"figures": {"agree_fast": "3/3 for, 0 against",
                              "agree_low": "1/3 for, 1 against"}},
            "2": {"figures": {"agree_fast": "2/3 for, 1 against"}}}
    records = [{"claims": {"C99": {"sets": sets}}}, {"claims": {}}]
    shares = ledger.pooled_shares(records, "C99", rules)
    assert shares == {"fast": (5 / 6, 1 / 6, 6), "low": (1 / 3, 1 / 3, 3)}
    odds = ledger.verdict_odds(rules, shares)
    fast = ledger.outcome_odds(5 / 6, 1 / 6, 3, 2)
    low = ledger.outcome_odds(1 / 3, 1 / 3, 3, 2)
    assert odds["reproduced"] == pytest.approx(fast["holds"] * low["holds"])
    assert odds["partially reproduced"] == pytest.approx(fast["holds"] * (1 - low["holds"]))
    assert odds["not reproduced"] == pytest.approx(fast["fails"])
    assert "undecided at this scale" not in odds  # 3 seeds, 2 needed, no neither: decided
    assert sum(odds.values()) == pytest.approx(1)
    with pytest.raises(KeyError):
        ledger.verdict_odds(rules, {"fast": shares["fast"]})


def test_decide_claim_by_the_declared_rule(tmp_path):
    path = tmp_path / "claims.yml"
    path.write_text("""claims:
- id: C15
  rule:
    primary: faster
    parts:
      faster: {quantity: updates ratio, direction: above, at: 1, margin: 0.05,
               majority: 2 of 3}
      ends lower: {quantity: LN final minus baseline final, direction: below,
                   majority: 2 of 3}
- id: C16
""")
    rules = ledger.load_rules(path)
    assert list(rules) == ["C15"] and rules["C15"]["held"] == "reproduced"
    assert rules["C15"]["primary"] == "faster"
    got = ledger.decide_claim("C15", {"faster": [1.3, 1.2, 1.01],
                                      "ends lower": [0.4, -0.1, 0.2]}, rules=rules)
    assert got.verdict == "partially reproduced" and got.primary == "faster"
    assert got.figures() == {"agree_faster": "2/3 for, 0 against",
                             "outcome_faster": "holds, primary",
                             "effect_faster": "1.2 [1.01, 1.3] (75%, 3 seeds)",
                             "agree_ends_lower": "1/3 for, 2 against",
                             "outcome_ends_lower": "fails",
                             "effect_ends_lower": "0.2 [-0.1, 0.4] (75%, 3 seeds)"}
    assert "| faster (primary) | holds | 2 of 3 |" in got._repr_markdown_()
    # the primary part fails: not reproduced, though the other part holds
    got = ledger.decide_claim("C15", {"faster": [0.8, 0.9, 1.3],
                                      "ends lower": [-0.4, -0.1, -0.2]}, rules=rules)
    assert got.verdict == "not reproduced"
    with pytest.raises(ValueError, match="declares"):
        ledger.decide_claim("C15", {"faster": [1.3, 1.2, 1.1]}, rules=rules)
    with pytest.raises(KeyError, match="C16 declares no rule"):
        ledger.decide_claim("C16", {}, rules=rules)
    path.write_text(path.read_text().replace("primary: faster", "primary: quicker"))
    with pytest.raises(ValueError, match="C15: rule 'primary' names the part"):
        ledger.load_rules(path)


def test_parts_text_shows_each_part_beside_the_verdict():
    rule = {"parts": {"faster": None, "ends lower": None, "unreported": None},
            "primary": "faster"}
    dec = ledger.ClaimDecision("C15", "partially reproduced", {
        "faster": ledger.decide(FASTER, [1.3, 1.2, 1.01, 1.5, 1.4]),
        "ends lower": ledger.Decision("fails", 1, 4, 5, 4)}, "faster")
    assert ledger.parts_text(rule, dec.figures()) == [
        "faster (primary): holds, 4/5 for, 0 against; median 1.3 [1.01, 1.5] (94%, 5 seeds)",
        "ends lower: fails, 1/5 for, 4 against",
        "unreported"]


def test_every_declared_rule_of_claims_yml_is_well_formed():
    rules = ledger.load_rules()
    assert rules, "claims.yml declares no rule"
    for cid, r in rules.items():
        assert cid in CLAIM_IDS_ALL
        for part in r["parts"].values():
            assert part.describe()
        assert r["primary"] in r["parts"], cid
    raw = {c["id"]: c["rule"] for c in CLAIMS if c.get("rule")}
    several = [cid for cid, r in raw.items() if len(r["parts"]) > 1 and "primary" not in r]
    assert not several, f"rules of several parts that name no primary part: {several}"


# --- the replication record (python3 dev.py replicate) --------------------------------------


def load_dev():
    spec = importlib.util.spec_from_file_location("lnbook_dev", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    return dev


def test_agreement_across_seed_sets():
    rep = {"claims": {"C15": {"sets": {str(k): {"verdict": v} for k, v in enumerate(
        ["partially reproduced", "partially reproduced", ledger.UNDECIDED, "partially "
         "reproduced"], 1)}}}}
    assert ledger.agreement(rep, "C15", "partially reproduced") == (3, 4)
    assert ledger.agreement_text(rep, "C15", "partially reproduced") == (
        "same on 3/4 fresh seed sets")
    assert ledger.agreement_text(rep, "C16", "reproduced") is None
    assert ledger.load_replication(BOOK / "no-such-record.json")["claims"] == {}


def test_replication_record_is_of_the_current_code():
    assert REPLICATION.is_file(), (
        "no replication record book/replication.json; make it with "
        "python3 dev.py replicate --sets 4")
    rep = json.loads(REPLICATION.read_text())
    now = load_dev().experiment_digests(sorted(rep["digest"]["notebooks"]))
    refresh = ("the replication record book/replication.json was made on other {} than the "
               "book's; refresh it with python3 dev.py replicate --sets {}")
    n = len(rep["sets"])
    assert rep["digest"]["lnbook"] == now["lnbook"], refresh.format("lnbook code", n)
    changed = [k for k, v in rep["digest"]["notebooks"].items() if now["notebooks"][k] != v]
    assert not changed, refresh.format(f"code or decision rules of the notebooks {changed}", n)
    for cid, entry in rep["claims"].items():
        assert cid in CLAIM_IDS_ALL and entry["sets"], cid
        assert set(entry["sets"]) == {str(k) for k in rep["sets"]}, cid


# --- the book's ledger ----------------------------------------------------------------------


def _records() -> dict[str, ledger.ClaimRecord]:
    recs = ledger.load_records(RECORDS)
    if not recs:
        pytest.fail(f"no claim records in {RECORDS}: they are written while the chapters "
                    "execute; build the book first (python3 dev.py book)")
    return recs


def _heading_level_and_text(line: str) -> tuple[int, str] | None:
    m = re.match(r"^(#+)\s+(.+?)\s*$", line)
    return (len(m.group(1)), m.group(2)) if m else None


def asserting_cells_under(chapter: str, where: str) -> list[str]:
    """The code cells between heading ``where`` and the next heading of its level or above."""
    nb = nbformat.read(BOOK / f"{chapter}.ipynb", as_version=4)
    level, cells = None, []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                h = _heading_level_and_text(line)
                if h is None:
                    continue
                if level is None and h[1] == where:
                    level = h[0]
                elif level is not None and h[0] <= level:
                    return cells
        elif level is not None:
            cells.append(cell.source)
    return cells


CLAIM_IDS = [c["id"] for c in CLAIMS]


def test_claim_ids_are_the_papers_and_parts_two_and_three():
    paper = [i for i in CLAIM_IDS if i.startswith("C")]
    assert paper == [f"C{i:02d}" for i in range(1, 23)]
    later = [i for i in CLAIM_IDS if i.startswith("P")]
    assert later == sorted(set(later)) and all(1 <= int(i[1:]) <= 29 for i in later)


def test_ledger_parts_split_the_ids():
    sys.path.insert(0, str(BOOK / "_ext"))
    try:
        from claims_ledger import in_part
    finally:
        sys.path.pop(0)
    assert in_part("C22", "paper") and not in_part("C22", "after-2016")
    assert in_part("P14", "after-2016") and not in_part("P14", "today")
    assert in_part("P15", "today") and not in_part("P15", "after-2016")
    assert not in_part("P23", "today") and not in_part("Px", "today")
    assert in_part("P23", "arguments") and in_part("P29", "arguments")
    for cid in CLAIM_IDS:  # every claim is shown in exactly one table
        parts = ("paper", "after-2016", "today", "arguments")
        assert sum(in_part(cid, p) for p in parts) == 1, cid


@pytest.mark.parametrize("row", CLAIMS, ids=lambda r: r["id"])
def test_row_is_written_by_a_person_with_no_typed_figures(row):
    for field in ("section", "claim", "status", "chapter", "where", "seen"):
        assert str(row.get(field, "")).strip(), f"{row['id']}: field {field!r} is empty"
    assert row["status"] in ledger.VERDICTS
    outside = re.sub(r"\{[^{}]*\}", "", str(row["seen"]))
    assert not re.search(r"\d", outside), (
        f"{row['id']}: 'seen' types a figure by hand ({outside!r}); name a recorded figure "
        "as {placeholder} instead")


@pytest.mark.parametrize("row", CLAIMS, ids=lambda r: r["id"])
def test_where_has_an_asserting_cell_and_the_chapter_records(row):
    path = BOOK / f"{row['chapter']}.ipynb"
    assert path.exists(), f"{row['id']}: no notebook {path.name}"
    cells = asserting_cells_under(row["chapter"], " ".join(str(row["where"]).split()))
    assert cells, f"{row['id']}: no heading {row['where']!r} with code under it in {path.name}"
    assert any(re.search(r"^\s*assert\b", c, re.M) for c in cells), (
        f"{row['id']}: no cell under {row['where']!r} in {path.name} asserts anything")
    text = path.read_text()
    assert re.search(rf"record\(\\?[\"']{row['id']}\\?[\"']", text), (
        f"{row['id']}: {path.name} never calls lnbook.ledger.record({row['id']!r}, ...)")


@pytest.mark.parametrize("row", CLAIMS, ids=lambda r: r["id"])
def test_record_exists_and_agrees_with_the_status(row):
    rec = _records().get(row["id"])
    assert rec is not None, (
        f"{row['id']}: no record in {RECORDS}; {row['chapter']} must call "
        f"lnbook.ledger.record({row['id']!r}, verdict, figures) while it executes")
    assert rec.figures, f"{row['id']}: the record holds no figures"
    assert rec.verdict == row["status"], (
        f"{row['id']}: claims.yml says {row['status']!r} but {row['chapter']} computed "
        f"{rec.verdict!r} from its runs; the runs decide: update claims.yml and the chapter's "
        "text, never the seeds or thresholds")
    ledger.format_seen(" ".join(str(row["seen"]).split()), rec.figures)  # names exist


def test_replication_digest_ignores_prose_but_not_code(tmp_path):
    dev = load_dev()
    one = tmp_path / "one.py"
    one.write_text('"""Doc."""\n\ndef f(x):\n    """Old words."""\n    return x + 1  # a note\n')
    before = dev.code_of(one)
    one.write_text('"""Other doc."""\n\ndef f(x):\n    """New words."""\n    return x + 1\n')
    assert dev.code_of(one) == before  # docstrings and comments are prose
    one.write_text('"""Doc."""\n\ndef f(x):\n    """Old words."""\n    return x + 2\n')
    assert dev.code_of(one) != before  # a changed constant is code


def test_replication_digest_ignores_the_colab_cell(tmp_path):
    """The Colab cell changes at every release (its pin) and runs nothing outside Colab."""
    dev = load_dev()
    path = tmp_path / "nb.ipynb"

    def write(colab: str, code: str) -> str:
        cells = [{"cell_type": "code", "source": colab}, {"cell_type": "markdown", "source": "x"},
                 {"cell_type": "code", "source": code}]
        path.write_text(json.dumps({"cells": cells}))
        return dev.notebook_code(path)

    old = 'if "google.colab" in sys.modules:\n    %pip install -q "lnbook @ git+U@v0.1.0"'
    new = old.replace("v0.1.0", "v0.2.0")
    assert write(old, "x = 1") == write(new, "x = 1") == "x = 1"
    assert write(new, "x = 2") != write(new, "x = 1")


def test_notebooks_execute_slowest_first_by_the_recorded_seconds(tmp_path, monkeypatch):
    dev = load_dev()
    record = tmp_path / "replication.json"
    record.write_text(json.dumps({"notebooks": {
        "fast": {"1": {"ok": True, "seconds": 2.0}, "2": {"ok": True, "seconds": 4.0}},
        "slow": {"1": {"ok": True, "seconds": 30.0}},
        "mid": {"1": {"ok": True, "seconds": 5.0}}}}))
    monkeypatch.setattr(dev, "REPLICATION", record)
    # a notebook the record has never timed (a new chapter) starts first
    assert dev.longest_first(["fast", "mid", "new", "slow"]) == ["new", "slow", "mid", "fast"]
    monkeypatch.setattr(dev, "REPLICATION", tmp_path / "none.json")
    assert dev.longest_first(["b", "a"]) == ["b", "a"]  # no record: the order given


@pytest.mark.parametrize("path", sorted(BOOK.glob("*.ipynb")), ids=lambda p: p.stem)
def test_record_cells_are_hidden_and_asserts_are_not(path):
    """A `ledger.record` call means nothing to a learner: its cell is hidden on the page (the
    prose says the verdict in a glued sentence). A cell that asserts stays in view."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = set(cell.metadata.get("tags", []))
        hidden = {"remove-input", "remove-output"} <= tags
        if "ledger.record(" in cell.source:
            assert hidden, f"{path.name}: a ledger.record cell is shown:\n{cell.source[:200]}"
        if "remove-input" in tags:
            assert not re.search(r"^\s*assert\b", cell.source, re.M), (
                f"{path.name}: an asserting cell is hidden:\n{cell.source[:200]}")


# --- pilots (python3 dev.py pilot CLAIM) -----------------------------------------------------


def test_every_declared_pilot_names_a_registered_experiment_and_its_fields():
    import dataclasses

    from lnbook.experiments import EXPERIMENTS

    pilots = ledger.load_pilots()
    assert pilots, "claims.yml declares no pilot"
    for cid, p in pilots.items():
        assert cid in CLAIM_IDS_ALL
        assert p.experiment in EXPERIMENTS, f"{cid}: pilot names no experiment {p.experiment!r}"
        module = EXPERIMENTS[p.experiment]
        fields = {f.name for f in dataclasses.fields(module.get_config("quick"))}
        for over in (p.config, *p.tried):
            assert set(over) <= fields - {"seeds", "scale"}, (
                f"{cid}: pilot overrides {sorted(set(over) - fields)} are not fields of "
                f"{p.experiment}'s Config")
            module.get_config("quick", **{**p.config, **over})  # the preset takes them
        assert p.chose, f"{cid}: a pilot says what was chosen"
        for name in (p.quantities, p.measure):
            if name:
                assert callable(getattr(module, name, None)), f"{cid}: {name}"


@pytest.mark.parametrize("fields, message", [
    ({"seeds": 3}, "names its 'experiment'"),
    ({"experiment": "dyt", "seeds": 0}, "how many pilot seeds"),
    ({"experiment": "dyt", "seeds": True}, "how many pilot seeds"),
    ({"experiment": "dyt", "seeds": 3, "config": {"seeds": 5}}, "the pilot's own"),
    ({"experiment": "dyt", "seeds": 3, "tried": {"lr": 0.1}}, "list of config overrides"),
    ({"experiment": "dyt", "seeds": 3, "budget": 1}, "unknown fields"),
    ({"experiment": "dyt", "seeds": 3, "quantities": "f", "measure": "g"}, "not both"),
])
def test_pilot_from_rejects_bad_entries(fields, message):
    with pytest.raises(ValueError, match=f"P12: .*{message}"):
        ledger.pilot_from("P12", fields)


def test_pilot_records_are_of_declared_pilots():
    """The records `dev.py pilot CLAIM` wrote are of the pilot claims.yml declares (chapters
    with a pilot function of their own, such as sphere.pilot, write their own layout)."""
    pilots = ledger.load_pilots()
    recorded = [p for p in sorted((ROOT / "lnbook" / "pilots").glob("[CP][0-9][0-9].json"))
                if p.stem in pilots]
    assert recorded, "no record of a declared pilot in lnbook/pilots/"
    for path in recorded:
        rec = json.loads(path.read_text())
        p = pilots[path.stem]
        assert rec["experiment"] == p.experiment and rec["chose"] == p.chose
        from lnbook.seeds import PILOT_BASE, pilot_seeds
        assert tuple(rec["seeds"]) == pilot_seeds(p.seeds)
        assert all(s >= PILOT_BASE for s in rec["seeds"])  # never a verdict seed
        assert [t["overrides"] for t in rec["tried"]] == list(p.tried)


# --- the blind confirmation (python3 dev.py confirm) -----------------------------------------


def test_confirmation_sets_are_drawn_once_never_design_sets(tmp_path, monkeypatch):
    dev = load_dev()
    rep = tmp_path / "replication.json"
    rep.write_text(json.dumps({"sets": [1, 2, 3, 4, 7]}))
    monkeypatch.setattr(dev, "REPLICATION", rep)
    manifest = tmp_path / "confirmation.yml"
    got = dev.draw_confirmation_sets(4, manifest, ["05_1_invariance"])
    sets = got["sets"]
    assert len(set(sets)) == 4 and sets == sorted(sets)
    assert not set(sets) & {0, 1, 2, 3, 4, 7}, "a design or replication set was drawn"
    assert all(5 <= k <= 999 for k in sets)
    saved = yaml.safe_load(manifest.read_text())
    assert saved["sets"] == sets and "secrets" in saved["drawn"]["how"]
    assert saved["digest"] == dev.experiment_digests(["05_1_invariance"])
    with pytest.raises(FileExistsError, match="drawn once"):
        dev.draw_confirmation_sets(4, manifest)
    # another draw gives other sets (4 of 993: the same draw once in ~4e9)
    other = dev.draw_confirmation_sets(4, tmp_path / "again.yml", ["05_1_invariance"])
    assert other["sets"] != sets


def test_an_earlier_confirmations_sets_are_spent(tmp_path, monkeypatch):
    """A new manifest never draws a set an earlier confirmation used or spent, and carries
    them on: with all but four sets spent, the draw is those four."""
    dev = load_dev()
    from lnbook.seeds import MAX_SET

    monkeypatch.setattr(dev, "REPLICATION", tmp_path / "none.json")
    earlier = tmp_path / "confirmation.json"
    free = list(range(MAX_SET - 3, MAX_SET + 1))
    earlier.write_text(json.dumps({"sets": [126, 611],
                                   "spent": [k for k in range(5, MAX_SET - 3)]}))
    monkeypatch.setattr(dev, "CONFIRMATION", earlier)
    got = dev.draw_confirmation_sets(4, tmp_path / "confirmation.yml", ["05_1_invariance"])
    assert got["sets"] == free
    assert set(got["spent"]) == set(range(5, MAX_SET - 3)) and 611 in got["spent"]
    assert yaml.safe_load((tmp_path / "confirmation.yml").read_text())["spent"] == got["spent"]


def test_confirmation_refuses_other_code_and_voids_changed_chapters(tmp_path):
    dev = load_dev()
    manifest = tmp_path / "confirmation.yml"
    digest = dev.experiment_digests(["05_1_invariance"])
    stale = {"lnbook": digest["lnbook"], "notebooks": {"05_1_invariance": "0" * 16}}
    manifest.write_text(yaml.safe_dump({"sets": [101, 102], "digest": stale}))
    with pytest.raises(RuntimeError, match="not the code the manifest froze"):
        dev.confirm_sets(None, manifest, tmp_path / "out.json")
    manifest.write_text(yaml.safe_dump({"sets": [3, 102], "digest": digest}))
    with pytest.raises(ValueError, match=r"design sets \[3\]"):
        dev.confirm_sets(None, manifest, tmp_path / "out.json")
    record = {"digest": digest, "claims": {"C06": {"chapter": "05_1_invariance"}}}
    assert dev.void_claims(record) == set()
    assert dev.void_claims({"digest": stale, "claims": record["claims"]}) == {"C06"}
    assert dev.void_claims({"claims": {}}) == set()


@pytest.mark.parametrize("path", sorted(BOOK.glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_claim_is_recorded_before_its_decision_is_asserted(path):
    """A verdict that another seed set flips must not stop the chapter before its record is
    written: no cell asserts on a decision (``X = ledger.decide_claim("ID", ...)``) before the
    cell that calls ``ledger.record("ID", ...)``."""
    nb = nbformat.read(path, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    for src in cells:
        for m in re.finditer(r"(\w+)\s*=\s*ledger\.decide_claim\(\s*\"([CP]\d\d)\"", src):
            var, cid = m.groups()
            rec = [j for j, s in enumerate(cells) if re.search(rf"ledger\.record\(\s*\"{cid}\"", s)]
            assert rec, f"{path.name}: {cid} is decided and never recorded"
            early = [j for j, s in enumerate(cells[:rec[0]])
                     if re.search(rf"^\s*assert\b.*\b{var}\b", s, re.M)]
            assert not early, (f"{path.name}: a cell asserts on {var} ({cid}) before "
                               f"ledger.record({cid!r}, ...):\n{cells[early[0]][:300]}")


def test_declared_reads_the_status_of_claims_yml_and_names_what_it_knows():
    import yaml

    claims = yaml.safe_load((Path(ledger.__file__).parent / "claims.yml").read_text())["claims"]
    for c in claims:
        assert ledger.declared(c["id"]) == c["status"]
    assert ledger.declared("C01") in ledger.VERDICTS
    with pytest.raises(ValueError, match="no claim 'C99'.*known: C01, C02"):
        ledger.declared("C99")
    with pytest.raises(TypeError, match="claim_id must be a str"):
        ledger.declared(17)


def test_expected_moves_sum_the_chances_of_another_verdict():
    sys.path.insert(0, str(BOOK / "_ext"))
    try:
        from claims_ledger import expected_moves, stability_text
    finally:
        sys.path.pop(0)
    rule = {"parts": {"fast": ledger.Rule("q", "above", agree=2, of=3)},
            "held": "reproduced", "primary": "fast"}
    sets = {"1": {"figures": {"agree_fast": "2/3 for, 1 against"}}}
    records = [{"claims": {"C98": {"sets": sets}, "C99": {"sets": sets}}}]
    claims = [{"id": "C98", "status": "reproduced"}, {"id": "C99", "status": "not reproduced"},
              {"id": "C97", "status": "reproduced"}]  # C97: no rule, left out
    moves = expected_moves({"C98": rule, "C99": rule}, claims, records)
    odds = ledger.outcome_odds(2 / 3, 1 / 3, 3, 2)  # holds 20/27, fails 7/27
    assert moves == pytest.approx({"C98": 1 - odds["holds"], "C99": 1 - odds["fails"]})
    text = stability_text(moves)
    assert "on 1.0 of the 2 claims" in text and "C99 0.74, C98 0.26." in text
    assert text.endswith("changes at most 3 verdicts with chance 1.00.")
    assert stability_text(moves, at_most=0).endswith(
        f"at most 0 verdicts with chance {(1 - moves['C98']) * (1 - moves['C99']):.2f}.")
    assert "No seed set" in stability_text({})


def test_moves_distribution_is_the_poisson_binomial():
    sys.path.insert(0, str(BOOK / "_ext"))
    try:
        from claims_ledger import moves_distribution
    finally:
        sys.path.pop(0)
    halves = moves_distribution({f"C{k}": 0.5 for k in range(5)})
    assert halves == pytest.approx([1 / 32, 5 / 32, 10 / 32, 10 / 32, 5 / 32, 1 / 32])
    dist = moves_distribution({"a": 0.2, "b": 0.9})
    assert dist == pytest.approx([0.8 * 0.1, 0.2 * 0.1 + 0.8 * 0.9, 0.2 * 0.9])
    assert moves_distribution({}) == [1.0]
