"""The single-writer stream ID generator (SQLite or PostgreSQL)."""

from __future__ import annotations

from typing import Sequence

from streamrep.db import Database, Transaction
from streamrep.idgen import ranges
from streamrep.idgen.base import BackingTable, IdGenerator
from streamrep.idgen.schema import COMPONENT as IDGEN_SCHEMA
from streamrep.idgen.tracking import CompletionTracker, WriterPositions


def stored_token_query(tables: Sequence[BackingTable], negative: bool,
                       instance: str | None = None) -> tuple[str, tuple[str, ...]]:
    """One statement (``?`` placeholders) whose single value is the largest token
    stored in *tables*, negated on a negative stream (NULL when they are empty);
    with *instance*, only rows that writer wrote (tables without a writer column
    count whole). Each table's part is an index lookup of its MAX (or MIN)."""
    func = "MIN" if negative else "MAX"
    parts: list[str] = []
    params: list[str] = []
    for table in tables:
        part = f"SELECT {func}({table.id_column}) AS token FROM {table.table}"
        if instance is not None and table.instance_column:
            part += f" WHERE {table.instance_column} = ?"
            params.append(instance)
        parts.append(part)
    sign = "-" if negative else ""
    if len(parts) == 1:
        sql = f"SELECT {sign}token FROM ({parts[0]}) AS stored"
    else:
        sql = f"SELECT {sign}{func}(token) FROM ({' UNION ALL '.join(parts)}) AS stored"
    return sql, tuple(params)


def max_stored_token(txn: Transaction, tables: Sequence[BackingTable], negative: bool,
                     instance: str | None = None) -> int:
    """The largest token stored in *tables* (0 when empty), as
    :func:`stored_token_query` reads it, in *txn*."""
    sql, params = stored_token_query(tables, negative, instance)
    return max(int(txn.fetchval(sql, params, 0)), 0)


class StreamIdGenerator(IdGenerator):
    """IDs for a stream with one writer, handed out from memory.

    At startup the position is the largest ID in the backing tables (``MAX``, or
    ``-MIN`` for a negative stream); there is nothing in flight then, since a
    transaction that did not commit left no rows. Works on SQLite and PostgreSQL.
    """

    def __init__(self, db: Database, stream_name: str, tables: Sequence[BackingTable], *,
                 instance_name: str = "master", negative: bool = False) -> None:
        super().__init__(stream_name, instance_name, [instance_name], negative)
        self.db = db
        self.tables = tuple(tables)
        start = db.run(max_stored_token, self.tables, negative,
                       name=f"{stream_name}:startup", read_only=True)
        self._tracker = CompletionTracker(start)
        self._positions = WriterPositions({instance_name: start})
        #: rows that do not name their writer: claim the tokens before the first fact
        self._unclaimed = ranges.needs_ranges(self.tables)
        if self._unclaimed:
            db.ensure_schema(IDGEN_SCHEMA)

    def _writing(self, txn: Transaction | None) -> None:
        if not self._unclaimed or not self.is_writer:
            return
        position = int(self._tracker.position)
        if txn is None:
            ranges.claim(self.db, self.stream_name, self.instance_name, position)
            self._unclaimed = False
        else:
            # With the fact: the claim commits (or not) with it.
            ranges.claim_in(txn, self.stream_name, self.instance_name, position)
            txn.call_after(self._claimed)

    def _claimed(self) -> None:
        self._unclaimed = False

    def _reserve(self, count: int) -> list[int]:
        self._require_writer()
        with self._lock:
            first = int(self._tracker.reserve(count))
        return list(range(first, first + count))
