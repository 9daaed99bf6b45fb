"""Running transactions: commit or roll back, commit markers, and retries.

:class:`TransactionRunner` opens each :class:`~streamrep.db.transaction.Transaction`
on a connection of the database's :mod:`~streamrep.db.pool`, commits it when the
block ends (running the handle's commit checks first) and rolls it back when an
exception escapes. :meth:`TransactionRunner.run` also retries where that is safe: a
serialization failure, a deadlock or a busy SQLite database a few times, and a lost
PostgreSQL connection with backoff within ``reconnect_timeout``. A write whose
``COMMIT`` was lost carries a commit marker (:mod:`streamrep.db.markers`) that tells
whether it committed, so a write run there happens exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from typing import Any, Callable, Iterator, TypeVar

import gevent
import psycopg2
import psycopg2.errors
import psycopg2.extensions

from streamrep import resources
from streamrep.db import markers
from streamrep.db.pool import PostgresPool, SqliteConnection
from streamrep.db.retry import Backoff, first_line, is_busy, is_connection_loss
from streamrep.db.transaction import (
    COMMITTED, COMMITTING, ROLLED_BACK, UNKNOWN, DatabaseInfo, Transaction,
)
from streamrep.errors import DatabaseUnavailableError

__all__ = ["PG_RETRYABLE", "TransactionRunner"]

logger = logging.getLogger(__name__)

R = TypeVar("R")

#: Errors after which a PostgreSQL transaction is simply retried by :meth:`TransactionRunner.run`.
PG_RETRYABLE = (psycopg2.errors.SerializationFailure, psycopg2.errors.DeadlockDetected)


#: Seconds :meth:`TransactionRunner.retry` goes on trying work that found a SQLite
#: database locked by another process (each attempt also waits the URL's busy_timeout_ms).
BUSY_RETRY_SECONDS = 30.0


class TransactionRunner:
    """Transactions on *connections* (a PostgreSQL pool or the SQLite connection).

    *owner* is the database the transactions report (``Transaction.database``); its
    ``config`` gives ``reconnect_timeout`` and the redacted URL errors name.
    """

    def __init__(self, owner: DatabaseInfo,
                 connections: PostgresPool | SqliteConnection) -> None:
        self._owner = owner
        self._connections = connections
        self._postgres = isinstance(connections, PostgresPool)
        self._commit_checks: list[Callable[[Transaction], None]] = []

    # -- commit checks -----------------------------------------------------------

    def add_commit_check(self, check: Callable[[Transaction], None]) -> None:
        """Call ``check(txn)`` before every write transaction commits."""
        self._commit_checks.append(check)

    def remove_commit_check(self, check: Callable[[Transaction], None]) -> None:
        """Stop calling *check*."""
        if check in self._commit_checks:
            self._commit_checks.remove(check)

    def _run_commit_checks(self, txn: Transaction) -> None:
        for check in list(self._commit_checks):
            check(txn)

    # -- one attempt -------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, name: str, read_only: bool) -> Iterator[Transaction]:
        """One transaction for the block; its callbacks run after its outcome."""
        txn: Transaction | None = None
        try:
            with self.attempt(name, read_only, marked=False) as txn:
                yield txn
        finally:
            # Outside the connection, so callbacks may open transactions of their own.
            if txn is not None:
                txn._run_callbacks(txn.outcome == COMMITTED)

    @contextlib.contextmanager
    def attempt(self, name: str, read_only: bool, marked: bool) -> Iterator[Transaction]:
        """One try at a transaction; sets ``txn.outcome`` and leaves the callbacks to
        the caller. With *marked* (PostgreSQL), a transaction that wrote commits
        together with its commit marker (:mod:`streamrep.db.markers`)."""
        if resources.ENABLED:
            resources.acquired("database transaction")
        try:
            if isinstance(self._connections, PostgresPool):
                with self._attempt_postgres(self._connections, name, read_only,
                                            marked) as txn:
                    yield txn
            else:
                with self._attempt_sqlite(self._connections, name, read_only) as txn:
                    yield txn
        finally:
            if resources.ENABLED:
                resources.released("database transaction")

    @contextlib.contextmanager
    def _attempt_postgres(self, pool: PostgresPool, name: str, read_only: bool,
                          marked: bool) -> Iterator[Transaction]:
        # Pooled connections are in autocommit mode; the transaction is bracketed
        # here, its BEGIN sent along with its first statement.
        with pool.borrow() as conn:
            cursor = conn.cursor()
            txn = Transaction(self._owner, cursor, name,
                              "BEGIN READ ONLY" if read_only else "BEGIN")
            try:
                yield txn
                if txn.wrote and self._commit_checks:
                    self._run_commit_checks(txn)
                if txn.begun:
                    commit = "COMMIT"
                    if marked and txn.wrote and not read_only:
                        txn.marker = conn.next_marker()
                        commit = markers.commit_with_marker(txn.marker)
                    txn.outcome = COMMITTING
                    # Deferred writes travel with it (see Transaction.defer).
                    cursor.execute(txn._pending(commit))
                txn.outcome = COMMITTED
            except BaseException as exc:
                # Only a connection lost while COMMIT was on its way leaves the
                # outcome open; any other failure rolled back.
                txn.outcome = (UNKNOWN if txn.outcome == COMMITTING
                               and is_connection_loss(exc) else ROLLED_BACK)
                _pg_rollback(conn, cursor)
                raise
            finally:
                cursor.close()

    @contextlib.contextmanager
    def _attempt_sqlite(self, sqlite: SqliteConnection, name: str,
                        read_only: bool) -> Iterator[Transaction]:
        with sqlite.lock:
            sqlite.check_open()
            sqlite.check_not_in_transaction()
            conn = sqlite.conn
            conn.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
            sqlite.in_txn = True
            txn = Transaction(self._owner, conn.cursor(), name)
            try:
                yield txn
                if txn.wrote and self._commit_checks:
                    self._run_commit_checks(txn)
                conn.execute("COMMIT")
                txn.outcome = COMMITTED
                if not read_only and sqlite.checkpointer is not None:
                    sqlite.checkpointer.nudge()
            except BaseException:
                txn.outcome = ROLLED_BACK
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite already rolled back (e.g. after SQLITE_FULL)
                raise
            finally:
                sqlite.in_txn = False
                txn.cursor.close()

    # -- retries -----------------------------------------------------------------

    def run(self, func: Callable[..., R], args: tuple[Any, ...], name: str, retries: int,
            read_only: bool, reconnect_timeout: float | None) -> R:
        """``func(txn, *args)`` in a transaction, retried where safe (see
        :meth:`streamrep.db.Database.run`); PostgreSQL write transactions are marked."""
        marked = self._postgres and not read_only
        busy_attempts = 0
        backoff: Backoff | None = None
        while True:
            txn: Transaction | None = None
            result: Any = None
            try:
                with self.attempt(name, read_only, marked) as txn:
                    result = func(txn, *args)
                txn._run_callbacks(True)
                return result  # type: ignore[no-any-return]
            except BaseException as exc:
                committed = False
                if txn is not None and txn.outcome == UNKNOWN:
                    committed = self._marker_committed(txn, name, exc, reconnect_timeout)
                if txn is not None:
                    txn._run_callbacks(committed)
                if committed:
                    logger.info("transaction %s: connection lost at COMMIT, which had "
                                "committed", name)
                    return result  # type: ignore[no-any-return]
                if isinstance(exc, PG_RETRYABLE) or is_busy(exc):
                    if busy_attempts >= retries:
                        raise
                    busy_attempts += 1
                    gevent.sleep(min(0.01 * 2 ** busy_attempts, 0.5))
                    continue
                if not self._postgres or not is_connection_loss(exc):
                    raise
                if backoff is None:
                    backoff = self.backoff(reconnect_timeout)
                self.wait_to_reconnect(backoff, name, exc)

    def retry(self, func: Callable[..., R], args: tuple[Any, ...], name: str,
              reconnect_timeout: float | None) -> R:
        """``func(*args)``, again after a lost PostgreSQL connection (see
        :meth:`streamrep.db.Database.retry`)."""
        backoff: Backoff | None = None
        busy: Backoff | None = None
        while True:
            try:
                return func(*args)
            except Exception as exc:
                if not self._postgres and is_busy(exc):
                    # Another process's write lock outlasted SQLite's own wait, or a
                    # snapshot went stale under another writer: *func* holds no
                    # transaction open once it raised, so it starts again whole.
                    if busy is None:
                        busy = Backoff(BUSY_RETRY_SECONDS)
                    self.wait_for_lock(busy, name, exc)
                    continue
                if not self._postgres or not is_connection_loss(exc):
                    raise
                if backoff is None:
                    backoff = self.backoff(reconnect_timeout)
                self.wait_to_reconnect(backoff, name, exc)

    def wait_for_lock(self, backoff: Backoff, name: str, exc: BaseException) -> None:
        """Sleep before trying a busy SQLite database again, or raise once the budget
        is spent."""
        delay = backoff.next_delay()
        if delay is None:
            raise DatabaseUnavailableError(
                f"SQLite database {self._owner.config.redacted()} stayed locked by another process "
                f"for {backoff.elapsed:.0f}s during {name} ({first_line(exc)}); retry once the other "
                "writer is done, or raise busy_timeout_ms in the URL"
            ) from exc
        gevent.sleep(delay)

    def backoff(self, reconnect_timeout: float | None) -> Backoff:
        """A backoff over *reconnect_timeout* seconds (default: the URL's)."""
        budget = (self._owner.config.reconnect_timeout if reconnect_timeout is None
                  else reconnect_timeout)
        return Backoff(budget)

    def wait_to_reconnect(self, backoff: Backoff, name: str, exc: BaseException) -> None:
        """Sleep before the next attempt, or raise once the budget is spent."""
        self._connections.check_open()
        delay = backoff.next_delay()
        if delay is None:
            raise DatabaseUnavailableError(
                f"database {self._owner.config.redacted()} unavailable for {backoff.elapsed:.0f}s "
                f"during {name} ({first_line(exc)}); check that the server is up and "
                "reachable (reconnect_timeout in the URL sets how long to retry)"
            ) from exc
        if backoff.attempts == 1:
            logger.warning("transaction %s: database connection lost (%s); retrying on a "
                           "new connection", name, first_line(exc))
        gevent.sleep(delay)

    def _marker_committed(self, txn: Transaction, name: str, exc: BaseException,
                          reconnect_timeout: float | None) -> bool:
        """Whether the transaction whose COMMIT was lost committed after all."""
        if txn.marker is None:
            return False  # it wrote nothing: running it again is harmless
        marker_id, serial = txn.marker

        def check(check_txn: Transaction) -> bool:
            check_txn.execute("SET LOCAL lock_timeout = '5s'")
            found = check_txn.fetchval(markers.CHECK_SQL, (marker_id,))
            return found is not None and int(found) >= serial

        backoff = self.backoff(reconnect_timeout)
        while True:
            try:
                with self.attempt(f"{name}:outcome", False, marked=False) as check_txn:
                    return check(check_txn)
            except psycopg2.errors.LockNotAvailable as failure:
                last: BaseException = failure  # the lost COMMIT is still being processed
            except Exception as failure:
                if not is_connection_loss(failure):
                    raise
                last = failure
            self.wait_to_reconnect(backoff, f"{name} (checking whether it committed)", last)


def _pg_rollback(conn: Any, cursor: Any) -> None:
    """End whatever transaction *conn* has open after a failure; close it if even
    that fails (the pool then drops it)."""
    if conn.closed:
        return
    try:
        if conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            cursor.execute("ROLLBACK")
    except psycopg2.Error:
        conn.close()
