"""The replication protocol, sans-IO: decoded commands and the time in, actions out.

Nothing here touches a socket, a greenlet, a timer or a database. A transport
(:mod:`streamrep.replication.transport`) decodes what arrives, hands the
commands to a session with the current time, and carries out the actions the
session returns, in order:

* :class:`Send`: queue these encoded lines to this peer (or, on a bus, publish them);
* :class:`Publish`: stream lines for every other peer following the stream (hub);
* :class:`Relay`: a non-stream command for every other peer (hub);
* :class:`Fact`: hand one fact to the application's handler;
* :class:`FillGap`: read a writer's rows between two tokens from the database and
  feed them back (:meth:`FollowerState.gap_facts` on a reader,
  :meth:`HubState.fill_rows` then :meth:`HubState.fill_done` on the hub);
* :class:`GapUnfilled`: a gap with no database to fill it from;
* :class:`CatchUp`: stream a stream's stored rows after a token to this peer (hub);
* :class:`Received`: a command for the application (``USER_IP``, ``LOCK_RELEASED``, ...);
* :class:`Close`: send ``ERROR <error>`` (when given) and close this peer.

Sessions:

* :class:`ClientSession`: a worker's or writer's end of a TCP connection to the hub;
* :class:`HubPeer` (one per connection) over :class:`HubState` (the hub's shared
  positions, who may write what, presence): the hub's end;
* :class:`BusSession`: one process on a shared bus (Redis), where there is no
  hub: every process publishes its own commands, sees everyone else's, answers
  every ``REPLICATE`` with its own positions, ignores its own echoes and fills
  gaps from the database.

Each session binds its ``on_<COMMAND>`` handlers once, for the commands its peer
may send (:func:`streamrep.wire_commands.accepted_from`); anything else is refused
with ``ERROR`` and a close. Keepalive is data (:class:`Keepalive`): the transport
calls :meth:`Session.tick` now and then and reports writes with
:meth:`Session.data_sent`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Mapping, Sequence, Union

import orjson

from streamrep.errors import MalformedCommandError, ProtocolError
from streamrep.replication import commands as C
from streamrep.replication.outbound import DEFAULT_MAX_QUEUED_COMMANDS
from streamrep.wire_commands import CLIENT_SIDE, SERVER_SIDE, SPECS, accepted_from

if TYPE_CHECKING:
    from streamrep._pure import wire
    from streamrep.config import Config

__all__ = [
    "ConnectionSettings",
    "DisconnectReason",
    "Send",
    "Publish",
    "Relay",
    "Fact",
    "FillGap",
    "GapUnfilled",
    "CatchUp",
    "Received",
    "Close",
    "Action",
    "Keepalive",
    "Session",
    "FollowerState",
    "ClientSession",
    "HubState",
    "HubPeer",
    "BusSession",
    "group_facts",
]

_group_rdata = C.group_rdata
_rdata_rows = C.rdata_rows
_loads = orjson.loads
_ALL = "ALL"


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


class ConnectionSettings:
    """Tunables shared by every connection of one hub or client.

    ``handshake_timeout``: a hub peer that has sent no valid ``NAME`` by then is
    closed. ``max_pending_rows``: ``batch`` rows one peer may hold back before the
    row with their token (default: ``max_queued_commands``, since a larger fact
    could not be queued to any reader anyway). ``max_connections`` and
    ``max_connections_per_host``: the hub's limits on peers.
    """

    __slots__ = ("ping_interval", "ping_timeout", "max_queued_commands", "max_line_length",
                 "handshake_timeout", "max_pending_rows", "max_connections", "max_connections_per_host")

    def __init__(
        self,
        ping_interval: float = 5.0,
        ping_timeout: float = 15.0,
        max_queued_commands: int = DEFAULT_MAX_QUEUED_COMMANDS,
        max_line_length: int = C.DEFAULT_MAX_LINE_LENGTH,
        handshake_timeout: float = 10.0,
        max_pending_rows: int | None = None,
        max_connections: int = 1000,
        max_connections_per_host: int = 200,
    ) -> None:
        if ping_interval <= 0 or ping_timeout <= 0 or handshake_timeout <= 0:
            raise ValueError("ping_interval, ping_timeout and handshake_timeout must be positive")
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_queued_commands = max_queued_commands
        self.max_line_length = max_line_length
        self.handshake_timeout = handshake_timeout
        self.max_pending_rows = max_pending_rows if max_pending_rows is not None else max_queued_commands
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host

    @classmethod
    def from_config(cls, config: Config) -> ConnectionSettings:
        """The settings a deployment's configuration file gives (``keepalive`` and
        ``backpressure``), the same for the hub and every process connecting to it."""
        return cls(
            ping_interval=config.keepalive.ping_interval,
            ping_timeout=config.keepalive.timeout,
            max_queued_commands=config.backpressure.max_queue,
            max_line_length=config.backpressure.max_line_length,
        )


# --- actions ------------------------------------------------------------------------------


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
    from the database and feed them back. On the hub, *then_token* (when set) is
    the position to publish once the rows are out."""

    stream: str
    instance: str
    from_token: int
    upto_token: int
    then_token: int | None = None


@dataclass(slots=True)
class GapUnfilled:
    """A gap that cannot be filled here (no database); the position is left alone."""

    stream: str
    instance: str
    from_token: int
    upto_token: int


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


Action = Union[Send, Publish, Relay, Fact, FillGap, GapUnfilled, CatchUp, Received, Close]


def _encode_positions(positions: Iterable[tuple[str, str, int, int]]) -> tuple[bytes, int]:
    lines = [C.encode_one(C.position(s, i, prev, new)) for s, i, prev, new in positions]
    return b"".join(lines), len(lines)


def group_facts(rows: Sequence[tuple[int, bytes]]) -> list[tuple[int, list[Any]]]:
    """Group ``(token, row_json)`` rows (token order) into facts ``(token, rows)``."""
    facts: list[tuple[int, list[Any]]] = []
    for token, row_json in rows:
        row = _loads(row_json)
        if facts and facts[-1][0] == token:
            facts[-1][1].append(row)
        else:
            facts.append((token, [row]))
    return facts


