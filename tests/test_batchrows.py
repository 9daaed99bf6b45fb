"""The per-event passes of persisting a batch (``batchrows``), on both core
implementations, and compiled against pure over generated batches."""

from __future__ import annotations

from array import array
from dataclasses import fields
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep._pure.eventrecord import EventRecord
from streamrep._pure.extremities import (BATCH_COUNTED, BATCH_NON_OUTLIER, ID_FORWARD,
                                         ID_STORED_NON_OUTLIER)
from support.impls import core_module
from support.records import as_event_record

ROOM = "!r:x"
COUNTED = BATCH_NON_OUTLIER | BATCH_COUNTED


@pytest.fixture
def batchrows(impl_kind: str) -> ModuleType:
    return core_module("batchrows", impl_kind)


def record(event_id: str, prevs: list[str], *, state_key: str | None = None,
           membership: str | None = None, outlier: bool = False, rejected: bool = False,
           soft_failed: bool = False, redacts: str | None = None,
           relates_to: str | None = None) -> SimpleNamespace:
    etype = "m.room.member" if membership else ("m.room.topic" if state_key is not None
                                                else "m.room.message")
    return SimpleNamespace(
        event_id=event_id, room_id=ROOM, type=etype, sender="@a:x", depth=len(prevs) + 1,
        prev_events=prevs, state_key=state_key, json=b'{"x":1}', membership=membership,
        outlier=outlier, rejected=rejected, soft_failed=soft_failed, redacts=redacts,
        relates_to=relates_to)


def chain(n: int, first_prev: str = "$old") -> list[SimpleNamespace]:
    out, prev = [], first_prev
    for k in range(n):
        out.append(record(f"$e{k}", [prev]))
        prev = f"$e{k}"
    return out


# --- by_room ---------------------------------------------------------------------


def test_records_by_room(batchrows: ModuleType) -> None:
    records = chain(3)
    assert batchrows.by_room(records) == {ROOM: records}
    assert batchrows.by_room(records)[ROOM] is records  # one room: no copy
    other = record("$x", ["$old"])
    other.room_id = "!other:x"
    assert batchrows.by_room([records[0], other, records[1]]) == {
        ROOM: [records[0], records[1]], "!other:x": [other]}
    assert batchrows.by_room([]) == {}


# --- orderings_of -----------------------------------------------------------------


def test_orderings_of_new_events(batchrows: ModuleType) -> None:
    records = chain(3)
    orderings: dict[str, tuple[int, int]] = {"$old": (1, 5)}
    assert batchrows.orderings_of(records, [7, 8, 9], orderings) == {
        "$e0": 7, "$e1": 8, "$e2": 9}
    assert orderings == {"$old": (1, 5), "$e0": (2, 7), "$e1": (2, 8), "$e2": (2, 9)}
    with pytest.raises(ValueError):
        batchrows.orderings_of(records, [1, 2], {})


# --- in_prev_order ---------------------------------------------------------------


def test_a_chain_in_order_needs_no_sort(batchrows: ModuleType) -> None:
    assert batchrows.in_prev_order(chain(5))
    assert batchrows.in_prev_order([])


def test_an_event_before_its_prev_event_needs_a_sort(batchrows: ModuleType) -> None:
    records = chain(4)
    assert not batchrows.in_prev_order([records[1], records[0], *records[2:]])
    assert not batchrows.in_prev_order([record("$self", ["$self"])])
    merge = record("$m", ["$e0", "$e3"])
    assert not batchrows.in_prev_order([*chain(2), merge, *chain(4)[2:]])


# --- share_groups ----------------------------------------------------------------


def share(batchrows: ModuleType, records: list[SimpleNamespace], start: int = 0,
          outside: dict[str, int] | None = None,
          known: dict[int, str] | None = None) -> tuple[int, dict[str, Any]]:
    event_groups: dict[str, int] = {}
    visibility: dict[str, str] = {}
    rows: list[tuple[str, int]] = []
    stop = batchrows.share_groups(records, start, event_groups,
                                  {"$old": 7} if outside is None else outside,
                                  {7: "shared"} if known is None else known, visibility, rows)
    return stop, {"groups": event_groups, "visibility": visibility, "rows": rows}


def test_messages_share_the_group_of_their_prev_event(batchrows: ModuleType) -> None:
    stop, got = share(batchrows, chain(3))
    assert stop == 3
    assert got["groups"] == {"$e0": 7, "$e1": 7, "$e2": 7}
    assert got["visibility"] == {"$e0": "shared", "$e1": "shared", "$e2": "shared"}
    assert got["rows"] == [("$e0", 7), ("$e1", 7), ("$e2", 7)]


