"""Counting live resources, for tests and debugging.

With ``STREAMREP_DEBUG_RESOURCES=1`` in the environment, the package counts what it
opens and what it holds: database handles and open transactions, replication
connections, commands queued to peers, stream IDs reserved and not yet completed,
WAL checkpoint threads. :func:`live` tells what is held right now; the test suite
checks after every test that everything went back to what it was before, so a
leak fails the test that caused it. Without the variable nothing is counted and
the calls cost one global lookup.
"""

from __future__ import annotations

import os
from collections import Counter

__all__ = ["ENABLED", "acquired", "released", "live"]

#: Whether resources are counted in this process (read once, at import).
ENABLED: bool = os.environ.get("STREAMREP_DEBUG_RESOURCES", "") == "1"

_live: Counter[str] = Counter()


def acquired(kind: str, count: int = 1) -> None:
    """Note that *count* resources of *kind* were taken (call only when ENABLED)."""
    _live[kind] += count


def released(kind: str, count: int = 1) -> None:
    """Note that *count* resources of *kind* were given back (call only when ENABLED)."""
    _live[kind] -= count


def live() -> dict[str, int]:
    """The resources held now, by kind (kinds at zero left out)."""
    return {kind: n for kind, n in _live.items() if n}
