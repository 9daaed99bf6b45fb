"""One room as the room rules hold it in memory: its version, its state events (auth
events are always state events) with their auth chain index, and the verdicts the
rules remember from batch to batch.

:meth:`RoomModel.from_stored` builds it from what the event store read of the room
(its stored version and its state events' JSON); the rules then keep it up to date
as they check batches.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import orjson

from streamrep.matrix.errors import MatrixError
from streamrep.matrix.eventformat import prune_event
from streamrep.matrix.events import CREATE, MatrixEvent, StateKey, parse_event
from streamrep.matrix.room_versions import DEFAULT_ROOM_VERSION, RoomVersion, room_version
from streamrep.matrix.stateres import InMemoryEventSource

__all__ = ["RoomModel", "PlainVerdict", "parse_held", "version_of", "known_version"]

#: Entries a room model's verdict memos hold before they are emptied: one per
#: (auth events, sender, type) and per (sender, type) seen, so a room of many senders
#: cannot grow them without bound.
_MAX_MEMO = 4096

#: A soft-failure verdict and the current state it read: ``(key, event ID)`` pairs.
PlainVerdict = tuple[bool, tuple[tuple[StateKey, "str | None"], ...]]


class RoomModel:
    """One room as the rules see it: its version and its state events."""

    def __init__(self, room_id: str, version: RoomVersion | None) -> None:
        self.room_id = room_id
        self.version = version
        self.source = InMemoryEventSource()
        #: ``(auth event IDs, sender, type)`` of plain events (see
        #: ``batchcheck.NOT_PLAIN``) that passed against their auth events. Held
        #: events never change, so such a verdict holds from batch to batch until a
        #: held event is replaced or one is added rejected (see :meth:`add`).
        self.passed: dict[tuple[tuple[str, ...], str, str], bool] = {}
        #: Soft-failure verdicts of plain events, sender -> type -> verdict and the
        #: current state it read; a batch uses those whose state is still current.
        self.plain_memo: dict[str, dict[str, PlainVerdict]] = {}

    @classmethod
    def from_stored(cls, room_id: str, version_id: str | None,
                    state_events: Iterable[tuple[str, bytes, bool, bool]]) -> "RoomModel":
        """The model of a stored room: *version_id* as its ``rooms`` row names it
        (None when it has none), and its state events as ``(event_id, json,
        rejected, redacted)``, the redacted ones held as the room version's
        redaction algorithm prunes them. Without a stored version the room's
        create event gives it."""
        version = room_version(version_id) if version_id is not None else None
        bodies = []
        for event_id, raw, rejected, redacted in state_events:
            body = orjson.loads(raw)
            bodies.append((event_id, body, rejected, redacted))
            if version is None and body.get("type") == CREATE and body.get(
                    "state_key") == "" and not rejected and known_version(body):
                version = room_version(version_of(body))
        model = cls(room_id, version)
        if version is not None:
            for event_id, body, rejected, redacted in bodies:
                if redacted:
                    body = prune_event(body, version)
                try:
                    model.add(parse_held(event_id, body, version), rejected)
                except MatrixError:
                    continue  # stored before these rules; it can authorize nothing
        return model

    def redact(self, event_id: str) -> None:
        """Hold *event_id*, if held, as redaction leaves it."""
        event = self.source.events.get(event_id)
        if event is None or self.version is None:
            return
        fields: dict[str, Any] = {"type": event.type, "room_id": event.room_id,
                                  "sender": event.sender, "content": dict(event.content),
                                  "prev_events": list(event.prev_events),
                                  "auth_events": list(event.auth_events),
                                  "depth": event.depth, "origin_server_ts": event.origin_server_ts}
        if event.state_key is not None:
            fields["state_key"] = event.state_key
        if event.redacts is not None:
            fields["redacts"] = event.redacts
        pruned = prune_event(fields, self.version)
        try:
            held = parse_held(event_id, pruned, self.version)
        except MatrixError:
            return
        self.add(held, rejected=event_id in self.source.rejected)

    def add(self, event: MatrixEvent, rejected: bool) -> None:
        """Hold *event* (a state event) for later authorization and resolution."""
        if self.passed and (rejected or event.event_id in self.source.events):
            self.passed.clear()  # a held event replaced or rejected: verdicts may change
        self.source.add(event, rejected=rejected)

    def bound_memos(self) -> None:
        """Empty the verdict memos that have grown past their bound."""
        if len(self.passed) > _MAX_MEMO:
            self.passed.clear()
        if len(self.plain_memo) > _MAX_MEMO:
            self.plain_memo.clear()


def known_version(body: Mapping[str, Any]) -> bool:
    """Whether a create event's *body* names a room version streamrep implements."""
    try:
        room_version(version_of(body))
    except MatrixError:
        return False
    return True


def version_of(body: Mapping[str, Any]) -> Any:
    """The room version a create event's *body* names (``"1"`` when none)."""
    content = body.get("content")
    return content.get("room_version", DEFAULT_ROOM_VERSION) if isinstance(
        content, dict) else DEFAULT_ROOM_VERSION


def parse_held(event_id: str, body: dict[str, Any], version: RoomVersion) -> MatrixEvent:
    """:func:`~streamrep.matrix.events.parse_event` for an event as the store holds
    it: a version 12 create event stored with the room ID it defines has that key
    set aside (the store needs a room ID on every event; the event has none)."""
    if version.room_id_from_create_event and body.get("type") == CREATE and body.get(
            "state_key") == "" and "room_id" in body:
        body = {k: v for k, v in body.items() if k != "room_id"}
    return parse_event(event_id, body, version)
