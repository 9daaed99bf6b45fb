"""A seeded, realistic room workload for the demo (pure: no IO).

:class:`Workload` plays a small homeserver's traffic in valid Matrix rooms (room
version 10 unless told otherwise): each room starts with its create event, the
creator's join, power levels, public join rules and history visibility; then members
join, leave, are invited and sometimes banned (by the creator or a moderator, who
hold the power to), send messages (some replies), change state (topics, names,
power levels), fork (two senders reply to the same events concurrently, sometimes
both changing the topic, and the next event merges them), redact, and change
history visibility. Rooms joined late arrive with their state and newest messages,
and their older messages are backfilled in chunks. Every event carries the
``prev_events``, ``depth`` and ``auth_events`` the authorization rules expect
(:class:`~streamrep.matrix.room_builder.RoomBuilder`), so an event store with the
Matrix room rules rejects and soft-fails none of them. Beside events it produces
account data, read receipts, to-device messages and explicit cache invalidations.

Each call of :meth:`Workload.next_op` returns one :class:`Op`; the same seed gives the
same sequence. Events are plain mappings in the event store's input form (an
``event_id`` key beside the event's own fields).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from streamrep.matrix.room_builder import RoomBuilder
from streamrep.matrix.room_versions import room_version

__all__ = ["Op", "Room", "Workload", "HISTORY_VISIBILITIES", "DEFAULT_ROOM_VERSION"]

HISTORY_VISIBILITIES = ("world_readable", "shared", "invited", "joined")

#: The room version of the demo's rooms unless told otherwise.
DEFAULT_ROOM_VERSION = "10"

#: op kinds -> relative weight in the mix
_MIX: dict[str, int] = {
    "message": 40,
    "fork": 4,
    "join": 6,
    "leave": 3,
    "invite": 3,
    "ban": 1,
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

#: Power levels the rules give without saying (the spec's defaults).
_STATE_DEFAULT = 50
_BAN = 50
_REDACT = 50


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
    builder: RoomBuilder
    members: set[str] = field(default_factory=set)
    invited: set[str] = field(default_factory=set)
    banned: set[str] = field(default_factory=set)
    #: user -> power level, as the room's power levels event says
    levels: dict[str, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    #: older history, newest first, still to be backfilled
    unbackfilled: list[dict[str, Any]] = field(default_factory=list)

    @property
    def extremities(self) -> list[str]:
        """The room's forward extremities."""
        return self.builder.extremities

    def level(self, user: str) -> int:
        """*user*'s power level."""
        return self.levels.get(user, 0)


