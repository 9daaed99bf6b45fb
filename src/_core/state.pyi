"""Typed API of ``streamrep._core.state`` (same as ``streamrep._pure.state``)."""

from array import array
from typing import Any, Iterable, Mapping

__all__ = [
    "MAX_NAMED_GROUPS",
    "expand_groups",
    "digest_states",
    "digest_state",
    "EMPTY_STATE_DIGEST",
]

MAX_NAMED_GROUPS: int
EMPTY_STATE_DIGEST: str

def expand_groups(
    group_ids: Any,
    prev_ids: Any,
    delta_offsets: Any,
    delta_keys: Any,
    delta_events: Any,
    wanted: Any = None,
) -> tuple[array[int], array[int], array[int]]: ...
def digest_states(
    out_groups: Any,
    out_keys: Any,
    out_events: Any,
    key_stride: int,
    types: Any,
    state_keys: Any,
    event_ids: Any,
) -> tuple[array[int], bytes]: ...
def digest_state(
    state: Mapping[tuple[str, str], str] | Iterable[tuple[tuple[str, str], str]],
) -> str: ...