@pytest.mark.parametrize("odd", [
    record("$s", ["$e1"], state_key=""),          # changes the state
    record("$m", ["$e1", "$old"]),                # several prev events
    record("$n", []),                             # none
    record("$u", ["$unknown"]),                   # a prev event of no known group
])
def test_the_general_case_is_left_to_the_caller(batchrows: ModuleType,
                                                odd: SimpleNamespace) -> None:
    records = [*chain(2), odd, record("$after", [odd.event_id])]
    stop, got = share(batchrows, records)
    assert stop == 2
    assert got["rows"] == [("$e0", 7), ("$e1", 7)]


def test_a_rejected_state_event_changes_nothing(batchrows: ModuleType) -> None:
    stop, got = share(batchrows, [record("$s", ["$old"], state_key="", rejected=True)])
    assert (stop, got["groups"]) == (1, {"$s": 7})


def test_a_group_of_unknown_visibility_is_left_to_the_caller(batchrows: ModuleType) -> None:
    assert share(batchrows, chain(2), known={})[0] == 0
    assert share(batchrows, chain(3), start=2)[0] == 2  # $e1's group is not known here
    with pytest.raises(ValueError):
        share(batchrows, chain(1), start=-1)


# --- intern_batch ----------------------------------------------------------------


def test_interning_numbers_the_batch_then_its_prev_events_then_the_extremities(
        batchrows: ModuleType) -> None:
    records = [record("$a", ["$old", "$stored"]), record("$b", ["$a"], rejected=True),
               record("$a", ["$old"])]
    names, ids, batch_ids, batch_flags, offsets, prev_ids, id_flags = batchrows.intern_batch(
        records, frozenset({"$old"}), {"$old": True, "$stored": False, "$a": False})
    assert names == ["$a", "$b", "$old", "$stored"]
    assert ids == {"$a": 0, "$b": 1, "$old": 2, "$stored": 3}
    assert batch_ids == array("q", [0, 1, 0])
    assert batch_flags == bytes([COUNTED, BATCH_NON_OUTLIER, COUNTED])
    assert offsets == array("q", [0, 2, 3, 4])
    assert prev_ids == array("q", [2, 3, 0, 2])
    # $old is an outlier on record (True) and a forward extremity; $stored is stored.
    assert id_flags == bytearray([0, 0, ID_FORWARD, ID_STORED_NON_OUTLIER])


# --- event_rows ------------------------------------------------------------------


def rows_of(batchrows: ModuleType, records: list[SimpleNamespace],
            sqlite: bool) -> tuple[Any, ...]:
    events: list[tuple[Any, ...]] = []
    plain: list[tuple[Any, ...]] = []
    edges: list[tuple[str, str, str]] = []
    orderings = {r.event_id: 10 + k for k, r in enumerate(records)}
    room_max, members = batchrows.event_rows(
        records, ROOM, orderings, {"$e1"}, {"$e0": "joined"}, 1234, sqlite, events, plain,
        edges)
    return room_max, members, events, plain, edges


def test_event_rows_on_sqlite(batchrows: ModuleType) -> None:
    join = record("$j", ["$e1"], state_key="@b:x", membership="join")
    outlier = record("$o", ["$x", "$y"], outlier=True, soft_failed=True)
    room_max, members, events, plain, edges = rows_of(
        batchrows, [*chain(2), join, outlier], sqlite=True)
    assert room_max == 13
    assert members == [join]
    assert plain == [
        (10, 2, "$e0", ROOM, "m.room.message", "@a:x", 0, 0, 0, 0, "joined", 1234,
         bytearray(b'{"x":1}')),
        (11, 2, "$e1", ROOM, "m.room.message", "@a:x", 0, 0, 0, 1, None, 1234,
         bytearray(b'{"x":1}')),
        (13, 3, "$o", ROOM, "m.room.message", "@a:x", 1, 0, 1, 0, None, 1234,
         bytearray(b'{"x":1}')),
    ]
    assert all(type(row[-1]) is bytearray for row in plain + events)
    assert events == [(12, 2, "$j", ROOM, "m.room.member", "@b:x", "@a:x", 0, 0, 0, 0,
                       None, None, "join", None, 1234, bytearray(b'{"x":1}'))]
    assert edges == [("$e0", "$old", ROOM), ("$e1", "$e0", ROOM), ("$j", "$e1", ROOM)]


def test_event_rows_on_postgresql_take_every_column(batchrows: ModuleType) -> None:
    reply = record("$r", ["$e0"], relates_to="$e0")
    _, members, events, plain, edges = rows_of(batchrows, [*chain(1), reply], sqlite=False)
    assert (members, plain) == ([], [])
    assert [row[:3] + row[11:14] for row in events] == [
        (10, 2, "$e0", None, None, None), (11, 2, "$r", None, "$e0", None)]
    assert all(type(row[-1]) is bytes for row in events)
    assert edges == [("$e0", "$old", ROOM), ("$r", "$e0", ROOM)]


# --- flat_chunks -----------------------------------------------------------------


