"""Scenarios for the event store's DAG mechanics, on SQLite and PostgreSQL (``db_url``).

Extremities, outliers, backfill, pagination, state groups, visibility bookkeeping,
stream rows and bad input, over small hand-drawn DAGs whose events cite no auth
events: every store here is opened with ``room_rules=None`` (DAG data that is not a
Matrix room). The same kinds of scenarios in valid Matrix rooms, through the
default store with the room rules, are in ``test_events_matrix_rooms.py``.
"""

from __future__ import annotations

import orjson
import pytest

from streamrep import EventStore
from streamrep.errors import EventNotFoundError, InvalidEventError, InvalidTokenError
from streamrep.events.streams import (
    EventsStreamFollower,
    current_backfill_token,
    current_events_token,
    get_backfill_stream_rows,
    get_events_stream_rows,
)
from streamrep.events.tokens import StreamToken, TopologicalToken, parse_token

ROOM = "!room:x"
ANN, BOB, CAT = "@ann:x", "@bob:x", "@cat:x"


def ev(event_id, prevs, depth, *, type="m.room.message", room=ROOM, sender=ANN, **extra):
    body = {"event_id": event_id, "room_id": room, "type": type, "sender": sender,
            "depth": depth, "prev_events": list(prevs), "content": {"body": event_id}}
    body.update(extra)
    return body


def member(event_id, prevs, depth, user, membership, room=ROOM, **extra):
    return ev(event_id, prevs, depth, type="m.room.member", state_key=user, room=room,
              sender=user, content={"membership": membership}, **extra)


def create_room(store, room=ROOM):
    prefix = "" if room == ROOM else room
    store.persist_events([
        ev(f"${prefix}create", [], 1, type="m.room.create", state_key="", room=room,
           content={"creator": ANN}),
        member(f"${prefix}ann_join", [f"${prefix}create"], 2, ANN, "join", room=room),
    ])


@pytest.fixture
def store(db_url):
    s = EventStore(db_url, max_delta_hops=4, room_rules=None)
    yield s
    s.close()


def test_fork_and_merge(store):
    create_room(store)
    store.persist_events([ev("$a", ["$ann_join"], 3), ev("$b", ["$ann_join"], 3)])
    assert store.get_forward_extremities(ROOM) == {"$a", "$b"}
    store.persist_events([ev("$m", ["$a", "$b"], 4)])
    assert store.get_forward_extremities(ROOM) == {"$m"}
    assert store.get_backward_extremities(ROOM) == set()
    assert store.get_room_events(ROOM) == ["$create", "$ann_join", "$a", "$b", "$m"]
    assert store.get_room_events(ROOM, order="stream") == [
        "$create", "$ann_join", "$a", "$b", "$m"]
    with pytest.raises(ValueError):
        store.get_room_events(ROOM, order="random")


def test_conflicting_fork_is_resolved_by_the_depth_order_resolver(store):
    create_room(store)
    store.persist_events([
        ev("$t1", ["$ann_join"], 3, type="m.room.topic", state_key="", content={"topic": "1"}),
        ev("$t2", ["$ann_join"], 3, type="m.room.topic", state_key="", content={"topic": "2"}),
    ])
    current = store.get_current_state(ROOM)
    # Same depth: the later stream ordering ($t2) wins.
    assert current[("m.room.topic", "")] == "$t2"
    store.persist_events([ev("$merge", ["$t1", "$t2"], 4)])
    assert store.get_state_after_event("$merge")[("m.room.topic", "")] == "$t2"
    assert store.get_state_after_event("$t1")[("m.room.topic", "")] == "$t1"
    assert dict(store.compute_state_at_extremities(ROOM)) == dict(store.get_current_state(ROOM))


def test_out_of_order_arrival(store):
    create_room(store)
    # The child arrives before its parent: the parent is a backward extremity meanwhile.
    store.persist_events([ev("$c", ["$p"], 4)])
    assert store.get_forward_extremities(ROOM) == {"$ann_join", "$c"}
    assert store.get_backward_extremities(ROOM) == {"$p"}
    store.persist_events([ev("$p", ["$ann_join"], 3)])
    # $p has a stored child, so it never becomes a forward extremity; it does
    # take $ann_join's place.
    assert store.get_forward_extremities(ROOM) == {"$c"}
    assert store.get_backward_extremities(ROOM) == set()


