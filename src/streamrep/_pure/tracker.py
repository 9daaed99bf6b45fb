"""Stream ID completion tracking (pure-Python twin of ``streamrep._core.tracker``).

:class:`CompletionTracker` is the writer's side: IDs are reserved (tracked), complete
in any order (a rollback is a completion too), and the position advances only once
every smaller tracked ID has completed; each advance reports the IDs that became
visible, ascending. :class:`WriterPositions` is the reader's side: the position of
every writer of a stream, their minimum (the linear position) and their maximum.

Both work on increasing IDs; a stream whose IDs decrease (backfill) tracks their
negations.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Mapping

from streamrep.errors import NotAWriterError, StreamIdError

__all__ = ["CompletionTracker", "WriterPositions"]

# Compact the in-flight list once this many leading slots are dead.
_COMPACT_AT = 4096


class CompletionTracker:
    """Tracks one writer's reserved stream IDs and its current position."""

    __slots__ = ("_position", "_last_reserved", "_ids", "_head", "_done", "_in_flight",
                 "_visible")

    def __init__(self, position: int) -> None:
        self._position = int(position)
        self._last_reserved = self._position
        # Tracked IDs not yet visible, ascending, from index _head on.
        self._ids: list[int] = []
        self._head = 0
        # Of those, the ones already completed (waiting for a smaller ID).
        self._done: set[int] = set()
        self._in_flight = 0
        # The IDs the last completion call made visible, ascending.
        self._visible: list[int] = []

    @property
    def position(self) -> int:
        """Largest ID such that every tracked ID at or below it has completed."""
        return self._position

    @property
    def last_reserved(self) -> int:
        """The largest ID tracked so far (or the position, if larger)."""
        return self._last_reserved

    @property
    def in_flight(self) -> int:
        """How many tracked IDs have not completed yet."""
        return self._in_flight

    @property
    def first_in_flight(self) -> int | None:
        """The smallest tracked ID that has not completed, or None."""
        return self._ids[self._head] if self._head < len(self._ids) else None

    def is_in_flight(self, stream_id: int) -> bool:
        """True when *stream_id* is tracked and not completed."""
        ids = self._ids
        i = bisect_left(ids, stream_id, self._head)
        return i < len(ids) and ids[i] == stream_id and stream_id not in self._done

    def track(self, stream_id: int, /) -> None:
        """Record that *stream_id* (reserved elsewhere, e.g. by a sequence) is in flight."""
        stream_id = int(stream_id)
        if stream_id <= self._position:
            raise StreamIdError(
                f"stream ID {stream_id} is not ahead of the position {self._position}"
            )
        ids = self._ids
        if stream_id > self._last_reserved:
            ids.append(stream_id)
            self._last_reserved = stream_id
        else:
            i = bisect_left(ids, stream_id, self._head)
            if i < len(ids) and ids[i] == stream_id:
                raise StreamIdError(f"stream ID {stream_id} is already tracked")
            ids.insert(i, stream_id)
        self._in_flight += 1

    def track_range(self, first: int, count: int) -> None:
        """Track the *count* consecutive IDs starting at *first*."""
        if count < 0:
            raise StreamIdError(f"cannot track {count} stream IDs")
        first = int(first)
        if count and first > self._last_reserved and first > self._position:
            self._ids.extend(range(first, first + count))
            self._last_reserved = first + count - 1
            self._in_flight += count
            return
        for stream_id in range(first, first + count):
            self.track(stream_id)

    def reserve(self, count: int = 1) -> int:
        """Track the next *count* IDs after :attr:`last_reserved`; return the first."""
        if count < 1:
            raise StreamIdError(f"cannot reserve {count} stream IDs")
        first = self._last_reserved + 1
        self.track_range(first, count)
        return first

    def _complete_one(self, stream_id: int, visible: list[int]) -> None:
        """Complete *stream_id*, appending the IDs it makes visible to *visible*."""
        ids = self._ids
        head = self._head
        if head < len(ids) and ids[head] == stream_id:
            self._in_flight -= 1
            visible.append(stream_id)
            head += 1
            done = self._done
            if done:
                end = len(ids)
                while head < end and ids[head] in done:
                    next_id = ids[head]
                    done.discard(next_id)
                    visible.append(next_id)
                    head += 1
            self._position = visible[-1]
            if head == len(ids):
                ids.clear()
                head = 0
            elif head >= _COMPACT_AT:
                del ids[:head]
                head = 0
            self._head = head
            return
        i = bisect_left(ids, stream_id, head)
        if i >= len(ids) or ids[i] != stream_id or stream_id in self._done:
            raise StreamIdError(f"stream ID {stream_id} is not in flight")
        self._done.add(stream_id)
        self._in_flight -= 1

    def complete(self, stream_id: int, /) -> int:
        """Mark *stream_id* completed; return how many IDs became visible (0 while a
        smaller tracked ID is in flight). :meth:`last_visible` lists them."""
        visible: list[int] = []
        self._visible = visible
        self._complete_one(stream_id, visible)
        return len(visible)

    def complete_many(self, stream_ids: Iterable[int]) -> int:
        """Complete each of *stream_ids*; return how many IDs became visible.

        If one of them is not in flight, :class:`StreamIdError` is raised after the
        ones before it completed; its ``visible`` attribute lists what they made
        visible.
        """
        visible: list[int] = []
        self._visible = visible
        try:
            for stream_id in stream_ids:
                self._complete_one(stream_id, visible)
        except StreamIdError as exc:
            exc.visible = list(visible)  # type: ignore[attr-defined]
            raise
        return len(visible)

    def last_visible(self) -> list[int]:
        """The IDs the last :meth:`complete` or :meth:`complete_many` call made
        visible, ascending (a new list)."""
        return list(self._visible)

    def advance_to(self, stream_id: int) -> int:
        """Move the position forward to *stream_id* over IDs this writer never tracked.

        The position stops short of the first ID still in flight, so it never passes
        an incomplete ID. Returns the new position. A writer with nothing in flight
        uses this to catch up with the stream (e.g. the sequence's current value), so
        readers' linear position is not held back by an idle writer.
        """
        stream_id = int(stream_id)
        first = self.first_in_flight
        if first is not None and stream_id >= first:
            stream_id = first - 1
        if stream_id > self._position:
            self._position = stream_id
            if stream_id > self._last_reserved:
                self._last_reserved = stream_id
        return self._position

    def __repr__(self) -> str:
        return (f"<CompletionTracker position={self._position} in_flight={self._in_flight} "
                f"last_reserved={self._last_reserved}>")


