"""The replication wire format in plain Python (twin of ``streamrep._core.wire``).

A line is ``NAME`` or ``NAME <arguments>``, UTF-8, terminated by ``\\n`` only (a
``\\r`` is data). Every command object keeps its exact line, so parsing then
serialising gives the same bytes and a relay forwards lines without re-encoding.
``RDATA`` rows stay raw JSON until ``.row`` is read.

This module is also the reference the compiled core is tested against: the
compiled parser asks :func:`_explain` for the message of every line it rejects,
so both implementations report the same errors in the same words.
"""

from __future__ import annotations

import codecs
import math
import re
from typing import Any, ClassVar, Iterable, Sequence, Union

import orjson

from streamrep.errors import (
    LineTooLongError,
    MalformedCommandError,
    ProtocolError,
    UnknownCommandError,
)
from streamrep.wire_commands import command_table

__all__ = [
    "Command",
    "ServerCommand",
    "RdataCommand",
    "PositionCommand",
    "ErrorCommand",
    "PingCommand",
    "NameCommand",
    "ReplicateCommand",
    "UserSyncCommand",
    "ClearUserSyncCommand",
    "FederationAckCommand",
    "UserIpCommand",
    "RemoteServerUpCommand",
    "LockReleasedCommand",
    "NewActiveTaskCommand",
    "CancelTaskCommand",
    "AuthChallengeCommand",
    "AuthResponseCommand",
    "AuthOkCommand",
    "COMMANDS",
    "DEFAULT_MAX_LINE_LENGTH",
    "parse_line",
    "Decoder",
    "Encoder",
    "encode_row",
    "group_rdata",
    "rdata_rows",
    "validate_rows",
    "encode_rdata_rows",
]

#: The decoder's default limit on one line, in bytes, without its newline.
DEFAULT_MAX_LINE_LENGTH = 16384

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_STRICT_INT = re.compile(rb"-?(?:0|[1-9][0-9]*)")
#: How many bytes of an offending word or line an error message quotes.
_QUOTE_LIMIT = 48
#: How many bytes of an over-long line LineTooLongError.line_prefix keeps.
_PREFIX_LIMIT = 64
_MISSING: Any = object()
_SURROGATE_ESCAPE = re.compile(r"\\udc([89a-f][0-9a-f])")

BytesLike = Union[bytes, bytearray, memoryview]


# --- helpers shared with the compiled core -------------------------------------


def _quote(raw: bytes) -> str:
    """A short, single-line, ASCII rendering of *raw* for error messages."""
    # Undecodable bytes become lone surrogates, which ascii() shows as \udcXX:
    # show them as the \xXX byte escapes they stand for.
    text = _SURROGATE_ESCAPE.sub(
        r"\\x\1", ascii(raw[:_QUOTE_LIMIT].decode("utf-8", "surrogateescape"))
    )
    return text + "..." if len(raw) > _QUOTE_LIMIT else text


def _too_long(line: bytes, max_line_length: int) -> LineTooLongError:
    prefix = line[: min(_PREFIX_LIMIT, max_line_length + 1)]
    return LineTooLongError(
        f"line too long (over {max_line_length} bytes): {_quote(prefix)}", prefix
    )


def _json_escape_non_ascii(exc: UnicodeError) -> tuple[str, int]:
    # A codecs error handler: \\uXXXX escapes (surrogate pairs above the BMP).
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    out = []
    for char in exc.object[exc.start : exc.end]:
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out), exc.end


codecs.register_error("streamrep.json_ascii", _json_escape_non_ascii)


def _check_finite(value: Any) -> None:
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError("JSON cannot carry NaN or Infinity")
    elif kind is list or kind is tuple:
        for item in value:
            _check_finite(item)
    elif kind is dict:
        for item in value.values():
            _check_finite(item)
    elif isinstance(value, float):
        _check_finite(float(value))
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_finite(item)
    elif isinstance(value, dict):
        for item in value.values():
            _check_finite(item)


def encode_row(row: Any) -> bytes:
    """Serialise *row* as the protocol's JSON: compact, ASCII-escaped, finite.

    Raises :class:`ValueError` for NaN or Infinity and :class:`TypeError` for
    values JSON cannot carry.
    """
    _check_finite(row)
    raw = orjson.dumps(row)
    if raw.isascii():
        return raw
    return raw.decode("utf-8").encode("ascii", "streamrep.json_ascii")


