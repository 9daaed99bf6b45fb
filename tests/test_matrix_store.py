"""The event store with Matrix room rules, per room version family, on SQLite and
PostgreSQL (``db_url``): forks merged by the room version's state resolution,
rejected and soft-failed events, auth events and room versions stored."""

from __future__ import annotations

from typing import Any

import pytest

from streamrep import EventStore
from streamrep.events import rules_schema as schema
from streamrep.matrix import auth
from streamrep.matrix.events import parse_event, room_id_for_create_event
from streamrep.matrix.rules import MatrixRoomRules as RoomRules
from streamrep.matrix.room_versions import room_version

ALICE, BOB, CAROL = "@alice:a.org", "@bob:b.org", "@carol:a.org"
FAMILIES = ["1", "5", "10", "12"]


class Room:
    """Builds a room's events client-side, each citing the auth events of the state
    at its prev events (tracked per event here)."""

    def __init__(self, version_id: str) -> None:
        self.version = room_version(version_id)
        self.state_after: dict[str, dict[tuple[str, str], str]] = {}
        self.n = 0
        self.room_id = "!room:a.org"
        content: dict[str, Any] = {"room_version": version_id}
        if not self.version.implicit_room_creator:
            content["creator"] = ALICE
        create_id = self._id("create")
        if self.version.room_id_from_create_event:
            self.room_id = room_id_for_create_event(create_id)
        self.create = self.event("create", [], "m.room.create", "", ALICE, content, create_id)

    def _id(self, name: str) -> str:
        return f"${name}:a.org" if self.version.event_ids_have_domain else f"${name}"

    def event(self, name: str, prevs: list[str], etype: str, state_key: str | None,
              sender: str, content: dict[str, Any], event_id: str | None = None,
              state: dict[tuple[str, str], str] | None = None) -> dict[str, Any]:
        """The event dict for the store; *state* overrides the state it cites."""
        self.n += 1
        event_id = event_id or self._id(name)
        before: dict[tuple[str, str], str] = {}
        for p in prevs:
            before.update(self.state_after[p])
        if state is not None:
            before = state
        body: dict[str, Any] = {"room_id": self.room_id, "type": etype, "sender": sender,
                                "content": content, "depth": self.n, "prev_events": prevs,
                                "origin_server_ts": self.n}
        if state_key is not None:
            body["state_key"] = state_key
        probe = parse_event(event_id, {k: v for k, v in body.items() if
                                       not (etype == "m.room.create" and k == "room_id"
                                            and self.version.room_id_from_create_event)},
                            self.version)
        cited = sorted(before[k] for k in auth.auth_types_for_event(probe, self.version)
                       if k in before)
        if self.version.room_id_from_create_event:
            cited = [c for c in cited if c != self._id("create")]
        body["auth_events"] = ([[c, {}] for c in cited] if self.version.event_ids_have_domain
                               else cited)
        after = dict(before)
        if state_key is not None:
            after[(etype, state_key)] = event_id
        self.state_after[event_id] = after
        return {"event_id": event_id, **body}

    def id(self, name: str) -> str:
        return self._id(name)


def build(version_id: str) -> tuple[Room, list[dict[str, Any]]]:
    """Create, Alice joins, power levels (Bob 50), public join rules, topic, Bob and
    Carol join."""
    r = Room(version_id)
    users = {BOB: 50} if r.version.creator_power else {ALICE: 100, BOB: 50}
    events = [r.create]
    chain = [("alice", "m.room.member", ALICE, ALICE, {"membership": "join"}),
             ("power", "m.room.power_levels", "", ALICE, {"users": users}),
             ("rules", "m.room.join_rules", "", ALICE, {"join_rule": "public"}),
             ("topic0", "m.room.topic", "", ALICE, {"topic": "first"}),
             ("bob", "m.room.member", BOB, BOB, {"membership": "join"}),
             ("carol", "m.room.member", CAROL, CAROL, {"membership": "join"})]
    prev = r.create["event_id"]
    for name, etype, sk, sender, content in chain:
        events.append(r.event(name, [prev], etype, sk, sender, content))
        prev = events[-1]["event_id"]
    return r, events


