"""Random forked rooms for property tests, the reference cross-check and benchmarks.

:func:`forked_room` returns an explicit case in the format of
tests/data/stateres_scenarios.json: a room built on one linear base, then several
forks of random power levels changes, bans, kicks, join rule changes, leaves, joins
and topics by random members. Each event cites the auth events its fork's state
selects; events the authorization rules reject are marked ``rejected`` and (like a
lying server would) sometimes kept in their fork's state anyway.
"""

from __future__ import annotations

import random
from typing import Any

from streamrep.matrix import auth
from streamrep.matrix.errors import AuthRejection
from streamrep.matrix.events import MatrixEvent, parse_event
from streamrep.matrix.room_versions import room_version

Key = tuple[str, str]
MEMBER = "m.room.member"
PL = "m.room.power_levels"
JR = "m.room.join_rules"


def user(n: int) -> str:
    return f"@u{n}:example.org"


class _Builder:
    def __init__(self, version_id: str, seed: int) -> None:
        self.version_id = version_id
        self.version = room_version(version_id)
        self.rnd = random.Random(seed)
        self.events: list[dict[str, Any]] = []
        self.parsed: dict[str, MatrixEvent] = {}
        self.by_id: dict[str, MatrixEvent] = {}
        self.rejected: set[str] = set()
        self.rejected_ids: set[str] = set()
        self.room = "!room:example.org"
        self.ts = 0

    def event_id(self, node: str) -> str:
        return f"${node}:example.org" if self.version.event_ids_have_domain else f"${node}"

    def add(self, node: str, etype: str, state_key: str | None, sender: str,
            content: dict[str, Any], state: dict[Key, str], prev: list[str],
            depth: int) -> bool:
        """Create an event citing *state*; return True when it passes auth."""
        # Equal timestamps exercise the event ID tie-break; the reference derives
        # version 3+ IDs from hashes, so there the order of IDs would differ.
        self.ts += self.rnd.randint(0 if self.version.event_ids_have_domain else 1, 3)
        spec: dict[str, Any] = {"id": node, "type": etype, "sender": sender,
                                "content": content, "prev": prev, "depth": depth,
                                "ts": self.ts}
        if state_key is not None:
            spec["state_key"] = state_key
        is_create = etype == "m.room.create"
        fields: dict[str, Any] = {"type": etype, "sender": sender, "content": content,
                                  "depth": depth, "origin_server_ts": self.ts,
                                  "prev_events": [self.event_id(p) for p in prev]}
        if state_key is not None:
            fields["state_key"] = state_key
        if not (is_create and self.version.room_id_from_create_event):
            fields["room_id"] = self.room
        probe = parse_event(self.event_id(node), dict(fields, auth_events=[]), self.version)
        keys = auth.auth_types_for_event(probe, self.version)
        cited = sorted(state[k] for k in keys if k in state)
        if self.version.room_id_from_create_event:
            cited = [c for c in cited if c != "CREATE"]
        spec["auth"] = cited
        fields["auth_events"] = [self.event_id(c) for c in cited]
        event = parse_event(self.event_id(node), fields, self.version)
        if is_create:
            self.room = event.room_id
        ok = True
        try:
            auth.authorize(event, self.version, self.by_id, self.rejected_ids)
        except AuthRejection:
            ok = False
            spec["rejected"] = "auth"
            self.rejected.add(node)
            self.rejected_ids.add(event.event_id)
        self.parsed[node] = event
        self.by_id[event.event_id] = event
        self.events.append(spec)
        return ok


#: Users 1..MODERATORS may hold power levels and send power events.
MODERATORS = 16


