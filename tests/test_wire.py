"""The replication wire format, over the compiled core and its pure twin."""

from __future__ import annotations

import pickle
from types import ModuleType
from typing import Any

import pytest

import streamrep.wire
from streamrep import _impl
from streamrep.errors import (
    LineTooLongError,
    MalformedCommandError,
    ProtocolError,
    UnknownCommandError,
)
from support.impls import core_module
from support.wire import describe


@pytest.fixture
def wire(impl_kind: str) -> ModuleType:
    return core_module("wire", impl_kind)


# Every example line of the current protocol document, with the wrapped RDATA
# line joined back together.
DOCUMENT_LINES = [
    "SERVER example.com",
    "REPLICATE",
    "POSITION events master 53 53",
    'RDATA events master 54 ["$foo1:bar.com", ...]',
    'RDATA events master 55 ["$foo4:bar.com", ...]',
    "SERVER localhost:8823",
    "PING 1490197665618",
    "NAME synapse.app.appservice",
    "POSITION backfill master 1 1",
    "POSITION events master 1 1",
    "POSITION caches master 1 1",
    'RDATA caches master 2 ["get_user_by_id",["@01register-user:localhost:8823"],1490197670513]',
    'RDATA events master 14 ["$149019767112vOHxz:localhost:8823",'
    '"!AFDCvgApUmpdfVjIXm:localhost:8823","m.room.guest_access","",null]',
    "PING 1490197675618",
    "ERROR server stopping",
    'RDATA caches master batch ["get_user_by_id",["@test:localhost:8823"],1490197670513]',
    'RDATA caches master batch ["get_user_by_id",["@test2:localhost:8823"],1490197670513]',
    'RDATA caches master batch ["get_user_by_id",["@test3:localhost:8823"],1490197670513]',
    'RDATA caches master 54 ["get_user_by_id",["@test4:localhost:8823"],1490197670513]',
    'RDATA caches master 550953771 ["get_user_by_id", ["@bob:example.com"], 1550574873251]',
    'RDATA caches master 550953772 ["get_user_by_id", null, 1550574873252]',
]

# The valid forms of the legacy document that the current protocol still speaks.
LEGACY_LINES = [
    "SERVER localhost:8823",
    "PING 1490197665618",
    "REPLICATE events 53",
    "REPLICATE ALL NOW",
    "REPLICATE events NOW",
    "REPLICATE caches 1",
    "ERROR server stopping",
]

# Lines of every command in its canonical form: building the command from its
# parsed fields gives the same line again.
CANONICAL_LINES = [
    "SERVER localhost:8823",
    "SERVER",
    "ERROR server stopping",
    "PING 1490197665618",
    "NAME synapse.app.generic_worker",
    "REPLICATE",
    "REPLICATE ALL NOW",
    "REPLICATE events 53",
    "POSITION events master 1 1",
    "POSITION events worker1 -5 9223372036854775807",
    'RDATA caches master 2 ["get_user_by_id",["@u:hs"],1490197670513]',
    'RDATA caches master batch ["get_user_by_id",null,1]',
    'RDATA events master 7 ["ev",["$e:hs","!r:hs","m.room.member","@u:hs",null,null,"join",false,false]]',
    "RDATA typing master 3 {\"room_id\":\"!r:hs\",\"user_ids\":[\"@a b:hs\"]}",
    "USER_SYNC worker1 @alice:hs DEVICE start 1490197670513",
    "USER_SYNC worker1 @alice:hs None end 0",
    "CLEAR_USER_SYNC worker1",
    "FEDERATION_ACK federation_sender1 42",
    'USER_IP @alice:hs ["syt_token","10.0.0.1","Mozilla/5.0 (X11; Linux)","DEV",1490197670513]',
    'USER_IP @alice:hs ["t","::1","curl",null,5]',
    "REMOTE_SERVER_UP remote.example.org",
    'LOCK_RELEASED ["worker1","purge_room","!room:hs"]',
    "NEW_ACTIVE_TASK abcdef",
    "CANCEL_TASK abcdef",
]


