"""The message history the persist benchmarks write: a room of version 10 with a
creator, power levels and public join rules, then messages, and a new member
joining every 20th event (the room grows as it would)."""

from __future__ import annotations

import itertools
from typing import Any, Iterator

__all__ = ["message_history"]


def message_history(room: str, hash_ids: bool = False) -> Iterator[dict[str, Any]]:
    """The room's events; their IDs count up (``$<room>-<n>``) unless *hash_ids*, the
    IDs room versions 3 on give (their reference hashes, random to a B-tree)."""
    from streamrep.matrix.room_builder import RoomBuilder

    alice = "@a:x"
    builder = RoomBuilder(room, alice, "10") if hash_ids else RoomBuilder(
        room, alice, "10", event_id=lambda n: f"${room}-{n}")
    yield builder.create
    yield builder.event("m.room.member", alice, {"membership": "join"}, state_key=alice)
    yield builder.event("m.room.power_levels", alice, {"users": {alice: 100}}, state_key="")
    yield builder.event("m.room.join_rules", alice, {"join_rule": "public"}, state_key="")
    for n in itertools.count(5):
        if n % 20 == 0:
            user = f"@u{n}:x"
            yield builder.event("m.room.member", user, {"membership": "join"},
                                state_key=user)
        else:
            yield builder.event("m.room.message", alice,
                                {"body": f"message {n}", "msgtype": "m.text"})
