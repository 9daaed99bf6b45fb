"""A cursor kept in a database, saved inside the transaction of each fact.

:class:`DatabaseCursor` keeps a follower's cursor in the table
``streamrep_follow_cursors``, one row per ``(cursor name, stream, instance)``.
:class:`SaveInTransaction` calls the application's handler once per fact inside a
database transaction (``handler(txn, stream, instance, token, rows)``) and moves
the cursor in the same transaction: a fact's writes and its position commit
together or not at all, so a follower killed at any moment (``SIGKILL``
included) resumes exactly after the last fact committed: nothing repeated,
nothing lost. The facts of one read share one transaction.
:class:`~streamrep.replication.sink.RowSink` is one such handler.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any, Callable, Mapping

import psycopg2

from streamrep.db import Database, Migration, register_schema
from streamrep.db.transaction import Transaction
from streamrep.errors import DatabaseConfigError, DatabaseUnavailableError
from streamrep.replication.cursor import Cursor, CursorKeeper

if TYPE_CHECKING:
    from streamrep.replication.follower import Handler, StreamFollower

__all__ = ["COMPONENT", "DatabaseCursor", "SaveInTransaction", "TransactionHandler"]

#: The schema component of the cursor table.
COMPONENT = "follow_cursors"

#: The ``instance`` of a row that gives a stream's start for writers not met yet.
ANY_WRITER = ""

register_schema(COMPONENT, [
    Migration(
        1,
        sql=[
            "CREATE TABLE IF NOT EXISTS streamrep_follow_cursors ("
            " cursor_name TEXT NOT NULL,"
            " stream TEXT NOT NULL,"
            " instance TEXT NOT NULL,"
            " token BIGINT NOT NULL,"
            " PRIMARY KEY (cursor_name, stream, instance))",
        ],
        description="streamrep_follow_cursors: where each durable follower is, per writer",
    ),
])

_UPSERT = ("INSERT INTO streamrep_follow_cursors (cursor_name, stream, instance, token) VALUES (?, ?, ?, ?)"
           " ON CONFLICT (cursor_name, stream, instance) DO UPDATE SET token = excluded.token")

#: Facts committed in one transaction at most (a long catch-up commits as it goes).
BATCH_LIMIT = 1000

#: ``handler(txn, stream, instance, token, rows)``: one fact, inside *txn*.
TransactionHandler = Callable[[Transaction, str, str, int, list[Any]], None]


class DatabaseCursor:
    """The cursor named *name* in *database*'s ``streamrep_follow_cursors``.

    A row per writer ``(stream, instance)`` holds the token of the last fact
    taken; a row whose instance is empty holds a stream's start for writers not
    met yet.
    """

    def __init__(self, database: Database, name: str) -> None:
        self.database = database
        self.name = name
        database.ensure_schema(COMPONENT)

    def describe(self) -> str:
        return f"the cursor {self.name!r} in {self.database.config.redacted()}"

    def load(self) -> Cursor | None:
        rows = self.database.fetchall(
            "SELECT stream, instance, token FROM streamrep_follow_cursors WHERE cursor_name = ?", (self.name,))
        if not rows:
            return None
        cursor = Cursor()
        for stream, instance, token in rows:
            if instance == ANY_WRITER:
                cursor.starts[str(stream)] = int(token)
            else:
                cursor.positions[(str(stream), str(instance))] = int(token)
        return cursor

    def save(self, cursor: Cursor) -> None:
        self.database.run(self.save_in, cursor, name="follow_cursor_save")

    def save_in(self, txn: Transaction, cursor: Cursor) -> None:
        """Write *cursor*'s entries in *txn* (entries it does not name are kept)."""
        rows = [(self.name, stream, ANY_WRITER, token) for stream, token in cursor.starts.items()]
        rows.extend((self.name, stream, instance, token) for (stream, instance), token in cursor.positions.items())
        if rows:
            txn.executemany(_UPSERT, rows)

    def move_in(self, txn: Transaction, stream: str, instance: str, token: int) -> None:
        """Move one writer's position in *txn*."""
        txn.execute(_UPSERT, (self.name, stream, instance, token))


def _database_error(exc: BaseException) -> bool:
    """Raised by the database itself (unreachable, full, refusing), rather than by
    the application's handler."""
    return isinstance(exc, (sqlite3.Error, psycopg2.Error, DatabaseUnavailableError, DatabaseConfigError))


