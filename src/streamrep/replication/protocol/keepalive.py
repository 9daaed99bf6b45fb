"""Keepalive as data: when to ping a peer and when to give up on it."""

from __future__ import annotations

from streamrep.replication import commands as C
from streamrep.replication.protocol.actions import Action, Close, DisconnectReason, Send
from streamrep.replication.protocol.settings import ConnectionSettings

__all__ = ["Keepalive"]


class Keepalive:
    """When to ping and when to give up on a peer, as data.

    Each end sends something at least every ``ping_interval`` seconds (a ``PING``
    when nothing else went out). Once the peer has sent a ``PING`` it must keep
    talking: silence longer than ``ping_timeout`` closes it. A peer that never
    pings is never timed out by this rule (the hub's handshake deadline still
    applies to it). Whether it pings or not, a peer that takes nothing of what waits
    for it for ``ping_timeout`` seconds is closed as too slow: a stalled reader
    holds no memory for longer than that, even below its queue's bounds.
    """

    __slots__ = ("ping_interval", "ping_timeout", "last_sent", "last_received", "ping_seen")

    def __init__(self, settings: ConnectionSettings, now: float) -> None:
        self.ping_interval = settings.ping_interval
        self.ping_timeout = settings.ping_timeout
        self.last_sent = now
        self.last_received = now
        self.ping_seen = False

    @property
    def check_interval(self) -> float:
        """How often a transport should call :meth:`Session.tick`."""
        return min(self.ping_interval, self.ping_timeout) / 4

    def due(self, now: float, idle: bool) -> Action | None:
        """A ``Close`` for a silent peer or one that took nothing of what waits for
        it (*idle* False) since the last write, a ``Send`` of ``PING`` when we have
        been quiet (and nothing is queued), or None."""
        if self.ping_seen and now - self.last_received > self.ping_timeout:
            return Close(DisconnectReason.TIMEOUT, f"no command received for {self.ping_timeout:g} seconds")
        if not idle and now - self.last_sent > self.ping_timeout:
            return Close(DisconnectReason.SLOW_CONSUMER,
                         f"too far behind: nothing could be written for {self.ping_timeout:g} seconds")
        if idle and now - self.last_sent >= self.ping_interval:
            # Counted as sent now, so a slow flush does not trigger a burst.
            self.last_sent = now
            return Send(C.encode_one(C.ping()), 1, "PING")
        return None
