"""Grouping decoded RDATA per fact (``group_rdata``) and decoding rows in bulk
(``rdata_rows``), over the compiled core and its pure twin."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrep import _impl
from streamrep.errors import MalformedCommandError
from support.impls import core_module


@pytest.fixture
def wire(impl_kind: str) -> ModuleType:
    return core_module("wire", impl_kind)


def _decode(wire: ModuleType, data: bytes) -> list[Any]:
    return list(wire.Decoder().feed(data))


def _shape(items: list[Any]) -> list[Any]:
    """Items as comparable plain values (runs as tuples of lines)."""
    out: list[Any] = []
    for item in items:
        if type(item) is tuple:
            stream, instance, token, commands = item
            out.append((stream, instance, token, [c.to_bytes() for c in commands]))
        else:
            out.append(item.to_bytes())
    return out


def test_runs_end_at_each_fact(wire: ModuleType) -> None:
    data = (
        b"PING 1\n"
        b'RDATA events w1 batch ["a"]\n'
        b'RDATA events w1 batch ["b"]\n'
        b'RDATA events w1 5 ["c"]\n'
        b'RDATA events w1 6 ["d"]\n'
        b"POSITION events w1 6 7\n"
    )
    assert _shape(wire.group_rdata(_decode(wire, data))) == [
        b"PING 1",
        ("events", "w1", 5, [b'RDATA events w1 batch ["a"]', b'RDATA events w1 batch ["b"]',
                             b'RDATA events w1 5 ["c"]']),
        ("events", "w1", 6, [b'RDATA events w1 6 ["d"]']),
        b"POSITION events w1 6 7",
    ]


def test_interrupted_and_unfinished_runs_have_no_token(wire: ModuleType) -> None:
    data = (
        b'RDATA events w1 batch ["a"]\n'
        b'RDATA events w2 3 ["x"]\n'  # another writer interrupts w1's fact
        b'RDATA events w1 batch ["b"]\n'
        b"PING 1\n"  # so does another command
        b'RDATA caches w1 batch ["c"]\n'  # same writer name, another stream
        b'RDATA events w1 batch ["d"]\n'  # the chunk ends mid-fact
    )
    assert _shape(wire.group_rdata(_decode(wire, data))) == [
        ("events", "w1", None, [b'RDATA events w1 batch ["a"]']),
        ("events", "w2", 3, [b'RDATA events w2 3 ["x"]']),
        ("events", "w1", None, [b'RDATA events w1 batch ["b"]']),
        b"PING 1",
        ("caches", "w1", None, [b'RDATA caches w1 batch ["c"]']),
        ("events", "w1", None, [b'RDATA events w1 batch ["d"]']),
    ]


def test_group_of_nothing(wire: ModuleType) -> None:
    assert wire.group_rdata([]) == []


def test_rdata_rows_decodes_in_order(wire: ModuleType) -> None:
    commands = _decode(wire, b'RDATA s w batch ["a",1]\nRDATA s w 2 {"k":[null,true,2.5]}\n')
    assert wire.rdata_rows(commands) == [["a", 1], {"k": [None, True, 2.5]}]
    # Rows built from values come back as those values.
    built = wire.RdataCommand("s", "w", 3, ["x"])
    assert wire.rdata_rows([built]) == [["x"]]


def test_rdata_rows_rejects_bad_json_and_other_commands(wire: ModuleType) -> None:
    commands = _decode(wire, b'RDATA s w batch ["a"]\nRDATA s w 2 [1, oops]\n')
    with pytest.raises(MalformedCommandError, match="not valid JSON"):
        wire.rdata_rows(commands)
    with pytest.raises(TypeError):
        wire.rdata_rows([wire.PingCommand("1")])


PURE = _impl.load_pure("wire")
WORDS = st.sampled_from(["events", "caches", "w1", "w2"])
LINES = st.one_of(
    st.tuples(WORDS, WORDS, st.one_of(st.none(), st.integers(0, 9)), st.integers(0, 99)).map(
        lambda t: b"RDATA %s %s %s [%d]" % (t[0].encode(), t[1].encode(),
                                           b"batch" if t[2] is None else b"%d" % t[2], t[3])
    ),
    st.integers(0, 9).map(lambda n: b"PING %d" % n),
    st.integers(0, 9).map(lambda n: b"POSITION events w1 %d %d" % (n, n + 1)),
)


@pytest.mark.compiled_vs_pure
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINES, max_size=30))
def test_compiled_groups_as_pure_does(lines: list[bytes]) -> None:
    compiled = core_module("wire", "compiled")
    data = b"".join(line + b"\n" for line in lines)
    expected = _shape(PURE.group_rdata(_decode(PURE, data)))
    assert _shape(compiled.group_rdata(_decode(compiled, data))) == expected
    # Concatenating the runs gives back every command, in order.
    flat: list[bytes] = []
    for item in expected:
        flat.extend(item[3] if type(item) is tuple else [item])
    assert flat == lines


def test_encode_rdata_rows_marks_batches_and_decodes_back(wire: ModuleType) -> None:
    rows = [(5, b'["a"]'), (5, b'["b"]'), (6, b"{}"), (9, b"[1,2]"), (9, b"null")]
    data = wire.encode_rdata_rows("events", "w1", rows)
    assert data == (
        b'RDATA events w1 batch ["a"]\n'
        b'RDATA events w1 5 ["b"]\n'
        b"RDATA events w1 6 {}\n"
        b"RDATA events w1 batch [1,2]\n"
        b"RDATA events w1 9 null\n"
    )
    runs = wire.group_rdata(_decode(wire, data))
    assert [(t, wire.rdata_rows(c)) for _s, _i, t, c in runs] == [
        (5, [["a"], ["b"]]), (6, [{}]), (9, [[1, 2], None])]
    assert wire.encode_rdata_rows("events", "w1", []) == b""


@pytest.mark.parametrize(
    "stream, rows, error",
    [
        ("events", [(1, b"")], ValueError),
        ("events", [(1, b"[1]\n[2]")], ValueError),
        ("events", [("1", b"[1]")], TypeError),
        ("events", [(2**63, b"[1]")], ValueError),
        ("events", [(1, "[1]")], TypeError),
        ("two words", [(1, b"[1]")], ValueError),
    ],
)
def test_encode_rdata_rows_refuses_what_cannot_be_a_line(
    wire: ModuleType, stream: str, rows: list[Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        wire.encode_rdata_rows(stream, "w1", rows)


@pytest.mark.compiled_vs_pure
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1),
                               st.binary(min_size=1, max_size=8).filter(lambda b: b"\n" not in b)),
                     max_size=20).map(lambda rows: sorted(rows, key=lambda r: r[0])))
def test_compiled_encodes_rdata_rows_as_pure_does(rows: list[tuple[int, bytes]]) -> None:
    compiled = core_module("wire", "compiled")
    assert compiled.encode_rdata_rows("s", "w", rows) == PURE.encode_rdata_rows("s", "w", rows)


# Rows on either side of the line between the in-place check and the decoder:
# compact ASCII, then escapes, non-ASCII, floats, big numbers, depth, whitespace.
ROW_CASES = [
    b'[]', b'{}', b'[1,-2,"a",null,true,false]', b'{"a":{"b":[{"c":[]}]}}',
    b'123456789012345678', b'-0', b'"x"', b'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]',
    b'"\\u00e9\\n"', '"\u00e9"'.encode(), b'[1.5,2e3]', b'12345678901234567890', b'[ 1 ]',
    b'{"a" : 1}',
    b'', b'[', b'[1,]', b'{"a"}', b'{1:2}', b'[01]', b'nul', b'[1]x', b'"unterminated',
    b'[NaN]', b'[Infinity]', b'-', b'[tru]', b'{"a":1,}', b'"\\x"', b'"\\ud800"',
]


def test_validate_rows_accepts_exactly_what_rdata_rows_decodes(wire: ModuleType) -> None:
    for row in ROW_CASES:
        line = b"RDATA s w 1 " + row + b"\n"
        try:
            commands = _decode(wire, line)
        except MalformedCommandError:
            continue  # not even a line (the row is empty): nothing to relay
        try:
            wire.rdata_rows(_decode(wire, line))
            valid = True
        except MalformedCommandError:
            valid = False
        if valid:
            assert wire.validate_rows(commands) is None, row
        else:
            with pytest.raises(MalformedCommandError, match="not valid JSON"):
                wire.validate_rows(commands)
    with pytest.raises(TypeError):
        wire.validate_rows([wire.PingCommand("1")])
    # What was decoded already is not checked again.
    built = wire.RdataCommand("s", "w", 3, ["x"])
    wire.validate_rows([built])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=12,
)


@pytest.mark.compiled_vs_pure
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON_VALUES, cut=st.integers(0, 40), junk=st.sampled_from([b"", b"]", b",", b"x", b"}"]))
def test_compiled_validates_rows_as_pure_does(value: Any, cut: int, junk: bytes) -> None:
    import json

    compiled = core_module("wire", "compiled")
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    # Whole rows, and rows cut short or with a stray byte added (mostly invalid).
    for row in (text, text[:cut] + junk):
        if not row or b"\n" in row:
            continue
        line = b"RDATA s w 1 " + row + b"\n"
        verdicts = []
        for wire in (PURE, compiled):
            try:
                wire.validate_rows(_decode(wire, line))
                verdicts.append(True)
            except MalformedCommandError:
                verdicts.append(False)
        assert verdicts[0] == verdicts[1], row
