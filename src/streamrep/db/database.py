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

import gevent
import gevent.lock
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from streamrep import resources
from streamrep.db.checkpoint import WalCheckpointer
from streamrep.db import markers
from streamrep.db.green import make_psycopg_green, suspended_wait_callback
from streamrep.db.migrations import SchemaComponent, get_component, registered_components
from streamrep.db.pgliteral import inline, literals_allowed
from streamrep.db.retry import Backoff, first_line, is_busy, is_connection_loss
from streamrep.db.sql import to_pyformat
from streamrep.db.url import POSTGRES, SQLITE, DatabaseURL, parse_database_url
from streamrep.errors import DatabaseConfigError, DatabaseUnavailableError, SchemaVersionError

logger = logging.getLogger(__name__)

R = TypeVar("R")
Row = tuple[Any, ...]
Params = Sequence[Any]

#: WAL size (in pages) at which a commit checkpoints inline although a background
#: checkpointer runs: only reached when that thread falls behind.
SAFETY_CHECKPOINT_PAGES = 16384

#: Errors after which a PostgreSQL transaction is simply retried by :meth:`Database.run`.
_PG_RETRYABLE = (psycopg2.errors.SerializationFailure, psycopg2.errors.DeadlockDetected)

#: What became of an attempted transaction (``Transaction.outcome``).
PENDING, COMMITTING, COMMITTED, ROLLED_BACK, UNKNOWN = (
    "pending", "committing", "committed", "rolled back", "unknown")

#: Statements that only read (a transaction of nothing else needs no commit marker).
_READ_PREFIXES = ("SELECT", "select", "Select")


