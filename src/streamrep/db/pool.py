"""The connections a :class:`~streamrep.db.Database` lends to its transactions.

SQLite: one connection (WAL, one writer), lent to one transaction at a time under a
lock, with a background WAL checkpointer. PostgreSQL: a pool of psycopg2 connections
in autocommit mode (transactions send their own ``BEGIN`` and ``COMMIT``), at most
``pool_size`` lent out at once; a connection that broke is closed instead of
returned, and a lost connection drops the idle ones too.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections import deque
from typing import Any, Iterator

import gevent
import gevent.lock
import psycopg2
import psycopg2.extensions

from streamrep.db import markers
from streamrep.db.checkpoint import WalCheckpointer
from streamrep.db.green import make_psycopg_green
from streamrep.db.retry import is_busy, is_connection_loss
from streamrep.db.transaction import DatabaseInfo
from streamrep.db.url import DatabaseURL
from streamrep.errors import DatabaseConfigError, DatabaseUnavailableError

__all__ = ["PostgresPool", "SAFETY_CHECKPOINT_PAGES", "SqliteConnection"]

logger = logging.getLogger(__name__)

#: WAL size (in pages) at which a commit checkpoints inline although a background
#: checkpointer runs: only reached when that thread falls behind.
SAFETY_CHECKPOINT_PAGES = 16384


class SqliteConnection:
    """The one connection to an SQLite database, in WAL mode.

    ``lock`` is held by whoever uses ``conn``; ``in_txn`` is set while a transaction
    is open on it (SQLite transactions do not nest). *owner* is the database handle
    (its ``config`` says where the file is; errors name it).
    """

    def __init__(self, owner: DatabaseInfo) -> None:
        self._owner = owner
        self.closed = False
        config = self.config
        self.conn = self._connect()
        self.checkpointer: WalCheckpointer | None = None
        if config.background_checkpoint and config.target != ":memory:":
            # SQLite's own checkpoint stays as a bound (64 MiB of 4 KiB pages) in
            # case the thread falls behind.
            self.conn.execute(f"PRAGMA wal_autocheckpoint={SAFETY_CHECKPOINT_PAGES}")
            self.checkpointer = WalCheckpointer(
                config.target, busy_timeout_ms=config.busy_timeout_ms)
        self.lock = gevent.lock.RLock()
        self.in_txn = False

    @property
    def config(self) -> DatabaseURL:
        return self._owner.config

    def check_open(self) -> None:
        """Raise :class:`DatabaseConfigError` once the database is closed."""
        if self.closed:
            raise DatabaseConfigError(f"{self._owner!r} is closed")

    def check_not_in_transaction(self) -> None:
        """Raise :class:`DatabaseConfigError` while a transaction holds the connection."""
        if self.in_txn:
            raise DatabaseConfigError(
                "nested transaction on SQLite: finish the open transaction first")

    def close(self) -> None:
        """Stop the checkpointer and close the connection."""
        self.closed = True
        with self.lock:
            if self.checkpointer is not None:
                self.checkpointer.close()
            self.conn.close()

    def _connect(self) -> sqlite3.Connection:
        config = self.config
        try:
            conn = sqlite3.connect(
                config.target,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,
                timeout=config.busy_timeout_ms / 1000.0,
            )
        except sqlite3.Error as exc:
            raise DatabaseConfigError(
                f"cannot open SQLite database {config.target!r}: {exc}"
            ) from exc
        mode = self._enable_wal(conn)
        if config.target != ":memory:" and (mode is None or str(mode[0]).lower() != "wal"):
            raise DatabaseConfigError(
                f"SQLite database {config.target!r} refused WAL mode (got {mode!r})"
            )
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={int(config.busy_timeout_ms)}")
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> Any:
        """Put *conn*'s database in WAL mode; return the mode SQLite reports.

        Switching a new database to WAL takes it whole for a moment, and a process
        opening it at that moment is refused at once: SQLite does not wait on the
        busy timeout there. Such a refusal is tried again until the busy timeout."""
        deadline = time.monotonic() + self.config.busy_timeout_ms / 1000.0
        delay = 0.005
        while True:
            try:
                return conn.execute("PRAGMA journal_mode=WAL").fetchone()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    conn.close()
                    raise DatabaseUnavailableError(
                        f"SQLite database {self.config.target!r} stayed locked by another "
                        f"process for {self.config.busy_timeout_ms} ms while opening it; "
                        "retry, or raise busy_timeout_ms in the URL") from exc
                gevent.sleep(delay)
                delay = min(delay * 2, 0.1)


class PostgresPool:
    """Pooled psycopg2 connections to one PostgreSQL database (gevent-cooperative).

    *owner* is the database handle (its ``config`` says where the server is and how
    many connections to keep; errors name it).
    """

    def __init__(self, owner: DatabaseInfo) -> None:
        make_psycopg_green()
        self._owner = owner
        self.closed = False
        self._idle: deque[Any] = deque()
        #: Connections lent out now.
        self.borrowed = 0
        self._slots = gevent.lock.BoundedSemaphore(owner.config.pool_size)

    @property
    def config(self) -> DatabaseURL:
        return self._owner.config

    @property
    def idle(self) -> int:
        """Connections kept open in the pool."""
        return len(self._idle)

    def check_open(self) -> None:
        """Raise :class:`DatabaseConfigError` once the database is closed."""
        if self.closed:
            raise DatabaseConfigError(f"{self._owner!r} is closed")

    def connect(self) -> Any:
        """A new connection (autocommit), outside the pool."""
        try:
            conn = psycopg2.connect(self.config.target,
                                    connection_factory=markers.MarkedConnection)
        except psycopg2.OperationalError as exc:
            raise DatabaseUnavailableError(
                f"cannot connect to PostgreSQL at {self.config.redacted()}: {str(exc).strip()}"
            ) from exc
        conn.autocommit = True  # Database.transaction sends BEGIN and COMMIT itself
        return conn

    @contextlib.contextmanager
    def borrow(self) -> Iterator[Any]:
        """A connection for the block: an idle one, else a new one once a slot is free."""
        self.check_open()
        self._slots.acquire()
        self.borrowed += 1
        conn = None
        try:
            while self._idle:
                candidate = self._idle.pop()
                if not candidate.closed:
                    conn = candidate
                    break
            if conn is None:
                conn = self.connect()
            yield conn
        except BaseException as exc:
            if conn is not None and (conn.closed or _connection_broken(conn)):
                close_quietly(conn)
                conn = None
                if is_connection_loss(exc):
                    # Whatever dropped this connection (a server restart, terminated
                    # backends) most likely dropped the idle ones too.
                    self.drop_idle()
            raise
        finally:
            if conn is not None:
                if self.closed or conn.closed:
                    close_quietly(conn)
                else:
                    self._idle.append(conn)
            self.borrowed -= 1
            self._slots.release()

    def drop_idle(self) -> None:
        """Close every idle connection."""
        while self._idle:
            close_quietly(self._idle.pop())

    def close(self) -> None:
        """Close the idle connections; those lent out are closed when returned."""
        self.closed = True
        self.drop_idle()


def _connection_broken(conn: Any) -> bool:
    try:
        status = conn.info.transaction_status
    except psycopg2.Error:
        return True
    return bool(status == psycopg2.extensions.TRANSACTION_STATUS_UNKNOWN)


def close_quietly(conn: Any) -> None:
    """Close *conn*, logging (at debug) rather than raising when that fails."""
    try:
        conn.close()
    except Exception:
        logger.debug("closing a connection failed", exc_info=True)
