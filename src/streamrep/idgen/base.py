"""What every stream ID generator shares: reservation context managers, listeners
and waiting for positions.

IDs and tokens: a stream's *tokens* always increase. For a stream whose stored IDs
decrease (backfill, ``negative=True``) the generator hands out the negative IDs to
store (``-1, -2, ...``) while positions, tokens and the IDs given to listeners are
their negations (``1, 2, ...``), which is how they travel on the wire.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import gevent
import gevent.event

from streamrep import resources
from streamrep.errors import ListenerFailedError, NotAWriterError
from streamrep.idgen.tracking import CompletionTracker, WriterPositions

if TYPE_CHECKING:
    from streamrep.db import Transaction

logger = logging.getLogger(__name__)

#: ``listener(stream_name, instance_name, visible_tokens, new_position)``: called once
#: per advance of this writer's position, with every token that became visible.
PositionListener = Callable[[str, str, list[int], int], None]


@dataclass(frozen=True)
class BackingTable:
    """A table that holds a stream's rows.

    ``id_column`` holds stream IDs; ``instance_column``, when the table has one,
    names the writer of each row (multi-writer streams need it).
    """

    table: str
    id_column: str = "stream_id"
    instance_column: str | None = "instance_name"


class IdGenerator(abc.ABC):
    """The shared half of :class:`StreamIdGenerator` and :class:`MultiWriterIdGenerator`."""

    def __init__(self, stream_name: str, instance_name: str, writers: Sequence[str],
                 negative: bool) -> None:
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.writers: tuple[str, ...] = tuple(writers)
        self.negative = negative
        self._sign = -1 if negative else 1
        self._lock = threading.Lock()  # tracker updates; never held across I/O
        self._listeners: list[PositionListener] = []
        #: the first exception a position listener raised (see :meth:`_reserve_counted`)
        self.listener_failure: Exception | None = None
        self._advanced = gevent.event.Event()
        self._tracker: CompletionTracker = CompletionTracker(0)
        self._positions: WriterPositions = WriterPositions({w: 0 for w in self.writers})
        #: Called before each reservation; raises to refuse it (a writer lease that
        #: may have passed to another process, see :mod:`streamrep.idgen.lease`).
        self.write_guard: Callable[[], None] | None = None

    # -- positions -------------------------------------------------------------------

    @property
    def is_writer(self) -> bool:
        """True when this instance writes the stream."""
        return self.instance_name in self.writers

    def get_current_token(self) -> int:
        """The linear position: every fact of every writer at or below it completed."""
        with self._lock:
            return int(self._positions.linear_position)

    def get_max_token(self) -> int:
        """The furthest position of any writer (the top of the range of current IDs)."""
        with self._lock:
            return int(self._positions.max_position)

    def get_current_token_for_writer(self, instance: str) -> int:
        """The position of writer *instance* as this process knows it."""
        with self._lock:
            return int(self._positions.get_position(instance))

    def get_positions(self) -> dict[str, int]:
        """``{writer: position}`` as this process knows them."""
        with self._lock:
            return self._positions.positions()

    @property
    def in_flight(self) -> int:
        """How many of this writer's IDs are reserved and not completed."""
        with self._lock:
            return int(self._tracker.in_flight)

    def advance_writer(self, instance: str, position: int) -> bool:
        """Record that writer *instance* reached *position* (from replication).

        Returns True when it moved. For this process's own writer the position comes
        from its tracker and this call is ignored.
        """
        if instance == self.instance_name and self.is_writer:
            return False
        with self._lock:
            moved = bool(self._positions.advance(instance, position))
        if moved:
            self._wake_waiters()
        return moved

    def add_listener(self, listener: PositionListener) -> None:
        """Call *listener* whenever this writer's position advances."""
        self._listeners.append(listener)

    def remove_listener(self, listener: PositionListener) -> None:
        """Stop calling *listener*."""
        self._listeners.remove(listener)

    # -- reserving -------------------------------------------------------------------

    def _require_writer(self) -> None:
        if not self.is_writer:
            raise NotAWriterError(
                f"instance {self.instance_name!r} does not write stream {self.stream_name!r} "
                f"(writers: {', '.join(self.writers)})"
            )

    @abc.abstractmethod
    def _reserve(self, count: int) -> list[int]:
        """Reserve and track *count* IDs (in the tracker's increasing space)."""

    def _to_stream_id(self, tracked: int) -> int:
        return tracked * self._sign

    def _reserve_counted(self, count: int) -> list[int]:
        if self.write_guard is not None:
            self.write_guard()
        failure = self.listener_failure
        if failure is not None:
            raise ListenerFailedError(
                f"stream {self.stream_name}: a position listener failed ({type(failure).__name__}: "
                f"{failure}); the facts committed before it are in the database, and a restarted "
                "writer announces them") from failure
        tracked = self._reserve(count)
        if resources.ENABLED:
            resources.acquired("stream ID in flight", len(tracked))
        return tracked

    def _complete(self, tracked_ids: Sequence[int]) -> None:
        """Complete tracker IDs; report and publish what became visible."""
        if resources.ENABLED:
            resources.released("stream ID in flight", len(tracked_ids))
        with self._lock:
            if not self._tracker.complete_many(tracked_ids):
                return
            visible = self._tracker.last_visible()
            position = int(self._tracker.position)
            self._positions.advance(self.instance_name, position)
        self._on_advance(visible, position)

    def _on_advance(self, visible: list[int], position: int) -> None:
        for listener in list(self._listeners):
            try:
                listener(self.stream_name, self.instance_name, visible, position)
            except Exception as exc:
                # Never only logged: the next reservation raises it (ListenerFailedError).
                logger.exception("stream %s: position listener %r failed",
                                 self.stream_name, listener)
                if self.listener_failure is None:
                    self.listener_failure = exc
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        event, self._advanced = self._advanced, gevent.event.Event()
        event.set()

    @contextlib.contextmanager
    def get_next(self) -> Iterator[int]:
        """Reserve one stream ID for the block; it completes when the block exits.

        Open the transaction that writes the fact *inside* the block: by the time the
        block exits, whatever exception escapes, the transaction has committed or
        rolled back, and only then does the ID complete.
        """
        self._writing(None)
        tracked = self._reserve_counted(1)
        try:
            yield self._to_stream_id(tracked[0])
        finally:
            self._complete(tracked)

    @contextlib.contextmanager
    def get_next_mult(self, count: int) -> Iterator[list[int]]:
        """Reserve *count* stream IDs (ascending tokens) for the block."""
        self._writing(None)
        tracked = self._reserve_counted(count)
        try:
            yield [self._to_stream_id(t) for t in tracked]
        finally:
            self._complete(tracked)

    def _writing(self, txn: "Transaction | None") -> None:
        """Called before every reservation (*txn*: the transaction that will write
        the fact, when the caller has one open): what a generator must record before
        its first fact."""

    def get_next_txn(self, txn: "Transaction") -> int:
        """Reserve one stream ID completed when *txn* commits or rolls back."""
        self._writing(txn)
        tracked = self._reserve_counted(1)
        txn.call_on_finish(self._complete, tracked)
        return self._to_stream_id(tracked[0])

    def get_next_mult_txn(self, txn: "Transaction", count: int) -> list[int]:
        """Reserve *count* stream IDs completed when *txn* commits or rolls back."""
        self._writing(txn)
        tracked = self._reserve_counted(count)
        txn.call_on_finish(self._complete, tracked)
        return [self._to_stream_id(t) for t in tracked]

    # -- waiting ---------------------------------------------------------------------

    def _refresh_positions(self) -> None:
        """Learn other writers' positions from the database (multi-writer only)."""

    def wait_for_stream_position(self, instance: str, stream: str, position: int,
                                 timeout: float = 30.0, poll_interval: float = 0.2) -> bool:
        """Block (cooperatively, under gevent) until writer *instance* reaches *position*.

        Positions arrive from replication (:meth:`advance_writer`), from this
        writer's own completions, and every *poll_interval* seconds from the
        ``stream_positions`` table. Returns False (and logs) on timeout.
        """
        if stream != self.stream_name:
            raise ValueError(f"this generator serves stream {self.stream_name!r}, not {stream!r}")
        deadline = time.monotonic() + timeout
        next_poll = time.monotonic() + poll_interval
        while True:
            event = self._advanced
            if self.get_current_token_for_writer(instance) >= position:
                return True
            now = time.monotonic()
            if now >= deadline:
                logger.warning("timed out after %.1fs waiting for %s to reach %d on %s",
                               timeout, instance, position, stream)
                return False
            if now >= next_poll:
                self._refresh_positions()
                next_poll = now + poll_interval
                continue
            event.wait(min(deadline, next_poll) - now)