# --- keepalive ----------------------------------------------------------------------------


class Keepalive:
    """When to ping and when to give up on a peer, as data.

    Each end sends something at least every ``ping_interval`` seconds (a ``PING``
    when nothing else went out). Once the peer has sent a ``PING`` it must keep
    talking: silence longer than ``ping_timeout`` closes it. A peer that never
    pings is never timed out by this rule (the hub's handshake deadline still
    applies to it).
    """

    __slots__ = ("ping_interval", "ping_timeout", "last_sent", "last_received", "ping_seen")

    def __init__(self, settings: ConnectionSettings, now: float) -> None:
        self.ping_interval = settings.ping_interval
        self.ping_timeout = settings.ping_timeout
        self.last_sent = now
        self.last_received = now
        self.ping_seen = False

    @property
    def check_interval(self) -> float:
        """How often a transport should call :meth:`Session.tick`."""
        return min(self.ping_interval, self.ping_timeout) / 4

    def due(self, now: float, idle: bool) -> Action | None:
        """A ``Close`` for a silent peer, a ``Send`` of ``PING`` when we have been
        quiet (and nothing is queued), or None."""
        if self.ping_seen and now - self.last_received > self.ping_timeout:
            return Close(DisconnectReason.TIMEOUT, f"no command received for {self.ping_timeout:g} seconds")
        if idle and now - self.last_sent >= self.ping_interval:
            # Counted as sent now, so a slow flush does not trigger a burst.
            self.last_sent = now
            return Send(C.encode_one(C.ping()), 1, "PING")
        return None


# --- sessions -----------------------------------------------------------------------------


class Session:
    """What every session shares: dispatch bound once, keepalive, closing.

    *peer_side* is the side the peer plays (:data:`~streamrep.wire_commands.SERVER_SIDE`
    or :data:`~streamrep.wire_commands.CLIENT_SIDE`); only the commands it may send
    get a handler. ``None`` (a bus) accepts every declared command.
    """

    peer_side: str | None = None

    def __init__(self, settings: ConnectionSettings, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.settings = settings
        self.keepalive = Keepalive(settings, now)
        self.started_at = now
        self.closed = False
        self.close_reason: str | None = None
        allowed = SPECS.keys() if self.peer_side is None else accepted_from(self.peer_side)
        self._handlers: dict[str, Callable[[Any, list[Action]], None]] = {}
        for name in allowed:
            handler = getattr(self, f"on_{name}", None)
            if handler is not None:
                self._handlers[name] = handler

    # --- driven by the transport ---------------------------------------------------------

    def receive(self, commands: list[Any], now: float) -> list[Action]:
        """Act on decoded *commands* received at *now*."""
        self.keepalive.last_received = now
        out: list[Action] = []
        try:
            self._dispatch(commands, out)
        except ProtocolError as exc:
            self._close(out, DisconnectReason.PROTOCOL_ERROR, str(exc))
        return out

    def receive_failed(self, error: ProtocolError, now: float) -> list[Action]:
        """A read whose decoding failed: act on its good commands (``error.commands``),
        then close with the error's message."""
        out = self.receive(list(getattr(error, "commands", None) or ()), now)
        if not self.closed:
            self._close(out, DisconnectReason.PROTOCOL_ERROR, str(error))
        return out

    def tick(self, now: float, idle: bool) -> list[Action]:
        """Timers: *idle* says nothing is waiting to be written to this peer."""
        if self.closed:
            return []
        action = self.keepalive.due(now, idle)
        if action is None:
            return []
        if type(action) is Close:
            self._mark_closed(action.reason)
        return [action]

    def data_sent(self, now: float) -> None:
        """The transport handed lines to the peer at *now*."""
        self.keepalive.last_sent = now

    def closing(self, reason: str) -> None:
        """The transport closed the connection (any reason); idempotent."""
        self._mark_closed(reason)

    # --- for subclasses --------------------------------------------------------------------

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        handlers = self._handlers
        for command in commands:
            if self.closed:
                return
            handler = handlers.get(command.NAME)
            if handler is None:
                self._refuse(command, out)
                return
            handler(command, out)

    def _refuse(self, command: Any, out: list[Action]) -> None:
        sender = {CLIENT_SIDE: "a client", SERVER_SIDE: "a server"}.get(self.peer_side or "", "a peer")
        self._close(out, DisconnectReason.PROTOCOL_ERROR, f"{command.NAME} is not accepted from {sender}")

    def _close(self, out: list[Action], reason: str, error: str | None = None) -> None:
        if not self.closed:
            self._mark_closed(reason)
            out.append(Close(reason, error))

    def _mark_closed(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason

    def on_PING(self, command: Any, out: list[Action]) -> None:
        self.keepalive.ping_seen = True

    def on_ERROR(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))
        self._close(out, DisconnectReason.PEER_ERROR)


# --- readers: positions per writer ----------------------------------------------------------


class FollowerState:
    """A reader's position per ``(stream, instance)``, as actions.

    ``RDATA`` ``batch`` rows wait for the row with the token; a fact at or below
    the writer's position is a replay and is dropped; a ``POSITION`` whose
    ``prev_token`` is past the position is a gap: :class:`FillGap` when the
    reader has a database (*can_fill*), :class:`GapUnfilled` otherwise.

    Positions move when the actions are made; a transport whose handler fails
    calls :meth:`rewind` with the actions it did not finish.
    """

    def __init__(self, streams: Iterable[str] | None = None, start_from: Mapping[Any, int] | None = None,
                 can_fill: bool = False) -> None:
        self.streams = frozenset(streams) if streams is not None else None
        self.start_from: dict[Any, int] = dict(start_from or {})
        self.can_fill = can_fill
        self.positions: dict[tuple[str, str], int] = {}
        self._pending: dict[tuple[str, str], list[Any]] = {}

    def follows(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams

    def base(self, key: tuple[str, str]) -> int | None:
        """Where the reader is for *key*: its position, else its configured start."""
        pos = self.positions.get(key)
        if pos is not None:
            return pos
        base = self.start_from.get(key)
        if base is None:
            base = self.start_from.get(key[0])
        return base

    def connection_lost(self) -> None:
        """Forget half-received batches: facts are always resent whole."""
        self._pending.clear()

    def rdata(self, stream: str, instance: str, token: int | None, row: Any, out: list[Action]) -> None:
        """One decoded ``RDATA`` row (*token* None: ``batch``)."""
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        if token is None:
            self._pending.setdefault(key, []).append(row)
            return
        pending = self._pending.pop(key, None)
        self._fact(key, token, pending + [row] if pending else [row], out)

    def rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any],
                  out: list[Action]) -> None:
        """Consecutive ``RDATA`` commands of one writer, all ``batch`` but the last
        (whose token is *token*; None: the fact goes on in a later read). Rows of a
        dropped fact are never decoded."""
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        if token is None:
            waiting = self._pending.get(key)
            rows = _rdata_rows(commands)
            if waiting is None:
                self._pending[key] = rows
            else:
                waiting.extend(rows)
            return
        pending = self._pending.pop(key, None)
        pos = self.positions.get(key)
        base = pos if pos is not None else self.base(key)
        if base is not None and token <= base:
            return
        if pending:
            pending.extend(_rdata_rows(commands))
            rows = pending
        else:
            rows = _rdata_rows(commands)
        self.positions[key] = token
        out.append(Fact(stream, instance, token, rows, base))

    def _fact(self, key: tuple[str, str], token: int, rows: list[Any], out: list[Action]) -> None:
        base = self.base(key)
        if base is not None and token <= base:
            return
        self.positions[key] = token
        out.append(Fact(key[0], key[1], token, rows, base))

    def position(self, stream: str, instance: str, prev_token: int, new_token: int, out: list[Action]) -> None:
        """A ``POSITION``."""
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        self._pending.pop(key, None)
        base = self.base(key)
        if base is None:
            self.positions[key] = new_token
            return
        if prev_token > base:
            if not self.can_fill:
                out.append(GapUnfilled(stream, instance, base, prev_token))
                return
            out.append(FillGap(stream, instance, base, new_token))
        if new_token > self.positions.get(key, base):
            self.positions[key] = new_token
        elif key not in self.positions:
            self.positions[key] = base

    def gap_facts(self, stream: str, instance: str, after: int, rows: Sequence[tuple[int, bytes]]) -> list[Fact]:
        """Facts of database rows ``(token, row_json)`` filling a gap, past *after*
        (rows at or below it were delivered already)."""
        out: list[Fact] = []
        prev = after
        for token, fact_rows in group_facts(rows):
            if token <= prev:
                continue
            out.append(Fact(stream, instance, token, fact_rows, prev))
            prev = token
        return out

    def skip_gap(self, gap: GapUnfilled) -> None:
        """Accept that a gap will not be filled: move past it."""
        key = (gap.stream, gap.instance)
        if gap.upto_token > self.positions.get(key, gap.from_token):
            self.positions[key] = gap.upto_token

    def rewind(self, stream: str, instance: str, token: int | None) -> None:
        """The application did not take facts after *token*: go back there (None:
        the writer was never seen)."""
        key = (stream, instance)
        if token is None:
            self.positions.pop(key, None)
        elif token < self.positions.get(key, token + 1):
            self.positions[key] = token

    def rewind_unfinished(self, actions: Iterable[Action]) -> None:
        """Rewind for every :class:`Fact` and :class:`FillGap` not carried out."""
        for action in actions:
            if type(action) is Fact:
                self.rewind(action.stream, action.instance, action.prev)
            elif type(action) is FillGap:
                self.rewind(action.stream, action.instance, action.from_token)

    def resume_tokens(self) -> dict[str, int]:
        """Per stream, the token to resume from through the hub: the lowest position
        over its writers (facts already seen are dropped on arrival)."""
        tokens: dict[str, int] = {}
        for (stream, _instance), pos in self.positions.items():
            tokens[stream] = min(pos, tokens.get(stream, pos))
        for key, base in self.start_from.items():
            stream = key if isinstance(key, str) else key[0]
            if isinstance(key, str) and stream in tokens:
                continue  # every writer the hub knows has a position already
            tokens[stream] = min(base, tokens.get(stream, base))
        return tokens