def test_public_module_reexports_the_selected_implementation() -> None:
    selected = _impl.load("wire")
    assert streamrep.wire.parse_line is selected.parse_line
    assert streamrep.wire.Decoder is selected.Decoder
    assert streamrep.wire.COMPILED == _impl.is_compiled(selected)
    assert streamrep.wire.UnknownCommandError is UnknownCommandError


def test_commands_map(wire: ModuleType) -> None:
    assert sorted(wire.COMMANDS) == sorted(
        [
            "SERVER", "RDATA", "POSITION", "ERROR", "PING", "NAME", "REPLICATE",
            "USER_SYNC", "CLEAR_USER_SYNC", "FEDERATION_ACK", "USER_IP",
            "REMOTE_SERVER_UP", "LOCK_RELEASED", "NEW_ACTIVE_TASK", "CANCEL_TASK",
            "AUTH_CHALLENGE", "AUTH_RESPONSE", "AUTH_OK",
        ]
    )
    for name, cls in wire.COMMANDS.items():
        assert cls.NAME == name
        assert issubclass(cls, wire.Command)


@pytest.mark.parametrize("line", DOCUMENT_LINES + LEGACY_LINES + CANONICAL_LINES)
def test_lines_round_trip(wire: ModuleType, line: str) -> None:
    command = wire.parse_line(line)
    assert command.NAME == line.split(" ", 1)[0]
    assert command.to_line() == line
    assert command.to_bytes() == line.encode()
    assert wire.parse_line(line.encode()) == command
    assert wire.parse_line(memoryview(line.encode())) == command
    encoder = wire.Encoder()
    encoder.encode(command)
    assert encoder.take() == line.encode() + b"\n"


@pytest.mark.parametrize("line", CANONICAL_LINES)
def test_canonical_lines_rebuild_from_fields(wire: ModuleType, line: str) -> None:
    command = wire.parse_line(line)
    fields = {name: getattr(command, name) for name in command.FIELDS}
    rebuilt = type(command)(**fields)
    assert rebuilt.to_line() == line
    assert rebuilt == command
    assert hash(rebuilt) == hash(command)


def test_document_rows(wire: ModuleType) -> None:
    cmd = wire.parse_line(DOCUMENT_LINES[12])
    assert cmd.row == [
        "$149019767112vOHxz:localhost:8823",
        "!AFDCvgApUmpdfVjIXm:localhost:8823",
        "m.room.guest_access",
        "",
        None,
    ]
    # Rows from other writers may carry spaces after separators: still valid JSON.
    spaced = wire.parse_line(DOCUMENT_LINES[-2])
    assert spaced.row == ["get_user_by_id", ["@bob:example.com"], 1550574873251]
    assert wire.parse_line(DOCUMENT_LINES[-1]).row == ["get_user_by_id", None, 1550574873252]
    # The document's elided rows parse (rows are decoded lazily) but are not JSON.
    elided = wire.parse_line(DOCUMENT_LINES[3])
    assert (elided.stream_name, elided.token) == ("events", 54)
    with pytest.raises(MalformedCommandError, match="RDATA row is not valid JSON"):
        elided.row


def test_rdata_fields(wire: ModuleType) -> None:
    cmd = wire.parse_line('RDATA events master 54 ["$a:hs","!r:hs",null, "x y"]')
    assert isinstance(cmd, wire.RdataCommand)
    assert cmd.stream_name == "events"
    assert cmd.instance_name == "master"
    assert cmd.token == 54
    assert cmd.row_json == b'["$a:hs","!r:hs",null, "x y"]'
    assert cmd.row == ["$a:hs", "!r:hs", None, "x y"]
    assert cmd.row is cmd.row  # decoded once
    batch = wire.parse_line('RDATA caches master batch ["c",null,1]')
    assert batch.token is None
    assert "token=None" in repr(batch)


