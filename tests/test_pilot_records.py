"""The pilot records (``lnbook/pilots/*.json``, shipped with the package) and their rendering
for the chapters' "How this experiment was designed" dropdowns (``ledger.pilot_markdown``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from lnbook import ledger

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
DROPDOWN = "How this experiment was designed"
# the titles where one dropdown covers several experiments (chapter 13) or a measurement of
# untrained models (chapter 9's P04)
DROPDOWNS = (DROPDOWN, "How these experiments were designed", "How this measurement was designed")


PILOTS = ROOT / "lnbook" / "pilots"


def _raw(name: str) -> dict:
    return json.loads((PILOTS / f"{name}.json").read_text())


def _g(x: float) -> str:
    return f"{x:.3g}"


# --- one home -------------------------------------------------------------------------------


def test_the_records_live_in_the_package_only():
    """The records ship with the package, where a chapter reads them from a plain install; the
    book keeps no second copy that could drift from them."""
    assert sorted(p.name for p in PILOTS.glob("*.json")), "no pilot record in lnbook/pilots"
    assert not (BOOK / "pilots").exists(), "book/pilots/ is gone: records live in lnbook/pilots/"
    for path in PILOTS.glob("*.json"):
        assert ledger.pilot_record(path.stem) == json.loads(path.read_text())


# --- one test per record layout, with the record's own values ---------------------------------


def test_dev_pilot_layout_p16():
    raw = _raw("P16")
    md = ledger.pilot_markdown("P16")
    q = raw["tried"][0]["quantities"]
    acc, loss = np.median(q["pre/lr0.01"]["accuracy"]), np.median(q["pre/lr0.01"]["loss"])
    assert (_g(acc), _g(loss)) == ("0.775", "0.617")
    assert f"`pre/lr0.01`: accuracy {_g(acc)}, loss {_g(loss)}, var_0…6 [2.08, " in md
    var6 = np.median(q["post/lr0.01"]["var_6"])
    assert f", {_g(var6)}]\n" in md.split("`post/lr0.01`")[1]
    assert "experiment `peri_ln`, made 2026-11-28 07:40 UTC" in md
    assert "Pilot seeds 1000000–1000009 (10 seeds, `lnbook.seeds.pilot_seeds(10)`" in md
    assert "1. the declared config (23.7 s)" in md
    assert "Chosen: the stability part as the rise of the final loss" in md
    assert md.count("\n   - `") == 7  # the seven arms: Pre-LN and Peri-LN at 3 rates, Post-LN


def test_dev_pilot_layout_with_the_claims_quantities_p14():
    """P14's pilot names its quantities (``norm_ablation.p14_pilot``): the parts' per-seed
    values by their median and the two counts as they are, per length tried."""
    raw = _raw("P14")
    md = ledger.pilot_markdown("P14")
    assert [t["overrides"]["steps"] for t in raw["tried"]] == [150, 300, 450]
    for k, t in enumerate(raw["tried"], 1):
        p14 = t["quantities"]["P14"]
        ratio = np.asarray(p14["does not hurt"])
        assert p14["seeds within 5 %"] == int((ratio <= 0.05).sum())
        loss = {a: np.asarray(t["quantities"][a]["val_nll"]) for a in ("layer", "simple")}
        np.testing.assert_allclose(ratio, loss["simple"] / loss["layer"] - 1, rtol=1e-12)
        item = md.split(f"\n{k}. ")[1].split("\n\n")[0]
        assert (f"does not hurt {_g(np.median(ratio))}, " in item
                and f"seeds within 5 % {p14['seeds within 5 %']}" in item), item


def test_measure_layout_p04():
    """P04's pilot measures untrained models (``measure: p04_pilot``): a single float is shown
    to 3 significant digits, a count as it is, a per-seed list by its median."""
    raw = _raw("P04")
    md = ledger.pilot_markdown("P04")
    (t,) = raw["tried"]
    exp = t["quantities"]["Post-LN, 8 blocks, last over first (root mean square)"]
    assert f"over all 160 seeds {_g(exp['over all 160 seeds'])}, " in md
    assert _g(exp["over all 160 seeds"]) == "1.15"
    assert "below 1 in groups of 16 (1 of 10), below 1 in groups of 32 (0 of 5)" in md
    parts = t["quantities"]["P04 on the first 10 seeds"]
    assert f"Pre-LN does not grow {_g(np.median(parts['Pre-LN does not grow']))}" in md


def test_inputs_layout_c17():
    """A pilot whose quantities are a claim's inputs (``values``, ``trivial_ok``) shows each
    part's median and, for the mask, on how many pilot seeds it holds."""
    raw = _raw("C17")
    md = ledger.pilot_markdown("C17")
    q = raw["tried"][0]["quantities"]
    part = "robust to batch size"
    assert "`per-seed values (median)`: faster than BN at batch 128 " in md
    assert f"{part} {_g(np.median(q['values'][part]))}" in md
    ok = q["trivial_ok"][part]
    assert "`seeds out of the trivial phase`: " in md and f"{part} {sum(ok)} of {len(ok)}" in md


