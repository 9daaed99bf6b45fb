"""The demo's streams, read as one :class:`~streamrep.replication.StreamSource`.

The built-in streams (``caches``, ``account_data``, ``to_device``, ``receipts``) come
from the stream registry; ``events`` and ``backfill`` from the event store's stream
functions (or the registry, once the event store registers them there). Workers
fill gaps from this source and the demo reads the truth from it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import orjson

from streamrep.db import Database
from streamrep.events.streams import (
    current_backfill_token,
    current_events_token,
    get_backfill_stream_rows,
    get_events_stream_rows,
)
from streamrep.streams import Streams, stream_definitions

__all__ = ["DemoSource", "demo_source", "stream_names", "EVENT_STREAMS", "REGISTRY_STREAMS"]

#: The streams of the event store.
EVENT_STREAMS = ("events", "backfill")
#: The built-in database streams the demo writes.
REGISTRY_STREAMS = ("caches", "account_data", "to_device", "receipts")


def stream_names() -> tuple[str, ...]:
    """Every database-backed stream the demo writes and follows."""
    return tuple(sorted(EVENT_STREAMS + REGISTRY_STREAMS))


class DemoSource:
    """A :class:`~streamrep.replication.StreamSource` over the demo's streams.

    *writers* maps each stream to its writer instances (the configuration's
    ``stream_writers``); *instance_name* is the process reading.
    """

    def __init__(self, db: Database, writers: Mapping[str, Sequence[str]],
                 instance_name: str = "reader") -> None:
        self.db = db
        self._writers = {s: tuple(writers.get(s, ())) for s in stream_names()}
        registered = {d.name for d in stream_definitions()}
        self._events_in_registry = set(EVENT_STREAMS) <= registered
        self.streams = Streams(db, instance_name,
                               {s: ws for s, ws in self._writers.items()
                                if s in REGISTRY_STREAMS or self._events_in_registry})

    def _via_registry(self, stream: str) -> bool:
        return stream in REGISTRY_STREAMS or self._events_in_registry

    def stream_names(self) -> Sequence[str]:
        return list(stream_names())

    def writers(self, stream: str) -> Sequence[str]:
        return list(self._writers.get(stream, ()))

    def current_token(self, stream: str, instance: str) -> int:
        if self._via_registry(stream):
            return int(self.streams.current_token(stream, instance))
        if instance not in self._writers.get(stream, ()):
            return 0
        if stream == "events":
            return current_events_token(self.db)
        return current_backfill_token(self.db)

    def updates(self, stream: str, instance: str, from_token: int, upto_token: int,
                limit: int) -> tuple[list[tuple[int, bytes]], bool]:
        rows: Sequence[tuple[int, Any]]
        if self._via_registry(stream):
            rows, limited = self.streams.get_updates_since(stream, instance, from_token,
                                                           upto_token, limit)
        elif instance not in self._writers.get(stream, ()):
            return [], False
        else:
            fetch = get_events_stream_rows if stream == "events" else get_backfill_stream_rows
            chunk = fetch(self.db, from_token, upto_token, limit)
            rows, limited = chunk.rows, chunk.limited
        return [(int(token), orjson.dumps(row)) for token, row in rows], limited

    def close(self) -> None:
        self.streams.close()


def demo_source(db: Database, writers: Mapping[str, Sequence[str]],
                instance_name: str = "reader") -> DemoSource:
    """The source for a process of the demo (see :class:`DemoSource`)."""
    return DemoSource(db, writers, instance_name)
