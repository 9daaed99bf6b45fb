"""Property tests of the wire format: round-trips, compiled vs pure, and fuzzing."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrep import _impl
from streamrep.errors import ProtocolError
from support.impls import IMPLEMENTATIONS, core_module
from support.wire import describe, flatten, run_chunks

PURE = _impl.load_pure("wire")
BOTH = [core_module("wire", kind) for kind in IMPLEMENTATIONS]
# Compares the compiled core with its twin: not collected with STREAMREP_NO_EXTENSIONS=1.
needs_compiled = pytest.mark.compiled_vs_pure

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# Whole streams are costlier per example; fewer of them still cover every branch.
STREAM_SETTINGS = settings(SETTINGS, max_examples=60)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Any text except surrogates (not encodable as UTF-8).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
LINE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=20)
WORD = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters=" \n"), min_size=1, max_size=12
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)


def _commands(wire: ModuleType) -> st.SearchStrategy[Any]:
    text_commands = [
        cls for cls in wire.COMMANDS.values() if "data" in cls.FIELDS or cls.NAME == "CLEAR_USER_SYNC"
    ]
    return st.one_of(
        st.builds(wire.RdataCommand, WORD, WORD, st.none() | INT64, JSON),
        st.builds(wire.PositionCommand, WORD, WORD, INT64, INT64),
        st.builds(wire.ReplicateCommand),
        st.builds(wire.ReplicateCommand, WORD, st.none() | INT64),
        st.builds(
            wire.UserSyncCommand, WORD, WORD, st.none() | WORD.filter(lambda w: w != "None"),
            st.booleans(), INT64,
        ),
        st.builds(wire.FederationAckCommand, WORD, INT64),
        st.builds(wire.UserIpCommand, WORD, TEXT, TEXT, TEXT, st.none() | TEXT, INT64),
        st.builds(wire.LockReleasedCommand, TEXT, TEXT, TEXT),
        st.sampled_from(text_commands).flatmap(lambda cls: st.builds(cls, LINE_TEXT)),
    )


@pytest.mark.parametrize("wire", BOTH, ids=lambda m: m.__name__)
@SETTINGS
@given(data=st.data())
def test_built_commands_round_trip(wire: ModuleType, data: st.DataObject) -> None:
    command = data.draw(_commands(wire))
    line = command.to_bytes()
    assert b"\n" not in line
    assert line.startswith(command.NAME.encode())
    for parser in BOTH:
        parsed = parser.parse_line(line)
        assert parsed.to_bytes() == line
        assert type(parsed).__name__ == type(command).__name__
        for field in command.FIELDS:
            value = getattr(parsed, field)
            expected = getattr(command, field)
            if field == "row":
                # JSON has no tuples; floats and ints survive exactly.
                assert value == PURE.parse_line(line).row
                assert PURE.encode_row(value) == PURE.encode_row(expected)
            else:
                assert value == expected, field
    # JSON in a line is compact and ASCII-escaped.
    json_part = {"RDATA": 4, "USER_IP": 2, "LOCK_RELEASED": 1}.get(command.NAME)
    if json_part is not None:
        assert line.split(b" ", json_part)[-1].isascii()


@needs_compiled
@SETTINGS
@given(data=st.data())
def test_compiled_builds_what_pure_builds(data: st.DataObject) -> None:
    compiled = _impl.load_compiled("wire")
    command = data.draw(_commands(PURE))
    fields = {f: getattr(command, f) for f in command.FIELDS}
    twin = compiled.COMMANDS[command.NAME](**fields)
    assert twin.to_bytes() == command.to_bytes()
    assert describe(twin) == describe(command)


# Lines close to valid ones, to reach every error branch of the parsers.
NAMES = st.sampled_from(sorted(PURE.COMMANDS) + ["", "FOO", "rdata", "PING\r", "P\xffNG"])
PIECES = st.sampled_from(
    [
        "events", "master", "batch", "NOW", "ALL", "None", "start", "end", "0", "-0", "01",
        "-1", "42", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
        "[]", "[1,2]", '["a", null]', "[NaN]", "[1e400]", '{"a":1}', '["t","ip","ua",null,5]',
        '["t","ip","ua","d",true]', '["w","n","k"]', "[", "", " ", "\r", "é", "\xff",
    ]
)
NEAR_LINES = st.builds(
    lambda name, parts, sep: (name + sep + " ".join(parts)).encode("utf-8", "surrogateescape"),
    NAMES,
    st.lists(PIECES, max_size=6),
    st.sampled_from([" ", "", "  "]),
)
NOISE_LINES = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" "))


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[bytes], int]:
    """A byte stream of valid, nearly valid and noisy lines, and a chunking of it."""
    valid = _commands(PURE).map(lambda c: c.to_bytes())
    lines = draw(st.lists(st.one_of(valid, NEAR_LINES, NOISE_LINES, st.just(b"")), max_size=12))
    stream = b"".join(line + b"\n" for line in lines) + draw(st.sampled_from([b"", b"PING tail"]))
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    limit = draw(st.sampled_from([8, 30, 64, 16384]))
    return stream, chunks, limit


@needs_compiled
@STREAM_SETTINGS
@given(case=streams())
def test_compiled_and_pure_decoders_agree(case: tuple[bytes, list[bytes], int]) -> None:
    stream, chunks, limit = case
    compiled = _impl.load_compiled("wire")
    outcome = run_chunks(compiled, chunks, limit)
    assert outcome == run_chunks(PURE, chunks, limit)
    # However the stream is cut, the same commands and errors come out in order.
    assert flatten(outcome) == flatten(run_chunks(PURE, [stream], limit))


@pytest.mark.parametrize("wire", BOTH, ids=lambda m: m.__name__)
@STREAM_SETTINGS
@given(case=streams())
def test_decoder_chunking_does_not_matter(wire: ModuleType, case: tuple[bytes, list[bytes], int]) -> None:
    stream, chunks, limit = case
    whole = flatten(run_chunks(wire, [stream], limit))
    assert flatten(run_chunks(wire, chunks, limit)) == whole
    single_bytes = [stream[i : i + 1] for i in range(min(len(stream), 400))]
    partial = flatten(run_chunks(wire, single_bytes, limit))
    if len(stream) <= 400:
        assert partial == whole


@needs_compiled
@SETTINGS
@given(line=st.one_of(NEAR_LINES, NOISE_LINES))
def test_parse_line_agrees(line: bytes) -> None:
    results = []
    for wire in BOTH:
        try:
            results.append(("ok", describe(wire.parse_line(line))))
        except ProtocolError as exc:
            results.append(("error", type(exc).__name__, str(exc)))
    assert results[0] == results[1]


FUZZ_BYTES = st.binary(max_size=300) | st.lists(
    st.sampled_from([b"\n", b" ", b"RDATA", b"PING", b"POSITION", b"1", b"[", b"]", b"\xff", b"x" * 40]),
    max_size=60,
).map(b"".join)


@pytest.mark.parametrize("wire", BOTH, ids=lambda m: m.__name__)
@settings(max_examples=300, deadline=None)
@given(data=FUZZ_BYTES, cuts=st.lists(st.integers(0, 300), max_size=6), limit=st.sampled_from([1, 16, 100]))
def test_fuzz_decoder(wire: ModuleType, data: bytes, cuts: list[int], limit: int) -> None:
    decoder = wire.Decoder(limit)
    points = sorted(min(c, len(data)) for c in cuts)
    for a, b in zip([0] + points, points + [len(data)]):
        try:
            commands = decoder.feed(data[a:b])
        except ProtocolError as exc:
            commands = list(exc.commands)
            assert all(isinstance(e, ProtocolError) for e in exc.errors)
            assert all(len(str(e)) < 200 and "\n" not in str(e) for e in exc.errors)
        assert all(isinstance(c, wire.Command) for c in commands)
        for command in commands:
            assert len(command.to_bytes()) <= limit
        assert decoder.buffered <= limit


def _row_spellings(value: Any) -> list[bytes]:
    import json

    import orjson

    return [
        PURE.encode_row(value),  # compact, ASCII-escaped: what streamrep writes
        orjson.dumps(value),  # compact, raw UTF-8
        json.dumps(value, allow_nan=False).encode(),  # spaced, as other writers send
    ]


@pytest.mark.parametrize("wire", BOTH, ids=lambda m: m.__name__)
@SETTINGS
@given(value=JSON, garble=st.none() | st.tuples(st.integers(0, 200), st.binary(max_size=3)))
def test_rows_decode_like_orjson(wire: ModuleType, value: Any, garble: Any) -> None:
    import orjson

    for spelling in _row_spellings(value):
        if garble is not None:
            at = min(garble[0], len(spelling))
            spelling = (spelling[:at] + garble[1] + spelling[at:]).replace(b"\n", b"")
            spelling = spelling or b"0"
        command = wire.parse_line(b"RDATA s m 1 " + spelling) if _utf8(spelling) else None
        if command is None:
            continue
        try:
            expected: Any = ("ok", orjson.loads(spelling))
        except orjson.JSONDecodeError:
            expected = ("error",)
        try:
            got: Any = ("ok", command.row)
        except ProtocolError:
            got = ("error",)
        assert got == expected
        if got[0] == "ok":
            assert _same_types(got[1], expected[1])


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _same_types(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return all(_same_types(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return all(_same_types(a[k], b[k]) for k in a)
    return True
