"""The replication client that worker and writer processes embed.

A :class:`ReplicationClient` keeps one connection to the hub, reconnecting
after any loss with exponential backoff and jitter. On every connection it sends
``NAME`` and ``PING``, announces the positions of the streams this process
writes (so the hub can fill anything it missed from the database), and, when it
follows streams, asks to replicate:

* with a database (*source*) it sends ``REPLICATE`` and fills any gap the
  answering ``POSITION`` commands reveal from the database;
* without one it sends the legacy ``REPLICATE <stream|ALL> <token>`` from its
  last tokens and lets the hub stream what it missed.

Either way the handler sees each fact once, in token order per writer, across
reconnects and hub restarts (see :class:`~streamrep.replication.follower.StreamFollower`).
"""

from __future__ import annotations

import logging
import random
import socket

from gevent import socket as gsocket
from typing import Any, Callable, Iterable, Mapping, Sequence

import gevent
import orjson
import gevent.event
from gevent import Greenlet

from streamrep.replication import commands as C
from streamrep.replication.connection import ConnectionSettings, DisconnectReason, ReplicationConnection
from streamrep.replication.follower import Handler, StreamFollower
from streamrep.replication.metrics import ReplicationMetrics
from streamrep.replication.source import StreamSource

__all__ = ["ReplicationClient", "ClientConnection", "Backoff"]

logger = logging.getLogger(__name__)

_loads = orjson.loads
_group_rdata = C.group_rdata


class Backoff:
    """Exponential backoff with jitter: attempt *n* waits a random time between
    half and all of ``min(maximum, base * 2**n)``."""

    def __init__(self, base: float = 0.1, maximum: float = 10.0, rng: random.Random | None = None) -> None:
        if base <= 0 or maximum < base:
            raise ValueError("need 0 < base <= maximum")
        self.base = base
        self.maximum = maximum
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.base * (2 ** min(self.attempt, 32)))
        self.attempt += 1
        return float(ceiling * self._rng.uniform(0.5, 1.0))

    def reset(self) -> None:
        self.attempt = 0


class ClientConnection(ReplicationConnection):
    """The client's end of one connection to the hub."""

    side = "client"

    def __init__(self, client: ReplicationClient, sock: socket.socket, peer: str) -> None:
        super().__init__(sock, peer, client.settings, client.metrics)
        self.client = client
        self.server_name: str | None = None
        self.established = False

    def connection_made(self) -> None:
        client = self.client
        self.send(C.name(client.client_name))
        self.send(C.ping())
        # Writers first say where they are, so the hub fills what it missed
        # before anything else arrives from this process.
        if client.writer_positions is not None:
            lines = [
                C.encode_one(C.position(stream, instance, token, token))
                for stream, instance, token in client.writer_positions()
            ]
            if lines:
                self.send_encoded(b"".join(lines), len(lines), "POSITION")
        for command in client.replicate_commands():
            self.send(command)
        self.established = True
        client._connected(self)

    def connection_lost(self, reason: str) -> None:
        self.client._disconnected(self, reason)

    def on_SERVER(self, command: Any) -> None:
        expected = self.client.server_name
        self.server_name = command.data
        if expected is not None and command.data != expected:
            self.close(DisconnectReason.WRONG_SERVER, f"expected server {expected}, found {command.data}")

    def handle_commands(self, commands: Iterable[Any], dispatch: dict[str, Callable[[Any], None]]) -> None:
        # RDATA is nearly all of the traffic: the core groups consecutive rows of
        # one writer, so the follower's bookkeeping runs once per fact, not per row.
        follower = self.client.follower
        if follower is None:
            super().handle_commands(commands, dispatch)
            return
        on_run = follower.on_rdata_run
        run_type = tuple
        for item in _group_rdata(commands if type(commands) is list else list(commands)):
            if self.closed:
                return
            if type(item) is run_type:
                on_run(*item)
                continue
            handler = dispatch.get(item.NAME)
            if handler is None:
                self.refuse(item)
                return
            handler(item)

    def on_RDATA(self, command: Any) -> None:
        follower = self.client.follower
        if follower is not None:
            try:
                row = _loads(command.row_json)
            except orjson.JSONDecodeError:
                row = command.row  # raises the wire format's own MalformedCommandError
            follower.on_rdata(command.stream_name, command.instance_name, command.token, row)

    def on_POSITION(self, command: Any) -> None:
        follower = self.client.follower
        if follower is None:
            return
        if not follower.on_position(command.stream_name, command.instance_name, command.prev_token, command.new_token):
            # A gap with no database to fill it from: reconnect, and the hub
            # streams what was missed from our last tokens.
            logger.warning(
                "gap on %s/%s (at %s, hub was at %s): resynchronising through the hub",
                command.stream_name, command.instance_name,
                follower.positions.get((command.stream_name, command.instance_name)), command.prev_token,
            )
            self.close(DisconnectReason.LOCAL_CLOSE)

    def _other(self, command: Any) -> None:
        callback = self.client.on_command
        if callback is not None:
            callback(command)

    on_USER_SYNC = on_CLEAR_USER_SYNC = on_FEDERATION_ACK = on_USER_IP = _other
    on_REMOTE_SERVER_UP = on_LOCK_RELEASED = on_NEW_ACTIVE_TASK = on_CANCEL_TASK = _other


