"""The replication layer's view of the wire format: typed constructors and encoders.

Everything the protocol and transports need from :mod:`streamrep.wire` goes
through these few functions, so they read as protocol, not encoding. The command
set itself (names, arguments, senders) is declared in :mod:`streamrep.wire_commands`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from streamrep import _impl
from streamrep.errors import ProtocolError, UnknownCommandError
from streamrep.wire_commands import SPECS

if TYPE_CHECKING:
    from streamrep._pure import wire
else:
    wire = _impl.load("wire")

__all__ = [
    "COMMAND_NAMES",
    "DEFAULT_MAX_LINE_LENGTH",
    "BATCH",
    "RdataCommand",
    "new_decoder",
    "encode_one",
    "encode_many",
    "server",
    "ping",
    "name",
    "error",
    "replicate",
    "position",
    "rdata",
    "rdata_lines",
    "rdata_line_list",
    "clear_user_sync",
    "auth_challenge",
    "auth_response",
    "auth_ok",
    "error_message",
    "group_rdata",
    "rdata_rows",
    "validate_rows",
    "UnknownCommand",
    "split_unknown",
]

DEFAULT_MAX_LINE_LENGTH: int = wire.DEFAULT_MAX_LINE_LENGTH
#: The class of RDATA commands, for type checks on the hot path.
RdataCommand = wire.RdataCommand
BATCH = "batch"
#: Consecutive RDATA commands of one writer as ``(stream, instance, token, commands)``.
group_rdata = wire.group_rdata
#: The decoded rows of RDATA commands.
rdata_rows = wire.rdata_rows
validate_rows = wire.validate_rows
COMMAND_NAMES: tuple[str, ...] = tuple(SPECS)


def new_decoder(max_line_length: int) -> wire.Decoder:
    return wire.Decoder(max_line_length=max_line_length)


def encode_one(command: wire.Command) -> bytes:
    """One command as a line, newline included."""
    return command.to_bytes() + b"\n"


def encode_many(commands: Iterable[wire.Command]) -> bytes:
    """Several commands as consecutive lines, for one write."""
    encoder = wire.Encoder()
    encoder.encode_many(commands)
    return encoder.take()


def server(server_name: str) -> wire.ServerCommand:
    return wire.ServerCommand(server_name)


def ping() -> wire.PingCommand:
    import time

    return wire.PingCommand(str(int(time.time() * 1000)))


def name(client_name: str) -> wire.NameCommand:
    return wire.NameCommand(client_name)


def error(message: str) -> wire.ErrorCommand:
    return wire.ErrorCommand(message)


def replicate(stream: str | None = None, token: int | None = None) -> wire.ReplicateCommand:
    """``REPLICATE`` (no stream), or the legacy form from *token* (None: ``NOW``)."""
    return wire.ReplicateCommand(stream, token)


def position(stream: str, instance: str, prev_token: int, new_token: int) -> wire.PositionCommand:
    return wire.PositionCommand(stream, instance, prev_token, new_token)


def rdata(stream: str, instance: str, token: int | None, row_json: bytes) -> wire.RdataCommand:
    return wire.RdataCommand(stream, instance, token, row_json=row_json)


def clear_user_sync(instance_id: str) -> wire.ClearUserSyncCommand:
    return wire.ClearUserSyncCommand(instance_id)


def auth_challenge(nonce: str) -> wire.AuthChallengeCommand:
    return wire.AuthChallengeCommand(nonce)


def auth_response(instance_name: str, nonce: str, proof: str) -> wire.AuthResponseCommand:
    return wire.AuthResponseCommand(instance_name, nonce, proof)


def auth_ok(proof: str) -> wire.AuthOkCommand:
    return wire.AuthOkCommand(proof)


def error_message(command: wire.ErrorCommand) -> str:
    return command.data


def rdata_lines(stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> bytes:
    """Encode rows ``(token, row_json)`` in token order as RDATA lines, with
    ``batch`` for every row but the last of each token."""
    return wire.encode_rdata_rows(stream, instance, rows)


def rdata_line_list(stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> list[bytes]:
    """As :func:`rdata_lines`, one bytes object per line."""
    # Built directly: this is the hub's hottest loop. The prefix is validated once
    # by building a real command from it.
    rdata(stream, instance, 0, b"0")
    head = f"RDATA {stream} {instance} ".encode()
    out = []
    n = len(rows)
    for i, (token, row_json) in enumerate(rows):
        if b"\n" in row_json:
            raise ValueError("row JSON cannot contain a newline")
        if i + 1 == n or rows[i + 1][0] != token:
            out.append(b"%b%d %b\n" % (head, token, row_json))
        else:
            out.append(b"%bbatch %b\n" % (head, row_json))
    return out


def position_lines(positions: Iterable[tuple[str, str, int, int]]) -> tuple[bytes, int]:
    """``POSITION`` lines of ``(stream, instance, prev_token, new_token)``, and how many."""
    lines = [encode_one(position(s, i, prev, new)) for s, i, prev, new in positions]
    return b"".join(lines), len(lines)


class UnknownCommand:
    """A line whose command this protocol does not know, as it came: ``NAME`` is
    its first word, ``line`` the whole line. A reader hands such lines on instead
    of refusing them, since a newer peer may send commands this one never heard of
    (the reference adds some from release to release)."""

    __slots__ = ("NAME", "line")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.NAME = line.split(b" ", 1)[0].decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"UnknownCommand({self.line!r})"


def split_unknown(error: ProtocolError) -> tuple[list[UnknownCommand], list[ProtocolError]]:
    """The errors of a failed read (``error.errors``, or *error* alone): the lines
    naming unknown commands, and every other problem."""
    unknown: list[UnknownCommand] = []
    problems: list[ProtocolError] = []
    for problem in error.errors or (error,):
        if type(problem) is UnknownCommandError and problem.line:
            unknown.append(UnknownCommand(problem.line))
        else:
            problems.append(problem)
    return unknown, problems
