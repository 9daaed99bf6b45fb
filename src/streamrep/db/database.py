"""The database handle: SQLite (embedded, one writer, WAL) or PostgreSQL (psycopg2).

Callers write SQL once with ``?`` placeholders and run it inside
``with db.transaction() as txn:``; the block commits when it ends normally and
rolls back when an exception escapes. Work that must happen only once the outcome
is known (completing stream IDs, notifying readers) is queued on the transaction
with :meth:`Transaction.call_after` / :meth:`Transaction.call_on_exception`.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import gevent.lock
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from streamrep import resources
from streamrep.db.checkpoint import WalCheckpointer
from streamrep.db.green import make_psycopg_green, suspended_wait_callback
from streamrep.db.migrations import SchemaComponent, get_component, registered_components
from streamrep.db.sql import to_pyformat
from streamrep.db.url import POSTGRES, SQLITE, DatabaseURL, parse_database_url
from streamrep.errors import DatabaseConfigError, SchemaVersionError

logger = logging.getLogger(__name__)

R = TypeVar("R")
Row = tuple[Any, ...]
Params = Sequence[Any]

#: Errors after which a PostgreSQL transaction is simply retried by :meth:`Database.run`.
#: WAL size (in pages) at which a commit checkpoints inline although a background
#: checkpointer runs: only reached when that thread falls behind.
SAFETY_CHECKPOINT_PAGES = 16384

_PG_RETRYABLE = (psycopg2.errors.SerializationFailure, psycopg2.errors.DeadlockDetected)


class Transaction:
    """One open database transaction. Obtain it from :meth:`Database.transaction`."""

    __slots__ = ("_db", "_cursor", "engine", "name", "_after", "_on_exception", "_begin")

    def __init__(self, db: "Database", cursor: Any, name: str, begin: str | None = None) -> None:
        self._db = db
        self._cursor = cursor
        self.engine: str = db.engine
        self.name = name
        self._after: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self._on_exception: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        # PostgreSQL: the BEGIN not sent yet. It travels with the first statement,
        # which saves the transaction a round trip of its own.
        self._begin = begin

    @property
    def is_postgres(self) -> bool:
        return self.engine == POSTGRES

    @property
    def database(self) -> "Database":
        """The database this transaction runs on."""
        return self._db

    @property
    def cursor(self) -> Any:
        """The DB-API cursor underneath (SQL given to it directly is not translated)."""
        self._send_begin()
        return self._cursor

    def _send_begin(self) -> None:
        if self._begin is not None:
            begin, self._begin = self._begin, None
            self._cursor.execute(begin)

    @property
    def begun(self) -> bool:
        """Whether a statement has run (on PostgreSQL: whether the server has a
        transaction open for it)."""
        return self._begin is None

    @property
    def rowcount(self) -> int:
        """Rows touched by the last :meth:`execute`."""
        return int(self._cursor.rowcount)

    def _sql(self, sql: str) -> str:
        return to_pyformat(sql) if self.engine == POSTGRES else sql

    def execute(self, sql: str, params: Params = ()) -> None:
        """Run one statement with ``?`` placeholders."""
        sql = self._sql(sql)
        if self._begin is not None:
            sql, self._begin = self._begin + ";\n" + sql, None
        self._cursor.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement once per parameter tuple of *rows* (batched on PostgreSQL)."""
        if self.engine == POSTGRES:
            self._send_begin()
            psycopg2.extras.execute_batch(self._cursor, self._sql(sql), list(rows), page_size=200)
        else:
            self._cursor.executemany(sql, rows)

    def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """Run a query and return every row as a tuple."""
        self.execute(sql, params)
        return [tuple(r) for r in self._cursor.fetchall()]

    def fetchone(self, sql: str, params: Params = ()) -> Row | None:
        """Run a query and return its first row, or None."""
        self.execute(sql, params)
        row = self._cursor.fetchone()
        return None if row is None else tuple(row)

    def fetchval(self, sql: str, params: Params = (), default: Any = None) -> Any:
        """Run a query and return the first column of its first row (or *default*)."""
        row = self.fetchone(sql, params)
        if row is None or row[0] is None:
            return default
        return row[0]

    def call_after(self, callback: Callable[..., object], *args: Any) -> None:
        """Call ``callback(*args)`` once this transaction has committed."""
        self._after.append((callback, args))

    def call_on_exception(self, callback: Callable[..., object], *args: Any) -> None:
        """Call ``callback(*args)`` once this transaction has rolled back."""
        self._on_exception.append((callback, args))

    def call_on_finish(self, callback: Callable[..., object], *args: Any) -> None:
        """Call ``callback(*args)`` once this transaction has committed or rolled back."""
        self.call_after(callback, *args)
        self.call_on_exception(callback, *args)

    def _run_callbacks(self, committed: bool) -> None:
        callbacks = self._after if committed else self._on_exception
        self._after, self._on_exception = [], []
        for callback, args in callbacks:
            try:
                callback(*args)
            except Exception:
                logger.exception("transaction %s: callback %r failed", self.name, callback)


