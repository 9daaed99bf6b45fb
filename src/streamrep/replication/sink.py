"""The rows a follower takes, written into a table of a SQLite or PostgreSQL database.

:class:`RowSink` writes one row of ``streamrep_follow_rows`` per row of each fact
(``tail --sink URL``). It is a handler of
:class:`~streamrep.replication.db_cursor.SaveInTransaction`: a fact's rows and
the follower's cursor commit in one transaction, so the table holds every fact
exactly once however the follower stops. :func:`open_sink` opens the database,
creates the tables (and nothing else) and returns the keeper that opens the link.

The table, for the people who query it (docs/following.md describes it too):

================  ==========================  ===========================================
column            type (SQLite / PostgreSQL)  holds
================  ==========================  ===========================================
``id``            INTEGER / BIGINT            the order rows were written (ascending)
``cursor_name``   TEXT                        the follower that wrote it (``tail --name``)
``stream``        TEXT                        the stream (``events``, ``caches``...)
``instance``      TEXT                        the writer instance
``token``         BIGINT                      the fact's stream token (a fact's rows share it)
``row_index``     INTEGER                     the row's place in its fact, from 0
``row_json``      TEXT / JSON                 the row, a JSON array as on the wire
``received_ts``   BIGINT                      when it was written, ms since the epoch
================  ==========================  ===========================================
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import orjson

from streamrep.db import Database, Migration, register_schema
from streamrep.db.transaction import Transaction
from streamrep.replication.db_cursor import SaveInTransaction

__all__ = ["COMPONENT", "RowSink", "open_sink"]

#: The schema component of the rows table.
COMPONENT = "follow_rows"

_INDEXES = [
    "CREATE INDEX IF NOT EXISTS streamrep_follow_rows_fact ON streamrep_follow_rows (stream, instance, token, row_index)",
    "CREATE INDEX IF NOT EXISTS streamrep_follow_rows_received ON streamrep_follow_rows (received_ts)",
]

register_schema(COMPONENT, [
    Migration(
        1,
        sqlite=[
            "CREATE TABLE IF NOT EXISTS streamrep_follow_rows ("
            " id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " cursor_name TEXT NOT NULL, stream TEXT NOT NULL, instance TEXT NOT NULL,"
            " token BIGINT NOT NULL, row_index INTEGER NOT NULL,"
            " row_json TEXT NOT NULL, received_ts BIGINT NOT NULL)",
            *_INDEXES,
        ],
        postgres=[
            "CREATE TABLE IF NOT EXISTS streamrep_follow_rows ("
            " id BIGSERIAL PRIMARY KEY,"
            " cursor_name TEXT NOT NULL, stream TEXT NOT NULL, instance TEXT NOT NULL,"
            " token BIGINT NOT NULL, row_index INTEGER NOT NULL,"
            " row_json JSON NOT NULL, received_ts BIGINT NOT NULL)",
            *_INDEXES,
        ],
        description="streamrep_follow_rows: the rows a durable follower took, one per row of each fact",
    ),
])

_INSERT = ("INSERT INTO streamrep_follow_rows"
           " (cursor_name, stream, instance, token, row_index, row_json, received_ts)"
           " VALUES (?, ?, ?, ?, ?, ?, ?)")


class RowSink:
    """Writes each fact's rows into ``streamrep_follow_rows`` of *database*, tagged
    with the follower's *name*; a :data:`~streamrep.replication.db_cursor.TransactionHandler`."""

    def __init__(self, database: Database, name: str) -> None:
        self.database = database
        self.name = name
        database.ensure_schema(COMPONENT)

    def __call__(self, txn: Transaction, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        now = int(time.time() * 1000)
        name = self.name
        txn.executemany(_INSERT, [(name, stream, instance, token, index, orjson.dumps(row).decode(), now)
                                  for index, row in enumerate(rows)])


def open_sink(url: str, name: str, *, start_from: Mapping[Any, int] | None = None,
              on_taken: Callable[[], None] | None = None) -> SaveInTransaction:
    """The keeper of a follower named *name* writing into the database at *url*
    (created when it is a new SQLite file): only its own tables are created there.
    *start_from* applies when *name* has no cursor in it yet; *on_taken* see
    :class:`~streamrep.replication.db_cursor.SaveInTransaction`."""
    database = Database.open(url, migrate=False)
    try:
        return SaveInTransaction(database, name, RowSink(database, name), start_from=start_from,
                                 on_taken=on_taken)
    except BaseException:
        database.close()
        raise
