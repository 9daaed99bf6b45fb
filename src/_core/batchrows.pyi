"""Typed API of streamrep._core.batchrows (same as streamrep._pure.batchrows)."""

from array import array
from typing import Any, Mapping, Sequence

__all__ = ["by_room", "event_rows", "flat_chunks", "in_prev_order", "intern_batch",
           "orderings_of", "share_groups"]

def by_room(records: list[Any]) -> dict[str, list[Any]]: ...
def orderings_of(records: Sequence[Any], streams: Sequence[int],
                 orderings: dict[str, tuple[int, int]]) -> dict[str, int]: ...
def in_prev_order(records: Sequence[Any]) -> bool: ...
def share_groups(records: Sequence[Any], start: int, event_groups: dict[str, int],
                 outside_groups: Mapping[str, int], visibility_at_group: Mapping[int, str],
                 visibility: dict[str, str], group_rows: list[tuple[str, int]]) -> int: ...
def intern_batch(non_outliers: Sequence[Any], forward: frozenset[str] | set[str],
                 stored: Mapping[str, bool]
                 ) -> tuple[list[str], dict[str, int], array[int], bytes, array[int], array[int],
                            bytearray]: ...
def event_rows(records: Sequence[Any], room_id: str, orderings: Mapping[str, int],
               redacted_now: set[str] | frozenset[str], visibility: Mapping[str, str],
               received_ts: int, sqlite: bool, events: list[tuple[Any, ...]],
               plain_events: list[tuple[Any, ...]], edges: list[tuple[str, str, str]],
               ) -> tuple[int, list[Any]]: ...
def flat_chunks(rows: Sequence[Sequence[Any]], start: int, end: int,
                size: int) -> list[list[Any]]: ...