def test_rdata_built_from_a_row(wire: ModuleType) -> None:
    cmd = wire.RdataCommand("events", "master", 5, ("ev", ["$é:hs", "\U0001f600", 1.5, True, {"k": None}]))
    assert cmd.to_line() == (
        'RDATA events master 5 ["ev",["$\\u00e9:hs","\\ud83d\\ude00",1.5,true,{"k":null}]]'
    )
    assert cmd.to_bytes().isascii()
    assert wire.parse_line(cmd.to_bytes()).row == ["ev", ["$é:hs", "\U0001f600", 1.5, True, {"k": None}]]
    batch = wire.RdataCommand("caches", "master", None, ["c", None, 1])
    assert batch.to_line() == 'RDATA caches master batch ["c",null,1]'
    relayed = wire.RdataCommand("caches", "w1", 9, row_json=b'["c", null, 1]')
    assert relayed.to_line() == 'RDATA caches w1 9 ["c", null, 1]'
    assert relayed.row == ["c", None, 1]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(stream_name="", instance_name="m", token=1, row=[]), ValueError),
        (dict(stream_name="a b", instance_name="m", token=1, row=[]), ValueError),
        (dict(stream_name="a", instance_name="m\n", token=1, row=[]), ValueError),
        (dict(stream_name="a", instance_name="m", token="1", row=[]), TypeError),
        (dict(stream_name="a", instance_name="m", token=True, row=[]), TypeError),
        (dict(stream_name="a", instance_name="m", token=2**63, row=[]), ValueError),
        (dict(stream_name="a", instance_name="m", token=1), TypeError),
        (dict(stream_name="a", instance_name="m", token=1, row=[], row_json=b"[]"), TypeError),
        (dict(stream_name="a", instance_name="m", token=1, row_json=b"[\n]"), ValueError),
        (dict(stream_name="a", instance_name="m", token=1, row=[float("nan")]), ValueError),
        (dict(stream_name="a", instance_name="m", token=1, row={"x": [float("inf")]}), ValueError),
        (dict(stream_name="a", instance_name="m", token=1, row=(float("-inf"),)), ValueError),
        (dict(stream_name="a", instance_name="m", token=1, row=[{1, 2}]), TypeError),
    ],
)
def test_rdata_rejects_bad_fields(wire: ModuleType, kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        wire.RdataCommand(**kwargs)


def test_encode_row_rejects_nan_and_escapes_non_ascii(wire: ModuleType) -> None:
    assert wire.encode_row(["a", 1, None, 2.5, {"é": "ü"}]) == b'["a",1,null,2.5,{"\\u00e9":"\\u00fc"}]'
    for bad in (float("nan"), [1, [float("inf")]], {"a": float("-inf")}):
        with pytest.raises(ValueError, match="NaN or Infinity"):
            wire.encode_row(bad)


@pytest.mark.parametrize(
    "row_json, row",
    [
        (b"[-0,0,-5]", [0, 0, -5]),
        (b'{"a":1,"a":2}', {"a": 2}),
        (b"[" + b",".join(b"%d" % i for i in range(40)) + b"]", list(range(40))),
        (b"[[[]],{},[{}]]", [[[]], {}, [{}]]),
        (b"[1234567890123456789,-9223372036854775808]", [1234567890123456789, -(2**63)]),
        (b"[18446744073709551615]", [18446744073709551615]),
        (b'["\\u00e9\\n\\"",1.5e3]', ["\u00e9\n\"", 1500.0]),
        (b'["a" , {"b" :null}]', ["a", {"b": None}]),
    ],
)
def test_rows_decode(wire: ModuleType, row_json: bytes, row: Any) -> None:
    assert wire.parse_line(b"RDATA s m 1 " + row_json).row == row


@pytest.mark.parametrize(
    "row_json",
    [b"[NaN]", b"[Infinity]", b"[-Infinity]", b"[1e400]", b"[1,", b"{'a':1}", b'["\\ud800"]'],
)
def test_rows_reject_non_json(wire: ModuleType, row_json: bytes) -> None:
    cmd = wire.parse_line(b"RDATA s m 1 " + row_json)
    with pytest.raises(MalformedCommandError, match="RDATA row is not valid JSON"):
        cmd.row
    assert cmd.row_json == row_json  # still relayable as received


def test_position(wire: ModuleType) -> None:
    cmd = wire.parse_line("POSITION events master 53 60")
    assert isinstance(cmd, wire.PositionCommand)
    assert (cmd.stream_name, cmd.instance_name, cmd.prev_token, cmd.new_token) == (
        "events", "master", 53, 60,
    )
    assert wire.PositionCommand("caches", "w", 1, 2).to_line() == "POSITION caches w 1 2"


def test_replicate_forms(wire: ModuleType) -> None:
    current = wire.parse_line("REPLICATE")
    assert (current.stream_name, current.token, current.all_streams) == (None, None, True)
    assert wire.parse_line("REPLICATE ").stream_name is None
    legacy_all = wire.parse_line("REPLICATE ALL NOW")
    assert (legacy_all.stream_name, legacy_all.token, legacy_all.all_streams) == ("ALL", None, True)
    legacy = wire.parse_line("REPLICATE events 53")
    assert (legacy.stream_name, legacy.token, legacy.all_streams) == ("events", 53, False)
    assert wire.ReplicateCommand().to_line() == "REPLICATE"
    assert wire.ReplicateCommand("events", None).to_line() == "REPLICATE events NOW"
    assert wire.ReplicateCommand("ALL", 7).to_line() == "REPLICATE ALL 7"
    with pytest.raises(ValueError):
        wire.ReplicateCommand(None, 5)


def test_user_sync(wire: ModuleType) -> None:
    cmd = wire.parse_line("USER_SYNC worker1 @alice:hs DEV start 1490197670513")
    assert (cmd.instance_id, cmd.user_id, cmd.device_id, cmd.is_syncing, cmd.last_sync_ms) == (
        "worker1", "@alice:hs", "DEV", True, 1490197670513,
    )
    stopped = wire.parse_line("USER_SYNC worker1 @alice:hs None end 5")
    assert (stopped.device_id, stopped.is_syncing) == (None, False)
    assert wire.UserSyncCommand("w", "@u:hs", None, False, 3).to_line() == "USER_SYNC w @u:hs None end 3"


def test_text_commands(wire: ModuleType) -> None:
    for name in ("SERVER", "ERROR", "PING", "NAME", "REMOTE_SERVER_UP", "NEW_ACTIVE_TASK", "CANCEL_TASK"):
        cmd = wire.parse_line(f"{name} some data with  spaces\r")
        assert cmd.NAME == name
        assert cmd.data == "some data with  spaces\r"
        assert wire.COMMANDS[name]("some data").to_line() == f"{name} some data"
        assert wire.COMMANDS[name]("").to_line() == name
        assert wire.parse_line(name).data == ""
        with pytest.raises(ValueError):
            wire.COMMANDS[name]("two\nlines")
    clear = wire.parse_line("CLEAR_USER_SYNC worker1")
    assert (clear.instance_id, clear.data) == ("worker1", "worker1")
    assert wire.ClearUserSyncCommand("w2").to_line() == "CLEAR_USER_SYNC w2"


def test_federation_ack(wire: ModuleType) -> None:
    cmd = wire.parse_line("FEDERATION_ACK fed1 99")
    assert (cmd.instance_name, cmd.token) == ("fed1", 99)
    assert wire.FederationAckCommand("fed1", 100).to_line() == "FEDERATION_ACK fed1 100"


def test_user_ip(wire: ModuleType) -> None:
    cmd = wire.parse_line('USER_IP @a:hs ["tok", "1.2.3.4", "Agent 1.0", null, 123]')
    assert (cmd.user_id, cmd.access_token, cmd.ip, cmd.user_agent, cmd.device_id, cmd.last_seen) == (
        "@a:hs", "tok", "1.2.3.4", "Agent 1.0", None, 123,
    )
    built = wire.UserIpCommand("@a:hs", "tok", "1.2.3.4", "Agent é", "D", 5)
    assert built.to_line() == 'USER_IP @a:hs ["tok","1.2.3.4","Agent \\u00e9","D",5]'


def test_lock_released(wire: ModuleType) -> None:
    cmd = wire.parse_line('LOCK_RELEASED ["w1","name","key with space"]')
    assert (cmd.instance_name, cmd.lock_name, cmd.lock_key) == ("w1", "name", "key with space")
    assert wire.LockReleasedCommand("w", "n", "k").to_line() == 'LOCK_RELEASED ["w","n","k"]'


@pytest.mark.parametrize(
    "line, message",
    [
        ("FOO bar", "unknown command 'FOO'"),
        ("rdata events master 1 []", "unknown command 'rdata'"),
        ("", "unknown command ''"),
        (" PING 1", "unknown command ''"),
        ("PING\r", "unknown command 'PING\\r'"),
        ("X" * 100, "unknown command '" + "X" * 48 + "'..."),
    ],
)
def test_unknown_commands(wire: ModuleType, line: str, message: str) -> None:
    with pytest.raises(UnknownCommandError) as info:
        wire.parse_line(line)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("RDATA", "RDATA expects <stream_name> <instance_name> <token|batch> <row_json>"),
        ("RDATA events master 1", "RDATA expects"),
        ("RDATA events master 1 ", "RDATA expects"),
        ("RDATA events  1 []", "RDATA expects"),
        ("RDATA events master x1 []", "RDATA: invalid token 'x1' (expected a 64-bit decimal integer or 'batch')"),
        ("RDATA events master 01 []", "invalid token '01'"),
        ("RDATA events master +1 []", "invalid token '+1'"),
        ("RDATA events master -0 []", "invalid token '-0'"),
        ("RDATA events master 9223372036854775808 []", "invalid token"),
        ('RDATA events 54 ["$foo1:bar.com", ...]', "RDATA: invalid token"),  # legacy, no instance
        ("POSITION events 1", "POSITION expects"),  # legacy, no instance
        ("POSITION events master 1 2 3", "POSITION: invalid new_token '2 3'"),
        ("POSITION events master 1 ", "POSITION: invalid new_token ''"),
        ("REPLICATE events", "REPLICATE expects no arguments, or <stream_name|ALL> <token|NOW>"),
        ("REPLICATE events 1 2", "REPLICATE expects"),
        ("REPLICATE events later", "REPLICATE: invalid token 'later'"),
        ("USER_SYNC w @u:hs None start", "USER_SYNC expects"),
        ("USER_SYNC w @u:hs None maybe 1", "USER_SYNC: invalid state 'maybe'"),
        ("USER_SYNC w @u:hs None start 1.5", "USER_SYNC: invalid last_sync_ms '1.5'"),
        ("FEDERATION_ACK 5", "FEDERATION_ACK expects <instance_name> <token>"),
        ("FEDERATION_ACK fed x", "FEDERATION_ACK: invalid token 'x'"),
        ("USER_IP @a:hs", "USER_IP expects"),
        ("USER_IP @a:hs [1,2", "USER_IP payload is not valid JSON"),
        ('USER_IP @a:hs ["t","ip","ua",null]', "USER_IP payload must be a JSON array"),
        ('USER_IP @a:hs ["t","ip","ua",null,true]', "USER_IP payload must be a JSON array"),
        ("LOCK_RELEASED", "LOCK_RELEASED payload is not valid JSON"),
        ('LOCK_RELEASED {"a":1}', "LOCK_RELEASED payload must be a JSON array"),
        ('LOCK_RELEASED ["a","b",3]', "LOCK_RELEASED payload must be a JSON array"),
    ],
)
def test_malformed_commands(wire: ModuleType, line: str, fragment: str) -> None:
    with pytest.raises(MalformedCommandError) as info:
        wire.parse_line(line)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message and message.isascii()


