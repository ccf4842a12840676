"""The seeds of every experiment, from one place (`book/verdicts.md`).

:func:`verdict_seeds` gives the seeds of the seed set ``$LNBOOK_SEED_SET`` (0, the book's,
is ``0..n-1``; set ``k >= 1`` is ``k * 1000 + i``); :func:`pilot_seeds` gives design-run
seeds ``10**6 + i``, disjoint from every verdict seed.

Example::

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
    """The seed set in use: ``value``, else ``$LNBOOK_SEED_SET``, else 0 (``ValueError``
    naming the variable unless an integer in ``0..MAX_SET``)."""
    if value is None:
        value = os.environ.get(ENV, "").strip() or 0
    try:
        k = None if isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        k = None
    if k is None or (isinstance(value, float) and value != k) or not 0 <= k <= MAX_SET:
        raise ValueError(f"{ENV} must be an integer from 0 to {MAX_SET} (0 is the book's "
                         f"seeds, 1, 2, ... fresh sets), got {value!r}")
    return k


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int (how many seeds), got {type(n).__name__}")
    if not 1 <= n <= MAX_SEEDS:
        raise ValueError(f"n must be from 1 to {MAX_SEEDS} seeds, got {n}")
    return n


def verdict_seeds(n: int, seed_set: int | str | None = None) -> tuple[int, ...]:
    """The ``n`` verdict seeds of a seed set (default ``$LNBOOK_SEED_SET``): set ``k`` gives
    ``(k * 1000, ..., k * 1000 + n - 1)``; a prefix of ``verdict_seeds(n)`` is the same set."""
    k = _seed_set(seed_set)
    return tuple(k * MAX_SEEDS + i for i in range(_check_n(n)))


def pilot_seeds(n: int) -> tuple[int, ...]:
    """``n`` seeds for design runs, disjoint from every verdict seed of every seed set."""
    return tuple(PILOT_BASE + i for i in range(_check_n(n)))


_seed_set = seed_set