# --- the client's end of a TCP connection ----------------------------------------------------


class ClientSession(Session):
    """A worker's or writer's end of one connection to the hub.

    *follower* is None for a process that only writes. *writer_positions* are
    this process's persisted positions ``(stream, instance, token)``, announced
    first so the hub fills what it missed. *resume_through_hub*: the reader has
    no database, so it asks the hub to stream what it missed (legacy
    ``REPLICATE <stream> <token>``) instead of filling gaps itself. A gap such
    a reader cannot fill (:class:`GapUnfilled`) closes the session at once,
    so no later fact of the read moves a position past the missing ones.
    """

    peer_side = SERVER_SIDE

    def __init__(self, settings: ConnectionSettings, *, client_name: str, server_name: str | None = None,
                 follower: FollowerState | None = None, resume_through_hub: bool = False,
                 now: float | None = None) -> None:
        super().__init__(settings, now)
        self.client_name = client_name
        self.expected_server = server_name
        self.server_name: str | None = None
        self.follower = follower
        self.resume_through_hub = resume_through_hub

    def greeting(self, writer_positions: Sequence[tuple[str, str, int]] = ()) -> list[Action]:
        """What the client sends on a new connection: ``NAME``, ``PING``, its
        writers' positions, ``REPLICATE``."""
        out: list[Action] = [Send(C.encode_one(C.name(self.client_name)), 1, "NAME"),
                             Send(C.encode_one(C.ping()), 1, "PING")]
        if writer_positions:
            data, count = _encode_positions((s, i, t, t) for s, i, t in writer_positions)
            out.append(Send(data, count, "POSITION"))
        for command in self.replicate_commands():
            out.append(Send(C.encode_one(command), 1, "REPLICATE"))
        return out

    def replicate_commands(self) -> list[Any]:
        """The ``REPLICATE`` commands for a new connection."""
        follower = self.follower
        if follower is None:
            return []
        if not self.resume_through_hub:
            return [C.replicate()]
        tokens = follower.resume_tokens()
        if follower.streams is None and not tokens:
            return [C.replicate(_ALL, None)]
        # Each stream from its own token (one token for all would replay the
        # busiest streams from the quietest one's position).
        names = sorted(follower.streams) if follower.streams is not None else sorted(tokens)
        return [C.replicate(stream, tokens.get(stream)) for stream in names]

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        # RDATA is nearly all of the traffic: the core groups consecutive rows of
        # one writer, so the bookkeeping runs once per fact, not per row.
        follower = self.follower
        if follower is None:
            super()._dispatch(commands, out)
            return
        on_run = follower.rdata_run
        handlers = self._handlers
        for item in _group_rdata(commands):
            if self.closed:
                return
            if type(item) is tuple:
                on_run(item[0], item[1], item[2], item[3], out)
                continue
            handler = handlers.get(item.NAME)
            if handler is None:
                self._refuse(item, out)
                return
            handler(item, out)

    def on_SERVER(self, command: Any, out: list[Action]) -> None:
        self.server_name = command.data
        if self.expected_server is not None and command.data != self.expected_server:
            self._close(out, DisconnectReason.WRONG_SERVER,
                        f"expected server {self.expected_server}, found {command.data}")

    def on_RDATA(self, command: Any, out: list[Action]) -> None:
        if self.follower is not None:
            try:
                row = _loads(command.row_json)
            except orjson.JSONDecodeError:
                row = command.row  # raises the wire format's own MalformedCommandError
            self.follower.rdata(command.stream_name, command.instance_name, command.token, row, out)

    def on_POSITION(self, command: Any, out: list[Action]) -> None:
        if self.follower is not None:
            before = len(out)
            self.follower.position(command.stream_name, command.instance_name, command.prev_token,
                                   command.new_token, out)
            if len(out) > before and type(out[-1]) is GapUnfilled:
                # No database to fill it: resynchronise through the hub from the
                # positions as they are now. Nothing after the gap is taken, since
                # a later fact of this writer would move its position past the
                # missing ones and the hub would never send them.
                self._close(out, DisconnectReason.GAP_UNFILLED)

    def _other(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))

    on_USER_SYNC = on_CLEAR_USER_SYNC = on_FEDERATION_ACK = on_USER_IP = _other
    on_REMOTE_SERVER_UP = on_LOCK_RELEASED = on_NEW_ACTIVE_TASK = on_CANCEL_TASK = _other