def test_utf8(wire: ModuleType) -> None:
    cmd = wire.parse_line("PING héllo ☃".encode())
    assert cmd.data == "héllo ☃"
    rdata = wire.parse_line('RDATA events master 1 ["é"]'.encode())
    assert rdata.row == ["é"]
    with pytest.raises(MalformedCommandError, match="PING: line is not valid UTF-8"):
        wire.parse_line(b"PING \xff")
    with pytest.raises(MalformedCommandError, match="RDATA: line is not valid UTF-8"):
        wire.parse_line(b'RDATA events master 1 ["\xc3"]')
    with pytest.raises(UnknownCommandError, match=r"unknown command 'P\\xffNG'"):
        wire.parse_line(b"P\xffNG 1")
    with pytest.raises(MalformedCommandError, match="not valid Unicode"):
        wire.parse_line("PING \ud800")


def test_parse_line_refuses_newlines(wire: ModuleType) -> None:
    with pytest.raises(MalformedCommandError, match="newline"):
        wire.parse_line("PING 1\nPING 2")


def test_errors_pickle() -> None:
    exc = LineTooLongError("line too long", b"RDATA")
    clone = pickle.loads(pickle.dumps(exc))
    assert (str(clone), clone.line_prefix) == ("line too long", b"RDATA")


