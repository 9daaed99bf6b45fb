"""Real-shaped events of every room version, as a homeserver sends them: every event
type whose content redaction keeps keys of, with the keys it keeps and others,
messages of 3 to 8 KB with formatting and non-ASCII text, the top-level keys some
versions keep (``origin``, ``membership``, ``prev_state``) and ``unsigned``.

Built with :class:`~streamrep.matrix.room_builder.RoomBuilder`, so each carries its
content hash and (versions 3 on) the event ID its reference hash gives."""

from __future__ import annotations

import random
from typing import Any, Iterator

from streamrep.matrix.room_builder import RoomBuilder

ROOM_VERSION_IDS = [str(n) for n in range(1, 13)]
SERVER = "example.org"
ALICE, BOB, CAROL = f"@alice:{SERVER}", f"@bob:{SERVER}", "@carol:other.example"

_WORDS = ("room", "state", "event", "hash", "über", "ñandú", "日本語", "emoji 😀", "line\nbreak",
          'quote "x"', "back\\slash", "tab\there")


def body_text(rng: random.Random, size: int) -> str:
    """About *size* bytes of message text."""
    parts: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        parts.append(word)
        length += len(word.encode()) + 1
    return " ".join(parts)


def _extra_top_level(rng: random.Random) -> dict[str, Any]:
    return {"origin": SERVER, "unsigned": {"age": rng.randrange(1000)}}


def room_events(version_id: str, seed: int = 0, messages: int = 6) -> Iterator[dict[str, Any]]:
    """One room's events (the event store's input form: ``event_id`` beside the
    fields)."""
    rng = random.Random(f"{version_id}-{seed}")
    r = RoomBuilder(f"!real{seed}:{SERVER}", ALICE, version_id,
                    create_content={"m.federate": True, "predecessor": {"room_id": "!old:x"}})
    yield r.create
    yield r.event("m.room.member", ALICE, {"membership": "join", "displayname": "Alice",
                                           "avatar_url": "mxc://x/a"}, state_key=ALICE)
    users = {BOB: 50} if r.version.creator_power else {ALICE: 100, BOB: 50}
    yield r.event("m.room.power_levels", ALICE, {
        "users": users, "users_default": 0, "events": {"m.room.name": 50},
        "events_default": 0, "state_default": 50, "ban": 50, "kick": 50, "redact": 50,
        "invite": 0, "notifications": {"room": 50}, "historical": 100}, state_key="")
    yield r.event("m.room.join_rules", ALICE, {"join_rule": "public",
                                               "allow": [{"type": "m.room_membership",
                                                          "room_id": "!space:x"}]},
                  state_key="")
    yield r.event("m.room.history_visibility", ALICE,
                  {"history_visibility": "shared", "note": "kept only the setting"},
                  state_key="")
    yield r.event("m.room.aliases", ALICE, {"aliases": [f"#real:{SERVER}"]}, state_key=SERVER)
    yield r.event("m.room.topic", ALICE, {"topic": body_text(rng, 200)}, state_key="")
    yield r.event("m.room.member", BOB, {
        "membership": "join", "displayname": "Bob", "reason": "hello",
        "join_authorised_via_users_server": ALICE}, state_key=BOB,
        **_extra_top_level(rng), membership="join", prev_state=[])
    yield r.event("m.room.member", ALICE, {
        "membership": "invite", "displayname": "Carol",
        "third_party_invite": {"display_name": "carol@x", "signed": {
            "mxid": CAROL, "token": "abc", "signatures": {"id.x": {"ed25519:0": "sig"}}}}},
        state_key=CAROL)
    for n in range(messages):
        body = body_text(rng, rng.randrange(3000, 8000))
        yield r.event("m.room.message", rng.choice([ALICE, BOB]), {
            "msgtype": "m.text", "body": body, "format": "org.matrix.custom.html",
            "formatted_body": f"<p>{body[:500]}</p>",
            "m.relates_to": {"m.in_reply_to": {"event_id": r.create["event_id"]}}},
            **_extra_top_level(rng))
    target = r.extremities[0]
    if r.version.updated_redaction_rules:
        yield r.event("m.room.redaction", ALICE, {"redacts": target, "reason": "spam"})
    else:
        yield r.event("m.room.redaction", ALICE, {"reason": "spam"}, redacts=target)
    yield r.event("m.room.member", ALICE, {"membership": "ban", "reason": "spam"},
                  state_key=BOB)
