"""Stream change cache (pure twin): when did an entity last change?

Keeps, for each entity (a room ID, a user ID), the stream position of its last
change, plus a position log in stream order so that the oldest entries can be
evicted once more than ``max_size`` entities are tracked. Questions about
positions older than the oldest evicted change (``earliest_known_position``) get
the safe answer "may have changed".
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Collection, Hashable

__all__ = ["StreamChangeCache"]


class StreamChangeCache:
    """Per-entity last-change positions, answering "changed since X?" in memory.

    ``current_position`` is the position up to which the cache has seen every
    change; nothing changed in ``(earliest_known_position, current_position]``
    unless recorded here.
    """

    def __init__(self, name: str, current_position: int, max_size: int = 10000) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.name = name
        self.max_size = max_size
        self._earliest = current_position
        self._current = current_position
        self._last: dict[Hashable, int] = {}
        self._positions: list[int] = []
        self._entities: list[Hashable] = []
        self._head = 0

    @property
    def earliest_known_position(self) -> int:
        """Changes at or before this position may be missing from the cache."""
        return self._earliest

    @property
    def current_position(self) -> int:
        """The highest position recorded (or the starting position)."""
        return self._current

    def __len__(self) -> int:
        return len(self._last)

    def entity_has_changed(self, entity: Hashable, position: int) -> None:
        """Record that *entity* changed at stream *position*."""
        if position <= self._earliest:
            return
        old = self._last.get(entity)
        if old is not None and old >= position:
            return
        self._last[entity] = position
        if not self._positions or position >= self._positions[-1]:
            self._positions.append(position)
            self._entities.append(entity)
        else:
            idx = bisect_right(self._positions, position, self._head)
            self._positions.insert(idx, position)
            self._entities.insert(idx, entity)
        if position > self._current:
            self._current = position
        self._evict()

    def _evict(self) -> None:
        while len(self._last) > self.max_size:
            pos = self._positions[self._head]
            entity = self._entities[self._head]
            self._head += 1
            if self._last.get(entity) == pos:
                del self._last[entity]
            self._earliest = max(self._earliest, pos)
        # Drop evicted and superseded log entries now and then, not on every call.
        if self._head > 64 and self._head * 2 > len(self._positions):
            self._positions = self._positions[self._head:]
            self._entities = self._entities[self._head:]
            self._head = 0

    def has_entity_changed(self, entity: Hashable, position: int) -> bool:
        """True when *entity* may have changed after *position*."""
        if position < self._earliest:
            return True
        last = self._last.get(entity)
        return last is not None and last > position

    def get_entities_changed(self, entities: Collection[Hashable], position: int) -> set[Hashable]:
        """The subset of *entities* that may have changed after *position*."""
        if position < self._earliest:
            return set(entities)
        last = self._last
        return {e for e in entities if last.get(e, position) > position}

    def get_all_entities_changed(self, position: int) -> list[Hashable] | None:
        """Every entity changed after *position*, in order of their last change,
        or None when the cache cannot tell (``position`` is too old)."""
        if position < self._earliest:
            return None
        start = bisect_right(self._positions, position, self._head)
        out: list[Hashable] = []
        last = self._last
        for k in range(start, len(self._positions)):
            entity = self._entities[k]
            if last.get(entity) == self._positions[k]:
                out.append(entity)
        return out

    def get_max_pos_of_last_change(self, entity: Hashable) -> int:
        """The position of *entity*'s last change, or the earliest known position."""
        return self._last.get(entity, self._earliest)

    def prefill(self, changes: Collection[tuple[Hashable, int]]) -> None:
        """Record many ``(entity, position)`` changes (any order)."""
        for entity, position in sorted(changes, key=lambda c: c[1]):
            self.entity_has_changed(entity, position)