class Transaction:
    """One open database transaction. Obtain it from :meth:`Database.transaction`."""

    __slots__ = ("_db", "_cursor", "engine", "name", "_after", "_on_exception", "_begin",
                 "_deferred", "wrote", "outcome", "marker")

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
        # PostgreSQL: statements given to defer() and not sent yet, as one text.
        self._deferred: str | None = None
        #: Whether a statement other than a plain SELECT ran (such a transaction gets
        #: a commit marker under :meth:`Database.run`).
        self.wrote = False
        #: PENDING until the block ends, then COMMITTED, ROLLED_BACK or UNKNOWN (the
        #: connection dropped while COMMIT was on its way).
        self.outcome = PENDING
        #: ``(connection_id, serial)`` sent with COMMIT, when marked.
        self.marker: tuple[int, int] | None = None

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
        self._send_pending()
        self.wrote = True  # unknown SQL: assume it writes
        return self._cursor

    def _send_pending(self) -> None:
        """Send what waits to go with the next statement (BEGIN, deferred writes)."""
        pending = self._pending("")
        if pending:
            self._cursor.execute(pending)

    def _pending(self, text: str) -> str:
        """*text* (SQL without parameters) after the BEGIN and the deferred
        statements that have not been sent, which it now carries."""
        parts = [part for part in (self._begin, self._deferred, text) if part]
        self._begin = self._deferred = None
        return ";\n".join(parts)

    def defer(self, sql: str, params: Params = ()) -> None:
        """Run a write statement with ``?`` placeholders whose result nothing reads.

        On PostgreSQL it goes out with the transaction's next statement or with its
        ``COMMIT``, a round trip fewer; its errors are raised there, and roll the
        transaction back as any error does. On SQLite, or when its parameters cannot
        travel as literals (see :mod:`streamrep.db.pgliteral`), it runs now."""
        if self.engine != POSTGRES:
            self.execute(sql, params)
            return
        text = inline(to_pyformat(sql), params) if literals_allowed(
            self._cursor.connection) else None
        if text is None:
            self.execute(sql, params)
            return
        self.wrote = True
        # BEGIN goes first in the text, which the COMMIT carries if nothing else does.
        self._deferred = self._pending(text) if self._deferred is None else (
            self._deferred + ";\n" + text)

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
        if not self.wrote and not sql.lstrip().startswith(_READ_PREFIXES):
            self.wrote = True
        if self.engine != POSTGRES:
            self._cursor.execute(sql, tuple(params))
            return
        sql = to_pyformat(sql)
        text = inline(sql, params) if literals_allowed(self._cursor.connection) else None
        if text is not None:
            self._cursor.execute(self._pending(text))
        else:
            self._send_pending()
            self._cursor.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement once per parameter tuple of *rows* (batched on PostgreSQL)."""
        self.wrote = True
        if self.engine == POSTGRES:
            self._send_pending()
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
        self._markers_ready = False
        self._commit_checks: list[Callable[[Transaction], None]] = []
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
        mode = self._enable_wal(conn)
        if self.config.target != ":memory:" and (mode is None or str(mode[0]).lower() != "wal"):
            raise DatabaseConfigError(
                f"SQLite database {self.config.target!r} refused WAL mode (got {mode!r})"
            )
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={int(self.config.busy_timeout_ms)}")
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

    def _new_pg_connection(self) -> Any:
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
        except BaseException as exc:
            if conn is not None and (conn.closed or _connection_broken(conn)):
                _close_quietly(conn)
                conn = None
                if is_connection_loss(exc):
                    # Whatever dropped this connection (a server restart, terminated
                    # backends) most likely dropped the idle ones too.
                    self._drop_idle_connections()
            raise
        finally:
            if conn is not None:
                if self._closed or conn.closed:
                    _close_quietly(conn)
                else:
                    self._pool.append(conn)
            self._borrowed -= 1
            self._pool_slots.release()

    def _drop_idle_connections(self) -> None:
        while self._pool:
            _close_quietly(self._pool.pop())

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
        Transactions do not nest on SQLite (the one connection is busy). A block
        cannot be run again, so a lost connection surfaces here as the driver's
        error: use :meth:`run` for work that must survive one.
        """
        txn: Transaction | None = None
        try:
            with self._attempt(name, read_only, marked=False) as txn:
                yield txn
        finally:
            # Outside the connection, so callbacks may open transactions of their own.
            if txn is not None:
                txn._run_callbacks(txn.outcome == COMMITTED)

    @contextlib.contextmanager
    def _attempt(self, name: str, read_only: bool, marked: bool) -> Iterator[Transaction]:
        """One try at a transaction; sets ``txn.outcome`` and leaves the callbacks to
        the caller. With *marked* (PostgreSQL), a transaction that wrote commits
        together with its commit marker (:mod:`streamrep.db.markers`)."""
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
                        # Only a connection lost while COMMIT was on its way leaves
                        # the outcome open; any other failure rolled back.
                        txn.outcome = (UNKNOWN if txn.outcome == COMMITTING
                                       and is_connection_loss(exc) else ROLLED_BACK)
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
                        if txn.wrote and self._commit_checks:
                            self._run_commit_checks(txn)
                        conn.execute("COMMIT")
                        txn.outcome = COMMITTED
                        if not read_only and self._checkpointer is not None:
                            self._checkpointer.nudge()
                    except BaseException:
                        txn.outcome = ROLLED_BACK
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

    def add_commit_check(self, check: Callable[[Transaction], None]) -> None:
        """Call ``check(txn)`` before every write transaction of this handle commits;
        an exception it raises rolls the transaction back (a writer that may have lost
        its lease, see :mod:`streamrep.idgen.lease`)."""
        self._commit_checks.append(check)

    def remove_commit_check(self, check: Callable[[Transaction], None]) -> None:
        """Stop calling *check*."""
        if check in self._commit_checks:
            self._commit_checks.remove(check)

    def _run_commit_checks(self, txn: Transaction) -> None:
        for check in list(self._commit_checks):
            check(txn)

    def run(self, func: Callable[..., R], *args: Any, name: str = "txn", retries: int = 5,
            read_only: bool = False, reconnect_timeout: float | None = None) -> R:
        """Run ``func(txn, *args)`` in a transaction and return its result, retrying
        where a retry is safe:

        * serialization failures and deadlocks (PostgreSQL) or a busy database
          (SQLite): up to *retries* times;
        * a lost PostgreSQL connection: on a new connection, with backoff, for up to
          *reconnect_timeout* seconds (default: the URL's ``reconnect_timeout``),
          then :class:`DatabaseUnavailableError`. When the connection dropped while
          ``COMMIT`` was on its way, the transaction's commit marker tells whether it
          committed: if so its result is returned, else it runs again. So a write
          run here happens exactly once.

        Every attempt's callbacks run when that attempt ends (``call_after`` on the
        one that committed, ``call_on_exception`` on each that did not), so stream
        IDs reserved with :meth:`IdGenerator.get_next_txn` complete either way and a
        retry reserves new ones. *func* must not keep effects of a failed attempt
        outside the database.
        """
        marked = self.engine == POSTGRES and not read_only
        if marked and not self._markers_ready:
            self._prepare_markers()
        busy_attempts = 0
        backoff: Backoff | None = None
        while True:
            txn: Transaction | None = None
            result: Any = None
            try:
                with self._attempt(name, read_only, marked) as txn:
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
                if isinstance(exc, _PG_RETRYABLE) or is_busy(exc):
                    if busy_attempts >= retries:
                        raise
                    busy_attempts += 1
                    gevent.sleep(min(0.01 * 2 ** busy_attempts, 0.5))
                    continue
                if self.engine != POSTGRES or not is_connection_loss(exc):
                    raise
                if backoff is None:
                    backoff = self._backoff(reconnect_timeout)
                self._wait_to_reconnect(backoff, name, exc)

    def retry(self, func: Callable[..., R], *args: Any, name: str,
              reconnect_timeout: float | None = None) -> R:
        """Call ``func(*args)`` (work outside :meth:`run`'s transactions, such as a
        query on a dedicated connection that *func* reopens when closed), again
        after a lost PostgreSQL connection, with :meth:`run`'s backoff and budget."""
        backoff: Backoff | None = None
        while True:
            try:
                return func(*args)
            except Exception as exc:
                if self.engine != POSTGRES or not is_connection_loss(exc):
                    raise
                if backoff is None:
                    backoff = self._backoff(reconnect_timeout)
                self._wait_to_reconnect(backoff, name, exc)

    def _backoff(self, reconnect_timeout: float | None) -> Backoff:
        budget = (self.config.reconnect_timeout if reconnect_timeout is None
                  else reconnect_timeout)
        return Backoff(budget)

    def _wait_to_reconnect(self, backoff: Backoff, name: str, exc: BaseException) -> None:
        """Sleep before the next attempt, or raise once the budget is spent."""
        self._check_open()
        delay = backoff.next_delay()
        if delay is None:
            raise DatabaseUnavailableError(
                f"database {self.config.redacted()} unavailable for {backoff.elapsed:.0f}s "
                f"during {name} ({first_line(exc)}); check that the server is up and "
                "reachable (reconnect_timeout in the URL sets how long to retry)"
            ) from exc
        if backoff.attempts == 1:
            logger.warning("transaction %s: database connection lost (%s); retrying on a "
                           "new connection", name, first_line(exc))
        gevent.sleep(delay)

    def _prepare_markers(self) -> None:
        def prepare() -> None:
            # A handle opened with migrate=False may not have the table yet.
            self.ensure_schema(markers.COMPONENT)
            with self.transaction("commit_markers:prune") as txn:
                txn.execute(markers.PRUNE_SQL)

        self.retry(prepare, name="commit_markers:prepare")
        self._markers_ready = True

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

        backoff = self._backoff(reconnect_timeout)
        while True:
            try:
                with self._attempt(f"{name}:outcome", False, marked=False) as check_txn:
                    return check(check_txn)
            except psycopg2.errors.LockNotAvailable as failure:
                last: BaseException = failure  # the lost COMMIT is still being processed
            except Exception as failure:
                if not is_connection_loss(failure):
                    raise
                last = failure
            self._wait_to_reconnect(backoff, f"{name} (checking whether it committed)", last)

    def execute(self, sql: str, params: Params = ()) -> None:
        """Run one statement in its own transaction (:meth:`run`: retried, once)."""
        self.run(lambda txn: txn.execute(sql, params), name="execute")

    def read_value(self, sql: str, params: Params = (), default: Any = None, *,
                   name: str = "read_value") -> Any:
        """The first value of one read-only statement (*default* for no row or NULL).

        The statement runs alone, in autocommit (a single statement is its own
        snapshot), so it costs no ``BEGIN``/``COMMIT``: this is for reads on a hot
        path, such as the hub's check of a writer's stored token. A busy SQLite
        database or a lost PostgreSQL connection falls back to :meth:`run`, which
        retries as it does for any read.
        """
        try:
            if self.engine == POSTGRES:
                with self._pg_connection() as conn:
                    with conn.cursor() as cursor:
                        cursor.execute(to_pyformat(sql), tuple(params))
                        row = cursor.fetchone()
            else:
                with self._sqlite_lock:
                    self._check_open()
                    if self._sqlite_in_txn:
                        raise DatabaseConfigError(
                            "nested transaction on SQLite: finish the open transaction first")
                    row = self._sqlite.execute(sql, tuple(params)).fetchone()
        except Exception as exc:
            if not (is_busy(exc) or is_connection_loss(exc) or isinstance(exc, _PG_RETRYABLE)):
                raise
            return self.run(lambda txn: txn.fetchval(sql, params, default), name=name, read_only=True)
        if row is None or row[0] is None:
            return default
        return row[0]

    def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one query in its own transaction and return its rows."""
        return self.run(lambda txn: txn.fetchall(sql, params), name="fetchall")

    def fetchone(self, sql: str, params: Params = ()) -> Row | None:
        """Run one query in its own transaction and return its first row."""
        row: Row | None = self.run(lambda txn: txn.fetchone(sql, params), name="fetchone")
        return row

    def fetchval(self, sql: str, params: Params = (), default: Any = None) -> Any:
        """Run one query in its own transaction and return its first value."""
        return self.run(lambda txn: txn.fetchval(sql, params, default), name="fetchval")

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
        # Each step reads the recorded version first, so after a lost connection the
        # whole walk simply starts again (a step whose COMMIT went through is skipped).
        return self.retry(self._migrate_steps, component, name=f"migrate:{component.name}")

    def _migrate_steps(self, component: SchemaComponent) -> int:
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
