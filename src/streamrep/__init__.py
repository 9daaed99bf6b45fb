"""streamrep: append-only streams, stream-ID generators, a room DAG store and the
line-based TCP replication protocol that lets worker processes follow them."""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamrep.events import EventStore as EventStore


def __getattr__(name: str) -> Any:
    # The event store pulls in the database layer; import it only when asked for.
    if name == "EventStore":
        from streamrep.events import EventStore

        return EventStore
    raise AttributeError(f"module 'streamrep' has no attribute {name!r}")
