"""The forward and backward extremities a batch moves in each room's DAG.

The extremity update itself runs in the ``extremities`` core: this module interns
the room's share of the batch into dense integers, tells the core which of them
are stored, forward extremities or have a counted child, and queues the rows the
core says to add and remove.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.events.batch import Batch
from streamrep.events.validation import EventRecord

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
    from streamrep._pure import extremities as _core_ext
else:
    _batchrows = _impl.load("batchrows")
    _core_ext = _impl.load("extremities")

__all__ = ["update_extremities"]


@dataclass
class _Interned:
    """One room's share of a batch as the extremity core takes it: batch event *k*
    has ID *k*; then come the prev_events outside the batch, then the room's
    current forward extremities."""

    names: list[str]
    ids: dict[str, int]
    batch_ids: "array[int]"
    batch_flags: bytes
    offsets: "array[int]"
    prev_ids: "array[int]"
    id_flags: bytearray


def _intern(non_outliers: list[EventRecord], forward: frozenset[str],
            stored: dict[str, bool]) -> _Interned:
    return _Interned(*_batchrows.intern_batch(non_outliers, forward, stored))


def _mark_counted_children(txn: Transaction, room_id: str, interned: _Interned,
                           counted: list[str]) -> None:
    """Flag those of *counted* (batch events that are backward extremities) that a
    stored counted event lists as a prev_event."""
    for chunk in chunks(counted):
        params: list[Any] = [room_id]
        for (event_id,) in txn.fetchall(
                "SELECT DISTINCT ee.prev_event_id FROM event_edges ee"
                " JOIN events e ON e.event_id = ee.event_id"
                " WHERE NOT e.outlier AND NOT e.rejected AND NOT e.soft_failed"
                " AND ee.room_id = ? AND " + in_list(txn, "ee.prev_event_id", chunk, params),
                params):
            interned.id_flags[interned.ids[event_id]] |= _core_ext.ID_HAS_COUNTED_CHILD


def update_extremities(batch: Batch, room_id: str, records: list[EventRecord],
                       stored: dict[str, bool],
                       backward: set[tuple[str, str]]) -> frozenset[str] | None:
    """Run the extremity core for one room's share of the batch and queue the
    changes on *writes*; return the room's new forward extremities, or None when
    they did not change and were cached.

    *stored* tells, for the batch's events and prev_events, which are stored and
    whether as outliers; *backward* holds the ``(room, event)`` backward extremities
    among the batch's events."""
    non_outliers = [r for r in records if not r.outlier]
    if not non_outliers:
        return None
    txn, writes, forward_cache = batch.txn, batch.writes, batch.caches.forward
    forward = forward_cache.get(room_id)
    if forward is None:
        forward = frozenset(e for (e,) in txn.fetchall(
            "SELECT event_id FROM event_forward_extremities WHERE room_id = ?", (room_id,)))
    interned = _intern(non_outliers, forward, stored)
    # Only batch events that are backward extremities can have a stored child.
    # (Usually none: then no pass over the batch.)
    backward_hits = {r.event_id for r in non_outliers
                     if (room_id, r.event_id) in backward} if backward else set()
    _mark_counted_children(txn, room_id, interned, sorted(
        r.event_id for r in non_outliers if r.event_id in backward_hits and r.counts)
        if backward_hits else [])
    f_add, f_rem, b_add, b_rem = _core_ext.update_extremities(
        interned.batch_ids, interned.batch_flags, interned.offsets, interned.prev_ids,
        bytes(interned.id_flags))
    names = interned.names
    if f_rem:
        writes.delete_in("event_forward_extremities", "event_id", [names[i] for i in f_rem],
                         room_id)
    if f_add:
        writes.insert("event_forward_extremities", "event_id, room_id",
                      [(names[i], room_id) for i in f_add])
    gone = [names[i] for i in b_rem if names[i] in backward_hits]
    if gone:
        writes.delete_in("event_backward_extremities", "event_id", gone, room_id)
    if b_add:
        writes.insert("event_backward_extremities", "event_id, room_id",
                      [(names[i], room_id) for i in b_add], " ON CONFLICT DO NOTHING")
    if f_add or f_rem or room_id not in forward_cache:
        return (forward - {names[i] for i in f_rem}) | {names[i] for i in f_add}
    return None