def test_outlier_then_deoutliered(store):
    create_room(store)
    store.persist_events([ev("$o", ["$missing"], 3, outlier=True)])
    assert store.get_event("$o").outlier
    assert "$o" not in store.get_room_events(ROOM)
    assert store.get_forward_extremities(ROOM) == {"$ann_join"}
    assert store.get_backward_extremities(ROOM) == set()
    with pytest.raises(EventNotFoundError):
        store.get_state_after_event("$o")
    before = store.get_event("$o").stream_ordering
    result = store.persist_events([ev("$o", ["$ann_join"], 3)])
    assert result.orderings["$o"] > before
    assert not store.get_event("$o").outlier
    assert store.get_forward_extremities(ROOM) == {"$o"}
    assert store.get_state_after_event("$o")[("m.room.member", ANN)] == "$ann_join"
    # Persisting it again changes nothing.
    assert dict(store.persist_events([ev("$o", ["$ann_join"], 3)]).orderings) == {}


def test_backfill_below_the_oldest_event(store):
    store.persist_events([
        ev("$e10", ["$e9"], 10, type="m.room.create", state_key="", content={"creator": ANN}),
        member("$j11", ["$e10"], 11, ANN, "join")])
    assert store.get_backward_extremities(ROOM) == {"$e9"}
    result = store.persist_events([ev("$e9", ["$e8"], 9), ev("$e8", ["$e7"], 8)],
                                  backfilled=True)
    assert all(o < 0 for o in result.orderings.values())
    assert result.orderings["$e8"] < 0 and result.orderings["$e9"] < 0
    assert store.get_backward_extremities(ROOM) == {"$e7"}
    assert store.get_forward_extremities(ROOM) == {"$j11"}
    assert store.get_room_events(ROOM) == ["$e8", "$e9", "$e10", "$j11"]
    assert store.get_room_events(ROOM, order="stream")[-2:] == ["$e10", "$j11"]
    rows = get_backfill_stream_rows(store.db, 0, current_backfill_token(store.db))
    assert sorted(r[1][0] for r in rows.rows) == ["$e8", "$e9"]
    # Six flat fields: [event_id, room_id, type, state_key, redacts, relates_to].
    assert all(len(row) == 6 and row[1] == ROOM for _, row in rows.rows)
    assert all(token > 0 for token, _ in rows.rows)


def test_rejected_and_soft_failed_events(store):
    create_room(store)
    store.persist_events([
        ev("$rej", ["$ann_join"], 3, type="m.room.topic", state_key="", rejected=True,
           content={"topic": "bad"}),
        ev("$soft", ["$ann_join"], 3, soft_failed=True),
    ])
    # Neither counts: the extremity stays where it was.
    assert store.get_forward_extremities(ROOM) == {"$ann_join"}
    assert ("m.room.topic", "") not in store.get_state_after_event("$rej")
    assert "$rej" in store.get_room_events(ROOM)
    page, _ = store.paginate_back(ROOM, ANN, None, limit=10)
    assert [e.event_id for e in page] == ["$ann_join", "$create"]
    store.persist_events([ev("$next", ["$rej", "$soft", "$ann_join"], 4)])
    assert store.get_forward_extremities(ROOM) == {"$next"}


def test_redaction_prunes_content_but_keeps_the_bytes(store):
    create_room(store)
    raw = b'{"room_id": "!room:x", "type": "m.room.message", "sender": "@ann:x",' \
          b' "depth": 3, "prev_events": ["$ann_join"], "content": {"body": "secret"}}'
    store.persist_events([("$secret", raw)])
    assert store.get_event("$secret").as_dict()["content"] == {"body": "secret"}
    store.persist_events([ev("$red", ["$secret"], 4, type="m.room.redaction", redacts="$secret")])
    redacted = store.get_event("$secret")
    assert redacted.redacted and redacted.as_dict()["content"] == {}
    assert store.get_event_json("$secret") == raw  # the exact bytes received
    # A redaction that arrives before its target applies when the target comes.
    store.persist_events([ev("$red2", ["$red"], 5, type="m.room.redaction", redacts="$late")])
    store.persist_events([ev("$late", ["$red"], 5)])
    assert store.get_event("$late").redacted
    # A redaction from another room changes nothing.
    store.persist_events([ev("$foreign", [], 1, room="!other:x", type="m.room.redaction",
                             redacts="$keep")])
    store.persist_events([ev("$keep", ["$late"], 6)])
    assert not store.get_event("$keep").redacted
    store.persist_events([ev("$foreign2", ["$foreign"], 2, room="!other:x",
                             type="m.room.redaction", redacts="$keep")])
    assert not store.get_event("$keep").redacted


