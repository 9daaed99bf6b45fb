"""The replication hub: a gevent TCP server that publishes and relays streams.

Every worker and writer process connects to the hub. The hub

* greets each connection with ``SERVER <name>`` and ``PING``;
* answers ``REPLICATE`` with a ``POSITION`` for every stream and writer it knows,
  and the legacy ``REPLICATE <stream|ALL> <token|NOW>`` by streaming the rows after
  the token from its :class:`~streamrep.replication.source.StreamSource` before
  going live, with neither gap nor duplicate at the switch;
* publishes its own writers' advances (:meth:`ReplicationHub.writer_advanced`):
  one ``RDATA`` per row, ``batch`` tokens where rows share a stream ID, or a
  ``POSITION`` when the position moved without rows;
* relays ``RDATA``/``POSITION`` from writer processes, filling any gap a writer's
  ``POSITION`` reveals from the database so workers only ever see a gap-free
  stream, and relays the presence, federation, lock and task commands to every
  other connection;
* keeps each instance's syncing users, cleared by ``CLEAR_USER_SYNC`` or when
  the connection that reported them goes away.

Positions published by the hub always refer to rows already readable from the
source (writers commit before they announce), so catch-up from the database
and the live stream agree.
"""

from __future__ import annotations

import logging
import socket

from gevent import socket as gsocket
from typing import Any, Callable, Iterable

import gevent
import gevent.event
from gevent.server import StreamServer

from streamrep.errors import MalformedCommandError, StreamrepError
from streamrep.replication import commands as C
from streamrep.replication.connection import ConnectionSettings, DisconnectReason, ReplicationConnection
from streamrep.replication.metrics import ReplicationMetrics, serve_metrics
from streamrep.replication.source import StreamSource

__all__ = ["ReplicationHub", "HubConnection", "DEFAULT_PORT", "CATCH_UP_BATCH"]

logger = logging.getLogger(__name__)

#: The hub's default TCP port (on 127.0.0.1 unless told otherwise).
DEFAULT_PORT = 9092

#: Rows read from the source per round trip during catch-up.
CATCH_UP_BATCH = 2000

_ALL = "ALL"


