"""Soft failure where the specification applies it: to events received from another
server (``persist_events(..., remote=True)``), checked against the room's current
state. A deployment's own events (the default) are checked against their auth events
only, so replaying a deployment's own history soft-fails nothing it accepted.
SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

from typing import Any

from streamrep import EventStore
from streamrep.matrix.room_builder import RoomBuilder

ANN, BOB = "@ann:s.org", "@bob:s.org"


def _history() -> tuple[RoomBuilder, list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Bob sends a message at the moment he leaves: the two are concurrent, and the
    message arrives (and is persisted) after the leave."""
    r = RoomBuilder("!soft:s.org", ANN, "10")
    events = [r.create,
              r.event("m.room.member", ANN, {"membership": "join"}, state_key=ANN),
              r.event("m.room.join_rules", ANN, {"join_rule": "public"}, state_key=""),
              r.event("m.room.member", BOB, {"membership": "join"}, state_key=BOB)]
    tip = r.extremities[0]
    leave = r.event("m.room.member", BOB, {"membership": "leave"}, state_key=BOB, prev=[tip])
    message = r.event("m.room.message", BOB, {"body": "bye"}, prev=[tip])
    return r, events, leave, message


def test_replaying_a_deployments_own_history_soft_fails_nothing(db_url: str) -> None:
    r, events, leave, message = _history()
    store = EventStore(db_url, verify_event_ids="strict")
    try:
        for event in [*events, leave, message]:  # one at a time, as it was written
            assert store.persist_events([event]).rejected == {}
        stored = store.get_event(message["event_id"])
        assert not stored.soft_failed
        assert store.get_forward_extremities(r.room_id) == {leave["event_id"],
                                                            message["event_id"]}
    finally:
        store.close()


def test_the_same_message_received_from_another_server_is_soft_failed(db_url: str) -> None:
    r, events, leave, message = _history()
    store = EventStore(db_url, verify_event_ids="strict")
    try:
        store.persist_events([*events, leave])
        result = store.persist_events([message], remote=True)
        assert result.rejected == {}
        assert store.get_event(message["event_id"]).soft_failed
        assert store.get_forward_extremities(r.room_id) == {leave["event_id"]}
        # Backfilled events are never soft-failed, wherever they come from.
        old = r.event("m.room.message", BOB, {"body": "older"}, prev=[events[-1]["event_id"]],
                      advance=False)
        store.persist_events([old], backfilled=True, remote=True)
        assert not store.get_event(old["event_id"]).soft_failed
    finally:
        store.close()
