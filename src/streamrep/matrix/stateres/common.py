"""Pieces shared by the state resolution algorithms."""

from __future__ import annotations

from typing import Mapping, Sequence

from streamrep.matrix import auth
from streamrep.matrix.errors import AuthRejection, StateResolutionError
from streamrep.matrix.events import MatrixEvent, StateKey
from streamrep.matrix.room_versions import RoomVersion
from streamrep.matrix.stateres.source import EventSource, InMemoryEventSource

__all__ = ["StateMap", "load_events", "passes_auth"]

StateMap = Mapping[StateKey, str]


def load_events(room_id: str, event_ids: Sequence[str] | set[str],
                source: EventSource) -> dict[str, MatrixEvent]:
    """The held events among *event_ids*; an event of another room is an error."""
    found: dict[str, MatrixEvent] = {}
    get = source.events.get if isinstance(source, InMemoryEventSource) else source.get_event
    for event_id in event_ids:
        event = get(event_id)
        if event is None:
            continue
        if event.room_id != room_id:
            raise StateResolutionError(
                f"event {event_id} belongs to room {event.room_id}, not {room_id}")
        found[event_id] = event
    return found


def passes_auth(event: MatrixEvent, version: RoomVersion,
                state: Mapping[StateKey, MatrixEvent]) -> bool:
    """True when *event* passes the authorization rules against *state*."""
    try:
        auth.check_against_state(event, version, state)
    except AuthRejection:
        return False
    return True
