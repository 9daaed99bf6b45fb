"""One replication link per process, whatever carries it.

Every process of a deployment other than the hub (a worker, a writer, a follower of
a Matrix deployment) talks to the others through one :class:`ReplicationLink`:
a TCP connection to the hub, or a subscription to the deployment's Redis channel.
Both take the same :class:`LinkSettings` (and through it the same
:class:`~streamrep.replication.protocol.ConnectionSettings`), and
:func:`open_link` is the one place that picks the transport: entry points ask for
a link and never branch on which one they got.

A transport is one module with a function ``open_link(settings, roles)``, named
in :data:`TRANSPORTS` under the scheme of :attr:`LinkSettings.transport`.
"""

from __future__ import annotations

import abc
import importlib
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import gevent
import gevent.event

from streamrep.replication.backoff import Backoff
from streamrep.replication.protocol.reader import StartFrom
from streamrep.replication.protocol.settings import ConnectionSettings

if TYPE_CHECKING:
    from streamrep.config import Config, SynapseConfig
    from streamrep.replication.follower import Handler, Stall, StreamFollower
    from streamrep.replication.metrics import ReplicationMetrics
    from streamrep.replication.security import PeerSecurity
    from streamrep.replication.sources import CatchUpSource

__all__ = [
    "LinkSettings", "LinkRoles", "ReplicationLink", "LinkBase", "open_link", "TRANSPORTS",
    "WriterPositions", "check_rows",
]

#: ``() -> [(stream, instance, token)]``: the positions a writer announces on every
#: new connection (see :class:`~streamrep.replication.announcer.Announcer`).
WriterPositions = Callable[[], Sequence[tuple[str, str, int]]]

#: Transport scheme -> module defining ``open_link(settings, roles)``.
TRANSPORTS: dict[str, str] = {
    "tcp": "streamrep.replication.transport.tcp_client",
    "redis": "streamrep.replication.transport.redis",
}


@dataclass(frozen=True)
class LinkSettings:
    """Where a process's link goes and how it behaves; the same for every transport.

    * *name*: this process's name: ``NAME`` towards the hub, and the instance whose
      echoes a Redis link ignores;
    * *server_name*: the deployment's name (the hub's ``SERVER``; Redis's channel);
    * *hub*: ``(host, port)`` of the hub, or *redis_url* for Redis (exactly one);
    * *connection*: keepalive, queue and line bounds (both transports);
    * *security*: TLS and the shared secret towards the hub (Redis takes TLS and its
      password from the URL: ``rediss://``, ``redis://user:password@...``);
    * *backoff*: reconnection delays; *connect_timeout*: seconds per attempt.
    """

    name: str
    server_name: str | None = None
    hub: tuple[str, int] | None = None
    redis_url: str | None = None
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    security: PeerSecurity | None = None
    backoff_base: float = 0.1
    backoff_max: float = 10.0
    connect_timeout: float = 5.0
    #: Redis only: also subscribe to ``<server_name>/USER_IP``
    user_ip: bool = False
    #: Redis only: up to this many of a writer's ``RDATA`` lines per message (1: the
    #: reference's format; more is read by streamrep alone)
    redis_lines_per_message: int = 1

    def __post_init__(self) -> None:
        if (self.hub is None) == (self.redis_url is None):
            raise ValueError("a link goes to a hub or to Redis: give exactly one of hub and redis_url")
        if self.redis_url is not None and not self.server_name:
            raise ValueError("a Redis link needs server_name (the deployment's channel)")
        if self.redis_lines_per_message < 1:
            raise ValueError("redis_lines_per_message must be at least 1")

    @classmethod
    def from_config(cls, config: Config, name: str, security: PeerSecurity | None = None) -> LinkSettings:
        """The link of a process named *name* in the deployment *config* describes:
        through Redis when it has ``replication.redis``, else to its hub (with the
        file's TLS and shared secret unless *security* is given)."""
        connection = ConnectionSettings.from_config(config)
        if config.synapse is not None:
            return cls.from_synapse(config.synapse, name, connection)
        if config.redis is not None:
            return cls(name, config.server_name, redis_url=config.redis.url, connection=connection,
                       redis_lines_per_message=config.redis.lines_per_message)
        if security is None:
            from streamrep.replication.security import PeerSecurity

            security = PeerSecurity.from_config(config, name)
        return cls(name, config.server_name, hub=(config.listen.host, config.listen.port),
                   connection=connection, security=security)

    @classmethod
    def from_synapse(cls, synapse: SynapseConfig, name: str,
                     connection: ConnectionSettings | None = None) -> LinkSettings:
        """The link of a follower named *name* of the reference deployment whose
        ``homeserver.yaml`` *synapse* holds (:func:`streamrep.config.load_synapse_config`):
        its Redis, with its server name as the channel. The link publishes only its
        ``REPLICATE``; the writers' answers and the facts they publish are what it
        follows (fill its gaps with :meth:`HttpSource.from_synapse
        <streamrep.replication.sources.http.HttpSource.from_synapse>`)."""
        return cls(name, synapse.server_name, redis_url=synapse.redis_url,
                   connection=connection if connection is not None else ConnectionSettings())

    @property
    def transport(self) -> str:
        """The scheme naming the transport in :data:`TRANSPORTS`."""
        return "redis" if self.redis_url is not None else "tcp"

    def new_backoff(self) -> Backoff:
        return Backoff(self.backoff_base, self.backoff_max)

    def where(self) -> str:
        """The far end, for messages (a Redis URL without its password)."""
        if self.redis_url is not None:
            from streamrep.config import redis_url_for_display

            return f"Redis {redis_url_for_display(self.redis_url)} channel {self.server_name}"
        assert self.hub is not None
        return f"the hub at {self.hub[0]}:{self.hub[1]}"


