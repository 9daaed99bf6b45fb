"""The bounded outbound queue of one connection.

Producers (the hub's publisher, relays, keepalive) append already-encoded bytes
with the number of commands they hold; one writer greenlet per connection takes
everything queued in one go and hands it to a single ``sendall``. The bound is
on commands, not bytes: a peer that falls more than ``max_commands`` behind is
cut off rather than allowed to grow the hub's memory or slow anyone else.
"""

from __future__ import annotations

from gevent.event import Event

from streamrep import resources

__all__ = ["OutboundQueue", "DEFAULT_MAX_QUEUED_COMMANDS"]

#: Default bound on commands waiting to be written to one peer.
DEFAULT_MAX_QUEUED_COMMANDS = 10_000


class OutboundQueue:
    """Encoded commands waiting to be written, bounded by command count."""

    __slots__ = ("max_commands", "_chunks", "_queued", "_ready", "_closed", "total_commands")

    def __init__(self, max_commands: int = DEFAULT_MAX_QUEUED_COMMANDS) -> None:
        if max_commands < 1:
            raise ValueError("max_commands must be at least 1")
        self.max_commands = max_commands
        self._chunks: list[bytes] = []
        self._queued = 0
        self._ready = Event()
        self._closed = False
        #: commands ever accepted, for metrics
        self.total_commands = 0

    def __len__(self) -> int:
        """Commands currently queued."""
        return self._queued

    @property
    def closed(self) -> bool:
        return self._closed

    def room(self) -> int:
        """How many more commands fit before the bound."""
        return self.max_commands - self._queued

    def put(self, data: bytes, count: int = 1) -> bool:
        """Queue *data* holding *count* commands.

        Returns False, queuing nothing, if that would exceed the bound (the caller
        then disconnects the peer) or the queue is closed.
        """
        if self._closed or self._queued + count > self.max_commands:
            return False
        self._chunks.append(data)
        self._queued += count
        self.total_commands += count
        if resources.ENABLED:
            resources.acquired("queued command", count)
        self._ready.set()
        return True

    def take(self, timeout: float | None = None) -> tuple[bytes, int]:
        """Wait (up to *timeout*) for data; return everything queued and its count.

        Returns ``(b"", 0)`` on timeout or once closed and empty.
        """
        if not self._chunks:
            if self._closed:
                return b"", 0
            self._ready.clear()
            self._ready.wait(timeout)
            if not self._chunks:
                return b"", 0
        chunks, count = self._chunks, self._queued
        self._chunks = []
        self._queued = 0
        self._ready.clear()
        if resources.ENABLED:
            resources.released("queued command", count)
        return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), count

    def wait_for_room(self, needed: int, timeout: float | None = None) -> bool:
        """Block until *needed* commands fit (or the queue closes); for producers
        that would rather wait than overflow, like database catch-up."""
        needed = min(needed, self.max_commands)
        if self._queued + needed <= self.max_commands:
            return True
        # The writer takes everything at once, so the queue becomes empty, not just
        # smaller: poll cheaply on the writer's progress.
        import gevent

        waited = 0.0
        step = 0.001
        while self._queued + needed > self.max_commands and not self._closed:
            if timeout is not None and waited >= timeout:
                return False
            gevent.sleep(step)
            waited += step
            step = min(step * 2, 0.05)
        return not self._closed

    def close(self) -> None:
        """Refuse further data; wakes a waiting writer so it can finish."""
        self._closed = True
        self._ready.set()

    def clear(self) -> None:
        """Drop whatever is queued (the peer is gone)."""
        if resources.ENABLED:
            resources.released("queued command", self._queued)
        self._chunks = []
        self._queued = 0
