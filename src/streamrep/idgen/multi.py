"""The multi-writer stream ID generator (PostgreSQL).

IDs come from a PostgreSQL sequence shared by every writer, so each writer's IDs
have gaps (the others' IDs). Every writer persists its position in
``stream_positions``; a reader (or a restarted writer) starts from there.

At startup the sequence must be ahead of every persisted position and every stored
row, else handing out its next value would reuse a stream ID (this happens after a
failover or a restore from a backup older than the data): the generator refuses with
:class:`SequenceMismatchError` and ``streamrep db repair-sequences`` fixes it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

import gevent
import gevent.lock

from streamrep.db import Database, Transaction
from streamrep.errors import DatabaseConfigError
from streamrep.idgen import schema
from streamrep.idgen.base import BackingTable, IdGenerator
from streamrep.idgen.sequences import check_sequence, sequence_last_value
from streamrep.idgen.single import max_stored_token
from streamrep.idgen.tracking import CompletionTracker, WriterPositions

logger = logging.getLogger(__name__)

UPSERT_POSITION = (
    "INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES (?, ?, ?)"
    " ON CONFLICT (stream_name, instance_name) DO UPDATE"
    " SET stream_id = GREATEST(stream_positions.stream_id, EXCLUDED.stream_id)"
)


class MultiWriterIdGenerator(IdGenerator):
    """IDs for a stream several instances write, from a PostgreSQL sequence.

    *writers* is the configured set of writer instances; *instance_name* is this
    process (a reader when it is not among the writers: it follows positions but
    cannot reserve IDs). Positions are tokens (see :mod:`streamrep.idgen.base`).
    This writer's position is written to ``stream_positions`` at most once per
    *persist_interval* seconds (and by :meth:`persist_position` / :meth:`close`).
    """

    def __init__(self, db: Database, stream_name: str, instance_name: str,
                 writers: Sequence[str], tables: Sequence[BackingTable], sequence_name: str,
                 *, negative: bool = False, persist_interval: float = 0.1) -> None:
        if not writers:
            raise DatabaseConfigError(f"stream {stream_name!r} has no writers configured")
        db.require_multiple_writers(stream_name, list(writers))
        if not db.is_postgres:
            raise DatabaseConfigError(
                f"stream {stream_name!r}: the multi-writer generator needs PostgreSQL "
                "sequences; use the single-writer generator on SQLite"
            )
        super().__init__(stream_name, instance_name, writers, negative)
        self.db = db
        self.tables = tuple(tables)
        self.sequence_name = sequence_name
        db.ensure_schema(schema.COMPONENT)
        # Serializes nextval + track so no advance can slip between them.
        self._reserve_lock = gevent.lock.BoundedSemaphore(1)
        self._seq_conn: Any = None
        self._persist_pending = False
        self._persist_interval = persist_interval
        self._persisted = 0
        self._startup()

    # -- startup ---------------------------------------------------------------------

    def _startup(self) -> None:
        # Idempotent: after a lost connection it runs again.
        self.db.retry(self._startup_once, name=f"{self.stream_name}:startup")

    def _startup_once(self) -> None:
        with self.db.transaction(f"{self.stream_name}:startup") as txn:
            self._ensure_sequence(txn)
            rows = txn.fetchall(
                "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?",
                (self.stream_name,),
            )
            persisted = {str(name): int(pos) for name, pos in rows}
            check_sequence(txn, self.stream_name, self.sequence_name, self.tables,
                           self.negative, persisted)
            seq_value = sequence_last_value(txn, self.sequence_name)
            positions: dict[str, int] = {}
            floor = min(persisted.values(), default=0)
            for writer in self.writers:
                if writer in persisted:
                    positions[writer] = persisted[writer]
                else:
                    # Not started yet (a writer persists its position at startup):
                    # assume the slowest known position, or the rows it stored if any.
                    written = max_stored_token(txn, self.tables, self.negative, writer)
                    positions[writer] = max(floor, written) if written else floor
            if self.is_writer:
                # Nothing of ours is in flight at startup: any transaction of a previous
                # run died with it. Our position catches up with the sequence.
                positions[self.instance_name] = max(positions[self.instance_name], seq_value)
                txn.execute(UPSERT_POSITION, (self.stream_name, self.instance_name,
                                              positions[self.instance_name]))
                self._persisted = positions[self.instance_name]
            # Record the stream's sequence and tables for the repair command.
            # An upsert: writers of one stream may start at the same moment.
            txn.execute(
                "INSERT INTO stream_sequences (stream_name, sequence_name, tables_json, negative)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (stream_name) DO UPDATE SET"
                " sequence_name = EXCLUDED.sequence_name, tables_json = EXCLUDED.tables_json,"
                " negative = EXCLUDED.negative",
                (self.stream_name, self.sequence_name,
                 json.dumps([[t.table, t.id_column, t.instance_column] for t in self.tables]),
                 self.negative),
            )
        own = positions.get(self.instance_name, 0)
        self._tracker = CompletionTracker(own)
        self._positions = WriterPositions(positions)

    def _ensure_sequence(self, txn: Transaction) -> None:
        exists = txn.fetchval("SELECT to_regclass(?) IS NOT NULL", (self.sequence_name,))
        if not exists:
            start = max_stored_token(txn, self.tables, self.negative) + 1
            txn.execute(f"CREATE SEQUENCE IF NOT EXISTS {self.sequence_name} START WITH {start}")

    # -- reserving -------------------------------------------------------------------

    def _sequence_connection(self) -> Any:
        # A private autocommit connection: reserving never waits for a pool slot, so
        # a transaction holding a pooled connection can reserve without deadlock.
        if self._seq_conn is None or self._seq_conn.closed:
            self._seq_conn = self.db.dedicated_connection()
        return self._seq_conn

    def _fetch_sequence_values(self, count: int) -> list[int]:
        # A value fetched on a connection that then dropped is simply never used: the
        # retry takes new ones, so no sequence value is handed out twice.
        return self.db.retry(self._fetch_sequence_values_once, count,
                             name=f"{self.stream_name}:nextval")

    def _fetch_sequence_values_once(self, count: int) -> list[int]:
        conn = self._sequence_connection()
        try:
            with conn.cursor() as cur:
                if count == 1:
                    cur.execute("SELECT nextval(%s)", (self.sequence_name,))
                else:
                    cur.execute("SELECT nextval(%s) FROM generate_series(1, %s)",
                                (self.sequence_name, count))
                values = sorted(int(row[0]) for row in cur.fetchall())
        except Exception:
            conn.close()
            raise
        return values

    def _reserve(self, count: int) -> list[int]:
        self._require_writer()
        if count < 1:
            raise ValueError(f"cannot reserve {count} stream IDs")
        with self._reserve_lock:
            values = self._fetch_sequence_values(count)
            with self._lock:
                for value in values:
                    self._tracker.track(value)
        return values

    def _on_advance(self, visible: list[int], position: int) -> None:
        self._schedule_persist()
        super()._on_advance(visible, position)

    # -- persisting positions ----------------------------------------------------------

    def _schedule_persist(self) -> None:
        if not self._persist_pending:
            self._persist_pending = True
            gevent.spawn(self._persist_soon)

    def _persist_soon(self) -> None:
        # Coalesce: one write per interval however many advances happen meanwhile.
        gevent.sleep(self._persist_interval)
        try:
            self.persist_position()
        except Exception:
            logger.exception("stream %s: persisting the position of %s failed",
                             self.stream_name, self.instance_name)

    def persist_position(self) -> int:
        """Write this writer's position to ``stream_positions`` now; return it."""
        self._persist_pending = False
        with self._lock:
            position = int(self._tracker.position)
        if position > self._persisted:
            self.db.execute(UPSERT_POSITION, (self.stream_name, self.instance_name, position))
            self._persisted = max(self._persisted, position)
        return position

    def _refresh_positions(self) -> None:
        rows = self.db.fetchall(
            "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?",
            (self.stream_name,),
        )
        moved = False
        with self._lock:
            for name, pos in rows:
                if name == self.instance_name and self.is_writer:
                    continue
                if name not in self._positions.positions():
                    self._positions.add_writer(str(name), int(pos))
                    moved = True
                elif self._positions.advance(str(name), int(pos)):
                    moved = True
        if moved:
            self._wake_waiters()

    def refresh_positions(self) -> None:
        """Read every writer's persisted position from ``stream_positions``."""
        self._refresh_positions()

    def advance_idle_position(self) -> tuple[int, int] | None:
        """Move this writer's position up to the sequence when nothing is in flight.

        A writer that writes nothing would otherwise hold every reader's linear
        position back. Returns ``(previous, new)`` (the two tokens of a ``POSITION``
        message) when the position moved, else None. Call it periodically.
        """
        self._require_writer()
        with self._reserve_lock:
            current = self.db.retry(self._sequence_current, name=f"{self.stream_name}:idle")
            with self._lock:
                previous = int(self._tracker.position)
                new = int(self._tracker.advance_to(current))
                if new > previous:
                    self._positions.advance(self.instance_name, new)
        if new <= previous:
            return None
        self._schedule_persist()
        self._wake_waiters()
        return previous, new

    def _sequence_current(self) -> int:
        conn = self._sequence_connection()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT last_value, is_called FROM {self.sequence_name}")
                last_value, is_called = cur.fetchone()
        except Exception:
            conn.close()
            raise
        return int(last_value) if is_called else int(last_value) - 1

    def close(self) -> None:
        """Persist the position and close the private sequence connection."""
        if self.is_writer:
            self.persist_position()
        if self._seq_conn is not None:
            self._seq_conn.close()
            self._seq_conn = None
