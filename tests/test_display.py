"""lnbook.display: printed text that fits the book's column (88 characters at 1280 pixels)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from lnbook import display
from lnbook.experiments import rmsnorm


@dataclass
class _Config:
    name: str = "quick"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    steps: int = 100
    secret: int = field(default=7, repr=False)


@dataclass
class _Custom:
    x: int = 1

    def __repr__(self) -> str:
        return "custom " * 20


def test_wrap_breaks_long_lines_at_spaces_and_keeps_the_words():
    text = "  " + " ".join(f"word{i}" for i in range(40)) + "\nshort line"
    out = display.wrap(text, width=30)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 30
    assert lines[0].startswith("  word0") and lines[1].startswith("    word")  # indent + 2
    assert lines[-1] == "short line"
    assert out.split() == text.split()  # only white space changed


def test_wrap_leaves_fitting_text_and_long_words_whole():
    assert display.wrap("a  b\n\n  c") == "a  b\n\n  c"
    word = "x" * 100
    assert display.wrap(f"a {word} b", width=20).splitlines() == ["a", f"  {word}", "  b"]


@pytest.mark.parametrize("bad, err", [(b"bytes", TypeError), (3, TypeError)])
def test_wrap_rejects_what_is_not_text(bad, err):
    with pytest.raises(err, match="wrap takes a str"):
        display.wrap(bad)


@pytest.mark.parametrize("width", [0, 7, 8.5, True])
def test_wrap_rejects_a_width_below_8(width):
    with pytest.raises(ValueError, match="width must be an int of at least 8"):
        display.wrap("text", width=width)


def test_pformat_fills_a_dataclass_field_by_field():
    cfg = _Config()
    assert display.pformat(cfg) == repr(cfg)  # fits: unchanged
    out = display.pformat(cfg, width=30)
    assert out.splitlines() == ["_Config(name='quick',", "        seeds=(0, 1, 2, 3, 4),",
                                "        steps=100)"]
    assert "secret" not in out  # a field without repr stays out, as in the dataclass's repr
    assert " ".join(out.split()) == repr(cfg)


def test_pformat_of_an_experiment_config_fits_the_column():
    cfg = rmsnorm.get_config("quick", seeds=(0, 1, 2, 3, 4))
    assert len(repr(cfg)) > 200  # one line of about 2,000 pixels
    out = display.pformat(cfg)
    assert max(map(len, out.splitlines())) <= display.WIDTH
    assert " ".join(out.split()) == repr(cfg)  # the same fields and values


def test_pformat_keeps_a_custom_repr_and_wraps_it():
    out = display.pformat(_Custom(), width=40)
    assert out.split() == repr(_Custom()).split() and max(map(len, out.splitlines())) <= 40


def test_pformat_of_containers_and_arrays():
    d = {f"k{i}": list(range(6)) for i in range(8)}
    out = display.pformat(d, width=40)
    assert max(map(len, out.splitlines())) <= 40 and eval(out) == d  # noqa: S307
    arr = np.arange(40) / 7
    assert max(map(len, display.pformat(np.round(arr, 3), width=50).splitlines())) <= 50


def test_show_prints_values_like_print_and_gives_a_tall_value_its_own_lines(capsys):
    display.show("a", 1, "b")
    assert capsys.readouterr().out == "a 1 b\n"
    display.show("config:", _Config(), "done", width=30)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "config:" and out[1].startswith("_Config(") and out[-1] == "done"
    assert max(map(len, out)) <= 30


def test_wrap_keeps_a_bracketed_group_that_fits_on_one_line():
    text = "final loss: layer norm [1.787 1.775 1.729], or write ((x - mu) ** 2).mean(-1) now"
    lines = display.wrap(text, width=40).splitlines()
    assert lines == ["final loss: layer norm", "  [1.787 1.775 1.729], or write",
                     "  ((x - mu) ** 2).mean(-1) now"]
    long = "(" + "a " * 30 + ")"  # a group wider than the line breaks like words
    assert max(map(len, display.wrap(long, width=20).splitlines())) <= 20
    odd = "a (b c] d " * 6  # unbalanced brackets: plain word wrapping
    assert display.wrap(odd, width=20).split() == odd.split()