class Database:
    """A database opened from a URL; see :func:`parse_database_url` for the forms.

    Thread- and greenlet-safe. On SQLite every transaction goes through the one
    connection in turn (SQLite has a single writer anyway); on PostgreSQL each
    transaction borrows a connection from a pool of ``pool_size``.
    """

    def __init__(self, url: str | DatabaseURL, *, migrate: bool = True) -> None:
        self.config = url if isinstance(url, DatabaseURL) else parse_database_url(url)
        self.engine: str = self.config.engine
        self._closed = False
        self._applied: dict[str, int] = {}
        self._schema_lock = gevent.lock.RLock()
        self.text_is_utf8 = True  # SQLite keeps text as UTF-8; PostgreSQL: checked below
        if self.engine == SQLITE:
            self._sqlite = self._connect_sqlite()
            self._checkpointer: WalCheckpointer | None = None
            if self.config.background_checkpoint and self.config.target != ":memory:":
                # SQLite's own checkpoint stays as a bound (64 MiB of 4 KiB pages) in
                # case the thread falls behind.
                self._sqlite.execute(f"PRAGMA wal_autocheckpoint={SAFETY_CHECKPOINT_PAGES}")
                self._checkpointer = WalCheckpointer(
                    self.config.target, busy_timeout_ms=self.config.busy_timeout_ms)
            self._sqlite_lock = gevent.lock.RLock()
            self._sqlite_in_txn = False
        else:
            make_psycopg_green()
            self._pool: deque[Any] = deque()
            self._borrowed = 0
            self._pool_slots = gevent.lock.BoundedSemaphore(self.config.pool_size)
            # Fail at open time, with a clear error, when the server is unreachable.
            with self._pg_connection() as conn:
                self.server_version = int(conn.server_version)
                # Text travels and is stored as UTF-8 unchanged only when both
                # encodings are UTF8; then UTF-8 bytes may be sent as text.
                self.text_is_utf8 = all(
                    conn.info.parameter_status(name) == "UTF8"
                    for name in ("server_encoding", "client_encoding"))
        if resources.ENABLED:
            resources.acquired("database handle")
        if migrate:
            self.apply_migrations()

    @classmethod
    def open(cls, url: str, *, migrate: bool = True) -> "Database":
        """Open the database at *url* and apply every registered migration."""
        return cls(url, migrate=migrate)

    # -- properties ------------------------------------------------------------------

    @property
    def is_postgres(self) -> bool:
        return self.engine == POSTGRES

    @property
    def is_sqlite(self) -> bool:
        return self.engine == SQLITE

    @property
    def supports_multiple_writers(self) -> bool:
        """False on SQLite: one process writes, so streams there have a single writer."""
        return self.engine == POSTGRES

    def require_multiple_writers(self, stream_name: str, writers: Sequence[str]) -> None:
        """Refuse a multi-writer configuration of *stream_name* on SQLite."""
        if len(writers) > 1 and not self.supports_multiple_writers:
            raise DatabaseConfigError(
                f"stream {stream_name!r} is configured with {len(writers)} writers "
                f"({', '.join(writers)}), but SQLite ({self.config.target}) supports a "
                "single writer: use PostgreSQL or configure one writer"
            )

    @property
    def connections_in_use(self) -> int:
        """Connections currently lent out (PostgreSQL pool) or 1 while the SQLite
        connection is in a transaction; returns to 0 when every block has ended."""
        if self.engine == POSTGRES:
            return self._borrowed
        return 1 if self._sqlite_in_txn else 0

    @property
    def idle_connections(self) -> int:
        """PostgreSQL connections kept open in the pool (0 on SQLite)."""
        return len(self._pool) if self.engine == POSTGRES else 0

    def __repr__(self) -> str:
        return f"<Database {self.engine} {self.config.redacted()}>"

    # -- connections -----------------------------------------------------------------

    def _connect_sqlite(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.config.target,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,
                timeout=self.config.busy_timeout_ms / 1000.0,
            )
        except sqlite3.Error as exc:
            raise DatabaseConfigError(
                f"cannot open SQLite database {self.config.target!r}: {exc}"
            ) from exc
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if self.config.target != ":memory:" and (mode is None or str(mode[0]).lower() != "wal"):
            raise DatabaseConfigError(
                f"SQLite database {self.config.target!r} refused WAL mode (got {mode!r})"
            )
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={int(self.config.busy_timeout_ms)}")
        return conn

    def _new_pg_connection(self) -> Any:
        try:
            conn = psycopg2.connect(self.config.target)
        except psycopg2.OperationalError as exc:
            raise DatabaseConfigError(
                f"cannot connect to PostgreSQL at {self.config.redacted()}: {str(exc).strip()}"
            ) from exc
        conn.autocommit = True  # Database.transaction sends BEGIN and COMMIT itself
        return conn

    @contextlib.contextmanager
    def _pg_connection(self) -> Iterator[Any]:
        if self._closed:
            raise DatabaseConfigError(f"{self!r} is closed")
        self._pool_slots.acquire()
        self._borrowed += 1
        conn = None
        try:
            while self._pool:
                candidate = self._pool.pop()
                if not candidate.closed:
                    conn = candidate
                    break
            if conn is None:
                conn = self._new_pg_connection()
            yield conn
        except BaseException:
            if conn is not None and (conn.closed or _connection_broken(conn)):
                _close_quietly(conn)
                conn = None
            raise
        finally:
            if conn is not None:
                if self._closed or conn.closed:
                    _close_quietly(conn)
                else:
                    self._pool.append(conn)
            self._borrowed -= 1
            self._pool_slots.release()

    @contextlib.contextmanager
    def raw_connection(self) -> Iterator[Any]:
        """A DB-API connection for work the helpers do not cover.

        PostgreSQL: a psycopg2 connection borrowed from the pool (not in autocommit;
        commit or roll back before the block ends, or it is rolled back). SQLite: the
        single connection, held exclusively, in autocommit mode. For ``COPY`` use
        :meth:`copy_connection`.
        """
        if self.engine == POSTGRES:
            with self._pg_connection() as conn:
                conn.autocommit = False
                try:
                    yield conn
                finally:
                    if not conn.closed:
                        try:
                            conn.rollback()
                            conn.autocommit = True
                        except psycopg2.Error:
                            conn.close()
        else:
            with self._sqlite_lock:
                self._check_open()
                yield self._sqlite

    def dedicated_connection(self) -> Any:
        """A new psycopg2 connection in autocommit mode, outside the pool.

        For long-lived private uses (e.g. fetching sequence values) that must never
        wait for a pool slot. The caller closes it. PostgreSQL only.
        """
        if self.engine != POSTGRES:
            raise DatabaseConfigError("dedicated connections exist on PostgreSQL only")
        self._check_open()
        conn = self._new_pg_connection()
        conn.autocommit = True
        return conn

    @contextlib.contextmanager
    def copy_connection(self) -> Iterator[Any]:
        """A connection on which ``cursor.copy_expert`` works (PostgreSQL).

        psycopg2 refuses ``COPY`` while the gevent wait callback is installed, so
        within this block it is suspended process-wide: other greenlets' queries block
        the hub meanwhile. Meant for bulk export/import jobs. On SQLite this is
        :meth:`raw_connection`.
        """
        if self.engine != POSTGRES:
            with self.raw_connection() as conn:
                yield conn
            return
        with suspended_wait_callback():
            conn = self._new_pg_connection()
            conn.autocommit = False  # the caller commits, as on raw_connection
            try:
                yield conn
            finally:
                _close_quietly(conn)

    def _check_open(self) -> None:
        if self._closed:
            raise DatabaseConfigError(f"{self!r} is closed")

    def close(self) -> None:
        """Close every connection; further use raises :class:`DatabaseConfigError`."""
        if self._closed:
            return
        self._closed = True
        if resources.ENABLED:
            resources.released("database handle")
        if self.engine == SQLITE:
            with self._sqlite_lock:
                if self._checkpointer is not None:
                    self._checkpointer.close()
                self._sqlite.close()
        else:
            while self._pool:
                _close_quietly(self._pool.pop())

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, name: str = "txn", *, read_only: bool = False) -> Iterator[Transaction]:
        """Open a transaction: commit when the block ends, roll back if it raises.

        After the commit (or the rollback) the callbacks queued with
        :meth:`Transaction.call_after` (or :meth:`Transaction.call_on_exception`) run.
        Transactions do not nest on SQLite (the one connection is busy).
        """
        txn: Transaction | None = None
        committed = False
        if resources.ENABLED:
            resources.acquired("database transaction")
        try:
            if self.engine == POSTGRES:
                # Pooled connections are in autocommit mode; the transaction is
                # bracketed here, its BEGIN sent along with its first statement.
                with self._pg_connection() as conn:
                    cursor = conn.cursor()
                    txn = Transaction(self, cursor, name,
                                      "BEGIN READ ONLY" if read_only else "BEGIN")
                    try:
                        yield txn
                        if txn.begun:
                            cursor.execute("COMMIT")
                        committed = True
                    except BaseException:
                        _pg_rollback(conn, cursor)
                        raise
                    finally:
                        cursor.close()
            else:
                with self._sqlite_lock:
                    self._check_open()
                    if self._sqlite_in_txn:
                        raise DatabaseConfigError(
                            "nested transaction on SQLite: finish the open transaction first"
                        )
                    conn = self._sqlite
                    conn.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
                    self._sqlite_in_txn = True
                    txn = Transaction(self, conn.cursor(), name)
                    try:
                        yield txn
                        conn.execute("COMMIT")
                        committed = True
                        if not read_only and self._checkpointer is not None:
                            self._checkpointer.nudge()
                    except BaseException:
                        try:
                            conn.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass  # SQLite already rolled back (e.g. after SQLITE_FULL)
                        raise
                    finally:
                        self._sqlite_in_txn = False
                        txn.cursor.close()
        finally:
            if resources.ENABLED:
                resources.released("database transaction")
            # Outside the connection, so callbacks may open transactions of their own.
            if txn is not None:
                txn._run_callbacks(committed)

    def run(self, func: Callable[..., R], *args: Any, name: str = "txn", retries: int = 5) -> R:
        """Run ``func(txn, *args)`` in a transaction, retrying on serialization
        failures and deadlocks (PostgreSQL) or a busy database (SQLite)."""
        attempt = 0
        while True:
            try:
                with self.transaction(name) as txn:
                    return func(txn, *args)
            except _PG_RETRYABLE:
                if attempt >= retries:
                    raise
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or attempt >= retries:
                    raise
            attempt += 1
            time.sleep(min(0.01 * 2**attempt, 0.5))

    def execute(self, sql: str, params: Params = ()) -> None:
        """Run one statement in its own transaction."""
        with self.transaction("execute") as txn:
            txn.execute(sql, params)

    def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one query in its own transaction and return its rows."""
        with self.transaction("fetchall") as txn:
            return txn.fetchall(sql, params)

    def fetchone(self, sql: str, params: Params = ()) -> Row | None:
        """Run one query in its own transaction and return its first row."""
        with self.transaction("fetchone") as txn:
            return txn.fetchone(sql, params)

    def fetchval(self, sql: str, params: Params = (), default: Any = None) -> Any:
        """Run one query in its own transaction and return its first value."""
        with self.transaction("fetchval") as txn:
            return txn.fetchval(sql, params, default)

    # -- schema ----------------------------------------------------------------------

    def _ensure_versions_table(self, txn: Transaction) -> None:
        txn.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions ("
            " component TEXT NOT NULL PRIMARY KEY,"
            " version INTEGER NOT NULL)"
        )

    def schema_version(self, component: str) -> int:
        """The last migration of *component* applied to this database (0: none)."""
        with self.transaction("schema_version") as txn:
            self._ensure_versions_table(txn)
            return int(txn.fetchval(
                "SELECT version FROM schema_versions WHERE component = ?", (component,), 0
            ))

    def apply_migrations(self, components: Iterable[str] | None = None) -> dict[str, int]:
        """Bring the named components (default: every registered one) up to date.

        Returns ``{component: version}``. Raises :class:`SchemaVersionError` when the
        database holds a newer version than this code knows. Safe to call from several
        processes at once (PostgreSQL serializes them with an advisory lock).
        """
        chosen = (registered_components() if components is None
                  else [get_component(name) for name in components])
        with self._schema_lock:
            return {c.name: self._migrate_component(c) for c in chosen}

    def ensure_schema(self, component: str) -> None:
        """Apply *component*'s migrations unless this handle already did (cheap)."""
        entry = get_component(component)
        if self._applied.get(component) == entry.latest_version:
            return
        with self._schema_lock:
            self._migrate_component(entry)

    def _migrate_component(self, component: SchemaComponent) -> int:
        latest = component.latest_version
        while True:
            with self.transaction(f"migrate:{component.name}") as txn:
                if self.engine == POSTGRES:
                    # Serialize concurrent migrators (per database, brief).
                    txn.execute("SELECT pg_advisory_xact_lock(?)", (0x5752_4D47,))
                self._ensure_versions_table(txn)
                current = int(txn.fetchval(
                    "SELECT version FROM schema_versions WHERE component = ?",
                    (component.name,), 0,
                ))
                if current > latest:
                    raise SchemaVersionError(
                        f"database schema component {component.name!r} is at version "
                        f"{current}, newer than this streamrep knows ({latest}); upgrade "
                        "streamrep before using this database"
                    )
                if current == latest:
                    self._applied[component.name] = latest
                    return latest
                step = component.migrations[current]
                for statement in step.statements(self.engine):
                    txn.execute(statement)
                if step.run is not None:
                    step.run(txn)
                if current == 0:
                    txn.execute(
                        "INSERT INTO schema_versions (component, version) VALUES (?, ?)",
                        (component.name, step.version),
                    )
                else:
                    txn.execute(
                        "UPDATE schema_versions SET version = ? WHERE component = ?",
                        (step.version, component.name),
                    )
                logger.info("schema %s: applied migration %d %s", component.name,
                            step.version, step.description)


def _connection_broken(conn: Any) -> bool:
    try:
        status = conn.info.transaction_status
    except psycopg2.Error:
        return True
    return bool(status == psycopg2.extensions.TRANSACTION_STATUS_UNKNOWN)


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


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        logger.debug("closing a connection failed", exc_info=True)


def open_database(url: str, *, migrate: bool = True) -> Database:
    """Open the database at *url* (``sqlite:///path`` or ``postgresql://...``)."""
    return Database(url, migrate=migrate)