class WriterPositions:
    """A reader's view of a stream: the position of each of its writers.

    Positions only move forward. ``linear_position`` is the minimum over the writers
    (every fact at or below it, from any writer, has completed); ``max_position`` the
    maximum. Together they are the range of current stream IDs.
    """

    __slots__ = ("_positions",)

    def __init__(self, positions: Mapping[str, int]) -> None:
        if not positions:
            raise NotAWriterError("a stream needs at least one writer")
        self._positions: dict[str, int] = {str(k): int(v) for k, v in positions.items()}

    @property
    def writers(self) -> list[str]:
        """The writer instances, sorted."""
        return sorted(self._positions)

    def positions(self) -> dict[str, int]:
        """A copy of ``{writer: position}``."""
        return dict(self._positions)

    def get_position(self, instance: str) -> int:
        """The position of writer *instance*."""
        try:
            return self._positions[instance]
        except KeyError:
            raise NotAWriterError(f"{instance!r} is not a writer of this stream") from None

    def advance(self, instance: str, position: int) -> bool:
        """Move *instance*'s position forward to *position*; True if it moved.

        Older (smaller) positions are ignored: messages may arrive late.
        """
        current = self.get_position(instance)
        position = int(position)
        if position > current:
            self._positions[instance] = position
            return True
        return False

    def apply_position(self, instance: str, prev_token: int, new_token: int) -> int | None:
        """Apply a ``POSITION`` (the writer had nothing in flight between *prev_token*
        and *new_token*).

        If this reader already holds everything up to *prev_token*, the writer's
        position jumps to *new_token* and None is returned. Otherwise facts in
        ``(position, prev_token]`` were missed: the position is left alone and the
        token to catch up from is returned; fetch those rows, then :meth:`advance`
        to *new_token*.
        """
        current = self.get_position(instance)
        if current < prev_token:
            return current
        self.advance(instance, new_token)
        return None

    def add_writer(self, instance: str, position: int) -> None:
        """Start following a new writer from *position* (no-op if already known)."""
        self._positions.setdefault(str(instance), int(position))

    @property
    def linear_position(self) -> int:
        """Largest ID at or below which every writer's facts have completed."""
        return min(self._positions.values())

    @property
    def max_position(self) -> int:
        """The furthest position of any writer."""
        return max(self._positions.values())

    def __repr__(self) -> str:
        return f"<WriterPositions {self._positions!r}>"
