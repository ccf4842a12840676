"""lnbook.table: the text table every chapter prints, and the glue that hands values to prose."""

from __future__ import annotations

import IPython.display
import pytest
from IPython.display import Markdown

import lnbook
from lnbook.table import GLUE_PREFIX, Table, glue


def test_table_as_text_and_as_markdown():
    t = Table(["norm", "error"], [["layer", 0.031], ["a|b", 0.5]], caption="one seed")
    assert str(t) == ("norm   error\n-----  -----\nlayer  0.031\na|b    0.5\n(one seed)")
    assert t._repr_markdown_() == ("| norm | error |\n|---|---|\n| layer | 0.031 |\n"
                                   "| a\\|b | 0.5 |\n\n*one seed*")
    with pytest.raises(ValueError):
        str(Table(["a", "b"], [["only one"]]))


def _shown(monkeypatch, module, attr, call) -> list:
    out = []
    monkeypatch.setattr(module, attr, lambda *a, **k: out.append((a, k)))
    call()
    return out


@pytest.mark.parametrize("value", [0.25, 3, "text", Markdown("**bold**")], ids=repr)
@pytest.mark.parametrize("display", [True, False])
def test_glue_writes_what_myst_nb_glue_writes(monkeypatch, value, display):
    from myst_nb.ext import glue as myst_glue

    ours = _shown(monkeypatch, IPython.display, "display",
                  lambda: glue("name", value, display=display))
    theirs = _shown(monkeypatch, myst_glue, "ipy_display",
                    lambda: myst_glue.glue("name", value, display=display))
    assert ours == theirs and len(ours) == 1
    assert GLUE_PREFIX == myst_glue.GLUE_PREFIX
    data = ours[0][0][0]
    assert all(k.startswith(GLUE_PREFIX) for k in data) == (not display)
    assert lnbook.glue is glue