# --- the decoder ------------------------------------------------------------------


def test_decoder_splits_chunks(wire: ModuleType) -> None:
    decoder = wire.Decoder()
    assert decoder.max_line_length == 16384
    assert decoder.feed(b"PING 1\nPOSITION events mas") == [wire.PingCommand("1")]
    assert decoder.buffered == len(b"POSITION events mas")
    assert decoder.feed(b"ter 1 2") == []
    assert decoder.feed(b"\n\nRDATA a m 1 [1]\n") == [
        wire.PositionCommand("events", "master", 1, 2),
        wire.RdataCommand("a", "m", 1, [1]),
    ]
    assert decoder.buffered == 0
    assert decoder.feed(b"") == []
    assert decoder.feed(bytearray(b"PING 2\n")) == [wire.PingCommand("2")]
    assert decoder.feed(memoryview(b"xPING 3\n")[1:]) == [wire.PingCommand("3")]
    assert decoder.feed(memoryview(b"PxIxNxGx x4x\nx")[::2]) == [wire.PingCommand("4")]


def test_decoder_byte_by_byte(wire: ModuleType) -> None:
    stream = "".join(line + "\n" for line in CANONICAL_LINES).encode()
    decoder = wire.Decoder()
    commands = []
    for i in range(len(stream)):
        commands.extend(decoder.feed(stream[i : i + 1]))
    assert [c.to_line() for c in commands] == CANONICAL_LINES


