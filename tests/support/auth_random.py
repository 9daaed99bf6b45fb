"""Random authorization cases: a room state, then one event to check against it.

Each case is an explicit case (tests/data/stateres_scenarios.json format) whose last
event is the one under test; every earlier event is taken as accepted.
"""

from __future__ import annotations

import random
from typing import Any

from streamrep.matrix import auth
from streamrep.matrix.events import parse_event
from streamrep.matrix.room_versions import room_version

MEMBER = "m.room.member"
PL = "m.room.power_levels"
JOIN_RULES = ["public", "invite", "knock", "restricted", "knock_restricted", "private"]
MEMBERSHIPS = ["join", "invite", "leave", "ban", "knock"]


def user(n: int) -> str:
    return f"@u{n}:{'example.org' if n % 3 else 'other.org'}"


def _level(rnd: random.Random, integer_only: bool) -> Any:
    value = rnd.choice([0, 0, 50, 50, 100, 75])
    if not integer_only and rnd.random() < 0.1:
        return str(value)
    if rnd.random() < 0.04:
        return rnd.choice(["50", 50.0, None, "x"])
    return value


def auth_case(version_id: str, seed: int, users: int = 6) -> dict[str, Any]:
    """One random authorization case."""
    rnd = random.Random(seed)
    version = room_version(version_id)
    creator = user(0)
    events: list[dict[str, Any]] = []
    state: dict[tuple[str, str], str] = {}
    count = 0

    def add(etype: str, sk: str | None, sender: str, content: dict[str, Any],
            auth_nodes: list[str] | None = None) -> str:
        nonlocal count
        count += 1
        node = f"E{count}"
        spec: dict[str, Any] = {"id": node, "type": etype, "sender": sender,
                                "content": content, "prev": [events[-1]["id"]] if events else [],
                                "auth": [], "depth": count, "ts": count}
        if sk is not None:
            spec["state_key"] = sk
        if auth_nodes is not None:
            spec["auth"] = auth_nodes
        elif events and not version.room_id_from_create_event:
            spec["auth"] = [events[0]["id"]]
        events.append(spec)
        if sk is not None:
            state[(etype, sk)] = node
        return node

    create_content: dict[str, Any] = {"room_version": version_id}
    if not version.implicit_room_creator or rnd.random() < 0.3:
        create_content["creator"] = creator
    if rnd.random() < 0.1:
        create_content["m.federate"] = False
    if version.creator_power and rnd.random() < 0.3:
        create_content["additional_creators"] = [user(1)]
    add("m.room.create", "", creator, create_content)
    add(MEMBER, creator, creator, {"membership": "join"})
    for n in range(1, users):
        membership = rnd.choice(MEMBERSHIPS + ["join", "join"])
        add(MEMBER, user(n), user(n) if rnd.random() < 0.7 else creator,
            {"membership": membership})
    if rnd.random() < 0.9:
        ints = version.integer_power_levels
        levels = {user(n): _level(rnd, ints) for n in range(users) if rnd.random() < 0.6}
        content: dict[str, Any] = {"users": levels}
        for name in ("ban", "kick", "invite", "redact", "state_default", "events_default",
                     "users_default"):
            if rnd.random() < 0.3:
                content[name] = _level(rnd, ints)
        if rnd.random() < 0.3:
            content["events"] = {"m.room.topic": _level(rnd, ints), PL: _level(rnd, ints)}
        if rnd.random() < 0.2:
            content["notifications"] = {"room": _level(rnd, ints)}
        add(PL, "", creator, content)
    if rnd.random() < 0.9:
        add("m.room.join_rules", "", creator, {"join_rule": rnd.choice(JOIN_RULES)})

    # The event under test.
    sender = user(rnd.randrange(users))
    target = user(rnd.randrange(users))
    kind = rnd.choice(["member"] * 5 + ["pl", "topic", "others_state", "aliases", "redaction",
                                        "create"])
    content = {}
    sk: str | None = ""
    etype = "m.room.topic"
    if kind == "member":
        etype, sk = MEMBER, target
        content = {"membership": rnd.choice(MEMBERSHIPS)}
        if rnd.random() < 0.3:
            content["join_authorised_via_users_server"] = user(rnd.randrange(users))
    elif kind == "pl":
        etype = PL
        ints = version.integer_power_levels
        content = {"users": {user(n): _level(rnd, ints) for n in range(users)
                             if rnd.random() < 0.5}}
        for name in ("ban", "kick", "state_default"):
            if rnd.random() < 0.3:
                content[name] = _level(rnd, ints)
    elif kind == "others_state":
        etype, sk = "m.custom", target
    elif kind == "aliases":
        etype, sk = "m.room.aliases", rnd.choice(["example.org", "other.org", ""])
    elif kind == "redaction":
        etype, sk = "m.room.redaction", None
        content = {}
    elif kind == "create":
        etype, sk = "m.room.create", ""
        content = {"room_version": version_id, "creator": sender}
    room = "!room:example.org"
    fields: dict[str, Any] = {"type": etype, "sender": sender, "content": content}
    if not (kind == "create" and version.room_id_from_create_event):
        fields["room_id"] = room
    if sk is not None:
        fields["state_key"] = sk
    probe = parse_event("$probe", fields, version)
    keys = auth.auth_types_for_event(probe, version)
    cited = sorted(state[k] for k in keys if k in state)
    if version.room_id_from_create_event:
        cited = [c for c in cited if c != "E1"]
    if rnd.random() < 0.05 and len(events) > 2:
        cited.append(events[2]["id"])
    prev = [events[-1]["id"]]
    if kind == "member" and content["membership"] == "join" and rnd.random() < 0.2:
        prev = ["E1"]
    if kind == "create":
        cited, prev = [], []
    spec: dict[str, Any] = {"id": "CHECK", "type": etype, "sender": sender,
                            "content": content, "prev": prev, "auth": sorted(set(cited)),
                            "depth": count + 1, "ts": count + 1}
    if sk is not None:
        spec["state_key"] = sk
    if kind == "redaction":
        redacts = f"$x:{rnd.choice(['example.org', 'other.org'])}"
        if version.updated_redaction_rules:
            spec["content"] = {"redacts": redacts}
        else:
            spec["redacts"] = redacts
    events.append(spec)
    return {"name": f"auth_v{version_id}_{seed}", "room_version": version_id,
            "events": events}