def test_visibility_changes_mid_room(store):
    create_room(store)
    store.persist_events([
        ev("$hv1", ["$ann_join"], 3, type="m.room.history_visibility", state_key="",
           content={"history_visibility": "joined"}),
        ev("$before_bob", ["$hv1"], 4),
        member("$bob_join", ["$before_bob"], 5, BOB, "join"),
        ev("$after_bob", ["$bob_join"], 6),
        ev("$hv2", ["$after_bob"], 7, type="m.room.history_visibility", state_key="",
           content={"history_visibility": "world_readable"}),
        ev("$public", ["$hv2"], 8),
    ])
    bob_view = [e.event_id for e in store.paginate_back(ROOM, BOB, None, limit=50)[0]]
    assert "$before_bob" not in bob_view
    # The events before $hv1 were under the default "shared" setting (and $hv1 itself
    # takes the more permissive of old and new): Bob, now joined, sees them.
    assert bob_view == ["$public", "$hv2", "$after_bob", "$bob_join", "$hv1", "$ann_join",
                        "$create"]
    # Cat never joined: only the world-readable part.
    cat_view = [e.event_id for e in store.paginate_back(ROOM, CAT, None, limit=50)[0]]
    assert cat_view == ["$public", "$hv2"]
    assert store.get_event("$hv2").history_visibility == "world_readable"
    assert store.get_event("$after_bob").history_visibility == "joined"


def test_shared_history_is_seen_by_who_joined_after_it_even_once_they_left(store):
    create_room(store)
    store.persist_events([ev("$old", ["$ann_join"], 3), member("$bj", ["$old"], 4, BOB, "join")])
    assert [e.event_id for e in store.paginate_back(ROOM, BOB, None, 10)[0]] == [
        "$bj", "$old", "$ann_join", "$create"]
    store.persist_events([member("$bl", ["$bj"], 5, BOB, "leave"), ev("$later", ["$bl"], 6)])
    # Left: he joined after the shared history, so he still sees it (and his own
    # leave, allowed by the state before it); not what came after he left.
    assert [e.event_id for e in store.paginate_back(ROOM, BOB, None, 10)[0]] == [
        "$bl", "$bj", "$old", "$ann_join", "$create"]


def test_invite_to_a_room_not_joined_reaches_sync(store):
    create_room(store)
    token = store.current_token()
    invite = member("$inv", ["$elsewhere"], 20, CAT, "invite", room="!other:y", outlier=True)
    invite["sender"] = "@dan:y"
    store.persist_events([invite])
    assert store.membership_changes.has_entity_changed(CAT, token.stream)
    sync = store.get_new_events_for_user(CAT, str(token))
    assert [e.event_id for e in sync.membership_changes] == ["$inv"]
    assert sync.events == []
    assert sync.next_token.stream > token.stream
    assert store.get_forward_extremities("!other:y") == set()
    assert [e.event_id for e in store.get_pending_invites(CAT)] == ["$inv"]
    # Rejecting the invite (another out-of-band membership) clears it.
    reject = member("$rej", ["$inv"], 21, CAT, "leave", room="!other:y", outlier=True)
    store.persist_events([reject])
    assert store.get_pending_invites(CAT) == []
    assert [e.event_id for e in store.get_new_events_for_user(CAT, token).membership_changes] \
        == ["$inv", "$rej"]


def test_sync_and_initial_sync(store):
    create_room(store)
    create_room(store, room="!two:x")
    token = store.current_token()
    assert not store.has_room_changed_since(ROOM, token)
    store.persist_events([ev("$n1", ["$ann_join"], 3), ev("$n2", ["$n1"], 4)])
    assert store.has_room_changed_since(ROOM, token)
    assert not store.has_room_changed_since("!two:x", token)
    sync = store.get_new_events_for_user(ANN, token)
    assert [e.event_id for e in sync.events] == ["$n1", "$n2"]
    again = store.get_new_events_for_user(ANN, sync.next_token)
    assert again.events == [] and again.membership_changes == []
    timelines = store.get_initial_sync(ANN, rooms=1, events_per_room=2)
    assert [t.room_id for t in timelines] == [ROOM]
    assert [e.event_id for e in timelines[0].events] == ["$n1", "$n2"]
    page, _ = store.paginate_back(ROOM, ANN, timelines[0].prev_token, limit=10)
    assert [e.event_id for e in page] == ["$ann_join", "$create"]
    assert store.get_user_rooms(ANN) == ["!room:x", "!two:x"]


