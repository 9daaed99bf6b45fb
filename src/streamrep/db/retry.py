"""What counts as a lost database connection, and how long to keep trying.

A PostgreSQL connection can drop under any statement: the server restarts or fails
over, an administrator terminates backends, a network path breaks. Such a failure is
worth retrying on a new connection; a constraint violation or a syntax error is not.
:class:`Backoff` spaces the attempts (exponential, capped, with jitter) within a time
budget, after which the caller gives up with one line naming what failed.
"""

from __future__ import annotations

import random
import sqlite3
import time

import psycopg2

from streamrep.errors import DatabaseUnavailableError

#: SQLSTATE classes and codes of a connection that is gone or going: 08 (connection
#: exception), 57P01/57P02/57P03 (admin shutdown, crash shutdown, cannot connect now).
_LOST_SQLSTATES = ("08", "57P01", "57P02", "57P03")


def is_connection_loss(exc: BaseException) -> bool:
    """True when *exc* means the database connection is gone (retry on a new one)."""
    if isinstance(exc, DatabaseUnavailableError):
        return True  # a reconnect that failed: the server is still away
    if isinstance(exc, psycopg2.InterfaceError):
        return True  # "connection already closed"
    if isinstance(exc, psycopg2.OperationalError):
        code = exc.pgcode
        # No SQLSTATE: libpq's own failure (the socket closed, the server vanished).
        return code is None or code.startswith(_LOST_SQLSTATES)
    return False


def is_busy(exc: BaseException) -> bool:
    """True for SQLite's "database is locked/busy" (another process holds the lock)."""
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc))


class Backoff:
    """Delays between attempts: *first* seconds, doubling up to *cap*, with jitter,
    for at most *budget* seconds in all.

    >>> backoff = Backoff(budget=10.0)
    >>> delay = backoff.next_delay()   # None once the budget is spent
    """

    __slots__ = ("budget", "first", "cap", "started", "attempts")

    def __init__(self, budget: float, first: float = 0.05, cap: float = 2.0) -> None:
        self.budget = budget
        self.first = first
        self.cap = cap
        self.started = time.monotonic()
        self.attempts = 0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def next_delay(self) -> float | None:
        """Seconds to wait before the next attempt, or None when the budget is spent."""
        remaining = self.budget - self.elapsed
        if remaining <= 0:
            return None
        delay = min(self.cap, self.first * 2.0 ** self.attempts)
        self.attempts += 1
        # Jitter spreads the reconnects of many processes after a server restart.
        return min(remaining, delay * random.uniform(0.5, 1.0))


def first_line(exc: BaseException) -> str:
    """The first line of *exc*'s message (libpq's are several lines long)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
