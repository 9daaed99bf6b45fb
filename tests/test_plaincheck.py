"""The plain-event checks of the room rules (``plaincheck``), on both core
implementations, and compiled against pure over generated batches."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.impls import core_module
from support.records import as_event_record

NOT_PLAIN = frozenset({"m.room.create", "m.room.member", "m.room.redaction"})
MEMBER = "m.room.member"
ROOM = "!r:x"


@pytest.fixture
def plaincheck(impl_kind: str) -> ModuleType:
    return core_module("plaincheck", impl_kind)


def record(event_id: str = "$e", sender: str = "@a:x", etype: str = "m.room.message",
           state_key: str | None = None, rejected: bool = False, outlier: bool = False,
           **fields: Any) -> SimpleNamespace:
    body = {"auth_events": ["$c", "$p"], "prev_events": ["$prev"], "origin_server_ts": 5}
    body.update(fields)
    return SimpleNamespace(event_id=event_id, sender=sender, type=etype, state_key=state_key,
                           rejected=rejected, outlier=outlier, body=body)


def plain_of(plaincheck: ModuleType, records: list[SimpleNamespace], room_id: str = ROOM,
             create_id: str | None = None) -> dict[str, tuple[str, ...]]:
    plain: dict[str, tuple[str, ...]] = plaincheck.scan_batch(
        records, room_id, create_id, NOT_PLAIN, MEMBER).plain
    return plain


def test_plain_events_of_the_usual_shape_give_their_auth_event_ids(
        plaincheck: ModuleType) -> None:
    records = [record("$1"), record("$2", auth_events=[]),
               record("$3", origin_server_ts=None, prev_events=["$a", "$b"])]
    assert plain_of(plaincheck, records) == {
        "$1": ("$c", "$p"), "$2": (), "$3": ("$c", "$p")}


def test_the_create_event_a_version_12_room_id_names_comes_first(
        plaincheck: ModuleType) -> None:
    """An event listing that create event itself is left to the full check, which
    rejects it: its auth event IDs would otherwise be those of one that does not."""
    listing = record("$2", auth_events=["$room", "$c", "$p"])
    records = [record("$1"), listing]
    scan = plaincheck.scan_batch(records, ROOM, "$room", NOT_PLAIN, MEMBER)
    assert scan.plain == {"$1": ("$room", "$c", "$p")}
    assert scan.others == [listing]


@pytest.mark.parametrize("odd", [
    record(state_key=""),  # a state event
    record(etype="m.room.member"),  # a type the caller names
    record(auth_events=["$c", ""]),
    record(auth_events=["$c", ["$p", {}]]),  # versions 1-2 pairs: parsed in full
    record(auth_events="$c"),
    record(auth_events=None),
    record(prev_events=[["$prev", {}]]),
    record(prev_events=("$prev",)),
    record(origin_server_ts=True),
    record(origin_server_ts=5.0),
    record(event_id="e"),
    record(sender="a:x"),
    record(sender="@a"),
])
def test_anything_else_is_left_to_the_full_parse(plaincheck: ModuleType,
                                                 odd: SimpleNamespace) -> None:
    scan = plaincheck.scan_batch([odd], ROOM, None, NOT_PLAIN, MEMBER)
    assert scan.plain == {}
    assert scan.others == [odd]


def test_a_room_id_that_is_not_one_leaves_every_event_to_the_full_parse(
        plaincheck: ModuleType) -> None:
    assert plain_of(plaincheck, [record()], room_id="r:x") == {}
    # Nor any when the caller names no plain types (the room's version is unknown).
    assert plaincheck.scan_batch([record()], ROOM, None, None, MEMBER).plain == {}


def test_the_scan_gathers_what_the_checks_ask_of_the_batch(plaincheck: ModuleType) -> None:
    join = record("$j", sender="@b:x", etype=MEMBER, state_key="@b:x")
    topic = record("$t", etype="m.room.topic", state_key="", outlier=True)
    invite = record("$i", etype=MEMBER, state_key="@c:x")
    odd = record("$o", sender="@d", auth_events=None)
    records = [record("$1"), join, record("$2"), topic, invite, odd]
    scan = plaincheck.scan_batch(records, ROOM, None, NOT_PLAIN, MEMBER)
    assert set(scan.plain) == {"$1", "$2"}
    assert scan.others == [join, topic, invite, odd]
    assert [r.event_id for r in scan.others if r.state_key is not None] == ["$j", "$t", "$i"]
    assert scan.senders == {"@a:x", "@b:x", "@d"}
    assert scan.member_targets == {"@b:x", "@c:x"}
    assert scan.has_outlier
    assert not plaincheck.scan_batch([record()], ROOM, None, NOT_PLAIN, MEMBER).has_outlier


def test_records_listing_the_same_auth_events_share_one_tuple(plaincheck: ModuleType) -> None:
    records = [record("$1"), record("$2"), record("$3", auth_events=["$c"]), record("$4")]
    plain = plain_of(plaincheck, records)
    assert plain["$1"] is plain["$2"]
    assert plain["$3"] == ("$c",)
    assert plain["$4"] == plain["$1"] and plain["$4"] is not plain["$1"]


def test_settled_until_stops_at_the_first_record_the_memos_do_not_settle(
        plaincheck: ModuleType) -> None:
    records = [record("$1"), record("$2"), record("$3", sender="@b:x"), record("$4")]
    plain = plain_of(plaincheck, records)
    passed = {(("$c", "$p"), "@a:x", "m.room.message"): True}
    verdicts = {("@a:x", "m.room.message"): False}
    assert plaincheck.settled_until(records, 0, plain, passed, verdicts) == 2
    assert plaincheck.settled_until(records, 3, plain, passed, verdicts) == 4
    # Not yet passed against the current state, or failed it: not settled.
    assert plaincheck.settled_until(records, 0, plain, passed, {}) == 0
    assert plaincheck.settled_until(
        records, 0, plain, passed, {("@a:x", "m.room.message"): True}) == 0
    # No current state to check against (a backfill), or an outlier: its auth events only.
    assert plaincheck.settled_until(records, 0, plain, passed, None) == 2
    outlier = [record("$5", outlier=True)]
    assert plaincheck.settled_until(outlier, 0, {"$5": ("$c", "$p")}, passed, {}) == 1
    # Flagged rejected, or not plain: the caller's.
    flagged = [record("$6", rejected=True)]
    assert plaincheck.settled_until(flagged, 0, {"$6": ("$c", "$p")}, passed, verdicts) == 0
    assert plaincheck.settled_until(records, 0, {}, passed, verdicts) == 0
    with pytest.raises(ValueError, match="start"):
        plaincheck.settled_until(records, -1, plain, passed, verdicts)


def test_an_outlier_settled_does_not_settle_a_live_event_like_it(
        plaincheck: ModuleType) -> None:
    """An outlier needs its auth events only; the live event after it, with the same
    auth events, sender and type, needs the current state's verdict too."""
    key = (("$c", "$p"), "@a:x", "m.room.message")
    records = [record("$1", outlier=True), record("$2")]
    plain = plain_of(plaincheck, records)
    failing = {("@a:x", "m.room.message"): True}
    assert plaincheck.settled_until(records, 0, plain, {key: True}, failing) == 1
    live_first = [record("$3"), record("$4", outlier=True), record("$5")]
    plain = plain_of(plaincheck, live_first)
    passing = {("@a:x", "m.room.message"): False}
    assert plaincheck.settled_until(live_first, 0, plain, {key: True}, passing) == 3