# --- the hub ------------------------------------------------------------------------------


class HubState:
    """What the hub knows across connections (sans-IO): every writer's published
    position, which streams it can read from its database, who may write what,
    which writer instances are connected, and presence.

    * *readable*: the streams whose rows the hub can read (catch-up, gap
      filling), or a test ``stream -> bool``.
    * *stream_writers*: stream -> the instances configured to write it; a peer
      may send ``RDATA``/``POSITION`` only for a stream it writes, under its own
      ``NAME``. None lets any named peer write any stream (embedding, tests).
    * *own_instances*: writer instances of the hub's own process; no peer may
      speak for them.
    * *stored_token*: ``(stream, instance) -> token``, the largest token of the
      writer that the database holds (writers commit before they announce; see
      :meth:`~streamrep.replication.source.StreamSource.stored_token`). An
      ``RDATA`` or ``POSITION`` past it is refused and the hub's position for the
      writer does not move, so no token can silence a writer and nothing is
      skipped if the database was only behind (the writer reconnects, announces
      again, and the hub fills from the database). It is read only when a token
      passes what was last read, so at most once per read of a busy writer.
    * *row_check*: ``(stream, rdata_commands) -> problem or None``, the stream's
      row format (:meth:`streamrep.streams.StreamSet.check_rows`); a relayed row
      that does not fit closes its peer with ``ERROR``. Without one, rows are
      only checked to be JSON.
    """

    def __init__(
        self,
        server_name: str,
        settings: ConnectionSettings,
        *,
        readable: Callable[[str], bool] | Collection[str] = (),
        stream_writers: Mapping[str, Collection[str]] | None = None,
        own_instances: Collection[str] = ("main",),
        stored_token: Callable[[str, str], int] | None = None,
        row_check: Callable[[str, Sequence[Any]], str | None] | None = None,
    ) -> None:
        self.server_name = server_name
        self.row_check = row_check
        self.settings = settings
        if callable(readable):
            self._readable = readable
            listed: Collection[str] = ()
        else:
            listed = frozenset(readable)
            self._readable = listed.__contains__
        self.stream_writers = ({s: frozenset(ws) for s, ws in stream_writers.items()}
                               if stream_writers is not None else None)
        self.own_instances = frozenset(own_instances)
        self.stored_token = stored_token
        self.positions: dict[tuple[str, str], int] = {}
        self.known_streams: dict[str, None] = dict.fromkeys(sorted(listed))
        self.syncing_users: dict[str, set[str]] = {}
        self.peers: list[HubPeer] = []
        self._writer_peers: dict[str, HubPeer] = {}
        self._verified: dict[tuple[str, str], int] = {}
        self._peers_per_host: dict[str, int] = {}

    # --- peers -------------------------------------------------------------------------------

    def admit(self, host: str) -> str | None:
        """Why a new connection from *host* must be refused, or None to accept it."""
        if len(self.peers) >= self.settings.max_connections:
            return f"too many connections (limit {self.settings.max_connections})"
        if self._peers_per_host.get(host, 0) >= self.settings.max_connections_per_host:
            return f"too many connections from {host} (limit {self.settings.max_connections_per_host})"
        return None

    def new_peer(self, label: str, host: str = "", now: float | None = None) -> HubPeer:
        """The session of a connection just accepted (after :meth:`admit`)."""
        peer = HubPeer(self, label, host, now)
        self.peers.append(peer)
        self._peers_per_host[host] = self._peers_per_host.get(host, 0) + 1
        return peer

    def peer_lost(self, peer: HubPeer) -> list[Action]:
        """A connection ended: forget it; its instances' syncing users go too
        (announced to the others as ``CLEAR_USER_SYNC``)."""
        if peer in self.peers:
            self.peers.remove(peer)
            left = self._peers_per_host.get(peer.host, 1) - 1
            if left > 0:
                self._peers_per_host[peer.host] = left
            else:
                self._peers_per_host.pop(peer.host, None)
        if peer.name is not None and self._writer_peers.get(peer.name) is peer:
            del self._writer_peers[peer.name]
        out: list[Action] = []
        for instance_id in peer.sync_instances:
            self.clear_user_sync(instance_id)
            out.append(Relay(C.encode_one(C.clear_user_sync(instance_id)), "CLEAR_USER_SYNC"))
        return out

    def is_writer(self, instance: str) -> bool:
        if self.stream_writers is None:
            return True
        return any(instance in ws for ws in self.stream_writers.values())

    def claim_writer(self, instance: str, peer: HubPeer) -> str | None:
        """Make *peer* the one live connection of writer *instance*; why not, or None."""
        if instance in self.own_instances:
            return f"{instance} is this hub's own instance"
        holder = self._writer_peers.get(instance)
        if holder is not None and holder is not peer and not holder.closed:
            return f"writer {instance} is already connected ({holder.label})"
        self._writer_peers[instance] = peer
        return None

    def may_write(self, peer_name: str | None, stream: str, instance: str) -> str | None:
        """Why a peer named *peer_name* may not send rows or positions of *instance*
        on *stream*, or None when it may."""
        if peer_name is None:
            return f"send NAME before writing {stream}"
        if instance in self.own_instances:
            return f"{instance} is this hub's own instance"
        if instance != peer_name:
            return f"{peer_name} cannot write as {instance}"
        if self.stream_writers is not None and instance not in self.stream_writers.get(stream, ()):
            return f"{instance} is not a configured writer of {stream}"
        return None

    def token_limit(self, stream: str, instance: str, token: int) -> int | None:
        """None when *token* of a writer peer is within what the database holds,
        else the largest token it holds."""
        if self.stored_token is None or not self._readable(stream):
            return None
        key = (stream, instance)
        if token <= self._verified.get(key, -1):
            return None
        stored = self.stored_token(stream, instance)
        self._verified[key] = stored
        return stored if token > stored else None

    # --- streams -----------------------------------------------------------------------------

    def load_positions(self, positions: Iterable[tuple[str, str, int]]) -> None:
        """Writers' persisted positions ``(stream, instance, token)`` (at start-up)."""
        for stream, instance, token in positions:
            self.known_streams.setdefault(stream, None)
            key = (stream, instance)
            self.positions[key] = max(token, self.positions.get(key, token))

    def stream_names(self) -> list[str]:
        return list(self.known_streams)

    def readable(self, stream: str) -> bool:
        """Whether the hub can read *stream*'s rows from its database."""
        return self._readable(stream)

    def writers(self, stream: str) -> list[str]:
        return [inst for (s, inst) in self.positions if s == stream]

    def position_lines(self, stream: str | None = None) -> tuple[bytes, int]:
        """``POSITION`` for every (stream, writer) known (or of one stream), encoded."""
        return _encode_positions((s, i, t, t) for (s, i), t in self.positions.items()
                                 if stream is None or s == stream)

    def publish_rows(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]],
                     new_token: int | None = None) -> list[Action]:
        """Rows ``(token, row_json)`` of a writer (token order): publish those past
        its position, then move it to *new_token* (default: the last row's)."""
        key = (stream, instance)
        self.known_streams.setdefault(stream, None)
        old = self.positions.get(key, 0)
        fresh = [r for r in rows if r[0] > old]
        out: list[Action] = []
        if fresh:
            self.positions[key] = fresh[-1][0]
            out.append(Publish(stream, C.rdata_lines(stream, instance, fresh), len(fresh), "RDATA"))
        last = self.positions.get(key, old)
        if new_token is not None and new_token > last:
            self.positions[key] = new_token
            out.append(Publish(stream, C.encode_one(C.position(stream, instance, last, new_token)), 1,
                               "POSITION"))
        return out

    def writer_advanced(self, stream: str, instance: str, new_token: int) -> list[Action]:
        """A writer of the hub's own process reached *new_token*."""
        key = (stream, instance)
        old = self.positions.get(key, 0)
        if new_token <= old:
            return []
        if not self.readable(stream):
            return self.publish_rows(stream, instance, [], new_token)
        self.known_streams.setdefault(stream, None)
        self.positions[key] = new_token
        return [FillGap(stream, instance, old, new_token)]

    def writer_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> list[Action]:
        """A writer peer's ``POSITION``: fill any gap from the database, then pass it on."""
        key = (stream, instance)
        self.known_streams.setdefault(stream, None)
        readable = self.readable(stream)
        old = self.positions.get(key)
        if old is None:
            old = 0 if readable else prev_token
        if prev_token > old and readable:
            # The position moves now, so rows of this writer later in the same
            # read are relayed after the filled ones and none is published twice.
            self.positions[key] = max(prev_token, new_token)
            return [FillGap(stream, instance, old, prev_token, then_token=new_token)]
        if prev_token > old:
            # No database: pass the gap on for readers to fill themselves.
            self.positions[key] = new_token
            return [Publish(stream, C.encode_one(C.position(stream, instance, prev_token, new_token)), 1,
                            "POSITION")]
        if new_token > old:
            self.positions[key] = new_token
            return [Publish(stream, C.encode_one(C.position(stream, instance, old, new_token)), 1,
                            "POSITION")]
        return []

    def fill_rows(self, gap: FillGap, after: int, rows: Sequence[tuple[int, bytes]]) -> list[Action]:
        """Rows ``(token, row_json)`` read from the database for *gap*, past *after*
        (what this fill published already): published as they are, since the
        writer's position moved when the gap was found."""
        fresh = [r for r in rows if after < r[0] <= gap.upto_token]
        if not fresh:
            return []
        return [Publish(gap.stream, C.rdata_lines(gap.stream, gap.instance, fresh), len(fresh), "RDATA")]

    def fill_done(self, gap: FillGap, last: int) -> list[Action]:
        """The end of a fill whose last published row is *last*: the positions that
        tell readers where the writer is (past rolled-back facts, and on to
        ``then_token``)."""
        out: list[Action] = []
        stream, instance = gap.stream, gap.instance
        if last < gap.upto_token:
            out.append(Publish(stream, C.encode_one(C.position(stream, instance, last, gap.upto_token)), 1,
                               "POSITION"))
        if gap.then_token is not None and gap.then_token > gap.upto_token:
            out.append(Publish(stream, C.encode_one(C.position(stream, instance, gap.upto_token, gap.then_token)),
                               1, "POSITION"))
        return out

    def fill_failed(self, gap: FillGap, last: int) -> None:
        """A fill stopped after publishing up to *last*: the writer's position goes
        back there, so the next announcement fills the rest."""
        key = (gap.stream, gap.instance)
        if self.positions.get(key, last) > last:
            self.positions[key] = last

    def catch_up_behind(self, stream: str, sent: Mapping[str, int], from_token: int) -> list[tuple[str, int]]:
        """Writers of *stream* whose published position is past what a catch-up
        sent them (``sent``: instance -> token), with that position."""
        return [(inst, token) for (s, inst), token in self.positions.items()
                if s == stream and token > sent.get(inst, from_token)]

    def catch_up_positions(self, stream: str, from_token: int, last_row: Mapping[str, int]) -> tuple[bytes, int]:
        """The ``POSITION`` lines that end a catch-up of *stream*: one per writer,
        from the last row sent (or *from_token*) to its position."""
        return _encode_positions(
            (stream, inst, max(from_token, last_row.get(inst, from_token)), token)
            for (s, inst), token in self.positions.items() if s == stream)

    def catch_up_room(self) -> int:
        """The most commands a catch-up must queue at once (its final positions):
        the bound on a connection's queue must be at least this."""
        per_stream: dict[str, int] = {}
        for stream, _inst in self.positions:
            per_stream[stream] = per_stream.get(stream, 0) + 1
        return max([len(self.positions)] + list(per_stream.values()))

    # --- presence ----------------------------------------------------------------------------

    def user_sync(self, instance_id: str, user_id: str, is_syncing: bool) -> None:
        users = self.syncing_users.setdefault(instance_id, set())
        if is_syncing:
            users.add(user_id)
        else:
            users.discard(user_id)
            if not users:
                del self.syncing_users[instance_id]

    def clear_user_sync(self, instance_id: str) -> None:
        self.syncing_users.pop(instance_id, None)

    def all_syncing_users(self) -> set[str]:
        out: set[str] = set()
        for users in self.syncing_users.values():
            out |= users
        return out


