"""The replication hub over TCP: a thin gevent layer over the protocol's hub.

Every worker and writer process connects to the hub. The protocol
(:class:`~streamrep.replication.protocol.HubState` and one
:class:`~streamrep.replication.protocol.HubPeer` per connection) decides what is
sent, published, relayed or refused; this module accepts connections, carries
out those decisions and does the database reads they ask for:

* publishing this process's own writers' advances (:meth:`ReplicationHub.writer_advanced`)
  and filling the gaps a writer's ``POSITION`` reveals, from the source;
* catch-up for the legacy ``REPLICATE <stream|ALL> <token>``: the rows after the
  token streamed from the source, then the switch to live without yielding, so
  there is neither gap nor duplicate. Every wait for queue room is bounded; a
  catch-up that cannot proceed (database error, a peer that stops reading, a
  queue too small for the final positions) closes that peer with ``ERROR``.

Accepting is gevent's :class:`~gevent.server.StreamServer` (its accept loop runs in
the event loop's callback, up to 100 connections per wake-up, each handed to a
greenlet of its own) on a socket listening with the kernel's largest backlog
(``/proc/sys/net/core/somaxconn``), so a burst of connections waits in the kernel
instead of overflowing it. Connections beyond ``max_connections`` (or
``max_connections_per_host`` from one address) get ``ERROR`` and are closed at once;
pending peers beyond the pending limits close the oldest pending peer; running out
of file descriptors pauses accepting instead of failing.

With *security*, every accepted socket gets TLS first
(:meth:`ReplicationHub.wrap_socket`, within the handshake timeout), and each
connection's reads pass its authentication gate (:meth:`ReplicationHub.gate`,
:mod:`streamrep.replication.auth`) before its session: the shared-secret
handshake, and ``NAME`` matched to the client certificate, before ``NAME`` is
accepted. :meth:`ReplicationHub.before_name` is a further hook for a handshake
on the socket itself.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Any, Callable, Collection, Mapping, Sequence

import gevent
import gevent.event
from gevent import Greenlet
from gevent import socket as gsocket
from gevent.server import StreamServer

from streamrep.errors import StreamrepError
from streamrep.replication import commands as C
from streamrep.replication.metrics import ReplicationMetrics, serve_metrics
from streamrep.replication.protocol import (
    Action,
    CatchUp,
    Close,
    ConnectionSettings,
    DisconnectReason,
    FillGap,
    HubPeer,
    HubState,
    Keepalive,
    Publish,
    Received,
    Relay,
    Send,
)
from streamrep.replication.auth import HubGate
from streamrep.replication.security import HubSecurity
from streamrep.replication.sources import StreamSource, pages
from streamrep.replication.transport.hub_memory import MemoryReturn
from streamrep.replication.transport.tcp_connection import FIRST_SEND_BUFFER, TcpConnection, WriteLane, poll_yield

__all__ = ["ReplicationHub", "HubConnection", "DEFAULT_PORT", "CATCH_UP_BATCH"]

logger = logging.getLogger(__name__)

#: The hub's default TCP port (on 127.0.0.1 unless told otherwise).
DEFAULT_PORT = 9092

#: Rows read from the source per round trip during catch-up.
CATCH_UP_BATCH = 2000

# accept() errors that mean "out of descriptors or memory for now": pause, retry.
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_PAUSE_WHEN_OUT_OF_DESCRIPTORS = 0.1
#: How many distinct refusals are logged at WARNING before they go to DEBUG.
_LOGGED_REFUSALS_LIMIT = 1000
#: Connections closed, with none closed for a keepalive step since, after which
#: the C allocator is asked to give the memory they freed back to the system.
_TRIM_AFTER_CLOSES = 100


def listen_backlog() -> int:
    """The listen backlog: the kernel's own ceiling (``net.core.somaxconn``), which
    it applies anyway, so a burst of connections is never refused by a smaller one."""
    try:
        with open("/proc/sys/net/core/somaxconn") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return socket.SOMAXCONN


class _Acceptor(StreamServer):  # type: ignore[misc]  # gevent.server has no type information
    """gevent's accept loop on the hub's listening socket. Running out of file
    descriptors pauses accepting for a tenth of a second (told once to *on_exhausted*)
    instead of a traceback per attempt."""

    def __init__(self, listener: socket.socket, handle: Callable[[socket.socket, Any], None],
                 on_exhausted: Callable[[OSError], None]) -> None:
        super().__init__(listener, handle)
        self._on_exhausted = on_exhausted

    def do_read(self) -> Any:
        try:
            return super().do_read()
        except OSError as exc:
            if exc.errno in _RESOURCE_ERRORS:
                self._on_exhausted(exc)
                self.stop_accepting()
                gevent.spawn_later(_PAUSE_WHEN_OUT_OF_DESCRIPTORS, self._resume)
            else:
                logger.debug("accept failed: %s", exc)
            return None

    def _resume(self) -> None:
        if self.started:
            self.start_accepting()


class HubConnection(TcpConnection):
    """The hub's end of one connection: a socket and its :class:`HubPeer`."""

    __slots__ = ("hub", "catch_ups", "catch_up_worker")
    session: HubPeer

    def __init__(self, hub: ReplicationHub, sock: socket.socket, peer: str, session: HubPeer) -> None:
        super().__init__(sock, peer, hub.settings, hub.metrics, session=session,
                         perform=hub.perform, on_lost=hub.connection_lost, send_buffer=FIRST_SEND_BUFFER,
                         lane=hub.write_lane)
        self.hub = hub
        self.catch_ups: list[CatchUp] = []
        self.catch_up_worker: Greenlet | None = None

    @property
    def name(self) -> str:
        """``NAME@address`` once the peer gave its name, else its address."""
        name = self.session.name
        return f"{name}@{self.peer}" if name is not None else self.peer

    def wants(self, stream: str) -> bool:
        """Whether live rows of *stream* go to this connection now."""
        return self.session.wants(stream)

    @property
    def live_all(self) -> bool:
        return self.session.live_all


