"""The event store as opened by default (with the Matrix room rules), on SQLite and
PostgreSQL (``db_url``): forks, state, visibility, sync and the worker's view of
valid Matrix rooms built with :class:`RoomBuilder`, and what ``room_rules=None``
changes."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from streamrep import EventStore
from streamrep.events.resolver import DepthOrderResolver
from streamrep.events.streams import EventsStreamFollower, current_events_token
from streamrep.matrix.rules import MatrixStateResolver
from streamrep.matrix.room_builder import RoomBuilder

ANN, BOB, CAT, DAN = "@ann:x.org", "@bob:x.org", "@cat:x.org", "@dan:y.org"
TOPIC = ("m.room.topic", "")


@pytest.fixture
def store(db_url: str) -> Iterator[EventStore]:
    s = EventStore(db_url)
    yield s
    s.close()


def new_room(store: EventStore, room_id: str = "!room:x.org",
             visibility: str | None = None) -> tuple[RoomBuilder, dict[str, str]]:
    """Create, Ann joins, power levels (Bob moderator), public join rules, [history
    visibility]; returns the builder and the events' IDs by name."""
    r = RoomBuilder(room_id, ANN, "10", event_id=lambda n: f"${room_id[1:5]}{n}")
    made = {"create": r.create}
    made["ann"] = r.event("m.room.member", ANN, {"membership": "join"}, state_key=ANN)
    made["power"] = r.event("m.room.power_levels", ANN, {"users": {ANN: 100, BOB: 50}},
                            state_key="")
    made["rules"] = r.event("m.room.join_rules", ANN, {"join_rule": "public"}, state_key="")
    if visibility is not None:
        made["hv"] = r.event("m.room.history_visibility", ANN,
                             {"history_visibility": visibility}, state_key="")
    assert store.persist_events(list(made.values())).rejected == {}
    return r, {k: v["event_id"] for k, v in made.items()}


def message(r: RoomBuilder, sender: str, body: str, **kw: Any) -> dict[str, Any]:
    return r.event("m.room.message", sender, {"msgtype": "m.text", "body": body}, **kw)


def member(r: RoomBuilder, user: str, membership: str, sender: str | None = None,
           **kw: Any) -> dict[str, Any]:
    return r.event("m.room.member", sender or user, {"membership": membership},
                   state_key=user, **kw)


def test_the_default_store_has_the_matrix_rules_and_none_opts_out(db_url: str) -> None:
    ruled = EventStore(db_url)
    plain = EventStore(db_url, room_rules=None)
    try:
        assert ruled.room_rules is not None
        assert isinstance(ruled.resolver, MatrixStateResolver)
        assert plain.room_rules is None and isinstance(plain.resolver, DepthOrderResolver)
        # Another resolver plugs in with the rules on: it replaces only the resolution.
        custom = DepthOrderResolver()
        both = EventStore(db_url, resolver=custom)
        assert both.room_rules is not None and both.resolver is custom
        both.close()
    finally:
        ruled.close()
        plain.close()


def test_a_forbidden_event_is_rejected_by_default_and_stored_plainly_without_rules(
        db_url: str) -> None:
    store = EventStore(db_url)
    r, ids = new_room(store)
    bob = member(r, BOB, "join")
    store.persist_events([bob])
    # Bob (moderator, 50) bans Ann (100): the rules forbid it.
    ban = member(r, ANN, "ban", sender=BOB, advance=False)
    result = store.persist_events([ban])
    assert result.rejected[ban["event_id"]].startswith("insufficient_power")
    assert store.get_event(ban["event_id"]).rejected
    assert store.get_current_state(r.room_id)[("m.room.member", ANN)] == ids["ann"]
    assert store.get_forward_extremities(r.room_id) == {bob["event_id"]}
    store.close()
    # The same events in a store without rules: nothing is checked.
    other = RoomBuilder("!plain:x.org", ANN, "10", event_id=lambda n: f"$p{n}")
    plain = EventStore(db_url, room_rules=None)
    try:
        join = member(other, ANN, "join")
        bad = member(other, ANN, "ban", sender=BOB)
        assert plain.persist_events([other.create, join, bad]).rejected == {}
        assert not plain.get_event(bad["event_id"]).rejected
        assert plain.get_current_state("!plain:x.org")[("m.room.member", ANN)] == \
            bad["event_id"]
    finally:
        plain.close()


def test_fork_and_merge(store: EventStore) -> None:
    r, ids = new_room(store)
    store.persist_events([member(r, BOB, "join")])
    base = list(r.extremities)
    a, b = (message(r, u, "hi", prev=base, advance=False) for u in (ANN, BOB))
    r.merge([a["event_id"], b["event_id"]])
    assert store.persist_events([a, b]).rejected == {}
    assert store.get_forward_extremities(r.room_id) == {a["event_id"], b["event_id"]}
    merge = message(r, ANN, "merged")
    store.persist_events([merge])
    assert store.get_forward_extremities(r.room_id) == {merge["event_id"]}
    assert store.get_backward_extremities(r.room_id) == set()
    assert store.get_room_events(r.room_id)[-3:] in (
        [a["event_id"], b["event_id"], merge["event_id"]],
        [b["event_id"], a["event_id"], merge["event_id"]])