def test_decoder_crlf_is_data(wire: ModuleType) -> None:
    decoder = wire.Decoder()
    commands = decoder.feed(b"PING 1\r\nRDATA s m 1 [1]\r\n")
    assert commands[0].data == "1\r"
    assert commands[1].row_json == b"[1]\r"
    assert commands[1].row == [1]  # JSON allows trailing whitespace, \r included
    with pytest.raises(UnknownCommandError, match=r"unknown command '\\r'"):
        decoder.feed(b"\r\n")


def test_decoder_keeps_good_lines_around_bad_ones(wire: ModuleType) -> None:
    decoder = wire.Decoder()
    with pytest.raises(UnknownCommandError) as info:
        decoder.feed(b"PING 1\nBOGUS\nPING 2\nPOSITION x\nPING 3")
    exc = info.value
    assert [c.data for c in exc.commands] == ["1", "2"]
    assert [type(e) for e in exc.errors] == [UnknownCommandError, MalformedCommandError]
    assert exc.errors[0] is exc
    assert decoder.feed(b"\n") == [wire.PingCommand("3")]


def test_decoder_line_too_long(wire: ModuleType) -> None:
    decoder = wire.Decoder(max_line_length=16)
    assert decoder.feed(b"PING 12345678901\n")[0].data == "12345678901"  # exactly 16 bytes
    with pytest.raises(LineTooLongError) as info:
        decoder.feed(b"PING 123456789012\nPING ok\n")
    assert info.value.line_prefix == b"PING 123456789012"
    assert str(info.value) == "line too long (over 16 bytes): 'PING 123456789012'"
    assert [c.data for c in info.value.commands] == ["ok"]
    # An unterminated over-long line is reported at once and dropped up to its newline.
    with pytest.raises(LineTooLongError):
        decoder.feed(b"RDATA events master 1 [")
    assert decoder.buffered == 0
    assert decoder.feed(b"1,2,3,4,5,6,7,8,9" * 100) == []
    assert decoder.buffered == 0
    assert decoder.feed(b"]\nPING 2\n") == [wire.PingCommand("2")]


