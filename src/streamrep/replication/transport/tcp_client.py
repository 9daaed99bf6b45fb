"""The replication client over TCP, which worker and writer processes embed: a
thin gevent layer over the protocol's :class:`~streamrep.replication.protocol.ClientSession`.

A :class:`ReplicationClient` keeps one connection to the hub, reconnecting after
any loss with exponential backoff and jitter. Each connection gets a new
session, whose greeting sends ``NAME`` and ``PING``, announces the positions of
the streams this process writes (so the hub can fill anything it missed from the
database), and, when it follows streams, asks to replicate:

* with a database (*source*) it sends ``REPLICATE`` and fills any gap the
  answering ``POSITION`` commands reveal from the database;
* without one it sends the legacy ``REPLICATE <stream|ALL> <token>`` from its
  last tokens and lets the hub stream what it missed.

Either way the handler sees each fact once, in token order per writer, across
reconnects and hub restarts (see :class:`~streamrep.replication.follower.StreamFollower`).

With *security* the connection is TLS (:meth:`ReplicationClient.wrap_socket`)
and, with a shared secret, passes the handshake of
:mod:`streamrep.replication.auth` before the session's greeting goes out.
"""

from __future__ import annotations

import functools
import logging
import socket
from typing import Any, Callable, Iterable, Mapping, Sequence

import gevent
import gevent.event
from gevent import Greenlet
from gevent import socket as gsocket

from streamrep.errors import StreamrepError
from streamrep.replication import commands as C
from streamrep.replication.backoff import Backoff
from streamrep.replication.follower import Handler, StreamFollower
from streamrep.replication.metrics import ReplicationMetrics
from streamrep.replication.protocol import (
    Action,
    ClientSession,
    ConnectionSettings,
    DisconnectReason,
    GapUnfilled,
)
from streamrep.replication.auth import AUTH_FAILED, PeerGate
from streamrep.replication.security import PeerSecurity
from streamrep.replication.source import StreamSource
from streamrep.replication.transport.tcp_connection import TcpConnection

__all__ = ["ReplicationClient", "ClientConnection", "Backoff"]

logger = logging.getLogger(__name__)

#: How long a new connection's greeting may take to reach the socket before the
#: client says it is connected anyway.
_GREETING_FLUSH_SECONDS = 1.0


