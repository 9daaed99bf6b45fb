"""The replication link over Redis pub/sub, in the reference deployments' format.

There is no hub: every process connects to one Redis server and

* subscribes to the channel named after the server (and ``<server>/USER_IP`` when
  asked to), see :mod:`.redis_format`;
* once the subscription is confirmed publishes ``REPLICATE``, then a ``POSITION``
  for every stream it writes (its peers cannot see that it reconnected), and
  answers every ``REPLICATE`` it hears with those positions;
* publishes each fact it commits as ``RDATA`` lines, one message per line (or up to
  ``settings.redis_lines_per_message`` lines per message, which only streamrep reads,
  see :mod:`.redis_format`); Redis's answer to each ``PUBLISH`` is what
  :meth:`RedisLink.confirmed` and :meth:`RedisLink.flush` go by;
* hands the facts of other writers to its handler exactly once, in order per
  writer (:class:`~streamrep.replication.protocol.BusSession`): with a database,
  every ``RDATA`` and ``POSITION`` is only a notification, checked against what
  the database holds and delivered from it; without one, a writer's rows count
  only once a ``POSITION`` of that writer arrived on the current subscription,
  and a gap nothing can fill is logged, counted and reported;
* ignores its own messages when Redis echoes them back;
* pings Redis on both connections; after any loss (Redis gone, or Redis cutting
  off a subscriber that fell behind its output-buffer limit) it reconnects with
  exponential backoff and jitter and announces itself again. Redis refusing the
  credentials is kept as :attr:`RedisLink.refusal`, named as such.

What to send and what a received command means is decided by the sans-IO
:class:`~streamrep.replication.protocol.BusSession`; this module only moves its
commands through Redis and carries out its actions.

Two connections per process, as Redis requires: a subscribed connection accepts
no other commands than (un)subscribing and pinging. Both are read and written in
bulk with hiredis (:mod:`.redis_connection`), on sockets that gevent made
cooperative: a process using this transport calls ``gevent.monkey.patch_all()``
before anything else, as the command-line tools do.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Sequence

import gevent
import gevent.event
from gevent import Greenlet

from streamrep.config import redis_url_for_display
from streamrep.errors import ProtocolError, StreamrepError
from streamrep.replication import commands as C
from streamrep.replication.link import LinkBase, LinkRoles, LinkSettings, check_rows
from streamrep.replication.metrics import ReplicationMetrics
from streamrep.replication.protocol import Action, BusSession, Close, FillGap, GapUnfilled, Received, Send
from streamrep.replication.sources import StreamSource
from streamrep.replication.transport.redis_connection import (
    Publisher, RedisRefused, Subscription, SubscriptionLost, encode_publish,
)
from streamrep.replication.transport.redis_format import EchoFilter, channel_for, channels, pack_lines

__all__ = ["RedisLink", "RedisUnavailableError", "describe_url", "open_link"]

logger = logging.getLogger(__name__)

#: How often the reader looks at the clock when Redis is quiet.
_POLL_SECONDS = 0.2
#: Commands whose echo is recognised by the writer's name rather than by EchoFilter.
_NAMED_BY_WRITER = (b"RDATA ", b"POSITION ")

#: Positions ``(stream, instance) -> token`` carried by some published commands.
_Tokens = dict[tuple[str, str], int]


class RedisUnavailableError(StreamrepError):
    """The Redis transport cannot run in this process (see the message)."""


class _Lost(Exception):
    """The current Redis connections are no good: reconnect."""


def describe_url(url: str) -> str:
    """*url* without its password, for messages."""
    return redis_url_for_display(url)


def open_link(settings: LinkSettings, roles: LinkRoles) -> RedisLink:
    """The Redis transport's entry in :data:`streamrep.replication.link.TRANSPORTS`."""
    return RedisLink(settings, roles)


