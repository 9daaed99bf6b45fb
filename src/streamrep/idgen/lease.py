"""Writer leases: one live process per writer instance and stream, enforced by the
database.

Two processes writing as the same instance would hand out the same stream IDs (a
single-writer stream counts from ``MAX(stream_id)`` in memory) and announce different
facts under one token. So a writer takes, at start, a lease row per stream it writes
in ``writer_leases`` (stream, instance, holder, token, times) and renews it every
third of its time to live; a second process finds a live lease held by someone else
and refuses to start with :class:`WriterLeaseHeldError`, naming the holder. A clean
stop releases the rows; a crashed writer's rows expire after ``ttl`` seconds, and then
the next process takes them over.

Times are the database's clock (both processes may be on different machines). A
writer also fences itself: once it has gone ``ttl`` seconds without a successful
renewal (a paused process, a database away), :meth:`WriterLease.check` raises
:class:`WriterLeaseLostError` before it reserves another stream ID or commits another
write, since by then another process may hold the lease.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
import uuid
from typing import Callable, Iterable, Sequence

import gevent

from streamrep.db import Database, Migration, Transaction, register_schema
from streamrep.errors import DatabaseConfigError, WriterLeaseHeldError, WriterLeaseLostError
from streamrep.idgen.base import IdGenerator

logger = logging.getLogger(__name__)

COMPONENT = "writer_leases"

#: Seconds a lease lives without renewal (the default of ``writer_lease_ttl``).
DEFAULT_TTL = 30.0

register_schema(COMPONENT, [
    Migration(
        1,
        sql=[
            "CREATE TABLE IF NOT EXISTS writer_leases ("
            " stream_name TEXT NOT NULL,"
            " instance_name TEXT NOT NULL,"
            " holder TEXT NOT NULL,"
            " token TEXT NOT NULL,"
            " acquired_at DOUBLE PRECISION NOT NULL,"
            " renewed_at DOUBLE PRECISION NOT NULL,"
            " expires_at DOUBLE PRECISION NOT NULL,"
            " PRIMARY KEY (stream_name, instance_name))",
        ],
        description="writer_leases: one live process per writer instance and stream",
    ),
])

# The database's clock, in seconds since the epoch.
_NOW = {
    "postgres": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8",
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
}

# Taken when free, expired, or already ours (a retried attempt); else left alone.
_TAKE = (
    "INSERT INTO writer_leases (stream_name, instance_name, holder, token, acquired_at,"
    " renewed_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (stream_name, instance_name) DO UPDATE SET holder = excluded.holder,"
    " token = excluded.token, acquired_at = excluded.acquired_at,"
    " renewed_at = excluded.renewed_at, expires_at = excluded.expires_at"
    " WHERE writer_leases.expires_at < excluded.acquired_at"
    " OR writer_leases.token = excluded.token"
)


#: Names of the lease's own transactions (not fenced by the lease).
_OWN_TRANSACTIONS = "writer_lease:"


def _utc(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class WriterLease:
    """The leases of writer *instance_name* on *streams* (see the module docstring).

    >>> lease = WriterLease(db, "writer1", ["caches"], ttl=30.0)
    >>> lease.acquire()        # WriterLeaseHeldError if another process holds one
    >>> lease.release()        # on a clean stop

    *on_lost* is called once (from the renewal greenlet) with the
    :class:`WriterLeaseLostError` when the lease is lost; the process must stop
    writing then.
    """

    def __init__(self, db: Database, instance_name: str, streams: Iterable[str], *,
                 ttl: float = DEFAULT_TTL,
                 on_lost: Callable[[WriterLeaseLostError], None] | None = None) -> None:
        self.db = db
        self.instance_name = instance_name
        self.streams: tuple[str, ...] = tuple(sorted(set(streams)))
        if not self.streams:
            raise DatabaseConfigError(f"a writer lease of {instance_name!r} needs a stream")
        if ttl <= 1:
            raise DatabaseConfigError(f"a writer lease lives more than 1 second, not {ttl:g}")
        self.ttl = float(ttl)
        self.holder = f"host {socket.gethostname()} pid {os.getpid()}"
        self.token = uuid.uuid4().hex
        self.on_lost = on_lost
        self._valid_until = 0.0  # monotonic; 0: not held
        self._lost: WriterLeaseLostError | None = None
        self._renewer: gevent.Greenlet | None = None
        db.ensure_schema(COMPONENT)
        self._fencing = False

    @property
    def held(self) -> bool:
        """Whether this process holds the lease now (as far as it can tell)."""
        return self._lost is None and time.monotonic() < self._valid_until

    # -- taking and giving back -----------------------------------------------------------

    def acquire(self) -> None:
        """Take the lease on every stream, or none (:class:`WriterLeaseHeldError`),
        and start renewing it."""
        sent = time.monotonic()
        self.db.run(self._take, name="writer_lease:take")
        self._valid_until = sent + self.ttl
        self._lost = None
        if not self._fencing:
            self.db.add_commit_check(self._check_commit)
            self._fencing = True
        if self._renewer is None:
            self._renewer = gevent.spawn(self._renew_loop)
        logger.info("writer %s holds its lease on %s (%s, ttl %gs)", self.instance_name,
                    ", ".join(self.streams), self.holder, self.ttl)

    def _take(self, txn: Transaction) -> None:
        now = float(txn.fetchval(_NOW[txn.engine]))
        refused: list[str] = []
        for stream in self.streams:
            txn.execute(_TAKE, (stream, self.instance_name, self.holder, self.token,
                                now, now, now + self.ttl))
            if txn.rowcount == 1:
                continue
            row = txn.fetchone(
                "SELECT holder, acquired_at, renewed_at, expires_at FROM writer_leases"
                " WHERE stream_name = ? AND instance_name = ?", (stream, self.instance_name))
            if row is None:  # released meanwhile: take it on the next start
                refused.append(f"{stream} (released while starting)")
                continue
            holder, acquired, renewed, expires = row
            refused.append(
                f"{stream} ({holder}, since {_utc(float(acquired))}, renewed "
                f"{max(0.0, now - float(renewed)):.0f}s ago, expires in "
                f"{max(0.0, float(expires) - now):.0f}s)")
        if refused:
            # Raising rolls back the leases taken on the other streams.
            raise WriterLeaseHeldError(
                f"writer {self.instance_name} is already running: another process holds "
                f"its lease on {'; '.join(refused)}; stop that process, or if it crashed "
                "wait for its lease to expire, then start this one again")

    def release(self) -> None:
        """Stop renewing and give the lease back (a clean stop)."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.kill()
        if self._fencing:
            self.db.remove_commit_check(self._check_commit)
            self._fencing = False
        if self._valid_until == 0.0:
            return
        self._valid_until = 0.0
        try:
            self.db.run(self._give_back, name="writer_lease:release", reconnect_timeout=5)
        except Exception as exc:  # the lease then expires on its own
            logger.warning("writer %s: releasing its lease failed (%s); it expires in at "
                           "most %gs", self.instance_name, exc, self.ttl)

    def _give_back(self, txn: Transaction) -> None:
        txn.execute(
            f"DELETE FROM writer_leases WHERE instance_name = ? AND token = ?"
            f" AND stream_name IN ({', '.join('?' * len(self.streams))})",
            (self.instance_name, self.token, *self.streams))

    def __enter__(self) -> "WriterLease":
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    # -- keeping it ------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`WriterLeaseLostError` unless the lease is surely still ours."""
        if self._lost is not None:
            raise self._lost
        if time.monotonic() >= self._valid_until:
            raise WriterLeaseLostError(
                f"writer {self.instance_name}: its lease on {', '.join(self.streams)} was "
                f"not renewed within {self.ttl:g}s (process paused or database away); "
                "stopping so that two processes never write as one instance")

    def _check_commit(self, txn: Transaction) -> None:
        # A write that started before a pause longer than the ttl must not land
        # after another process took over; the lease's own statements are exempt.
        if not txn.name.startswith(_OWN_TRANSACTIONS):
            self.check()

    def guard(self, generators: Sequence[IdGenerator]) -> None:
        """Make each of *generators* call :meth:`check` before reserving a stream ID."""
        for generator in generators:
            generator.write_guard = self.check

    def renew(self) -> None:
        """Renew the lease now (the renewal greenlet calls this every ``ttl / 3``)."""
        sent = time.monotonic()
        budget = max(0.5, self._valid_until - sent)
        renewed = self.db.run(self._extend, name="writer_lease:renew",
                              reconnect_timeout=budget)
        if renewed < len(self.streams):
            raise WriterLeaseLostError(
                f"writer {self.instance_name}: another process took over its lease on "
                f"{', '.join(self.streams)} after it expired; stopping")
        self._valid_until = sent + self.ttl

    def _extend(self, txn: Transaction) -> int:
        now = float(txn.fetchval(_NOW[txn.engine]))
        txn.execute(
            f"UPDATE writer_leases SET renewed_at = ?, expires_at = ?"
            f" WHERE instance_name = ? AND token = ?"
            f" AND stream_name IN ({', '.join('?' * len(self.streams))})",
            (now, now + self.ttl, self.instance_name, self.token, *self.streams))
        return txn.rowcount

    def _renew_loop(self) -> None:
        delay = self.ttl / 3
        while True:
            gevent.sleep(delay)
            delay = self.ttl / 3
            try:
                self.renew()
                continue
            except WriterLeaseLostError as exc:
                lost = exc
            except Exception as exc:
                if time.monotonic() < self._valid_until:
                    logger.warning("writer %s: renewing its lease failed (%s); trying again",
                                   self.instance_name, exc)
                    delay = min(delay, 1.0)
                    continue
                lost = WriterLeaseLostError(
                    f"writer {self.instance_name}: its lease on {', '.join(self.streams)} "
                    f"expired while it could not be renewed ({exc}); stopping")
            self._lost = lost
            self._renewer = None
            logger.error("%s", lost)
            if self.on_lost is not None:
                self.on_lost(lost)
            return
