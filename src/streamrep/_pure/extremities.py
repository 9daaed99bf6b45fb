"""Forward and backward extremity upkeep for one batch of events (pure twin).

The caller interns every event ID it mentions (the batch, the batch's
prev_events and the room's current forward extremities) into dense integers
``0..n_ids-1`` and describes what the database already knows about each of them
in ``id_flags``; this module then decides which rows of
``event_forward_extremities`` and ``event_backward_extremities`` to add and
remove. It never sees the rest of the room.

Definitions (see docs/events.md):

* an event *counts* for forward extremities when it is not an outlier, not
  rejected and not soft-failed;
* the forward extremities are the counted events that no counted event lists in
  its prev_events;
* the backward extremities are the prev_events of non-outlier events that are not
  themselves stored as non-outliers.
"""

from __future__ import annotations

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

#: ``batch_flags`` bit: the batch event is persisted as a non-outlier.
BATCH_NON_OUTLIER = 1
#: ``batch_flags`` bit: the batch event counts (non-outlier, not rejected, not soft-failed).
BATCH_COUNTED = 2

#: ``id_flags`` bit: the event is already stored as a non-outlier.
ID_STORED_NON_OUTLIER = 1
#: ``id_flags`` bit: a stored counted event already lists this event as a prev_event.
ID_HAS_COUNTED_CHILD = 2
#: ``id_flags`` bit: the event is currently a forward extremity of the room.
ID_FORWARD = 4


_INT64_FORMATS = frozenset({"q", "l", "<q", "<l", "=q", "=l", "@q", "@l"})
_UINT8_FORMATS = frozenset({"B", "<B", "=B", "@B", "c"})


def _int64s(obj: Any, name: str) -> Any:
    view = memoryview(obj)
    if view.format not in _INT64_FORMATS or view.itemsize != 8 or view.ndim != 1:
        raise ValueError(f"{name}: buffer dtype mismatch, expected int64, got {view.format!r}")
    return view.cast("B").cast("q")


def _uint8s(obj: Any, name: str) -> Any:
    view = memoryview(obj)
    if view.format not in _UINT8_FORMATS or view.itemsize != 1 or view.ndim != 1:
        raise ValueError(f"{name}: buffer dtype mismatch, expected uint8, got {view.format!r}")
    return view.cast("B")


def _check(n: int, batch_flags: Any, prev_offsets: Any, prev_ids: Any, n_ids: int,
           batch_ids: Any) -> None:
    if len(batch_flags) != n:
        raise ValueError("batch_flags must have one entry per batch event")
    if len(prev_offsets) != n + 1:
        raise ValueError("prev_offsets must have len(batch_ids) + 1 entries")
    if prev_offsets[0] != 0 or prev_offsets[n] != len(prev_ids):
        raise ValueError("prev_offsets must start at 0 and end at len(prev_ids)")
    for i in range(n):
        if prev_offsets[i] > prev_offsets[i + 1]:
            raise ValueError("prev_offsets must not decrease")
        if not 0 <= batch_ids[i] < n_ids:
            raise ValueError(f"batch id {batch_ids[i]} outside 0..{n_ids - 1}")
    for p in prev_ids:
        if not 0 <= p < n_ids:
            raise ValueError(f"prev id {p} outside 0..{n_ids - 1}")


def update_extremities(
    batch_ids: Any,
    batch_flags: Any,
    prev_offsets: Any,
    prev_ids: Any,
    id_flags: Any,
) -> tuple[array[int], array[int], array[int], array[int]]:
    """Compute the extremity changes a batch makes.

    ``batch_ids`` (int64, one per batch event, distinct), ``batch_flags`` (uint8,
    ``BATCH_*`` bits), ``prev_offsets``/``prev_ids`` (int64 CSR: the prev_events of
    batch event ``i`` are ``prev_ids[prev_offsets[i]:prev_offsets[i+1]]``) and
    ``id_flags`` (uint8 per interned ID, ``ID_*`` bits, length ``n_ids``).

    Returns ``(forward_added, forward_removed, backward_added, backward_removed)``
    as ``array('q')`` of interned IDs, each without duplicates, in order of first
    mention. Raises :class:`ValueError` for inconsistent buffers.
    """
    batch_ids = _int64s(batch_ids, "batch_ids")
    batch_flags = _uint8s(batch_flags, "batch_flags")
    prev_offsets = _int64s(prev_offsets, "prev_offsets")
    prev_ids = _int64s(prev_ids, "prev_ids")
    id_flags = _uint8s(id_flags, "id_flags")
    n = len(batch_ids)
    n_ids = len(id_flags)
    _check(n, batch_flags, prev_offsets, prev_ids, n_ids, batch_ids)

    # mark bits: 1 = referenced by a counted batch event, 2 = non-outlier in the
    # batch, 4 = already emitted as a backward extremity, 8 = already removed.
    mark = bytearray(n_ids)
    for i in range(n):
        flags = batch_flags[i]
        if flags & BATCH_NON_OUTLIER:
            mark[batch_ids[i]] |= 2
        if flags & BATCH_COUNTED:
            for j in range(prev_offsets[i], prev_offsets[i + 1]):
                mark[prev_ids[j]] |= 1

    forward_added: array[int] = array("q")
    forward_removed: array[int] = array("q")
    backward_added: array[int] = array("q")
    backward_removed: array[int] = array("q")

    for i in range(n):
        eid = batch_ids[i]
        flags = batch_flags[i]
        if (flags & BATCH_COUNTED and not mark[eid] & 1
                and not id_flags[eid] & (ID_HAS_COUNTED_CHILD | ID_FORWARD)):
            forward_added.append(eid)
        if flags & BATCH_NON_OUTLIER:
            backward_removed.append(eid)
            for j in range(prev_offsets[i], prev_offsets[i + 1]):
                p = prev_ids[j]
                if (mark[p] & 6) == 0 and not id_flags[p] & ID_STORED_NON_OUTLIER:
                    mark[p] |= 4
                    backward_added.append(p)
        if flags & BATCH_COUNTED:
            for j in range(prev_offsets[i], prev_offsets[i + 1]):
                p = prev_ids[j]
                if id_flags[p] & ID_FORWARD and not mark[p] & 8:
                    mark[p] |= 8
                    forward_removed.append(p)
    return forward_added, forward_removed, backward_added, backward_removed