def test_state_groups_reuse_and_bounded_chains(store):
    create_room(store)
    prev, depth = "$ann_join", 3
    events = []
    for i in range(12):
        events.append(ev(f"$s{i}", [prev], depth, type="m.room.topic", state_key="",
                         content={"topic": str(i)}))
        events.append(ev(f"$m{i}", [f"$s{i}"], depth + 1))
        prev, depth = f"$m{i}", depth + 2
    store.persist_events(events)
    for i in range(12):
        assert store.get_state_group_for_event(f"$m{i}") == \
            store.get_state_group_for_event(f"$s{i}")
    groups = {store.get_state_group_for_event(f"$s{i}") for i in range(12)}
    assert len(groups) == 12
    store.states.clear()
    assert store.get_state_after_event("$m11")[("m.room.topic", "")] == "$s11"
    # max_delta_hops=4: no chain is longer than 4 edges.
    for group in groups:
        assert store.db.run(lambda txn: store.states.load(txn, group))[1] <= 4
    edges = store.db.fetchval("SELECT COUNT(*) FROM state_group_edges")
    snapshots = store.db.fetchval(
        "SELECT COUNT(*) FROM state_groups WHERE id NOT IN"
        " (SELECT state_group FROM state_group_edges)")
    assert snapshots >= 3 and edges >= 8


def test_invalid_events_store_nothing(store):
    create_room(store)
    good = ev("$good", ["$ann_join"], 3)
    cases = [
        {k: v for k, v in ev("$x", [], 3).items() if k != "room_id"},
        ev("$x", [], "3"),
        {**ev("$x", [], 3), "prev_events": "notalist"},
        {**ev("$x", [], 3), "content": [1]},
        {**ev("$x", [], 3), "depth": True},
        {**ev("$x", [], 3), "sender": ""},
        ev("$x", [], 3, type="m.room.redaction"),
        ev("$x", ["$x"], 3),
        ev("$x", [5], 3),
        ev("$x", [], 3, state_key=7),
        ev("$x", [], 3, type="m.room.member", state_key=BOB, content={}),
        ev("$x", [], 3, outlier="yes"),
        ("$x", b"{not json"),
        ("$x", "text, not bytes"),
        ("$x", b"[1, 2]"),
        42,
    ]
    for bad in cases:
        with pytest.raises(InvalidEventError):
            store.persist_events([good, bad])
    with pytest.raises(InvalidEventError):
        store.persist_events(good)
    assert "$good" not in store.get_room_events(ROOM)
    with pytest.raises(EventNotFoundError):
        store.get_event("$good")


def test_tokens():
    assert parse_token("s42") == StreamToken(42)
    assert parse_token("t7-42") == TopologicalToken(7, 42)
    assert parse_token("t7--3") == TopologicalToken(7, -3)
    assert str(TopologicalToken(7, -3)) == "t7--3"
    for bad in ["", "x1", "s", "t1", "t-1-2", "s1.5", "s" + "9" * 30]:
        with pytest.raises(InvalidTokenError):
            parse_token(bad)


def test_pagination_tokens_round_trip(store):
    create_room(store)
    store.persist_events([ev(f"$p{i}", [f"$p{i-1}" if i else "$ann_join"], 3 + i)
                          for i in range(7)])
    seen, token = [], None
    while True:
        page, token = store.paginate_back(ROOM, ANN, str(token) if token else None, limit=2)
        seen += [e.event_id for e in page]
        if token is None:
            break
    assert seen == [f"$p{i}" for i in reversed(range(7))] + ["$ann_join", "$create"]
    with pytest.raises(InvalidTokenError):
        store.paginate_back(ROOM, ANN, "bogus")
    # From a stream token: the events up to that stream position.
    at = store.get_event("$p3").stream_ordering
    page, _ = store.paginate_back(ROOM, ANN, f"s{at}", limit=3)
    assert [e.event_id for e in page] == ["$p3", "$p2", "$p1"]


