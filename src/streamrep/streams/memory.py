"""Streams kept in one process's memory: ``typing``.

Typing notifications are short-lived: they are not stored in the database, only in
the writer's memory, with a bounded history for readers that fall behind (a reader
further behind than the history gets the current state of every room instead).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from streamrep.errors import DatabaseConfigError, StreamIdError
from streamrep.idgen.base import IdGenerator
from streamrep.idgen.tracking import CompletionTracker, WriterPositions
from streamrep.streams.definition import Stream, StreamDefinition, StreamRow


class MemoryIdGenerator(IdGenerator):
    """A single-writer generator starting at 0 with nothing stored."""

    def __init__(self, stream_name: str, instance_name: str, writer: str) -> None:
        super().__init__(stream_name, instance_name, [writer], False)
        self._tracker = CompletionTracker(0)
        self._positions = WriterPositions({writer: 0})

    def _reserve(self, count: int) -> list[int]:
        self._require_writer()
        with self._lock:
            first = int(self._tracker.reserve(count))
        return list(range(first, first + count))


@dataclass(frozen=True)
class _MemoryDefinition(StreamDefinition):
    history: int = 10_000

    def fetch_rows(self, txn: Any, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[StreamRow]:
        raise DatabaseConfigError(f"stream {self.name!r} is not stored in the database")


class InMemoryStream(Stream):
    """The ``typing`` stream: rows ``[room_id, [user_id, ...]]``, one per change."""

    Definition = _MemoryDefinition

    def __init__(self, definition: StreamDefinition, instance_name: str,
                 writers: Sequence[str]) -> None:
        if len(writers) != 1:
            raise DatabaseConfigError(
                f"stream {definition.name!r} lives in one process's memory: configure "
                f"exactly one writer, not {len(writers)}"
            )
        gen = MemoryIdGenerator(definition.name, instance_name, writers[0])
        super().__init__(definition, None, gen, writers)
        history = definition.history if isinstance(definition, _MemoryDefinition) else 10_000
        self._rows: deque[StreamRow] = deque(maxlen=history)
        self._rooms: dict[str, tuple[int, list[str]]] = {}
        self._lock = threading.Lock()

    def set_typing(self, room_id: str, user_ids: Sequence[str]) -> int:
        """Set who is typing in *room_id*; returns the new token."""
        users = sorted(set(user_ids))
        with self.id_gen.get_next() as token:
            with self._lock:
                self._rows.append((token, [room_id, users]))
                self._rooms[room_id] = (token, users)
        return token

    def typing_in(self, room_id: str) -> list[str]:
        """Who is typing in *room_id* now."""
        with self._lock:
            return list(self._rooms.get(room_id, (0, []))[1])

    def get_updates_since(self, instance: str, from_token: int, upto_token: int,
                          limit: int) -> tuple[list[StreamRow], bool]:
        """As :meth:`Stream.get_updates_since`, from memory. A reader older than the
        history gets each room's latest row instead (one per room, token order)."""
        if limit < 1:
            raise StreamIdError(f"limit must be at least 1, not {limit}")
        if upto_token <= from_token or instance not in self.writers:
            return [], False
        with self._lock:
            oldest = self._rows[0][0] if self._rows else upto_token + 1
            if from_token + 1 < oldest:
                source = sorted(((tok, [room, list(users)])
                                 for room, (tok, users) in self._rooms.items()
                                 if from_token < tok <= upto_token), key=lambda r: r[0])
            else:
                source = [(tok, [row[0], list(row[1])]) for tok, row in self._rows
                          if from_token < tok <= upto_token]
        if len(source) > limit:
            return source[:limit], True
        return source, False


__all__ = ["InMemoryStream", "MemoryIdGenerator"]
