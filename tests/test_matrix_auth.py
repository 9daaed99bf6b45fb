"""Room versions and the authorization rules, by hand and against the reference."""

from __future__ import annotations

from typing import Any

import pytest

from streamrep.matrix import auth
from streamrep.matrix.errors import (
    AuthRejection,
    MalformedEventError,
    RejectionReason,
    UnknownRoomVersionError,
)
from streamrep.matrix.events import MatrixEvent, parse_event
from streamrep.matrix.powerlevels import CREATOR_POWER_LEVEL, user_level
from streamrep.matrix.room_versions import ROOM_VERSIONS, StateResAlgorithm, room_version

from support import stateres_build as build
from support.auth_random import auth_case
from support.stateres_reference import run_oracle

ALICE, BOB, CAROL = "@alice:a.org", "@bob:b.org", "@carol:a.org"


class Room:
    """A room built event by event; each event cites the state before it."""

    def __init__(self, version_id: str, creator: str = ALICE, **create: Any) -> None:
        self.version = room_version(version_id)
        self.events: dict[str, MatrixEvent] = {}
        self.state: dict[tuple[str, str], str] = {}
        self.room_id = "!r:a.org"
        self.n = 0
        self.last = ""
        content = {"room_version": version_id, **create}
        if not self.version.implicit_room_creator:
            content.setdefault("creator", creator)
        self.create = self.send("m.room.create", "", creator, content)
        self.send("m.room.member", creator, creator, {"membership": "join"})

    def make(self, etype: str, state_key: str | None, sender: str,
             content: dict[str, Any], **extra: Any) -> MatrixEvent:
        self.n += 1
        event_id = f"$e{self.n}:a.org" if self.version.event_ids_have_domain else f"$e{self.n}"
        fields: dict[str, Any] = {"type": etype, "sender": sender, "content": content,
                                  "depth": self.n, "prev_events": [self.last], **extra}
        if state_key is not None:
            fields["state_key"] = state_key
        is_create = etype == "m.room.create"
        if is_create:
            fields["prev_events"] = []
        if not (is_create and self.version.room_id_from_create_event):
            fields["room_id"] = self.room_id
        probe = parse_event(event_id, dict(fields, auth_events=[]), self.version)
        keys = auth.auth_types_for_event(probe, self.version)
        cited = [self.state[k] for k in sorted(keys) if k in self.state]
        if self.version.room_id_from_create_event:
            cited = [c for c in cited if c != self.create.event_id]
        fields["auth_events"] = cited
        event = parse_event(event_id, fields, self.version)
        if is_create:
            self.room_id = event.room_id
        return event

    def check(self, event: MatrixEvent) -> None:
        auth.authorize(event, self.version, self.events)

    def send(self, etype: str, state_key: str | None, sender: str,
             content: dict[str, Any], **extra: Any) -> MatrixEvent:
        """Create, check (raising on rejection) and apply an event."""
        event = self.make(etype, state_key, sender, content, **extra)
        self.check(event)
        self.events[event.event_id] = event
        self.last = event.event_id
        if state_key is not None:
            self.state[(etype, state_key)] = event.event_id
        return event

    def rejects(self, reason: RejectionReason, etype: str, state_key: str | None,
                sender: str, content: dict[str, Any]) -> None:
        with pytest.raises(AuthRejection) as info:
            self.check(self.make(etype, state_key, sender, content))
        assert info.value.reason is reason, str(info.value)


def join(room: Room, user: str) -> None:
    room.send("m.room.member", user, user, {"membership": "join"})


def public_room(version_id: str, **create: Any) -> Room:
    room = Room(version_id, **create)
    users = {} if room.version.creator_power else {ALICE: 100}
    room.send("m.room.power_levels", "", ALICE, {"users": users})
    room.send("m.room.join_rules", "", ALICE, {"join_rule": "public"})
    return room


def test_every_version_is_known_and_picks_its_algorithm() -> None:
    assert sorted(ROOM_VERSIONS, key=int) == [str(n) for n in range(1, 13)]
    assert room_version("1").state_res is StateResAlgorithm.V1
    assert {room_version(str(n)).state_res for n in range(2, 12)} == {StateResAlgorithm.V2}
    assert room_version("12").state_res is StateResAlgorithm.V2_1
    assert room_version("7").knock and not room_version("6").knock
    assert room_version("8").restricted_join_rule and not room_version("7").restricted_join_rule
    assert room_version("10").integer_power_levels and not room_version("9").integer_power_levels


@pytest.mark.parametrize("bad", ["13", "", 12, None, "org.example.custom"])
def test_unknown_room_versions_are_a_typed_error(bad: object) -> None:
    with pytest.raises(UnknownRoomVersionError, match="unknown room version"):
        room_version(bad)


