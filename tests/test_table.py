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


@pytest.mark.parametrize("make", ["numpy", "numpy0d", "torch"])
def test_glue_gives_a_scalar_as_the_python_number_a_format_can_read(monkeypatch, make):
    import numpy as np
    import torch

    value = {"numpy": lambda: np.float64(1.25), "numpy0d": lambda: np.array(1.25),
             "torch": lambda: torch.tensor(1.25, dtype=torch.float64)}[make]()
    ours = _shown(monkeypatch, IPython.display, "display",
                  lambda: glue("name", value, display=False))
    text = ours[0][0][0][GLUE_PREFIX + "text/plain"]
    assert text == "1.25" and f"{float(text):.1f}" == "1.2"
    vector = _shown(monkeypatch, IPython.display, "display",
                    lambda: glue("name", np.array([1.0, 2.0]), display=False))
    assert vector[0][0][0][GLUE_PREFIX + "text/plain"] == "array([1., 2.])"  # kept whole
