"""Tunables of replication connections, one object for every transport.

The hub, its TCP clients and a process on a Redis bus take the same
:class:`ConnectionSettings`, so a setting given in the deployment file reaches every
one of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrep.replication import commands as C
from streamrep.replication.outbound import DEFAULT_MAX_QUEUED_COMMANDS

if TYPE_CHECKING:
    from streamrep.config import Config

__all__ = ["ConnectionSettings"]


class ConnectionSettings:
    """Tunables shared by every connection of one hub or client.

    ``handshake_timeout``: a hub peer that has sent no valid ``NAME`` by then is
    closed. ``database_poll_interval``: how often the hub looks in its database for
    facts of writers that nobody announces (0: never). ``max_pending_rows``: ``batch`` rows one peer may hold back before the
    row with their token (default: ``max_queued_commands``, since a larger fact
    could not be queued to any reader anyway). ``max_connections`` and
    ``max_connections_per_host``: the hub's limits on peers.
    """

    __slots__ = ("ping_interval", "ping_timeout", "max_queued_commands", "max_line_length",
                 "handshake_timeout", "max_pending_rows", "max_connections", "max_connections_per_host",
                 "database_poll_interval")

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
    ) -> None:
        if ping_interval <= 0 or ping_timeout <= 0 or handshake_timeout <= 0:
            raise ValueError("ping_interval, ping_timeout and handshake_timeout must be positive")
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.max_queued_commands = max_queued_commands
        self.max_line_length = max_line_length
        self.handshake_timeout = handshake_timeout
        self.max_pending_rows = max_pending_rows if max_pending_rows is not None else max_queued_commands
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        self.database_poll_interval = database_poll_interval

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
