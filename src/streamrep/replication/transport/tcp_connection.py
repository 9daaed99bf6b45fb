"""One TCP connection driven by a protocol session: the only place that reads and
writes replication sockets.

Three greenlets per connection: the read loop (decode, hand the commands to the
session, pass its actions to the owner), the writer (everything queued at a
time, from a bounded :class:`OutboundQueue`, in one scatter-gather ``sendmsg`` over
the queued chunks as they are, so a burst shared by every reader is never copied
per reader) and the
keepalive timer (the session's :meth:`~streamrep.replication.protocol.Session.tick`).
A TLS layer wraps the socket before it gets here; an authentication gate
(:attr:`TcpConnection.gate`) sees every read before the session until it has
nothing left to check.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import gevent
import gevent.event
from gevent import Greenlet
from gevent import socket as gsocket

from streamrep import resources
from streamrep.errors import ProtocolError
from streamrep.replication import commands as C
from streamrep.replication.outbound import OutboundQueue
from streamrep.replication.protocol import Action, Close, ConnectionSettings, DisconnectReason, Received, Send, Session

if TYPE_CHECKING:
    from streamrep.replication.metrics import ReplicationMetrics

__all__ = ["TcpConnection", "Perform"]

logger = logging.getLogger(__name__)

#: ``perform(connection, actions)``: the owner carries out a session's actions.
Perform = Callable[["TcpConnection", list[Action]], None]


def _half_close(sock: socket.socket) -> None:
    """Send FIN and keep reading. A TLS socket's own ``shutdown`` drops its TLS
    state, after which nothing more could be read (or drained) from it; the
    plain socket's keeps it, and the peer reads the FIN as the end of the stream."""
    if hasattr(sock, "getpeercert") and isinstance(sock, gsocket.socket):
        gsocket.socket.shutdown(sock, socket.SHUT_WR)
    else:
        sock.shutdown(socket.SHUT_WR)


class Gate(Protocol):
    """What the read loop needs of an authentication gate (see :mod:`streamrep.replication.auth`)."""

    passthrough: bool

    def receive(self, commands: list[Any]) -> tuple[list[Action], list[Any]]: ...

#: How long a closing connection may spend flushing its last lines.
_CLOSE_FLUSH_SECONDS = 1.0
# After our last line, how long to read (and drop) what the peer still sends
# until it closes too. Closing a socket with unread input makes the kernel
# reset the connection, and a reset can destroy lines the peer has not read
# yet: our ERROR, or a writer's last RDATA.
_CLOSE_DRAIN_SECONDS = 1.0
_READ_SIZE = 262144
#: Buffers per ``sendmsg`` (the kernel refuses more than IOV_MAX).
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
#: Largest piece small chunks are joined into on a TLS socket.
_TLS_PIECE = 65536


def _send_scattered(sendmsg: Callable[[list[Any]], int], chunks: list[bytes]) -> None:
    """Write every chunk with as few ``sendmsg`` calls as the socket allows, resuming
    after a partial write through a memoryview (no chunk is copied)."""
    total = len(chunks)
    start = 0
    head: memoryview | None = None  # what is left of chunks[start] after a partial write
    while start < total:
        end = min(total, start + _IOV_MAX)
        batch: list[Any] = chunks[start:end]
        if head is not None:
            batch[0] = head
        sent = sendmsg(batch)
        for buf in batch:
            size = len(buf)
            if sent < size:
                if sent:
                    head = memoryview(buf)[sent:]
                break
            sent -= size
            start += 1
            head = None


def _send_coalesced(sendall: Callable[[Any], None], chunks: list[bytes]) -> None:
    """Write *chunks* through ``sendall``: large ones alone, small ones joined into
    pieces of at most :data:`_TLS_PIECE` bytes."""
    piece: list[bytes] = []
    size = 0
    for chunk in chunks:
        if size and size + len(chunk) > _TLS_PIECE:
            sendall(piece[0] if len(piece) == 1 else b"".join(piece))
            piece, size = [], 0
        if len(chunk) >= _TLS_PIECE:
            sendall(chunk)
            continue
        piece.append(chunk)
        size += len(chunk)
    if piece:
        sendall(piece[0] if len(piece) == 1 else b"".join(piece))


