"""The parts of a Matrix event that authorization and state resolution read.

:func:`parse_event` checks the shape a room version requires and raises
:class:`~streamrep.matrix.errors.MalformedEventError` (one line, naming the field)
for anything else. :class:`MatrixEvent` is read-only; ``content`` is the decoded JSON
object and is never modified.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from streamrep.matrix.errors import MalformedEventError
from streamrep.matrix.room_versions import RoomVersion

__all__ = [
    "StateKey",
    "CREATE",
    "MEMBER",
    "POWER_LEVELS",
    "JOIN_RULES",
    "THIRD_PARTY_INVITE",
    "ALIASES",
    "REDACTION",
    "CREATE_KEY",
    "POWER_LEVELS_KEY",
    "JOIN_RULES_KEY",
    "MatrixEvent",
    "parse_event",
    "room_id_for_create_event",
    "create_event_id_for_room",
]

StateKey = tuple[str, str]

CREATE = "m.room.create"
MEMBER = "m.room.member"
POWER_LEVELS = "m.room.power_levels"
JOIN_RULES = "m.room.join_rules"
THIRD_PARTY_INVITE = "m.room.third_party_invite"
ALIASES = "m.room.aliases"
REDACTION = "m.room.redaction"

CREATE_KEY: StateKey = (CREATE, "")
POWER_LEVELS_KEY: StateKey = (POWER_LEVELS, "")
JOIN_RULES_KEY: StateKey = (JOIN_RULES, "")


_T = TypeVar("_T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_options: Any) -> Callable[[_T], _T]:
        return lambda decorator: decorator


@dataclass_transform(frozen_default=True)
def _read_only(cls: type[_T]) -> type[_T]:
    """A slotted dataclass that type checkers treat as frozen.

    At run time it is not frozen: a frozen dataclass sets each field through
    ``object.__setattr__``, which made building a 14-field event 8 times slower, and
    one is built for every state event checked or loaded."""
    return dataclasses.dataclass(slots=True)(cls)


@_read_only
class MatrixEvent:
    """One event as the room model sees it (build it with :func:`parse_event`).
    Read-only: type checkers refuse assignments to its fields, and nothing in
    streamrep makes any."""

    event_id: str
    room_id: str
    type: str
    sender: str
    state_key: str | None
    content: Mapping[str, Any]
    prev_events: tuple[str, ...]
    #: ``auth_events`` exactly as the event lists them.
    auth_events: tuple[str, ...]
    #: Every auth event ID: the listed ones, plus (version 12) the create event
    #: that the room ID names.
    auth_ids: tuple[str, ...]
    depth: int
    origin_server_ts: int
    redacts: str | None = None
    #: ``(type, state_key)``; ``state_key`` is ``""`` for events that have none.
    key: StateKey = ("", "")
    #: ``content.membership`` of a membership event, else None.
    membership: str | None = None

    @property
    def is_state(self) -> bool:
        """True for state events (those with a ``state_key``)."""
        return self.state_key is not None


def room_id_for_create_event(create_event_id: str) -> str:
    """Version 12: the room ID a create event defines (``$abc`` -> ``!abc``)."""
    return "!" + create_event_id[1:]


def create_event_id_for_room(room_id: str) -> str:
    """Version 12: the create event's ID that a room ID names (``!abc`` -> ``$abc``)."""
    return "$" + room_id[1:]


_STR_ONLY = frozenset({str})


def _ids(value: object, field: str, event_id: str, version: RoomVersion) -> tuple[str, ...]:
    if type(value) is list and not version.event_ids_have_domain and _STR_ONLY.issuperset(
            map(type, value)) and "" not in value:
        return tuple(value)  # the usual case, checked in C loops
    if not isinstance(value, list):
        raise MalformedEventError(f"event {event_id}: {field} must be a list")
    out: list[str] = []
    for item in value:
        # Versions 1 and 2 list [event_id, {hashes}] pairs.
        if version.event_ids_have_domain and isinstance(item, list) and item:
            item = item[0]
        if not isinstance(item, str) or not item:
            raise MalformedEventError(
                f"event {event_id}: {field} entries must be event IDs, got {item!r}")
        out.append(item)
    return tuple(out)


def _int(value: object, field: str, event_id: str, default: int | None = None) -> int:
    if type(value) is int:
        return value
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedEventError(f"event {event_id}: {field} must be an integer")
    return value


def parse_event(event_id: str, fields: Mapping[str, Any], version: RoomVersion) -> MatrixEvent:
    """Build a :class:`MatrixEvent` from an event's JSON fields, checking their shape."""
    if not isinstance(event_id, str) or not event_id.startswith("$"):
        raise MalformedEventError(f"event ID {event_id!r} must be a string starting with '$'")
    etype = fields.get("type")
    sender = fields.get("sender")
    if not isinstance(etype, str) or not etype:
        raise MalformedEventError(f"event {event_id}: type must be a non-empty string")
    if not isinstance(sender, str) or not sender.startswith("@") or ":" not in sender:
        raise MalformedEventError(f"event {event_id}: sender must be a user ID")
    state_key = fields.get("state_key")
    if state_key is not None and not isinstance(state_key, str):
        raise MalformedEventError(f"event {event_id}: state_key must be a string")
    content = fields.get("content", {})
    if type(content) is not dict and not isinstance(content, Mapping):
        raise MalformedEventError(f"event {event_id}: content must be an object")
    room_id = fields.get("room_id")
    if etype == CREATE and state_key == "" and version.room_id_from_create_event:
        if room_id is not None:
            raise MalformedEventError(
                f"event {event_id}: a room version {version.identifier} create event has no room_id")
        room_id = room_id_for_create_event(event_id)
    if not isinstance(room_id, str) or not room_id.startswith("!"):
        raise MalformedEventError(f"event {event_id}: room_id must be a room ID")
    if etype == MEMBER:
        if state_key is None:
            raise MalformedEventError(f"event {event_id}: a membership event needs a state_key")
        if not isinstance(content.get("membership"), str):
            raise MalformedEventError(
                f"event {event_id}: a membership event needs a string content.membership")
    prev = _ids(fields.get("prev_events", []), "prev_events", event_id, version)
    auth = _ids(fields.get("auth_events", []), "auth_events", event_id, version)
    auth_ids = auth
    if version.room_id_from_create_event and not (etype == CREATE and state_key == ""):
        create_id = create_event_id_for_room(room_id)
        if create_id not in auth:
            auth_ids = (create_id,) + auth
    # ``redacts`` is a top-level key until version 11, a content key from then on.
    redacts = content.get("redacts") if version.updated_redaction_rules else fields.get(
        "redacts")
    if etype == REDACTION and redacts is not None and not isinstance(redacts, str):
        raise MalformedEventError(f"event {event_id}: redacts must be an event ID")
    if not isinstance(redacts, str):
        redacts = None
    # Positional, in MatrixEvent's field order: cheaper than keywords, once per event.
    return MatrixEvent(
        event_id,
        room_id,
        etype,
        sender,
        state_key,
        content,
        prev,
        auth,
        auth_ids,
        _int(fields.get("depth"), "depth", event_id, default=0),
        _int(fields.get("origin_server_ts"), "origin_server_ts", event_id, default=0),
        redacts,
        (etype, state_key if state_key is not None else ""),
        content.get("membership") if etype == MEMBER else None,
    )