def test_events_stream_rows_and_worker_follower(db_url, store):
    create_room(store)
    worker = EventStore(db_url, room_rules=None)
    try:
        follower = EventsStreamFollower(worker)
        start = current_events_token(store.db)
        worker_token = worker.current_token().stream
        assert worker.get_current_state(ROOM)[("m.room.member", ANN)] == "$ann_join"
        assert worker.get_forward_extremities(ROOM) == {"$ann_join"}
        store.persist_events([member("$bob", ["$ann_join"], 3, BOB, "join"),
                              ev("$hello", ["$bob"], 4)])
        rows = get_events_stream_rows(store.db, start, current_events_token(store.db))
        kinds = [(row[0], row[1][0] if row[0] == "ev" else row[1][1]) for _, row in rows.rows]
        assert ("ev", "$bob") in kinds and ("ev", "$hello") in kinds
        assert ("state", "m.room.member") in kinds
        ev_row = next(row for _, row in rows.rows if row[0] == "ev" and row[1][0] == "$bob")
        assert ev_row[1] == ["$bob", ROOM, "m.room.member", BOB, None, None, "join", False, False]
        # Before the rows arrive the worker's caches are stale; after, correct.
        assert worker.get_current_state(ROOM).get(("m.room.member", BOB)) is None
        # Sync on the worker only reaches as far as the rows it has applied.
        assert worker.get_new_events_for_user(ANN, f"s{worker_token}").events == []
        reached = follower.catch_up(worker_token, current_events_token(store.db))
        assert reached == current_events_token(store.db)
        assert worker.get_current_state(ROOM)[("m.room.member", BOB)] == "$bob"
        assert worker.get_forward_extremities(ROOM) == {"$hello"}
        assert worker.has_room_changed_since(ROOM, StreamToken(worker_token))
        assert worker.membership_changes.has_entity_changed(BOB, worker_token)
        synced = worker.get_new_events_for_user(ANN, f"s{worker_token}")
        assert [e.event_id for e in synced.events] == ["$bob", "$hello"]
        assert synced.next_token == store.current_token()
        # Limited reads stay complete per position and make progress.
        small = get_events_stream_rows(store.db, start, current_events_token(store.db), limit=1)
        assert small.limited and small.rows and small.upto_token > start
    finally:
        worker.close()


def test_worker_follower_applies_backfill_and_state_all_rows(db_url, store):
    create_room(store)
    worker = EventStore(db_url, room_rules=None)
    try:
        follower = EventsStreamFollower(worker)
        assert worker.get_current_state(ROOM)[("m.room.member", ANN)] == "$ann_join"
        assert worker.get_forward_extremities(ROOM) == {"$ann_join"}
        before = current_backfill_token(store.db)
        store.persist_events([ev("$old", ["$older"], 0)], backfilled=True)
        rows = get_backfill_stream_rows(store.db, before, current_backfill_token(store.db))
        assert [row for _, row in rows.rows] == [
            ["$old", ROOM, "m.room.message", None, None, None]]
        for token, row in rows.rows:
            follower.on_backfill_row(token, row)
        assert worker.get_event("$old").event_id == "$old"
        assert worker.get_forward_extremities(ROOM) == store.get_forward_extremities(ROOM)
        # "state-all": every current-state key of the room may have changed.
        store.persist_events([member("$bob", ["$ann_join"], 3, BOB, "join")])
        assert worker.get_current_state(ROOM).get(("m.room.member", BOB)) is None
        follower.on_events_row(current_events_token(store.db), ["state-all", [ROOM]])
        assert worker.get_current_state(ROOM)[("m.room.member", BOB)] == "$bob"
    finally:
        worker.close()


def test_persist_emits_cache_invalidations(db_url):
    seen = []
    store = EventStore(db_url, room_rules=None, on_persisted=lambda outcome, rows: seen.extend(rows))
    try:
        create_room(store)
        store.persist_events([member("$bob", ["$ann_join"], 3, BOB, "join")])
        assert ("cs_cache_fake", [ROOM, BOB]) in seen
        seen.clear()
        store.persist_events([ev("$msg", ["$bob"], 4)])
        assert seen == []
        store.persist_events([ev("$red", ["$msg"], 5, type="m.room.redaction", redacts="$msg")])
        assert ("get_event", ["$msg"]) in seen
    finally:
        store.close()


def test_exact_bytes_for_mapping_events(store):
    create_room(store)
    body = ev("$m", ["$ann_join"], 3)
    store.persist_events([body])
    stored = orjson.loads(store.get_event_json("$m"))
    assert "event_id" not in stored and stored["content"] == {"body": "$m"}