class SaveInTransaction(CursorKeeper):
    """The application's *handler* is called once per fact inside a transaction of
    *database* that also moves the cursor *name* (:class:`DatabaseCursor`): exactly
    once across any stop, ``SIGKILL`` included.

    The facts of one read share a transaction (at most *batch_limit* facts each,
    for a long catch-up), committed once the read's facts were all handed on, with
    the positions that moved without a fact. It runs through
    :meth:`Database.run`, so it is retried after a lost PostgreSQL connection and
    its outcome is known even when the connection dropped during ``COMMIT``; the
    handler must keep no effect outside the transaction. A handler that raises
    rolls back the facts of its transaction, which come again, as with any link;
    an error of the database itself (unreachable beyond its retries, full) sets
    :attr:`failure` and stops the link, and the next start resumes after the last
    fact committed. *on_taken* is called as each fact is handed on, before it is
    committed (``tail --limit`` holds the follower there).
    """

    def __init__(self, database: Database, name: str, handler: TransactionHandler, *,
                 start_from: Mapping[Any, int] | None = None, batch_limit: int = BATCH_LIMIT,
                 on_taken: Callable[[], None] | None = None) -> None:
        self.cursor_store = DatabaseCursor(database, name)
        super().__init__(self.cursor_store, start_from=start_from)
        self.database = database
        self.application_handler = handler
        self.batch_limit = batch_limit
        self.on_taken = on_taken
        #: the cursor as committed
        resumed = self.resumed or Cursor()
        self._stored = Cursor(dict(resumed.positions), dict(resumed.starts))
        #: facts handed on and not committed yet
        self._batch: list[tuple[str, str, int, list[Any]]] = []
        self._follower: StreamFollower | None = None

    def handler(self) -> Handler:
        batch = self._batch

        def take(stream: str, instance: str, token: int, rows: list[Any]) -> None:
            follower = self._follower if self._follower is not None else (
                self.link.follower if self.link is not None else None)
            if len(batch) >= self.batch_limit and follower is not None:
                self._commit(follower, None)  # a long catch-up: commit as it goes
                if self.failure is not None:
                    return
            batch.append((stream, instance, token, rows))
            if self.on_taken is not None:
                self.on_taken()

        return take

    def after_read(self, follower: StreamFollower) -> None:
        """The read's facts, and the positions that moved without a fact (a writer's
        ``POSITION``, a writer met for the first time), in one transaction."""
        self._follower = follower
        if self.failure is None:
            self._commit(follower, Cursor.of(follower))

    def save_now(self, cursor: Cursor, follower: StreamFollower | None) -> None:
        try:
            self._commit(follower, cursor)
        except Exception as exc:  # stopping: there is nobody to raise it to
            self._failed(exc, follower)

    def _commit(self, follower: StreamFollower | None, cursor: Cursor | None) -> None:
        """Commit the facts taken so far, with *cursor*'s entries that moved (None:
        only the facts' own positions). A failing handler rolls them back and
        raises, after the follower was rewound to the cursor as committed."""
        batch = list(self._batch)
        stored = self._stored
        if cursor is None:
            cursor = Cursor({(s, i): t for s, i, t, _rows in batch})
        moved = Cursor({k: t for k, t in cursor.positions.items() if stored.positions.get(k) != t},
                       {s: t for s, t in cursor.starts.items() if stored.starts.get(s) != t})
        if not batch and not moved.positions and not moved.starts:
            return
        handler = self.application_handler
        save_in = self.cursor_store.save_in

        def work(txn: Transaction) -> None:
            for stream, instance, token, rows in batch:
                handler(txn, stream, instance, token, rows)
            save_in(txn, moved)

        self._batch.clear()
        try:
            self.database.run(work, name="follow_facts")
        except Exception as exc:
            if follower is not None:
                for key in {(s, i) for s, i, _t, _rows in batch}:
                    follower.state.rewind(key[0], key[1], stored.positions.get(key))
            if not _database_error(exc):
                raise
            # Not committed: take nothing more and stop; nothing is saved from now
            # on, so the next start resumes before these facts.
            self._failed(exc, follower)
            return
        stored.positions.update(moved.positions)
        stored.starts.update(moved.starts)
