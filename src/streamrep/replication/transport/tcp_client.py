"""The replication link over TCP: a process's connection to the hub, a thin gevent
layer over the protocol's :class:`~streamrep.replication.protocol.ClientSession`.

A :class:`TcpLink` keeps one connection to the hub, reconnecting after any loss
with exponential backoff and jitter. Each connection gets a new session, whose
greeting sends ``NAME`` and ``PING``, announces the positions of the streams this
process writes, and, when it follows streams, asks to replicate:

* with a catch-up source (the database) it sends ``REPLICATE`` and fills any gap
  the answering ``POSITION`` commands reveal from it;
* without one it sends the legacy ``REPLICATE <stream|ALL> <token>`` from its
  last tokens and lets the hub stream what it missed.

Either way the handler sees each fact once, in token order per writer, across
reconnects and hub restarts (see :class:`~streamrep.replication.follower.StreamFollower`).
The hub answers a writer's ``RDATA`` and ``POSITION`` with the position it took,
which is what :meth:`TcpLink.confirmed` and :meth:`TcpLink.flush` go by; an
``ERROR`` from the hub is kept as :attr:`TcpLink.refusal`.

With ``settings.security`` the connection is TLS (:meth:`TcpLink.wrap_socket`)
and, with a shared secret, passes the handshake of
:mod:`streamrep.replication.auth` before the session's greeting goes out.
"""

from __future__ import annotations

import functools
import logging
import socket
from typing import Any, Sequence

import gevent
from gevent import Greenlet
from gevent import socket as gsocket

from streamrep.errors import StreamrepError
from streamrep.replication import commands as C
from streamrep.replication.auth import AUTH_FAILED, PeerGate
from streamrep.replication.link import LinkBase, LinkRoles, LinkSettings, check_rows
from streamrep.replication.metrics import ReplicationMetrics
from streamrep.replication.protocol import Action, ClientSession, Confirmed, DisconnectReason, GapUnfilled
from streamrep.replication.security import PeerSecurity
from streamrep.replication.transport.tcp_connection import TcpConnection

__all__ = ["TcpLink", "ClientConnection", "open_link"]

logger = logging.getLogger(__name__)

#: How long a new connection's greeting may take to reach the socket before the
#: link says it is connected anyway.
_GREETING_FLUSH_SECONDS = 1.0


class ClientConnection(TcpConnection):
    """The link's end of one connection to the hub."""

    session: ClientSession

    def __init__(self, link: TcpLink, sock: socket.socket, peer: str, session: ClientSession) -> None:
        super().__init__(sock, peer, link.settings.connection, link.metrics, session=session,
                         perform=link.perform, on_lost=link.connection_lost)
        self.established = False

    @property
    def server_name(self) -> str | None:
        """The name the hub gave in ``SERVER`` (None until then)."""
        return self.session.server_name


def open_link(settings: LinkSettings, roles: LinkRoles) -> TcpLink:
    """The TCP transport's entry in :data:`streamrep.replication.link.TRANSPORTS`."""
    return TcpLink(settings, roles)


