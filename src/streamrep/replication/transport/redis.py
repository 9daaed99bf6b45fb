"""Replication over Redis pub/sub, in the reference deployments' format.

There is no hub: every process connects to one Redis server and

* subscribes to the channel named after the server (and ``<server>/USER_IP`` when
  asked to), see :mod:`.redis_format`;
* once the subscription is confirmed publishes ``REPLICATE``, then a ``POSITION``
  for every stream it writes (its peers cannot see that it reconnected), and
  answers every ``REPLICATE`` it hears with those positions;
* publishes each fact it commits as ``RDATA`` lines, one message per line;
* hands the facts of other writers to its handler exactly once, in order per
  writer: a writer's rows count only once a ``POSITION`` of that writer arrived on
  the current subscription, and any gap that ``POSITION`` reveals is filled from the
  database (:class:`~streamrep.replication.follower.StreamFollower`), so nothing
  lost while the subscription was down is ever missed;
* ignores its own messages when Redis echoes them back;
* pings Redis on both connections; after any loss (Redis gone, or Redis cutting
  off a subscriber that fell behind its output-buffer limit) it reconnects with
  exponential backoff and jitter and announces itself again.

What to send and what a received command means is decided by the sans-IO
:class:`~streamrep.replication.protocol.BusSession`; this module only moves its
commands through Redis and carries out its actions (facts and gap filling through
:class:`~streamrep.replication.follower.StreamFollower`).

Two connections per process, as Redis requires: a subscribed connection accepts
no other commands than (un)subscribing and pinging. Both are read and written in
bulk with hiredis (:mod:`.redis_connection`), on sockets that gevent made
cooperative: a process using this transport calls ``gevent.monkey.patch_all()``
before anything else, as the command-line tools do.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import gevent
import gevent.event
from gevent import Greenlet

from streamrep.errors import ProtocolError, StreamrepError
from streamrep.replication import commands as C
from streamrep.replication.backoff import Backoff
from streamrep.replication.follower import Handler, StreamFollower
from streamrep.replication.protocol import (
    Action, BusSession, Close, ConnectionSettings, FillGap, GapUnfilled, Received, Send,
)
from streamrep.replication.source import StreamSource
from streamrep.replication.transport.redis_format import EchoFilter, channel_for, channels
from streamrep.replication.transport.redis_connection import (
    Publisher, Subscription, SubscriptionLost, encode_publish,
)

__all__ = [
    "RedisReplication", "RedisUnavailableError", "advance_publisher", "describe_url",
    "DEFAULT_MAX_QUEUED_COMMANDS",
]

logger = logging.getLogger(__name__)

#: Commands waiting to be published before the process gives up on the connection.
DEFAULT_MAX_QUEUED_COMMANDS = 100_000
#: How often the reader looks at the clock when Redis is quiet.
_POLL_SECONDS = 0.2
#: Commands whose echo is recognised by the writer's name rather than by EchoFilter.
_NAMED_BY_WRITER = (b"RDATA ", b"POSITION ")


class RedisUnavailableError(StreamrepError):
    """The Redis transport cannot run in this process (see the message)."""


class _Lost(Exception):
    """The current Redis connections are no good: reconnect."""


def describe_url(url: str) -> str:
    """*url* without its password, for messages."""
    from streamrep.config import redis_url_for_display

    return redis_url_for_display(url)


class RedisReplication:
    """One process's replication link through Redis.

    The same surface as :class:`~streamrep.replication.transport.tcp_client.ReplicationClient`,
    so a process picks its transport in one place:

    * *url*: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS),
      or ``unix:///path/to/redis.sock[?password=...]``;
    * *server_name*: the deployment's name, which is also the channel;
    * *instance_name*: the name this process writes streams as (its own ``RDATA`` and
      ``POSITION`` come back from Redis and are ignored);
    * *handler*, *source*, *streams*, *start_from*: as for the TCP client; without a
      *source* a gap cannot be filled and *on_unfilled_gap* ``(stream, instance,
      from_token, to_token)`` is called instead (the reader then goes on from
      the writer's position);
    * *writer_positions*: ``() -> [(stream, instance, token)]``, this process's
      persisted positions, announced on every subscription and on every ``REPLICATE``;
    * *on_command*: called with the other commands (``USER_SYNC``, ``USER_IP``, ...);
    * *user_ip*: also subscribe to ``<server_name>/USER_IP``.
    """

    def __init__(
        self,
        url: str,
        *,
        server_name: str,
        instance_name: str,
        handler: Handler | None = None,
        source: StreamSource | None = None,
        streams: Iterable[str] | None = None,
        start_from: Mapping[Any, int] | None = None,
        writer_positions: Callable[[], Sequence[tuple[str, str, int]]] | None = None,
        on_command: Callable[[Any], None] | None = None,
        on_unfilled_gap: Callable[[str, str, int, int], None] | None = None,
        user_ip: bool = False,
        ping_interval: float = 5.0,
        ping_timeout: float = 15.0,
        max_queued_commands: int = DEFAULT_MAX_QUEUED_COMMANDS,
        max_line_length: int = C.DEFAULT_MAX_LINE_LENGTH,
        backoff: Backoff | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        if ping_interval <= 0 or ping_timeout <= ping_interval:
            raise ValueError("need 0 < ping_interval < ping_timeout")
        self.url = url
        self.server_name = server_name
        self.instance_name = instance_name
        self.client_name = instance_name
        self.source = source
        self.follower = StreamFollower(handler, source, streams, start_from) if handler is not None else None
        self.settings = ConnectionSettings(ping_interval=ping_interval, ping_timeout=ping_timeout,
                                           max_queued_commands=max_queued_commands,
                                           max_line_length=max_line_length)
        self.session = BusSession(self.settings, instances=[instance_name],
                                  follower=self.follower.state if self.follower is not None else None)
        self.writer_positions = writer_positions
        self.on_command = on_command
        self.on_unfilled_gap = on_unfilled_gap
        self.channels = channels(server_name, user_ip)
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_queued_commands = max_queued_commands
        self.max_line_length = max_line_length
        self.backoff = backoff or Backoff()
        self.connect_timeout = connect_timeout
        #: subscriptions confirmed so far (1 after the first connection)
        self.connections_made = 0
        self._echoes = EchoFilter()
        self._fillable: frozenset[str] = frozenset(source.stream_names()) if source is not None else frozenset()
        #: PUBLISH commands encoded for Redis, and how many they are
        self._outbox: list[bytes] = []
        self._queued = 0
        self._outbox_ready = gevent.event.Event()
        self._publishing = False
        self._publisher: Publisher | None = None
        self._subscribed = False
        self._lost: str | None = None
        self._stopping = False
        self._greenlet: Greenlet | None = None
        self._up = gevent.event.Event()

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> Greenlet:
        """Connect (and keep reconnecting) in a background greenlet."""
        from gevent import monkey

        if not monkey.is_module_patched("socket"):
            raise RedisUnavailableError(
                "the Redis transport needs cooperative sockets: call gevent.monkey.patch_all() "
                "at the very start of the program")
        if self._greenlet is None or self._greenlet.dead:
            self._stopping = False
            self._greenlet = gevent.spawn(self._run)
        return self._greenlet

    def stop(self, timeout: float = 2.0) -> None:
        """Publish what is queued (for at most *timeout*), then disconnect."""
        if self._subscribed and self._outbox:
            self.flush(timeout)
        self._stopping = True
        self._lost = "stopping"
        self._outbox_ready.set()
        if self._greenlet is not None:
            self._greenlet.join(timeout)
            self._greenlet.kill(block=True, timeout=timeout)

    @property
    def connected(self) -> bool:
        return self._subscribed

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block until subscribed (True) or *timeout* passes (False)."""
        return bool(self._up.wait(timeout))

    def _run(self) -> None:
        where = describe_url(self.url)
        while not self._stopping:
            try:
                self._connection(where)
            except (_Lost, SubscriptionLost) as exc:
                reason = str(exc)
            except (OSError, ProtocolError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                import redis

                if not isinstance(exc, redis.RedisError):
                    # The handler or the database failed on a fact: start over, and
                    # the fact comes again (from the database) after resubscribing.
                    logger.exception("handling replication from Redis failed")
                reason = f"{type(exc).__name__}: {exc}"
            else:
                reason = "closed"
            if self._stopping:
                break
            delay = self.backoff.next_delay()
            logger.warning("Redis %s: %s; reconnecting in %.2fs", where, reason, delay)
            gevent.sleep(delay)

    def _connection(self, where: str) -> None:
        subscription = Subscription(self.url, self.channels, self.connect_timeout)
        publisher = Publisher(self.url, self.ping_timeout)
        writer: Greenlet | None = None
        self._lost = None
        try:
            subscription.open()
            publisher.open()
            self._subscribed_now()
            logger.info("Redis %s: subscribed to %s", where, ", ".join(self.channels))
            writer = gevent.spawn(self._publish_loop, publisher)
            self._read_loop(subscription)
        finally:
            self._subscribed = False
            self._up.clear()
            if writer is not None:
                self._outbox_ready.set()
                writer.join(1.0)
                writer.kill(block=False)
            subscription.close()
            publisher.close()

    def _subscribed_now(self) -> None:
        """The subscription is confirmed: start afresh and announce ourselves."""
        self._echoes.clear()
        self._outbox = []  # announced again below as positions
        self._queued = 0
        self._subscribed = True
        self.connections_made += 1
        self.backoff.reset()
        positions = self.writer_positions() if self.writer_positions is not None else ()
        self._carry_out(self.session.announce(positions))
        self._up.set()

    # --- reading ---------------------------------------------------------------------

    def _read_loop(self, subscription: Subscription) -> None:
        read = subscription.read_messages
        decoder = C.new_decoder(self.max_line_length)
        # A process that only writes hears everyone's rows, its own echoes above
        # all: none concern it, so they are dropped before anything is decoded.
        skip = b"RDATA " if self.follower is None else None
        last_ping = time.monotonic()
        # When the answer to our last ping is overdue (None: nothing outstanding).
        # Measured from the ping, not from the last message, so a process that was
        # itself suspended does not blame Redis.
        answer_due: float | None = None
        patience = self.ping_timeout - self.ping_interval
        while True:
            if self._lost is not None:
                raise _Lost(self._lost)
            lines, replies = read(_POLL_SECONDS, skip)
            if replies:
                answer_due = None
                if lines:
                    self._received(decoder, lines)
            now = time.monotonic()
            if answer_due is not None and now > answer_due:
                raise _Lost(f"no answer from Redis for {self.ping_timeout:g}s")
            if now - last_ping >= self.ping_interval:
                subscription.ping()  # answered on the subscription
                last_ping = now
                if answer_due is None:
                    answer_due = now + patience

    def _received(self, decoder: Any, lines: list[bytes]) -> None:
        echoes = self._echoes
        if len(echoes):
            lines = [line for line in lines if line.startswith(_NAMED_BY_WRITER) or not echoes.is_echo(line)]
            if not lines:
                return
        try:
            commands = decoder.feed(b"\n".join(lines) + b"\n")
        except ProtocolError as exc:
            # Another process's bad line hurts nobody else: say so and go on with
            # the good ones (the same lines the reference would act on).
            logger.warning("ignoring a replication message from Redis: %s", exc)
            commands = exc.commands
        self._carry_out(self.session.receive(commands, time.monotonic()))

    def _carry_out(self, actions: list[Action]) -> None:
        """Do what the session asked, in order."""
        follower = self.follower
        if follower is not None and actions:
            actions = follower.run([self._unfillable(a) if type(a) is FillGap else a for a in actions])
        for action in actions:
            kind = type(action)
            if kind is Send:
                assert isinstance(action, Send)
                self._publish(action.data)
            elif kind is GapUnfilled:
                assert isinstance(action, GapUnfilled) and follower is not None
                if self.on_unfilled_gap is not None:
                    self.on_unfilled_gap(action.stream, action.instance, action.from_token, action.upto_token)
                # Nothing to fill from: go on from the writer's position.
                follower.state.skip_gap(action)
            elif kind is Received:
                assert isinstance(action, Received)
                command = action.command
                if command.NAME == "ERROR":
                    logger.warning("a replication peer said ERROR %s", C.error_message(command))
                elif self.on_command is not None:
                    self.on_command(command)
            elif kind is Close:
                assert isinstance(action, Close)
                logger.warning("replication through Redis: %s (%s)", action.reason, action.error)

    def _unfillable(self, gap: FillGap) -> Action:
        """A gap of a stream the database does not hold (one only the reference
        writes) cannot be filled from it."""
        if gap.stream in self._fillable:
            return gap
        return GapUnfilled(gap.stream, gap.instance, gap.from_token, gap.upto_token)

    # --- writing ---------------------------------------------------------------------

    def _publish(self, data: bytes, named_by_writer: bool = False) -> bool:
        """Queue encoded command lines, one message each. *named_by_writer*: they
        are all ``RDATA``/``POSITION`` (no echo to remember, one channel)."""
        if not self._subscribed:
            return False
        messages = data.split(b"\n")
        messages.pop()  # after the last newline
        channel = self.server_name
        if named_by_writer:
            return self._queue(encode_publish(channel, messages), len(messages))
        chunks = []
        for message in messages:
            target = channel
            if not message.startswith(_NAMED_BY_WRITER):
                self._echoes.published(message)
                target = channel_for(message.partition(b" ")[0].decode(), channel)
            chunks.append(encode_publish(target, [message]))
        return self._queue(b"".join(chunks), len(messages))

    def send(self, command: Any) -> bool:
        """Publish any command now if subscribed; False otherwise."""
        return self._publish(C.encode_one(command))

    def announce(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> bool:
        """Publish rows ``(token, row_json)`` this process committed (token order).

        Returns False when not subscribed: the next subscription announces the
        persisted position instead, and readers fill the rest from the database.
        """
        if not self._subscribed or not rows:
            return False
        actions = self.session.rows(stream, instance, rows)
        return all(self._publish(a.data, True) for a in actions if type(a) is Send)

    def announce_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool:
        """Announce that a writer moved from *prev_token* to *new_token* with no rows."""
        if not self._subscribed:
            return False
        actions = self.session.position(stream, instance, prev_token, new_token)
        return all(self._publish(a.data, True) for a in actions if type(a) is Send)

    def _queue(self, data: bytes, count: int) -> bool:
        limit = self.max_queued_commands - count
        if self._queued > limit:
            # Redis is slower than this writer: the writer waits (its persisting
            # with it) for up to ping_timeout, then starts over; the new
            # subscription announces its positions and readers fill the rest
            # from the database.
            deadline = time.monotonic() + self.ping_timeout
            while (self._queued > limit and self._subscribed and self._lost is None
                   and time.monotonic() < deadline):
                gevent.sleep(0.001)
            if self._queued > limit:
                if self._lost is None:
                    self._lost = f"more than {self.max_queued_commands} commands waiting to be published"
                self._outbox = []
                self._queued = 0
                return False
        self._outbox.append(data)
        self._queued += count
        self._outbox_ready.set()
        return True

    def _publish_loop(self, publisher: Publisher) -> None:
        ready = self._outbox_ready
        answers = gevent.spawn(self._answer_loop, publisher)
        last_sent = time.monotonic()
        try:
            while self._lost is None:
                if not self._outbox:
                    ready.clear()
                    ready.wait(self.ping_interval)
                if self._lost is not None:
                    return
                batch = self._outbox
                if not batch:
                    if time.monotonic() - last_sent >= self.ping_interval:
                        publisher.ping()
                        last_sent = time.monotonic()
                    continue
                count = self._queued
                self._outbox = []
                self._queued = 0
                self._publishing = True
                publisher.send(b"".join(batch), count)
                self._publishing = False
                last_sent = time.monotonic()
        except Exception as exc:
            if self._lost is None:
                self._lost = f"publishing failed ({type(exc).__name__}: {exc})"
        finally:
            self._publishing = False
            answers.kill(block=False)

    def _answer_loop(self, publisher: Publisher) -> None:
        """Take Redis's answers on the publishing connection; give up on it when
        answers owed are ``ping_timeout`` late."""
        self._publisher = publisher
        waiting_since: float | None = None
        try:
            while self._lost is None:
                answered = publisher.take_answers(_POLL_SECONDS)
                now = time.monotonic()
                if answered or publisher.unanswered == 0:
                    waiting_since = None
                elif waiting_since is None:
                    waiting_since = now
                elif now - waiting_since > self.ping_timeout:
                    self._lost = f"no answer from Redis for {self.ping_timeout:g}s"
        except Exception as exc:
            if self._lost is None:
                self._lost = f"publishing failed ({type(exc).__name__}: {exc})"
        finally:
            self._publisher = None

    def flush(self, timeout: float) -> bool:
        """Wait until subscribed with nothing left to publish (True), or *timeout*."""
        with gevent.Timeout(timeout, False):
            while True:
                publisher = self._publisher
                if (self._subscribed and not self._outbox and not self._publishing
                        and publisher is not None and publisher.unanswered == 0):
                    return True
                gevent.sleep(0.005)
        return False


def advance_publisher(link: RedisReplication, source: StreamSource) -> Callable[[str, str, list[int], int], None]:
    """A ``Streams`` position listener publishing this process's committed facts
    on *link*, read back from *source* from the last position it published."""
    published: dict[tuple[str, str], int] = {}

    def listener(stream: str, instance: str, visible: list[int], position: int) -> None:
        key = (stream, instance)
        start = published.get(key)
        if start is None:
            start = published[key] = min(visible) - 1 if visible else position
        published[key] = max(start, position)
        if not link.connected:
            return  # the next subscription announces the position instead
        while start < position:
            rows, limited = source.updates(stream, instance, start, position, 5000)
            if not rows:
                break
            link.announce(stream, instance, rows)
            start = rows[-1][0]
            if not limited:
                break
        if start < position:
            link.announce_position(stream, instance, start, position)

    return listener