@pytest.fixture
def store(db_url: str) -> Any:
    s = EventStore(db_url, room_rules=RoomRules())
    yield s
    s.close()


@pytest.mark.parametrize("version_id", FAMILIES)
def test_a_ban_racing_a_topic_resets_the_topic(store: EventStore, version_id: str) -> None:
    r, events = build(version_id)
    result = store.persist_events(events)
    assert result.rejected == {}
    tip = r.id("carol")
    ban = r.event("ban", [tip], "m.room.member", BOB, ALICE, {"membership": "ban"})
    topic = r.event("topic_b", [tip], "m.room.topic", "", BOB, {"topic": "bob's"})
    # The topic arrives first; the ban, sent concurrently, after it (the other
    # order would soft-fail the topic: Bob is banned in the current state by then).
    store.persist_events([topic])
    store.persist_events([ban])
    assert store.get_forward_extremities(r.room_id) == {r.id("ban"), r.id("topic_b")}
    merge = r.event("merge", [r.id("ban"), r.id("topic_b")], "m.room.message", None, ALICE,
                    {"body": "hi"})
    assert store.persist_events([merge]).rejected == {}
    state = store.get_state_after_event(r.id("merge"))
    # Bob is banned on one side, so his topic on the other does not survive.
    assert state[("m.room.member", BOB)] == r.id("ban")
    assert state[("m.room.topic", "")] == r.id("topic0")
    assert store.get_current_state(r.room_id) == state
    assert store.db.fetchval("SELECT room_version FROM rooms WHERE room_id = ?",
                             (r.room_id,)) == version_id


@pytest.mark.parametrize("version_id", FAMILIES)
def test_a_forbidden_ban_is_stored_rejected_with_its_reason(store: EventStore,
                                                            version_id: str) -> None:
    r, events = build(version_id)
    store.persist_events(events)
    bad = r.event("carol_bans", [r.id("carol")], "m.room.member", BOB, CAROL,
                  {"membership": "ban"})
    result = store.persist_events([bad])
    for user in (ALICE, BOB, CAROL):
        seen = store.get_new_events_for_user(user, "s0")
        assert bad["event_id"] not in {e.event_id for e in seen.events}
        assert bad["event_id"] not in {e.event_id for e in seen.membership_changes}
    assert set(result.rejected) == {bad["event_id"]}
    assert result.rejected[bad["event_id"]].startswith("insufficient_power:")
    stored = store.get_event(bad["event_id"])
    assert stored.rejected
    assert store.get_forward_extremities(r.room_id) == {r.id("carol")}
    assert store.get_current_state(r.room_id)[("m.room.member", BOB)] == r.id("bob")
    assert store.db.fetchval("SELECT reason FROM rejections WHERE event_id = ?",
                             (bad["event_id"],)) == "insufficient_power"
    cited = {row[0] for row in store.db.fetchall(
        "SELECT auth_id FROM event_auth WHERE event_id = ?", (bad["event_id"],))}
    assert r.id("power") in cited and r.id("create") in cited


@pytest.mark.parametrize("version_id", FAMILIES)
def test_missing_auth_events_reject_with_their_names(store: EventStore,
                                                     version_id: str) -> None:
    r, events = build(version_id)
    store.persist_events(events)
    orphan = r.event("orphan", [r.id("carol")], "m.room.topic", "", ALICE, {"topic": "?"})
    gone = r.id("never_seen")
    orphan["auth_events"] = orphan["auth_events"] + (
        [[gone, {}]] if r.version.event_ids_have_domain else [gone])
    result = store.persist_events([orphan])
    assert gone in result.rejected[orphan["event_id"]]
    assert result.rejected[orphan["event_id"]].startswith("missing_auth_events")