def test_registry_streams_allocate_and_serve_rows(db_url):
    from streamrep.catalogue import known_streams
    from streamrep.db import Database
    from streamrep.errors import DatabaseConfigError
    from streamrep.streams import Streams

    db = Database.open(db_url)
    with pytest.raises(DatabaseConfigError, match="does not serve the events and backfill"):
        EventStore(db, streams=Streams(db, "master"), room_rules=None)
    streams = Streams(db, "master", definitions=known_streams())
    announced = []
    streams.add_listener(lambda stream, instance, tokens, pos: announced.append((stream, pos)))
    store = EventStore(db, streams=streams, room_rules=None)
    try:
        create_room(store)
        live = store.persist_events([ev("$x", ["$ann_join"], 3)])
        back = store.persist_events([ev("$old", ["$older"], 0)], backfilled=True)
        assert back.orderings["$old"] < 0
        assert ("events", live.max_stream) in announced
        assert ("backfill", -back.orderings["$old"]) in announced
        rows, limited = streams.get_updates_since("events", "master", 0, live.max_stream, 100)
        assert not limited
        assert [r[1][1][0] for r in rows if r[1][0] == "ev"] == ["$create", "$ann_join", "$x"]
        assert any(r[1][0] == "state" for r in rows)
        rows, _ = streams.get_updates_since("backfill", "master", 0,
                                            streams.current_token("backfill"), 100)
        assert [(t, r[0]) for t, r in rows] == [(-back.orderings["$old"], "$old")]
        # This instance writes the caches stream: invalidations went there.
        token = streams.current_token("caches")
        cache_rows, _ = streams.get_updates_since("caches", "master", 0, token, 100)
        assert any(r[1][0] == "cs_cache_fake" and r[1][1][0] == ROOM for r in cache_rows)
        # A second store over the same generators continues the orderings.
        again = EventStore(db, streams=streams, room_rules=None)
        nxt = again.persist_events([ev("$y", ["$x"], 4)])
        assert nxt.orderings["$y"] > live.max_stream
    finally:
        streams.close()
        db.close()


def test_large_batch_over_several_rooms_in_reverse_order(store):
    rooms = ["!a:x", "!b:x", "!c:x"]
    batch = []
    for room in rooms:
        prev = []
        for n in range(400):
            eid = f"${room}{n}"
            if n == 0:
                batch.append(ev(eid, [], 1, room=room, type="m.room.create", state_key="",
                                content={"creator": ANN}))
            elif n % 50 == 0:
                batch.append(ev(eid, prev, n + 1, room=room, type="m.room.topic", state_key="",
                                content={"topic": str(n)}))
            else:
                batch.append(ev(eid, prev, n + 1, room=room))
            prev = [eid]
    batch.reverse()
    result = store.persist_events(batch)
    assert len(result.orderings) == 1200
    for room in rooms:
        assert store.get_forward_extremities(room) == {f"${room}399"}
        assert store.get_backward_extremities(room) == set()
        order = store.get_room_events(room)
        assert order == [f"${room}{n}" for n in range(400)]
        # Within the batch, a parent always got a lower stream ordering than its child.
        assert store.get_room_events(room, order="stream") == order
        assert store.get_current_state(room)[("m.room.topic", "")] == f"${room}350"
        assert store.get_state_after_event(f"${room}120")[("m.room.topic", "")] == f"${room}100"
    with pytest.raises(InvalidEventError):
        store.persist_events([ev("$dup", [], 1), ev("$dup", [], 2)])


def test_large_batch_filling_gaps_below_stored_events(store):
    """A batch larger than one lookup chunk: its events' stored children, stored
    prev_events and backward extremities are all found."""
    a, b = "!a:x", "!b:x"
    store.persist_events([ev("$a0", [], 1, room=a, type="m.room.create", state_key="",
                             content={"creator": ANN})])
    # The room's newest events arrive first: $a599 becomes a backward extremity.
    store.persist_events([ev(f"$a{n}", [f"$a{n - 1}"], n + 1, room=a) for n in range(600, 610)])
    assert store.get_backward_extremities(a) == {"$a599"}
    assert store.get_forward_extremities(a) == {"$a0", "$a609"}
    batch = [ev(f"$a{n}", [f"$a{n - 1}"], n + 1, room=a) for n in range(1, 600)]
    batch.append(ev("$b0", [], 1, room=b, type="m.room.create", state_key="",
                    content={"creator": ANN}))
    batch += [ev(f"$b{n}", [f"$b{n - 1}"], n + 1, room=b) for n in range(1, 500)]
    batch.reverse()
    result = store.persist_events(batch)
    assert len(result.orderings) == 1099
    # $a599 already has a stored child, so it is neither a forward nor a backward
    # extremity; $a0 stopped being a forward extremity.
    assert store.get_forward_extremities(a) == {"$a609"}
    assert store.get_backward_extremities(a) == set()
    assert store.get_room_events(a) == [f"$a{n}" for n in range(610)]
    assert store.get_forward_extremities(b) == {"$b499"}
    assert store.get_backward_extremities(b) == set()
    assert store.get_room_events(b) == [f"$b{n}" for n in range(500)]


