"""Streams held in memory: a complete :class:`~streamrep.replication.sources.StreamSource`
for streams that are never persisted, and for embedding without a database."""

from __future__ import annotations

import bisect
from typing import Any, Sequence

import orjson

__all__ = ["MemorySource"]


class MemorySource:
    """Streams held in memory: a complete :class:`StreamSource`.

    ``append(stream, instance, token, rows)`` records one fact; tokens of one
    writer must increase.
    """

    def __init__(self, streams: Sequence[str] = ()) -> None:
        self._tokens: dict[tuple[str, str], list[int]] = {}
        self._rows: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        self._positions: dict[tuple[str, str], int] = {}
        self._streams: dict[str, None] = dict.fromkeys(streams)

    def append(self, stream: str, instance: str, token: int, rows: Sequence[Any]) -> None:
        key = (stream, instance)
        if token <= self._positions.get(key, 0):
            raise ValueError(f"token {token} is not past {instance}'s position on {stream}")
        self._streams.setdefault(stream, None)
        tokens = self._tokens.setdefault(key, [])
        stored = self._rows.setdefault(key, [])
        for row in rows:
            tokens.append(token)
            stored.append((token, orjson.dumps(row)))
        self._positions[key] = token

    def advance(self, stream: str, instance: str, token: int) -> None:
        """Move a writer's position without rows (e.g. a rolled-back fact)."""
        key = (stream, instance)
        self._streams.setdefault(stream, None)
        self._positions[key] = max(token, self._positions.get(key, 0))

    def stream_names(self) -> Sequence[str]:
        return list(self._streams)

    def writers(self, stream: str, after: int | None = None) -> Sequence[str]:
        return [inst for (s, inst), token in self._positions.items()
                if s == stream and (after is None or token > after)]

    def current_token(self, stream: str, instance: str) -> int:
        return self._positions.get((stream, instance), 0)

    def stored_token(self, stream: str, instance: str) -> int:
        tokens = self._tokens.get((stream, instance))
        return tokens[-1] if tokens else 0

    def updates(
        self, stream: str, instance: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], bool]:
        key = (stream, instance)
        tokens = self._tokens.get(key, [])
        rows = self._rows.get(key, [])
        lo = bisect.bisect_right(tokens, from_token)
        hi = bisect.bisect_right(tokens, upto_token)
        if hi - lo > limit:
            end = lo + limit
            while end < hi and tokens[end] == tokens[end - 1]:
                end += 1  # never split a fact
            return rows[lo:end], end < hi
        return rows[lo:hi], False