@dataclass
class LinkRoles:
    """What a process does on its link: follow streams (*handler*, filling gaps from
    *source*), write streams (*writer_positions*, announced on every connection), or
    both; and what it wants to hear about.

    * *streams*, *start_from*: what to follow and where to start (see
      :class:`~streamrep.replication.follower.StreamFollower`);
    * *on_command*: the commands that carry no fact as they pass (``USER_SYNC``,
      ``USER_IP``, ``LOCK_RELEASED``, ..., and as
      :class:`~streamrep.replication.commands.UnknownCommand` those this version
      does not know); with *hand_on_positions* also every other writer's
      ``POSITION`` of a followed stream, after the follower took it;
    * *on_retry* ``(problem, delay)``: an attempt failed or the link was lost;
    * *on_gap* ``(stream, instance, from_token, upto_token)``: a gap that could not be
      filled (nothing to fill it from); the link also logs and counts it;
    * *on_stall*, *on_resume* ``(stall)``: the source could not answer for a writer,
      which is held back (the other writers go on) and retried in the background;
      it answered again (see :class:`~streamrep.replication.follower.Stall`);
    * *new_writers_from*, *after_read*: where writers nobody named start, and a hook
      called once a read's facts were all handed on (see
      :class:`~streamrep.replication.follower.StreamFollower`); *after_stop* is called
      with the follower once the link stopped. A durable cursor
      (:mod:`streamrep.replication.cursor`) sets these three.
    """

    handler: Handler | None = None
    source: CatchUpSource | None = None
    streams: Iterable[str] | None = None
    start_from: StartFrom | None = None
    writer_positions: WriterPositions | None = None
    on_command: Callable[[Any], None] | None = None
    hand_on_positions: bool = False
    on_retry: Callable[[str, float], None] | None = None
    on_gap: Callable[[str, str, int, int], None] | None = None
    on_stall: Callable[[Stall], None] | None = None
    on_resume: Callable[[Stall], None] | None = None
    new_writers_from: int | None = None
    after_read: Callable[[StreamFollower], None] | None = None
    after_stop: Callable[[StreamFollower], None] | None = None


