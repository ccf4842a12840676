"""lnbook.seeds: the seed sets (book's set 0, fresh sets k >= 1) and the pilot seeds."""

from __future__ import annotations

import pytest

from lnbook import seeds


def test_set_zero_is_the_books_seeds(monkeypatch):
    monkeypatch.delenv("LNBOOK_SEED_SET", raising=False)
    assert seeds.seed_set() == 0
    assert seeds.verdict_seeds(3) == (0, 1, 2)
    assert seeds.verdict_seeds(5) == (0, 1, 2, 3, 4)
    monkeypatch.setenv("LNBOOK_SEED_SET", "")
    assert seeds.verdict_seeds(2) == (0, 1)


def test_the_variable_chooses_the_set(monkeypatch):
    monkeypatch.setenv("LNBOOK_SEED_SET", "3")
    assert seeds.seed_set() == 3
    assert seeds.verdict_seeds(4) == (3000, 3001, 3002, 3003)
    assert seeds.verdict_seeds(2, seed_set=0) == (0, 1)  # an explicit set wins


def test_sets_and_pilots_are_disjoint():
    n = seeds.MAX_SEEDS
    sets = [set(seeds.verdict_seeds(n, seed_set=k)) for k in (0, 1, 2, 7, seeds.MAX_SET)]
    pilots = set(seeds.pilot_seeds(n))
    for i, a in enumerate(sets):
        assert len(a) == n and not a & pilots
        for b in sets[i + 1:]:
            assert not a & b
    assert min(pilots) == seeds.PILOT_BASE > max(sets[-1])


def test_a_prefix_of_a_set_is_the_smaller_set():
    assert seeds.verdict_seeds(10, seed_set=4)[:3] == seeds.verdict_seeds(3, seed_set=4)
    assert seeds.pilot_seeds(5)[:2] == seeds.pilot_seeds(2) == (1_000_000, 1_000_001)


@pytest.mark.parametrize("bad", ["one", "-1", "1.5", "1000", "2x"])
def test_a_bad_variable_is_a_clear_error(monkeypatch, bad):
    monkeypatch.setenv("LNBOOK_SEED_SET", bad)
    with pytest.raises(ValueError, match="LNBOOK_SEED_SET must be an integer from 0 to 999"):
        seeds.verdict_seeds(3)


@pytest.mark.parametrize("n, err", [(0, ValueError), (1001, ValueError), (2.0, TypeError),
                                    (True, TypeError)])
def test_bad_counts(n, err):
    with pytest.raises(err, match="n must be"):
        seeds.verdict_seeds(n)
    with pytest.raises(err, match="n must be"):
        seeds.pilot_seeds(n)


def test_bad_explicit_sets():
    for bad in (True, 2.5, -3, None.__class__):
        with pytest.raises(ValueError, match="LNBOOK_SEED_SET"):
            seeds.verdict_seeds(2, seed_set=bad)
