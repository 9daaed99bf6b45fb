"""The database handle: SQLite (embedded, one writer, WAL) or PostgreSQL (psycopg2).

Callers write SQL once with ``?`` placeholders and run it inside
``with db.transaction() as txn:``; the block commits when it ends normally and
rolls back when an exception escapes. Work that must happen only once the outcome
is known (completing stream IDs, notifying readers) is queued on the transaction
with :meth:`Transaction.call_after` / :meth:`Transaction.call_on_exception`.

:class:`Database` puts three parts behind one handle: the connections
(:mod:`streamrep.db.pool`), the transactions with their retries and commit markers
(:mod:`streamrep.db.transactions`) and the schema migrations
(:mod:`streamrep.db.migrations`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import psycopg2

from streamrep import resources
from streamrep.db import markers
from streamrep.db.green import suspended_wait_callback
from streamrep.db.migrations import Migrator
from streamrep.db.pool import PostgresPool, SqliteConnection, close_quietly
from streamrep.db.retry import is_busy, is_connection_loss
from streamrep.db.sql import to_pyformat
from streamrep.db.transaction import Params, Row, Transaction
from streamrep.db.transactions import PG_RETRYABLE, TransactionRunner
from streamrep.db.url import POSTGRES, SQLITE, DatabaseURL, parse_database_url
from streamrep.errors import DatabaseConfigError

__all__ = ["Database", "Row", "Transaction", "open_database"]

R = TypeVar("R")


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
        self._markers_ready = False
        self.text_is_utf8 = True  # SQLite keeps text as UTF-8; PostgreSQL: checked below
        self._sqlite: SqliteConnection | None = None
        self._pool: PostgresPool | None = None
        if self.engine == SQLITE:
            self._sqlite = SqliteConnection(self)
            connections: PostgresPool | SqliteConnection = self._sqlite
        else:
            self._pool = connections = PostgresPool(self)
            # Fail at open time, with a clear error, when the server is unreachable.
            with self._pool.borrow() as conn:
                self.server_version = int(conn.server_version)
                # Text travels and is stored as UTF-8 unchanged only when both
                # encodings are UTF8; then UTF-8 bytes may be sent as text.
                self.text_is_utf8 = all(
                    conn.info.parameter_status(name) == "UTF8"
                    for name in ("server_encoding", "client_encoding"))
        self._transactions = TransactionRunner(self, connections)
        self._migrator = Migrator(self.engine, self.transaction, self.retry)
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
        if self._pool is not None:
            return self._pool.borrowed
        assert self._sqlite is not None
        return 1 if self._sqlite.in_txn else 0

    @property
    def idle_connections(self) -> int:
        """PostgreSQL connections kept open in the pool (0 on SQLite)."""
        return self._pool.idle if self._pool is not None else 0

    def __repr__(self) -> str:
        return f"<Database {self.engine} {self.config.redacted()}>"

    # -- connections -----------------------------------------------------------------

    def _postgres_pool(self) -> PostgresPool:
        if self._pool is None:
            raise DatabaseConfigError("dedicated connections exist on PostgreSQL only")
        return self._pool

    @contextlib.contextmanager
    def raw_connection(self) -> Iterator[Any]:
        """A DB-API connection for work the helpers do not cover.

        PostgreSQL: a psycopg2 connection borrowed from the pool (not in autocommit;
        commit or roll back before the block ends, or it is rolled back). SQLite: the
        single connection, held exclusively, in autocommit mode. For ``COPY`` use
        :meth:`copy_connection`.
        """
        if self._pool is not None:
            with self._pool.borrow() as conn:
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
            assert self._sqlite is not None
            with self._sqlite.lock:
                self._sqlite.check_open()
                yield self._sqlite.conn

    def dedicated_connection(self) -> Any:
        """A new psycopg2 connection in autocommit mode, outside the pool.

        For long-lived private uses (e.g. fetching sequence values) that must never
        wait for a pool slot. The caller closes it. PostgreSQL only.
        """
        pool = self._postgres_pool()
        self._check_open()
        conn = pool.connect()
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
        if self._pool is None:
            with self.raw_connection() as conn:
                yield conn
            return
        with suspended_wait_callback():
            conn = self._pool.connect()
            conn.autocommit = False  # the caller commits, as on raw_connection
            try:
                yield conn
            finally:
                close_quietly(conn)

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
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pool is not None:
            self._pool.close()

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
        with self._transactions.transaction(name, read_only) as txn:
            yield txn

    def add_commit_check(self, check: Callable[[Transaction], None]) -> None:
        """Call ``check(txn)`` before every write transaction of this handle commits;
        an exception it raises rolls the transaction back (a writer that may have lost
        its lease, see :mod:`streamrep.idgen.lease`)."""
        self._transactions.add_commit_check(check)

    def remove_commit_check(self, check: Callable[[Transaction], None]) -> None:
        """Stop calling *check*."""
        self._transactions.remove_commit_check(check)

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
        if self.engine == POSTGRES and not read_only and not self._markers_ready:
            self._prepare_markers()
        return self._transactions.run(func, args, name, retries, read_only, reconnect_timeout)

    def retry(self, func: Callable[..., R], *args: Any, name: str,
              reconnect_timeout: float | None = None) -> R:
        """Call ``func(*args)`` (work outside :meth:`run`'s transactions, such as a
        query on a dedicated connection that *func* reopens when closed), again
        after a lost PostgreSQL connection, with :meth:`run`'s backoff and budget."""
        return self._transactions.retry(func, args, name, reconnect_timeout)

    def _prepare_markers(self) -> None:
        def prepare() -> None:
            # A handle opened with migrate=False may not have the table yet.
            self.ensure_schema(markers.COMPONENT)
            with self.transaction("commit_markers:prune") as txn:
                txn.execute(markers.PRUNE_SQL)

        self.retry(prepare, name="commit_markers:prepare")
        self._markers_ready = True

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
            row = self._read_row(sql, params)
        except Exception as exc:
            if not (is_busy(exc) or is_connection_loss(exc) or isinstance(exc, PG_RETRYABLE)):
                raise
            return self.run(lambda txn: txn.fetchval(sql, params, default), name=name, read_only=True)
        if row is None or row[0] is None:
            return default
        return row[0]

    def _read_row(self, sql: str, params: Params) -> Any:
        """The first row of *sql*, run alone in autocommit."""
        if self._pool is not None:
            with self._pool.borrow() as conn:
                with conn.cursor() as cursor:
                    cursor.execute(to_pyformat(sql), tuple(params))
                    return cursor.fetchone()
        assert self._sqlite is not None
        with self._sqlite.lock:
            self._sqlite.check_open()
            self._sqlite.check_not_in_transaction()
            return self._sqlite.conn.execute(sql, tuple(params)).fetchone()

    def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one query in its own read-only transaction and return its rows.

        Read-only, so a reader never holds SQLite's write lock (a reader stopped or
        slow inside its query would otherwise stop every writer) nor starts a
        PostgreSQL transaction that could write: use :meth:`run` to write."""
        return self.run(lambda txn: txn.fetchall(sql, params), name="fetchall", read_only=True)

    def fetchone(self, sql: str, params: Params = ()) -> Row | None:
        """Run one query in its own read-only transaction and return its first row."""
        row: Row | None = self.run(lambda txn: txn.fetchone(sql, params), name="fetchone",
                                   read_only=True)
        return row

    def fetchval(self, sql: str, params: Params = (), default: Any = None) -> Any:
        """Run one query in its own read-only transaction and return its first value."""
        return self.run(lambda txn: txn.fetchval(sql, params, default), name="fetchval",
                        read_only=True)

    # -- schema ----------------------------------------------------------------------

    def schema_version(self, component: str) -> int:
        """The last migration of *component* applied to this database (0: none)."""
        return self._migrator.schema_version(component)

    def apply_migrations(self, components: Iterable[str] | None = None) -> dict[str, int]:
        """Bring the named components (default: every registered one) up to date.

        Returns ``{component: version}``. Raises :class:`SchemaVersionError` when the
        database holds a newer version than this code knows. Safe to call from several
        processes at once (PostgreSQL serializes them with an advisory lock).
        """
        return self._migrator.apply(components)

    def ensure_schema(self, component: str) -> None:
        """Apply *component*'s migrations unless this handle already did (cheap)."""
        self._migrator.ensure(component)


def open_database(url: str, *, migrate: bool = True) -> Database:
    """Open the database at *url* (``sqlite:///path`` or ``postgresql://...``)."""
    return Database(url, migrate=migrate)