class HubPeer(Session):
    """The hub's end of one connection (see :class:`HubState`).

    A peer must send a valid ``NAME`` within ``handshake_timeout``; a writer's
    ``NAME`` claims its instance (one live connection each). ``RDATA`` of one
    writer is gathered per fact and published once per read as the writer's exact
    lines; a row that does not fit its stream (or is not JSON), a ``batch`` run longer than
    ``max_pending_rows``, or a stream the peer may not write closes it with ``ERROR``.
    """

    peer_side = CLIENT_SIDE

    def __init__(self, hub: HubState, label: str, host: str = "", now: float | None = None) -> None:
        super().__init__(hub.settings, now)
        self.hub = hub
        self.label = label
        self.host = host
        #: the peer's NAME once accepted
        self.name: str | None = None
        #: subscribed to every stream (``REPLICATE`` or ``REPLICATE ALL``)
        self.live_all = False
        #: streams subscribed one by one (legacy ``REPLICATE <stream> ...``)
        self.live_streams: set[str] = set()
        #: streams whose catch-up is still being streamed; no live rows meanwhile
        self.catching_up: set[str] = set()
        #: instance IDs this connection reported syncing users for
        self.sync_instances: set[str] = set()
        self._batches: dict[tuple[str, str], list[Any]] = {}
        self._pending_rows = 0
        self._claimed = False
        self._relay: dict[str, list[Any]] = {}

    def greeting(self) -> list[Action]:
        """``SERVER <name>`` and ``PING``."""
        return [Send(C.encode_one(C.server(self.hub.server_name)), 1, "SERVER"),
                Send(C.encode_one(C.ping()), 1, "PING")]

    def wants(self, stream: str) -> bool:
        """Whether live rows of *stream* go to this peer now."""
        return (self.live_all or stream in self.live_streams) and stream not in self.catching_up

    def tick(self, now: float, idle: bool) -> list[Action]:
        if not self.closed and self.name is None and now - self.started_at > self.settings.handshake_timeout:
            self._mark_closed(DisconnectReason.HANDSHAKE_TIMEOUT)
            return [Close(DisconnectReason.HANDSHAKE_TIMEOUT,
                          f"no NAME received within {self.settings.handshake_timeout:g} seconds")]
        return super().tick(now, idle)

    def catch_up_done(self, stream: str) -> None:
        """The transport streamed *stream*'s catch-up: live rows flow again."""
        self.catching_up.discard(stream)

    # --- dispatch ----------------------------------------------------------------------------

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        # A writer's RDATA comes grouped per fact by the core; consecutive facts of
        # one writer are checked together and gathered per stream, published once
        # per read; anything else first flushes what was gathered, keeping the order.
        handlers = self._handlers
        facts: list[tuple[Any, ...]] = []
        try:
            for item in _group_rdata(commands):
                if type(item) is tuple:
                    if facts and (item[0] != facts[0][0] or item[1] != facts[0][1]):
                        self._writer_facts(facts, out)
                        facts = []
                    facts.append(item)
                    continue
                if facts:
                    self._writer_facts(facts, out)
                    facts = []
                if self.closed:
                    return
                if self._relay:
                    self._flush_relay(out)
                handler = handlers.get(item.NAME)
                if handler is None:
                    self._refuse(item, out)
                    return
                handler(item, out)
            if facts:
                self._writer_facts(facts, out)
        finally:
            # Facts gathered before a bad line passed every check and moved the
            # hub's positions: they go out whatever follows.
            if self._relay:
                self._flush_relay(out)

    def _flush_relay(self, out: list[Action]) -> None:
        relay = self._relay
        self._relay = {}
        for stream, rdata in relay.items():
            out.append(Publish(stream, C.encode_many(rdata), len(rdata), "RDATA"))

    def _refused(self, out: list[Action], why: str) -> None:
        self._close(out, DisconnectReason.REFUSED, why)

    def _writer_facts(self, facts: list[tuple[Any, ...]], out: list[Action]) -> None:
        """Consecutive facts ``(stream, instance, token, commands)`` of one writer
        from one read. Several are checked together (one read of the database's
        token per batch of facts rather than per fact); when that fails they are
        checked one by one, so the facts before the first bad one still go out, as
        they would have alone."""
        stream, instance = facts[0][0], facts[0][1]
        if (len(facts) > 1 and not self.closed and self._may_write(stream, instance, out)
                and self._all_pass(stream, instance, facts)):
            for fact in facts:
                self._take_fact(stream, instance, fact[2], fact[3], out)
                if self.closed:
                    return
            return
        for fact in facts:
            if self.closed:
                return
            self._rdata_run(stream, instance, fact[2], fact[3], out)

    def _all_pass(self, stream: str, instance: str, facts: list[tuple[Any, ...]]) -> bool:
        """Whether every row of *facts* fits and their last token is stored."""
        if self._rows_problem(stream, [command for fact in facts for command in fact[3]]) is not None:
            return False
        last = max((fact[2] for fact in facts if fact[2] is not None), default=None)
        return last is None or self.hub.token_limit(stream, instance, last) is None

    def _rows_problem(self, stream: str, commands: list[Any]) -> str | None:
        """What is wrong with the rows of RDATA *commands* of *stream*, or None."""
        row_check = self.hub.row_check
        if row_check is not None:
            # The stream's row format (JSON validity included), checked in place.
            return row_check(stream, commands)
        try:
            C.validate_rows(commands)
        except MalformedCommandError:
            return "row is not valid JSON"
        return None

    def _rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any],
                   out: list[Action]) -> None:
        """One fact (or the ``batch`` rows of one), checked on its own."""
        if not self._may_write(stream, instance, out):
            return
        problem = self._rows_problem(stream, commands)
        if problem is not None:
            raise MalformedCommandError(f"RDATA {stream} {instance}: {problem}")
        if token is not None:
            pos = self.hub.positions.get((stream, instance))
            if pos is None or token > pos:
                limit = self.hub.token_limit(stream, instance, token)
                if limit is not None:
                    self._refused(out, f"{stream}/{instance} token {token} is past what the database "
                                       f"holds ({limit})")
                    return
        self._take_fact(stream, instance, token, commands, out)

    def _take_fact(self, stream: str, instance: str, token: int | None, commands: list[Any],
                   out: list[Action]) -> None:
        """Gather a checked fact for relaying (``batch`` rows wait for their token)."""
        key = (stream, instance)
        if token is None:
            self._pending_rows += len(commands)
            if self._pending_rows > self.settings.max_pending_rows:
                self._refused(out, f"more than {self.settings.max_pending_rows} batch rows without a token")
                return
            waiting = self._batches.get(key)
            if waiting is None:
                self._batches[key] = commands
            else:
                waiting.extend(commands)
            return
        waiting = self._batches.pop(key, None)
        if waiting:
            self._pending_rows -= len(waiting)
        hub = self.hub
        pos = hub.positions.get(key)
        if pos is not None and token <= pos:
            return  # already published (the hub filled it from the database)
        hub.positions[key] = token
        hub.known_streams.setdefault(stream, None)
        buf = self._relay.get(stream)
        if buf is None:
            buf = self._relay[stream] = []
        if waiting:
            buf.extend(waiting)
        buf.extend(commands)

    # --- commands ----------------------------------------------------------------------------

    def on_NAME(self, command: Any, out: list[Action]) -> None:
        name = command.data
        if not name or " " in name:
            self._refused(out, f"NAME must be one word, not {name!r}")
            return
        if self.name is not None and name != self.name:
            self._refused(out, f"NAME {name}: this connection is {self.name} already")
            return
        if name in self.hub.own_instances:
            self._refused(out, f"NAME {name} is this hub's own instance")
            return
        self.name = name

    def _may_write(self, stream: str, instance: str, out: list[Action]) -> bool:
        # The first write claims the instance: one live connection per writer.
        hub = self.hub
        problem = hub.may_write(self.name, stream, instance)
        if problem is None and not self._claimed:
            problem = hub.claim_writer(instance, self)
            self._claimed = problem is None
        if problem is not None:
            self._refused(out, problem)
            return False
        return True

    def on_REPLICATE(self, command: Any, out: list[Action]) -> None:
        stream = command.stream_name
        hub = self.hub
        if stream is None:
            # Current protocol: every position, then everything live.
            data, count = hub.position_lines()
            if count:
                out.append(Send(data, count, "POSITION"))
            self.live_all = True
            return
        known = hub.stream_names()
        if stream != _ALL and stream not in known:
            self._close(out, DisconnectReason.PROTOCOL_ERROR, f"unknown stream {stream}")
            return
        streams = list(known) if stream == _ALL else [stream]
        token = command.token
        if token is None:
            for name in streams:
                data, count = hub.position_lines(name)
                if count:
                    out.append(Send(data, count, "POSITION"))
        else:
            if stream != _ALL and not hub.readable(stream):
                self._close(out, DisconnectReason.PROTOCOL_ERROR,
                            f"cannot replicate {stream} from a token: this hub has no stored rows of it")
                return
            for name in streams:
                if hub.readable(name):
                    self.catching_up.add(name)
                    out.append(CatchUp(name, int(token)))
                else:
                    # Streams only relayed through the hub go live from now.
                    data, count = hub.position_lines(name)
                    if count:
                        out.append(Send(data, count, "POSITION"))
        if stream == _ALL:
            self.live_all = True
        else:
            self.live_streams.add(stream)

    def on_RDATA(self, command: Any, out: list[Action]) -> None:
        self._rdata_run(command.stream_name, command.instance_name, command.token, [command], out)

    def on_POSITION(self, command: Any, out: list[Action]) -> None:
        stream, instance = command.stream_name, command.instance_name
        if not self._may_write(stream, instance, out):
            return
        hub = self.hub
        prev_token, new_token = command.prev_token, command.new_token
        limit = hub.token_limit(stream, instance, new_token)
        if limit is not None:
            # Refused rather than trimmed: the hub's position does not move, so
            # if the database was only behind, the writer's next connection
            # announces again and the hub fills everything from there.
            self._refused(out, f"{stream}/{instance} position {new_token} is past what the database holds "
                               f"({limit})")
            return
        waiting = self._batches.pop((stream, instance), None)
        if waiting:
            self._pending_rows -= len(waiting)
        out.extend(hub.writer_position(stream, instance, prev_token, new_token))

    def on_USER_SYNC(self, command: Any, out: list[Action]) -> None:
        self.sync_instances.add(command.instance_id)
        self.hub.user_sync(command.instance_id, command.user_id, bool(command.is_syncing))
        out.append(Relay(C.encode_one(command), "USER_SYNC"))

    def on_CLEAR_USER_SYNC(self, command: Any, out: list[Action]) -> None:
        self.hub.clear_user_sync(command.instance_id)
        self.sync_instances.discard(command.instance_id)
        out.append(Relay(C.encode_one(command), "CLEAR_USER_SYNC"))

    def _relay_command(self, command: Any, out: list[Action]) -> None:
        out.append(Relay(C.encode_one(command), command.NAME))

    on_FEDERATION_ACK = on_USER_IP = on_REMOTE_SERVER_UP = _relay_command
    on_LOCK_RELEASED = on_NEW_ACTIVE_TASK = on_CANCEL_TASK = _relay_command


