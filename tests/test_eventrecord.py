"""Event records from ``persist_events`` items (``eventrecord``), on both core
implementations, and compiled against pure over generated items: the compiled twin
takes the usual items on a path of its own and must give what the pure definition
gives, record or error, for every item."""

from __future__ import annotations

import dataclasses
import gc
import sys
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep._pure.eventrecord import EventRecord
from streamrep.errors import InvalidEventError
from support.impls import core_module


@pytest.fixture
def eventrecord(impl_kind: str) -> ModuleType:
    return core_module("eventrecord", impl_kind)


def message(**changes: Any) -> dict[str, Any]:
    item = {"event_id": "$m", "room_id": "!r:x", "type": "m.room.message", "sender": "@a:x",
            "content": {"body": "hi"}, "prev_events": ["$p"], "depth": 7,
            "auth_events": ["$c"], "origin_server_ts": 5}
    item.update(changes)
    return {k: v for k, v in item.items() if v is not ...}


def test_a_usual_message_gives_its_record(eventrecord: ModuleType) -> None:
    record = eventrecord.parse_event(message(content={"body": "x", "m.relates_to": {
        "event_id": "$t", "rel_type": "m.thread"}}))
    assert (record.event_id, record.room_id, record.type, record.sender, record.depth,
            record.prev_events, record.state_key, record.relates_to) == (
        "$m", "!r:x", "m.room.message", "@a:x", 7, ["$p"], None, "$t")
    assert not (record.outlier or record.rejected or record.soft_failed)
    assert record.json.startswith(b'{"room_id":') and "event_id" not in record.body


def test_a_record_is_a_whole_event_record_holding_its_values_once(
        eventrecord: ModuleType) -> None:
    # The compiled twin fills a new record's slots in place, without its __init__.
    item = message()
    record = eventrecord.parse_event(item)
    assert type(record) is EventRecord and gc.is_tracked(record)
    assert dataclasses.replace(record) == record
    assert [getattr(record, f.name) for f in dataclasses.fields(EventRecord)] == [
        "$m", "!r:x", "m.room.message", "@a:x", 7, ["$p"], None, record.json, record.body,
        {"body": "hi"}, False, False, False, None, None, None]
    room_id, content = item["room_id"], item["content"]
    before = sys.getrefcount(room_id), sys.getrefcount(content)
    records = [eventrecord.parse_event(item) for _ in range(1000)]
    assert sys.getrefcount(content) - before[1] == 2000  # each record's body and content
    del records
    assert (sys.getrefcount(room_id), sys.getrefcount(content)) == before


def test_a_membership_event_gives_its_membership(eventrecord: ModuleType) -> None:
    record = eventrecord.parse_event(message(type="m.room.member", state_key="@a:x",
                                             content={"membership": "join"}))
    assert (record.state_key, record.membership) == ("@a:x", "join")


@pytest.mark.parametrize("item, error", [
    (message(depth=-1), "'depth' must be a non-negative integer"),
    (message(depth=2**62), "'depth' must be a non-negative integer"),
    (message(depth="7"), "'depth' must be a non-negative integer"),
    (message(prev_events=["$m"]), "lists itself in 'prev_events'"),
    (message(sender=""), "field 'sender' must be a non-empty string"),
    (message(room_id=...), "missing field 'room_id'"),
    (message(content=[]), "'content' must be an object"),
    (message(state_key=5), "'state_key' must be a string"),
    (message(type="m.room.member", state_key="@a:x", content={}), "m.room.member needs"),
    (message(type="m.room.redaction", content={}), "m.room.redaction needs 'redacts'"),
    (message(outlier="yes"), "flag 'outlier' must be a boolean"),
    (message(content={"x": {1, 2}}), "not serializable as JSON"),
])
def test_bad_items_get_their_errors(eventrecord: ModuleType, item: dict[str, Any],
                                    error: str) -> None:
    with pytest.raises(InvalidEventError, match=error):
        eventrecord.parse_event(item)


def test_the_other_items_are_records_too(eventrecord: ModuleType) -> None:
    merge = eventrecord.parse_event(message(prev_events=["$p", "$q", "$p"]))
    assert merge.prev_events == ["$p", "$q"]
    flagged = eventrecord.parse_event(message(outlier=True))
    assert flagged.outlier and b"outlier" not in flagged.json
    redaction = eventrecord.parse_event(message(type="m.room.redaction", redacts="$x"))
    assert redaction.redacts == "$x"
    raw = eventrecord.parse_event(("$b", b'{"room_id":"!r:x","type":"t","sender":"@a:x",'
                                         b'"prev_events":[],"depth":1}'))
    assert raw.json.startswith(b'{"room_id"') and raw.prev_events == []
    create = eventrecord.parse_event(message(event_id="$room", room_id=..., state_key="",
                                             type="m.room.create", prev_events=[]))
    assert create.room_id == "!room"