class TcpLink(LinkBase):
    """A process's link to the hub (see the module docstring and
    :class:`~streamrep.replication.link.LinkBase`)."""

    def __init__(self, settings: LinkSettings, roles: LinkRoles | None = None) -> None:
        if settings.hub is None:
            raise ValueError("a TCP link needs settings.hub")
        super().__init__(settings, roles if roles is not None else LinkRoles())
        self.host, self.port = settings.hub
        self.security = settings.security if settings.security is not None else PeerSecurity()
        self.client_name = settings.name
        self.server_name = settings.server_name
        self.source = self.roles.source
        follower = self.follower
        self.metrics = ReplicationMetrics(
            positions=lambda: follower.taken_positions() if follower is not None else {},
            queue_depths=lambda: {self.client_name: len(self.connection.queue)} if self.connection else {},
            gaps=lambda: follower.unfilled if follower is not None else {},
            refusals=lambda: follower.refused if follower is not None else {},
            stalled=lambda: follower.stalled_seconds() if follower is not None else {},
            stalls=lambda: follower.stalls if follower is not None else {},
            prefix="streamrep_replication_client",
        )
        self.connection: ClientConnection | None = None
        self._greenlet: Greenlet | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def _launch(self) -> Greenlet:
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)
        return self._greenlet

    def _shutdown(self, timeout: float) -> None:
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

    # --- hooks for a security layer ----------------------------------------------------------

    def wrap_socket(self, sock: socket.socket) -> socket.socket:
        """The socket the connection will use: TLS-wrapped when the settings say so,
        the hub's certificate checked (a failed check raises :class:`OSError`)."""
        context = self.security.ssl_context
        if context is None:
            return sock
        from streamrep.replication.tls import connect_tls

        return connect_tls(context, sock, self.security.server_hostname or self.host,
                           self.settings.connect_timeout)

    def before_name(self, sock: socket.socket) -> bool:
        """A handshake before ``NAME`` (a shared-secret challenge, say); False
        drops this attempt and retries after the backoff."""
        return True

    def _connect(self) -> socket.socket:
        sock = gsocket.create_connection((self.host, self.port), timeout=self.settings.connect_timeout)
        sock = self.wrap_socket(sock)
        if not self.before_name(sock):
            raise StreamrepError("the hub refused the handshake")
        sock.settimeout(None)
        return sock

    def _run(self) -> None:
        while not self._stop_requested.is_set():
            try:
                sock = self._connect()
            except (OSError, StreamrepError) as exc:
                delay = self.backoff.next_delay()
                logger.info("cannot reach hub %s:%s (%s); retrying in %.2fs", self.host, self.port, exc, delay)
                self._down(f"cannot connect to {self.host}:{self.port}: {exc}", delay)
                gevent.sleep(delay)
                continue
            self._serve(sock)
            if self._stop_requested.is_set():
                break
            conn = self.connection
            assert conn is not None
            delay = self.backoff.next_delay()
            logger.info("lost hub %s:%s (%s); reconnecting in %.2fs", self.host, self.port, conn.close_reason, delay)
            self._down(self._why_lost(conn), delay, conn.refusal)
            gevent.sleep(delay)

    def _serve(self, sock: socket.socket) -> None:
        """One connection, from the greeting until it ends."""
        follower = self.follower
        session = ClientSession(
            self.settings.connection, client_name=self.client_name, server_name=self.server_name,
            follower=follower.state if follower is not None else None,
            resume_through_hub=self.source is None,
            hand_on_positions=self.roles.hand_on_positions and self.roles.on_command is not None,
        )
        conn = ClientConnection(self, sock, f"{self.host}:{self.port}", session)
        self.connection = conn
        self.metrics.connected()
        greeting = functools.partial(self._greeting, conn, session)
        gate = PeerGate(self.client_name, self.security.secret, self.server_name, greeting)
        conn.gate = gate
        # With a secret the greeting waits for the hub's proof (the gate sends it).
        conn.run(greeting() if gate.ready else [])

    def _greeting(self, conn: ClientConnection, session: ClientSession) -> list[Action]:
        positions = list(self.writer_positions()) if self.writer_positions is not None else []
        for stream, instance, token in positions:
            self._noted(stream, instance, token)
        greeting = session.greeting(positions)
        conn.established = True
        gevent.spawn(self._up_once_greeted, conn)
        return greeting

    def _up_once_greeted(self, conn: ClientConnection) -> None:
        # The application learns it is connected once the greeting is on its
        # way: what it sends next (a writer's first announcements) never shares
        # the queue's bound with the greeting.
        self._connection_up()
        with gevent.Timeout(_GREETING_FLUSH_SECONDS, False):
            while not conn.idle() and not conn.closed:
                gevent.sleep(0.001)
        if not conn.closed:
            self._greeted()

    def _why_lost(self, conn: ClientConnection) -> str:
        where = f"{self.host}:{self.port}"
        if conn.close_reason == DisconnectReason.WRONG_SERVER:
            return (f"the hub at {where} says it is {conn.server_name!r}, "
                    f"not {self.server_name!r}")
        if conn.refusal is not None:
            return f"the hub at {where} refused this process: {conn.refusal}"
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
        if (conn.server_name is not None and conn.established and conn.refusal is None
                and reason not in (DisconnectReason.WRONG_SERVER, AUTH_FAILED)):
            self.backoff.reset()

    # --- carrying out the protocol's actions ----------------------------------------------------

    def perform(self, conn: TcpConnection, actions: list[Action]) -> None:
        """Facts and gaps go to the follower; the rest is sending, closing and
        handing relayed commands to ``on_command``."""
        follower = self.follower
        if follower is not None:
            actions = follower.run(actions)
        for index, action in enumerate(actions):
            if type(action) is Confirmed:
                assert isinstance(action, Confirmed)
                self._confirm(action.stream, action.instance, action.token)
            elif type(action) is GapUnfilled:
                assert isinstance(action, GapUnfilled)
                conn.perform_basic(actions[:index], self.roles.on_command)
                # No database to fill it from: reconnect, and the hub streams what
                # was missed from our last tokens.
                logger.warning("gap on %s/%s (at %s, hub was at %s): resynchronising through the hub",
                               action.stream, action.instance, action.from_token, action.upto_token)
                conn.close(DisconnectReason.GAP_UNFILLED)
                return
        conn.perform_basic(actions, self.roles.on_command)

    # --- sending ---------------------------------------------------------------------------------

    def replicate_commands(self) -> list[Any]:
        """The ``REPLICATE`` commands a new connection would send."""
        follower = self.follower
        session = ClientSession(self.settings.connection, client_name=self.client_name,
                                follower=follower.state if follower is not None else None,
                                resume_through_hub=self.source is None)
        return session.replicate_commands()

    def _live(self) -> ClientConnection | None:
        conn = self.connection
        if conn is None or not conn.established or conn.closed:
            return None
        return conn

    def send(self, command: Any) -> bool:
        """Send a command now if connected; False when there is no connection."""
        conn = self._live()
        return conn is not None and conn.send(command)

    def announce(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> bool:
        """Announce rows ``(token, row_json)`` this process committed (token order).

        Returns False when not connected: the next connection announces the
        writer's position instead and the rest follows from there.
        """
        check_rows(rows)
        conn = self._live()
        if conn is None or not rows:
            return False
        if not conn.send_lines(C.rdata_lines(stream, instance, rows), len(rows), "RDATA"):
            return False
        self._noted(stream, instance, rows[-1][0])
        return True

    def announce_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool:
        """Announce that a writer moved from *prev_token* to *new_token* with no rows."""
        if not self.send(C.position(stream, instance, prev_token, new_token)):
            return False
        self._noted(stream, instance, new_token)
        return True