# --- a bus without a hub ---------------------------------------------------------------------


class BusSession(Session):
    """One process on a shared bus (Redis pub/sub): there is no hub.

    Every process publishes its own commands (:class:`Send` means "publish") and
    receives everyone's, its own included. It answers every ``REPLICATE`` with
    the positions of the streams it writes, drops ``RDATA``/``POSITION`` of its
    own *instances* (its echoes), and follows everyone else's through
    *follower* (gaps become :class:`FillGap`, or :class:`GapUnfilled` without a
    database). With *stream_writers*, rows and positions of an instance that is
    not a configured writer of the stream are dropped (nobody can be
    disconnected on a bus) and counted in :attr:`refused`.

    A writer's rows count only once one of its ``POSITION`` commands arrived on
    the current subscription (:meth:`announce` starts one): rows published while
    this process was not subscribed are unknown to it, and that ``POSITION``
    fills everything up to it from the database, whereas the first rows heard
    would otherwise move the position past them.
    """

    peer_side = None

    def __init__(self, settings: ConnectionSettings, *, instances: Collection[str] = (),
                 follower: FollowerState | None = None,
                 stream_writers: Mapping[str, Collection[str]] | None = None,
                 now: float | None = None) -> None:
        super().__init__(settings, now)
        self.instances = frozenset(instances)
        self.follower = follower
        self.stream_writers = ({s: frozenset(ws) for s, ws in stream_writers.items()}
                               if stream_writers is not None else None)
        #: this process's writers' positions, as announced
        self.own_positions: dict[tuple[str, str], int] = {}
        #: commands dropped because their writer may not write that stream
        self.refused = 0
        #: writers whose POSITION arrived on the current subscription
        self.heard: set[tuple[str, str]] = set()

    def announce(self, writer_positions: Sequence[tuple[str, str, int]]) -> list[Action]:
        """On (re)subscribing: ``REPLICATE``, then the position of every stream this
        process writes (peers cannot see a bus reconnect), as every reference
        process does."""
        out: list[Action] = [Send(C.encode_one(C.replicate()), 1, "REPLICATE")]
        self.heard.clear()
        if self.follower is not None:
            self.follower.connection_lost()
        for stream, instance, token in writer_positions:
            self.own_positions[(stream, instance)] = token
        data, count = _encode_positions((s, i, t, t) for (s, i), t in self.own_positions.items())
        if count:
            out.append(Send(data, count, "POSITION"))
        return out

    def rows(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> list[Action]:
        """Publish committed rows ``(token, row_json)`` of one of this process's writers."""
        if not rows:
            return []
        self.own_positions[(stream, instance)] = rows[-1][0]
        return [Send(C.rdata_lines(stream, instance, rows), len(rows), "RDATA")]

    def position(self, stream: str, instance: str, prev_token: int, new_token: int) -> list[Action]:
        """Publish an advance of one of this process's writers without rows."""
        self.own_positions[(stream, instance)] = new_token
        return [Send(C.encode_one(C.position(stream, instance, prev_token, new_token)), 1, "POSITION")]

    def _allowed(self, stream: str, instance: str) -> bool:
        if instance in self.instances:
            return False  # our own echo
        if self.stream_writers is not None and instance not in self.stream_writers.get(stream, ()):
            self.refused += 1
            return False
        return True

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        handlers = self._handlers
        follower = self.follower
        for item in _group_rdata(commands):
            if type(item) is tuple:
                if (follower is not None and (item[0], item[1]) in self.heard
                        and self._allowed(item[0], item[1])):
                    follower.rdata_run(item[0], item[1], item[2], item[3], out)
                continue
            handler = handlers.get(item.NAME)
            if handler is not None:
                handler(item, out)

    def on_REPLICATE(self, command: Any, out: list[Action]) -> None:
        data, count = _encode_positions((s, i, t, t) for (s, i), t in self.own_positions.items())
        if count:
            out.append(Send(data, count, "POSITION"))

    def on_POSITION(self, command: Any, out: list[Action]) -> None:
        if self.follower is not None and self._allowed(command.stream_name, command.instance_name):
            self.heard.add((command.stream_name, command.instance_name))
            self.follower.position(command.stream_name, command.instance_name, command.prev_token,
                                   command.new_token, out)

    def on_ERROR(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))  # a bus is not closed by one process's complaint

    def _other(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))

    on_SERVER = on_NAME = on_USER_SYNC = on_CLEAR_USER_SYNC = on_FEDERATION_ACK = on_USER_IP = _other
    on_REMOTE_SERVER_UP = on_LOCK_RELEASED = on_NEW_ACTIVE_TASK = on_CANCEL_TASK = _other
