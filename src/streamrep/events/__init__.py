"""The room DAG event store: events, edges, extremities, state groups, sync and
pagination. ``from streamrep import EventStore``; see docs/events.md."""

from streamrep.events.store import EventStore, PersistResult, RoomTimeline, SyncResult

__all__ = ["EventStore", "PersistResult", "RoomTimeline", "SyncResult"]
