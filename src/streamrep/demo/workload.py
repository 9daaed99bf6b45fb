"""A seeded, realistic room workload for the demo (pure: no IO).

:class:`Workload` plays a small homeserver's traffic: rooms with members joining,
leaving and being invited, messages (some replies), state changes (topics, names,
power levels), forks where two senders reply to the same events concurrently (and
the next event merges them), redactions, history-visibility changes, and rooms joined
late whose older history is backfilled in chunks. Beside events it produces account
data, read receipts, to-device messages and explicit cache invalidations.

Each call of :meth:`Workload.next_op` returns one :class:`Op`; the same seed gives the
same sequence. Events are plain mappings in the event store's input form (an
``event_id`` key beside the event's own fields).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Op", "Room", "Workload", "HISTORY_VISIBILITIES"]

HISTORY_VISIBILITIES = ("world_readable", "shared", "invited", "joined")

#: op kinds -> relative weight in the mix
_MIX: dict[str, int] = {
    "message": 40,
    "fork": 4,
    "join": 6,
    "leave": 3,
    "invite": 3,
    "state": 4,
    "visibility": 2,
    "redaction": 3,
    "backfill": 3,
    "account_data": 8,
    "receipt": 10,
    "to_device": 8,
    "cache_invalidation": 3,
}


_NON_EVENT_KINDS = ("account_data", "receipt", "to_device", "cache_invalidation")


@dataclass
class Op:
    """One unit of work for the writer.

    ``kind`` is ``"events"`` (``events`` to persist live), ``"backfill"`` (``events``
    older than anything stored, persisted as backfilled), ``"account_data"``,
    ``"receipt"``, ``"to_device"`` or ``"cache_invalidation"`` (details in ``args``).
    ``label`` says what the op models (``"fork"``, ``"join"``, ...).
    """

    kind: str
    label: str
    events: list[dict[str, Any]] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Room:
    """What the workload knows of one room."""

    room_id: str
    creator: str
    members: set[str] = field(default_factory=set)
    invited: set[str] = field(default_factory=set)
    extremities: list[str] = field(default_factory=list)
    depth: int = 0
    messages: list[str] = field(default_factory=list)
    #: older history, newest first, still to be backfilled
    unbackfilled: list[dict[str, Any]] = field(default_factory=list)


class Workload:
    """The generator; see the module docstring."""

    def __init__(self, seed: int, rooms: int, users: int | None = None,
                 server_name: str = "demo.example", prefix: str = "",
                 events: bool = True) -> None:
        if rooms < 1:
            raise ValueError("rooms must be at least 1")
        self.rng = random.Random(seed)
        self.server_name = server_name
        #: distinguishes event IDs of several writers sharing one database
        self.prefix = prefix
        self.users = [f"@user{i}:{server_name}" for i in range(users or max(8, rooms * 4))]
        self.rooms: list[Room] = []
        self._counter = 0
        self._ts = 1_700_000_000_000
        self._pending: list[Op] = []
        #: whether this workload persists events (a second writer shares only the
        #: other multi-writer streams, since events have one writer)
        self.events = events
        kinds = list(_MIX) if events else [k for k in _MIX if k in _NON_EVENT_KINDS]
        self._kinds, self._weights = kinds, [_MIX[k] for k in kinds]
        for i in range(rooms):
            ops = self._create_room(i, late_join=(i % 3 == 2))
            if events:
                self._pending.extend(ops)

    # --- event construction -----------------------------------------------------------

    def _event(self, room: Room, etype: str, sender: str, content: dict[str, Any],
               state_key: str | None = None, prev: list[str] | None = None,
               depth: int | None = None, **extra: Any) -> dict[str, Any]:
        self._counter += 1
        self._ts += self.rng.randint(1, 900)
        prev_events = list(room.extremities if prev is None else prev)
        event: dict[str, Any] = {
            "event_id": f"${self.prefix}e{self._counter}:{self.server_name}",
            "room_id": room.room_id,
            "type": etype,
            "sender": sender,
            "content": content,
            "depth": room.depth + 1 if depth is None else depth,
            "prev_events": prev_events,
            "origin_server_ts": self._ts,
        }
        if state_key is not None:
            event["state_key"] = state_key
        event.update(extra)
        return event

    def _advance(self, room: Room, events: list[dict[str, Any]]) -> None:
        """Make *events* (siblings, all on the current extremities) the new extremities."""
        room.extremities = [e["event_id"] for e in events]
        room.depth = max(int(e["depth"]) for e in events)

    def _create_room(self, index: int, late_join: bool) -> list[Op]:
        creator = self.users[index % len(self.users)]
        room = Room(f"!{self.prefix}room{index}:{self.server_name}", creator)
        self.rooms.append(room)
        chain: list[tuple[str, dict[str, Any], str]] = [
            ("m.room.create", {"creator": creator, "room_version": "10"}, ""),
            ("m.room.member", {"membership": "join"}, creator),
            ("m.room.power_levels", {"users": {creator: 100}, "events_default": 0}, ""),
            ("m.room.join_rules", {"join_rule": "public"}, ""),
            ("m.room.history_visibility", {"history_visibility": "shared"}, ""),
        ]
        events = []
        for etype, content, state_key in chain:
            event = self._event(room, etype, creator, content, state_key)
            self._advance(room, [event])
            events.append(event)
        room.members.add(creator)
        if not late_join:
            return [Op("events", "create_room", events)]
        # A room joined late: some older history exists only remotely. The live
        # timeline starts at the newest few events; the rest is backfilled later.
        for _ in range(self.rng.randint(12, 30)):
            sender = self.rng.choice(sorted(room.members))
            if self.rng.random() < 0.3:
                joiner = self.rng.choice(self.users)
                event = self._event(room, "m.room.member", joiner, {"membership": "join"},
                                    joiner)
                room.members.add(joiner)
            else:
                event = self._event(room, "m.room.message", sender,
                                    {"msgtype": "m.text", "body": self._text()})
                room.messages.append(event["event_id"])
            self._advance(room, [event])
            events.append(event)
        live = events[-3:]
        room.unbackfilled = list(reversed(events[:-3]))
        return [Op("events", "join_remote_room", live)]

    def _text(self) -> str:
        words = ("sync", "state", "fork", "merge", "stream", "token", "hello", "room",
                 "replica", "worker", "writer", "cache", "event", "batch", "lag")
        return " ".join(self.rng.choice(words) for _ in range(self.rng.randint(2, 9)))

    # --- ops -------------------------------------------------------------------------

    def next_op(self) -> Op:
        """The next unit of work."""
        if self._pending:
            return self._pending.pop(0)
        kind = self.rng.choices(self._kinds, self._weights)[0]
        room = self.rng.choice(self.rooms)
        op = getattr(self, f"_op_{kind}")(room)
        assert op is None or isinstance(op, Op)
        if op is not None:
            return op
        return self._op_message(room) if self.events else self._op_account_data(room)

    def _member(self, room: Room) -> str:
        return self.rng.choice(sorted(room.members))

    def _op_message(self, room: Room) -> Op:
        content: dict[str, Any] = {"msgtype": "m.text", "body": self._text()}
        if room.messages and self.rng.random() < 0.2:
            content["m.relates_to"] = {"m.in_reply_to": {
                "event_id": self.rng.choice(room.messages[-20:])}}
        event = self._event(room, "m.room.message", self._member(room), content)
        self._advance(room, [event])
        room.messages.append(event["event_id"])
        return Op("events", "message", [event])

    def _op_fork(self, room: Room) -> Op | None:
        if len(room.members) < 2:
            return None
        # Two senders reply to the same events before seeing each other's: siblings.
        first, second = self.rng.sample(sorted(room.members), 2)
        prev = list(room.extremities)
        a = self._event(room, "m.room.message", first, {"msgtype": "m.text",
                                                         "body": self._text()}, prev=prev)
        b = self._event(room, "m.room.message", second, {"msgtype": "m.text",
                                                          "body": self._text()}, prev=prev)
        self._advance(room, [a, b])
        room.messages.extend([a["event_id"], b["event_id"]])
        return Op("events", "fork", [a, b])

    def _op_join(self, room: Room) -> Op | None:
        candidates = sorted(set(self.users) - room.members)
        if not candidates:
            return None
        user = next((u for u in sorted(room.invited) if u in candidates), None) \
            or self.rng.choice(candidates)
        event = self._event(room, "m.room.member", user, {"membership": "join"}, user)
        self._advance(room, [event])
        room.members.add(user)
        room.invited.discard(user)
        return Op("events", "join", [event])

    def _op_leave(self, room: Room) -> Op | None:
        leavers = sorted(room.members - {room.creator})
        if not leavers:
            return None
        user = self.rng.choice(leavers)
        event = self._event(room, "m.room.member", user, {"membership": "leave"}, user)
        self._advance(room, [event])
        room.members.discard(user)
        return Op("events", "leave", [event])

    def _op_invite(self, room: Room) -> Op | None:
        candidates = sorted(set(self.users) - room.members - room.invited)
        if not candidates:
            return None
        user = self.rng.choice(candidates)
        event = self._event(room, "m.room.member", self._member(room),
                            {"membership": "invite"}, user)
        self._advance(room, [event])
        room.invited.add(user)
        return Op("events", "invite", [event])

    def _op_state(self, room: Room) -> Op:
        choices: list[tuple[str, dict[str, Any]]] = [
            ("m.room.topic", {"topic": self._text()}),
            ("m.room.name", {"name": self._text()[:30]}),
            ("m.room.power_levels", {"users": {room.creator: 100,
                                               self._member(room): 50}}),
        ]
        etype, content = self.rng.choice(choices)
        event = self._event(room, etype, room.creator, content, "")
        self._advance(room, [event])
        return Op("events", "state", [event])

    def _op_visibility(self, room: Room) -> Op:
        event = self._event(room, "m.room.history_visibility", room.creator,
                            {"history_visibility": self.rng.choice(HISTORY_VISIBILITIES)}, "")
        self._advance(room, [event])
        return Op("events", "visibility", [event])

    def _op_redaction(self, room: Room) -> Op | None:
        if not room.messages:
            return None
        target = self.rng.choice(room.messages)
        event = self._event(room, "m.room.redaction", room.creator, {"reason": "spam"},
                            redacts=target)
        self._advance(room, [event])
        room.messages.remove(target)
        return Op("events", "redaction", [event])

    def _op_backfill(self, room: Room) -> Op | None:
        backfillable = [r for r in self.rooms if r.unbackfilled]
        if not backfillable:
            return None
        target = self.rng.choice(backfillable)
        chunk = target.unbackfilled[:self.rng.randint(3, 8)]
        del target.unbackfilled[:len(chunk)]
        return Op("backfill", "backfill", chunk)

    def _op_account_data(self, room: Room) -> Op:
        user = self.rng.choice(self.users)
        data_type = self.rng.choice(["m.push_rules", "m.direct", "im.vector.setting"])
        return Op("account_data", "account_data", args={
            "user_id": user, "room_id": room.room_id if self.rng.random() < 0.4 else None,
            "type": data_type, "content": {"value": self.rng.randint(0, 10_000)}})

    def _op_receipt(self, room: Room) -> Op | None:
        if not room.messages:
            return None
        return Op("receipt", "receipt", args={
            "room_id": room.room_id, "receipt_type": "m.read", "user_id": self._member(room),
            "event_ids": [room.messages[-1]], "data": {"ts": self._ts}})

    def _op_to_device(self, room: Room) -> Op:
        sender, target = self.rng.sample(self.users, 2)
        return Op("to_device", "to_device", args={
            "sender": sender, "user_id": target,
            "device_id": f"DEV{self.rng.randint(1, 3)}",
            "message_type": "m.room_key_request",
            "content": {"request_id": f"r{self._counter}-{self.rng.randint(0, 1 << 30)}"}})

    def _op_cache_invalidation(self, room: Room) -> Op:
        if self.rng.random() < 0.2:
            # Drop a whole cache (keys None), as after a bulk change.
            return Op("cache_invalidation", "cache_invalidation",
                      args={"cache_name": "get_user_by_id", "keys": None})
        return Op("cache_invalidation", "cache_invalidation", args={
            "cache_name": "get_user_by_id", "keys": [self.rng.choice(self.users)]})