class Workload:
    """The generator; see the module docstring."""

    def __init__(self, seed: int, rooms: int, users: int | None = None,
                 server_name: str = "demo.example", prefix: str = "",
                 events: bool = True, room_version_id: str = DEFAULT_ROOM_VERSION) -> None:
        if rooms < 1:
            raise ValueError("rooms must be at least 1")
        version = room_version(room_version_id)
        if version.event_ids_have_domain or version.room_id_from_create_event:
            raise ValueError(f"the demo builds rooms of versions 3 to 11, not "
                             f"{room_version_id!r}")
        self.room_version = room_version_id
        self.rng = random.Random(seed)
        self.server_name = server_name
        #: distinguishes the rooms (so the events) of several writers sharing one database
        self.prefix = prefix
        self.users = [f"@user{i}:{server_name}" for i in range(users or max(8, rooms * 4))]
        self.rooms: list[Room] = []
        self._counter = 0
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
               advance: bool = True, **extra: Any) -> dict[str, Any]:
        self._counter += 1  # events built so far (receipts and to-device requests use it)
        return room.builder.event(etype, sender, content, state_key=state_key, prev=prev,
                                  advance=advance, **extra)

    def _create_room(self, index: int, late_join: bool) -> list[Op]:
        creator = self.users[index % len(self.users)]
        # Event IDs are the events' reference hashes (RoomBuilder), so the events
        # pass EventStore(verify_event_ids="strict").
        builder = RoomBuilder(f"!{self.prefix}room{index}:{self.server_name}", creator,
                              self.room_version, first_ts=1_700_000_000_000 + index * 10_000_000)
        self._counter += 1
        room = Room(builder.room_id, creator, builder, levels={creator: 100})
        self.rooms.append(room)
        events = [builder.create]
        for etype, content, state_key in [
            ("m.room.member", {"membership": "join"}, creator),
            ("m.room.power_levels", self._power_content(room), ""),
            ("m.room.join_rules", {"join_rule": "public"}, ""),
            ("m.room.history_visibility", {"history_visibility": "shared"}, ""),
        ]:
            events.append(self._event(room, etype, creator, content, state_key))
        room.members.add(creator)
        if not late_join:
            return [Op("events", "create_room", events)]
        # A room joined late: its older history exists only remotely. Its state
        # arrives first (as a joining server receives it), then its newest messages;
        # the messages before those are backfilled later.
        for joiner in self.rng.sample([u for u in self.users if u != creator],
                                      self.rng.randint(1, 4)):
            events.append(self._event(room, "m.room.member", joiner, {"membership": "join"},
                                      joiner))
            room.members.add(joiner)
        state_tip = events[-1]["event_id"]
        history = []
        for _ in range(self.rng.randint(12, 30)):
            history.append(self._event(room, "m.room.message", self._member(room),
                                       {"msgtype": "m.text", "body": self._text()}))
        room.messages.extend(e["event_id"] for e in history)
        # The newest messages also build on the state's last event, so the state
        # at them is known before their older siblings are backfilled.
        tail_prev = [history[-1]["event_id"], state_tip]
        tail = [self._event(room, "m.room.message", self._member(room),
                            {"msgtype": "m.text", "body": self._text()}, prev=tail_prev)]
        for _ in range(2):
            tail.append(self._event(room, "m.room.message", self._member(room),
                                    {"msgtype": "m.text", "body": self._text()}))
        room.messages.extend(e["event_id"] for e in tail)
        room.unbackfilled = list(reversed(history))
        return [Op("events", "join_remote_room", events + tail)]

    def _power_content(self, room: Room) -> dict[str, Any]:
        return {"users": dict(sorted(room.levels.items())), "events_default": 0,
                "state_default": _STATE_DEFAULT, "ban": _BAN, "kick": _BAN,
                "redact": _REDACT, "invite": 0}

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
        room.messages.append(event["event_id"])
        return Op("events", "message", [event])

    def _op_fork(self, room: Room) -> Op | None:
        if len(room.members) < 2:
            return None
        # Two senders reply to the same events before seeing each other's: siblings.
        # Sometimes two who may both change the topic do so at once: the merge
        # resolves the conflict.
        prev = list(room.extremities)
        setters = sorted(u for u in room.members if room.level(u) >= _STATE_DEFAULT)
        if len(setters) >= 2 and self.rng.random() < 0.3:
            pair = self.rng.sample(setters, 2)
            a, b = (self._event(room, "m.room.topic", u, {"topic": self._text()}, "",
                                prev=prev, advance=False) for u in pair)
        else:
            first, second = self.rng.sample(sorted(room.members), 2)
            a, b = (self._event(room, "m.room.message", u, {"msgtype": "m.text",
                                                             "body": self._text()},
                                prev=prev, advance=False) for u in (first, second))
            room.messages.extend([a["event_id"], b["event_id"]])
        room.builder.merge([a["event_id"], b["event_id"]])
        return Op("events", "fork", [a, b])

    def _op_join(self, room: Room) -> Op | None:
        candidates = sorted(set(self.users) - room.members - room.banned)
        if not candidates:
            return None
        user = next((u for u in sorted(room.invited) if u in candidates), None) \
            or self.rng.choice(candidates)
        event = self._event(room, "m.room.member", user, {"membership": "join"}, user)
        room.members.add(user)
        room.invited.discard(user)
        return Op("events", "join", [event])

    def _op_leave(self, room: Room) -> Op | None:
        leavers = sorted(room.members - {room.creator})
        if not leavers:
            return None
        user = self.rng.choice(leavers)
        event = self._event(room, "m.room.member", user, {"membership": "leave"}, user)
        room.members.discard(user)
        return Op("events", "leave", [event])

    def _op_invite(self, room: Room) -> Op | None:
        candidates = sorted(set(self.users) - room.members - room.invited - room.banned)
        if not candidates:
            return None
        user = self.rng.choice(candidates)
        event = self._event(room, "m.room.member", self._member(room),
                            {"membership": "invite"}, user)
        room.invited.add(user)
        return Op("events", "invite", [event])

    def _op_ban(self, room: Room) -> Op | None:
        # A member who may ban, banning someone of lower power (joined or not).
        banners = sorted(u for u in room.members if room.level(u) >= _BAN)
        if not banners:
            return None
        banner = self.rng.choice(banners)
        targets = sorted(u for u in set(self.users) - room.banned
                         if room.level(u) < room.level(banner))
        if not targets:
            return None
        target = self.rng.choice(targets)
        event = self._event(room, "m.room.member", banner,
                            {"membership": "ban", "reason": "spam"}, target)
        room.members.discard(target)
        room.invited.discard(target)
        room.banned.add(target)
        return Op("events", "ban", [event])

    def _op_state(self, room: Room) -> Op:
        setters = sorted(u for u in room.members if room.level(u) >= _STATE_DEFAULT)
        choices = ["m.room.topic", "m.room.name", "m.room.power_levels"]
        etype = self.rng.choice(choices)
        if etype == "m.room.power_levels":
            # The creator names one member moderator (the previous one steps down).
            moderator = self._member(room)
            room.levels = {room.creator: 100}
            if moderator != room.creator:
                room.levels[moderator] = 50
            event = self._event(room, etype, room.creator, self._power_content(room), "")
        else:
            content: dict[str, Any] = ({"topic": self._text()} if etype == "m.room.topic"
                                       else {"name": self._text()[:30]})
            event = self._event(room, etype, self.rng.choice(setters), content, "")
        return Op("events", "state", [event])

    def _op_visibility(self, room: Room) -> Op:
        event = self._event(room, "m.room.history_visibility", room.creator,
                            {"history_visibility": self.rng.choice(HISTORY_VISIBILITIES)}, "")
        return Op("events", "visibility", [event])

    def _op_redaction(self, room: Room) -> Op | None:
        if not room.messages:
            return None
        target = self.rng.choice(room.messages)
        content: dict[str, Any] = {"reason": "spam"}
        if room.builder.version.updated_redaction_rules:
            content["redacts"] = target  # a content key from version 11 on
        event = self._event(room, "m.room.redaction", room.creator, content, redacts=target)
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
            "event_ids": [room.messages[-1]],
            "data": {"ts": 1_700_000_000_000 + self._counter}})

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