class TcpConnection:
    """A socket, a session, a bounded outbound queue.

    *perform* carries out the session's actions (default: :meth:`perform_basic`,
    which knows ``Send``, ``Close`` and a peer's ``ERROR``). *on_lost* is called
    once with the close reason.
    """

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        settings: ConnectionSettings,
        metrics: ReplicationMetrics | None = None,
        *,
        session: Session | None = None,
        perform: Perform | None = None,
        on_lost: Callable[[TcpConnection, str], None] | None = None,
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.settings = settings
        self.metrics = metrics
        self.session = session if session is not None else Session(settings)
        self.queue = OutboundQueue(settings.max_queued_commands, settings.max_queued_bytes)
        self.decoder = C.new_decoder(settings.max_line_length)
        #: whether anything was ever read from the peer
        self.heard = False
        self.closed = False
        self.close_reason: str | None = None
        #: what the peer's last ``ERROR`` said (None: it sent none)
        self.refusal: str | None = None
        self._perform = perform if perform is not None else TcpConnection.perform_basic
        self._on_lost = on_lost
        self._in_flight = False
        #: An authentication gate (:mod:`streamrep.replication.auth`) every read goes
        #: through first, until it says ``passthrough``; None: none.
        self.gate: Gate | None = None
        self._closer: Greenlet | None = None
        self._drained = gevent.event.Event()
        self._greenlets: list[Greenlet] = []
        self._writer: Greenlet | None = None
        if resources.ENABLED:
            resources.acquired("replication connection")
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    @property
    def name(self) -> str:
        """How logs and metrics name the connection."""
        return self.peer

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, greeting: Sequence[Action] = (), keepalive: bool = True) -> None:
        """Start the writer greenlet (and, with *keepalive*, the keepalive timer; an
        owner of many connections calls :meth:`tick` itself instead) and carry out
        *greeting*."""
        self._writer = gevent.spawn(self._write_loop)
        self._greenlets = [self._writer]
        if keepalive:
            self._greenlets.append(gevent.spawn(self._keepalive_loop))
        if greeting:
            self._perform(self, list(greeting))

    def run(self, greeting: Sequence[Action] = (), keepalive: bool = True) -> None:
        """Start, then read in the current greenlet until the connection ends."""
        self.start(greeting, keepalive)
        self._read_loop()
        # Stay until the last lines are flushed: the caller may close the socket
        # as soon as this returns.
        if self._closer is not None:
            self._closer.join(_CLOSE_FLUSH_SECONDS + _CLOSE_DRAIN_SECONDS + 1)

    def wait_flushed(self, timeout: float) -> None:
        """Wait (at most *timeout*) for the writer to finish after a close."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout)

    def close(self, reason: str, error: str | None = None) -> None:
        """End the connection, sending ``ERROR <error>`` first when given.

        Queued lines are still flushed (for at most a second) unless the peer is a
        slow consumer, whose backlog is dropped.
        """
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self.session.closing(reason)
        if reason == DisconnectReason.SLOW_CONSUMER:
            self.queue.clear()
        if error is not None:
            # ERROR lines go out even when the bound was reached.
            self.queue.put_last(C.encode_one(C.error(error)), 1)
            if self.metrics is not None:
                self.metrics.sent("ERROR", 1)
        self.queue.close()
        if self.metrics is not None:
            self.metrics.disconnected(reason)
        # A connection that closed before saying anything is routine (a port
        # check, a load balancer's probe): not worth a line per connection.
        quiet = reason == DisconnectReason.PEER_CLOSED and not self.heard
        (logger.debug if quiet else logger.info)(
            "replication connection %s closed: %s%s", self.name, reason, f" ({error})" if error else "")
        self._closer = gevent.spawn(self._finish_close)
        if self._on_lost is not None:
            try:
                self._on_lost(self, reason)
            except Exception:
                logger.exception("connection-lost handling failed for %s", self.name)

    def _finish_close(self) -> None:
        writer = self._writer
        if writer is not None and not writer.dead:
            writer.join(_CLOSE_FLUSH_SECONDS)
            if not writer.dead:
                writer.kill(block=False)
        # Half-close, then let the read loop drain until the peer closes its side.
        try:
            _half_close(self.sock)
        except OSError:
            self._drained.set()
        self._drained.wait(_CLOSE_DRAIN_SECONDS)
        self.sock.close()
        self.queue.clear()  # what the writer could not flush in time is dropped
        if resources.ENABLED:
            resources.released("replication connection")
        for greenlet in self._greenlets:
            if greenlet is not gevent.getcurrent() and not greenlet.dead:
                greenlet.kill(block=False)

    # --- actions ----------------------------------------------------------------------------

    def perform_basic(self, actions: Sequence[Action],
                      on_command: Callable[[Any], None] | None = None) -> None:
        """Carry out ``Send``, ``Close`` and a peer's ``ERROR``; hand any other
        received command to *on_command*; ignore the rest."""
        for action in actions:
            kind = type(action)
            if kind is Send:
                assert isinstance(action, Send)
                self.send_lines(action.data, action.count, action.name)
            elif kind is Close:
                assert isinstance(action, Close)
                self.close(action.reason, action.error)
            elif kind is Received:
                assert isinstance(action, Received)
                if not self.log_peer_error(action.command) and on_command is not None:
                    on_command(action.command)

    def log_peer_error(self, command: Any) -> bool:
        """Log a peer's ``ERROR``; True if *command* was one."""
        if command.NAME != "ERROR":
            return False
        self.refusal = C.error_message(command)
        logger.warning("replication peer %s sent ERROR %s", self.name, self.refusal)
        return True

    # --- reading -----------------------------------------------------------------------------

    def _read_loop(self) -> None:
        try:
            self._read_until_eof()
        finally:
            self._drained.set()

    def _read_until_eof(self) -> None:
        """Read and act on commands until the peer closes; once this end has
        closed, keep reading (and dropping) until then, see _CLOSE_DRAIN_SECONDS."""
        recv = self.sock.recv
        feed = self.decoder.feed
        session = self.session
        metrics = self.metrics
        perform = self._perform
        monotonic = time.monotonic
        while True:
            try:
                data = recv(_READ_SIZE)
            except (OSError, ValueError) as exc:  # ValueError: a TLS socket closed under us
                if not self.closed:
                    self.close(DisconnectReason.SOCKET_ERROR)
                logger.debug("read from %s failed: %s", self.name, exc)
                return
            if not data:
                if not self.closed:
                    self.close(DisconnectReason.PEER_CLOSED)
                return
            if self.closed:
                continue
            self.heard = True
            try:
                commands = feed(data)
            except ProtocolError as exc:
                if metrics is not None:
                    metrics.received_commands(exc.commands)
                if self.gate is not None and not self.gate.passthrough:
                    actions = self._through_gate(self.gate, list(exc.commands), exc)
                else:
                    actions = session.receive_failed(exc, monotonic())
            else:
                if metrics is not None:
                    metrics.received_commands(commands)
                if self.gate is not None and not self.gate.passthrough:
                    actions = self._through_gate(self.gate, commands)
                else:
                    actions = session.receive(commands, monotonic())
            if actions:
                try:
                    perform(self, actions)
                except Exception:
                    # A bug (or a failing handler): drop this connection (a client
                    # reconnects) rather than leave it half-processed.
                    logger.exception("handling commands from %s failed", self.name)
                    self.close(DisconnectReason.LOCAL_CLOSE, "internal error")

    def _through_gate(self, gate: Gate, commands: list[Any],
                      error: ProtocolError | None = None) -> list[Action]:
        """The gate's actions, then the session's for what the gate let through."""
        first, passed = gate.receive(commands)
        if any(type(action) is Close for action in first):
            return first
        now = time.monotonic()
        if error is not None:
            error.commands = passed  # only what the gate let through reaches the session
            return first + self.session.receive_failed(error, now)
        return first + self.session.receive(passed, now)

    # --- writing -----------------------------------------------------------------------------

    def send(self, command: Any) -> bool:
        """Queue one command; False (and the peer is cut off) if the queue is full."""
        return self.send_lines(C.encode_one(command), 1, command.NAME)

    def send_lines(self, data: bytes, count: int, name: str) -> bool:
        """Queue *count* already-encoded commands named *name*.

        A peer whose queue would overflow gets ``ERROR`` and is disconnected, so
        it can never hold the sender up or grow its memory past the bound.
        """
        if self.closed:
            return False
        queue = self.queue
        if not queue.put(data, count):
            if len(queue) + count > queue.max_commands:
                why = f"more than {queue.max_commands} commands queued"
            else:
                why = f"more than {queue.max_bytes} bytes queued"
            self.close(DisconnectReason.SLOW_CONSUMER, f"too far behind: {why}")
            return False
        if self.metrics is not None:
            self.metrics.sent(name, count)
        return True

    def _write_loop(self) -> None:
        queue = self.queue
        write = self._chunk_writer()
        session = self.session
        while True:
            chunks, _count = queue.take()
            if not chunks:
                if queue.closed:
                    return
                continue
            self._in_flight = True
            try:
                write(chunks)
            except OSError as exc:
                logger.debug("write to %s failed: %s", self.name, exc)
                self.close(DisconnectReason.SOCKET_ERROR)
                return
            finally:
                self._in_flight = False
                del chunks
            session.data_sent(time.monotonic())

    def _chunk_writer(self) -> Callable[[list[bytes]], None]:
        """How this socket writes a list of chunks: ``sendmsg`` over them as they
        are; a TLS socket (which has no ``sendmsg``) gets them coalesced into
        pieces of at most :data:`_TLS_PIECE` bytes, so what is copied per peer
        stays small."""
        sock = self.sock
        if hasattr(sock, "getpeercert") or not hasattr(sock, "sendmsg"):
            sendall = sock.sendall
            return lambda chunks: _send_coalesced(sendall, chunks)
        sendmsg = sock.sendmsg
        return lambda chunks: _send_scattered(sendmsg, chunks)

    def idle(self) -> bool:
        """True when everything queued has been handed to the socket."""
        return len(self.queue) == 0 and not self._in_flight

    def tick(self, now: float) -> None:
        """The session's timers (pings, timeouts, deadlines), carried out."""
        if self.closed:
            return
        actions = self.session.tick(now, len(self.queue) == 0)
        if actions:
            self._perform(self, actions)

    def _keepalive_loop(self) -> None:
        step = self.session.keepalive.check_interval
        while not self.closed:
            gevent.sleep(step)
            self.tick(time.monotonic())