class ReplicationLink(Protocol):
    """What every transport offers a process (see :class:`LinkBase` for the semantics)."""

    settings: LinkSettings
    follower: StreamFollower | None
    metrics: ReplicationMetrics
    writer_positions: WriterPositions | None
    on_connected: Callable[[], None] | None
    connections_made: int

    @property
    def connected(self) -> bool: ...

    @property
    def refusal(self) -> str | None: ...

    @property
    def problem(self) -> str | None: ...

    @property
    def refused_credentials(self) -> bool: ...

    def start(self) -> Any: ...

    def stop(self, timeout: float = 2.0) -> None: ...

    def run(self, signals: Sequence[int] = ...) -> None: ...

    def wait_connected(self, timeout: float | None = None) -> bool: ...

    def send(self, command: Any) -> bool: ...

    def announce(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> bool: ...

    def announce_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool: ...

    def confirmed(self, stream: str, instance: str) -> int | None: ...

    def flush(self, timeout: float) -> bool: ...


def check_rows(rows: Sequence[tuple[int, bytes]]) -> None:
    """Refuse rows that are not ``(int token, bytes row_json)`` at the call, rather
    than in a greenlet where the failure could only be logged."""
    for row in rows:
        if (type(row) is not tuple or len(row) != 2 or type(row[0]) is not int
                or not isinstance(row[1], (bytes, bytearray, memoryview))):
            raise TypeError(f"announce takes (int token, bytes row_json) rows, not {row!r:.80}; "
                            "encode rows with streamrep.wire.encode_row, or let "
                            "streamrep.replication.Announcer read them from the database")


class LinkBase(abc.ABC):
    """What both transports share: the lifecycle around the transport's own loop,
    what the far end said, and the announcement bookkeeping behind :meth:`flush`.

    * :attr:`connected`: a connection (or subscription) is up and greeted;
    * :attr:`problem`: why the link is down now, in one line (None when it is up);
    * :attr:`refusal`: the far end's last refusal of this process (``ERROR`` from the
      hub, an authentication failure from Redis), kept until the next success;
    * :meth:`announce` / :meth:`announce_position`: hand a writer's committed facts
      to the far end; False when not connected (nothing is queued: the writer's
      next connection announces its position and the rest follows from there);
    * :meth:`confirmed`: the position of a writer that the far end has accepted;
    * :meth:`flush`: wait until every announcement so far was accepted, not merely
      written to a socket;
    * :meth:`run`: start, block until SIGTERM/SIGINT or :meth:`stop`, stop.
    """

    #: set by :meth:`run` and :meth:`stop`
    _stop_requested: gevent.event.Event
    #: a reader with a database checks what it hears against it (a bus anyone can
    #: publish on), rather than trusting an authenticated hub
    verifies_what_it_hears = False

    def __init__(self, settings: LinkSettings, roles: LinkRoles) -> None:
        from streamrep.replication.follower import StreamFollower
        from streamrep.replication.sources import StreamSource

        self.settings = settings
        self.roles = roles
        self.follower: StreamFollower | None = (
            StreamFollower(roles.handler, roles.source, roles.streams, roles.start_from, roles.on_gap,
                           verify=self.verifies_what_it_hears and isinstance(roles.source, StreamSource),
                           new_writers_from=roles.new_writers_from, after_read=roles.after_read,
                           on_stall=roles.on_stall, on_resume=roles.on_resume)
            if roles.handler is not None else None)
        self.writer_positions = roles.writer_positions
        #: called in the link's greenlet once each new connection has been greeted
        self.on_connected: Callable[[], None] | None = None
        self.connections_made = 0
        self.backoff = settings.new_backoff()
        self._problem: str | None = "not connected yet"
        self._refusal: str | None = None
        self._credentials_refused = False
        self._up = gevent.event.Event()
        self._stop_requested = gevent.event.Event()
        #: the last token announced per (stream, instance), on any connection
        self._announced: dict[tuple[str, str], int] = {}
        #: what the far end accepted, per (stream, instance)
        self._confirmed: dict[tuple[str, str], int] = {}

    # --- what the far end said ------------------------------------------------------------

    @property
    def problem(self) -> str | None:
        return None if self.connected else self._problem

    @property
    def refusal(self) -> str | None:
        return self._refusal

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """A connection (or subscription) is up and greeted."""

    @property
    def refused_credentials(self) -> bool:
        """The last refusal was of this process's credentials (a password, the shared
        secret): retrying cannot help until they change."""
        return self._credentials_refused

    def _down(self, problem: str, delay: float, refusal: str | None = None, credentials: bool = False) -> None:
        """The link is down for *problem*; it tries again in *delay* seconds. *refusal*:
        the far end refused this process (*credentials*: its credentials)."""
        self._problem = problem
        if refusal is not None:
            self._refusal = refusal
            self._credentials_refused = credentials
        if self.roles.on_retry is not None:
            self.roles.on_retry(problem, delay)

    def _connection_up(self) -> None:
        """A new connection is up: called as :attr:`connected` turns True, before the
        link yields, so that announcements can tell connections apart."""
        self.connections_made += 1

    def _greeted(self) -> None:
        """The new connection's greeting is on its way: run the writer's hook, then
        say so."""
        self._problem = None
        self._refusal = None
        self._credentials_refused = False
        if self.on_connected is not None:
            self.on_connected()
        self._up.set()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Block until a connection is up (True) or *timeout* passes (False)."""
        return bool(self._up.wait(timeout))

    # --- announcing -----------------------------------------------------------------------

    def confirmed(self, stream: str, instance: str) -> int | None:
        """The position of writer *instance* on *stream* that the far end accepted
        (None: nothing yet)."""
        return self._confirmed.get((stream, instance))

    def _unconfirmed(self) -> dict[tuple[str, str], int]:
        confirmed = self._confirmed
        return {key: token for key, token in self._announced.items() if confirmed.get(key, -1) < token}

    def _confirm(self, stream: str, instance: str, token: int) -> None:
        key = (stream, instance)
        if token > self._confirmed.get(key, -1):
            self._confirmed[key] = token

    def _noted(self, stream: str, instance: str, token: int) -> None:
        key = (stream, instance)
        if token > self._announced.get(key, -1):
            self._announced[key] = token

    def flush(self, timeout: float) -> bool:
        """Wait until the far end has accepted everything announced so far (True), or
        *timeout* passes (False: :attr:`refusal` or :attr:`problem` says why)."""
        with gevent.Timeout(timeout, False):
            while not self._stop_requested.is_set() and not self.refused_credentials:
                if self.connected and self._settle():
                    return True
                gevent.sleep(0.005)
        return False

    def _settle(self) -> bool:
        """True once the far end confirmed every announcement; a transport that must
        ask for confirmations does so here."""
        return not self._unconfirmed()

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> Any:
        """Connect (and keep reconnecting) in a background greenlet."""
        self._stop_requested.clear()
        if self.follower is not None:
            self.follower.release()
        return self._launch()

    @abc.abstractmethod
    def _launch(self) -> Any:
        """The transport's part of :meth:`start`: its background greenlet."""

    def stop(self, timeout: float = 2.0) -> None:
        """Stop reconnecting; flush what is queued for at most *timeout*; disconnect.
        Also ends :meth:`run`. No fact is handed on once it was called, so the
        follower's positions say exactly what the handler took."""
        self._stop_requested.set()
        follower = self.follower
        if follower is not None:
            follower.hold()
        self._shutdown(timeout)
        if follower is not None:
            follower.stop_retrying()
            if self.roles.after_stop is not None:
                self.roles.after_stop(follower)

    @abc.abstractmethod
    def _shutdown(self, timeout: float) -> None:
        """The transport's part of :meth:`stop`."""

    def run(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """Start the link and block until one of *signals* arrives or :meth:`stop` is
        called (from a handler, say), then stop it. Call it from the main greenlet."""
        self.start()
        handlers = [gevent.signal_handler(signum, self._stop_requested.set) for signum in signals]
        try:
            self._stop_requested.wait()
        finally:
            for handler in handlers:
                handler.cancel()
            self.stop()


def open_link(settings: LinkSettings, roles: LinkRoles | None = None, **role_kwargs: Any) -> ReplicationLink:
    """The link *settings* describe, doing what *roles* (or the same as keywords) say.

    The one place that picks a transport: ``settings.transport`` names its module in
    :data:`TRANSPORTS`.
    """
    if roles is None:
        roles = LinkRoles(**role_kwargs)
    elif role_kwargs:
        raise TypeError("give roles or role keywords, not both")
    module = importlib.import_module(TRANSPORTS[settings.transport])
    link: ReplicationLink = module.open_link(settings, roles)
    return link
