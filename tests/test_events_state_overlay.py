"""``StateOverlay``: the state of a group a batch makes, as changes over a full
state, behaves as the whole state would."""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep.events.state import StateOverlay, mutable_copy

KEYS = st.tuples(st.sampled_from(["m.room.member", "m.room.name", "m.room.topic"]),
                 st.sampled_from(["", "@a:x", "@b:x", "@c:x"]))


@settings(max_examples=200, deadline=None)
@given(base=st.dictionaries(KEYS, st.text(min_size=1, max_size=3), max_size=8),
       changes=st.lists(st.tuples(KEYS, st.text(min_size=1, max_size=3)), min_size=1,
                        max_size=8))
def test_overlay_reads_as_the_whole_state(base, changes):
    expected = dict(base)
    state = MappingProxyType(dict(base))
    overlays = []
    for key, event_id in changes:
        state = StateOverlay.over(state, key, event_id)
        expected[key] = event_id
        overlays.append((state, dict(expected)))
    # Each overlay keeps its own state, whatever came after it.
    for overlay, whole in overlays:
        assert type(overlay) is StateOverlay and overlay.base is not overlay
        assert type(overlay.base) is MappingProxyType  # never an overlay of an overlay
        assert len(overlay) == len(whole)
        assert sorted(overlay) == sorted(whole)
        assert dict(overlay.items()) == whole and overlay == whole
        for key in whole:
            assert key in overlay and overlay[key] == whole[key] == overlay.get(key)
        assert ("x.absent", "") not in overlay and overlay.get(("x.absent", ""), "d") == "d"
        assert mutable_copy(overlay) == whole
        materialized = overlay.materialize()
        assert type(materialized) is MappingProxyType and materialized == whole
    assert dict(base) == dict(overlays[0][0].base)  # the base is left alone


def _member(event_id: str, prev: str, depth: int, user: str) -> dict[str, object]:
    return {"event_id": event_id, "room_id": "!r:x", "type": "m.room.member", "sender": user,
            "state_key": user, "depth": depth, "prev_events": [prev],
            "content": {"membership": "join"}}


def test_current_state_stays_an_overlay_until_its_changes_are_many(db_url):
    """A room's current state is kept between batches as the batches' changes over
    the last whole state until those changes pass the limit (32 here), then made
    whole; at every batch it reads as the tables' current state, as the state
    recomputed from the forward extremities and as a fresh store reads its group."""
    from streamrep import EventStore

    store = EventStore(db_url, room_rules=None)
    try:
        store.persist_events([
            {"event_id": "$c", "room_id": "!r:x", "type": "m.room.create", "sender": "@a:x",
             "state_key": "", "depth": 1, "prev_events": [], "content": {"creator": "@a:x"}},
            *[_member(f"$m{n}", "$c" if n == 0 else f"$m{n - 1}", n + 2, f"@u{n}:x")
              for n in range(50)]])
        kinds = []
        prev, depth = "$m49", 52
        for batch in range(12):
            events = []
            for n in range(5):
                event_id = f"$b{batch}-{n}"
                user = f"@u{n + 5 * batch if n < 4 else 1000 + batch}:x"
                events.append(_member(event_id, prev, depth, user) if n % 2 == 0 else
                              {"event_id": event_id, "room_id": "!r:x", "sender": "@a:x",
                               "type": "m.room.message", "depth": depth,
                               "prev_events": [prev], "content": {"body": "hi"}})
                prev, depth = event_id, depth + 1
            store.persist_events(events)
            current = store.get_current_state("!r:x")
            kinds.append(type(current).__name__)
            with EventStore(db_url, room_rules=None) as fresh:
                in_tables = dict(fresh.get_current_state("!r:x"))
                assert dict(fresh.get_state_after_event(prev)) == in_tables
            assert dict(current) == in_tables == dict(store.compute_state_at_extremities("!r:x"))
            assert dict(store.get_state_after_event(prev)) == in_tables
            assert len(current) == len(in_tables)
        assert "StateOverlay" in kinds and "mappingproxy" in kinds[kinds.index("StateOverlay"):]
    finally:
        store.close()
