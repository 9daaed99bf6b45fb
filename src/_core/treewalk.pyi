"""Typed API of ``streamrep._core.treewalk`` (same as ``streamrep._pure.treewalk``)."""

from array import array
from typing import Any, Iterable, Mapping

__all__ = [
    "DIGEST_VERSION",
    "EMPTY_STATE_DIGEST",
    "digest_state",
    "digest_groups",
    "StateWalk",
    "plan_compression",
    "rows_hash",
    "group_rows_hashes",
    "StringInterner",
]

DIGEST_VERSION: int
EMPTY_STATE_DIGEST: str

def digest_state(
    state: Mapping[tuple[str, str], str] | Iterable[tuple[tuple[str, str], str]],
) -> str: ...
def digest_groups(
    parents: Any,
    delta_offsets: Any,
    delta_keys: Any,
    delta_events: Any,
    wanted: Any,
    key_stride: int,
    types: Any,
    state_keys: Any,
    event_ids: Any,
) -> tuple[array[int], bytes]: ...

class StateWalk:
    def __init__(
        self,
        parents: Any,
        delta_offsets: Any,
        delta_keys: Any,
        delta_events: Any,
        wanted: Any = None,
    ) -> None: ...
    def next_states(self, max_rows: int) -> tuple[array[int], array[int], array[int]]: ...

def plan_compression(
    parents: Any,
    rooms: Any,
    delta_offsets: Any,
    delta_keys: Any,
    delta_events: Any,
    fixed: Any = None,
    max_depth: int = 100,
    candidates: int = 16,
) -> tuple[array[int], array[int], array[int], array[int], array[int]]: ...
def rows_hash(rows: Iterable[tuple[str, str, str]]) -> int: ...
def group_rows_hashes(
    delta_offsets: Any,
    delta_keys: Any,
    delta_events: Any,
    key_stride: int,
    types: Any,
    state_keys: Any,
    event_ids: Any,
) -> array[int]: ...

class StringInterner:
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def intern(self, offsets: Any, data: Any) -> array[int]: ...
    def table(self) -> tuple[bytes, bytes]: ...
