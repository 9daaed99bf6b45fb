"""The bounded outbound queue of one connection.

Producers (the hub's publisher, relays, keepalive) append already-encoded bytes
with the number of commands they hold; the connection's writer takes everything
queued in one go, as the list of chunks it was queued as, and writes them with
one scatter-gather call: a chunk shared by many connections (a burst's ``RDATA``,
encoded once) is never copied per connection. The bound is on commands
and on bytes: a peer that falls more than ``max_commands`` or ``max_bytes`` behind
is cut off rather than allowed to grow the hub's memory or slow anyone else. Bytes
are what a queue costs, so by default the byte bound is the one that acts: the
default command bound is reached first only by lines shorter than 17 bytes, and a
writer's large transaction (10,000 rows announced at once) is just so many bytes.
"""

from __future__ import annotations

from gevent.event import Event

from streamrep import resources

__all__ = ["OutboundQueue", "DEFAULT_MAX_QUEUED_COMMANDS", "DEFAULT_MAX_QUEUED_BYTES"]

#: Default bound on commands waiting to be written to one peer.
DEFAULT_MAX_QUEUED_COMMANDS = 1_000_000
#: Default bound on bytes waiting to be written to one peer.
DEFAULT_MAX_QUEUED_BYTES = 16 * 1024 * 1024


class OutboundQueue:
    """Encoded commands waiting to be written, bounded by command count and bytes.

    A single chunk larger than ``max_bytes`` is still accepted into an empty queue,
    so a fact larger than the bound can reach a reader that keeps up.
    """

    __slots__ = ("max_commands", "max_bytes", "_chunks", "_queued", "_bytes", "_ready", "_closed",
                 "total_commands")

    def __init__(self, max_commands: int = DEFAULT_MAX_QUEUED_COMMANDS,
                 max_bytes: int = DEFAULT_MAX_QUEUED_BYTES) -> None:
        if max_commands < 1 or max_bytes < 1:
            raise ValueError("max_commands and max_bytes must be at least 1")
        self.max_commands = max_commands
        self.max_bytes = max_bytes
        self._chunks: list[bytes] = []
        self._queued = 0
        self._bytes = 0
        # Made by the first take() that waits: a connection that writes as data
        # comes (without a greenlet waiting here) never needs one.
        self._ready: Event | None = None
        self._closed = False
        #: commands ever accepted, for metrics
        self.total_commands = 0

    def __len__(self) -> int:
        """Commands currently queued."""
        return self._queued

    @property
    def queued_bytes(self) -> int:
        """Bytes currently queued."""
        return self._bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def room(self) -> int:
        """How many more commands fit before the bound."""
        return self.max_commands - self._queued

    def fits(self, count: int, size: int) -> bool:
        """Whether *count* commands of *size* bytes fit now."""
        return (self._queued + count <= self.max_commands
                and (self._bytes + size <= self.max_bytes or not self._bytes))

    def put(self, data: bytes, count: int = 1) -> bool:
        """Queue *data* holding *count* commands.

        Returns False, queuing nothing, if that would exceed a bound (the caller
        then disconnects the peer) or the queue is closed.
        """
        size = len(data)
        if (self._closed or self._queued + count > self.max_commands
                or (self._bytes + size > self.max_bytes and self._bytes)):
            return False
        self._chunks.append(data)
        self._queued += count
        self._bytes += size
        self.total_commands += count
        if resources.ENABLED:
            resources.acquired("queued command", count)
        if self._ready is not None:
            self._ready.set()
        return True

    def put_last(self, data: bytes, count: int = 1) -> bool:
        """Queue *data* whatever the bounds (a closing connection's ``ERROR``);
        False once closed."""
        if self._closed:
            return False
        self.max_commands = max(self.max_commands, self._queued + count)
        self.max_bytes = max(self.max_bytes, self._bytes + len(data))
        return self.put(data, count)

    def take(self, timeout: float | None = None) -> tuple[list[bytes], int]:
        """Wait (up to *timeout*) for data; return every chunk queued, in order,
        and how many commands they hold (the chunks are the producers' own
        objects, not copies).

        Returns ``([], 0)`` on timeout or once closed and empty.
        """
        if not self._chunks:
            if self._closed:
                return [], 0
            ready = self._ready
            if ready is None:
                ready = self._ready = Event()
            ready.clear()
            ready.wait(timeout)
        return self.take_now()

    def take_now(self) -> tuple[list[bytes], int]:
        """Every chunk queued and how many commands they hold, without waiting
        (``([], 0)`` when nothing is queued)."""
        chunks, count = self._chunks, self._queued
        if not chunks:
            return [], 0
        self._chunks = []
        self._queued = 0
        self._bytes = 0
        if self._ready is not None:
            self._ready.clear()
        if resources.ENABLED:
            resources.released("queued command", count)
        return chunks, count

    def wait_for_room(self, needed: int, timeout: float | None = None, size: int = 0) -> bool:
        """Block until *needed* commands of *size* bytes fit (or the queue closes);
        for producers that would rather wait than overflow, like database catch-up."""
        needed = min(needed, self.max_commands)
        if self.fits(needed, size):
            return True
        # The writer takes everything at once, so the queue becomes empty, not just
        # smaller: poll cheaply on the writer's progress.
        import gevent

        waited = 0.0
        step = 0.001
        while not self.fits(needed, size) and not self._closed:
            if timeout is not None and waited >= timeout:
                return False
            gevent.sleep(step)
            waited += step
            step = min(step * 2, 0.05)
        return not self._closed

    def close(self) -> None:
        """Refuse further data; wakes a waiting writer so it can finish."""
        self._closed = True
        if self._ready is not None:
            self._ready.set()

    def clear(self) -> None:
        """Drop whatever is queued (the peer is gone)."""
        if resources.ENABLED:
            resources.released("queued command", self._queued)
        self._chunks = []
        self._queued = 0
        self._bytes = 0
