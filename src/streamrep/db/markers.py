"""Commit markers: how a retried PostgreSQL transaction learns whether its lost
``COMMIT`` went through.

When the connection drops while ``COMMIT`` is on its way, the client cannot tell
whether the server committed. Redoing the work could write a fact twice; dropping it
could lose one. So every write transaction run by :meth:`Database.run` on PostgreSQL
upserts one row in ``commit_markers`` in the same round trip as its ``COMMIT``: the
row of its connection (a random ``connection_id``) with the connection's next
``serial``. After such a loss, reading that row on a new connection decides: the
serial is there, so the transaction committed; it is not, so it rolled back and is
run again. The read takes the row lock (``FOR UPDATE``), so it waits for a ``COMMIT``
the server is still processing instead of reading past it.

One row per connection, rewritten in place; rows of connections idle for a day
(dead processes' included) are deleted when a handle first writes.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg2.extensions

from streamrep.db.migrations import Migration, register_schema

COMPONENT = "commit_markers"

register_schema(COMPONENT, [
    Migration(
        1,
        postgres=[
            "CREATE TABLE IF NOT EXISTS commit_markers ("
            " connection_id BIGINT NOT NULL PRIMARY KEY,"
            " serial BIGINT NOT NULL,"
            " touched_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        ],
        description="commit_markers (PostgreSQL): outcome of a COMMIT whose connection dropped",
    ),
])

#: Sent with ``COMMIT``, in the same query: both values are integers this module made.
MARK_SQL = (
    "INSERT INTO commit_markers (connection_id, serial, touched_at) VALUES ({0}, {1}, now())"
    " ON CONFLICT (connection_id) DO UPDATE SET serial = EXCLUDED.serial,"
    " touched_at = EXCLUDED.touched_at;\nCOMMIT"
)

CHECK_SQL = "SELECT serial FROM commit_markers WHERE connection_id = ? FOR UPDATE"

PRUNE_SQL = "DELETE FROM commit_markers WHERE touched_at < now() - interval '1 day'"


class MarkedConnection(psycopg2.extensions.connection):  # type: ignore[misc]
    """A psycopg2 connection that carries its commit-marker identity."""

    def __init__(self, dsn: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(dsn, *args, **kwargs)
        self.marker_id = random.getrandbits(63)
        self.marker_serial = 0

    def next_marker(self) -> tuple[int, int]:
        """``(connection_id, serial)`` for the next marked commit on this connection."""
        self.marker_serial += 1
        return self.marker_id, self.marker_serial


def commit_with_marker(marker: tuple[int, int]) -> str:
    """The query committing a transaction together with its marker."""
    return MARK_SQL.format(int(marker[0]), int(marker[1]))