class HubConnection(ReplicationConnection):
    """The hub's end of one connection."""

    side = "server"

    def __init__(self, hub: ReplicationHub, sock: socket.socket, peer: str) -> None:
        super().__init__(sock, peer, hub.settings, hub.metrics)
        self.hub = hub
        #: subscribed to every stream (modern REPLICATE or ``REPLICATE ALL``)
        self.live_all = False
        #: streams subscribed one by one (legacy REPLICATE)
        self.live_streams: set[str] = set()
        #: streams whose catch-up is still being streamed; no live rows meanwhile
        self.catching_up: set[str] = set()
        #: instance IDs this connection reported syncing users for
        self.sync_instances: set[str] = set()
        self._batches: dict[tuple[str, str], list[Any]] = {}
        self._relay: dict[str, list[Any]] = {}
        self._catch_up_queue: list[tuple[str, int]] = []
        self._catch_up_worker: gevent.Greenlet | None = None

    def wants(self, stream: str) -> bool:
        """Whether live rows of *stream* go to this connection now."""
        return (self.live_all or stream in self.live_streams) and stream not in self.catching_up

    def connection_made(self) -> None:
        self.send(C.server(self.hub.server_name))
        self.send(C.ping())

    def connection_lost(self, reason: str) -> None:
        self.hub._connection_lost(self)
        if self._catch_up_worker is not None and self._catch_up_worker is not gevent.getcurrent():
            self._catch_up_worker.kill(block=False)

    # --- batching relayed rows -----------------------------------------------------------

    def handle_commands(self, commands: Iterable[Any], dispatch: dict[str, Callable[[Any], None]]) -> None:
        # RDATA from a writer comes grouped per fact by the core, is gathered per
        # stream and broadcast once per read as the writer's exact lines; anything
        # else first flushes what was gathered, keeping the order.
        if "RDATA" not in dispatch:
            super().handle_commands(commands, dispatch)
            return
        on_run = self._on_rdata_run
        run_type = tuple
        for item in C.group_rdata(commands if type(commands) is list else list(commands)):
            if self.closed:
                break
            if type(item) is run_type:
                on_run(*item)
                continue
            self._flush_relay()
            handler = dispatch.get(item.NAME)
            if handler is None:
                self.refuse(item)
                break
            handler(item)
        self._flush_relay()

    def _flush_relay(self) -> None:
        if not self._relay:
            return
        relay = self._relay
        self._relay = {}
        for stream, rdata in relay.items():
            self.hub.broadcast(stream, C.encode_many(rdata), len(rdata), "RDATA", exclude=self)

    def _on_rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any]) -> None:
        """RDATA commands of one writer, all ``batch`` but the last (token None:
        the fact goes on later). Relayed once the fact is complete."""
        try:
            C.validate_rows(commands)
        except MalformedCommandError:
            raise MalformedCommandError(f"RDATA {stream} {instance}: row is not valid JSON") from None
        key = (stream, instance)
        if token is None:
            waiting = self._batches.get(key)
            if waiting is None:
                self._batches[key] = commands
            else:
                waiting.extend(commands)
            return
        waiting = self._batches.pop(key, None)
        hub = self.hub
        pos = hub.positions.get(key)
        if pos is not None and token <= pos:
            return  # already published (the hub filled it from the database)
        hub.positions[key] = token
        hub._known_streams.setdefault(stream, None)
        buf = self._relay.get(stream)
        if buf is None:
            buf = self._relay[stream] = []
        if waiting:
            buf.extend(waiting)
        buf.extend(commands)

    # --- commands ----------------------------------------------------------------------

    def on_NAME(self, command: Any) -> None:
        self.name = f"{command.data}@{self.peer}"

    def on_REPLICATE(self, command: Any) -> None:
        stream = getattr(command, "stream_name", None)
        token = getattr(command, "token", None)
        if stream is None:
            # Current protocol: every position, then everything live.
            self.hub.send_positions(self)
            self.live_all = True
            return
        hub = self.hub
        streams = list(hub.stream_names()) if stream == _ALL else [stream]
        if stream != _ALL and stream not in hub.stream_names():
            self.close(DisconnectReason.PROTOCOL_ERROR, f"unknown stream {stream}")
            return
        if token is None:
            for name in streams:
                hub.send_positions(self, name)
            if stream == _ALL:
                self.live_all = True
            else:
                self.live_streams.add(stream)
            return
        from_token = int(token)
        if stream != _ALL and not hub.readable(stream):
            self.close(DisconnectReason.PROTOCOL_ERROR,
                       f"cannot replicate {stream} from a token: this hub has no stored rows of it")
            return
        # Streams only relayed through the hub (no stored rows) go live from now.
        for name in [n for n in streams if not hub.readable(n)]:
            hub.send_positions(self, name)
            streams.remove(name)
        for name in streams:
            self.catching_up.add(name)
            self._catch_up_queue.append((name, from_token))
        if stream == _ALL:
            self.live_all = True
        else:
            self.live_streams.add(stream)
        if self._catch_up_worker is None or self._catch_up_worker.dead:
            self._catch_up_worker = gevent.spawn(self._catch_up_all)

    def _catch_up_all(self) -> None:
        while self._catch_up_queue and not self.closed:
            stream, from_token = self._catch_up_queue.pop(0)
            try:
                self.hub.catch_up(self, stream, from_token)
            except StreamrepError as exc:
                self.close(DisconnectReason.PROTOCOL_ERROR, f"cannot replicate {stream}: {exc}")
                return

    def on_RDATA(self, command: Any) -> None:
        self._on_rdata_run(command.stream_name, command.instance_name, command.token, [command])

    def on_POSITION(self, command: Any) -> None:
        self._batches.pop((command.stream_name, command.instance_name), None)
        self.hub.writer_position(
            command.stream_name, command.instance_name, command.prev_token, command.new_token, exclude=self
        )

    def on_USER_SYNC(self, command: Any) -> None:
        self.sync_instances.add(command.instance_id)
        self.hub.user_sync(command.instance_id, command.user_id, bool(command.is_syncing))
        self.hub.relay(command, exclude=self)

    def on_CLEAR_USER_SYNC(self, command: Any) -> None:
        self.hub.clear_user_sync(command.instance_id)
        self.sync_instances.discard(command.instance_id)
        self.hub.relay(command, exclude=self)

    def on_FEDERATION_ACK(self, command: Any) -> None:
        self.hub.relay(command, exclude=self)

    def on_USER_IP(self, command: Any) -> None:
        self.hub.relay(command, exclude=self)

    def on_REMOTE_SERVER_UP(self, command: Any) -> None:
        self.hub.relay(command, exclude=self)

    def on_LOCK_RELEASED(self, command: Any) -> None:
        self.hub.relay(command, exclude=self)

    def on_NEW_ACTIVE_TASK(self, command: Any) -> None:
        self.hub.relay(command, exclude=self)

    def on_CANCEL_TASK(self, command: Any) -> None:
        self.hub.relay(command, exclude=self)