def test_flat_chunks_give_each_statement_its_rows_values(batchrows: ModuleType) -> None:
    rows = [(k, f"$e{k}", b"{}") for k in range(7)]
    assert batchrows.flat_chunks(rows, 1, 7, 3) == [
        [1, "$e1", b"{}", 2, "$e2", b"{}", 3, "$e3", b"{}"],
        [4, "$e4", b"{}", 5, "$e5", b"{}", 6, "$e6", b"{}"]]
    assert batchrows.flat_chunks(rows, 0, 2, 1) == [[0, "$e0", b"{}"], [1, "$e1", b"{}"]]
    assert batchrows.flat_chunks(rows, 3, 3, 8) == []
    # Rows as lists too, and the very objects of the rows.
    listed = [[k, [k]] for k in range(4)]
    chunks = batchrows.flat_chunks(listed, 0, 4, 2)
    assert chunks == [[0, [0], 1, [1]], [2, [2], 3, [3]]]
    assert chunks[1][3] is listed[3][1]


def test_flat_chunks_refuse_partial_statements_and_ragged_rows(batchrows: ModuleType) -> None:
    with pytest.raises(ValueError):
        batchrows.flat_chunks([(1,), (2,), (3,)], 0, 3, 2)
    with pytest.raises(ValueError):
        batchrows.flat_chunks([(1, 2), (3,)], 0, 2, 2)
    with pytest.raises(ValueError):
        batchrows.flat_chunks([(1,)], 0, 1, 0)


def test_an_event_record_with_a_field_unset_is_refused_as_getattr_refuses(
        batchrows: ModuleType) -> None:
    whole = as_event_record(record("$e0", ["$old"]))
    partial = object.__new__(EventRecord)
    for f in fields(EventRecord):
        if f.name != "prev_events":
            setattr(partial, f.name, getattr(whole, f.name))
    assert batchrows.in_prev_order([whole])
    with pytest.raises(AttributeError, match="prev_events"):
        batchrows.in_prev_order([whole, partial])


# --- compiled against pure ---------------------------------------------------------

_IDS = [f"$e{k}" for k in range(8)]


@st.composite
def batches(draw: Any) -> list[SimpleNamespace]:
    out = []
    for event_id in draw(st.lists(st.sampled_from(_IDS), min_size=0, max_size=10)):
        state_key = draw(st.sampled_from([None, None, "", "@b:x"]))
        out.append(record(
            event_id, draw(st.lists(st.sampled_from([*_IDS, "$old", "$far"]), max_size=3)),
            state_key=state_key,
            membership=draw(st.sampled_from([None, "join"])) if state_key == "@b:x" else None,
            outlier=draw(st.booleans()), rejected=draw(st.booleans()),
            soft_failed=draw(st.booleans()), redacts=draw(st.sampled_from([None, "$x"])),
            relates_to=draw(st.sampled_from([None, "$y"]))))
    return out


@pytest.mark.compiled_vs_pure
@settings(max_examples=400, deadline=None)
@given(records=batches(), start=st.integers(0, 4), sqlite=st.booleans(),
       forward=st.frozensets(st.sampled_from([*_IDS, "$old", "$f"]), max_size=3),
       stored=st.dictionaries(st.sampled_from([*_IDS, "$old", "$far"]), st.booleans()),
       event_records=st.booleans())
def test_compiled_and_pure_agree(records: list[Any], start: int, sqlite: bool,
                                 forward: frozenset[str], stored: dict[str, bool],
                                 event_records: bool) -> None:
    compiled, pure = core_module("batchrows", "compiled"), core_module("batchrows", "pure")
    if event_records:  # read at their slots by the compiled passes
        records = [as_event_record(r) for r in records]
    for k, r in enumerate(records):
        r.room_id = ROOM if k % 3 or not sqlite else "!other:x"
    assert compiled.by_room(records) == pure.by_room(records)
    streams = list(range(-3, len(records) - 3))
    orderings: list[dict[str, tuple[int, int]]] = [{"$old": (0, 0)}, {"$old": (0, 0)}]
    assert compiled.orderings_of(records, streams, orderings[0]) == pure.orderings_of(
        records, streams, orderings[1])
    assert orderings[0] == orderings[1]
    assert compiled.in_prev_order(records) == pure.in_prev_order(records)
    assert compiled.intern_batch(records, forward, stored) == pure.intern_batch(
        records, forward, stored)
    groups = {"$old": 1, "$e0": 2}
    for mod in (compiled, pure):
        got = [dict(groups), {}, []]
        stop = mod.share_groups(records, start, got[0], {"$far": 3}, {1: "a", 3: "b"},
                                got[1], got[2])
        got.append(stop)
        if mod is compiled:
            from_compiled = got
    assert from_compiled == got
    unique = list({r.event_id: r for r in records}.values())
    assert rows_of(compiled, unique, sqlite) == rows_of(pure, unique, sqlite)
    events = rows_of(pure, unique, sqlite)[2]
    for size in (1, 2, 3):
        end = len(events) // size * size
        assert compiled.flat_chunks(events, 0, end, size) == pure.flat_chunks(
            events, 0, end, size)
