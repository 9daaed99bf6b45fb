"""One replication connection: reading, dispatch, the outbound queue, keepalive.

The same machinery serves both ends. Subclasses define ``on_<COMMAND>`` methods
for the commands they accept; :meth:`ReplicationConnection.__init__` binds those
that exist into a dispatch table once, so a line costs one dict lookup. A command
with no handler is refused with ``ERROR`` and the connection is closed, like a
line that does not parse.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

import gevent
import gevent.event
from gevent import Greenlet

from streamrep import resources
from streamrep.errors import ProtocolError
from streamrep.replication import commands as C
from streamrep.replication.keepalive import Keepalive
from streamrep.replication.outbound import DEFAULT_MAX_QUEUED_COMMANDS, OutboundQueue

if TYPE_CHECKING:
    from streamrep.config import Config
    from streamrep.replication.metrics import ReplicationMetrics

__all__ = ["ReplicationConnection", "ConnectionSettings", "DisconnectReason"]

logger = logging.getLogger(__name__)

#: How long a closing connection may spend flushing its last lines.
_CLOSE_FLUSH_SECONDS = 1.0
# After our last line, how long to read (and drop) what the peer still sends
# until it closes too. Closing a socket with unread input makes the kernel
# reset the connection, and a reset can destroy lines the peer has not read
# yet: our ERROR, or a writer's last RDATA.
_CLOSE_DRAIN_SECONDS = 1.0


class DisconnectReason:
    """The reasons a connection ends, as they appear in metrics."""

    PEER_CLOSED = "peer_closed"
    TIMEOUT = "timeout"
    SLOW_CONSUMER = "slow_consumer"
    PROTOCOL_ERROR = "protocol_error"
    PEER_ERROR = "peer_error"
    SOCKET_ERROR = "socket_error"
    SERVER_STOPPING = "server_stopping"
    LOCAL_CLOSE = "local_close"
    WRONG_SERVER = "wrong_server"


class ConnectionSettings:
    """Tunables shared by every connection of one hub or client."""

    __slots__ = ("ping_interval", "ping_timeout", "max_queued_commands", "max_line_length")

    def __init__(
        self,
        ping_interval: float = 5.0,
        ping_timeout: float = 15.0,
        max_queued_commands: int = DEFAULT_MAX_QUEUED_COMMANDS,
        max_line_length: int = C.DEFAULT_MAX_LINE_LENGTH,
    ) -> None:
        if ping_interval <= 0 or ping_timeout <= 0:
            raise ValueError("ping_interval and ping_timeout must be positive")
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_queued_commands = max_queued_commands
        self.max_line_length = max_line_length

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


class ReplicationConnection:
    """Base class of both ends of a replication connection."""

    #: "server" or "client": which side of the protocol this end plays.
    side: ClassVar[str] = "server"

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        settings: ConnectionSettings,
        metrics: ReplicationMetrics | None = None,
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.name = peer
        self.settings = settings
        self.metrics = metrics
        self.queue = OutboundQueue(settings.max_queued_commands)
        self.decoder = C.new_decoder(settings.max_line_length)
        self.closed = False
        self.close_reason: str | None = None
        self.ping_seen = False
        now = time.monotonic()
        self.last_received = now
        self.last_sent = now
        self.connected_at = now
        self._in_flight = False
        self._closer: Greenlet | None = None
        self._drained = gevent.event.Event()
        if resources.ENABLED:
            resources.acquired("replication connection")
        self._greenlets: list[Greenlet] = []
        self._writer: Greenlet | None = None
        self._keepalive = Keepalive(self)
        self._dispatch: dict[str, Callable[[Any], None]] = {}
        for name in C.COMMAND_NAMES:
            handler = getattr(self, f"on_{name}", None)
            if handler is not None:
                self._dispatch[name] = handler
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start reading, writing and keepalive; then call :meth:`connection_made`."""
        self._writer = gevent.spawn(self._write_loop)
        self._greenlets = [self._writer, gevent.spawn(self._keepalive.run)]
        self.connection_made()

    def run(self) -> None:
        """Start, then read in the current greenlet until the connection ends."""
        self.start()
        self._read_loop()
        # Stay until the last lines are flushed: the caller may close the socket
        # as soon as this returns.
        if self._closer is not None:
            self._closer.join(_CLOSE_FLUSH_SECONDS + _CLOSE_DRAIN_SECONDS + 1)

    def connection_made(self) -> None:
        """Called once the connection's greenlets run; subclasses send greetings here."""

    def connection_lost(self, reason: str) -> None:
        """Called once when the connection ends."""

    def close(self, reason: str, error: str | None = None) -> None:
        """End the connection, sending ``ERROR <error>`` first when given.

        Queued lines are still flushed (for at most a second) unless the peer is a
        slow consumer, whose backlog is dropped.
        """
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        if reason == DisconnectReason.SLOW_CONSUMER:
            self.queue.clear()
        if error is not None:
            self._force_put(C.encode_one(C.error(error)), "ERROR")
        self.queue.close()
        if self.metrics is not None:
            self.metrics.disconnected(reason)
        logger.info("replication connection %s closed: %s%s", self.name, reason,
                    f" ({error})" if error else "")
        self._closer = gevent.spawn(self._finish_close)
        try:
            self.connection_lost(reason)
        except Exception:
            logger.exception("connection_lost handler failed for %s", self.name)

    def _force_put(self, data: bytes, name: str) -> None:
        # ERROR lines go out even when the bound was reached.
        self.queue.max_commands += 1
        self.queue.put(data, 1)
        if self.metrics is not None:
            self.metrics.sent(name, 1)

    def _finish_close(self) -> None:
        writer = self._writer
        if writer is not None and not writer.dead:
            writer.join(_CLOSE_FLUSH_SECONDS)
            if not writer.dead:
                writer.kill(block=False)
        # Half-close, then let the read loop drain until the peer closes its side.
        try:
            self.sock.shutdown(socket.SHUT_WR)
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

    # --- reading -------------------------------------------------------------------

    def _read_loop(self) -> None:
        try:
            self._read_until_eof()
        finally:
            self._drained.set()

    def _read_until_eof(self) -> None:
        """Read and act on commands until the peer closes; once this end has
        closed, keep reading (and dropping) until then, see _CLOSE_DRAIN_SECONDS."""
        sock = self.sock
        feed = self.decoder.feed
        dispatch = self._dispatch
        metrics = self.metrics
        while True:
            try:
                data = sock.recv(262144)
            except OSError as exc:
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
            self.last_received = time.monotonic()
            try:
                commands = feed(data)
            except ProtocolError as exc:
                # The good lines of this read are still acted on, then the peer is
                # told what was wrong and cut off.
                if metrics is not None:
                    metrics.received_commands(exc.commands)
                self._handle_safely(exc.commands, dispatch)
                self.close(DisconnectReason.PROTOCOL_ERROR, str(exc))
                continue
            if metrics is not None:
                metrics.received_commands(commands)
            self._handle_safely(commands, dispatch)

    def _handle_safely(self, commands: Iterable[Any], dispatch: dict[str, Callable[[Any], None]]) -> None:
        try:
            self.handle_commands(commands, dispatch)
        except ProtocolError as exc:
            self.close(DisconnectReason.PROTOCOL_ERROR, str(exc))
        except Exception:
            # A bug in a handler: drop this connection (and reconnect, for a client)
            # rather than leave it half-processed.
            logger.exception("handling commands from %s failed", self.name)
            self.close(DisconnectReason.LOCAL_CLOSE, "internal error")

    def handle_commands(self, commands: Iterable[Any], dispatch: dict[str, Callable[[Any], None]]) -> None:
        """Dispatch decoded commands in order; subclasses may batch runs of them."""
        for command in commands:
            if self.closed:
                return
            handler = dispatch.get(command.NAME)
            if handler is None:
                self.refuse(command)
                return
            handler(command)

    def refuse(self, command: Any) -> None:
        """Refuse a command this end does not accept from its peer."""
        self.close(
            DisconnectReason.PROTOCOL_ERROR,
            f"{command.NAME} is not accepted from a {'client' if self.side == 'server' else 'server'}",
        )

    # --- writing -------------------------------------------------------------------

    def send(self, command: Any) -> bool:
        """Queue one command; False (and the peer is cut off) if the queue is full."""
        return self.send_encoded(C.encode_one(command), 1, command.NAME)

    def send_encoded(self, data: bytes, count: int, name: str) -> bool:
        """Queue *count* already-encoded commands named *name*.

        A peer whose queue would overflow gets ``ERROR`` and is disconnected, so
        it can never hold the sender up or grow its memory past the bound.
        """
        if self.closed:
            return False
        if not self.queue.put(data, count):
            self.close(
                DisconnectReason.SLOW_CONSUMER,
                f"too far behind: more than {self.queue.max_commands} commands queued",
            )
            return False
        if self.metrics is not None:
            self.metrics.sent(name, count)
        return True

    def _write_loop(self) -> None:
        queue = self.queue
        sendall = self.sock.sendall
        while True:
            data, _count = queue.take()
            if not data:
                if queue.closed:
                    return
                continue
            self._in_flight = True
            try:
                sendall(data)
            except OSError as exc:
                logger.debug("write to %s failed: %s", self.name, exc)
                self.close(DisconnectReason.SOCKET_ERROR)
                return
            finally:
                self._in_flight = False
            self.last_sent = time.monotonic()

    def idle(self) -> bool:
        """True when everything queued has been handed to the socket."""
        return len(self.queue) == 0 and not self._in_flight

    # --- commands every end handles --------------------------------------------------

    def on_PING(self, command: Any) -> None:
        # Timeouts start only once the peer has shown it pings.
        self.ping_seen = True

    def on_ERROR(self, command: Any) -> None:
        logger.warning("replication peer %s sent ERROR %s", self.name, C.error_message(command))
        self.close(DisconnectReason.PEER_ERROR)