class RedisLink(LinkBase):
    """One process's replication link through Redis (see the module docstring and
    :class:`~streamrep.replication.link.LinkBase`).

    ``settings.redis_url``: ``redis://[[user]:password@]host[:port][/db]``,
    ``rediss://...`` (TLS), or ``unix:///path/to/redis.sock[?password=...]``;
    ``settings.server_name`` is also the channel; ``settings.name`` is the instance
    this process writes as (its own ``RDATA`` and ``POSITION`` come back from Redis
    and are ignored).
    """

    verifies_what_it_hears = True

    def __init__(self, settings: LinkSettings, roles: LinkRoles | None = None) -> None:
        if settings.redis_url is None or not settings.server_name:
            raise ValueError("a Redis link needs settings.redis_url and settings.server_name")
        connection = settings.connection
        if connection.ping_timeout <= connection.ping_interval:
            raise ValueError("need ping_interval < ping_timeout")
        super().__init__(settings, roles if roles is not None else LinkRoles())
        self.url: str = settings.redis_url
        self.server_name: str = settings.server_name
        self.instance_name = self.client_name = settings.name
        self.source = self.roles.source
        follower = self.follower
        self.session = BusSession(connection, instances=[settings.name],
                                  follower=follower.state if follower is not None else None,
                                  hand_on_positions=self.roles.hand_on_positions and self.roles.on_command is not None)
        self.channels = channels(self.server_name, settings.user_ip)
        self.metrics = ReplicationMetrics(
            positions=lambda: follower.taken_positions() if follower is not None else {},
            queue_depths=lambda: {self.client_name: self._queued},
            gaps=lambda: follower.unfilled if follower is not None else {},
            refusals=lambda: follower.refused if follower is not None else {},
            stalled=lambda: follower.stalled_seconds() if follower is not None else {},
            stalls=lambda: follower.stalls if follower is not None else {},
            prefix="streamrep_replication_client",
        )
        self._echoes = EchoFilter()
        self._bad_lines_logged: set[str] = set()
        self._fillable: frozenset[str] = (frozenset(self.source.stream_names()) if self.source is not None
                                          else frozenset())
        self._lines_per_message = settings.redis_lines_per_message
        #: PUBLISH commands encoded for Redis, how many lines and how many commands
        #: they are, and the writer positions they carry
        self._outbox: list[bytes] = []
        self._queued = 0
        self._outbox_publishes = 0
        self._outbox_tokens: _Tokens = {}
        #: (commands sent on the publisher when a batch went out, its positions)
        self._in_flight: deque[tuple[int, _Tokens]] = deque()
        self._outbox_ready = gevent.event.Event()
        self._publishing = False
        self._publisher: Publisher | None = None
        self._subscribed = False
        #: Redis refused this process's PUBLISH (an ACL that lets it only read)
        self._read_only = False
        self._lost: str | None = None
        self._greenlet: Greenlet | None = None

    # --- lifecycle -------------------------------------------------------------------

    def _launch(self) -> Greenlet:
        from gevent import monkey

        if not monkey.is_module_patched("socket"):
            raise RedisUnavailableError(
                "the Redis transport needs cooperative sockets: call gevent.monkey.patch_all() "
                "at the very start of the program")
        if self._greenlet is None or self._greenlet.dead:
            if self.follower is not None:
                self.follower.resolve_start()
            self._greenlet = gevent.spawn(self._run)
        return self._greenlet

    def _shutdown(self, timeout: float) -> None:
        """Publish what is queued (for at most *timeout*), then disconnect."""
        if self._subscribed and self._outbox:
            with gevent.Timeout(timeout, False):
                while self._subscribed and (self._outbox or self._publishing):
                    gevent.sleep(0.005)
        self._lost = "stopping"
        self._outbox_ready.set()
        if self._greenlet is not None:
            self._greenlet.join(timeout)
            self._greenlet.kill(block=True, timeout=timeout)

    @property
    def connected(self) -> bool:
        return self._subscribed

    def _run(self) -> None:
        where = describe_url(self.url)
        while not self._stop_requested.is_set():
            refusal, credentials = None, False
            try:
                self._connection(where)
            except RedisRefused as exc:
                reason = refusal = str(exc)
                credentials = exc.credentials
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
            if self._stop_requested.is_set():
                break
            delay = self.backoff.next_delay()
            logger.warning("Redis %s: %s; reconnecting in %.2fs", where, reason, delay)
            self._down(f"no connection to Redis at {where}: {reason}", delay, refusal, credentials)
            gevent.sleep(delay)

    def _connection(self, where: str) -> None:
        connect_timeout = self.settings.connect_timeout
        subscription = Subscription(self.url, self.channels, connect_timeout)
        publisher = Publisher(self.url, self.settings.connection.ping_timeout)
        writer: Greenlet | None = None
        self._lost = None
        try:
            subscription.open()
            publisher.open()
            self._subscribed_now()
            logger.info("Redis %s: subscribed to %s", where, ", ".join(self.channels))
            if self._lines_per_message > 1 and self.connections_made == 1:
                logger.info("publishing up to %d RDATA lines a Redis message, which only streamrep reads: "
                            "no reference process may follow channel %s (replication.redis.lines_per_message)",
                            self._lines_per_message, self.server_name)
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
        # Whatever was queued for the old subscription is announced again from the
        # confirmed positions (the writer's restart positions) below.
        self._drop_outbox()
        self._in_flight.clear()
        self._read_only = False
        self._subscribed = True
        self._connection_up()
        self.backoff.reset()
        positions = list(self.writer_positions()) if self.writer_positions is not None else []
        for stream, instance, token in positions:
            self._noted(stream, instance, token)
        greeting_tokens = {(s, i): t for s, i, t in positions}
        for action in self.session.announce(positions):
            if type(action) is Send:
                self._publish(action.data, tokens=greeting_tokens if action.name == "POSITION" else None)
        self._greeted()
        if self.follower is not None:
            # Writers that stopped answer no REPLICATE: fill what the database holds.
            with self.follower.lock:
                self._carry_out(self.follower.stored_positions())

    # --- reading ---------------------------------------------------------------------

    def _read_loop(self, subscription: Subscription) -> None:
        read = subscription.read_messages
        connection = self.settings.connection
        decoder = C.new_decoder(connection.max_line_length)
        # A process that only writes hears everyone's rows, its own echoes above
        # all: none concern it, so they are dropped before anything is decoded.
        skip = b"RDATA " if self.follower is None else None
        last_ping = time.monotonic()
        # When the answer to our last ping is overdue (None: nothing outstanding).
        # Measured from the ping, not from the last message, so a process that was
        # itself suspended does not blame Redis.
        answer_due: float | None = None
        patience = connection.ping_timeout - connection.ping_interval
        poll_every = connection.database_poll_interval
        next_poll = last_ping + poll_every
        while True:
            if self._lost is not None:
                raise _Lost(self._lost)
            lines, replies = read(_POLL_SECONDS, skip)
            if replies:
                answer_due = None
                if lines:
                    self._received(decoder, lines)
            now = time.monotonic()
            if poll_every > 0 and now >= next_poll and self._verifying():
                self._poll_database()
                next_poll = now + poll_every
            if answer_due is not None and now > answer_due:
                raise _Lost(f"no answer from Redis for {connection.ping_timeout:g}s")
            if now - last_ping >= connection.ping_interval:
                subscription.ping()  # answered on the subscription
                last_ping = now
                if answer_due is None:
                    answer_due = now + patience

    def _verifying(self) -> bool:
        follower = self.follower
        return follower is not None and follower.state.verify is not None

    def _poll_database(self) -> None:
        """A verifying reader delivers what its database holds of the writers it
        follows even when nobody announces it (a writer that crashed after
        committing, or lost its link for good), writers it never heard of included."""
        follower = self.follower
        source = self.source
        assert follower is not None and isinstance(source, StreamSource)
        keys = set(follower.positions)
        reached: dict[str, int] = {}
        for (stream, _instance), token in follower.positions.items():
            reached[stream] = max(token, reached.get(stream, 0))
        for stream in source.stream_names():
            if follower.follows(stream):
                # Only rows past what this reader reached on the stream: cheap.
                keys.update((stream, instance) for instance in source.writers(stream, reached.get(stream, 0)))
        stored = {key: source.current_token(*key) for key in keys}
        with follower.lock:
            self._carry_out(follower.state.stored_positions(stored))

    def _received(self, decoder: Any, lines: bytes) -> None:
        """*lines*: the messages of one read, each followed by a newline."""
        echoes = self._echoes
        if len(echoes):
            kept = [line for line in lines.split(b"\n")[:-1]
                    if line.startswith(_NAMED_BY_WRITER) or not echoes.is_echo(line)]
            if not kept:
                return
            kept.append(b"")
            lines = b"\n".join(kept)
        try:
            commands = decoder.feed(lines)
        except ProtocolError as exc:
            # Another process's bad line hurts nobody else: say so (once per kind of
            # problem: anyone may publish, so the log must not follow their pace),
            # count it, and go on with the good ones (those the reference acts on).
            # A command this version does not know is no problem: it is handed on.
            _unknown, problems = C.split_unknown(exc)
            if problems:
                self._bad_line(str(problems[0]))
            self._read(lambda: self.session.receive_failed(exc, time.monotonic()))
            return
        self._read(lambda: self.session.receive(commands, time.monotonic()))

    def _read(self, receive: Callable[[], list[Action]]) -> None:
        """Carry out what the session makes of a read. Facts move positions as the
        session reads them: the follower's background fills wait until this read's
        facts were handed on."""
        follower = self.follower
        if follower is None:
            self._carry_out(receive())
            return
        with follower.lock:
            self._carry_out(receive())

    def _bad_line(self, problem: str) -> None:
        self.metrics.refused["malformed line"] += 1
        if problem not in self._bad_lines_logged and len(self._bad_lines_logged) < 100:
            self._bad_lines_logged.add(problem)
            logger.warning("ignoring a replication message from Redis: %s (logged once; counted in "
                           "streamrep_replication_client_refused_total)", problem)
        else:
            logger.debug("ignoring a replication message from Redis: %s", problem)

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
                follower.skip_gap(action)
            elif kind is Received:
                assert isinstance(action, Received)
                command = action.command
                if command.NAME == "ERROR":
                    logger.warning("a replication peer said ERROR %s", C.error_message(command))
                elif self.roles.on_command is not None:
                    self.roles.on_command(command)
            elif kind is Close:
                assert isinstance(action, Close)
                logger.warning("replication through Redis: %s (%s)", action.reason, action.error)

    def _unfillable(self, gap: FillGap) -> Action:
        """A gap of a stream the catch-up source does not hold (one only the
        reference writes, say) cannot be filled from it."""
        if gap.stream in self._fillable:
            return gap
        return GapUnfilled(gap.stream, gap.instance, gap.from_token, gap.upto_token)

    # --- writing ---------------------------------------------------------------------

    def _publish(self, data: bytes, named_by_writer: bool = False, tokens: _Tokens | None = None) -> bool:
        """Queue encoded command lines, one message each. *named_by_writer*: they
        are all ``RDATA``/``POSITION`` (no echo to remember, one channel), packed
        up to ``redis_lines_per_message`` lines a message. *tokens*: the writer
        positions Redis's answers to them confirm."""
        if not self._subscribed or self._read_only:
            return False
        lines = data.split(b"\n")
        lines.pop()  # after the last newline
        channel = self.server_name
        if named_by_writer:
            messages = pack_lines(lines, self._lines_per_message)
            return self._queue(encode_publish(channel, messages), len(lines), len(messages), tokens)
        chunks = []
        for message in lines:
            target = channel
            if not message.startswith(_NAMED_BY_WRITER):
                self._echoes.published(message)
                target = channel_for(message.partition(b" ")[0].decode(), channel)
            chunks.append(encode_publish(target, [message]))
        return self._queue(b"".join(chunks), len(lines), len(lines), tokens)

    def send(self, command: Any) -> bool:
        """Publish any command now if subscribed; False otherwise."""
        return self._publish(C.encode_one(command))

    def announce(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> bool:
        """Publish rows ``(token, row_json)`` this process committed (token order).

        Returns False when not subscribed: the next subscription announces the
        writer's position and the rest follows from there.
        """
        check_rows(rows)
        if not self._subscribed or not rows:
            return False
        token = rows[-1][0]
        actions = self.session.rows(stream, instance, rows)
        if not all(self._publish(a.data, True, {(stream, instance): token}) for a in actions if type(a) is Send):
            return False
        self._noted(stream, instance, token)
        return True

    def announce_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool:
        """Announce that a writer moved from *prev_token* to *new_token* with no rows."""
        if not self._subscribed:
            return False
        actions = self.session.position(stream, instance, prev_token, new_token)
        if not all(self._publish(a.data, True, {(stream, instance): new_token})
                   for a in actions if type(a) is Send):
            return False
        self._noted(stream, instance, new_token)
        return True

    def _drop_outbox(self) -> None:
        self._outbox, self._queued, self._outbox_publishes, self._outbox_tokens = [], 0, 0, {}

    def _queue(self, data: bytes, count: int, publishes: int, tokens: _Tokens | None) -> bool:
        """Queue *data*, *publishes* ``PUBLISH`` commands carrying *count* lines."""
        max_queued = self.settings.connection.max_queued_commands
        limit = max_queued - count
        generation = self.connections_made
        if self._queued > limit:
            # Redis is slower than this writer: the writer waits (its persisting
            # with it) for up to ping_timeout, then starts over; the new
            # subscription announces its positions and the rest follows.
            deadline = time.monotonic() + self.settings.connection.ping_timeout
            while (self._queued > limit and self._subscribed and self._lost is None
                   and time.monotonic() < deadline):
                gevent.sleep(0.001)
            if self.connections_made != generation or not self._subscribed:
                return False  # queued for a subscription that is gone
            if self._queued > limit:
                if self._lost is None:
                    self._lost = f"more than {max_queued} commands waiting to be published"
                self._drop_outbox()
                return False
        self._outbox.append(data)
        self._queued += count
        self._outbox_publishes += publishes
        if tokens:
            pending = self._outbox_tokens
            for key, token in tokens.items():
                if token > pending.get(key, -1):
                    pending[key] = token
        self._outbox_ready.set()
        return True

    def _publish_loop(self, publisher: Publisher) -> None:
        ready = self._outbox_ready
        answers = gevent.spawn(self._answer_loop, publisher)
        ping_interval = self.settings.connection.ping_interval
        last_sent = time.monotonic()
        try:
            while self._lost is None:
                if not self._outbox:
                    ready.clear()
                    ready.wait(ping_interval)
                if self._lost is not None:
                    return
                batch = self._outbox
                if not batch:
                    if time.monotonic() - last_sent >= ping_interval:
                        publisher.ping()
                        last_sent = time.monotonic()
                    continue
                publishes, tokens = self._outbox_publishes, self._outbox_tokens
                self._drop_outbox()
                self._publishing = True
                publisher.send(b"".join(batch), publishes)
                if tokens:
                    self._in_flight.append((publisher.sent, tokens))
                self._publishing = False
                last_sent = time.monotonic()
        except Exception as exc:
            if self._lost is None:
                self._lost = f"publishing failed ({type(exc).__name__}: {exc})"
        finally:
            self._publishing = False
            answers.kill(block=False)

    def _answer_loop(self, publisher: Publisher) -> None:
        """Take Redis's answers on the publishing connection: they confirm what was
        published. Give up on the connection when answers owed are ``ping_timeout``
        late."""
        self._publisher = publisher
        ping_timeout = self.settings.connection.ping_timeout
        waiting_since: float | None = None
        try:
            while self._lost is None:
                answered, refusal = publisher.take_answers(_POLL_SECONDS)
                if refusal is not None:
                    self._refused_publish(refusal)
                self._confirm_answered(publisher.answered)
                now = time.monotonic()
                if answered or publisher.unanswered == 0:
                    waiting_since = None
                elif waiting_since is None:
                    waiting_since = now
                elif now - waiting_since > ping_timeout:
                    self._lost = f"no answer from Redis for {ping_timeout:g}s"
        except Exception as exc:
            if self._lost is None:
                self._lost = f"publishing failed ({type(exc).__name__}: {exc})"
        finally:
            self._publisher = None

    def _confirm_answered(self, answered: int) -> None:
        """Every batch whose commands Redis answered confirms the positions it carried."""
        in_flight = self._in_flight
        while in_flight and in_flight[0][0] <= answered:
            for (stream, instance), token in in_flight.popleft()[1].items():
                self._confirm(stream, instance, token)

    def _refused_publish(self, refusal: str) -> None:
        """Redis refused a ``PUBLISH``. A process that writes no stream may only be
        allowed to read (an ACL): it goes on without publishing. A writer cannot."""
        if refusal.startswith("NOPERM") and not self._announced and self.writer_positions is None:
            if not self._read_only:
                self._read_only = True
                logger.warning("Redis refused this process's PUBLISH (%s): following without asking the "
                               "writers for their positions; without a database, facts published while "
                               "this process was not subscribed cannot be noticed", refusal)
            self._drop_outbox()
            return
        if refusal.startswith("NOPERM"):
            self._refusal = (f"Redis refused to publish {self.instance_name}'s facts: {refusal}; grant "
                             f"PUBLISH on the channel {self.server_name} in the server's ACL")
        self._lost = f"Redis refused a PUBLISH: {refusal}"

    def _settle(self) -> bool:
        return not self._unconfirmed()
