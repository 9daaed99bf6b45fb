"""The replication wire format: parse lines, decode byte streams, encode batches.

This is the public API; it re-exports the compiled core (``streamrep._core.wire``)
or, with ``STREAMREP_NO_EXTENSIONS=1``, its pure-Python twin. See
``docs/wire-protocol.md`` for every command and its arguments.

>>> from streamrep.wire import parse_line
>>> cmd = parse_line(b'RDATA events master 54 ["$ev:hs",null]')
>>> cmd.NAME, cmd.stream_name, cmd.token
('RDATA', 'events', 54)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrep import _impl
from streamrep.errors import (
    LineTooLongError,
    MalformedCommandError,
    ProtocolError,
    UnknownCommandError,
)

if TYPE_CHECKING:
    from streamrep._pure import wire as _core_wire
else:
    _core_wire = _impl.load("wire")

Command = _core_wire.Command
ServerCommand = _core_wire.ServerCommand
RdataCommand = _core_wire.RdataCommand
PositionCommand = _core_wire.PositionCommand
ErrorCommand = _core_wire.ErrorCommand
PingCommand = _core_wire.PingCommand
NameCommand = _core_wire.NameCommand
ReplicateCommand = _core_wire.ReplicateCommand
UserSyncCommand = _core_wire.UserSyncCommand
ClearUserSyncCommand = _core_wire.ClearUserSyncCommand
FederationAckCommand = _core_wire.FederationAckCommand
UserIpCommand = _core_wire.UserIpCommand
RemoteServerUpCommand = _core_wire.RemoteServerUpCommand
LockReleasedCommand = _core_wire.LockReleasedCommand
NewActiveTaskCommand = _core_wire.NewActiveTaskCommand
CancelTaskCommand = _core_wire.CancelTaskCommand
AuthChallengeCommand = _core_wire.AuthChallengeCommand
AuthResponseCommand = _core_wire.AuthResponseCommand
AuthOkCommand = _core_wire.AuthOkCommand

#: Every command class by its wire name (``"RDATA"`` -> :class:`RdataCommand`, ...).
COMMANDS = _core_wire.COMMANDS
#: The decoder's default limit on one line, in bytes, without its newline.
DEFAULT_MAX_LINE_LENGTH = _core_wire.DEFAULT_MAX_LINE_LENGTH

parse_line = _core_wire.parse_line
encode_row = _core_wire.encode_row
Decoder = _core_wire.Decoder
Encoder = _core_wire.Encoder

#: Whether the compiled core is in use (False with ``STREAMREP_NO_EXTENSIONS=1``).
COMPILED: bool = _impl.is_compiled(_core_wire)

__all__ = [
    "COMPILED",
    "COMMANDS",
    "DEFAULT_MAX_LINE_LENGTH",
    "AuthChallengeCommand",
    "AuthOkCommand",
    "AuthResponseCommand",
    "CancelTaskCommand",
    "ClearUserSyncCommand",
    "Command",
    "Decoder",
    "Encoder",
    "ErrorCommand",
    "FederationAckCommand",
    "LineTooLongError",
    "LockReleasedCommand",
    "MalformedCommandError",
    "NameCommand",
    "NewActiveTaskCommand",
    "PingCommand",
    "PositionCommand",
    "ProtocolError",
    "RdataCommand",
    "RemoteServerUpCommand",
    "ReplicateCommand",
    "ServerCommand",
    "UnknownCommandError",
    "UserIpCommand",
    "UserSyncCommand",
    "encode_row",
    "parse_line",
]
