"""The database as a :class:`~streamrep.replication.sources.StreamSource`.

:class:`DatabaseSource` reads rows through :class:`streamrep.streams.Streams`
(``get_updates_since``) and encodes them once as the JSON ``RDATA`` carries.
Writer positions come from the database, so a restarted hub starts from what is
really persisted:

* a stream fed by a PostgreSQL sequence (several writers): the writer's position
  in ``stream_positions`` (which never runs ahead of its completed facts);
* a single-writer stream: the largest ID that writer stored (its facts commit
  in order, so everything up to that is readable).

A writer may announce a position up to what the database holds of it: its largest
row, or on a sequence-fed stream its persisted position when that is further.

In-memory streams (``typing``) are included only where this process writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamrep.errors import UnknownStreamError
from streamrep.idgen import ranges
from streamrep.idgen.single import stored_token_query
from streamrep.streams import Streams

if TYPE_CHECKING:
    from streamrep._pure import wire as _core_wire
else:
    from streamrep import _impl

    _core_wire = _impl.load("wire")

__all__ = ["DatabaseSource"]


def _distinct_instances(table: str, column: str) -> str:
    """The distinct writers of *table*, one index probe each (a loose index scan
    over its ``(instance_name, stream_id)`` index), however many rows it holds."""
    return (f"WITH RECURSIVE w(name) AS (SELECT MIN({column}) FROM {table} UNION ALL"
            f" SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > w.name) FROM w"
            f" WHERE w.name IS NOT NULL) SELECT name FROM w WHERE name IS NOT NULL")


class DatabaseSource:
    """Streams of one database as a replication source (see module docstring)."""

    def __init__(self, streams: Streams, names: Sequence[str] | None = None) -> None:
        self.streams = streams
        self.db = streams.db
        chosen = list(names) if names is not None else streams.names()
        self._names = [
            name for name in chosen
            if not streams.definition(name).in_memory
            or streams.instance_name in streams.writers_of(name)
        ]
        for name in self._names:
            streams.get(name)  # creates tables and generators now, failing early

    def stream_names(self) -> Sequence[str]:
        return list(self._names)

    def _multi_writer(self, stream: str) -> bool:
        return self.streams.definition(stream).sequence_name is not None and bool(self.db.is_postgres)

    def writers(self, stream: str, after: int | None = None) -> Sequence[str]:
        definition = self.streams.definition(stream)
        if definition.in_memory:
            return list(dict.fromkeys(self.streams.writers_of(stream)))
        recorded = self._ranges(stream)
        if recorded:
            # The instances that wrote it, never one configured that did not.
            return [instance for instance in ranges.writers(recorded)
                    if after is None or ranges.last_token_of(recorded, instance, 2**62) > after]
        found: dict[str, None] = dict.fromkeys(self.streams.writers_of(stream) if after is None else ())
        for table in definition.tables:
            if table.instance_column:
                for (instance,) in self.db.fetchall(_distinct_instances(table.table, table.instance_column)):
                    if after is None or self._stored(stream, str(instance)) > after:
                        found.setdefault(str(instance), None)
        if self._multi_writer(stream):
            for (instance,) in self.db.fetchall(
                "SELECT instance_name FROM stream_positions WHERE stream_name = ?", (stream,)
            ):
                found.setdefault(str(instance), None)
        return list(found)

    def current_token(self, stream: str, instance: str) -> int:
        definition = self.streams.definition(stream)
        if definition.in_memory:
            return int(self.streams.current_token(stream, instance))
        if self._multi_writer(stream):
            return self._persisted(stream, instance)
        return self._stored(stream, instance)

    def stored_token(self, stream: str, instance: str) -> int:
        definition = self.streams.definition(stream)
        if definition.in_memory:
            return int(self.streams.current_token(stream, instance))
        stored = self._stored(stream, instance)
        if self._multi_writer(stream):
            # A stream that keeps one row per key (receipts, account data) loses a
            # writer's rows to later facts, another writer's too, so its largest
            # row can fall behind facts it has completed: its persisted position
            # counts as held.
            stored = max(stored, self._persisted(stream, instance))
        return stored

    def _persisted(self, stream: str, instance: str) -> int:
        """The writer's position in ``stream_positions`` (0 when it has none)."""
        value = self.db.read_value(
            "SELECT stream_id FROM stream_positions WHERE stream_name = ? AND instance_name = ?",
            (stream, instance), 0, name=f"{stream}:replication_persisted")
        return abs(int(value))

    def _stored(self, stream: str, instance: str) -> int:
        # Read once per writer transaction by the hub's token check: one statement
        # without BEGIN/COMMIT, and a lost connection is retried rather than
        # failing the peer.
        definition = self.streams.definition(stream)
        sql, params = stored_token_query(definition.tables, definition.negative, instance)
        stored = max(int(self.db.read_value(sql, params, 0, name=f"{stream}:replication_stored")), 0)
        recorded = self._ranges(stream)
        if recorded:
            # Rows that do not name their writer: only the tokens *instance* wrote.
            return ranges.last_token_of(recorded, instance, stored)
        return stored

    def _ranges(self, stream: str) -> ranges.Ranges:
        """Who wrote which tokens of *stream*, when its rows do not say (else empty)."""
        if not ranges.needs_ranges(self.streams.definition(stream).tables):
            return []
        return ranges.read(self.db, stream)

    def updates(
        self, stream: str, instance: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], bool]:
        if stream not in self._names:
            raise UnknownStreamError(f"unknown stream {stream!r}")
        rows, limited = self.streams.get_updates_since(stream, instance, from_token, upto_token, limit)
        encode = _core_wire.encode_row
        out: list[tuple[int, bytes]] = [(int(token), encode(row)) for token, row in rows]
        return out, limited