def forked_room(version_id: str, seed: int, members: int = 8, forks: int = 2,
                per_fork: int = 6, staff_levels: tuple[int, ...] = (100, 50, 50, 0),
                topic_level: int | None = None, keep_rejected: float = 0.2
                ) -> dict[str, Any]:
    """A random forked room as an explicit scenario case (see the module doc).

    Power levels, join rules, kicks and bans come from the first few users (most of
    them moderators); joins, leaves and topics from anyone.
    """
    b = _Builder(version_id, seed)
    rnd = b.rnd
    creator = user(0)
    state: dict[Key, str] = {}
    depth = 1
    create_content: dict[str, Any] = {"room_version": version_id}
    if not b.version.implicit_room_creator:
        create_content["creator"] = creator
    if b.version.creator_power and rnd.random() < 0.3:
        create_content["additional_creators"] = [user(1)]
    creators = {creator} | set(create_content.get("additional_creators", []))

    def put(node: str, etype: str, sk: str | None, sender: str, content: dict[str, Any],
            st: dict[Key, str], prev: list[str], d: int, keep_rejected: bool = False) -> None:
        ok = b.add(node, etype, sk, sender, content, st, prev, d)
        if sk is not None and (ok or keep_rejected):
            st[(etype, sk)] = node

    put("CREATE", "m.room.create", "", creator, create_content, state, [], depth)
    last = "CREATE"
    put("J0", MEMBER, creator, creator, {"membership": "join"}, state, [last], depth + 1)
    last, depth = "J0", depth + 2
    staff = min(members, MODERATORS + 1)
    levels = {user(n): rnd.choice(staff_levels) for n in range(1, staff)}
    levels[user(1)] = 100
    users = {u: lv for u, lv in levels.items() if lv and u not in (
        creators if b.version.creator_power else set())}
    if not b.version.creator_power:
        users[creator] = 100
    extra: dict[str, Any] = {}
    if topic_level is not None:
        extra["events"] = {"m.room.topic": topic_level}
    put("PL0", PL, "", creator, {"users": users, "ban": 50, "kick": 50, **extra}, state,
        [last], depth)
    last, depth = "PL0", depth + 1
    put("JR0", JR, "", creator, {"join_rule": "public"}, state, [last], depth)
    last, depth = "JR0", depth + 1
    for n in range(1, members):
        put(f"J{n}", MEMBER, user(n), user(n), {"membership": "join"}, state, [last], depth)
        last, depth = f"J{n}", depth + 1
    base_state, base_last, base_depth = dict(state), last, depth
    state_sets = []
    for f in range(forks):
        st, tip, d = dict(base_state), base_last, base_depth
        for i in range(per_fork):
            node = f"F{f}E{i}"
            kind = rnd.choice(["pl", "ban", "kick", "jr", "leave", "join", "topic", "topic"])
            powerful = kind in ("pl", "ban", "kick", "jr")
            sender = user(rnd.randrange(staff if powerful else members))
            target = user(rnd.randrange(members))
            keep = rnd.random() < keep_rejected
            if kind == "pl":
                new_users = dict(users)
                moved = user(rnd.randrange(1, staff))
                if not (b.version.creator_power and moved in creators):
                    new_users[moved] = rnd.choice([0, 50, 100])
                put(node, PL, "", sender, {"users": new_users, "ban": 50, "kick": 50, **extra},
                    st, [tip], d, keep)
            elif kind in ("ban", "kick"):
                put(node, MEMBER, target, sender,
                    {"membership": "ban" if kind == "ban" else "leave"}, st, [tip], d, keep)
            elif kind == "jr":
                put(node, JR, "", sender, {"join_rule": rnd.choice(["public", "invite"])}, st,
                    [tip], d, keep)
            elif kind == "leave":
                put(node, MEMBER, sender, sender, {"membership": "leave"}, st, [tip], d, keep)
            elif kind == "join":
                put(node, MEMBER, sender, sender, {"membership": "join"}, st, [tip], d, keep)
            else:
                put(node, "m.room.topic", "", sender, {"topic": node}, st, [tip], d, keep)
            tip, d = node, d + 1
        state_sets.append([[t, k, n] for (t, k), n in sorted(st.items())])
    return {"name": f"random_v{version_id}_s{seed}_f{forks}_m{members}_e{per_fork}", "room_version": version_id,
            "events": b.events, "state_sets": state_sets}