ids = st.sampled_from(["$c", "$p", "$q", "", "c", "$room"])
values = st.one_of(st.none(), st.integers(-2, 2), st.booleans(), st.text(max_size=3),
                   st.lists(ids, max_size=3), st.lists(st.one_of(ids, st.integers()), max_size=2))
records_strategy = st.lists(st.builds(
    record,
    event_id=st.sampled_from(["$1", "$2", "$3", "x"]),
    sender=st.sampled_from(["@a:x", "@b:x", "a:x", "@b"]),
    etype=st.sampled_from(["m.room.message", "m.room.member", "m.reaction"]),
    state_key=st.sampled_from([None, None, "", "@b:x"]),
    rejected=st.booleans(), outlier=st.booleans(),
    auth_events=values, prev_events=values, origin_server_ts=values), max_size=6)


@pytest.mark.compiled_vs_pure
@settings(max_examples=300, deadline=None)
@given(records=records_strategy, create_id=st.sampled_from([None, "$room"]),
       start=st.integers(0, 7), memo=st.booleans(), event_records=st.booleans())
def test_compiled_and_pure_agree(records: list[Any], create_id: str | None,
                                 start: int, memo: bool, event_records: bool) -> None:
    compiled, pure = core_module("plaincheck", "compiled"), core_module("plaincheck", "pure")
    if event_records:  # read at their slots by the compiled scan
        records = [as_event_record(r) for r in records]
    scan = pure.scan_batch(records, ROOM, create_id, NOT_PLAIN, MEMBER)
    compiled_scan = compiled.scan_batch(records, ROOM, create_id, NOT_PLAIN, MEMBER)
    for field in ("plain", "others", "senders", "member_targets", "has_outlier"):
        assert getattr(compiled_scan, field) == getattr(scan, field), field
    plain = scan.plain
    passed = {(v, r.sender, r.type): True for r in records[:2]
              for v in [plain.get(r.event_id)] if v is not None}
    verdicts = {(r.sender, r.type): memo for r in records} if start % 2 else None
    assert (compiled.settled_until(records, start, compiled_scan.plain, passed, verdicts)
            == pure.settled_until(records, start, plain, passed, verdicts))
