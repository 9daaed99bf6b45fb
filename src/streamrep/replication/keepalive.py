"""Keepalive for one connection.

Each end sends at least one command every ``ping_interval`` seconds (a ``PING``
when nothing else went out). Once the peer has sent a ``PING`` it is expected to
keep talking: silence longer than ``ping_timeout`` closes the connection. A peer
that never pings (someone typing into netcat) is never timed out.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import gevent

from streamrep.replication import commands as C

if TYPE_CHECKING:
    from streamrep.replication.connection import ReplicationConnection

__all__ = ["Keepalive"]


class Keepalive:
    """The keepalive loop of one connection (run in its own greenlet)."""

    __slots__ = ("conn",)

    def __init__(self, conn: ReplicationConnection) -> None:
        self.conn = conn

    def tick(self, now: float) -> None:
        """One check: ping if we have been quiet, close if the peer has."""
        conn = self.conn
        settings = conn.settings
        if conn.ping_seen and now - conn.last_received > settings.ping_timeout:
            from streamrep.replication.connection import DisconnectReason

            conn.close(
                DisconnectReason.TIMEOUT,
                f"no command received for {settings.ping_timeout:g} seconds",
            )
            return
        if now - conn.last_sent >= settings.ping_interval and len(conn.queue) == 0:
            conn.send(C.ping())
            # Count the ping as sent now so a slow flush does not trigger a burst.
            conn.last_sent = now

    def run(self) -> None:
        conn = self.conn
        settings = conn.settings
        step = min(settings.ping_interval, settings.ping_timeout) / 4
        while not conn.closed:
            gevent.sleep(step)
            self.tick(time.monotonic())
