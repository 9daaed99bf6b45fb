"""Pruning a redacted event down to what its room version's redaction algorithm
keeps (:mod:`streamrep.matrix.eventformat`). A stored event keeps the JSON it was
received with; readers prune it when it is redacted."""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from streamrep.matrix.eventformat import prune_event as _prune
from streamrep.matrix.room_versions import RoomVersion

__all__ = ["prune_event", "prune_event_json"]


def prune_event(event: Mapping[str, Any], version: RoomVersion) -> dict[str, Any]:
    """The event with every field and content key that redaction in a room of
    *version* removes dropped."""
    return _prune(event, version)


def prune_event_json(raw: bytes, version: RoomVersion) -> bytes:
    """:func:`prune_event` over JSON bytes."""
    body = orjson.loads(raw)
    if not isinstance(body, dict):
        return raw
    return orjson.dumps(_prune(body, version))
