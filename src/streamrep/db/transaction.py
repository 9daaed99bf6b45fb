"""One open database transaction: statements with ``?`` placeholders, and callbacks
that run once its outcome is known.

A :class:`Transaction` comes from :meth:`Database.transaction` or :meth:`Database.run`
(see :mod:`streamrep.db.transactions`), which commit it when the block ends and roll it
back when an exception escapes. Work that must happen only once the outcome is known
(completing stream IDs, notifying readers) is queued with
:meth:`Transaction.call_after` / :meth:`Transaction.call_on_exception`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Protocol, Sequence

import psycopg2.extras

from streamrep.db.pgliteral import inline, literals_allowed
from streamrep.db.sql import to_pyformat
from streamrep.db.url import POSTGRES, DatabaseURL

__all__ = ["COMMITTED", "COMMITTING", "DatabaseInfo", "PENDING", "Params", "ROLLED_BACK", "Row",
           "Transaction", "UNKNOWN"]

logger = logging.getLogger(__name__)

Row = tuple[Any, ...]
Params = Sequence[Any]

#: What became of an attempted transaction (``Transaction.outcome``).
PENDING, COMMITTING, COMMITTED, ROLLED_BACK, UNKNOWN = (
    "pending", "committing", "committed", "rolled back", "unknown")

#: Statements that only read (a transaction of nothing else needs no commit marker).
_READ_PREFIXES = ("SELECT", "select", "Select")


class DatabaseInfo(Protocol):
    """What a transaction (and the connections under it) know of their database."""

    #: The parsed URL: where the database is, and the connection settings.
    config: DatabaseURL
    #: ``"sqlite"`` or ``"postgresql"``
    engine: str
    #: Whether text travels and is stored as UTF-8 unchanged (always on SQLite).
    text_is_utf8: bool


class Transaction:
    """One open database transaction. Obtain it from :meth:`Database.transaction`."""

    __slots__ = ("_db", "_cursor", "engine", "name", "_after", "_on_exception", "_begin",
                 "_deferred", "wrote", "outcome", "marker")

    def __init__(self, db: DatabaseInfo, cursor: Any, name: str, begin: str | None = None) -> None:
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
    def database(self) -> DatabaseInfo:
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
