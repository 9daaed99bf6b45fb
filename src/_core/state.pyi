"""Typed API of ``streamrep._core.state`` (same as ``streamrep._pure.state``)."""

from array import array
from typing import Any

__all__ = ["MAX_NAMED_GROUPS", "expand_groups"]

MAX_NAMED_GROUPS: int

def expand_groups(
    group_ids: Any,
    prev_ids: Any,
    delta_offsets: Any,
    delta_keys: Any,
    delta_events: Any,
    wanted: Any = None,
) -> tuple[array[int], array[int], array[int]]: ...
