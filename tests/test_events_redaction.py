"""Redaction in every room version from 1 to 12, restated from the specification as
data (``KEPT``, ``TOP_LEVEL``), checked through the event store (persist, redact,
``get_event``), against the reference implementation's pruning of the same events,
and through the room rules: an event authorized against a redacted power levels
event sees the pruned powers. SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamrep import EventStore
from streamrep.matrix.room_builder import RoomBuilder
from support.reference import reference_python

VERSIONS = [str(n) for n in range(1, 13)]
ALICE, BOB, CAROL = "@alice:a.org", "@bob:a.org", "@carol:a.org"
ORACLE = Path(__file__).resolve().parent / "support" / "eventformat_oracle.py"

#: Room versions -> the top-level keys redaction keeps (Room Versions, "Redactions"
#: of version 1; version 11 drops origin, membership and prev_state).
TOP_LEVEL_V1 = {"event_id", "type", "room_id", "sender", "state_key", "content", "hashes",
                "signatures", "depth", "prev_events", "prev_state", "auth_events", "origin",
                "origin_server_ts", "membership"}
TOP_LEVEL = {v: TOP_LEVEL_V1 if int(v) < 11 else
             TOP_LEVEL_V1 - {"origin", "membership", "prev_state"} for v in VERSIONS}


def _kept(first: int, last: int, keys: set[str] | str) -> dict[str, set[str] | str]:
    return {str(v): keys for v in range(first, last + 1)}


#: Event type -> room version -> the content keys redaction keeps ("all", or a set;
#: ``third_party_invite.signed`` names the one key kept inside that object).
KEPT: dict[str, dict[str, set[str] | str]] = {
    "m.room.member": {**_kept(1, 8, {"membership"}),
                      **_kept(9, 10, {"membership", "join_authorised_via_users_server"}),
                      **_kept(11, 12, {"membership", "join_authorised_via_users_server",
                                       "third_party_invite.signed"})},
    "m.room.create": {**_kept(1, 10, {"creator"}), **_kept(11, 12, "all")},
    "m.room.join_rules": {**_kept(1, 7, {"join_rule"}), **_kept(8, 12, {"join_rule", "allow"})},
    "m.room.power_levels": {
        **_kept(1, 10, {"ban", "events", "events_default", "kick", "redact", "state_default",
                        "users", "users_default"}),
        **_kept(11, 12, {"ban", "events", "events_default", "invite", "kick", "redact",
                         "state_default", "users", "users_default"})},
    "m.room.history_visibility": _kept(1, 12, {"history_visibility"}),
    "m.room.aliases": {**_kept(1, 5, {"aliases"}), **_kept(6, 12, set())},
    "m.room.redaction": {**_kept(1, 10, set()), **_kept(11, 12, {"redacts"})},
}


def expected_content(etype: str, version_id: str, content: dict[str, Any]) -> dict[str, Any]:
    kept = KEPT[etype][version_id]
    if kept == "all":
        return dict(content)
    out = {k: v for k, v in content.items() if k in kept}
    if "third_party_invite.signed" in kept and isinstance(content.get("third_party_invite"),
                                                          dict):
        out["third_party_invite"] = {k: v for k, v in content["third_party_invite"].items()
                                     if k == "signed"}
    return out


EXTRA_TOP_LEVEL = {"origin": "a.org", "membership": "join", "prev_state": [],
                   "unsigned": {"age": 5}, "custom": 1}


def _room(version_id: str) -> tuple[RoomBuilder, list[dict[str, Any]]]:
    r = RoomBuilder("!redact:a.org", ALICE, version_id)
    users = {BOB: 50} if r.version.creator_power else {ALICE: 100, BOB: 50}
    events = [r.create,
              r.event("m.room.member", ALICE, {"membership": "join"}, state_key=ALICE),
              r.event("m.room.power_levels", ALICE, {"users": users, "invite": 100},
                      state_key=""),
              r.event("m.room.join_rules", ALICE, {"join_rule": "public"}, state_key=""),
              r.event("m.room.member", BOB, {"membership": "join"}, state_key=BOB)]
    return r, events


def _targets(r: RoomBuilder) -> dict[str, dict[str, Any]]:
    """One event of each type whose content redaction keeps keys of, with those keys
    and others, and the top-level keys some versions keep."""
    users = {BOB: 50} if r.version.creator_power else {ALICE: 100, BOB: 50}
    return {
        "m.room.member": r.event("m.room.member", BOB, {
            "membership": "join", "displayname": "Bob", "join_authorised_via_users_server": ALICE,
            "third_party_invite": {"signed": {"token": "t"}, "display_name": "b"}},
            state_key=BOB, **EXTRA_TOP_LEVEL),
        "m.room.join_rules": r.event("m.room.join_rules", ALICE, {
            "join_rule": "public", "allow": [{"type": "m.room_membership"}], "x": 1},
            state_key="", **EXTRA_TOP_LEVEL),
        "m.room.power_levels": r.event("m.room.power_levels", ALICE, {
            "users": users, "invite": 100, "ban": 50, "kick": 50, "redact": 50,
            "events": {}, "events_default": 0, "state_default": 50, "users_default": 0,
            "notifications": {"room": 50}}, state_key="", **EXTRA_TOP_LEVEL),
        "m.room.history_visibility": r.event("m.room.history_visibility", ALICE, {
            "history_visibility": "joined", "x": 1}, state_key="", **EXTRA_TOP_LEVEL),
        "m.room.aliases": r.event("m.room.aliases", ALICE, {"aliases": ["#a:a.org"], "x": 1},
                                  state_key="a.org", **EXTRA_TOP_LEVEL),
        "m.room.redaction": r.event("m.room.redaction", ALICE, {
            "redacts": "$gone", "reason": "r"} if r.version.updated_redaction_rules
            else {"reason": "r"}, **({} if r.version.updated_redaction_rules
                                     else {"redacts": "$gone"}), **EXTRA_TOP_LEVEL),
    }


def _redaction_of(r: RoomBuilder, target: str) -> dict[str, Any]:
    if r.version.updated_redaction_rules:
        return r.event("m.room.redaction", ALICE, {"redacts": target})
    return r.event("m.room.redaction", ALICE, {}, redacts=target)


def _fields(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "event_id"}


@pytest.mark.parametrize("version_id", VERSIONS)
def test_redacted_events_read_as_each_version_prunes_them(db_url: str, version_id: str) -> None:
    r, events = _room(version_id)
    targets = _targets(r)
    redactions = [_redaction_of(r, t["event_id"]) for t in [r.create, *targets.values()]]
    store = EventStore(db_url, verify_event_ids="strict")
    try:
        assert store.persist_events(events).rejected == {}
        store.persist_events(list(targets.values()))
        assert store.persist_events(redactions).rejected == {}
        pruned: dict[str, dict[str, Any]] = {}
        for etype, event in [("m.room.create", r.create), *targets.items()]:
            stored = store.get_event(event["event_id"])
            assert stored.redacted, etype
            got = stored.as_dict()
            pruned[event["event_id"]] = got
            assert got["content"] == expected_content(etype, version_id, event["content"]), etype
            assert set(got) == set(event) & TOP_LEVEL[version_id] - {"event_id"}, etype
            # The bytes received stay as they were.
            assert json.loads(store.get_event_json(event["event_id"])) == _fields(event)
        _matches_the_reference(version_id, [r.create, *targets.values()], pruned)
    finally:
        store.close()


def _matches_the_reference(version_id: str, events: list[dict[str, Any]],
                           pruned: dict[str, dict[str, Any]]) -> None:
    # Versions 1 and 2 carry their event ID in the event (the store keeps it beside).
    carries_id = version_id in ("1", "2")
    cases = [{"version": version_id, "event": dict(e) if carries_id else _fields(e)}
             for e in events]
    done = subprocess.run([reference_python(), str(ORACLE)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    for event, answer in zip(events, json.loads(done.stdout)):
        reference = {k: v for k, v in answer["pruned"].items()
                     if k not in ("unsigned", "event_id")}
        assert pruned[event["event_id"]] == reference, event["type"]


@pytest.mark.parametrize("version_id", VERSIONS)
def test_the_rules_read_a_redacted_power_levels_event_as_pruned(db_url: str,
                                                                version_id: str) -> None:
    """Power levels that only admins may invite under, then redacted: from version 11
    the redacted event keeps ``invite``, before it the default (0) applies."""
    r, events = _room(version_id)
    store = EventStore(db_url, verify_event_ids="strict")
    try:
        assert store.persist_events(events).rejected == {}
        power = events[2]["event_id"]
        tip = r.extremities[0]
        invite = r.event("m.room.member", BOB, {"membership": "invite"}, state_key=CAROL,
                         advance=False)
        assert invite["event_id"] in store.persist_events([invite]).rejected
        store.persist_events([_redaction_of(r, power)])
        assert store.get_event(power).redacted
        kept = version_id in ("11", "12")
        for reload in (False, True):
            if reload:  # the rules read the room again from the tables
                store.invalidate_current_state(None)
            again = r.event("m.room.member", BOB, {"membership": "invite", "reason": str(reload)},
                            state_key=CAROL, prev=[tip], advance=False)
            rejected = store.persist_events([again]).rejected
            assert (again["event_id"] in rejected) is kept, (version_id, reload)
    finally:
        store.close()
