"""Tunables of replication connections, one object for every transport.

The hub, its TCP clients and a process on a Redis bus take the same
:class:`ConnectionSettings`, so a setting given in the deployment file reaches every
one of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrep.replication import commands as C
from streamrep.replication.outbound import DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_COMMANDS

if TYPE_CHECKING:
    from streamrep.config import Config

__all__ = ["ConnectionSettings", "DEFAULT_MAX_PENDING_CONNECTIONS", "DEFAULT_MAX_PENDING_PER_HOST"]

#: Default bound on ``batch`` rows one peer may send before their token.
DEFAULT_MAX_PENDING_ROWS = 10_000
#: Default bounds on peers that have not started replicating, in all and per address.
DEFAULT_MAX_PENDING_CONNECTIONS = 200
DEFAULT_MAX_PENDING_PER_HOST = 50


class ConnectionSettings:
    """Tunables shared by every connection of one hub or client.

    ``handshake_timeout``: a hub peer that has sent no valid ``NAME`` by then is
    closed. ``idle_timeout``: a hub peer that is not *active* by then (it named
    itself and sent ``REPLICATE``, ``RDATA``, ``POSITION`` or another command the hub
    acts on; ``PING`` does not count) is closed. ``database_poll_interval``: how
    often the hub looks in its database for facts of writers that nobody announces
    (0: never). ``max_pending_rows``: ``batch`` rows one peer may hold back before
    the row with their token (default: 10,000, or ``max_queued_commands`` when
    smaller, since a larger fact could not be queued to any reader). ``max_queued_commands`` and
    ``max_queued_bytes`` bound one peer's outbound queue. ``max_connections`` and
    ``max_connections_per_host``: the hub's limits on peers, refused beyond them.
    ``max_pending_connections`` and ``max_pending_per_host``: how many peers not
    active yet the hub holds, in all and from one address (default: 200 and 50, at
    most the limits on all peers); a new connection beyond them closes the oldest
    such peer, so peers that never start replicating cannot lock anyone out.
    """

    __slots__ = ("ping_interval", "ping_timeout", "max_queued_commands", "max_line_length",
                 "handshake_timeout", "max_pending_rows", "max_connections", "max_connections_per_host",
                 "database_poll_interval", "idle_timeout", "max_pending_connections", "max_pending_per_host",
                 "max_queued_bytes")

    def __init__(
        self,
        ping_interval: float = 5.0,
        ping_timeout: float = 15.0,
        max_queued_commands: int = DEFAULT_MAX_QUEUED_COMMANDS,
        max_line_length: int = C.DEFAULT_MAX_LINE_LENGTH,
        handshake_timeout: float = 10.0,
        max_pending_rows: int | None = None,
        max_connections: int = 1000,
        max_connections_per_host: int = 200,
        database_poll_interval: float = 5.0,
        idle_timeout: float = 30.0,
        max_pending_connections: int | None = None,
        max_pending_per_host: int | None = None,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    ) -> None:
        if ping_interval <= 0 or ping_timeout <= 0 or handshake_timeout <= 0 or idle_timeout <= 0:
            raise ValueError("ping_interval, ping_timeout, handshake_timeout and idle_timeout must be positive")
        if max_pending_connections is None:
            max_pending_connections = min(DEFAULT_MAX_PENDING_CONNECTIONS, max_connections)
        if max_pending_per_host is None:
            max_pending_per_host = min(DEFAULT_MAX_PENDING_PER_HOST, max_connections_per_host)
        if not 0 < max_pending_connections <= max_connections:
            raise ValueError("max_pending_connections must be between 1 and max_connections")
        if not 0 < max_pending_per_host <= max_connections_per_host:
            raise ValueError("max_pending_per_host must be between 1 and max_connections_per_host")
        if max_queued_bytes < 1:
            raise ValueError("max_queued_bytes must be at least 1")
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_queued_commands = max_queued_commands
        self.max_line_length = max_line_length
        self.handshake_timeout = handshake_timeout
        self.max_pending_rows = (max_pending_rows if max_pending_rows is not None
                                 else min(max_queued_commands, DEFAULT_MAX_PENDING_ROWS))
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        self.database_poll_interval = database_poll_interval
        self.idle_timeout = idle_timeout
        self.max_pending_connections = max_pending_connections
        self.max_pending_per_host = max_pending_per_host
        self.max_queued_bytes = max_queued_bytes

    @classmethod
    def from_config(cls, config: Config) -> ConnectionSettings:
        """The settings a deployment's configuration file gives (``keepalive`` and
        ``backpressure``, ``connections``), the same for the hub and every process
        connecting to it."""
        connections = config.connections
        return cls(
            ping_interval=config.keepalive.ping_interval,
            ping_timeout=config.keepalive.timeout,
            max_queued_commands=config.backpressure.max_queue,
            max_queued_bytes=config.backpressure.max_queue_bytes,
            max_line_length=config.backpressure.max_line_length,
            handshake_timeout=connections.handshake_timeout,
            idle_timeout=connections.idle_timeout,
            max_connections=connections.max,
            max_connections_per_host=connections.max_per_host,
            max_pending_connections=connections.max_pending,
            max_pending_per_host=connections.max_pending_per_host,
        )