def test_every_declared_pilot_has_its_record():
    """A claim that declares a pilot in ``claims.yml`` has its record, unless its pilot is
    another claim's (``chose: the same pilot as ...``)."""
    pilots = ledger.load_pilots()
    shared = {c for c, p in pilots.items() if p.chose.startswith("the same pilot as")}
    missing = set(pilots) - shared - {p.stem for p in PILOTS.glob("*.json")}
    assert not missing, f"declared pilots without a record: {sorted(missing)}"


def test_design_map_layout_p23_p29():
    raw = _raw("P23")
    md = ledger.pilot_markdown("P23", "P29")
    left = sum(c["left"] for k, c in raw["map"].items() if k.startswith("pre/"))
    total = sum(c["n"] for k, c in raw["map"].items() if k.startswith("pre/"))
    assert (left, total) == (34, 40)
    grid_a, grid_b = md.split("\n2. ")
    assert "1. depths=[1, 4], lrs=[0.003, 0.03]" in grid_a
    assert grid_b.startswith("depths=[1, 5], lrs=[0.01, 0.1], warmups=[0, 30] (chosen)")
    assert "`pre`: runs out of the trivial phase 34 of 40" in grid_b
    ends = np.median(raw["per_seed"]["Post-LN ends lower where it trains"])
    assert f"P23, *Post-LN ends lower where it trains*: {_g(ends)}" in grid_b
    assert _g(ends) == "-0.268"
    spikes = np.median(_raw("P29")["tried"][0]["per_seed"]["fewer loss spikes"])
    assert f"P29, *fewer loss spikes*: {_g(spikes)}" in grid_a and spikes == 0
    assert "post [0.0758, 0.138, 0.368]" in md  # the amplification probe at 1/4/16 blocks
    assert "its date is not in the file" in md


def test_outliers_layout_p24_alone_and_with_p25_p26():
    raw = _raw("P24")
    md = ledger.pilot_markdown("P24")
    bias = np.median(raw["claim_values"]["P24"]["a bias removes them"])
    assert f"P24, *a bias removes them*: {_g(bias)}" in md and _g(bias) == "0.962"
    assert "P25," not in md  # only the rendered claim's values
    ratio = np.median(np.array(raw["runs"]["plain"]["ratio"]), axis=0)
    assert f"`plain`: ratio [{_g(ratio[0])}, {_g(ratio[1])}], " in md
    both = ledger.pilot_markdown("P24", "P25", "P26")
    assert both.count("`plain`:") == 1 and "P26, *far more than random*: 0.706" in both
    assert both.startswith("**Pilot record P24, P25, P26**: experiment `outliers`")
    with pytest.raises(ValueError, match="P17: not the same pilot run as P24"):
        ledger.pilot_markdown("P24", "P17")