def test_conflicting_topics_are_resolved_by_the_room_version(db_url: str) -> None:
    """Two concurrent topics of the same depth: version 10's resolution orders them by
    mainline, then ``origin_server_ts``, so the later-sent one wins, whichever the
    store received last; ``DepthOrderResolver`` takes the last received."""
    winners = {}
    for name, rules in (("matrix", True), ("depth", False)):
        store = EventStore(db_url) if rules else EventStore(db_url, room_rules=None)
        try:
            r, _ = new_room(store, f"!{name}:x.org")
            store.persist_events([member(r, BOB, "join")])
            base = list(r.extremities)
            early = r.event("m.room.topic", ANN, {"topic": "early"}, state_key="",
                            prev=base, advance=False)
            late = r.event("m.room.topic", BOB, {"topic": "late"}, state_key="",
                           prev=base, advance=False)
            r.merge([early["event_id"], late["event_id"]])
            # The later-sent topic arrives first.
            assert store.persist_events([late]).rejected == {}
            assert store.persist_events([early]).rejected == {}
            merge = message(r, ANN, "after")
            store.persist_events([merge])
            winner = store.get_current_state(r.room_id)[TOPIC]
            assert store.get_state_after_event(merge["event_id"])[TOPIC] == winner
            assert dict(store.compute_state_at_extremities(r.room_id)) == \
                dict(store.get_current_state(r.room_id))
            winners[name] = "late" if winner == late["event_id"] else "early"
        finally:
            store.close()
    assert winners == {"matrix": "late", "depth": "early"}


def test_visibility_changes_mid_room(store: EventStore) -> None:
    r, ids = new_room(store, visibility="joined")
    before_bob = message(r, ANN, "before bob")
    bob_join = member(r, BOB, "join")
    after_bob = message(r, ANN, "after bob")
    hv2 = r.event("m.room.history_visibility", ANN, {"history_visibility": "world_readable"},
                  state_key="")
    public = message(r, ANN, "public")
    assert store.persist_events([before_bob, bob_join, after_bob, hv2, public]).rejected == {}
    bob_view = [e.event_id for e in store.paginate_back(r.room_id, BOB, None, limit=50)[0]]
    assert before_bob["event_id"] not in bob_view
    # The events before the "joined" setting were under the default "shared" (and the
    # change itself takes the more permissive of old and new): Bob, now joined, sees them.
    assert bob_view == [e["event_id"] for e in (public, hv2, after_bob, bob_join)] + [
        ids[k] for k in ("hv", "rules", "power", "ann", "create")]
    # Cat never joined: only the world-readable part.
    cat_view = [e.event_id for e in store.paginate_back(r.room_id, CAT, None, limit=50)[0]]
    assert cat_view == [public["event_id"], hv2["event_id"]]
    assert store.get_event(hv2["event_id"]).history_visibility == "world_readable"
    assert store.get_event(after_bob["event_id"]).history_visibility == "joined"


def test_shared_history_is_seen_by_who_joined_after_it_even_once_they_left(
        store: EventStore) -> None:
    r, ids = new_room(store)
    old = message(r, ANN, "old")
    bob_join = member(r, BOB, "join")
    store.persist_events([old, bob_join])
    history = [ids[k] for k in ("rules", "power", "ann", "create")]
    assert [e.event_id for e in store.paginate_back(r.room_id, BOB, None, 10)[0]] == [
        bob_join["event_id"], old["event_id"], *history]
    bob_leave = member(r, BOB, "leave")
    later = message(r, ANN, "later")
    store.persist_events([bob_leave, later])
    # Left: he joined after the shared history, so he still sees it (and his own
    # leave); not what came after he left.
    assert [e.event_id for e in store.paginate_back(r.room_id, BOB, None, 10)[0]] == [
        bob_leave["event_id"], bob_join["event_id"], old["event_id"], *history]


def test_sync_initial_sync_and_rooms(store: EventStore) -> None:
    r, ids = new_room(store)
    two, _ = new_room(store, "!two:x.org")
    token = store.current_token()
    assert not store.has_room_changed_since(r.room_id, token)
    n1, n2 = message(r, ANN, "n1"), message(r, ANN, "n2")
    store.persist_events([n1, n2])
    assert store.has_room_changed_since(r.room_id, token)
    assert not store.has_room_changed_since(two.room_id, token)
    sync = store.get_new_events_for_user(ANN, token)
    assert [e.event_id for e in sync.events] == [n1["event_id"], n2["event_id"]]
    again = store.get_new_events_for_user(ANN, sync.next_token)
    assert again.events == [] and again.membership_changes == []
    timelines = store.get_initial_sync(ANN, rooms=1, events_per_room=2)
    assert [t.room_id for t in timelines] == [r.room_id]
    assert [e.event_id for e in timelines[0].events] == [n1["event_id"], n2["event_id"]]
    assert store.get_user_rooms(ANN) == sorted([r.room_id, two.room_id])