class Text(str):
    """A str subclass: valid, and not what the compiled path takes itself."""


#: Leave the field as :func:`message` has it (``...`` drops it).
KEEP = object()


def changed(**changes: Any) -> dict[str, Any]:
    return message(**{k: v for k, v in changes.items() if v is not KEEP})


def field(*others: Any) -> st.SearchStrategy[Any]:
    """Mostly the valid default, else one of *others*."""
    return st.one_of(st.just(KEEP), st.just(KEEP), st.just(KEEP), st.just(KEEP),
                     st.sampled_from(others))


relations = st.one_of(st.sampled_from(["$t", None]), st.fixed_dictionaries(
    {}, optional={"event_id": st.sampled_from(["$t", 1, Text("$t")])}))
contents = st.one_of(st.just(KEEP), st.just(KEEP), st.sampled_from([None, [], "x"]),
                     st.fixed_dictionaries({}, optional={
                         "body": st.just("hi"),
                         "membership": st.sampled_from(["join", "leave", "", 1, Text("join")]),
                         "redacts": st.sampled_from(["$x", 1]),
                         "m.relates_to": relations}))
items = st.builds(
    changed,
    event_id=field("$n", "", Text("$m"), 5),
    room_id=field(..., "", Text("!r:x"), None, 3),
    type=st.sampled_from(["m.room.message", "m.room.message", "m.room.member",
                          "m.room.redaction", "m.room.create", "", Text("t")]),
    sender=field("", Text("@a:x"), None),
    state_key=field(..., "", "@a:x", None, 5, Text("k")),
    content=contents,
    prev_events=st.one_of(st.just(KEEP), st.just(KEEP), st.lists(
        st.sampled_from(["$p", "$q", "$m", "", 3, Text("$p"), ["$p", {}]]), max_size=3)),
    depth=field(..., 0, 2**62 - 1, -1, 2**62, 2**70, "7", True, 1.0),
    redacts=field("$x", 3),
    outlier=field(True, False, 1),
    rejected=field(True),
    extra=field({1, 2}, "x"),
)


def _outcome(parse: Any, item: dict[str, Any]) -> Any:
    try:
        return parse(dict(item))
    except InvalidEventError as exc:
        return ("error", str(exc))


@pytest.mark.compiled_vs_pure
@settings(max_examples=600, deadline=None)
@given(item=items)
def test_compiled_and_pure_agree(item: dict[str, Any]) -> None:
    compiled, pure = core_module("eventrecord", "compiled"), core_module("eventrecord", "pure")
    assert _outcome(compiled.parse_event, item) == _outcome(pure.parse_event, item)


def test_a_batch_keeps_each_event_once(eventrecord: ModuleType) -> None:
    first, other = message(), message(event_id="$n", prev_events=["$m"])
    records = eventrecord.parse_batch([first, other, dict(first)])
    assert [r.event_id for r in records] == ["$m", "$n"]
    # Listed again as a non-outlier, an outlier joins the DAG.
    records = eventrecord.parse_batch(iter([message(outlier=True), first]))
    assert [(r.event_id, r.outlier) for r in records] == [("$m", False)]
    records = eventrecord.parse_batch([first, message(outlier=True)])
    assert [(r.event_id, r.outlier) for r in records] == [("$m", False)]
    assert eventrecord.parse_batch([]) == []


def test_a_batch_refuses_one_event_twice_with_other_json_and_a_lone_event(
        eventrecord: ModuleType) -> None:
    with pytest.raises(InvalidEventError, match="appears twice"):
        eventrecord.parse_batch([message(), message(depth=8)])
    for lone in (message(), b"{}", "$m"):
        with pytest.raises(InvalidEventError, match="takes a list"):
            eventrecord.parse_batch(lone)
    with pytest.raises(InvalidEventError):
        eventrecord.parse_batch([message(), message(event_id="")])


@pytest.mark.compiled_vs_pure
@settings(max_examples=200, deadline=None)
@given(batch=st.lists(items, max_size=4))
def test_compiled_and_pure_agree_on_batches(batch: list[dict[str, Any]]) -> None:
    compiled, pure = core_module("eventrecord", "compiled"), core_module("eventrecord", "pure")
    outcomes = []
    for parse_batch in (compiled.parse_batch, pure.parse_batch):
        try:
            outcomes.append(parse_batch([dict(item) for item in batch]))
        except InvalidEventError as exc:
            outcomes.append(("error", str(exc)))
    assert outcomes[0] == outcomes[1]
