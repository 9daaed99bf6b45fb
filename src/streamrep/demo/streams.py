"""The demo's streams and where processes read them from.

The demo writes and follows every database-backed stream streamrep has
(:func:`streamrep.catalogue.known_streams`): the built-in ``caches``,
``account_data``, ``to_device`` and ``receipts``, and the event store's ``events``
and ``backfill``. Workers fill gaps from a
:class:`~streamrep.replication.sources.database.DatabaseSource` over them, exactly as
``streamrep serve`` does, and the demo reads the truth through one.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from streamrep.catalogue import known_streams
from streamrep.db import Database
from streamrep.events.streams import EVENT_STORE_STREAMS
from streamrep.replication.sources.database import DatabaseSource
from streamrep.streams import Streams, StreamSet

__all__ = ["EVENT_STREAMS", "demo_source", "demo_stream_set", "demo_streams",
           "demo_writers", "stream_names"]

#: The event store's streams (one writer).
EVENT_STREAMS = tuple(d.name for d in EVENT_STORE_STREAMS)


def demo_stream_set() -> StreamSet:
    """Every database-backed stream (the demo leaves ``typing`` alone)."""
    return StreamSet(d for d in known_streams() if not d.in_memory)


def stream_names() -> tuple[str, ...]:
    """Every database-backed stream the demo writes and follows."""
    return demo_stream_set().names()


def demo_writers(writers: Sequence[str]) -> dict[str, list[str]]:
    """``stream_writers`` for the demo's *writers*: every writer writes each stream
    that may have several; the first writes the others."""
    return {d.name: list(writers) if d.sequence_name is not None else [writers[0]]
            for d in demo_stream_set()}


def demo_streams(db: Database, instance_name: str,
                 writers: Mapping[str, Sequence[str]]) -> Streams:
    """A :class:`Streams` handle of *instance_name* over the demo's streams."""
    served = demo_stream_set()
    return Streams(db, instance_name, {s: list(writers[s]) for s in served.names()},
                   definitions=served)


def demo_source(db: Database, writers: Mapping[str, Sequence[str]],
                instance_name: str = "reader") -> DatabaseSource:
    """The replication source of a demo process (its ``streams`` attribute is the
    :class:`Streams` handle; close that when done)."""
    return DatabaseSource(demo_streams(db, instance_name, writers), stream_names())