def test_create_event_with_unknown_version_is_rejected() -> None:
    room = Room("10")
    event = room.make("m.room.create", "", ALICE, {"room_version": "99", "creator": ALICE})
    with pytest.raises(AuthRejection) as info:
        auth.authorize(event, room.version, {})
    assert info.value.reason is RejectionReason.BAD_CREATE_EVENT


@pytest.mark.parametrize("fields, match", [
    ({"type": "m.room.member", "state_key": BOB, "sender": BOB, "content": {}}, "membership"),
    ({"type": "m.room.member", "sender": BOB, "content": {"membership": "join"}}, "state_key"),
    ({"type": "m.room.topic", "sender": "bob", "content": {}}, "sender"),
    ({"type": "m.room.topic", "sender": BOB, "content": []}, "content"),
    ({"type": "m.room.topic", "sender": BOB, "content": {}, "auth_events": "x"}, "auth_events"),
    ({"type": "m.room.topic", "sender": BOB, "content": {}, "depth": "3"}, "depth"),
])
def test_malformed_events_are_a_typed_error(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(MalformedEventError, match=match):
        parse_event("$x", dict({"room_id": "!r:a.org"}, **fields), room_version("10"))


def test_version_12_room_id_comes_from_the_create_event() -> None:
    room = public_room("12")
    assert room.room_id == "!" + room.create.event_id[1:]
    with pytest.raises(MalformedEventError, match="no room_id"):
        parse_event("$c", {"type": "m.room.create", "state_key": "", "sender": ALICE,
                           "room_id": "!r:a.org", "content": {}}, room_version("12"))
    # Listing the create event explicitly is refused.
    event = room.make("m.room.topic", "", ALICE, {})
    listed = parse_event(event.event_id, {
        "type": "m.room.topic", "state_key": "", "sender": ALICE, "room_id": room.room_id,
        "content": {}, "auth_events": [room.create.event_id, *event.auth_events]},
        room.version)
    with pytest.raises(AuthRejection) as info:
        room.check(listed)
    assert info.value.reason is RejectionReason.BAD_AUTH_EVENTS


def test_missing_auth_events_are_named() -> None:
    room = public_room("10")
    event = parse_event("$late", {"type": "m.room.topic", "state_key": "", "sender": ALICE,
                                  "room_id": room.room_id, "content": {},
                                  "auth_events": ["$gone", room.create.event_id]},
                        room.version)
    with pytest.raises(AuthRejection, match=r"\$gone") as info:
        room.check(event)
    assert info.value.reason is RejectionReason.MISSING_AUTH_EVENTS


def test_ban_by_a_non_moderator_is_rejected() -> None:
    room = public_room("10")
    join(room, BOB)
    join(room, CAROL)
    room.rejects(RejectionReason.INSUFFICIENT_POWER, "m.room.member", CAROL, BOB,
                 {"membership": "ban"})
    room.send("m.room.member", BOB, ALICE, {"membership": "ban"})
    room.rejects(RejectionReason.MEMBERSHIP_FORBIDDEN, "m.room.member", BOB, BOB,
                 {"membership": "join"})


def test_invite_only_rooms_need_an_invite() -> None:
    room = public_room("10")
    room.send("m.room.join_rules", "", ALICE, {"join_rule": "invite"})
    room.rejects(RejectionReason.MEMBERSHIP_FORBIDDEN, "m.room.member", BOB, BOB,
                 {"membership": "join"})
    room.send("m.room.member", BOB, ALICE, {"membership": "invite"})
    join(room, BOB)


def test_knocking_exists_from_version_7() -> None:
    for version_id, allowed in (("6", False), ("7", True)):
        room = public_room(version_id)
        room.send("m.room.join_rules", "", ALICE, {"join_rule": "knock"})
        event = room.make("m.room.member", BOB, BOB, {"membership": "knock"})
        if allowed:
            room.check(event)
        else:
            with pytest.raises(AuthRejection):
                room.check(event)


def test_restricted_joins_need_an_authorising_member_with_invite_power() -> None:
    room = public_room("9")
    join(room, CAROL)
    room.send("m.room.join_rules", "", ALICE, {"join_rule": "restricted", "allow": []})
    room.rejects(RejectionReason.MEMBERSHIP_FORBIDDEN, "m.room.member", BOB, BOB,
                 {"membership": "join"})
    room.send("m.room.member", BOB, BOB, {"membership": "join",
                                          "join_authorised_via_users_server": ALICE})
    # Version 7 has no restricted rule: the join is refused whoever vouches.
    old = public_room("7")
    old.send("m.room.join_rules", "", ALICE, {"join_rule": "restricted"})
    old.rejects(RejectionReason.MEMBERSHIP_FORBIDDEN, "m.room.member", BOB, BOB,
                {"membership": "join", "join_authorised_via_users_server": ALICE})


def test_string_power_levels_are_refused_from_version_10() -> None:
    for version_id, ok in (("9", True), ("10", False), ("12", False)):
        room = public_room(version_id)
        users = {} if room.version.creator_power else {ALICE: 100}
        event = room.make("m.room.power_levels", "", ALICE, {"users": users, "ban": "50"})
        if ok:
            room.check(event)
        else:
            with pytest.raises(AuthRejection) as info:
                room.check(event)
            assert info.value.reason is RejectionReason.BAD_POWER_LEVELS


def test_version_12_creators_have_infinite_power() -> None:
    room = public_room("12", additional_creators=[CAROL])
    join(room, BOB)
    join(room, CAROL)
    state = {k: room.events[v] for k, v in room.state.items()}
    assert user_level(ALICE, state, room.version) == CREATOR_POWER_LEVEL
    assert user_level(CAROL, state, room.version) == CREATOR_POWER_LEVEL
    assert user_level(BOB, state, room.version) == 0
    room.rejects(RejectionReason.BAD_POWER_LEVELS, "m.room.power_levels", "", ALICE,
                 {"users": {CAROL: 100}})
    room.send("m.room.power_levels", "", ALICE, {"users": {BOB: 100}})
    # Bob at 100 still cannot ban a creator.
    room.rejects(RejectionReason.INSUFFICIENT_POWER, "m.room.member", CAROL, BOB,
                 {"membership": "ban"})


@pytest.mark.parametrize("users, refused", [
    ({ALICE: 100}, [ALICE]),
    ({CAROL: 100, BOB: 50}, [CAROL]),
    ({CAROL: 100, ALICE: 100}, [ALICE, CAROL]),
    ({BOB: 100}, []),
    ({}, []),
])
def test_creators_named_in_power_levels_users_are_refused(users: dict[str, int],
                                                          refused: list[str]) -> None:
    # The sender of the create event and its additional creators (one listed twice)
    # may not be given a level in version 12.
    room = public_room("12", additional_creators=[CAROL, CAROL])
    event = room.make("m.room.power_levels", "", ALICE, {"users": users})
    if not refused:
        room.check(event)
        return
    with pytest.raises(AuthRejection) as info:
        room.check(event)
    assert info.value.reason is RejectionReason.BAD_POWER_LEVELS
    assert str(refused) in str(info.value)
    # Before version 12 a creator's level is an ordinary entry.
    older = public_room("11")
    older.check(older.make("m.room.power_levels", "", ALICE, {"users": {ALICE: 100, **users}}))


def test_others_state_and_power_above_own_are_refused() -> None:
    room = public_room("11")
    join(room, BOB)
    room.send("m.room.power_levels", "", ALICE, {"users": {ALICE: 100, BOB: 50},
                                                 "state_default": 50})
    room.rejects(RejectionReason.OTHERS_STATE, "m.custom", CAROL, BOB, {})
    room.rejects(RejectionReason.INSUFFICIENT_POWER, "m.room.power_levels", "", BOB,
                 {"users": {ALICE: 100, BOB: 75}, "state_default": 50})
    room.rejects(RejectionReason.INSUFFICIENT_POWER, "m.room.power_levels", "", BOB,
                 {"users": {ALICE: 0, BOB: 50}, "state_default": 50})


def test_auth_checks_agree_with_the_reference() -> None:
    cases = [auth_case(str(v), seed) for v in range(1, 13) for seed in range(40)]
    answers = run_oracle({"auth": cases}, "auth")
    compared = 0
    for case in cases:
        theirs = answers[case["name"]]
        if theirs.startswith("error"):
            continue  # the reference crashes on some malformed levels; nothing to compare
        room_id, source, id_of = build.explicit_source(case)
        events = build.events_by_id(source)
        try:
            auth.authorize(events[id_of["CHECK"]], room_version(case["room_version"]), events)
            mine = "accepted"
        except AuthRejection:
            mine = "rejected"
        assert mine == theirs, case["name"]
        compared += 1
    assert compared > 0.95 * len(cases)


def test_third_party_invites_need_a_valid_signature() -> None:
    import base64

    import orjson
    from nacl.signing import SigningKey

    key = SigningKey.generate()
    public = base64.b64encode(bytes(key.verify_key)).decode().rstrip("=")
    room = public_room("10")
    room.send("m.room.third_party_invite", "tok", ALICE, {"public_key": public,
                                                          "display_name": "b"})
    signed = {"mxid": BOB, "token": "tok"}
    signature = key.sign(orjson.dumps(signed, option=orjson.OPT_SORT_KEYS)).signature
    good = dict(signed, signatures={"id.org": {
        "ed25519:0": base64.b64encode(signature).decode().rstrip("=")}})
    room.send("m.room.member", BOB, ALICE, {"membership": "invite",
                                            "third_party_invite": {"signed": good}})
    forged = dict(good, mxid=CAROL)
    room.rejects(RejectionReason.MEMBERSHIP_FORBIDDEN, "m.room.member", CAROL, ALICE,
                 {"membership": "invite", "third_party_invite": {"signed": forged}})
