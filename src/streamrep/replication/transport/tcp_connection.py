"""One TCP connection driven by a protocol session: the only place that reads and
writes replication sockets.

One greenlet per connection: the read loop (decode, hand the commands to the
session, pass its actions to the owner), which also finishes the connection when
it ends. Writing takes no greenlet: what producers queue (a bounded
:class:`OutboundQueue`) is written from the event loop, once per loop iteration,
in one non-blocking scatter-gather ``sendmsg`` over the queued chunks as they are
(a burst shared by every reader is never copied per reader); what the socket does
not take waits for it to become writable. So a peer that does not read never
blocks the loop, and is cut off when it falls past its queue's bound or takes
nothing for ``ping_timeout`` seconds.

The hub's sockets start with a small kernel send buffer that grows fourfold each
time the peer drains it (its full socket then takes twice the kernel's buffer): a
peer that never reads holds a copy of at most that first buffer in the kernel (and
its own receive window), while a reader soon gets one as large as the kernel
allows. Until a peer has drained its buffer once (or taken a mebibyte), its
writes wait their turn in the owner's :class:`WriteLane`, a few at a time between
everything else the loop does: copying a burst into the buffers of many peers that
never read cannot hold up the relay or the readers that have shown they keep up,
whose writes go first.

A TLS socket (no ``sendmsg``, and writes that may need reads) gets a writer
greenlet instead. Keepalive is the session's
:meth:`~streamrep.replication.protocol.Session.tick`, from a timer of the
connection's own or from its owner. A TLS layer wraps the socket before it gets
here; an authentication gate (:attr:`TcpConnection.gate`) sees every read before
the session until it has nothing left to check.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
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

__all__ = ["TcpConnection", "Perform", "WriteLane", "poll_yield"]

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

#: Why a connection may end without a line at INFO when the peer never said anything.
_ROUTINE_UNHEARD = frozenset({DisconnectReason.PEER_CLOSED, DisconnectReason.PENDING_EVICTED})
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
_WRITE = 2  # libev/libuv: watch for writability
#: The hub's first send buffer per peer (``SO_SNDBUF``; Linux doubles it): what a
#: peer that never reads costs the kernel, copied once per such peer.
FIRST_SEND_BUFFER = 4 * 1024
#: The largest it grows to (the kernel holds it under ``net.core.wmem_max``).
LARGEST_SEND_BUFFER = 4 * 1024 * 1024
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)


def _send_scattered(sendmsg: Callable[[list[Any]], int], chunks: list[Any]) -> tuple[list[Any], int]:
    """Write the chunks with as few ``sendmsg`` calls as the socket takes, until it
    is full (a short write, or :class:`BlockingIOError`). Returns what is left, in
    order, the first chunk resumed through a memoryview after a partial write (no
    chunk is copied), and how many bytes were written."""
    total = len(chunks)
    start = 0
    head: Any = None  # what is left of chunks[start] after a partial write
    wrote = 0
    while start < total:
        batch: list[Any] = chunks[start:start + _IOV_MAX]
        if head is not None:
            batch[0] = head
        try:
            sent = sendmsg(batch)
        except BlockingIOError:
            sent = 0
        wrote += sent
        for buf in batch:
            size = len(buf)
            if sent < size:
                if sent:
                    head = memoryview(buf)[sent:]
                rest = chunks[start:]
                if head is not None:
                    rest[0] = head
                return rest, wrote
            sent -= size
            start += 1
            head = None
    return [], wrote


#: A sleep that lets the event loop poll its sockets once (sleep(0) does not).
_YIELD_SECONDS = 1e-6


def poll_yield() -> None:
    """Let every other greenlet run and the event loop poll its sockets once, so a
    long loop (a catch-up, a burst) never keeps writable sockets waiting for its end."""
    gevent.sleep(_YIELD_SECONDS)


#: How long one turn of a WriteLane may write before the loop does anything else.
_LANE_TURN_SECONDS = 0.001
#: Bytes a peer's socket must have taken to show the peer reads, when it never
#: filled: more than the kernel buffers of a peer that does not read hold.
_SHOWN_TO_READ = 1 << 20


class WriteLane:
    """The writes of connections that have not shown yet that they read, taken in
    order, for at most :data:`_LANE_TURN_SECONDS` per iteration of the event loop,
    from a timer: each turn comes after the loop has polled the sockets, so what
    became ready meanwhile (a relay's next read, a reader's socket that drained)
    runs between turns. One per owner of many connections (the hub)."""

    __slots__ = ("_waiting", "_timer")

    def __init__(self) -> None:
        self._waiting: deque[TcpConnection] = deque()
        self._timer: Any = None

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, conn: TcpConnection) -> None:
        self._waiting.append(conn)
        timer = self._timer
        if timer is None:
            timer = self._timer = gevent.get_hub().loop.timer(0.0)
        if not timer.active:
            timer.start(self._turn)

    def _turn(self) -> None:
        waiting = self._waiting
        deadline = time.perf_counter() + _LANE_TURN_SECONDS
        while waiting:
            conn = waiting.popleft()
            try:
                conn._write_now()
            except Exception:
                logger.exception("writing to %s failed", conn.name)
            if time.perf_counter() >= deadline:
                break
        if waiting:
            self._timer.start(self._turn)


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
    once with the close reason. *send_buffer*: the socket's kernel send buffer,
    which grows fourfold (up to :data:`LARGEST_SEND_BUFFER`) each time the peer
    takes more after it was full; None leaves it to the kernel. *lane*: where
    writes wait until the peer has drained its buffer once (None: written at once).
    """

    # No __dict__: a hub holds thousands of these.
    __slots__ = ("sock", "peer", "settings", "metrics", "session", "queue", "decoder", "heard", "closed",
                 "close_reason", "refusal", "_perform", "_on_lost", "gate", "_reader", "_closer", "_eof",
                 "_drained", "_keepalive", "_sendmsg", "_write_scheduled", "_unsent", "_writable", "_flushed",
                 "_writer", "_in_flight", "_sock_closed", "_send_buffer", "_lane", "_taken",
                 "_taken_since_full")

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
        send_buffer: int | None = None,
        lane: WriteLane | None = None,
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
        #: An authentication gate (:mod:`streamrep.replication.auth`) every read goes
        #: through first, until it says ``passthrough``; None: none.
        self.gate: Gate | None = None
        self._reader: Greenlet | None = None  # the greenlet in run()
        self._closer: Greenlet | None = None  # finishes a close asked for by another greenlet
        self._eof = False  # the read loop has ended: the peer closed, or the socket failed
        self._drained: gevent.event.Event | None = None
        self._keepalive: Greenlet | None = None
        # Writing. A plain socket is written from the event loop (_write_now); a
        # TLS socket by a greenlet of its own (_write_loop).
        self._sendmsg: Callable[[list[Any]], int] | None = None
        kind = type(sock)  # the class: a gevent socket forwards misses on itself
        if not hasattr(kind, "getpeercert") and hasattr(kind, "sendmsg"):
            sendmsg = sock.sendmsg
            self._sendmsg = lambda buffers: sendmsg(buffers, (), _DONTWAIT)
        self._write_scheduled = False
        self._unsent: list[Any] | None = None  # what the socket did not take yet
        self._writable: Any = None  # the loop's watcher for writability, while _unsent waits
        self._flushed: gevent.event.Event | None = None
        self._writer: Greenlet | None = None
        self._in_flight = False
        self._sock_closed = False
        self._send_buffer = send_buffer
        self._lane = lane  # None once the peer has shown it reads
        self._taken = 0  # bytes its socket took while it was in the lane
        self._taken_since_full = 0  # bytes its socket took once full, since its buffer last grew
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
        """Start writing (and, with *keepalive*, the keepalive timer; an owner of many
        connections calls :meth:`tick` itself instead) and carry out *greeting*."""
        if self._sendmsg is None:
            # A TLS writer blocks in sendall, with no moment to grow the buffer.
            self._grow_send_buffer(LARGEST_SEND_BUFFER)
            self._writer = gevent.spawn(self._write_loop)
        if keepalive:
            self._keepalive = gevent.spawn(self._keepalive_loop)
        if greeting:
            self._perform(self, list(greeting))

    def run(self, greeting: Sequence[Action] = (), keepalive: bool = True) -> None:
        """Start, then read in the current greenlet until the connection ends, and
        finish it (flush, close the socket) before returning."""
        self._reader = gevent.getcurrent()
        self.start(greeting, keepalive)
        self._read_loop()
        if self._closer is None:
            self._finish_close()
        else:
            # Stay until the last lines are flushed: the caller may close the
            # socket as soon as this returns.
            self._closer.join(_CLOSE_FLUSH_SECONDS + _CLOSE_DRAIN_SECONDS + 1)

    def wait_flushed(self, timeout: float) -> None:
        """Wait (at most *timeout*) for what is queued to be written after a close."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout)
            return
        if self._sock_closed or self.idle():
            return
        flushed = self._flushed
        if flushed is None:
            flushed = self._flushed = gevent.event.Event()
        flushed.wait(timeout)

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
            self._schedule_write()
            if self.metrics is not None:
                self.metrics.sent("ERROR", 1)
        self.queue.close()
        if self.metrics is not None:
            self.metrics.disconnected(reason)
        # A connection that ended before saying anything is routine (a port
        # check, a load balancer's probe, one closed to make room for newer ones
        # in a burst of them): not worth a line per connection.
        if reason not in _ROUTINE_UNHEARD or self.heard:
            logger.info("replication connection %s closed: %s%s", self.name, reason,
                        f" ({error})" if error else "")
        elif logger.isEnabledFor(logging.DEBUG):
            logger.debug("replication connection %s closed: %s", self.name, reason)
        if gevent.getcurrent() is not self._reader:
            # The read loop may be waiting for input: it keeps reading (and
            # dropping) while this greenlet flushes and half-closes.
            self._closer = gevent.spawn(self._finish_close)
        if self._on_lost is not None:
            try:
                self._on_lost(self, reason)
            except Exception:
                logger.exception("connection-lost handling failed for %s", self.name)

    def _finish_close(self) -> None:
        """Flush (at most a second), half-close and let the peer close its side (at
        most a second more), then close the socket. In the read loop's greenlet
        once it has ended, else in a closer greenlet while the read loop drains."""
        self.wait_flushed(_CLOSE_FLUSH_SECONDS)
        self._stop_writing()
        if not self._eof:
            try:
                _half_close(self.sock)
            except OSError:
                pass
            else:
                self._drain(_CLOSE_DRAIN_SECONDS)
        self._sock_closed = True
        self.sock.close()
        self.queue.clear()  # what could not be flushed in time is dropped
        if resources.ENABLED:
            resources.released("replication connection")
        for greenlet in (self._writer, self._keepalive):
            if greenlet is not None and greenlet is not gevent.getcurrent() and not greenlet.dead:
                greenlet.kill(block=False)

    def _drain(self, seconds: float) -> None:
        """Read (and drop) what the peer still sends until it closes, for at most
        *seconds*: closing a socket with unread input makes the kernel reset the
        connection, and a reset can destroy lines the peer has not read yet."""
        if gevent.getcurrent() is not self._reader:
            if not self._eof:
                drained = self._drained = gevent.event.Event()
                drained.wait(seconds)
            return
        recv = self.sock.recv
        with gevent.Timeout(seconds, False):
            while True:
                try:
                    if not recv(_READ_SIZE):
                        return
                except (OSError, ValueError):
                    return

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
            self._eof = True
            if self._drained is not None:
                self._drained.set()

    def _read_until_eof(self) -> None:
        """Read and act on commands until the peer closes or this greenlet closed
        the connection (run() then finishes it). Closed by another greenlet, keep
        reading (and dropping) until the peer closes, see _CLOSE_DRAIN_SECONDS."""
        recv = self.sock.recv
        feed = self.decoder.feed
        session = self.session
        metrics = self.metrics
        perform = self._perform
        monotonic = time.monotonic
        sleep = gevent.sleep
        while not (self.closed and self._closer is None):
            try:
                data = recv(_READ_SIZE)
            except (OSError, ValueError) as exc:  # ValueError: a TLS socket closed under us
                self._eof = True
                if not self.closed:
                    self.close(DisconnectReason.SOCKET_ERROR)
                logger.debug("read from %s failed: %s", self.name, exc)
                return
            if not data:
                self._eof = True
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
                # Let the loop poll and write what this read queued (to every peer)
                # before the next read: a long burst goes out as it is read, not once
                # it is over. (sleep(0) would not poll: sockets that became writable
                # would wait for the whole burst.)
                sleep(_YIELD_SECONDS)

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
        if not self.queue_lines(data, count):
            return False
        if self.metrics is not None:
            self.metrics.sent(name, count)
        return True

    def queue_lines(self, data: bytes, count: int) -> bool:
        """:meth:`send_lines` without counting them in the metrics: for lines shared
        by many connections (a broadcast), which the owner counts once for all."""
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
        if not self._write_scheduled and self._unsent is None and self._sendmsg is not None:
            self._schedule_write()
        return True

    def _schedule_write(self) -> None:
        """Write what is queued from the event loop, once everything running now has
        queued its part: one ``sendmsg`` per peer per loop iteration. A peer whose
        socket is full is written when it becomes writable instead."""
        if self._write_scheduled or self._unsent is not None or self._sendmsg is None or self._sock_closed:
            return
        self._write_scheduled = True
        if self._lane is None:
            gevent.get_hub().loop.run_callback(self._write_now)
        else:
            self._lane.add(self)

    def _write_now(self) -> None:
        """Write, without blocking, what the socket did not take before and then what
        is queued, until the socket is full (then wait for it to be writable) or
        nothing is left. Runs in the event loop: it never blocks or yields."""
        self._write_scheduled = False
        if self._sock_closed:
            return
        sendmsg = self._sendmsg
        assert sendmsg is not None
        chunks = self._unsent
        drained = chunks is not None  # called because the full socket became writable
        wrote = 0
        while True:
            if chunks is None:
                chunks, _count = self.queue.take_now()
                if not chunks:
                    break
            try:
                chunks, sent = _send_scattered(sendmsg, chunks)
            except OSError as exc:
                self._write_failed(exc)
                return
            wrote += sent
            if chunks:
                break
            chunks = None
        if wrote:
            self.session.data_sent(time.monotonic())
            if drained and self._send_buffer is not None:
                # Once full, the socket has since taken twice the kernel's buffer
                # (which is twice what was asked): the peer reads. A peer that does
                # not only lets its own receive window take a little more.
                self._taken_since_full += wrote
                if self._taken_since_full >= 4 * self._send_buffer:
                    self._taken_since_full = 0
                    self._grow_send_buffer(self._send_buffer * 4)
                    self._lane = None
            elif self._lane is not None:
                self._taken += wrote
                if self._taken >= _SHOWN_TO_READ:
                    self._lane = None
        self._unsent = chunks or None
        if chunks:
            if self._writable is None:
                self._writable = gevent.get_hub().loop.io(self.sock.fileno(), _WRITE)
                self._writable.start(self._write_now)
            return
        if self._writable is not None:
            self._writable.close()
            self._writable = None
        if self._flushed is not None and self.queue.closed:
            self._flushed.set()

    def _grow_send_buffer(self, size: int) -> None:
        """The peer reads what it is sent: give its socket a larger send buffer."""
        current = self._send_buffer
        if current is None or current >= LARGEST_SEND_BUFFER:
            return
        self._send_buffer = min(size, LARGEST_SEND_BUFFER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        except OSError:
            self._send_buffer = None

    def _write_failed(self, exc: OSError) -> None:
        """A write failed (the peer reset the connection, say): close from a greenlet,
        not from the event loop, which must not run the owner's handling."""
        logger.debug("write to %s failed: %s", self.name, exc)
        self._stop_writing()
        if self._flushed is not None:
            self._flushed.set()
        if not self.closed:
            gevent.spawn(self.close, DisconnectReason.SOCKET_ERROR)

    def _stop_writing(self) -> None:
        """Nothing more is written: stop watching the socket (before it is closed)."""
        self._unsent = None
        if self._writable is not None:
            self._writable.close()
            self._writable = None

    def _write_loop(self) -> None:
        """A TLS socket's writer: everything queued at a time, in pieces."""
        queue = self.queue
        sock = self.sock
        sendall = sock.sendall
        session = self.session

        def send_piece(piece: Any) -> None:
            sendall(piece)
            session.data_sent(time.monotonic())

        while True:
            chunks, _count = queue.take()
            if not chunks:
                if queue.closed:
                    return
                continue
            self._in_flight = True
            try:
                _send_coalesced(send_piece, chunks)
            except OSError as exc:
                logger.debug("write to %s failed: %s", self.name, exc)
                self.close(DisconnectReason.SOCKET_ERROR)
                return
            finally:
                self._in_flight = False
                del chunks

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting to be written: queued, and what the socket did not take yet."""
        return self.queue.queued_bytes + sum(len(chunk) for chunk in self._unsent or ())

    def idle(self) -> bool:
        """True when everything queued has been handed to the socket."""
        return len(self.queue) == 0 and self._unsent is None and not self._in_flight

    def tick(self, now: float) -> None:
        """The session's timers (pings, timeouts, deadlines), carried out."""
        if self.closed:
            return
        actions = self.session.tick(now, self.idle())
        if actions:
            self._perform(self, actions)

    def _keepalive_loop(self) -> None:
        step = self.session.keepalive.check_interval
        while not self.closed:
            gevent.sleep(step)
            self.tick(time.monotonic())
