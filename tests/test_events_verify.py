"""Event IDs and content hashes verified on persist (``verify_event_ids``): everything
streamrep builds passes ``strict``; tampered copies are rejected with their reason
under ``strict``, stored and counted (logged once per room) under ``warn``, and not
looked at under ``off``. SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from streamrep import EventStore
from streamrep.demo.workload import Workload
from streamrep.errors import InvalidEventError
from streamrep.matrix.eventformat import event_id_for
from streamrep.matrix.room_builder import RoomBuilder
from support.real_events import ROOM_VERSION_IDS, room_events

ALICE, BOB = "@alice:a.org", "@bob:a.org"


@pytest.mark.parametrize("version_id", ROOM_VERSION_IDS)
def test_every_event_room_builder_makes_passes_strict(db_url: str, version_id: str) -> None:
    store = EventStore(db_url, verify_event_ids="strict")
    try:
        events = list(room_events(version_id, messages=2))
        result = store.persist_events(events)
        # The third-party invite cites no m.room.third_party_invite: the room rules,
        # not the hashes, reject it.
        assert all(reason.startswith(("membership_forbidden", "missing_auth_events"))
                   for reason in result.rejected.values()), result.rejected
        assert len(result.rejected) <= 1
        assert store.unverified_events == {}
    finally:
        store.close()


def test_the_demo_workload_passes_strict(sqlite_url: str) -> None:
    workload = Workload(seed=11, rooms=3)
    store = EventStore(sqlite_url, verify_event_ids="strict")
    try:
        persisted = 0
        for _ in range(400):
            op = workload.next_op()
            if op.kind in ("events", "backfill"):
                result = store.persist_events(op.events, backfilled=op.kind == "backfill")
                assert result.rejected == {}, result.rejected
                persisted += len(op.events)
        assert persisted > 200
    finally:
        store.close()


def _room(version_id: str = "10") -> tuple[RoomBuilder, list[dict[str, Any]]]:
    r = RoomBuilder("!verify:a.org", ALICE, version_id)
    return r, [r.create, r.event("m.room.member", ALICE, {"membership": "join"}, state_key=ALICE),
               r.event("m.room.join_rules", ALICE, {"join_rule": "public"}, state_key="")]


def _tampered(r: RoomBuilder) -> dict[str, dict[str, Any]]:
    one = r.event("m.room.message", ALICE, {"body": "one"}, advance=False)
    two = r.event("m.room.message", ALICE, {"body": "two"}, advance=False)
    topic = r.event("m.room.topic", ALICE, {"topic": "t"}, state_key="", advance=False)
    return {
        # The body is not in the reference hash: the ID still matches, the content hash not.
        "content changed": dict(one, event_id=one["event_id"],
                                content={"body": "one, edited"}),
        # A top-level key: both hashes change.
        "key added": dict(two, depth=two["depth"] + 1),
        # Another event's ID.
        "ID swapped": dict(topic, event_id=one["event_id"][:-4] + "AAAA"),
        # Built without one: its ID is the hash of what it has.
        "no content hash": _without_hashes(topic, r),
    }


def _without_hashes(event: dict[str, Any], r: RoomBuilder) -> dict[str, Any]:
    fields = {k: v for k, v in event.items() if k not in ("hashes", "event_id")}
    return {"event_id": event_id_for(fields, r.version), **fields}


EXPECTED_REASON = {"content changed": "bad_content_hash", "key added": "bad_event_id",
                   "ID swapped": "bad_event_id", "no content hash": "bad_content_hash"}


@pytest.mark.parametrize("version_id", ["3", "4", "10", "12"])
def test_tampered_copies_are_rejected_under_strict_with_their_reason(
        db_url: str, version_id: str) -> None:
    r, events = _room(version_id)
    store = EventStore(db_url, verify_event_ids="strict")
    try:
        assert store.persist_events(events).rejected == {}
        for what, event in _tampered(r).items():
            result = store.persist_events([event])
            reason = result.rejected.get(event["event_id"], "")
            assert reason.startswith(EXPECTED_REASON[what] + ": "), (what, result.rejected)
            stored = store.get_event(event["event_id"])
            assert stored.rejected, what
            assert store.db.fetchval("SELECT reason FROM rejections WHERE event_id = ?",
                                     (event["event_id"],)) == EXPECTED_REASON[what]
        assert store.get_forward_extremities(r.room_id) == {events[-1]["event_id"]}
    finally:
        store.close()


def test_warn_stores_them_and_counts_them_logging_once_per_room(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    r, events = _room()
    other, other_events = RoomBuilder("!other:a.org", ALICE, "10"), []
    other_events = [other.create]
    store = EventStore(db_url)  # warn is the default
    try:
        assert store.verify_event_ids == "warn"
        store.persist_events([*events, *other_events])
        tampered = list(_tampered(r).values())
        with caplog.at_level(logging.WARNING, logger="streamrep.events.store"):
            result = store.persist_events(tampered)
            store.persist_events([dict(other.event("m.room.member", ALICE,
                                                   {"membership": "join"}, state_key=ALICE),
                                       content={"membership": "join", "x": 1})])
        assert result.rejected == {}
        assert not any(store.get_event(e["event_id"]).rejected for e in tampered)
        assert store.unverified_events == {r.room_id: len(tampered), other.room_id: 1}
        lines = [m for m in caplog.messages if "does not match its hashes" in m]
        assert len(lines) == 2 and r.room_id in lines[0] and other.room_id in lines[1]
    finally:
        store.close()


def test_off_computes_nothing_and_versions_one_and_two_are_not_checked(db_url: str) -> None:
    r, events = _room()
    store = EventStore(db_url, verify_event_ids="off")
    try:
        store.persist_events([*events, *_tampered(r).values()])
        assert store.unverified_events == {}
    finally:
        store.close()
    strict = EventStore(db_url, verify_event_ids="strict")
    try:
        v1 = RoomBuilder("!old:a.org", ALICE, "1")
        forged = dict(v1.event("m.room.member", ALICE, {"membership": "join"}, state_key=ALICE),
                      event_id="$any:a.org")
        assert strict.persist_events([v1.create, forged]).rejected == {}
    finally:
        strict.close()


def test_verification_needs_no_room_rules(db_url: str) -> None:
    r, events = _room()
    store = EventStore(db_url, room_rules=None, verify_event_ids="strict")
    try:
        store.persist_events(events)
        tampered = _tampered(r)["content changed"]
        result = store.persist_events([tampered])
        assert result.rejected[tampered["event_id"]].startswith("bad_content_hash")
        assert store.get_event(tampered["event_id"]).rejected
    finally:
        store.close()


def test_an_outlier_arriving_again_is_checked_as_first_stored(db_url: str) -> None:
    # Checked right after validation, the copy arriving now matches its hashes;
    # the one written is the outlier first stored, which does not.
    r, events = _room()
    good = r.event("m.room.message", ALICE, {"body": "one"})
    store = EventStore(db_url, verify_event_ids="off")
    try:
        store.persist_events(events)
        store.persist_events([dict(good, content={"body": "one, edited"}, outlier=True)])
        store.verify_event_ids = "strict"
        result = store.persist_events([good])
        assert result.rejected[good["event_id"]].startswith("bad_content_hash: ")
    finally:
        store.close()


def test_an_event_is_checked_under_its_room_s_version_whatever_a_skipped_create_says(
        db_url: str) -> None:
    # A create event already stored is skipped, so it does not name the version
    # the transaction checks under; a copy of it naming version 3 (standard
    # Base64 IDs) must not make this version 10 event fail.
    r, events = _room()
    message = r.event("m.room.message", ALICE, {"body": "one"})
    store = EventStore(db_url, verify_event_ids="strict")
    try:
        assert store.persist_events(events).rejected == {}
        create = dict(events[0], content={**events[0]["content"], "room_version": "3"})
        assert store.persist_events([create, message]).rejected == {}
        assert not store.get_event(message["event_id"]).rejected
    finally:
        store.close()


def test_an_unknown_mode_is_refused(sqlite_url: str) -> None:
    with pytest.raises(InvalidEventError, match="verify_event_ids must be one of"):
        EventStore(sqlite_url, verify_event_ids="sometimes")  # type: ignore[arg-type]


def test_the_configuration_file_has_the_key(tmp_path: Any) -> None:
    from streamrep.catalogue import known_streams
    from streamrep.config import load_config
    from streamrep.errors import ConfigError

    path = tmp_path / "streamrep.yaml"
    path.write_text("server_name: v.example\n")
    assert load_config(path, streams=known_streams()).verify_event_ids == "warn"
    path.write_text("server_name: v.example\nverify_event_ids: strict\n")
    assert load_config(path, streams=known_streams()).verify_event_ids == "strict"
    path.write_text("server_name: v.example\nverify_event_ids: sometimes\n")
    with pytest.raises(ConfigError, match="verify_event_ids.*use one of strict, warn, off"):
        load_config(path, streams=known_streams())
