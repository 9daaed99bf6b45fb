"""Completion tracking: the seed's examples, error cases and property tests,
on the compiled core and its pure twin."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep import _impl
from streamrep.errors import NotAWriterError, StreamIdError
from streamrep.idgen import CompletionTracker
from support.impls import IMPLEMENTATIONS, core_module


@pytest.fixture
def tracker_mod(impl_kind: str) -> ModuleType:
    return core_module("tracker", impl_kind)


def done(t: object, *stream_ids: int) -> list[int]:
    """Complete *stream_ids* (one call to ``complete``, or ``complete_many`` for
    several); the IDs that became visible, checked against the returned count."""
    if len(stream_ids) == 1:
        count = t.complete(stream_ids[0])  # type: ignore[attr-defined]
    else:
        count = t.complete_many(stream_ids)  # type: ignore[attr-defined]
    visible: list[int] = t.last_visible()  # type: ignore[attr-defined]
    assert count == len(visible)
    return visible


def test_idgen_exports_the_selected_implementation() -> None:
    expected = _impl.load("tracker").CompletionTracker
    assert CompletionTracker is expected


def test_seed_single_writer_out_of_order(tracker_mod: ModuleType) -> None:
    # A single-writer stream at 1 reserves 2, 3 and 4; they complete 3, 2, 4.
    t = tracker_mod.CompletionTracker(1)
    assert t.reserve(3) == 2
    assert t.in_flight == 3 and t.last_reserved == 4
    assert done(t, 3) == []
    assert t.position == 1  # 2 is still in flight: 3 is not visible yet
    assert done(t, 2) == [2, 3]
    assert t.position == 3
    assert done(t, 4) == [4]
    assert t.position == 4 and t.in_flight == 0


def test_rollback_counts_as_completion_and_gaps_are_skipped(tracker_mod: ModuleType) -> None:
    # IDs from a shared sequence: 6 and 8 belong to another writer.
    t = tracker_mod.CompletionTracker(4)
    for stream_id in (5, 7, 9):
        t.track(stream_id)
    assert done(t, 9) == []
    assert done(t, 7) == []
    assert t.first_in_flight == 5
    assert done(t, 5) == [5, 7, 9]
    assert t.position == 9
    # An idle writer catches up with the sequence so readers are not held back.
    assert t.advance_to(12) == 12
    assert t.reserve() == 13


def test_advance_to_stops_before_in_flight(tracker_mod: ModuleType) -> None:
    t = tracker_mod.CompletionTracker(0)
    t.track(5)
    assert t.advance_to(10) == 4
    assert t.advance_to(2) == 4  # never backwards
    assert done(t, 5) == [5]
    assert t.advance_to(10) == 10


def test_out_of_order_tracking(tracker_mod: ModuleType) -> None:
    t = tracker_mod.CompletionTracker(0)
    t.track(3)
    t.track(1)
    t.track(2)
    assert t.is_in_flight(2) and not t.is_in_flight(4)
    assert done(t, 2) == []
    assert done(t, 1) == [1, 2]
    assert t.complete_many([3]) == 1 and t.last_visible() == [3]
    assert t.complete_many([]) == 0 and t.last_visible() == []


def test_backfill_tracks_negations(tracker_mod: ModuleType) -> None:
    # Backfill IDs decrease from -1; the tracker follows their negations.
    t = tracker_mod.CompletionTracker(1)  # stream at -1
    for stream_id in (-2, -3, -4):
        t.track(-stream_id)
    assert [-x for x in done(t, 3)] == []
    assert [-x for x in done(t, 2)] == [-2, -3]
    assert -t.position == -3


def test_misuse_is_a_typed_error(tracker_mod: ModuleType) -> None:
    t = tracker_mod.CompletionTracker(10)
    with pytest.raises(StreamIdError):
        t.track(10)
    t.track(11)
    with pytest.raises(StreamIdError):
        t.track(11)
    with pytest.raises(StreamIdError):
        done(t, 12)
    t.track(13)
    assert done(t, 13) == []
    with pytest.raises(StreamIdError):
        done(t, 13)
    with pytest.raises(StreamIdError):
        t.reserve(0)
    with pytest.raises(StreamIdError):
        t.track_range(20, -1)
    with pytest.raises(StreamIdError) as info:
        t.complete_many([11, 99])
    assert info.value.visible == [11, 13]  # type: ignore[attr-defined]
    assert t.last_visible() == [11, 13]
    assert t.position == 13


def test_reserve_many_grows_and_compacts(tracker_mod: ModuleType) -> None:
    t = tracker_mod.CompletionTracker(0)
    first = t.reserve(10_000)
    assert first == 1 and t.in_flight == 10_000
    assert t.complete_many(range(2, 10_001)) == 0 and t.last_visible() == []
    assert done(t, 1) == list(range(1, 10_001))
    # The IDs made visible stay listed while more are tracked (and storage grows).
    t.reserve(20_000)
    assert t.last_visible() == list(range(1, 10_001))
    t.complete_many(range(10_001, 30_001))
    for _ in range(50):
        start = t.reserve(300)
        assert t.complete_many(range(start, start + 300)) == 300
        assert t.last_visible() == list(range(start, start + 300))
    assert t.position == 30_000 + 50 * 300 and t.in_flight == 0


def test_writer_positions(tracker_mod: ModuleType) -> None:
    w = tracker_mod.WriterPositions({"w1": 5, "w2": 3})
    assert (w.linear_position, w.max_position) == (3, 5)
    assert w.advance("w2", 7)
    assert not w.advance("w2", 6)  # late messages never move a writer back
    assert (w.linear_position, w.max_position) == (5, 7)
    assert w.get_position("w2") == 7
    w.add_writer("w3", 4)
    assert w.linear_position == 4 and w.writers == ["w1", "w2", "w3"]
    assert w.positions() == {"w1": 5, "w2": 7, "w3": 4}
    with pytest.raises(NotAWriterError):
        w.get_position("nobody")
    with pytest.raises(NotAWriterError):
        w.advance("nobody", 1)
    with pytest.raises(NotAWriterError):
        tracker_mod.WriterPositions({})


def test_position_messages_jump_only_without_a_gap(tracker_mod: ModuleType) -> None:
    w = tracker_mod.WriterPositions({"w1": 10, "w2": 4})
    # POSITION w1 10 25: w1 had nothing in flight from 10 to 25; the reader holds 10.
    assert w.apply_position("w1", 10, 25) is None
    assert w.get_position("w1") == 25
    # POSITION w2 8 30 while the reader only holds 4: rows in (4, 8] were missed.
    assert w.apply_position("w2", 8, 30) == 4
    assert w.get_position("w2") == 4
    w.advance("w2", 8)  # after fetching the missed rows
    assert w.apply_position("w2", 8, 30) is None
    assert (w.linear_position, w.max_position) == (25, 30)
    with pytest.raises(NotAWriterError):
        w.apply_position("nobody", 1, 2)


# --- properties -------------------------------------------------------------------

# An operation is ("reserve", n), ("complete", index into the in-flight list),
# ("many", how many in-flight IDs to complete in one call, from the newest),
# ("gap", IDs skipped before tracking one) or ("advance", delta).
operations = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(1, 5)),
        st.tuples(st.just("complete"), st.integers(0, 1000)),
        st.tuples(st.just("many"), st.integers(0, 4)),
        st.tuples(st.just("advance"), st.integers(0, 4)),
        st.tuples(st.just("gap"), st.integers(1, 3)),
    ),
    max_size=150,
)


def _run(mod: ModuleType, start: int, ops: list[tuple[str, int]]) -> list[object]:
    """Apply *ops*, checking the invariants; return a transcript of every result."""
    t = mod.CompletionTracker(start)
    in_flight: list[int] = []
    completed: set[int] = set()
    reported: list[int] = []
    transcript: list[object] = []
    for op, arg in ops:
        before = t.position
        if op == "reserve":
            first = t.reserve(arg)
            in_flight.extend(range(first, first + arg))
            transcript.append(first)
        elif op == "gap":
            # IDs taken by another writer: track one beyond a gap.
            stream_id = t.last_reserved + arg + 1
            t.track(stream_id)
            in_flight.append(stream_id)
            transcript.append(stream_id)
        elif op in ("complete", "many") and in_flight:
            if op == "complete":
                chosen = [in_flight.pop(arg % len(in_flight))]
                count = t.complete(chosen[0])
            else:
                chosen = in_flight[len(in_flight) - arg:] if arg else []
                del in_flight[len(in_flight) - len(chosen):]
                count = t.complete_many(chosen)
            completed.update(chosen)
            visible = t.last_visible()
            assert count == len(visible)
            assert visible == sorted(visible)
            reported.extend(visible)
            transcript.append(visible)
        elif op == "advance":
            transcript.append(t.advance_to(t.position + arg))
        pos = t.position
        assert pos >= before, "the position went backwards"
        assert all(x > pos for x in in_flight), "the position passed an incomplete ID"
        assert t.in_flight == len(in_flight)
        transcript.append(pos)
        transcript.append(t.last_visible())  # kept until the next completion call
    assert len(reported) == len(set(reported)), "an ID was reported twice"
    assert set(reported) <= completed
    assert all(x <= t.position for x in reported)
    # Everything completed at or below the position has been reported.
    assert {x for x in completed if x <= t.position} == set(reported)
    return transcript


@settings(max_examples=150, deadline=None)
@given(start=st.integers(-1000, 1000), ops=operations)
def test_tracker_properties_and_twins_agree(start: int, ops: list[tuple[str, int]]) -> None:
    transcripts = [_run(core_module("tracker", kind), start, ops) for kind in IMPLEMENTATIONS]
    assert all(t == transcripts[0] for t in transcripts)


@settings(max_examples=100, deadline=None)
@given(
    writers=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 50),
                            min_size=1),
    moves=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 100)),
                   max_size=60),
)
def test_writer_positions_properties(writers: dict[str, int],
                                     moves: list[tuple[str, int]]) -> None:
    results = []
    for kind in IMPLEMENTATIONS:
        w = core_module("tracker", kind).WriterPositions(writers)
        model = dict(writers)
        trace = []
        for name, pos in moves:
            if name not in model:
                continue
            linear, top = w.linear_position, w.max_position
            trace.append(w.advance(name, pos))
            model[name] = max(model[name], pos)
            assert w.linear_position == min(model.values()) >= linear
            assert w.max_position == max(model.values()) >= top
        trace.append(w.positions())
        results.append(trace)
    assert all(r == results[0] for r in results)
