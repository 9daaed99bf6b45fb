"""Typed API of ``streamrep._core.compress`` (same as ``streamrep._pure.compress``)."""

from array import array
from typing import Any

__all__ = ["DEFAULT_MAX_DEPTH", "DEFAULT_CANDIDATES", "plan_compression", "level_radices"]

DEFAULT_MAX_DEPTH: int
DEFAULT_CANDIDATES: int

def level_radices(height: int, max_depth: int) -> list[list[int]]: ...
def plan_compression(
    parents: Any,
    rooms: Any,
    full_offsets: Any,
    full_keys: Any,
    full_events: Any,
    fixed: Any = None,
    max_depth: int = 100,
    candidates: int = 16,
) -> tuple[array[int], array[int], array[int], array[int], array[int]]: ...
