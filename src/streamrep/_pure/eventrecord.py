"""Checked event records from what callers hand to ``persist_events`` (pure twin of
``streamrep._core.eventrecord``; :mod:`streamrep.events.validation` says what an
item may be).

:func:`parse_event` is the one definition of what a valid item is and of the
error each invalid one gets (:func:`parse_batch` applies it to a whole batch); the compiled twin takes the usual items on a path of
its own and hands every other to this one. Both build this module's
:class:`EventRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from streamrep.errors import InvalidEventError

# The twins' API; EventRecord and FLAG_KEYS, defined here once, are shared by both.
__all__ = ["parse_batch", "parse_event"]

#: Keys of a mapping that are persistence flags rather than event fields.
FLAG_KEYS = ("outlier", "rejected", "soft_failed")

#: The longest an identifier may be, in UTF-8 bytes (the specification's size limit
#: of ``event_id``, ``room_id``, ``sender``, ``type`` and ``state_key``, which the
#: store also applies to the event IDs an event names).
MAX_IDENTIFIER_BYTES = 255


@dataclass(slots=True)
class EventRecord:
    """One validated event on its way into the database."""

    event_id: str
    room_id: str
    type: str
    sender: str
    depth: int
    prev_events: list[str]
    state_key: str | None
    json: bytes
    #: The event's fields as given: the caller's mapping less ``event_id`` and the
    #: flags (its values are the caller's objects), or the decoded ``json``.
    body: dict[str, Any]
    content: dict[str, Any]
    outlier: bool
    rejected: bool
    soft_failed: bool
    membership: str | None
    redacts: str | None
    relates_to: str | None

    @property
    def is_state(self) -> bool:
        return self.state_key is not None

    @property
    def counts(self) -> bool:
        """Whether it can be (or remove) a forward extremity."""
        return not (self.outlier or self.rejected or self.soft_failed)


_EMPTY: dict[str, Any] = {}


def _flag(flags: Mapping[str, Any], name: str, event_id: str) -> bool:
    value = flags.get(name, False)
    if value is False or value is True:
        return value
    if not isinstance(value, bool):
        raise InvalidEventError(f"event {event_id}: flag {name!r} must be a boolean, "
                                f"not {type(value).__name__}")
    return value


def _str_field(body: Mapping[str, Any], name: str, event_id: str) -> str:
    if name not in body:
        raise InvalidEventError(f"event {event_id}: missing field {name!r}")
    value = body[name]
    if not isinstance(value, str) or not value:
        raise InvalidEventError(f"event {event_id}: field {name!r} must be a non-empty "
                                f"string, not {value!r}"[:300])
    return value


def _prev_events(body: Mapping[str, Any], event_id: str) -> list[str]:
    if "prev_events" not in body:
        raise InvalidEventError(f"event {event_id}: missing field 'prev_events'")
    raw = body["prev_events"]
    if not isinstance(raw, list):
        raise InvalidEventError(f"event {event_id}: 'prev_events' must be a list")
    out: list[str] = []
    for item in raw:
        # Room versions 1 and 2 list [event_id, hashes] pairs.
        if isinstance(item, list) and item and isinstance(item[0], str):
            item = item[0]
        if not isinstance(item, str) or not item:
            raise InvalidEventError(f"event {event_id}: 'prev_events' holds {item!r}"[:300])
        if item == event_id:
            raise InvalidEventError(f"event {event_id}: lists itself in 'prev_events'")
        if item not in out:
            out.append(item)
    return out


def _check_identifier(value: str, field: str, event_id: str) -> None:
    """Refuse a NUL character (no database text column holds it; PostgreSQL refuses
    it) and more than :data:`MAX_IDENTIFIER_BYTES` (past them PostgreSQL's indexes
    refuse keys)."""
    if "\x00" in value:
        raise InvalidEventError(f"event {event_id}: {field!r} holds a NUL character, "
                                "which no identifier may hold"[:300])
    size = len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidEventError(f"event {event_id[:100]}: {field!r} is {size} bytes; "
                                f"identifiers may have at most {MAX_IDENTIFIER_BYTES}")


def _check_identifiers(event_id: str, room_id: str, etype: str, sender: str,
                       state_key: str | None, prev_events: list[str], body: Mapping[str, Any],
                       others: tuple[tuple[str, str | None], ...]) -> None:
    """The identifiers of an event as :func:`_check_identifier` wants them."""
    for field, value in (("event_id", event_id), ("room_id", room_id), ("type", etype),
                         ("sender", sender), ("state_key", state_key), *others):
        if value is not None:
            _check_identifier(value, field, event_id)
    for prev in prev_events:
        _check_identifier(prev, "prev_events", event_id)
    auth = body.get("auth_events")
    if type(auth) is list:
        for item in auth:
            if isinstance(item, list) and item:  # versions 1 and 2: [event_id, hashes]
                item = item[0]
            if isinstance(item, str):
                _check_identifier(item, "auth_events", event_id)


def _build(event_id: Any, body: Any, raw: bytes, flags: Mapping[str, Any]) -> EventRecord:
    if type(event_id) is not str or not event_id:
        raise InvalidEventError(f"event_id must be a non-empty string, not {event_id!r}"[:300])
    if type(body) is not dict:
        raise InvalidEventError(f"event {event_id}: JSON must be an object")
    room_id = body.get("room_id")
    etype = body.get("type")
    sender = body.get("sender")
    if room_id is None and etype == "m.room.create" and body.get("state_key") == "" and (
            event_id.startswith("$")):
        # Room version 12: a create event has no room_id; the room's ID is the
        # create event's ID with "!" for "$" (the JSON is stored as received).
        room_id = "!" + event_id[1:]
    # The common case costs three type checks; the helper explains any failure.
    if type(room_id) is not str or not room_id:
        room_id = _str_field(body, "room_id", event_id)
    if type(etype) is not str or not etype:
        etype = _str_field(body, "type", event_id)
    if type(sender) is not str or not sender:
        sender = _str_field(body, "sender", event_id)
    depth = body.get("depth")
    if type(depth) is not int or not 0 <= depth < 2**62:
        if "depth" not in body:
            raise InvalidEventError(f"event {event_id}: missing field 'depth'")
        raise InvalidEventError(f"event {event_id}: 'depth' must be a non-negative integer")
    raw_prevs = body.get("prev_events")
    if (type(raw_prevs) is list and len(raw_prevs) == 1 and type(raw_prevs[0]) is str
            and raw_prevs[0] and raw_prevs[0] != event_id):
        prev_events = [raw_prevs[0]]
    else:
        prev_events = _prev_events(body, event_id)
    state_key = body.get("state_key")
    if state_key is not None and not isinstance(state_key, str):
        raise InvalidEventError(f"event {event_id}: 'state_key' must be a string")
    content = body.get("content", _EMPTY)
    if type(content) is not dict:
        raise InvalidEventError(f"event {event_id}: 'content' must be an object")
    membership = None
    if etype == "m.room.member":
        membership = content.get("membership")
        if not isinstance(membership, str) or state_key is None:
            raise InvalidEventError(
                f"event {event_id}: m.room.member needs a state_key and a string "
                "content.membership")
    redacts = None
    if etype == "m.room.redaction":
        redacts = body.get("redacts", content.get("redacts"))
        if not isinstance(redacts, str) or not redacts:
            raise InvalidEventError(f"event {event_id}: m.room.redaction needs 'redacts'")
    relates_to = None
    relation = content.get("m.relates_to")
    if isinstance(relation, dict) and isinstance(relation.get("event_id"), str):
        relates_to = relation["event_id"]
    _check_identifiers(event_id, room_id, etype, sender, state_key, prev_events, body,
                       (("membership", membership), ("redacts", redacts),
                        ("m.relates_to.event_id", relates_to)))
    if flags:
        outlier = _flag(flags, "outlier", event_id)
        rejected = _flag(flags, "rejected", event_id)
        soft_failed = _flag(flags, "soft_failed", event_id)
    else:
        outlier = rejected = soft_failed = False
    # Positional: several times cheaper than keywords for a slotted dataclass, and
    # this runs once per persisted event. The order is EventRecord's field order.
    return EventRecord(event_id, room_id, etype, sender, depth, prev_events, state_key, raw,
                       body, content, outlier, rejected, soft_failed, membership, redacts,
                       relates_to)


def parse_event(item: Any) -> EventRecord:
    """Validate one ``persist_events`` item; raises :class:`InvalidEventError`."""
    if type(item) is dict or isinstance(item, Mapping):
        if "event_id" not in item:
            raise InvalidEventError("event mapping has no 'event_id'")
        body = dict(item)
        del body["event_id"]
        has_flags = False
        for key in FLAG_KEYS:
            if key in body:
                del body[key]
                has_flags = True
        try:
            raw = orjson.dumps(body)
        except TypeError as exc:
            raise InvalidEventError(
                f"event {item['event_id']!r}: not serializable as JSON ({exc})") from exc
        return _build(item["event_id"], body, raw, item if has_flags else _EMPTY)
    if isinstance(item, tuple) and len(item) in (2, 3):
        event_id, raw = item[0], item[1]
        flags = item[2] if len(item) == 3 else {}
        if not isinstance(flags, Mapping):
            raise InvalidEventError(f"event {event_id!r}: flags must be a mapping")
        if isinstance(raw, (bytearray, memoryview)):
            raw = bytes(raw)
        if not isinstance(raw, bytes):
            raise InvalidEventError(f"event {event_id!r}: JSON must be bytes, "
                                    f"not {type(raw).__name__}")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidEventError(f"event {event_id!r}: bad JSON ({exc})") from exc
        return _build(event_id, body, raw, flags)
    raise InvalidEventError(
        "an event is a mapping with 'event_id' or an (event_id, json_bytes[, flags]) tuple, "
        f"not {type(item).__name__}")


def parse_batch(items: Any) -> list[EventRecord]:
    """The records of a ``persist_events`` batch (a list or other iterable of
    items, not one mapping, bytes or str), each event once: listed again with the
    same JSON, the later copy is dropped unless it takes an outlier into the DAG;
    with other JSON, :class:`InvalidEventError`."""
    if isinstance(items, (Mapping, bytes, str)):
        raise InvalidEventError("persist_events takes a list of events")
    records: dict[str, EventRecord] = {}
    for item in items:
        record = parse_event(item)
        seen = records.get(record.event_id)
        if seen is None:
            records[record.event_id] = record
        elif seen.json != record.json:
            raise InvalidEventError(
                f"event {record.event_id} appears twice in the batch with different JSON")
        elif seen.outlier and not record.outlier:
            records[record.event_id] = record
    return list(records.values())