class ReplicationClient:
    """A worker's or writer's link to the hub (see the module docstring).

    * *handler* ``(stream, instance, token, rows)``: called once per fact; omit it
      for a process that only writes.
    * *source*: the database, to fill gaps; without it catch-up goes through the hub.
    * *streams*: follow only these; *start_from*: where to start for writers seen
      for the first time (token per stream or per ``(stream, instance)``), else
      from their current position.
    * *writer_positions*: ``() -> [(stream, instance, token)]`` for a process that
      writes streams: its persisted positions, announced on every connection.
    * *on_command*: called with relayed commands (``USER_SYNC``, ``USER_IP``, ...).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_name: str,
        server_name: str | None = None,
        handler: Handler | None = None,
        source: StreamSource | None = None,
        streams: Iterable[str] | None = None,
        start_from: Mapping[Any, int] | None = None,
        writer_positions: Callable[[], Sequence[tuple[str, str, int]]] | None = None,
        on_command: Callable[[Any], None] | None = None,
        settings: ConnectionSettings | None = None,
        backoff: Backoff | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        self.host, self.port = host, port
        self.client_name = client_name
        self.server_name = server_name
        self.source = source
        self.follower = StreamFollower(handler, source, streams, start_from) if handler is not None else None
        self.writer_positions = writer_positions
        self.on_command = on_command
        self.settings = settings or ConnectionSettings()
        self.backoff = backoff or Backoff()
        self.connect_timeout = connect_timeout
        self.metrics = ReplicationMetrics(
            positions=lambda: dict(self.follower.positions) if self.follower else {},
            queue_depths=lambda: {self.client_name: len(self.connection.queue)} if self.connection else {},
            prefix="streamrep_replication_client",
        )
        self.connection: ClientConnection | None = None
        self.connections_made = 0
        self._stopping = False
        self._greenlet: Greenlet | None = None
        self._up = gevent.event.Event()

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> Greenlet:
        """Connect (and keep reconnecting) in a background greenlet."""
        if self._greenlet is None or self._greenlet.dead:
            self._stopping = False
            self._greenlet = gevent.spawn(self._run)
        return self._greenlet

    def stop(self, timeout: float = 2.0) -> None:
        """Stop reconnecting and close the connection (after flushing it)."""
        self._stopping = True
        conn = self.connection
        if conn is not None and not conn.closed:
            conn.close(DisconnectReason.LOCAL_CLOSE)
            if conn._writer is not None:
                conn._writer.join(timeout)
            if self._greenlet is not None:
                self._greenlet.join(timeout)
        if self._greenlet is not None:
            # Not connected: it is waiting to retry, nothing to finish.
            self._greenlet.kill(block=True, timeout=timeout)

    @property
    def connected(self) -> bool:
        conn = self.connection
        return conn is not None and conn.established and not conn.closed

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block until a connection is up (True) or *timeout* passes (False)."""
        return bool(self._up.wait(timeout))

    def _run(self) -> None:
        while not self._stopping:
            try:
                sock = gsocket.create_connection((self.host, self.port), timeout=self.connect_timeout)
                sock.settimeout(None)
            except OSError as exc:
                delay = self.backoff.next_delay()
                logger.info("cannot reach hub %s:%s (%s); retrying in %.2fs", self.host, self.port, exc, delay)
                gevent.sleep(delay)
                continue
            conn = ClientConnection(self, sock, f"{self.host}:{self.port}")
            self.connection = conn
            self.metrics.connected()
            conn.run()
            if self._stopping:
                break
            delay = self.backoff.next_delay()
            logger.info("lost hub %s:%s (%s); reconnecting in %.2fs", self.host, self.port, conn.close_reason, delay)
            gevent.sleep(delay)

    def _connected(self, conn: ClientConnection) -> None:
        self.connections_made += 1
        self._up.set()

    def _disconnected(self, conn: ClientConnection, reason: str) -> None:
        if self.connection is conn:
            self._up.clear()
        if self.follower is not None:
            self.follower.connection_lost()
        # A connection that got as far as the server's greeting resets the backoff;
        # one that keeps failing early keeps backing off.
        if conn.server_name is not None and reason != DisconnectReason.WRONG_SERVER:
            self.backoff.reset()

    # --- what to ask for -----------------------------------------------------------------

    def replicate_commands(self) -> list[Any]:
        """The ``REPLICATE`` commands for a new connection."""
        follower = self.follower
        if follower is None:
            return []
        if self.source is not None:
            return [C.replicate()]
        tokens = follower.resume_tokens()
        if follower.streams is None and not tokens:
            return [C.replicate("ALL", None)]
        # Each stream from its own token (one token for all would replay the
        # busiest streams from the quietest one's position).
        names = sorted(follower.streams) if follower.streams is not None else sorted(tokens)
        return [C.replicate(stream, tokens.get(stream)) for stream in names]

    # --- sending ------------------------------------------------------------------------

    def send(self, command: Any) -> bool:
        """Send a command now if connected; False when there is no connection."""
        conn = self.connection
        if conn is None or not conn.established or conn.closed:
            return False
        return conn.send(command)

    def announce(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> bool:
        """Announce rows ``(token, row_json)`` this process committed (token order).

        Returns False when not connected: the next connection announces the
        persisted position instead and the hub fills the rest from the database.
        """
        conn = self.connection
        if conn is None or not conn.established or conn.closed or not rows:
            return False
        return conn.send_encoded(C.rdata_lines(stream, instance, rows), len(rows), "RDATA")

    def announce_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool:
        """Announce that a writer moved from *prev_token* to *new_token* with no rows."""
        return self.send(C.position(stream, instance, prev_token, new_token))

    def flush(self, timeout: float) -> bool:
        """Wait until connected with nothing left to write (True), or *timeout*."""
        with gevent.Timeout(timeout, False):
            while True:
                conn = self.connection
                if conn is not None and conn.established and not conn.closed and conn.idle():
                    return True
                gevent.sleep(0.005)
        return False