def test_unknown_state_group_is_reported(store):
    from streamrep.errors import StateCorruptionError

    create_room(store)
    with pytest.raises(StateCorruptionError):
        store.get_state_group(999_999)
    with pytest.raises(EventNotFoundError):
        store.get_state_after_event("$nope")
    # Edges that loop cannot describe a state.
    store.db.execute("INSERT INTO state_groups (id, room_id, event_id) VALUES (?, ?, ?)",
                     (500, ROOM, "$x"))
    store.db.execute("INSERT INTO state_groups (id, room_id, event_id) VALUES (?, ?, ?)",
                     (501, ROOM, "$y"))
    store.db.execute("INSERT INTO state_group_edges VALUES (?, ?)", (500, 501))
    store.db.execute("INSERT INTO state_group_edges VALUES (?, ?)", (501, 500))
    with pytest.raises(StateCorruptionError):
        store.get_state_group(500)


def test_awkward_text_survives_both_engines(store):
    """IDs and JSON with quotes, backslashes, non-ASCII, an escaped NUL, whitespace
    between tokens and a large depth are stored and read back exactly (PostgreSQL
    takes rows as one JSON value, the event JSON inside it as text)."""
    create_room(store)
    odd_id = '$we\'ird"\\id\u00e9\U0001f600'
    raw = ('{"room_id":"!room:x",\r\n\t"type":"m.room.message","sender":"@ann:x",'
           '"depth":4611686018427387000,"prev_events":["$ann_join"],'
           '"content":{"body":"tab\\t quote\\" back\\\\ nul\\u0000 \u00e9 \U0001f600"}}\n').encode()
    sender_event = ev("$snowman\u2603", [odd_id], 4611686018427387001, sender="@\u00fcber:x")
    store.persist_events([(odd_id, raw), sender_event])
    assert store.get_event_json(odd_id) == raw
    assert store.get_forward_extremities(ROOM) == {"$snowman\u2603"}
    assert store.get_room_events(ROOM)[-2:] == [odd_id, "$snowman\u2603"]
    assert orjson.loads(store.get_event_json("$snowman\u2603"))["sender"] == "@\u00fcber:x"


def test_event_json_goes_as_hex_where_text_is_not_utf8(store):
    """A PostgreSQL database whose encodings are not both UTF-8 gets the event JSON
    as hex rather than as text; the bytes come back the same either way."""
    store.db.text_is_utf8 = False
    create_room(store)
    raw = '{"room_id":"!room:x", "type":"m.room.message","sender":"@ann:x","depth":4,' \
          '"prev_events":["$ann_join"],"content":{"body":"\u00e9\\u0000"}}'.encode()
    store.persist_events([("$hex", raw)])
    assert store.get_event_json("$hex") == raw


def test_current_state_rows_follow_each_batch_across_snapshots(store):
    """One state change a batch, past max_delta_hops (4) so that some groups are
    stored whole: the current state table and its delta rows name each change."""
    create_room(store)
    prev = "$ann_join"
    for n in range(12):
        store.persist_events([ev(f"$topic{n}", [prev], 3 + n, type="m.room.topic",
                                 state_key="", content={"topic": str(n)})])
        prev = f"$topic{n}"
        rows = store.db.run(lambda txn: txn.fetchall(
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            (ROOM,)))
        assert sorted(rows) == [("m.room.create", "", "$create"),
                                ("m.room.member", ANN, "$ann_join"),
                                ("m.room.topic", "", prev)]
    deltas = store.db.run(lambda txn: txn.fetchall(
        "SELECT event_id, prev_event_id FROM current_state_delta_stream"
        " WHERE type = 'm.room.topic' ORDER BY stream_id"))
    assert deltas == [(f"$topic{n}", f"$topic{n - 1}" if n else None) for n in range(12)]
    snapshots = store.db.run(lambda txn: txn.fetchval(
        "SELECT COUNT(*) FROM state_groups g WHERE NOT EXISTS"
        " (SELECT 1 FROM state_group_edges e WHERE e.state_group = g.id)"))
    assert snapshots >= 3  # the create event's, and two made past the hops