class ReplicationHub:
    """The replication server (see the module docstring).

    *security* (:class:`~streamrep.replication.security.HubSecurity`) puts TLS on
    the port, asks peers for client certificates and for the shared secret; by
    default the hub speaks plain TCP and asks for nothing.

    *source* is where the hub reads rows for catch-up and for its own writers'
    advances; without one the hub only relays. *instance_name* is this process's
    name as a writer (no peer may write as it). *stream_writers* (stream ->
    instances) says which peer may write which stream; None lets any named peer
    write streams under its own name. *row_check* ``(stream, rdata_commands) ->
    problem or None`` checks relayed rows against their stream's row format.
    """

    def __init__(
        self,
        server_name: str,
        source: StreamSource | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        instance_name: str = "main",
        settings: ConnectionSettings | None = None,
        metrics_listen: tuple[str, int] | None = None,
        security: HubSecurity | None = None,
        stream_writers: Mapping[str, Collection[str]] | None = None,
        row_check: Callable[[str, Sequence[Any]], str | None] | None = None,
    ) -> None:
        self.server_name = server_name
        self.security = security if security is not None else HubSecurity()
        self.source = source
        self.instance_name = instance_name
        self.settings = settings or ConnectionSettings()
        self.state = HubState(
            server_name, self.settings,
            readable=(lambda stream: stream in source.stream_names()) if source is not None else (),
            stream_writers=stream_writers,
            own_instances=(instance_name,),
            stored_token=source.stored_token if source is not None else None,
            row_check=row_check,
        )
        # Every connection past its handshake, in the order they came (a dict: a
        # close removes its connection in constant time).
        self._by_session: dict[HubPeer, HubConnection] = {}
        #: where writes to peers that have not shown they read wait their turn
        self.write_lane = WriteLane()
        # Sessions whose socket is still in its TLS or authentication handshake,
        # with the greenlet doing it.
        self._handshaking: dict[HubPeer, Greenlet] = {}
        self.metrics = ReplicationMetrics(
            positions=lambda: dict(self.state.positions),
            queue_depths=lambda: {f"{c.name}#{id(c):x}": len(c.queue) for c in self._by_session.values()},
            queue_bytes=lambda: {f"{c.name}#{id(c):x}": c.queued_bytes for c in self._by_session.values()},
        )
        self._host, self._port = host, port
        self._listener: socket.socket | None = None
        self._acceptor: _Acceptor | None = None
        self._watcher: Greenlet | None = None
        self._ticker: Greenlet | None = None
        self._metrics_listen = metrics_listen
        self._metrics_server: Any = None
        self._refusals_logged: set[tuple[str, str]] = set()
        self._closed_since_trim = 0
        self._memory = MemoryReturn()
        self.stopped = gevent.event.Event()
        self.load_positions()

    # --- what the protocol knows, for embedding and tests --------------------------------------

    @property
    def positions(self) -> dict[tuple[str, str], int]:
        """Every writer's published position."""
        return self.state.positions

    @property
    def syncing_users(self) -> dict[str, set[str]]:
        """Syncing users per instance, from ``USER_SYNC``."""
        return self.state.syncing_users

    def all_syncing_users(self) -> set[str]:
        return self.state.all_syncing_users()

    def stream_names(self) -> list[str]:
        return self.state.stream_names()

    def writers(self, stream: str) -> list[str]:
        return self.state.writers(stream)

    def readable(self, stream: str) -> bool:
        """Whether the hub can read *stream*'s rows (for catch-up and gap filling)."""
        return self.state.readable(stream)

    @property
    def connections(self) -> list[HubConnection]:
        """Every connection past its handshake, in the order they came."""
        return list(self._by_session.values())

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the hub listens on (the real port once started)."""
        if self._listener is not None:
            host, port = self._listener.getsockname()[:2]
            return str(host), int(port)
        return self._host, self._port

    def load_positions(self, only_new: bool = False) -> None:
        """Read every writer's persisted position from the source (*only_new*: of
        writers the hub does not know yet, which start at 0 and are then published
        from the database like any writer nobody announces)."""
        source = self.source
        if source is None:
            return
        known = self.state.positions
        if only_new:
            reached: dict[str, int] = {}
            for (stream, _instance), token in known.items():
                reached[stream] = max(token, reached.get(stream, 0))
            for stream in source.stream_names():
                # Only rows past what the hub reached on the stream: cheap.
                for instance in source.writers(stream, reached.get(stream, 0)):
                    if (stream, instance) not in known and instance != self.instance_name:
                        self.state.load_positions([(stream, instance, 0)])
            return
        self.state.load_positions(
            (stream, instance, source.current_token(stream, instance))
            for stream in source.stream_names() for instance in source.writers(stream))
        for stream in source.stream_names():
            self.state.known_streams.setdefault(stream, None)

    def start(self) -> None:
        """Listen and serve in the background (greenlets)."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = gsocket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted sockets inherit the first (small) send buffer: see TcpConnection.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FIRST_SEND_BUFFER)
        listener.bind((self._host, self._port))
        listener.listen(listen_backlog())
        self._listener = listener
        self._acceptor = _Acceptor(listener, self._serve, self._out_of_descriptors)
        self._acceptor.start()
        self._ticker = gevent.spawn(self._tick_connections)
        if self.source is not None and self.settings.database_poll_interval > 0:
            self._watcher = gevent.spawn(self._watch_database)
        if self._metrics_listen is not None:
            self._metrics_server = serve_metrics(self.metrics, *self._metrics_listen)
        logger.info("replication hub %s listening on %s:%s", self.server_name, *self.address)

    def serve_forever(self) -> None:
        """Start (if needed) and block until :meth:`stop`."""
        if self._listener is None:
            self.start()
        self.stopped.wait()

    def stop(self, message: str = "server stopping", flush_timeout: float = 2.0) -> None:
        """Send ``ERROR <message>`` to every peer, close them all, stop listening."""
        if self.stopped.is_set():
            return
        if self._acceptor is not None:
            self._acceptor.close()
        if self._watcher is not None:
            self._watcher.kill(block=False)
        if self._ticker is not None:
            self._ticker.kill(block=False)
        if self._listener is not None:
            self._listener.close()
        closing = list(self.connections)
        for conn in closing:
            conn.close(DisconnectReason.SERVER_STOPPING, message)
        with gevent.Timeout(flush_timeout, False):
            for conn in closing:
                conn.wait_flushed(flush_timeout)
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self.stopped.set()

    # --- hooks for a security layer ----------------------------------------------------------

    def wrap_socket(self, sock: socket.socket) -> socket.socket:
        """The socket the connection will use: with TLS, the wrapped one once the
        handshake succeeded within the handshake timeout (else :class:`OSError`)."""
        context = self.security.ssl_context
        if context is None:
            return sock
        from streamrep.replication.tls import accept_tls

        wrapped, _ = accept_tls(context, sock, self.security.handshake_timeout)
        return wrapped

    def gate(self, sock: socket.socket) -> HubGate | None:
        """The authentication gate of a new connection on *sock*: the shared-secret
        handshake, and ``NAME`` matched to the client certificate; None: neither."""
        # Looked up on the class: a plain gevent socket would otherwise forward the
        # miss to the socket it wraps (an exception per connection).
        getpeercert = getattr(sock, "getpeercert", None) if hasattr(type(sock), "getpeercert") else None
        names = None
        if getpeercert is not None:
            from streamrep.replication.tls import certificate_names

            cert = getpeercert()
            names = certificate_names(cert) if cert else None
        if self.security.secret is None and names is None:
            return None
        return HubGate(self.server_name, self.security.secret, names)

    def before_name(self, sock: socket.socket, peer: str) -> bool:
        """A handshake before the session starts (a shared-secret challenge, say);
        False closes the connection. Nothing but this handshake is read until it
        returns."""
        return True

    # --- connections ---------------------------------------------------------------------------

    def _tick_connections(self) -> None:
        """Every connection's keepalive and deadlines, from one greenlet: a greenlet
        and a timer per connection would cost every accept and every close."""
        step = Keepalive(self.settings, 0.0).check_interval
        closed = 0
        while True:
            gevent.sleep(step)
            self._tick_all(time.monotonic())
            if self._closed_since_trim >= _TRIM_AFTER_CLOSES and self._closed_since_trim == closed:
                self._give_memory_back()
            closed = self._closed_since_trim

    def _tick_all(self, now: float) -> None:
        # Not inlined in _tick_connections: its loop variable would keep the last
        # connection (closed by its tick, say) alive while that greenlet sleeps.
        for conn in tuple(self._by_session.values()):
            try:
                conn.tick(now)
            except Exception:
                logger.exception("keepalive of %s failed", conn.name)
                conn.close(DisconnectReason.LOCAL_CLOSE, "internal error")

    def _give_memory_back(self) -> None:
        """Many peers went (slow readers cut off, say) and none since: hand back
        what their objects held (see :mod:`.hub_memory`)."""
        self._closed_since_trim = 0
        self._memory.give_back()

    def _out_of_descriptors(self, exc: OSError) -> None:
        self._log_refusal("*", f"cannot accept connections: {exc.strerror}; raise the "
                               "file descriptor limit (ulimit -n) or lower max_connections")

    def _serve(self, sock: socket.socket, address: Any) -> None:
        host = str(address[0])
        label = f"{host}:{address[1]}"
        state = self.state
        for peer, close in state.make_room(host):
            self._evict(peer, close)
        refusal = state.admit(host)
        if refusal is not None:
            self._refuse_early(sock, host, refusal)
            return
        # The session exists from the accept on: a peer still in its TLS or
        # authentication handshake is pending like one that has not sent NAME.
        session = state.new_peer(label, host)
        self._handshaking[session] = gevent.getcurrent()
        try:
            sock = self.wrap_socket(sock)
            if not self.before_name(sock, label):
                sock.close()
                return
        except (OSError, StreamrepError) as exc:
            if not session.closed:
                logger.info("replication connection %s failed its handshake: %s", label, exc)
            sock.close()
            return
        finally:
            self._handshaking.pop(session, None)
            if session.closed or sock.fileno() < 0:
                state.peer_lost(session)
        if session.closed:  # closed for a newer connection during its handshake
            sock.close()
            return
        conn = HubConnection(self, sock, label, session)
        gate = conn.gate = self.gate(sock)
        self._by_session[session] = conn
        self.metrics.connected()
        # Keepalive: one timer for every connection (_tick_connections), not one each.
        conn.run(gate.greeting(session.greeting()) if gate is not None else session.greeting(), keepalive=False)
        self._closed_since_trim += 1  # finished: what it held is freed as this returns

    def _evict(self, peer: HubPeer, close: Close) -> None:
        """Close a pending peer to make room for a new connection."""
        conn = self._by_session.get(peer)
        if conn is not None:
            conn.close(close.reason, close.error)
            return
        # Still in its handshake: nothing can be said to it yet. Killing its
        # greenlet ends the handshake, which closes the socket.
        handshake = self._handshaking.pop(peer, None)
        self.metrics.disconnected(close.reason)
        self.state.peer_lost(peer)
        if handshake is not None and handshake is not gevent.getcurrent():
            handshake.kill(block=False)

    def _refuse_early(self, sock: socket.socket, host: str, refusal: str) -> None:
        self.metrics.disconnected(DisconnectReason.TOO_MANY_CONNECTIONS)
        self._log_refusal(host, refusal)
        try:
            sock.settimeout(1.0)
            sock.sendall(f"ERROR {refusal}\n".encode())
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            sock.close()

    def _log_refusal(self, host: str, why: str) -> None:
        # Once per (peer, reason): a peer repeating an attack cannot flood the log.
        key = (host, why)
        if key in self._refusals_logged or len(self._refusals_logged) >= _LOGGED_REFUSALS_LIMIT:
            logger.debug("replication peer %s refused: %s", host, why)
            return
        self._refusals_logged.add(key)
        logger.warning("replication peer %s refused: %s", host, why)

    def connection_lost(self, conn: TcpConnection, reason: str) -> None:
        assert isinstance(conn, HubConnection)
        self._by_session.pop(conn.session, None)
        actions = self.state.peer_lost(conn.session)
        if not self.stopped.is_set():
            self.perform(conn, actions)
        worker = conn.catch_up_worker
        if worker is not None and worker is not gevent.getcurrent():
            worker.kill(block=False)

    # --- carrying out the protocol's actions ----------------------------------------------------

    def perform(self, conn: TcpConnection | None, actions: list[Action]) -> None:
        """Carry out *actions* of *conn*'s session (None: the hub's own).

        When a gap's fill fails, the later rows of that stream in *actions* (the
        writer's live ones, past the hole) are not published: a reader taking
        them would move past the facts the fill could not read, and never get
        them when the writer announces again and the hub fills from there.
        """
        unfilled: set[str] | None = None
        for action in actions:
            kind = type(action)
            if kind is Publish:
                assert isinstance(action, Publish)
                if unfilled is not None and action.stream in unfilled:
                    continue
                self.broadcast(action.stream, action.data, action.count, action.name, exclude=conn)
            elif kind is Send:
                assert isinstance(action, Send) and conn is not None
                conn.send_lines(action.data, action.count, action.name)
            elif kind is Relay:
                assert isinstance(action, Relay)
                self.relay_lines(action.data, action.name, exclude=conn)
            elif kind is FillGap:
                assert isinstance(action, FillGap)
                if not self._fill(action, conn):
                    unfilled = (unfilled or set()) | {action.stream}
            elif kind is CatchUp:
                assert isinstance(action, CatchUp) and isinstance(conn, HubConnection)
                self._start_catch_up(conn, action)
            elif kind is Close:
                assert isinstance(action, Close) and conn is not None
                conn.close(action.reason, action.error)
            elif kind is Received:
                assert isinstance(action, Received)
                if conn is not None:
                    conn.log_peer_error(action.command)

    def broadcast(self, stream: str, data: bytes, count: int, name: str, exclude: Any = None) -> None:
        """Queue encoded stream commands to every connection following *stream*
        (one shared chunk, counted in the metrics once for all)."""
        taken = 0
        for conn in tuple(self._by_session.values()):
            if conn is not exclude and conn.session.wants(stream):
                taken += conn.queue_lines(data, count)
        if taken:
            self.metrics.sent(name, count * taken)

    def relay_lines(self, data: bytes, name: str, exclude: Any = None) -> None:
        """Queue one encoded non-stream command to every connection but *exclude*."""
        taken = 0
        for conn in tuple(self._by_session.values()):
            if conn is not exclude:
                taken += conn.queue_lines(data, 1)
        if taken:
            self.metrics.sent(name, taken)

    def publish_rows(self, stream: str, instance: str, rows: list[tuple[int, bytes]],
                     new_token: int | None = None) -> None:
        """Publish rows ``(token, row_json)`` of a writer (token order, all past its
        position) and move its position to *new_token* (default: the last row's)."""
        self.perform(None, self.state.publish_rows(stream, instance, rows, new_token))

    def on_advance(self, stream: str, instance: str, visible: list[int], position: int) -> None:
        """A ``Streams`` position listener: ``streams.add_listener(hub.on_advance)``
        publishes the advances of this process's writers."""
        self.writer_advanced(stream, instance, position)

    def _watch_database(self) -> None:
        """Every ``database_poll_interval`` seconds, publish what writers nobody
        announces have committed (see :meth:`HubState.unattended`), writers the hub
        has never heard of included. A fact a writer committed is published even if
        that writer never announces it."""
        source = self.source
        assert source is not None
        while not self.stopped.is_set():
            gevent.sleep(self.settings.database_poll_interval)
            try:
                self.load_positions(only_new=True)
                for stream, instance in self.state.unattended():
                    self.writer_advanced(stream, instance, source.current_token(stream, instance))
            except Exception as exc:
                logger.warning("looking for unannounced facts in the database failed: %s", exc)

    def writer_advanced(self, stream: str, instance: str, new_token: int) -> None:
        """A writer of this process (or one sharing its database) reached
        *new_token*: publish its rows since the last published position."""
        self.perform(None, self.state.writer_advanced(stream, instance, new_token))

    def _fill(self, gap: FillGap, conn: TcpConnection | None) -> bool:
        """Publish a writer's rows in ``(from_token, upto_token]`` from the source;
        False if reading them failed (*conn*, the writer's, is then closed)."""
        source = self.source
        state = self.state
        stream, instance = gap.stream, gap.instance
        last = gap.from_token
        try:
            if source is None:
                raise StreamrepError(f"no database to read {stream} from")
            for rows in pages(source, stream, instance, last, gap.upto_token, CATCH_UP_BATCH):
                self.perform(None, state.fill_rows(gap, last, rows))
                last = rows[-1][0]
        except Exception as exc:
            state.fill_failed(gap, last)
            logger.warning("reading %s/%s from the database failed: %s", stream, instance, exc)
            if conn is not None:
                conn.close(DisconnectReason.CATCH_UP_FAILED, f"cannot read {stream} from the database: {exc}")
            return False
        self.perform(None, state.fill_done(gap, last))
        return True

    # --- catch-up -------------------------------------------------------------------------------

    def _start_catch_up(self, conn: HubConnection, action: CatchUp) -> None:
        conn.catch_ups.append(action)
        if conn.catch_up_worker is None or conn.catch_up_worker.dead:
            conn.catch_up_worker = gevent.spawn(self._catch_up_all, conn)

    def _catch_up_all(self, conn: HubConnection) -> None:
        while conn.catch_ups and not conn.closed:
            action = conn.catch_ups.pop(0)
            try:
                self.catch_up(conn, action.stream, action.from_token)
            except Exception as exc:
                logger.warning("catch-up of %s for %s failed: %s", action.stream, conn.name, exc)
                conn.close(DisconnectReason.CATCH_UP_FAILED, f"cannot replicate {action.stream}: {exc}")
                return

    def catch_up(self, conn: HubConnection, stream: str, from_token: int) -> None:
        """Stream *stream*'s rows after *from_token* to *conn*, then make it live.

        Runs in the connection's catch-up greenlet. Live rows of the stream are
        held back from *conn* meanwhile; the switch happens without yielding once
        every writer's published position has been streamed, so nothing is missed
        or sent twice. Every wait for room is bounded by the keepalive timeout.
        """
        source = self.source
        assert source is not None
        state = self.state
        queue = conn.queue
        wait = self.settings.ping_timeout
        sent: dict[str, int] = {}
        last_row: dict[str, int] = {}
        while not conn.closed:
            behind = state.catch_up_behind(stream, sent, from_token)
            if not behind:
                data, count = state.catch_up_positions(stream, from_token, last_row)
                if count > queue.max_commands:
                    conn.close(DisconnectReason.CATCH_UP_FAILED,
                               f"catch-up of {stream} must queue {count} positions at once, more than "
                               f"the queue bound ({queue.max_commands}); raise backpressure.max_queue")
                    return
                if queue.fits(count, len(data)):
                    # Switch to live: nothing yielded since the check above.
                    conn.session.catch_up_done(stream)
                    if count:
                        conn.send_lines(data, count, "POSITION")
                    return
                if not queue.wait_for_room(count, timeout=wait, size=len(data)):
                    self._too_slow(conn)
                    return
                continue  # the wait yielded: look again for newer rows
            for instance, upto in behind:
                start = sent.get(instance, from_token)
                # Limited pages end at a whole stream ID (the source's contract).
                for rows in pages(source, stream, instance, start, upto, CATCH_UP_BATCH):
                    if not self._send_catch_up_rows(conn, stream, instance, rows):
                        return
                    last_row[instance] = rows[-1][0]
                    # One peer's long catch-up never holds the others, nor the
                    # sockets: sleep(0) would run other greenlets without polling.
                    poll_yield()
                sent[instance] = upto

    def _send_catch_up_rows(self, conn: HubConnection, stream: str, instance: str,
                            rows: list[tuple[int, bytes]]) -> bool:
        """Queue one page of catch-up rows, in pieces that fit the queue (at most half
        its bound in commands and in bytes; a single larger row goes alone), even when
        one fact is larger than the whole bound; False when the peer is gone or too slow."""
        queue = conn.queue
        most_lines = max(1, queue.max_commands // 2)
        most_bytes = max(1, queue.max_bytes // 2)
        piece: list[bytes] = []
        size = 0
        for line in C.rdata_line_list(stream, instance, rows):
            if piece and (len(piece) >= most_lines or size + len(line) > most_bytes):
                if not self._queue_catch_up_piece(conn, piece, size):
                    return False
                piece, size = [], 0
            piece.append(line)
            size += len(line)
        return not piece or self._queue_catch_up_piece(conn, piece, size)

    def _queue_catch_up_piece(self, conn: HubConnection, piece: list[bytes], size: int) -> bool:
        if not conn.queue.wait_for_room(len(piece), timeout=self.settings.ping_timeout, size=size):
            self._too_slow(conn)
            return False
        return conn.send_lines(b"".join(piece), len(piece), "RDATA")

    def _too_slow(self, conn: TcpConnection) -> None:
        if not conn.closed:
            conn.close(DisconnectReason.SLOW_CONSUMER,
                       f"too far behind: no room in the queue for {self.settings.ping_timeout:g} seconds")

