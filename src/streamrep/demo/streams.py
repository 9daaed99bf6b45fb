"""The demo's streams and where processes read them from.

Every stream the demo writes is in the stream registry: the built-in ``caches``,
``account_data``, ``to_device`` and ``receipts``, and the event store's ``events``
and ``backfill``. Workers fill gaps from a
:class:`~streamrep.replication.registry_source.RegistrySource` over them, exactly as
``streamrep serve`` does, and the demo reads the truth through one.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import streamrep.events.streams  # noqa: F401  (registers the events and backfill streams)
from streamrep.db import Database
from streamrep.replication.registry_source import RegistrySource
from streamrep.streams import Streams

__all__ = ["EVENT_STREAMS", "REGISTRY_STREAMS", "demo_source", "stream_names"]

#: The event store's streams (one writer).
EVENT_STREAMS = ("events", "backfill")
#: The built-in streams the demo writes (several writers on PostgreSQL).
REGISTRY_STREAMS = ("caches", "account_data", "to_device", "receipts")


def stream_names() -> tuple[str, ...]:
    """Every database-backed stream the demo writes and follows."""
    return tuple(sorted(EVENT_STREAMS + REGISTRY_STREAMS))


def demo_streams(db: Database, instance_name: str,
                 writers: Mapping[str, Sequence[str]]) -> Streams:
    """A :class:`Streams` handle of *instance_name* over the demo's streams."""
    return Streams(db, instance_name, {s: list(writers[s]) for s in stream_names()})


def demo_source(db: Database, writers: Mapping[str, Sequence[str]],
                instance_name: str = "reader") -> RegistrySource:
    """The replication source of a demo process (its ``streams`` attribute is the
    :class:`Streams` handle; close that when done)."""
    return RegistrySource(demo_streams(db, instance_name, writers), stream_names())
