"""Typed API of streamrep._core.extremities (same as streamrep._pure.extremities)."""

from array import array
from typing import Any

__all__ = [
    "BATCH_NON_OUTLIER",
    "BATCH_COUNTED",
    "ID_STORED_NON_OUTLIER",
    "ID_HAS_COUNTED_CHILD",
    "ID_FORWARD",
    "update_extremities",
]

BATCH_NON_OUTLIER: int
BATCH_COUNTED: int
ID_STORED_NON_OUTLIER: int
ID_HAS_COUNTED_CHILD: int
ID_FORWARD: int

def update_extremities(
    batch_ids: Any,
    batch_flags: Any,
    prev_offsets: Any,
    prev_ids: Any,
    id_flags: Any,
) -> tuple[array[int], array[int], array[int], array[int]]: ...
