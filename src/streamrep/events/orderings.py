"""Stream orderings: where the ``events`` and ``backfill`` streams stand, and the
orderings a batch of new events gets.

Live events count up from 1, backfilled events down from -1 (the ``backfill``
stream's token is ``-stream_ordering``). :func:`live_position` and
:func:`backfill_position` are the one place those positions are read from the
tables; the allocators hand out what follows them.
"""

from __future__ import annotations

from typing import Any, Protocol

from streamrep.db import Transaction

__all__ = ["BACKFILL_STREAM", "EVENTS_STREAM", "GeneratorAllocator", "StreamAllocator",
           "backfill_position", "live_position"]

#: The stream of live events and current-state changes (positive orderings).
EVENTS_STREAM = "events"
#: The stream of backfilled events (token ``-stream_ordering``).
BACKFILL_STREAM = "backfill"


class _Queryable(Protocol):
    def fetchval(self, sql: str, params: Any = (), default: Any = None) -> Any: ...


def live_position(conn: _Queryable) -> int:
    """The highest position of the ``events`` stream: the largest live stream
    ordering, or the largest current-state delta's (a backfill that moves the
    current state takes a live position without an event)."""
    return max(int(conn.fetchval("SELECT MAX(stream_ordering) FROM events", (), 0)),
               int(conn.fetchval("SELECT MAX(stream_id) FROM current_state_delta_stream",
                                 (), 0)),
               0)


def backfill_position(conn: _Queryable) -> int:
    """The highest position of the ``backfill`` stream, ``-MIN(stream_ordering)``."""
    return max(-int(conn.fetchval("SELECT MIN(stream_ordering) FROM events", (), 0)), 0)


class StreamAllocator:
    """Stream orderings for this (single) writer of events: live events count up
    from the highest stored ordering, backfilled ones down from the lowest."""

    def __init__(self) -> None:
        self._live: int | None = None
        self._backfill: int | None = None

    def _load(self, txn: Transaction) -> tuple[int, int]:
        if self._live is None or self._backfill is None:
            self._live = live_position(txn)
            self._backfill = -backfill_position(txn)
        return self._live, self._backfill

    def current(self, txn: Transaction) -> tuple[int, int]:
        """``(highest live ordering, lowest backfill ordering)`` handed out so far."""
        return self._load(txn)

    def next_live(self, txn: Transaction) -> int:
        """The next live ordering."""
        return self.next_live_mult(txn, 1)[0]

    def next_live_mult(self, txn: Transaction, count: int) -> list[int]:
        """The next *count* live orderings, increasing."""
        live, _ = self._load(txn)
        self._live = live + count
        return list(range(live + 1, live + 1 + count))

    def next_backfill_mult(self, txn: Transaction, count: int) -> list[int]:
        """The next *count* backfill orderings, decreasing."""
        _, backfill = self._load(txn)
        self._backfill = backfill - count
        return list(range(backfill - 1, backfill - 1 - count, -1))

    def reset(self) -> None:
        """Re-read the positions from the database (after a rolled-back write)."""
        self._live = self._backfill = None


class GeneratorAllocator(StreamAllocator):
    """Stream orderings from the stream registry's ID generators of the ``events``
    and ``backfill`` streams: each ID completes when the transaction that
    reserved it commits or rolls back, and the generators' listeners announce it."""

    def __init__(self, events: Any, backfill: Any) -> None:
        super().__init__()
        self.events_gen = events
        self.backfill_gen = backfill

    def current(self, txn: Transaction) -> tuple[int, int]:
        return (int(self.events_gen.get_current_token()),
                -int(self.backfill_gen.get_current_token()))

    def next_live_mult(self, txn: Transaction, count: int) -> list[int]:
        return [int(i) for i in self.events_gen.get_next_mult_txn(txn, count)]

    def next_backfill_mult(self, txn: Transaction, count: int) -> list[int]:
        return [int(i) for i in self.backfill_gen.get_next_mult_txn(txn, count)]