class ClientConnection(TcpConnection):
    """The client's end of one connection to the hub."""

    session: ClientSession

    def __init__(self, client: ReplicationClient, sock: socket.socket, peer: str, session: ClientSession) -> None:
        super().__init__(sock, peer, client.settings, client.metrics, session=session,
                         perform=client.perform, on_lost=client.connection_lost)
        self.established = False

    @property
    def server_name(self) -> str | None:
        """The name the hub gave in ``SERVER`` (None until then)."""
        return self.session.server_name


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
    * *on_retry* ``(problem, delay)``: called when an attempt to connect fails or a
      connection is lost, with one line saying why, before waiting *delay* seconds.
    * *security*: TLS towards the hub and the shared secret
      (:class:`~streamrep.replication.security.PeerSecurity`); default plain TCP.
      With a secret, nothing is sent before the hub has proved it holds it too.
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
        on_retry: Callable[[str, float], None] | None = None,
        settings: ConnectionSettings | None = None,
        backoff: Backoff | None = None,
        connect_timeout: float = 5.0,
        security: PeerSecurity | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.security = security if security is not None else PeerSecurity()
        self.client_name = client_name
        self.server_name = server_name
        self.source = source
        self.follower = StreamFollower(handler, source, streams, start_from) if handler is not None else None
        self.writer_positions = writer_positions
        self.on_command = on_command
        self.on_retry = on_retry
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

    # --- lifecycle -------------------------------------------------------------------------------

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
            conn.wait_flushed(timeout)
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

    # --- hooks for a security layer ----------------------------------------------------------

    def wrap_socket(self, sock: socket.socket) -> socket.socket:
        """The socket the connection will use: TLS-wrapped when *security* says so,
        the hub's certificate checked (a failed check raises :class:`OSError`)."""
        context = self.security.ssl_context
        if context is None:
            return sock
        from streamrep.replication.tls import connect_tls

        return connect_tls(context, sock, self.security.server_hostname or self.host,
                           self.connect_timeout)

    def before_name(self, sock: socket.socket) -> bool:
        """A handshake before ``NAME`` (a shared-secret challenge, say); False
        drops this attempt and retries after the backoff."""
        return True

    def _run(self) -> None:
        while not self._stopping:
            try:
                sock = gsocket.create_connection((self.host, self.port), timeout=self.connect_timeout)
                sock = self.wrap_socket(sock)
                if not self.before_name(sock):
                    raise StreamrepError("the hub refused the handshake")
                sock.settimeout(None)
            except (OSError, StreamrepError) as exc:
                delay = self.backoff.next_delay()
                logger.info("cannot reach hub %s:%s (%s); retrying in %.2fs", self.host, self.port, exc, delay)
                if self.on_retry is not None:
                    self.on_retry(f"cannot connect to {self.host}:{self.port}: {exc}", delay)
                gevent.sleep(delay)
                continue
            follower = self.follower
            session = ClientSession(
                self.settings, client_name=self.client_name, server_name=self.server_name,
                follower=follower.state if follower is not None else None,
                resume_through_hub=self.source is None,
            )
            conn = ClientConnection(self, sock, f"{self.host}:{self.port}", session)
            self.connection = conn
            self.metrics.connected()
            greeting = functools.partial(self._greeting, conn, session)
            gate = PeerGate(self.client_name, self.security.secret, self.server_name, greeting)
            conn.gate = gate
            # With a secret the greeting waits for the hub's proof (the gate sends it).
            conn.run(greeting() if gate.ready else [])
            if self._stopping:
                break
            delay = self.backoff.next_delay()
            logger.info("lost hub %s:%s (%s); reconnecting in %.2fs", self.host, self.port, conn.close_reason, delay)
            if self.on_retry is not None:
                self.on_retry(self._why_lost(conn), delay)
            gevent.sleep(delay)

    def _greeting(self, conn: ClientConnection, session: ClientSession) -> list[Action]:
        positions = list(self.writer_positions()) if self.writer_positions is not None else []
        return self._greeted(conn, session.greeting(positions))

    def _greeted(self, conn: ClientConnection, greeting: list[Action]) -> list[Action]:
        conn.established = True
        self.connections_made += 1
        gevent.spawn(self._up_once_greeted, conn)
        return greeting

    def _up_once_greeted(self, conn: ClientConnection) -> None:
        # The application learns it is connected once the greeting is on its
        # way: what it sends next (a writer's first announcements) never shares
        # the queue's bound with the greeting.
        with gevent.Timeout(_GREETING_FLUSH_SECONDS, False):
            while not conn.idle() and not conn.closed:
                gevent.sleep(0.001)
        if not conn.closed:
            self._up.set()

    def _why_lost(self, conn: ClientConnection) -> str:
        where = f"{self.host}:{self.port}"
        if conn.close_reason == DisconnectReason.WRONG_SERVER:
            return (f"the hub at {where} says it is {conn.server_name!r}, "
                    f"not {self.server_name!r}")
        if not conn.established:
            return f"the hub at {where} closed the connection before replicating ({conn.close_reason})"
        return f"lost the hub at {where} ({conn.close_reason})"

    def connection_lost(self, conn: TcpConnection, reason: str) -> None:
        assert isinstance(conn, ClientConnection)
        if self.connection is conn:
            self._up.clear()
        if self.follower is not None:
            self.follower.connection_lost()
        # A connection that got as far as the server's greeting (and past the
        # handshake) resets the backoff; one that keeps failing early keeps backing off.
        if (conn.server_name is not None and conn.established
                and reason not in (DisconnectReason.WRONG_SERVER, AUTH_FAILED)):
            self.backoff.reset()

    # --- carrying out the protocol's actions ----------------------------------------------------

    def perform(self, conn: TcpConnection, actions: list[Action]) -> None:
        """Facts and gaps go to the follower; the rest is sending, closing and
        handing relayed commands to *on_command*."""
        follower = self.follower
        if follower is not None:
            actions = follower.run(actions)
        for index, action in enumerate(actions):
            if type(action) is GapUnfilled:
                assert isinstance(action, GapUnfilled)
                conn.perform_basic(actions[:index], self.on_command)
                # No database to fill it from: reconnect, and the hub streams what
                # was missed from our last tokens.
                logger.warning("gap on %s/%s (at %s, hub was at %s): resynchronising through the hub",
                               action.stream, action.instance, action.from_token, action.upto_token)
                conn.close(DisconnectReason.GAP_UNFILLED)
                return
        conn.perform_basic(actions, self.on_command)

    # --- sending ---------------------------------------------------------------------------------

    def replicate_commands(self) -> list[Any]:
        """The ``REPLICATE`` commands a new connection would send."""
        follower = self.follower
        session = ClientSession(self.settings, client_name=self.client_name,
                                follower=follower.state if follower is not None else None,
                                resume_through_hub=self.source is None)
        return session.replicate_commands()

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
        return conn.send_lines(C.rdata_lines(stream, instance, rows), len(rows), "RDATA")

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
