"""The seeds of every experiment, from one place: seed sets for verdicts, and pilot seeds.

Book page "How the verdicts are made" (`book/verdicts.md`). A chapter's verdict must hold on
seeds that nobody looked at while the experiment was designed. So every experiment config and
every chapter takes its seeds from here:

- :func:`verdict_seeds` gives the ``n`` seeds of the current *seed set*, chosen by the
  environment variable ``LNBOOK_SEED_SET`` (an integer ``k >= 0``; unset means 0). Set 0 is the
  book's own, ``0, 1, ..., n - 1``, the seeds the chapters have always run on; each ``k >= 1``
  is a fresh set, ``k * 1000 + i``, disjoint from every other set. ``python3 dev.py replicate``
  executes the whole book on sets 1..N.
- :func:`pilot_seeds` gives the seeds of design runs (choosing a learning rate, a length, a
  threshold), ``10**6 + i``, disjoint from every verdict seed of every set.

Example::

    >>> verdict_seeds(3, seed_set=0)
    (0, 1, 2)
    >>> verdict_seeds(3, seed_set=2)
    (2000, 2001, 2002)
    >>> pilot_seeds(2)
    (1000000, 1000001)
"""

from __future__ import annotations

import os

__all__ = ["ENV", "MAX_SEEDS", "MAX_SET", "PILOT_BASE", "pilot_seeds", "seed_set",
           "verdict_seeds"]

ENV = "LNBOOK_SEED_SET"
#: At most this many verdict seeds per experiment; set ``k`` owns ``k * MAX_SEEDS`` onwards.
MAX_SEEDS = 1000
#: The largest seed set; sets ``0..MAX_SET`` lie below :data:`PILOT_BASE`.
MAX_SET = 999
#: The first pilot seed; every verdict seed is smaller.
PILOT_BASE = (MAX_SET + 1) * MAX_SEEDS


def seed_set(value: str | int | None = None) -> int:
    """The seed set in use: ``value``, else ``$LNBOOK_SEED_SET``, else 0.

    Raises ``ValueError`` naming the variable when it is not an integer in ``0..MAX_SET``.
    """
    if value is None:
        value = os.environ.get(ENV, "").strip() or 0
    if isinstance(value, bool):
        raise ValueError(f"{ENV} must be an integer from 0 to {MAX_SET}, got {value!r}")
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{ENV} must be an integer from 0 to {MAX_SET} (0 is the book's "
                         f"seeds, 1, 2, ... fresh sets), got {value!r}") from None
    if isinstance(value, float) and value != k:
        raise ValueError(f"{ENV} must be an integer from 0 to {MAX_SET}, got {value!r}")
    if not 0 <= k <= MAX_SET:
        raise ValueError(f"{ENV} must be an integer from 0 to {MAX_SET}, got {value!r}")
    return k


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int (how many seeds), got {type(n).__name__}")
    if not 1 <= n <= MAX_SEEDS:
        raise ValueError(f"n must be from 1 to {MAX_SEEDS} seeds, got {n}")
    return n


def verdict_seeds(n: int, seed_set: int | str | None = None) -> tuple[int, ...]:
    """The ``n`` verdict seeds of a seed set (default: the one ``$LNBOOK_SEED_SET`` names).

    Set 0 gives ``(0, ..., n - 1)``; set ``k`` gives ``(k * 1000, ..., k * 1000 + n - 1)``.
    The first ``m`` seeds of ``verdict_seeds(n)`` are ``verdict_seeds(m)``, so an experiment
    that needs fewer runs keeps a prefix of the same set.
    """
    k = _seed_set(seed_set)
    return tuple(k * MAX_SEEDS + i for i in range(_check_n(n)))


def pilot_seeds(n: int) -> tuple[int, ...]:
    """``n`` seeds for design runs, disjoint from every verdict seed of every seed set."""
    return tuple(PILOT_BASE + i for i in range(_check_n(n)))


_seed_set = seed_set
