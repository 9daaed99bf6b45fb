"""Property tests: the event store against the brute-force model of support.dagmodel,
on SQLite and PostgreSQL, over random DAGs delivered in random orders and batches.

The model is of the DAG alone (extremities, outliers, backfill, state by depth
order), so the store is opened with ``room_rules=None``; the room rules over random
forked rooms are tested in ``test_matrix_store.py``."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from streamrep import EventStore
from support.dagmodel import DagModel, ModelEvent

USERS = ["@ann:x", "@bob:x", "@cat:x"]
_room_counter = itertools.count()


@st.composite
def room_histories(draw):
    """A room DAG plus a delivery plan: [(batch of (index, as_outlier)), backfilled]."""
    n = draw(st.integers(2, 12))
    specs = []
    for i in range(n):
        if i == 0:
            prevs: list[int] = []
        else:
            prevs = sorted(set(draw(st.lists(st.integers(0, i - 1), min_size=1, max_size=3))))
        kind = draw(st.sampled_from(
            ["msg", "msg", "member", "member", "vis", "topic"] if i else ["create"]))
        extra: dict = {}
        if kind == "member":
            extra = {"user": draw(st.sampled_from(USERS)),
                     "membership": draw(st.sampled_from(["join", "join", "leave", "invite"]))}
        elif kind == "vis":
            extra = {"vis": draw(st.sampled_from(
                ["world_readable", "shared", "invited", "joined"]))}
        flag = draw(st.sampled_from(["ok"] * 8 + ["rejected", "soft_failed"])) if i else "ok"
        specs.append((kind, prevs, extra, flag))
    order = draw(st.permutations(range(n)))
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=3))) | {n})
    batches = []
    start = 0
    for cut in cuts:
        batches.append((list(order[start:cut]), draw(st.booleans())))
        start = cut
    early_outliers = draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))
    viewer = draw(st.sampled_from(USERS))
    return specs, batches, early_outliers, viewer


def build_events(room: str, specs) -> list[ModelEvent]:
    depths: list[int] = []
    events = []
    for i, (kind, prevs, extra, flag) in enumerate(specs):
        depth = 1 + max((depths[p] for p in prevs), default=0)
        depths.append(depth)
        eid = f"${room}-{i}"
        etype, state_key, content = "m.room.message", None, {"body": str(i)}
        if kind == "create":
            etype, state_key, content = "m.room.create", "", {"creator": USERS[0]}
        elif kind == "member":
            etype, state_key, content = "m.room.member", extra["user"], {
                "membership": extra["membership"]}
        elif kind == "vis":
            etype, state_key, content = "m.room.history_visibility", "", {
                "history_visibility": extra["vis"]}
        elif kind == "topic":
            etype, state_key, content = "m.room.topic", "", {"topic": str(i)}
        events.append(ModelEvent(
            event_id=eid, room_id=room, type=etype, state_key=state_key, sender=USERS[0],
            depth=depth, prev_events=[f"${room}-{p}" for p in prevs], content=content,
            rejected=flag == "rejected", soft_failed=flag == "soft_failed"))
    return events


def to_wire(ev: ModelEvent, outlier: bool) -> dict:
    body = {"event_id": ev.event_id, "room_id": ev.room_id, "type": ev.type,
            "sender": ev.sender, "depth": ev.depth, "prev_events": ev.prev_events,
            "content": ev.content, "outlier": outlier, "rejected": ev.rejected,
            "soft_failed": ev.soft_failed}
    if ev.state_key is not None:
        body["state_key"] = ev.state_key
    return body


def copy_event(ev: ModelEvent, outlier: bool) -> ModelEvent:
    return ModelEvent(**{**ev.__dict__, "outlier": outlier, "known_prevs": []})


@pytest.mark.parametrize("db_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_store_matches_brute_force_model(db_kind, request, tmp_path):
    if db_kind == "postgres":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path}/prop.db"
    store = EventStore(url, max_delta_hops=3, room_rules=None)
    try:
        run_property(store)
    finally:
        store.close()


def run_property(store: EventStore) -> None:
    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(room_histories())
    def check(history):
        specs, batches, early_outliers, viewer = history
        room = f"!r{next(_room_counter)}"
        events = build_events(room, specs)
        model = DagModel()
        if early_outliers:
            batch = [copy_event(events[i], True) for i in early_outliers]
            result = store.persist_events([to_wire(ev, True) for ev in batch])
            model.persist(batch, dict(result.orderings))
        for indices, backfilled in batches:
            batch = [copy_event(events[i], False) for i in indices]
            result = store.persist_events([to_wire(ev, False) for ev in batch],
                                          backfilled=backfilled)
            model.persist(batch, dict(result.orderings))
            assert store.get_forward_extremities(room) == model.forward(room)
            assert store.get_backward_extremities(room) == model.backward(room)
        for ev in events:
            assert dict(store.get_state_after_event(ev.event_id)) == model.state_after(ev.event_id)
        assert dict(store.get_current_state(room)) == model.current_state(room)
        # The table too, not only the cache: its rows follow the batches' deltas.
        assert {(t, k): e for t, k, e in store.db.run(lambda txn: txn.fetchall(
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            (room,)))} == model.current_state(room)
        store.states.clear()  # read every group back from the database too
        for ev in events:
            assert dict(store.get_state_after_event(ev.event_id)) == model.state_after(ev.event_id)
        topo = store.get_room_events(room)
        expected = sorted(model.room_events(room), key=lambda e: (e.depth, e.stream))
        assert topo == [e.event_id for e in expected if not e.outlier]
        # Paginating back from the end yields every visible event once, in order.
        seen = []
        token = None
        for _ in range(len(events) + 2):
            page, token = store.paginate_back(room, viewer, token, limit=3)
            seen.extend(e.event_id for e in page)
            if token is None:
                break
        assert seen == model.visible_timeline(room, viewer)

    check()
