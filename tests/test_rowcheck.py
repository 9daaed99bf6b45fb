"""The row-shape check, on both core implementations, and compiled against pure."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.impls import core_module

PURE = core_module("rowcheck", "pure")

RECEIPTS = [("room_id", "string"), ("receipt_type", "string"), ("user_id", "string"),
            ("event_id", "string"), ("thread_id", "string|null"), ("data", "object")]
EVENTS = {
    "ev": [("event_id", "string"), ("room_id", "string"), ("type", "string"),
           ("state_key", "string|null"), ("redacts", "string|null"),
           ("relates_to", "string|null"), ("membership", "string|null"),
           ("rejected", "flag"), ("outlier", "flag")],
    "state": [("room_id", "string"), ("type", "string"), ("state_key", "string"),
              ("event_id", "string|null")],
    "state-all": [("room_id", "string")],
}
CACHES = [("cache_func", "string"), ("keys", "array|null"), ("invalidation_ts", "integer")]
TYPING = [("room_id", "string"), ("user_ids", "string[]")]
PRESENCE = [("user_id", "string"), ("state", "string"), ("last_active_ts", "integer"),
            ("status_msg", "string|null"), ("currently_active", "flag")]
PUSHERS = [("user_id", "string"), ("app_id", "string"), ("pushkey", "string"),
           ("deleted", "boolean")]
ANY = [("anything", "any"), ("list", "array")]


@pytest.fixture
def rowcheck(impl_kind: str) -> ModuleType:
    return core_module("rowcheck", impl_kind)


def shapes(mod: ModuleType) -> dict[str, Any]:
    return {
        "receipts": mod.RowShape("receipts", RECEIPTS),
        "events": mod.RowShape("events", variants=EVENTS),
        "caches": mod.RowShape("caches", CACHES),
        "typing": mod.RowShape("typing", TYPING),
        "presence": mod.RowShape("presence", PRESENCE),
        "pushers": mod.RowShape("pushers", PUSHERS),
        "any": mod.RowShape("any", ANY),
        "empty": mod.RowShape("empty", []),
    }


GOOD = [
    ("receipts", b'["!r:hs","m.read","@u:hs","$e:hs",null,{"ts":1}]'),
    ("receipts", b'["!r:hs","m.read","@u:hs","$e:hs","$t",{}]'),
    ("receipts", b'[ "!r:hs", "m.read", "@u:hs", "$e:hs", null, {"ts": 1.5} ]'),
    ("receipts", '["!r\u00e9","m.read","@u","$e",null,{"k":"\\n"}]'.encode()),
    ("events", b'["ev",["$a","!r","m.room.member","@u",null,null,"join",false,true]]'),
    # A flag as the reference sends it from SQLite (0 or 1) and from PostgreSQL.
    ("events", b'["ev",["$a","!r","m.room.message",null,null,null,null,0,0]]'),
    ("events", b'["ev",["$a","!r","m.room.member","@u",null,null,"join",1,false]]'),
    ("events", b'["ev", ["$a", "!r", "m.room.message", null, null, null, null, true, 1]]'),
    ("events", b'["state",["!r","m.room.topic","",null]]'),
    ("events", b'["state-all",["!r"]]'),
    ("caches", b'["get_event",null,1700000000000]'),
    ("caches", b'["cs_cache_fake",["!r",["nested",{"a":[1]}],-3],0]'),
    ("caches", b'["x",[],12345678901234567890]'),
    ("typing", b'["!r",[]]'),
    ("typing", b'["!r",["@a","@b"]]'),
    ("presence", b'["@u","online",1700000000000,null,1]'),
    ("presence", b'["@u","offline",0,"away",0]'),
    ("presence", b'["@u","online",0,"",true]'),
    ("pushers", b'["@u","m.http","key",false]'),
    ("any", b'[{"a":[null,true,1]},[[]]]'),
    ("empty", b'[]'),
]

BAD = [
    ("receipts", b'["!r:hs","m.read","@u:hs","$e:hs",null]',
     "receipts row has 5 fields, expected 6 (room_id, receipt_type, user_id, event_id, "
     "thread_id, data)"),
    ("receipts", b'["!r:hs","m.read","@u:hs","$e:hs",null,[]]',
     "receipts row field 5 (data) must be an object, not an array"),
    ("receipts", b'["!r:hs","m.read","@u:hs",7,null,{}]',
     "receipts row field 3 (event_id) must be a string, not an integer"),
    ("receipts", b'{"room_id":"!r"}', "receipts row must be a JSON array, not an object"),
    ("receipts", b'["!r:hs",', "receipts row is not valid JSON"),
    ("receipts", b'["a","b","c","d",null,{}] x', "receipts row is not valid JSON"),
    ("events", b'["ev",["$a","!r"]]',
     "events ev row has 2 fields, expected 9 (event_id, room_id, type, state_key, redacts, "
     "relates_to, membership, rejected, outlier)"),
    ("events", b'["ev",["$a","!r","t",null,null,null,null,2,false]]',
     "events ev row field 7 (rejected) must be a boolean or the integer 0 or 1, not 2"),
    ("events", b'["ev",["$a","!r","t",null,null,null,null,false,-1]]',
     "events ev row field 8 (outlier) must be a boolean or the integer 0 or 1, not -1"),
    ("events", b'["ev",["$a","!r","t",null,null,null,null,false,10]]',
     "events ev row field 8 (outlier) must be a boolean or the integer 0 or 1, not 10"),
    ("events", b'["ev",["$a","!r","t",null,null,null,null,1.0,false]]',
     "events ev row field 7 (rejected) must be a boolean or the integer 0 or 1, not a number"),
    ("events", b'["ev",["$a","!r","t",null,null,null,null,"1",false]]',
     "events ev row field 7 (rejected) must be a boolean or the integer 0 or 1, not a string"),
    ("events", b'["ev",["$a","!r","t",null,null,null,null,null,false]]',
     "events ev row field 7 (rejected) must be a boolean or the integer 0 or 1, not null"),
    ("presence", b'["@u","online",1,null,[1]]',
     "presence row field 4 (currently_active) must be a boolean or the integer 0 or 1, "
     "not an array"),
    # A field the reference always sends as a boolean takes no integer.
    ("pushers", b'["@u","m.http","key",0]',
     "pushers row field 3 (deleted) must be a boolean, not an integer"),
    ("events", b'["bogus",[]]',
     "events row kind 'bogus' is unknown (known: ev, state, state-all)"),
    ("events", b'[1,[]]', "events row field 0 (kind) must be a string, not an integer"),
    ("events", b'["state-all",["!r"],1]', "events row has 3 fields, expected 2 (kind, data)"),
    ("events", b'["state-all","!r"]', "events state-all row must be a JSON array, not a string"),
    ("caches", b'["get_event",null,"17"]',
     "caches row field 2 (invalidation_ts) must be an integer, not a string"),
    ("caches", b'["get_event",null,1.0]',
     "caches row field 2 (invalidation_ts) must be an integer, not a number"),
    ("caches", b'["get_event",null,true]',
     "caches row field 2 (invalidation_ts) must be an integer, not a boolean"),
    ("caches", b'["get_event",{},1]',
     "caches row field 1 (keys) must be an array or null, not an object"),
    ("typing", b'["!r",["@a",null]]',
     "typing row field 1 (user_ids) must be an array of strings, but item 1 is null"),
    ("typing", b'["!r",null]', "typing row field 1 (user_ids) must be an array of strings, "
                               "not null"),
    ("empty", b'[1]', "empty row has 1 fields, expected 0 ()"),
]


@pytest.mark.parametrize(("stream", "row"), GOOD)
def test_accepts_rows_of_the_shape(rowcheck: ModuleType, stream: str, row: bytes) -> None:
    assert rowcheck.check_row(shapes(rowcheck)[stream], row) is None


@pytest.mark.parametrize(("stream", "row", "error"), BAD)
def test_names_what_is_wrong(rowcheck: ModuleType, stream: str, row: bytes,
                             error: str) -> None:
    assert rowcheck.check_row(shapes(rowcheck)[stream], row) == error


def test_takes_any_bytes_like_and_commands(rowcheck: ModuleType) -> None:
    shape = rowcheck.RowShape("typing", TYPING)
    assert rowcheck.check_row(shape, bytearray(b'["!r",[]]')) is None
    assert rowcheck.check_row(shape, memoryview(b'["!r",[1]]')) is not None

    class Command:
        def __init__(self, row_json: bytes) -> None:
            self.row_json = row_json

    good, bad = Command(b'["!r",[]]'), Command(b'["!r"]')
    assert rowcheck.check_rows(shape, [good, good]) is None
    assert rowcheck.check_rows(shape, [good, bad, good]) == (
        "typing row has 1 fields, expected 2 (room_id, user_ids)")


def test_refuses_bad_declarations(rowcheck: ModuleType) -> None:
    with pytest.raises(ValueError, match="unknown kind 'text'"):
        rowcheck.RowShape("s", [("a", "text")])
    with pytest.raises(ValueError, match="fields or variants"):
        rowcheck.RowShape("s", [("a", "string")], variants={"x": []})
    with pytest.raises(ValueError, match="at least one variant"):
        rowcheck.RowShape("s", variants={})
    shape = rowcheck.RowShape("events", variants=EVENTS)
    assert shape.fields == () and sorted(shape.variants) == ["ev", "state", "state-all"]
    assert shape.variants["state"].name == "events state"


# Values on both sides of the in-place check: compact ASCII, escapes, non-ASCII,
# floats, huge integers, whitespace, deep nesting.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.integers(-2, 11)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "!r:hs", "@u", "ev", "state", "state-all", "m.read", "\u00e9", "a\"b"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["a", "ts", "\u00e9"]), inner, max_size=3),
    max_leaves=12,
)


def _encode(value: Any, spaced: bool) -> bytes:
    # Compact with raw UTF-8 (as the project writes rows), or spaced with \u escapes.
    if spaced:
        return json.dumps(value, indent=1).replace("\n", " ").encode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.compiled_vs_pure
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.sampled_from(["receipts", "events", "caches", "typing", "presence", "pushers",
                                "any", "empty"]),
       row=st.one_of(
           JSON_VALUES.map(lambda v: (v, False)),
           st.lists(JSON_VALUES, max_size=7).map(lambda v: (v, False)),
           st.tuples(st.sampled_from(["ev", "state", "state-all", "x"]),
                     st.lists(JSON_VALUES, max_size=9)).map(lambda v: (list(v), False)),
           st.lists(JSON_VALUES, max_size=7).map(lambda v: (v, True)),
       ),
       cut=st.integers(0, 3))
def test_compiled_checks_as_pure_does(stream: str, row: tuple[Any, bool], cut: int) -> None:
    compiled = core_module("rowcheck", "compiled")
    data = _encode(*row)
    if cut:
        data = data[:-cut]  # truncated: mostly not JSON any more
    assert (compiled.check_row(shapes(compiled)[stream], data)
            == PURE.check_row(shapes(PURE)[stream], data))


@pytest.mark.compiled_vs_pure
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.tuples(
    st.sampled_from(["!r", "\u00e9", "a\"b"]), st.sampled_from(["m.read", "x"]),
    st.sampled_from(["@u", ""]), st.sampled_from(["$e", "$f"]),
    st.none() | st.sampled_from(["$t"]), st.dictionaries(st.sampled_from(["ts"]),
                                                          st.integers(0, 2**40))))
def test_compiled_accepts_well_formed_receipts_as_pure_does(values: tuple[Any, ...]) -> None:
    compiled = core_module("rowcheck", "compiled")
    data = orjson.dumps(list(values))
    assert compiled.check_row(shapes(compiled)["receipts"], data) is None
    assert PURE.check_row(shapes(PURE)["receipts"], data) is None


@pytest.mark.compiled_vs_pure
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flag=st.booleans() | st.integers(-(2**70), 2**70) | st.integers(-3, 12) | st.none()
       | st.floats(-2, 2) | st.sampled_from(["0", "1", "true", [], {}, [1]]),
       spaced=st.booleans())
def test_a_flag_is_a_boolean_or_0_or_1_on_both(flag: Any, spaced: bool) -> None:
    data = _encode(["@u", "online", 5, None, flag], spaced)
    compiled = core_module("rowcheck", "compiled")
    answer = PURE.check_row(shapes(PURE)["presence"], data)
    assert compiled.check_row(shapes(compiled)["presence"], data) == answer
    if type(flag) is bool or (type(flag) is int and flag in (0, 1)):
        assert answer is None
    else:
        assert answer is not None and answer.startswith(
            "presence row field 4 (currently_active) must be a boolean or the integer 0 or 1, not ")


@pytest.mark.compiled_vs_pure
def test_compiled_checks_compact_rows_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact rows that fit never reach the decoder (the twin explains the rest)."""
    compiled = core_module("rowcheck", "compiled")
    compiled_shapes = shapes(compiled)

    class Unreachable:
        @staticmethod
        def check_row(shape: Any, row_json: bytes) -> str | None:
            raise AssertionError(f"decoded {row_json!r}")

    monkeypatch.setattr(compiled, "_ref", Unreachable)
    in_place = [(s, r) for s, r in GOOD if b" " not in r and r.isascii() and b"\\" not in r
                and b"12345678901234567890" not in r]
    assert len(in_place) >= 10
    for stream, row in in_place:
        assert compiled.check_row(compiled_shapes[stream], row) is None
    with pytest.raises(AssertionError, match="decoded"):
        compiled.check_row(compiled_shapes["typing"], b'["!r",[1]]')


def test_rows_of_decoded_rdata_lines(rowcheck: ModuleType, impl_kind: str) -> None:
    """Decoded RDATA commands (checked inside their lines on the compiled core)
    get the same answers as their rows alone, spaces and escapes included."""
    wire = core_module("wire", impl_kind)
    mod_shapes = shapes(rowcheck)
    for stream, row in GOOD:
        line = b"RDATA %s writer1 batch %s\n" % (stream.encode(), row)
        commands = wire.Decoder().feed(line + line.replace(b"batch", b"7"))
        assert rowcheck.check_rows(mod_shapes[stream], commands) is None, row
    for stream, row, message in BAD:
        good_row = next(r for s, r in GOOD if s == stream)
        lines = b"".join(b"RDATA %s writer1 batch %s\n" % (stream.encode(), r) for r in (good_row, row))
        commands = wire.Decoder().feed(lines)
        assert rowcheck.check_rows(mod_shapes[stream], commands) == message