@pytest.mark.parametrize("json_lists", [True, False])
def test_batch_lookup_finds_what_is_stored(store, monkeypatch, json_lists):
    """The batch lookup's three probes (stored events and outliers with their bytes,
    stored redactions aimed at the batch, backward extremities among it), with the
    ID lists as JSON parameters (SQLite with ``json_each``) and as ``IN`` lists."""
    import streamrep.events.plan as plan
    from streamrep.events.validation import parse_event

    monkeypatch.setattr(plan, "SQLITE_JSON", json_lists and plan.SQLITE_JSON)
    create_room(store)
    store.persist_events([ev("$o", ["$gone"], 3, outlier=True),
                          ev("$red", ["$ann_join"], 3, type="m.room.redaction", redacts="$t1"),
                          ev("$x", ["$hole"], 4),
                          ev("$y", ["$gap"], 1, room="!other:x"),
                          ev('$q"\u00e9\\', ["$ann_join"], 3)])
    store.persist_events([ev("$red2", [], 1, room="!third:x", type="m.room.redaction",
                             redacts="$t2")])
    assert store.get_backward_extremities(ROOM) == {"$hole"}
    batch = [parse_event(e) for e in (
        ev("$o", ["$gone"], 3), ev("$t1", ["$red"], 4), ev("$t2", ["$x"], 5),
        ev("$hole", ["$ann_join"], 3), ev("$gap", [], 1, room="!other:x"),
        ev("$new", ["$t1", "$unknown"], 6), ev('$q"\u00e9\\', ["$ann_join"], 3))]
    found = store.db.run(lambda txn: plan.BatchLookup.query(txn, batch))
    assert found.stored == {"$o": True, "$red": False, "$x": False, "$ann_join": False,
                            '$q"\u00e9\\': False}
    assert set(found.outlier_json) == {"$o"}
    assert found.redaction_targets == {("$t1", ROOM), ("$t2", "!third:x")}
    assert found.backward == {(ROOM, "$hole"), ("!other:x", "$gap")}


def test_a_workers_reads_leave_the_sqlite_write_lock_free(tmp_path, monkeypatch):
    """A worker's store serving reads (events, state, sync, pagination) on a shared
    SQLite file must not keep the writer out: while each read's transaction is open,
    the writer persists an event with a 200 ms busy timeout."""
    from streamrep.db.transaction import Transaction

    url = f"sqlite:///{tmp_path}/shared.db?busy_timeout_ms=200"
    writer = EventStore(url, room_rules=None)
    create_room(writer)
    writer.persist_events([ev("$m1", ["$ann_join"], 3), ev("$m2", ["$m1"], 4)])
    worker = EventStore(url, room_rules=None)
    since = worker.current_token()
    group = writer.get_state_group_for_event("$m1")
    written: list[str] = []
    locked_out: list[str] = []
    inside = {"read": None}
    real_fetchall = Transaction.fetchall

    def fetchall_then_write(txn, sql, params=()):
        rows = real_fetchall(txn, sql, params)
        if inside["read"] is not None and inside["read"] not in written:
            # The worker's transaction is still open here.
            written.append(inside["read"])
            prev = writer.get_forward_extremities(ROOM)
            try:
                writer.persist_events(
                    [ev(f"$during_{inside['read']}", sorted(prev), 10 + len(written))])
            except Exception as error:  # kept: the worker's retry would hide it
                locked_out.append(f"{inside['read']}: {error}")
        return rows

    monkeypatch.setattr(Transaction, "fetchall", fetchall_then_write)
    reads = {
        "get_event": lambda: worker.get_event("$m1"),
        "get_events": lambda: worker.get_events(["$m2", "$create"]),
        "event_state_group": lambda: worker.get_state_group_for_event("$m2"),
        "state_group": lambda: worker.get_state_group(group),
        "state_at_extremities": lambda: worker.compute_state_at_extremities(ROOM),
        "pending_invites": lambda: worker.get_pending_invites(BOB),
        "sync": lambda: worker.get_new_events_for_user(ANN, since),
        "initial_sync": lambda: worker.get_initial_sync(ANN),
        "paginate": lambda: worker.paginate_back(ROOM, ANN, None, 5),
    }
    for name, read in reads.items():
        inside["read"] = name
        read()
        inside["read"] = None
        assert name in written, f"{name} ran no query"
        assert locked_out == []
        assert writer.get_event(f"$during_{name}").event_id == f"$during_{name}"
    worker.close()
    writer.close()