def test_decoder_long_prefix_is_bounded(wire: ModuleType) -> None:
    decoder = wire.Decoder()
    with pytest.raises(LineTooLongError) as info:
        decoder.feed(b"RDATA events master 1 " + b"x" * 20000)
    assert len(info.value.line_prefix) == 64
    assert info.value.line_prefix.startswith(b"RDATA events master 1 xx")
    assert len(str(info.value)) < 120


def test_decoder_rejects_bad_limits(wire: ModuleType) -> None:
    for bad in (0, -1, 1.5, "10", True):
        with pytest.raises(ValueError):
            wire.Decoder(bad)
    with pytest.raises(TypeError):
        wire.Decoder().feed("PING 1\n")


def test_protocol_errors_share_a_base(wire: ModuleType) -> None:
    for cls in (UnknownCommandError, MalformedCommandError, LineTooLongError):
        assert issubclass(cls, ProtocolError)


# --- the encoder ------------------------------------------------------------------


def test_encoder_batches(wire: ModuleType) -> None:
    encoder = wire.Encoder()
    assert encoder.take() == b""
    commands = [wire.parse_line(line) for line in CANONICAL_LINES]
    encoder.encode(commands[0])
    encoder.encode_many(commands[1:])
    expected = "".join(line + "\n" for line in CANONICAL_LINES).encode()
    assert len(encoder) == len(expected)
    assert encoder.take() == expected
    assert len(encoder) == 0 and encoder.take() == b""
    encoder.encode_many(iter(commands[:2]))
    assert wire.Decoder().feed(encoder.take()) == commands[:2]
    with pytest.raises(TypeError):
        encoder.encode(b"PING 1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encoder.encode_many([commands[0], "PING 1"])


def test_commands_are_immutable_and_comparable(wire: ModuleType) -> None:
    cmd = wire.parse_line("POSITION events master 1 2")
    with pytest.raises(AttributeError):
        cmd.stream_name = "other"
    assert cmd != wire.parse_line("POSITION events master 1 3")
    assert cmd != "POSITION events master 1 2"
    assert wire.PingCommand("1") != wire.NameCommand("1")
    assert repr(cmd) == "PositionCommand(stream_name='events', instance_name='master', prev_token=1, new_token=2)"
    assert describe(cmd)[0] == "PositionCommand"


# The document's example session, as each side sends it.
SERVER_TRANSCRIPT = (
    b"SERVER localhost:8823\n"
    b"PING 1490197665618\n"
    b"POSITION events master 1 1\n"
    b"POSITION backfill master 1 1\n"
    b"POSITION caches master 1 1\n"
    b'RDATA caches master 2 ["get_user_by_id",["@01register-user:localhost:8823"],1490197670513]\n'
    b'RDATA events master 14 ["$149019767112vOHxz:localhost:8823",'
    b'"!AFDCvgApUmpdfVjIXm:localhost:8823","m.room.guest_access","",null]\n'
    b"ERROR server stopping\n"
)
CLIENT_TRANSCRIPT = b"NAME synapse.app.appservice\nPING 1490197665618\nREPLICATE\nPING 1490197675618\n"


@pytest.mark.parametrize("transcript", [SERVER_TRANSCRIPT, CLIENT_TRANSCRIPT])
@pytest.mark.parametrize("chunk", [1, 7, 64, 65536])
def test_golden_transcripts(wire: ModuleType, transcript: bytes, chunk: int) -> None:
    decoder = wire.Decoder()
    commands = []
    for i in range(0, len(transcript), chunk):
        commands.extend(decoder.feed(transcript[i : i + chunk]))
    encoder = wire.Encoder()
    encoder.encode_many(commands)
    assert encoder.take() == transcript
    rebuilt = wire.Encoder()
    rebuilt.encode_many(type(c)(**{f: getattr(c, f) for f in c.FIELDS}) for c in commands)
    assert rebuilt.take() == transcript