class ReplicationHub:
    """The replication server (see the module docstring).

    *source* is where the hub reads rows for catch-up and for its own writers'
    advances; without one the hub only relays. *instance_name* is this process's
    name as a writer.
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
    ) -> None:
        self.server_name = server_name
        self.source = source
        self.instance_name = instance_name
        self.settings = settings or ConnectionSettings()
        self.positions: dict[tuple[str, str], int] = {}
        self.syncing_users: dict[str, set[str]] = {}
        self.connections: list[HubConnection] = []
        self._known_streams: dict[str, None] = {}
        self.metrics = ReplicationMetrics(
            positions=lambda: dict(self.positions),
            queue_depths=lambda: {f"{c.name}#{id(c):x}": len(c.queue) for c in self.connections},
        )
        self._host, self._port = host, port
        self._server: StreamServer | None = None
        self._metrics_listen = metrics_listen
        self._metrics_server: Any = None
        self.stopped = gevent.event.Event()
        self.load_positions()

    # --- lifecycle -------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the hub listens on (the real port once started)."""
        if self._server is not None:
            host, port = self._server.address[:2]
            return str(host), int(port)
        return self._host, self._port

    def load_positions(self) -> None:
        """Read every writer's persisted position from the source."""
        if self.source is None:
            return
        for stream in self.source.stream_names():
            self._known_streams.setdefault(stream, None)
            for instance in self.source.writers(stream):
                token = self.source.current_token(stream, instance)
                key = (stream, instance)
                self.positions[key] = max(token, self.positions.get(key, token))

    def start(self) -> None:
        """Listen and serve in the background (greenlets)."""
        listener = gsocket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, self._port))
        listener.listen(128)
        self._server = StreamServer(listener, self._handle)
        self._server.start()
        if self._metrics_listen is not None:
            self._metrics_server = serve_metrics(self.metrics, *self._metrics_listen)
        logger.info("replication hub %s listening on %s:%s", self.server_name, *self.address)

    def serve_forever(self) -> None:
        """Start (if needed) and block until :meth:`stop`."""
        if self._server is None:
            self.start()
        self.stopped.wait()

    def stop(self, message: str = "server stopping", flush_timeout: float = 2.0) -> None:
        """Send ``ERROR <message>`` to every peer, close them all, stop listening."""
        if self.stopped.is_set():
            return
        if self._server is not None:
            self._server.close()
        closing = list(self.connections)
        for conn in closing:
            conn.close(DisconnectReason.SERVER_STOPPING, message)
        with gevent.Timeout(flush_timeout, False):
            for conn in closing:
                if conn._writer is not None:
                    conn._writer.join()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self.stopped.set()

    def _handle(self, sock: socket.socket, address: Any) -> None:
        conn = HubConnection(self, sock, f"{address[0]}:{address[1]}")
        self.connections.append(conn)
        self.metrics.connected()
        conn.run()

    def _connection_lost(self, conn: HubConnection) -> None:
        if conn in self.connections:
            self.connections.remove(conn)
        for instance_id in conn.sync_instances:
            self.clear_user_sync(instance_id)
            if not self.stopped.is_set():
                self.relay(_clear_user_sync(instance_id), exclude=conn)

    # --- streams -----------------------------------------------------------------------

    def stream_names(self) -> list[str]:
        return list(self._known_streams)

    def writers(self, stream: str) -> list[str]:
        return [inst for (s, inst) in self.positions if s == stream]

    def send_positions(self, conn: HubConnection, stream: str | None = None) -> None:
        """``POSITION`` for every (stream, writer) the hub knows (or of one stream)."""
        lines = [
            C.encode_one(C.position(s, inst, token, token))
            for (s, inst), token in self.positions.items()
            if stream is None or s == stream
        ]
        if lines:
            conn.send_encoded(b"".join(lines), len(lines), "POSITION")

    def broadcast(self, stream: str, data: bytes, count: int, name: str, exclude: HubConnection | None = None) -> None:
        """Queue encoded stream commands to every connection following *stream*."""
        for conn in tuple(self.connections):
            if conn is not exclude and conn.wants(stream):
                conn.send_encoded(data, count, name)

    def relay(self, command: Any, exclude: HubConnection | None = None) -> None:
        """Send a non-stream command to every connection but *exclude*."""
        data = C.encode_one(command)
        for conn in tuple(self.connections):
            if conn is not exclude:
                conn.send_encoded(data, 1, command.NAME)

    def publish_rows(self, stream: str, instance: str, rows: list[tuple[int, bytes]], new_token: int | None = None) -> None:
        """Publish rows ``(token, row_json)`` of a writer (token order, all past its
        position) and move its position to *new_token* (default: the last row's)."""
        key = (stream, instance)
        self._known_streams.setdefault(stream, None)
        old = self.positions.get(key, 0)
        rows = [r for r in rows if r[0] > old]
        if rows:
            self.positions[key] = rows[-1][0]
            self.broadcast(stream, C.rdata_lines(stream, instance, rows), len(rows), "RDATA")
        last = self.positions.get(key, old)
        if new_token is not None and new_token > last:
            self.positions[key] = new_token
            self.broadcast(stream, C.encode_one(C.position(stream, instance, last, new_token)), 1, "POSITION")

    def readable(self, stream: str) -> bool:
        """Whether the hub can read *stream*'s rows (for catch-up and gap filling)."""
        return self.source is not None and stream in self.source.stream_names()

    def writer_advanced(self, stream: str, instance: str, new_token: int) -> None:
        """A writer of this process (or one sharing its database) reached
        *new_token*: publish its rows since the last published position."""
        key = (stream, instance)
        old = self.positions.get(key, 0)
        if new_token <= old:
            return
        if not self.readable(stream):
            self.publish_rows(stream, instance, [], new_token)
            return
        self._publish_from_source(stream, instance, old, new_token)

    def _publish_from_source(self, stream: str, instance: str, from_token: int, upto_token: int) -> None:
        assert self.source is not None
        while from_token < upto_token:
            rows, limited = self.source.updates(stream, instance, from_token, upto_token, CATCH_UP_BATCH)
            if not rows:
                break
            self.publish_rows(stream, instance, rows)
            from_token = rows[-1][0]
            if not limited:
                break
        self.publish_rows(stream, instance, [], upto_token)

    def writer_position(self, stream: str, instance: str, prev_token: int, new_token: int,
                        exclude: HubConnection | None = None) -> None:
        """A writer process's ``POSITION``: fill any gap from the source, then
        pass the position on."""
        key = (stream, instance)
        self._known_streams.setdefault(stream, None)
        readable = self.readable(stream)
        old = self.positions.get(key)
        if old is None:
            old = 0 if readable else prev_token
        if prev_token > old and readable:
            self._publish_from_source(stream, instance, old, prev_token)
            old = self.positions.get(key, old)
        elif prev_token > old:
            # No database: pass the gap on for readers to fill themselves.
            self.positions[key] = new_token
            self.broadcast(stream, C.encode_one(C.position(stream, instance, prev_token, new_token)), 1,
                           "POSITION", exclude=exclude)
            return
        if new_token > old:
            self.positions[key] = new_token
            self.broadcast(stream, C.encode_one(C.position(stream, instance, old, new_token)), 1,
                           "POSITION", exclude=exclude)

    def catch_up(self, conn: HubConnection, stream: str, from_token: int) -> None:
        """Stream *stream*'s rows after *from_token* to *conn*, then make it live.

        Runs in the connection's catch-up greenlet. Live rows of the stream are
        held back from *conn* meanwhile; the switch happens without yielding once
        every writer's published position has been streamed, so nothing is missed
        or sent twice.
        """
        assert self.source is not None
        sent: dict[str, int] = {}
        last_row: dict[str, int] = {}
        while not conn.closed:
            behind = [
                (inst, token)
                for (s, inst), token in self.positions.items()
                if s == stream and token > sent.get(inst, from_token)
            ]
            if not behind:
                lines = [
                    C.encode_one(C.position(stream, inst, max(from_token, last_row.get(inst, from_token)), token))
                    for (s, inst), token in self.positions.items()
                    if s == stream
                ]
                if conn.queue.room() >= len(lines):
                    # Switch to live: nothing yielded since the check above.
                    conn.catching_up.discard(stream)
                    if lines:
                        conn.send_encoded(b"".join(lines), len(lines), "POSITION")
                    return
                conn.queue.wait_for_room(len(lines))
                continue  # the wait yielded: look again for newer rows
            for instance, upto in behind:
                start = sent.get(instance, from_token)
                while start < upto and not conn.closed:
                    # Limited answers end at a whole stream ID (the source's contract).
                    rows, limited = self.source.updates(stream, instance, start, upto, CATCH_UP_BATCH)
                    if rows:
                        # In pieces that fit the queue, even when one fact is larger
                        # than the whole bound.
                        lines = C.rdata_line_list(stream, instance, rows)
                        piece = max(1, conn.queue.max_commands // 2)
                        for i in range(0, len(lines), piece):
                            chunk = lines[i : i + piece]
                            conn.queue.wait_for_room(len(chunk))
                            if not conn.send_encoded(b"".join(chunk), len(chunk), "RDATA"):
                                return
                        start = last_row[instance] = rows[-1][0]
                    if not limited or not rows:
                        break
                sent[instance] = upto

    # --- presence ----------------------------------------------------------------------

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
        """Users syncing on any instance."""
        out: set[str] = set()
        for users in self.syncing_users.values():
            out |= users
        return out


def _clear_user_sync(instance_id: str) -> Any:
    return C.clear_user_sync(instance_id)