@pytest.mark.parametrize("version_id", FAMILIES)
def test_an_event_failing_only_the_current_state_is_soft_failed(store: EventStore,
                                                                version_id: str) -> None:
    r, events = build(version_id)
    store.persist_events(events)
    store.persist_events([r.event("ban", [r.id("carol")], "m.room.member", BOB, ALICE,
                                  {"membership": "ban"})])
    # Bob, unaware of the ban, sends from before it: fine by its auth events.
    late = r.event("late", [r.id("carol")], "m.room.message", None, BOB, {"body": "hey"})
    # Received from Bob's server: checked against the current state too.
    result = store.persist_events([late], remote=True)
    assert result.rejected == {}
    stored = store.get_event(late["event_id"])
    assert stored.soft_failed and not stored.rejected
    seen = store.get_new_events_for_user(ALICE, "s0")
    assert late["event_id"] not in {e.event_id for e in seen.events}
    assert store.get_forward_extremities(r.room_id) == {r.id("ban")}


@pytest.mark.parametrize("version_id", FAMILIES)
def test_an_outlier_with_its_auth_chain_is_de_outliered_later(store: EventStore,
                                                              version_id: str) -> None:
    r, events = build(version_id)
    base, rest = events[:4], events[4:]
    store.persist_events(base)
    # Carol's join arrives first as an outlier, with the auth events it cites.
    carol = next(e for e in events if e["event_id"] == r.id("carol"))
    result = store.persist_events([dict(carol, outlier=True)])
    assert result.rejected == {}
    assert store.get_event(carol["event_id"]).outlier
    store.persist_events(rest)
    assert not store.get_event(carol["event_id"]).outlier
    assert store.get_current_state(r.room_id)[("m.room.member", CAROL)] == carol["event_id"]


def test_unknown_room_version_rejects_the_create_event(store: EventStore) -> None:
    create = {"event_id": "$c", "room_id": "!r:a.org", "type": "m.room.create",
              "state_key": "", "sender": ALICE, "depth": 1, "prev_events": [],
              "content": {"room_version": "99", "creator": ALICE}}
    member = {"event_id": "$m", "room_id": "!r:a.org", "type": "m.room.member",
              "state_key": ALICE, "sender": ALICE, "depth": 2, "prev_events": ["$c"],
              "auth_events": ["$c"], "content": {"membership": "join"}}
    result = store.persist_events([create, member])
    assert set(result.rejected) == {"$c", "$m"}
    assert store.get_forward_extremities("!r:a.org") == set()
    assert store.get_current_state("!r:a.org") == {}


def _auth_rows(store: EventStore) -> dict[str, set[str]]:
    rows: dict[str, set[str]] = {}
    for event_id, auth_id in store.db.fetchall("SELECT event_id, auth_id FROM event_auth"):
        rows.setdefault(event_id, set()).add(auth_id)
    return rows


def _expected_auth_rows(r: Room, events: list[dict[str, Any]]) -> dict[str, set[str]]:
    """The rows the reference system stores: each state event's auth event IDs, with
    the create event in version 12."""
    expected = {}
    for e in events:
        if "state_key" not in e:
            continue
        cited = {a[0] if isinstance(a, list) else a for a in e["auth_events"]}
        if r.version.room_id_from_create_event and e is not r.create:
            cited.add(r.id("create"))
        if cited:
            expected[e["event_id"]] = cited
    return expected


