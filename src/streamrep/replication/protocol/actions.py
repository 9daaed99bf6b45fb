"""What a session asks its transport to do: the protocol's actions, as data.

A transport hands decoded commands to a session and carries out the actions it
returns, in order (see :mod:`streamrep.replication.protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

__all__ = [
    "DisconnectReason", "Send", "Publish", "Relay", "Fact", "FillGap", "GapUnfilled",
    "Refused", "Confirmed", "CatchUp", "Received", "Close", "Action",
]


class DisconnectReason:
    """The reasons a connection ends, as they appear in metrics."""

    PEER_CLOSED = "peer_closed"
    TIMEOUT = "timeout"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    SLOW_CONSUMER = "slow_consumer"
    PROTOCOL_ERROR = "protocol_error"
    REFUSED = "refused"
    PEER_ERROR = "peer_error"
    SOCKET_ERROR = "socket_error"
    SERVER_STOPPING = "server_stopping"
    LOCAL_CLOSE = "local_close"
    WRONG_SERVER = "wrong_server"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    CATCH_UP_FAILED = "catch_up_failed"
    GAP_UNFILLED = "gap_unfilled"
    IDLE_TIMEOUT = "idle_timeout"
    PENDING_EVICTED = "pending_evicted"


@dataclass(slots=True)
class Send:
    """Queue *data* (*count* encoded lines named *name*) to this peer."""

    data: bytes
    count: int
    name: str


@dataclass(slots=True)
class Publish:
    """Queue stream lines to every other peer that follows *stream* now."""

    stream: str
    data: bytes
    count: int
    name: str


@dataclass(slots=True)
class Relay:
    """Queue one non-stream command to every other peer."""

    data: bytes
    name: str


@dataclass(slots=True)
class Fact:
    """Hand a fact to the application. *prev* is the writer's position before it
    (what :meth:`FollowerState.rewind` goes back to if the handler fails)."""

    stream: str
    instance: str
    token: int
    rows: list[Any]
    prev: int | None


@dataclass(slots=True)
class FillGap:
    """Read *instance*'s rows of *stream* with ``from_token < token <= upto_token``
    from the catch-up source and feed them back. On the hub, *then_token* (when set)
    is the position to publish once the rows are out. *expect*: the ``RDATA`` lines
    this fill stands in for (a reader that verifies what it hears against its
    database), ``token -> [row_json]``, to compare with the stored rows."""

    stream: str
    instance: str
    from_token: int
    upto_token: int
    then_token: int | None = None
    expect: dict[int, list[bytes]] | None = None


@dataclass(slots=True)
class GapUnfilled:
    """A gap that cannot be filled here (no database); the position is left alone."""

    stream: str
    instance: str
    from_token: int
    upto_token: int


@dataclass(slots=True)
class Refused:
    """A command a verifying reader did not take as a fact (*reason* says why);
    positions did not move."""

    stream: str
    instance: str
    reason: str


@dataclass(slots=True)
class Confirmed:
    """The far end accepted writer *instance*'s facts on *stream* up to *token*."""

    stream: str
    instance: str
    token: int


@dataclass(slots=True)
class CatchUp:
    """Stream *stream*'s stored rows after *from_token* to this peer, then make it live
    (see :meth:`HubState.catch_up_behind` and :meth:`HubPeer.catch_up_done`)."""

    stream: str
    from_token: int


@dataclass(slots=True)
class Received:
    """A command for the application (relayed presence, locks, tasks, ...)."""

    command: Any


@dataclass(slots=True)
class Close:
    """Close this peer, sending ``ERROR <error>`` first when *error* is set."""

    reason: str
    error: str | None = None


Action = Union[Send, Publish, Relay, Fact, FillGap, GapUnfilled, Refused, Confirmed, CatchUp, Received, Close]