def _decode_json(raw: bytes | memoryview, what: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedCommandError(f"{what} is not valid JSON ({exc})") from None


def _word(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, not {type(value).__name__}")
    if not value or " " in value or "\n" in value:
        raise ValueError(f"{field} must be non-empty without spaces or newlines: {value!r}")
    return value


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, not {type(value).__name__}")
    if "\n" in value:
        raise ValueError(f"{field} must not contain a newline: {value!r}")
    return value


def _int64(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{field} must be an int, not {type(value).__name__}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{field} is out of the 64-bit range: {value}")
    return int(value)


def _join(name: bytes, *args: str) -> bytes:
    line = " ".join(args).encode("utf-8")
    return name + b" " + line if args else name


def _parse_int(raw: bytes, name: str, field: str, extra: str = "") -> int:
    # Common case first: up to 18 plain digits, no leading zero, always in range.
    if raw.isdigit() and len(raw) <= 18 and (raw[0] != 48 or len(raw) == 1):
        return int(raw)
    if _STRICT_INT.fullmatch(raw) and raw != b"-0":
        value = int(raw)
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
    raise MalformedCommandError(
        f"{name}: invalid {field} {_quote(raw)} (expected a 64-bit decimal integer{extra})"
    )


_NAMES: dict[bytes, str] = {}


def _name(raw: bytes) -> str:
    """Decode a stream or instance name, sharing one str per name (bounded cache)."""
    name = _NAMES.get(raw)
    if name is None:
        if len(_NAMES) >= 1024:
            _NAMES.clear()
        name = _NAMES[raw] = raw.decode("utf-8")
    return name


def _split_words(args: bytes, count: int, name: str, usage: str) -> list[bytes]:
    """Split *args* into *count* space-separated parts; all but the last are words."""
    parts = args.split(b" ", count - 1)
    if len(parts) != count or not all(parts[:-1]):
        raise MalformedCommandError(f"{name} expects {usage}")
    return parts


# --- commands --------------------------------------------------------------------


class Command:
    """A line of the replication protocol.

    Commands are immutable. ``to_bytes()`` is the line as sent or received (no
    newline); two commands are equal when their lines are.
    """

    __slots__ = ("_line",)
    NAME: ClassVar[str] = ""
    #: The constructor's arguments, in order.
    FIELDS: ClassVar[tuple[str, ...]] = ()

    _line: bytes

    def to_bytes(self) -> bytes:
        """The whole line as UTF-8 bytes, name included, without the newline."""
        return self._line

    def to_line(self) -> str:
        """The whole line as text, name included, without the newline."""
        return self._line.decode("utf-8")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Command)
        return self._line == other._line

    def __hash__(self) -> int:
        return hash(self._line)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"{type(self).__name__}({fields})"


class _TextCommand(Command):
    """A command whose arguments are the rest of the line, as one string."""

    __slots__ = ("_data",)
    FIELDS = ("data",)
    _data: str

    def __init__(self, data: str) -> None:
        self._data = _text(data, "data")
        self._line = _join(self.NAME.encode(), data) if data else self.NAME.encode()

    @property
    def data(self) -> str:
        """The rest of the line after the name (may be empty)."""
        return self._data

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> _TextCommand:
        self = cls.__new__(cls)
        self._line = line
        self._data = args.decode("utf-8")
        return self


class ServerCommand(_TextCommand):
    """``SERVER <server_name>``: the server says who it is (server to client)."""

    __slots__ = ()
    NAME = "SERVER"


class ErrorCommand(_TextCommand):
    """``ERROR <message>``: the sender hit an error and usually closes (both ways)."""

    __slots__ = ()
    NAME = "ERROR"


class PingCommand(_TextCommand):
    """``PING <data>``: keep-alive, usually a timestamp in ms (both ways)."""

    __slots__ = ()
    NAME = "PING"


class NameCommand(_TextCommand):
    """``NAME <name>``: the client's human-friendly name (client to server)."""

    __slots__ = ()
    NAME = "NAME"


class RemoteServerUpCommand(_TextCommand):
    """``REMOTE_SERVER_UP <server_name>``: a remote server may be back online."""

    __slots__ = ()
    NAME = "REMOTE_SERVER_UP"


class NewActiveTaskCommand(_TextCommand):
    """``NEW_ACTIVE_TASK <task_id>``: a scheduled task became active."""

    __slots__ = ()
    NAME = "NEW_ACTIVE_TASK"


class CancelTaskCommand(_TextCommand):
    """``CANCEL_TASK <task_id>``: cancel a running scheduled task."""

    __slots__ = ()
    NAME = "CANCEL_TASK"


class ClearUserSyncCommand(_TextCommand):
    """``CLEAR_USER_SYNC <instance_id>``: forget a worker's user syncs (it is stopping)."""

    __slots__ = ()
    NAME = "CLEAR_USER_SYNC"
    FIELDS = ("instance_id",)

    def __init__(self, instance_id: str) -> None:
        super().__init__(instance_id)

    @property
    def instance_id(self) -> str:
        """The worker whose syncs to clear (the whole argument string)."""
        return self._data


class RdataCommand(Command):
    """``RDATA <stream_name> <instance_name> <token|batch> <row_json>``: one stream row.

    ``token`` is None for ``batch`` (more rows with the same token follow). The
    row stays raw JSON (``row_json``) until ``row`` is first read, so routing
    by ``stream_name`` costs no JSON decoding.
    """

    __slots__ = ("_stream_name", "_instance_name", "_token", "_row_start", "_row")
    NAME = "RDATA"
    FIELDS = ("stream_name", "instance_name", "token", "row")
    _USAGE = "<stream_name> <instance_name> <token|batch> <row_json>"

    _stream_name: str
    _instance_name: str
    _token: int | None
    _row_start: int
    _row: Any

    def __init__(
        self,
        stream_name: str,
        instance_name: str,
        token: int | None,
        row: Any = _MISSING,
        *,
        row_json: bytes | None = None,
    ) -> None:
        self._stream_name = _word(stream_name, "stream_name")
        self._instance_name = _word(instance_name, "instance_name")
        self._token = None if token is None else _int64(token, "token")
        if row_json is None:
            if row is _MISSING:
                raise TypeError("RdataCommand needs row or row_json")
            row_json = encode_row(row)
            self._row = row
        else:
            if row is not _MISSING:
                raise TypeError("RdataCommand takes row or row_json, not both")
            row_json = bytes(row_json)
            if not row_json or b"\n" in row_json:
                raise ValueError("row_json must be non-empty without newlines")
            row_json.decode("utf-8")
            self._row = _MISSING
        head = f"RDATA {stream_name} {instance_name} {'batch' if token is None else token} "
        encoded = head.encode("utf-8")
        self._row_start = len(encoded)
        self._line = encoded + row_json

    @property
    def stream_name(self) -> str:
        """The stream this row belongs to."""
        return self._stream_name

    @property
    def instance_name(self) -> str:
        """The process that wrote the row."""
        return self._instance_name

    @property
    def token(self) -> int | None:
        """The row's stream token, or None for ``batch``."""
        return self._token

    @property
    def row_json(self) -> bytes:
        """The row's JSON exactly as on the wire."""
        return self._line[self._row_start :]

    @property
    def row(self) -> Any:
        """The decoded row (decoded on first access; MalformedCommandError if invalid)."""
        if self._row is _MISSING:
            self._row = _decode_json(memoryview(self._line)[self._row_start :], "RDATA row")
        return self._row

    def __repr__(self) -> str:
        return (
            f"RdataCommand(stream_name={self._stream_name!r}, "
            f"instance_name={self._instance_name!r}, token={self._token!r}, "
            f"row_json={self.row_json!r})"
        )

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> RdataCommand:
        stream, instance, token, row = _split_words(args, 4, "RDATA", cls._USAGE)
        if not row:
            raise MalformedCommandError(f"RDATA expects {cls._USAGE}")
        self = cls.__new__(cls)
        self._line = line
        self._stream_name = _name(stream)
        self._instance_name = _name(instance)
        self._token = None if token == b"batch" else _parse_int(
            token, "RDATA", "token", " or 'batch'"
        )
        self._row_start = len(line) - len(row)
        self._row = _MISSING
        return self


class PositionCommand(Command):
    """``POSITION <stream_name> <instance_name> <prev_token> <new_token>`` (server to client).

    The writer's stream advanced from ``prev_token`` to ``new_token``; a client
    fetches out of band only if it is behind ``prev_token``.
    """

    __slots__ = ("_stream_name", "_instance_name", "_prev_token", "_new_token")
    NAME = "POSITION"
    FIELDS = ("stream_name", "instance_name", "prev_token", "new_token")
    _USAGE = "<stream_name> <instance_name> <prev_token> <new_token>"

    def __init__(self, stream_name: str, instance_name: str, prev_token: int, new_token: int) -> None:
        self._stream_name = _word(stream_name, "stream_name")
        self._instance_name = _word(instance_name, "instance_name")
        self._prev_token = _int64(prev_token, "prev_token")
        self._new_token = _int64(new_token, "new_token")
        self._line = _join(b"POSITION", stream_name, instance_name, str(prev_token), str(new_token))

    @property
    def stream_name(self) -> str:
        """The stream whose position this is."""
        return self._stream_name

    @property
    def instance_name(self) -> str:
        """The writer of the stream."""
        return self._instance_name

    @property
    def prev_token(self) -> int:
        """The position sent before this one."""
        return self._prev_token

    @property
    def new_token(self) -> int:
        """The writer's current position."""
        return self._new_token

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> PositionCommand:
        stream, instance, prev, new = _split_words(args, 4, "POSITION", cls._USAGE)
        self = cls.__new__(cls)
        self._line = line
        self._stream_name = _name(stream)
        self._instance_name = _name(instance)
        self._prev_token = _parse_int(prev, "POSITION", "prev_token")
        self._new_token = _parse_int(new, "POSITION", "new_token")
        return self


class ReplicateCommand(Command):
    """``REPLICATE`` asks for every stream's position (client to server).

    The legacy form ``REPLICATE <stream_name|ALL> <token|NOW>`` subscribes from a
    token: ``stream_name`` is the stream (or ``"ALL"``) and ``token`` is None for
    ``NOW``. In the current form both are None.
    """

    __slots__ = ("_stream_name", "_token")
    NAME = "REPLICATE"
    FIELDS = ("stream_name", "token")
    _USAGE = "no arguments, or <stream_name|ALL> <token|NOW>"

    _stream_name: str | None
    _token: int | None

    def __init__(self, stream_name: str | None = None, token: int | None = None) -> None:
        if stream_name is None:
            if token is not None:
                raise ValueError("a REPLICATE token needs a stream_name")
            self._line = b"REPLICATE"
        else:
            _word(stream_name, "stream_name")
            if token is not None:
                _int64(token, "token")
            self._line = _join(b"REPLICATE", stream_name, "NOW" if token is None else str(token))
        self._stream_name = stream_name
        self._token = token

    @property
    def stream_name(self) -> str | None:
        """The legacy form's stream (or ``"ALL"``); None in the current form."""
        return self._stream_name

    @property
    def token(self) -> int | None:
        """The legacy form's token; None for ``NOW`` and in the current form."""
        return self._token

    @property
    def all_streams(self) -> bool:
        """True when every stream is asked for (current form, or legacy ``ALL``)."""
        return self._stream_name is None or self._stream_name == "ALL"

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> ReplicateCommand:
        self = cls.__new__(cls)
        self._line = line
        if not args:
            self._stream_name = None
            self._token = None
            return self
        parts = args.split(b" ")
        if len(parts) != 2 or not parts[0]:
            raise MalformedCommandError(f"REPLICATE expects {cls._USAGE}")
        self._stream_name = parts[0].decode("utf-8")
        self._token = None if parts[1] == b"NOW" else _parse_int(
            parts[1], "REPLICATE", "token", " or 'NOW'"
        )
        return self


class UserSyncCommand(Command):
    """``USER_SYNC <instance_id> <user_id> <device_id|None> <start|end> <last_sync_ms>``.

    A user started or stopped syncing on a worker (client to server).
    """

    __slots__ = ("_instance_id", "_user_id", "_device_id", "_is_syncing", "_last_sync_ms")
    NAME = "USER_SYNC"
    FIELDS = ("instance_id", "user_id", "device_id", "is_syncing", "last_sync_ms")
    _USAGE = "<instance_id> <user_id> <device_id|None> <start|end> <last_sync_ms>"

    def __init__(
        self,
        instance_id: str,
        user_id: str,
        device_id: str | None,
        is_syncing: bool,
        last_sync_ms: int,
    ) -> None:
        self._instance_id = _word(instance_id, "instance_id")
        self._user_id = _word(user_id, "user_id")
        self._device_id = None if device_id is None else _word(device_id, "device_id")
        self._is_syncing = bool(is_syncing)
        self._last_sync_ms = _int64(last_sync_ms, "last_sync_ms")
        self._line = _join(
            b"USER_SYNC",
            instance_id,
            user_id,
            "None" if device_id is None else device_id,
            "start" if is_syncing else "end",
            str(last_sync_ms),
        )

    @property
    def instance_id(self) -> str:
        """The worker the user syncs on."""
        return self._instance_id

    @property
    def user_id(self) -> str:
        """The syncing user."""
        return self._user_id

    @property
    def device_id(self) -> str | None:
        """The syncing device, or None (``None`` on the wire)."""
        return self._device_id

    @property
    def is_syncing(self) -> bool:
        """True for ``start``, False for ``end``."""
        return self._is_syncing

    @property
    def last_sync_ms(self) -> int:
        """When the user last synced, in ms since the epoch."""
        return self._last_sync_ms

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> UserSyncCommand:
        instance, user, device, state, last = _split_words(args, 5, "USER_SYNC", cls._USAGE)
        if state == b"start":
            syncing = True
        elif state == b"end":
            syncing = False
        else:
            raise MalformedCommandError(
                f"USER_SYNC: invalid state {_quote(state)} (expected 'start' or 'end')"
            )
        self = cls.__new__(cls)
        self._line = line
        self._instance_id = instance.decode("utf-8")
        self._user_id = user.decode("utf-8")
        self._device_id = None if device == b"None" else device.decode("utf-8")
        self._is_syncing = syncing
        self._last_sync_ms = _parse_int(last, "USER_SYNC", "last_sync_ms")
        return self


class FederationAckCommand(Command):
    """``FEDERATION_ACK <instance_name> <token>``: federation data received up to a token."""

    __slots__ = ("_instance_name", "_token")
    NAME = "FEDERATION_ACK"
    FIELDS = ("instance_name", "token")
    _USAGE = "<instance_name> <token>"

    def __init__(self, instance_name: str, token: int) -> None:
        self._instance_name = _word(instance_name, "instance_name")
        self._token = _int64(token, "token")
        self._line = _join(b"FEDERATION_ACK", instance_name, str(token))

    @property
    def instance_name(self) -> str:
        """The federation sender acknowledging."""
        return self._instance_name

    @property
    def token(self) -> int:
        """The federation stream token received up to."""
        return self._token

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> FederationAckCommand:
        instance, token = _split_words(args, 2, "FEDERATION_ACK", cls._USAGE)
        self = cls.__new__(cls)
        self._line = line
        self._instance_name = instance.decode("utf-8")
        self._token = _parse_int(token, "FEDERATION_ACK", "token")
        return self


class UserIpCommand(Command):
    """``USER_IP <user_id> <[access_token, ip, user_agent, device_id, last_seen]>``.

    A worker saw a user's client (client to server).
    """

    __slots__ = ("_user_id", "_access_token", "_ip", "_user_agent", "_device_id", "_last_seen")
    NAME = "USER_IP"
    FIELDS = ("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen")
    _USAGE = "<user_id> <[access_token, ip, user_agent, device_id, last_seen]>"

    def __init__(
        self,
        user_id: str,
        access_token: str,
        ip: str,
        user_agent: str,
        device_id: str | None,
        last_seen: int,
    ) -> None:
        self._user_id = _word(user_id, "user_id")
        self._access_token = _str(access_token, "access_token")
        self._ip = _str(ip, "ip")
        self._user_agent = _str(user_agent, "user_agent")
        self._device_id = None if device_id is None else _str(device_id, "device_id")
        self._last_seen = _int64(last_seen, "last_seen")
        payload = encode_row([access_token, ip, user_agent, device_id, last_seen])
        self._line = b"USER_IP " + user_id.encode("utf-8") + b" " + payload

    @property
    def user_id(self) -> str:
        """The user seen."""
        return self._user_id

    @property
    def access_token(self) -> str:
        """The access token the client used."""
        return self._access_token

    @property
    def ip(self) -> str:
        """The client's IP address."""
        return self._ip

    @property
    def user_agent(self) -> str:
        """The client's User-Agent."""
        return self._user_agent

    @property
    def device_id(self) -> str | None:
        """The client's device, if known."""
        return self._device_id

    @property
    def last_seen(self) -> int:
        """When the client was seen, in ms since the epoch."""
        return self._last_seen

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> UserIpCommand:
        user, payload = _split_words(args, 2, "USER_IP", cls._USAGE)
        value = _decode_json(payload, "USER_IP payload")
        if (
            type(value) is not list
            or len(value) != 5
            or not all(type(v) is str for v in value[:3])
            or not (value[3] is None or type(value[3]) is str)
            or type(value[4]) is not int
            or not _INT64_MIN <= value[4] <= _INT64_MAX
        ):
            raise MalformedCommandError(
                "USER_IP payload must be a JSON array "
                "[access_token, ip, user_agent, device_id|null, last_seen]"
            )
        self = cls.__new__(cls)
        self._line = line
        self._user_id = user.decode("utf-8")
        self._access_token, self._ip, self._user_agent, self._device_id, self._last_seen = value
        return self


class LockReleasedCommand(Command):
    """``LOCK_RELEASED <[instance_name, lock_name, lock_key]>``: a named lock was released."""

    __slots__ = ("_instance_name", "_lock_name", "_lock_key")
    NAME = "LOCK_RELEASED"
    FIELDS = ("instance_name", "lock_name", "lock_key")

    def __init__(self, instance_name: str, lock_name: str, lock_key: str) -> None:
        self._instance_name = _str(instance_name, "instance_name")
        self._lock_name = _str(lock_name, "lock_name")
        self._lock_key = _str(lock_key, "lock_key")
        self._line = b"LOCK_RELEASED " + encode_row([instance_name, lock_name, lock_key])

    @property
    def instance_name(self) -> str:
        """The process that held the lock."""
        return self._instance_name

    @property
    def lock_name(self) -> str:
        """The lock's name."""
        return self._lock_name

    @property
    def lock_key(self) -> str:
        """The lock's key."""
        return self._lock_key

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> LockReleasedCommand:
        value = _decode_json(args, "LOCK_RELEASED payload")
        if type(value) is not list or len(value) != 3 or not all(type(v) is str for v in value):
            raise MalformedCommandError(
                "LOCK_RELEASED payload must be a JSON array [instance_name, lock_name, lock_key]"
            )
        self = cls.__new__(cls)
        self._line = line
        self._instance_name, self._lock_name, self._lock_key = value
        return self


def _str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, not {type(value).__name__}")
    return value


class AuthChallengeCommand(Command):
    """``AUTH_CHALLENGE <nonce>``: the hub asks for proof of the shared secret
    (server to client, before ``NAME``)."""

    __slots__ = ("_nonce",)
    NAME = "AUTH_CHALLENGE"
    FIELDS = ("nonce",)

    def __init__(self, nonce: str) -> None:
        self._nonce = _word(nonce, "nonce")
        self._line = _join(b"AUTH_CHALLENGE", nonce)

    @property
    def nonce(self) -> str:
        """The hub's fresh nonce, hex."""
        return self._nonce

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> AuthChallengeCommand:
        (nonce,) = _split_words(args, 1, "AUTH_CHALLENGE", "<nonce>")
        if not nonce or b" " in nonce:
            raise MalformedCommandError("AUTH_CHALLENGE expects <nonce>")
        self = cls.__new__(cls)
        self._line = line
        self._nonce = nonce.decode("utf-8")
        return self


class AuthResponseCommand(Command):
    """``AUTH_RESPONSE <instance_name> <nonce> <proof>``: the instance a peer speaks
    for, its nonce and its proof of the shared secret (client to server)."""

    __slots__ = ("_instance_name", "_nonce", "_proof")
    NAME = "AUTH_RESPONSE"
    FIELDS = ("instance_name", "nonce", "proof")
    _USAGE = "<instance_name> <nonce> <proof>"

    def __init__(self, instance_name: str, nonce: str, proof: str) -> None:
        self._instance_name = _word(instance_name, "instance_name")
        self._nonce = _word(nonce, "nonce")
        self._proof = _word(proof, "proof")
        self._line = _join(b"AUTH_RESPONSE", instance_name, nonce, proof)

    @property
    def instance_name(self) -> str:
        """The instance the peer will name itself in ``NAME``."""
        return self._instance_name

    @property
    def nonce(self) -> str:
        """The peer's fresh nonce, hex."""
        return self._nonce

    @property
    def proof(self) -> str:
        """The peer's HMAC proof, hex."""
        return self._proof

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> AuthResponseCommand:
        instance, nonce, proof = _split_words(args, 3, "AUTH_RESPONSE", cls._USAGE)
        if not proof or b" " in proof:
            raise MalformedCommandError(f"AUTH_RESPONSE expects {cls._USAGE}")
        self = cls.__new__(cls)
        self._line = line
        self._instance_name = instance.decode("utf-8")
        self._nonce = nonce.decode("utf-8")
        self._proof = proof.decode("utf-8")
        return self


class AuthOkCommand(Command):
    """``AUTH_OK <proof>``: the hub accepted the peer's proof and proves it holds the
    shared secret too (server to client)."""

    __slots__ = ("_proof",)
    NAME = "AUTH_OK"
    FIELDS = ("proof",)

    def __init__(self, proof: str) -> None:
        self._proof = _word(proof, "proof")
        self._line = _join(b"AUTH_OK", proof)

    @property
    def proof(self) -> str:
        """The hub's HMAC proof, hex."""
        return self._proof

    @classmethod
    def _parse(cls, line: bytes, args: bytes) -> AuthOkCommand:
        (proof,) = _split_words(args, 1, "AUTH_OK", "<proof>")
        if not proof or b" " in proof:
            raise MalformedCommandError("AUTH_OK expects <proof>")
        self = cls.__new__(cls)
        self._line = line
        self._proof = proof.decode("utf-8")
        return self


#: Every command class by its wire name, in the declared order
#: (:data:`streamrep.wire_commands.COMMAND_SET`; a class that drifts fails here).
COMMANDS: dict[str, type[Command]] = command_table(
    (
        ServerCommand,
        RdataCommand,
        PositionCommand,
        ErrorCommand,
        PingCommand,
        NameCommand,
        ReplicateCommand,
        UserSyncCommand,
        ClearUserSyncCommand,
        FederationAckCommand,
        UserIpCommand,
        RemoteServerUpCommand,
        LockReleasedCommand,
        NewActiveTaskCommand,
        CancelTaskCommand,
        AuthChallengeCommand,
        AuthResponseCommand,
        AuthOkCommand,
    )
)

_PARSERS = {name.encode("ascii"): cls._parse for name, cls in COMMANDS.items()}  # type: ignore[attr-defined]


def _parse(line: bytes) -> Command:
    space = line.find(b" ")
    name = line if space < 0 else line[:space]
    parser = _PARSERS.get(name)
    if parser is None:
        raise UnknownCommandError(f"unknown command {_quote(name)}", line)
    if not line.isascii():
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedCommandError(f"{name.decode()}: line is not valid UTF-8") from None
    command: Command = parser(line, b"" if space < 0 else line[space + 1 :])
    return command


def _explain(line: bytes) -> ProtocolError:
    """The error this implementation reports for *line* (a line the caller rejected)."""
    try:
        _parse(line)
    except ProtocolError as exc:
        return exc
    return MalformedCommandError(f"cannot parse line {_quote(line)}")


def parse_line(line: str | BytesLike) -> Command:
    """Parse one line (without its newline) into a command.

    Raises :class:`UnknownCommandError` or :class:`MalformedCommandError`, whose
    messages are fit for an ``ERROR`` line.
    """
    if isinstance(line, str):
        try:
            raw = line.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedCommandError("line is not valid Unicode") from None
    else:
        raw = bytes(line)
    if b"\n" in raw:
        raise MalformedCommandError("a line cannot contain a newline")
    return _parse(raw)


def encode_rdata_rows(stream_name: str, instance_name: str, rows: Sequence[tuple[int, bytes]]) -> bytes:
    """Encode rows ``(token, row_json)`` of one writer, in token order, as ``RDATA``
    lines: ``batch`` for every row but the last of each token.

    The row JSON is taken as it is (the writer's own encoding); it must be
    non-empty and without newlines (ValueError). Tokens are 64-bit ints.
    """
    _word(stream_name, "stream_name")
    _word(instance_name, "instance_name")
    head = b"RDATA %b %b " % (stream_name.encode("utf-8"), instance_name.encode("utf-8"))
    out = []
    n = len(rows)
    for i in range(n):
        token, row_json = rows[i]
        token = _int64(token, "token")
        if not isinstance(row_json, bytes):
            raise TypeError(f"row_json must be bytes, not {type(row_json).__name__}")
        if not row_json or b"\n" in row_json:
            raise ValueError("row_json must be non-empty without newlines")
        if i + 1 == n or rows[i + 1][0] != token:
            out.append(b"%b%d %b\n" % (head, token, row_json))
        else:
            out.append(b"%bbatch %b\n" % (head, row_json))
    return b"".join(out)


def group_rdata(commands: list[Command]) -> list[Any]:
    """Group decoded *commands* for a reader that acts once per fact.

    Returns the commands in order, except that consecutive ``RDATA`` commands of
    one writer are replaced by a tuple ``(stream_name, instance_name, token,
    rdata_commands)``: every command of the run is ``batch`` but the last, whose
    token is *token*. A run that ends in ``batch`` (the fact goes on in a later
    chunk, or another writer's row or another command interrupts it) has the
    token None. Runs are never merged across facts, so each tuple with a token
    is one fact, or the end of one.
    """
    out: list[Any] = []
    run: list[Command] | None = None
    run_stream = run_instance = ""
    for command in commands:
        if type(command) is RdataCommand:
            stream = command._stream_name
            instance = command._instance_name
            if run is not None and (stream != run_stream or instance != run_instance):
                out.append((run_stream, run_instance, None, run))
                run = None
            if run is None:
                run = []
                run_stream, run_instance = stream, instance
            run.append(command)
            if command._token is not None:
                out.append((stream, instance, command._token, run))
                run = None
        else:
            if run is not None:
                out.append((run_stream, run_instance, None, run))
                run = None
            out.append(command)
    if run is not None:
        out.append((run_stream, run_instance, None, run))
    return out


def validate_rows(commands: list[RdataCommand]) -> None:
    """Check that the ``row`` of each ``RDATA`` command is valid JSON, without
    keeping what it decodes to (MalformedCommandError on the first that is not)."""
    loads = orjson.loads
    for command in commands:
        if type(command) is not RdataCommand:
            raise TypeError("validate_rows takes RDATA commands only")
        if command._row is _MISSING:
            try:
                loads(command._line[command._row_start :])
            except orjson.JSONDecodeError:
                command.row  # raises the MalformedCommandError that explains it


def rdata_rows(commands: list[RdataCommand]) -> list[Any]:
    """The decoded ``row`` of each ``RDATA`` command, in order
    (MalformedCommandError on the first row that is not valid JSON)."""
    out = []
    loads = orjson.loads
    for command in commands:
        if type(command) is not RdataCommand:
            raise TypeError("rdata_rows takes RDATA commands only")
        row = command._row
        if row is _MISSING:
            try:
                row = loads(command._line[command._row_start :])
            except orjson.JSONDecodeError:
                row = command.row  # raises the MalformedCommandError that explains it
            command._row = row
        out.append(row)
    return out


def _raise_collected(errors: list[ProtocolError], commands: list[Command]) -> None:
    first = errors[0]
    first.commands = commands
    first.errors = errors
    raise first


class Decoder:
    """Turns a byte stream into commands, in chunks of any size.

    ``feed(data)`` returns the commands of every line completed by *data* and
    keeps the partial tail (never more than ``max_line_length`` bytes). Blank
    lines are skipped. A bad line is skipped too; the remaining lines of the
    call are still decoded, and then the first error is raised with every good
    command of the call in ``exc.commands`` and every error in ``exc.errors``.
    The decoder stays usable. An over-long line raises :class:`LineTooLongError`
    as soon as it passes the limit and is dropped up to its newline.
    """

    __slots__ = ("_max_line_length", "_tail", "_discarding")

    def __init__(self, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> None:
        if (
            not isinstance(max_line_length, int)
            or isinstance(max_line_length, bool)
            or max_line_length < 1
        ):
            raise ValueError("max_line_length must be a positive int")
        self._max_line_length = max_line_length
        self._tail = b""
        self._discarding = False

    @property
    def max_line_length(self) -> int:
        """The longest line accepted, in bytes, without its newline."""
        return self._max_line_length

    @property
    def buffered(self) -> int:
        """How many bytes of an incomplete line are held."""
        return len(self._tail)

    def feed(self, data: BytesLike) -> list[Command]:
        """Decode *data*; return the commands of the lines it completes."""
        data = bytes(data)
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            data = data[newline + 1 :]
            self._discarding = False
        if self._tail:
            data = self._tail + data
            self._tail = b""
        lines = data.split(b"\n")
        tail = lines.pop()
        commands: list[Command] = []
        errors: list[ProtocolError] = []
        limit = self._max_line_length
        for line in lines:
            if not line:
                continue
            if len(line) > limit:
                errors.append(_too_long(line, limit))
                continue
            try:
                commands.append(_parse(line))
            except ProtocolError as exc:
                errors.append(exc)
        if len(tail) > limit:
            errors.append(_too_long(tail, limit))
            self._discarding = True
        else:
            self._tail = tail
        if errors:
            _raise_collected(errors, commands)
        return commands


class Encoder:
    """Collects commands into one buffer, for one ``sendall`` per batch."""

    __slots__ = ("_lines", "_size")

    def __init__(self) -> None:
        self._lines: list[bytes] = []
        self._size = 0

    def encode(self, command: Command) -> None:
        """Append *command*'s line and its newline."""
        if not isinstance(command, Command):
            raise TypeError(f"cannot encode {type(command).__name__}: not a Command")
        line = command._line
        self._lines.append(line)
        self._size += len(line) + 1

    def encode_many(self, commands: Iterable[Command]) -> None:
        """Append every command of *commands*, in order."""
        for command in commands:
            self.encode(command)

    def __len__(self) -> int:
        """How many bytes are buffered."""
        return self._size

    def take(self) -> bytes:
        """Return the buffered bytes and empty the buffer."""
        if not self._lines:
            return b""
        self._lines.append(b"")
        data = b"\n".join(self._lines)
        self._lines = []
        self._size = 0
        return data