def _with_messages(r: Room, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hello = r.event("hello", [events[-1]["event_id"]], "m.room.message", None, BOB,
                    {"body": "hello"})
    return [*events, hello]


@pytest.mark.parametrize("version_id", ["10", "12"])
def test_event_auth_holds_the_state_events_auth_events(store: EventStore,
                                                       version_id: str) -> None:
    r, events = build(version_id)
    events = _with_messages(r, events)
    assert store.persist_events(events).rejected == {}
    assert _auth_rows(store) == _expected_auth_rows(r, events)


@pytest.mark.parametrize("version_id", ["10", "12"])
def test_existing_databases_get_the_tables_filled(db_url: str, version_id: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "_PAGE", 3)  # the state events span several pages
    r, events = build(version_id)
    events = _with_messages(r, events)
    plain = EventStore(db_url, room_rules=None)  # no matrix tables yet
    plain.persist_events(events)
    plain.close()
    ruled = EventStore(db_url, room_rules=RoomRules())
    try:
        assert ruled.db.fetchval("SELECT room_version FROM rooms WHERE room_id = ?",
                                 (r.room_id,)) == version_id
        assert _auth_rows(ruled) == _expected_auth_rows(r, events)
    finally:
        ruled.close()


def test_event_auth_rows_of_an_earlier_release_are_brought_to_the_state_events(
        db_url: str) -> None:
    r, events = build("12")
    events = _with_messages(r, events)
    store = EventStore(db_url, room_rules=RoomRules())
    try:
        store.persist_events(events)
        hello = r.id("hello")
        # As an earlier release left them: rows for every event, and version 12's
        # state events without their create event.
        store.db.execute("DELETE FROM event_auth WHERE auth_id = ?", (r.id("create"),))
        store.db.execute("INSERT INTO event_auth (event_id, auth_id, room_id) VALUES (?, ?, ?)",
                         (hello, r.id("bob"), r.room_id))
        store.db.execute("UPDATE schema_versions SET version = 1 WHERE component = 'matrix'")
    finally:
        store.close()
    again = EventStore(db_url, room_rules=RoomRules())
    try:
        assert _auth_rows(again) == _expected_auth_rows(r, events)
        assert again.db.fetchval(
            "SELECT version FROM schema_versions WHERE component = 'matrix'"
        ) == schema.MIGRATIONS[-1].version
    finally:
        again.close()


def test_sqlite_event_auth_of_an_earlier_release_is_clustered_by_event(sqlite_url: str) -> None:
    r, events = build("10")
    store = EventStore(sqlite_url, room_rules=RoomRules())
    try:
        store.persist_events(events)
        expected = _auth_rows(store)
        # As release 2 of the matrix tables left it: a table and an index on event_id,
        # here with one row twice.
        store.db.run(lambda txn: [txn.execute(sql) for sql in (
            "ALTER TABLE event_auth RENAME TO event_auth_v3",
            "CREATE TABLE event_auth (event_id TEXT NOT NULL, auth_id TEXT NOT NULL,"
            " room_id TEXT NOT NULL)",
            "CREATE INDEX event_auth_id ON event_auth (event_id)",
            "INSERT INTO event_auth SELECT * FROM event_auth_v3",
            "INSERT INTO event_auth SELECT * FROM event_auth_v3 LIMIT 1",
            "DROP TABLE event_auth_v3",
            "UPDATE schema_versions SET version = 2 WHERE component = 'matrix'")])
    finally:
        store.close()
    again = EventStore(sqlite_url, room_rules=RoomRules())
    try:
        assert _auth_rows(again) == expected
        assert again.db.fetchval("SELECT COUNT(*) FROM event_auth") == sum(
            len(ids) for ids in expected.values())
        table_sql = again.db.fetchval(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'event_auth'")
        assert "WITHOUT ROWID" in table_sql
        assert again.db.fetchval("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index'"
                                 " AND tbl_name = 'event_auth' AND sql IS NOT NULL") == 0
        # A new state event's rows go in beside them.
        more = r.event("topic1", [events[-1]["event_id"]], "m.room.topic", "", ALICE,
                       {"topic": "after"})
        assert again.persist_events([more]).rejected == {}
        assert _auth_rows(again)[more["event_id"]] == set(more["auth_events"])
    finally:
        again.close()


def test_a_version_12_create_event_without_room_id_makes_its_room(store: EventStore) -> None:
    r, events = build("12")
    create = {k: v for k, v in events[0].items() if k != "room_id"}
    result = store.persist_events([create, *events[1:]])
    assert result.rejected == {}
    assert r.room_id == "!" + create["event_id"][1:]
    assert store.get_event(create["event_id"]).room_id == r.room_id
    assert b"room_id" not in store.get_event_json(create["event_id"])
    assert store.get_current_state(r.room_id)[("m.room.member", CAROL)] == r.id("carol")


def _store_events(case: dict[str, Any]) -> list[dict[str, Any]]:
    """A random forked room's events as the store takes them."""
    from support.stateres_build import event_id_for

    version = room_version(case["room_version"])
    room = "!room:example.org"
    out = []
    for spec in case["events"]:
        eid = event_id_for(spec["id"], case["room_version"])
        ids = [event_id_for(a, case["room_version"]) for a in spec["auth"]]
        body: dict[str, Any] = {
            "event_id": eid, "type": spec["type"], "sender": spec["sender"],
            "content": spec["content"], "depth": spec["depth"],
            "origin_server_ts": spec["ts"],
            "prev_events": [event_id_for(p, case["room_version"]) for p in spec["prev"]],
            "auth_events": [[a, {}] for a in ids] if version.event_ids_have_domain else ids}
        if "state_key" in spec:
            body["state_key"] = spec["state_key"]
        if spec["type"] == "m.room.create" and version.room_id_from_create_event:
            room = room_id_for_create_event(eid)
        else:
            body["room_id"] = room
        out.append(body)
    return out


@pytest.mark.parametrize("version_id", ["1", "2", "6", "10", "11", "12"])
@pytest.mark.parametrize("seed", range(3))
def test_rejected_events_of_random_rooms_stay_out_of_every_answer(
        tmp_path: Any, version_id: str, seed: int) -> None:
    from support.stateres_build import event_id_for
    from support.stateres_random import forked_room

    case = forked_room(version_id, seed, members=6, forks=3, per_fork=8)
    expected = {event_id_for(s["id"], version_id) for s in case["events"] if s.get("rejected")}
    events = _store_events(case)
    store = EventStore(f"sqlite:///{tmp_path}/r.db", room_rules=RoomRules())
    try:
        rejected: set[str] = set()
        for event in events:  # one at a time, as they would arrive
            rejected |= set(store.persist_events([event]).rejected)
        # The store rejects exactly what the rules reject against the auth events.
        assert rejected == expected
        room = store.get_event(events[0]["event_id"]).room_id
        assert not rejected & store.get_forward_extremities(room)
        assert not rejected & set(store.get_current_state(room).values())
        for event in events:
            if event["event_id"] not in rejected:
                state = store.get_state_after_event(event["event_id"])
                assert not rejected & set(state.values())
        for n in range(6):
            seen = store.get_new_events_for_user(f"@u{n}:example.org", "s0")
            assert not rejected & {e.event_id for e in seen.events}
    finally:
        store.close()


def test_a_retried_batch_is_checked_from_the_flags_it_was_given(tmp_path: Any) -> None:
    from streamrep.events.authorize import authorize_batch
    from streamrep.events.validation import parse_event as record_of

    r, events = build("10")
    rules = RoomRules()
    store = EventStore(f"sqlite:///{tmp_path}/retry.db", room_rules=rules)
    try:
        store.persist_events(events)
        bad = r.event("carol_bans", [r.id("carol")], "m.room.member", BOB, CAROL,
                      {"membership": "ban"})
        records = [record_of(bad)]
        first = store.db.run(lambda txn: authorize_batch(
            txn, rules, records, False, store._current_state).rejected)
        again = store.db.run(lambda txn: authorize_batch(
            txn, rules, records, False, store._current_state).rejected)
        assert first == again
        assert again[bad["event_id"]].reason == "insufficient_power"
        assert not records[0].rejected  # the verdict is a value; the records keep their flags
    finally:
        store.close()


@pytest.mark.parametrize("version_id", FAMILIES)
def test_an_outlier_whose_auth_chain_arrives_later_is_accepted_when_de_outliered(
        store: EventStore, version_id: str) -> None:
    r, events = build(version_id)
    by_id = {e["event_id"]: e for e in events}
    carol = by_id[r.id("carol")]
    # Carol's join arrives first, alone: the auth events it cites are not held yet.
    early = store.persist_events([dict(carol, outlier=True)])
    assert early.rejected[carol["event_id"]].startswith("missing_auth_events")
    # Then the room's history, and Carol's join again as part of the DAG.
    store.persist_events([e for e in events if e is not carol])
    later = store.persist_events([carol])
    assert later.rejected == {}
    stored = store.get_event(carol["event_id"])
    assert not stored.outlier and not stored.rejected
    assert store.get_current_state(r.room_id)[("m.room.member", CAROL)] == carol["event_id"]
    assert store.db.fetchval("SELECT COUNT(*) FROM rejections WHERE event_id = ?",
                             (carol["event_id"],)) == 0
    rows = store.db.fetchall("SELECT auth_id FROM event_auth WHERE event_id = ?",
                             (carol["event_id"],))
    assert len(rows) == len({row[0] for row in rows}) > 0


@pytest.mark.parametrize("version_id", FAMILIES)
def test_verdicts_within_one_batch_follow_each_state_event(store: EventStore,
                                                          version_id: str) -> None:
    """Messages of one batch citing the same auth events get the verdicts each would
    get alone: a ban between two of Bob's soft-fails the later one, and every message
    of a user who is not in the room is rejected with its reason."""
    r, events = build(version_id)
    store.persist_events(events)
    tip = r.id("carol")
    early = [r.event(f"m{n}", [tip], "m.room.message", None, BOB, {"body": str(n)})
             for n in range(2)]
    ban = r.event("ban", [r.id("m1")], "m.room.member", BOB, ALICE, {"membership": "ban"})
    late = r.event("late", [tip], "m.room.message", None, BOB, {"body": "late"})
    assert late["auth_events"] == early[0]["auth_events"]
    outsider = "@dave:d.org"
    no_members = {k: v for k, v in r.state_after[tip].items() if k[0] != "m.room.member"}
    strays = [r.event(f"d{n}", [tip], "m.room.message", None, outsider, {"body": str(n)},
                      state=no_members) for n in range(2)]
    result = store.persist_events([*early, ban, late, *strays], remote=True)
    assert set(result.rejected) == {r.id("d0"), r.id("d1")}
    assert all(reason.startswith("not_in_room") for reason in result.rejected.values())
    assert [store.get_event(e["event_id"]).soft_failed for e in [*early, late]] == [
        False, False, True]
    assert store.get_forward_extremities(r.room_id) == {r.id("m0"), r.id("ban")}


@pytest.mark.parametrize("version_id", FAMILIES)
def test_messages_get_the_verdicts_of_the_json_stored(store: EventStore,
                                                      version_id: str) -> None:
    """A message with a malformed field is rejected with its reason; a mapping's
    tuple of auth events reads as the JSON list it is stored as."""
    r, events = build(version_id)
    store.persist_events(events)
    tip = r.id("carol")

    def message(name: str, **changes: Any) -> dict[str, Any]:
        return {**r.event(name, [tip], "m.room.message", None, BOB, {"body": name}),
                **changes}

    good = message("good")
    as_tuple = message("tuple")
    as_tuple["auth_events"] = tuple(as_tuple["auth_events"])
    malformed = [message("ts", origin_server_ts="soon"), message("sender", sender="@bob"),
                 message("auth", auth_events=[*good["auth_events"], ""])]
    result = store.persist_events([good, as_tuple, *malformed])
    assert set(result.rejected) == {e["event_id"] for e in malformed}
    assert all(reason.startswith("malformed") for reason in result.rejected.values())
    assert not store.get_event(as_tuple["event_id"]).soft_failed


@pytest.mark.parametrize("version_id", FAMILIES)
def test_soft_failures_in_one_batch_follow_the_state_their_messages_read(
        store: EventStore, version_id: str) -> None:
    """Another user's join between two of Bob's messages leaves their verdict as it
    was; new power levels that Bob's level no longer meets soft-fail the next one."""
    r, events = build(version_id)
    store.persist_events(events)
    tip, dave = r.id("carol"), "@dave:d.org"
    users = {BOB: 50} if r.version.creator_power else {ALICE: 100, BOB: 50}
    batch = [
        r.event("m0", [tip], "m.room.message", None, BOB, {"body": "0"}),
        r.event("dave", [r.id("m0")], "m.room.member", dave, dave, {"membership": "join"}),
        r.event("m1", [tip], "m.room.message", None, BOB, {"body": "1"}),
        r.event("power2", [r.id("dave")], "m.room.power_levels", "", ALICE,
                {"users": users, "events_default": 60}),
        r.event("m2", [tip], "m.room.message", None, BOB, {"body": "2"}),
    ]
    assert store.persist_events(batch, remote=True).rejected == {}
    assert [store.get_event(r.id(name)).soft_failed for name in ("m0", "m1", "m2")] == [
        False, False, True]


@pytest.mark.parametrize("version_id", FAMILIES)
def test_verdicts_of_earlier_batches_hold_only_while_the_state_they_read_does(
        store: EventStore, version_id: str) -> None:
    """Bob's messages all cite the same auth events, one batch each: the verdicts the
    first worked out are kept for the next ones until the power levels or Bob's
    membership change, and worked out again after."""
    r, events = build(version_id)
    store.persist_events(events)
    tip = r.id("carol")
    users = {BOB: 50} if r.version.creator_power else {ALICE: 100, BOB: 50}
    prev = tip

    def send(name: str, sender: str = BOB, etype: str = "m.room.message",
             state_key: str | None = None, content: dict[str, Any] | None = None,
             cites: str = tip) -> bool:
        nonlocal prev
        event = r.event(name, [prev], etype, state_key, sender, content or {"body": name},
                        state=r.state_after[cites])
        prev = event["event_id"]
        assert store.persist_events([event], remote=True).rejected == {}
        return bool(store.get_event(event["event_id"]).soft_failed)

    assert [send("m0"), send("m1")] == [False, False]
    send("power2", ALICE, "m.room.power_levels", "", {"users": users, "events_default": 60},
         cites=r.id("carol"))
    assert send("m2") is True
    send("power3", ALICE, "m.room.power_levels", "", {"users": users, "events_default": 0},
         cites=r.id("power2"))
    assert send("m3") is False
    send("kick", ALICE, "m.room.member", BOB, {"membership": "leave"}, cites=r.id("power3"))
    assert send("m4") is True


@pytest.mark.parametrize("together", [True, False], ids=["one-batch", "two-batches"])
def test_a_version_12_message_listing_the_create_event_is_rejected_after_one_that_passed(
        store: EventStore, together: bool) -> None:
    """Listing the create event among auth events is forbidden from version 12; the
    message that does, with otherwise the same auth events, sender and type as one
    that passed, gets its own verdict."""
    r, events = build("12")
    store.persist_events(events)
    tip = r.id("carol")
    fine = r.event("fine", [tip], "m.room.message", None, BOB, {"body": "fine"})
    listing = r.event("listing", [r.id("fine")], "m.room.message", None, BOB, {"body": "x"},
                      state=r.state_after[tip])
    listing["auth_events"] = [r.id("create"), *listing["auth_events"]]
    rejected = {}
    for batch in ([fine, listing],) if together else ([fine], [listing]):
        rejected.update(store.persist_events(batch).rejected)
    assert list(rejected) == [listing["event_id"]]
    assert rejected[listing["event_id"]].startswith("bad_auth_events")


def test_a_state_event_listing_an_auth_event_twice_is_rejected_and_stored(
        store: EventStore) -> None:
    r, events = build("10")
    assert store.persist_events(events).rejected == {}
    topic = r.event("topic1", [events[-1]["event_id"]], "m.room.topic", "", ALICE,
                    {"topic": "twice"})
    topic["auth_events"] = [*topic["auth_events"], topic["auth_events"][0]]
    result = store.persist_events([topic])
    assert result.rejected[topic["event_id"]].startswith("bad_auth_events")
    assert store.get_event(topic["event_id"]).rejected
    # One row per auth event, on both engines (SQLite's table is keyed by the pair).
    assert sorted(store.db.fetchall("SELECT auth_id FROM event_auth WHERE event_id = ?",
                                    (topic["event_id"],))) == sorted(
        (a,) for a in set(topic["auth_events"]))
