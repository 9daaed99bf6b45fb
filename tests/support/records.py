"""Test records as the store's own class: the compiled passes read an
``EventRecord``'s fields at their slots and any other object's by attribute, so
the agreement tests run both kinds."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace
from typing import Any

from streamrep._pure.eventrecord import EventRecord

_DEFAULTS: dict[str, Any] = {
    "event_id": "$e", "room_id": "!r:x", "type": "m.room.message", "sender": "@a:x",
    "depth": 1, "prev_events": [], "state_key": None, "json": b"{}", "body": {},
    "content": {}, "outlier": False, "rejected": False, "soft_failed": False,
    "membership": None, "redacts": None, "relates_to": None}


def as_event_record(record: SimpleNamespace) -> EventRecord:
    """An ``EventRecord`` with *record*'s attributes, the defaults above for the rest
    (the objects are shared, not copied)."""
    given = vars(record)
    return EventRecord(**{f.name: given.get(f.name, _DEFAULTS[f.name])
                          for f in fields(EventRecord)})
