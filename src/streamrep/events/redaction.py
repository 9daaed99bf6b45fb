"""Pruning a redacted event down to the fields that survive redaction."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["prune_event", "prune_event_json"]

_KEPT_TOP_LEVEL = frozenset({
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "auth_events", "origin_server_ts", "origin", "membership",
    "prev_state",
})

_KEPT_CONTENT = {
    "m.room.member": ("membership", "join_authorised_via_users_server"),
    "m.room.create": ("creator", "room_version"),
    "m.room.join_rules": ("join_rule", "allow"),
    "m.room.power_levels": ("ban", "events", "events_default", "kick", "redact",
                            "state_default", "users", "users_default", "invite"),
    "m.room.history_visibility": ("history_visibility",),
    "m.room.aliases": ("aliases",),
}


def prune_event(event: dict[str, Any]) -> dict[str, Any]:
    """The event with every field and content key that redaction removes dropped."""
    pruned = {k: v for k, v in event.items() if k in _KEPT_TOP_LEVEL}
    content = event.get("content")
    kept = _KEPT_CONTENT.get(str(event.get("type")), ())
    pruned["content"] = ({k: v for k, v in content.items() if k in kept}
                         if isinstance(content, dict) else {})
    return pruned


def prune_event_json(raw: bytes) -> bytes:
    """:func:`prune_event` over JSON bytes."""
    return orjson.dumps(prune_event(orjson.loads(raw)))