def test_sphere_layout():
    raw = _raw("sphere")
    md = ledger.pilot_markdown("sphere")
    assert [line for line in md.splitlines() if re.match(r"\d\. ", line)] == [
        "1. lr=0.001", "2. lr=0.003", "3. lr=0.01", "4. lr=0.03", "5. lr=0.1"]
    # seeds 70/120/180, 90/130/200, 90/160/not reached: the missing one counts as more updates
    assert raw["runs"]["0.003"]["pre/L2"]["updates_to_targets"][2][2] is None
    at3 = md.split("2. lr=0.003")[1].split("3. lr=0.01")[0]
    assert "`pre/L2`: final_test_loss 0.143, updates_to_targets [90, 130, 200]" in at3
    # a diverged seed (NaN) ranks above the finite ones: the median is the larger finite loss
    losses = raw["runs"]["0.1"]["rezero/L6"]["final_test_loss"]
    assert np.isnan(losses[1]) and _g(max(losses[0], losses[2])) == "6.22e+11"
    assert "`rezero/L6`: final_test_loss 6.22e+11, updates_to_targets [∞, ∞, ∞]" in md
    assert "Chosen: the rate of each design: pre 0.01, post 0.01, rezero 0.01, ngpt 0.03" in md


def test_errors_name_the_claim():
    with pytest.raises(FileNotFoundError, match=r"P07: no pilot record .*'P16'"):
        ledger.pilot_markdown("P07")
    with pytest.raises(FileNotFoundError, match="chosen without a pilot"):
        ledger.pilot_record("C01")
    with pytest.raises(FileNotFoundError, match=r"\.\./P16: no pilot record"):
        ledger.pilot_record("../P16")
    with pytest.raises(TypeError, match="claim ID or a record name"):
        ledger.pilot_record(16)
    with pytest.raises(ValueError, match="at least one"):
        ledger.pilot_markdown()


# --- the book: every design dropdown renders a record or says it had none ---------------------


def _rendered(nb) -> tuple[set[str], str]:
    """The records a notebook renders (``pilot_markdown("P16", ...)`` glued and shown with
    ``{glue:md}`` inside its dropdown) and the text of its design dropdowns."""
    names, glued = set(), set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for call in re.finditer(r"glue\(\"(\w+)\", Markdown\((?:ledger\.)?pilot_markdown\("
                                r"([^)]*)\)", cell.source):
            glued.add(call.group(1))
            names.update(re.findall(r"\"(\w+)\"", call.group(2)))
    dropdowns = "\n".join(c.source for c in nb.cells
                          if c.cell_type == "markdown"
                          and any(d in c.source for d in DROPDOWNS))
    shown = set(re.findall(r"\{glue:md\} (\w+)", dropdowns))
    return (names if glued and glued <= shown else set()), dropdowns


def test_every_design_dropdown_renders_a_record_or_says_it_had_none():
    rendered: set[str] = set()
    for path in sorted(BOOK.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        names, dropdowns = _rendered(nb)
        if not dropdowns:
            continue
        rendered |= names
        assert names or "chosen without a pilot" in " ".join(dropdowns.split()).lower(), (
            f"{path.name}: its design dropdown neither renders a pilot record "
            "(glue of ledger.pilot_markdown shown with {glue:md} in it) nor says "
            "'chosen without a pilot'")
    records = {p.stem for p in PILOTS.glob("*.json")}
    assert records <= rendered, f"records no chapter renders: {sorted(records - rendered)}"


def test_the_book_check_sees_a_glue_that_is_not_shown_in_the_dropdown():
    import nbformat.v4 as v4

    glue = v4.new_code_cell('glue("p16_pilot", Markdown(ledger.pilot_markdown("P16")), '
                            'display=False)')
    shown = v4.new_markdown_cell(f"````{{dropdown}} {DROPDOWN}\n```{{glue:md}} p16_pilot\n"
                                 ":format: myst\n```\n````")
    elsewhere = v4.new_markdown_cell(f"```{{dropdown}} {DROPDOWN}\nWhy.\n```\n\n"
                                     "{glue:md}`p16_pilot`")
    assert _rendered(v4.new_notebook(cells=[glue, shown]))[0] == {"P16"}
    assert _rendered(v4.new_notebook(cells=[glue, elsewhere]))[0] == set()