def test_an_invite_to_a_room_not_held_reaches_sync(store: EventStore) -> None:
    """An out-of-band invite (its room's auth events are the remote room's) is
    stored unchecked, and so is its rejection."""
    new_room(store)
    token = store.current_token()
    invite = {"event_id": "$inv", "room_id": "!other:y.org", "type": "m.room.member",
              "state_key": CAT, "sender": DAN, "depth": 20, "prev_events": ["$elsewhere"],
              "auth_events": ["$their_create", "$their_power"],
              "content": {"membership": "invite"}, "outlier": True}
    assert store.persist_events([invite]).rejected == {}
    sync = store.get_new_events_for_user(CAT, str(token))
    assert [e.event_id for e in sync.membership_changes] == ["$inv"]
    assert [e.event_id for e in store.get_pending_invites(CAT)] == ["$inv"]
    reject = dict(invite, event_id="$no", sender=CAT, content={"membership": "leave"},
                  prev_events=["$inv"])
    assert store.persist_events([reject]).rejected == {}
    assert store.get_pending_invites(CAT) == []
    # Anything else in that room is rejected, naming the auth events it misses.
    message_there = dict(invite, event_id="$msg", type="m.room.message", outlier=False)
    del message_there["state_key"]
    assert store.persist_events([message_there]).rejected["$msg"].startswith(
        "missing_auth_events")


def test_a_worker_follows_the_resolved_state(db_url: str, store: EventStore) -> None:
    r, ids = new_room(store)
    worker = EventStore(db_url)
    try:
        follower = EventsStreamFollower(worker)
        start = worker.current_token().stream
        bob = member(r, BOB, "join")
        base = [bob["event_id"]]
        early = r.event("m.room.topic", ANN, {"topic": "early"}, state_key="", prev=base,
                        advance=False, state=r.state_after[bob["event_id"]])
        late = r.event("m.room.topic", BOB, {"topic": "late"}, state_key="", prev=base,
                       advance=False)
        r.merge([early["event_id"], late["event_id"]])
        store.persist_events([bob])
        store.persist_events([late])
        store.persist_events([early])
        follower.catch_up(start, current_events_token(store.db))
        state = worker.get_current_state(r.room_id)
        assert state[("m.room.member", BOB)] == bob["event_id"]
        assert state[TOPIC] == late["event_id"] == store.get_current_state(r.room_id)[TOPIC]
        assert worker.has_room_changed_since(r.room_id, f"s{start}")
    finally:
        worker.close()


@pytest.mark.parametrize("version_id", ["1", "2", "5", "10", "11", "12"])
def test_room_builder_events_pass_the_rules_of_every_version_family(
        db_url: str, version_id: str) -> None:
    """RoomBuilder cites what each version's rules expect (event IDs with a server
    name and ``[id, hashes]`` pairs in 1-2, the room ID from the create event in 12),
    and a forbidden event it builds is still rejected."""
    store = EventStore(db_url)
    try:
        r = RoomBuilder(f"!v{version_id}:x.org", ANN, version_id,
                        event_id=(lambda n: f"$v{version_id}-{n}:x.org")
                        if version_id in ("1", "2") else (lambda n: f"$v{version_id}-{n}"))
        users = {BOB: 50} if r.version.creator_power else {ANN: 100, BOB: 50}
        events = [r.create, member(r, ANN, "join"),
                  r.event("m.room.power_levels", ANN, {"users": users}, state_key=""),
                  r.event("m.room.join_rules", ANN, {"join_rule": "public"}, state_key=""),
                  member(r, BOB, "join"), member(r, CAT, "join")]
        assert store.persist_events(events).rejected == {}
        base = list(r.extremities)
        t1 = r.event("m.room.topic", ANN, {"topic": "a"}, state_key="", prev=base,
                     advance=False)
        t2 = r.event("m.room.topic", BOB, {"topic": "b"}, state_key="", prev=base,
                     advance=False)
        r.merge([t1["event_id"], t2["event_id"]])
        assert store.persist_events([t1, t2]).rejected == {}
        after = message(r, CAT, "hi")
        bad = member(r, BOB, "ban", sender=CAT, advance=False)
        result = store.persist_events([after, bad])
        assert list(result.rejected) == [bad["event_id"]]
        state = store.get_current_state(r.room_id)
        assert state[("m.room.member", BOB)] == events[4]["event_id"]
        assert state[TOPIC] in (t1["event_id"], t2["event_id"])
        assert store.get_state_after_event(after["event_id"])[TOPIC] == state[TOPIC]
        assert store.db.fetchval("SELECT room_version FROM rooms WHERE room_id = ?",
                                 (r.room_id,)) == version_id
    finally:
        store.close()
