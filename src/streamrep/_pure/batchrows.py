"""The per-event passes of persisting a batch (pure twin of ``streamrep._core.batchrows``).

The event store persists a batch of validated records (``eventrecord``) in a few
passes over them; the ones made of per-event work with no query in them live here:

* :func:`by_room` - the records of each room (a batch is mostly of one room);
* :func:`orderings_of` - each new event's stream ordering, and its depth with it;
* :func:`in_prev_order` - whether the batch already lists each event after the
  batch events it cites as prev events (the usual case: nothing to sort);
* :func:`share_groups` - the usual state group assignment: an event that changes
  no state shares the group of its one prev event;
* :func:`intern_batch` - one room's share of the batch as the extremity core
  takes it (``extremities``: event IDs as dense integers, and flags);
* :func:`event_rows` - the rows of ``events`` and ``event_edges``;
* :func:`flat_chunks` - rows as the parameters of multi-row SQLite inserts.

They read the records' attributes only, so any object with those works.
"""

from __future__ import annotations

from array import array
from typing import Any, Mapping, Sequence

from streamrep._pure.extremities import (BATCH_COUNTED, BATCH_NON_OUTLIER, ID_FORWARD,
                                         ID_STORED_NON_OUTLIER)

__all__ = ["by_room", "event_rows", "flat_chunks", "in_prev_order", "intern_batch",
           "orderings_of", "share_groups"]

#: What :func:`intern_batch` returns: names, ids, batch_ids, batch_flags, prev_offsets,
#: prev_ids, id_flags.
Interned = tuple[list[str], dict[str, int], "array[int]", bytes, "array[int]", "array[int]",
                 bytearray]


def by_room(records: list[Any]) -> dict[str, list[Any]]:
    """*records* by ``room_id``, in the order given; a batch of one room gives
    *records* itself."""
    if not records:
        return {}
    first = records[0].room_id
    if all(r.room_id == first for r in records):
        return {first: records}
    rooms: dict[str, list[Any]] = {}
    for record in records:
        rooms.setdefault(record.room_id, []).append(record)
    return rooms


def orderings_of(records: Sequence[Any], streams: Sequence[int],
                 orderings: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Each record's stream ordering (``streams`` in the records' order), by event
    ID; *orderings* gets each one's ``(depth, stream ordering)`` too."""
    if len(streams) != len(records):
        raise ValueError(f"{len(streams)} stream orderings for {len(records)} records")
    event_orderings = {}
    for record, stream in zip(records, streams):
        event_orderings[record.event_id] = stream
        orderings[record.event_id] = (record.depth, stream)
    return event_orderings


def in_prev_order(records: Sequence[Any]) -> bool:
    """True when every record comes after each record of *records* it lists as a
    prev event (and none lists itself)."""
    position = {r.event_id: i for i, r in enumerate(records)}
    return all(position.get(p, -1) < i for i, r in enumerate(records) for p in r.prev_events)


def share_groups(records: Sequence[Any], start: int, event_groups: dict[str, int],
                 outside_groups: Mapping[str, int], visibility_at_group: Mapping[int, str],
                 visibility: dict[str, str], group_rows: list[tuple[str, int]]) -> int:
    """Assign groups from ``records[start]`` on while the usual case holds, and
    return the index of the first record it does not (``len(records)`` for none).

    The usual case: the record changes no state (no state key, or rejected), lists
    one prev event, that event's group is known (*event_groups*, the batch's, then
    *outside_groups*) and so is the history visibility at that group
    (*visibility_at_group*). The record then gets that group in *event_groups*, a
    ``(event ID, group)`` row in *group_rows* and that visibility in *visibility*.
    """
    if start < 0:
        raise ValueError(f"start must not be negative, not {start}")
    for i in range(start, len(records)):
        record = records[i]
        prev_events = record.prev_events
        if len(prev_events) != 1 or not (record.state_key is None or record.rejected):
            return i
        group = event_groups.get(prev_events[0])
        if group is None:
            group = outside_groups.get(prev_events[0])
            if group is None:
                return i
        known = visibility_at_group.get(group)
        if known is None:
            return i
        event_id = record.event_id
        visibility[event_id] = known
        event_groups[event_id] = group
        group_rows.append((event_id, group))
    return len(records)


def intern_batch(non_outliers: Sequence[Any], forward: frozenset[str] | set[str],
                 stored: Mapping[str, bool]) -> Interned:
    """Number the event IDs of one room's non-outlier records (*non_outliers*), of the
    prev events they list and of the room's forward extremities (*forward*), in that
    order, each ID once; the extremity core's ``update_extremities`` takes the result.

    Returns ``(names, ids, batch_ids, batch_flags, prev_offsets, prev_ids,
    id_flags)``: the IDs by number and the numbers by ID; each record's number
    (int64) and flags (``BATCH_NON_OUTLIER``, plus ``BATCH_COUNTED`` unless rejected
    or soft-failed); the numbers of its prev events, in ``prev_ids`` from
    ``prev_offsets[k]`` to ``prev_offsets[k + 1]`` (int64); and per number,
    ``ID_FORWARD`` for a forward extremity and ``ID_STORED_NON_OUTLIER`` for a prev
    event outside the batch that *stored* says is stored as a non-outlier (False).
    """
    ids: dict[str, int] = {}
    names: list[str] = []
    for record in non_outliers:
        if record.event_id not in ids:  # the same event twice: the first number
            ids[record.event_id] = len(names)
            names.append(record.event_id)
    n_batch = len(names)
    counted = BATCH_NON_OUTLIER | BATCH_COUNTED
    batch_ids = array("q", [ids[r.event_id] for r in non_outliers])
    batch_flags = bytes([counted if not (r.rejected or r.soft_failed) else BATCH_NON_OUTLIER
                         for r in non_outliers])
    prev_offsets = array("q", [0])
    prev_list: list[int] = []
    for record in non_outliers:
        for prev in record.prev_events:
            number = ids.setdefault(prev, len(names))
            if number == len(names):
                names.append(prev)
            prev_list.append(number)
        prev_offsets.append(len(prev_list))
    n_known = len(names)
    for event_id in forward:
        if ids.setdefault(event_id, len(names)) == len(names):
            names.append(event_id)
    id_flags = bytearray(len(names))
    for event_id in forward:
        id_flags[ids[event_id]] |= ID_FORWARD
    for number in range(n_batch, n_known):
        if stored.get(names[number]) is False:
            id_flags[number] |= ID_STORED_NON_OUTLIER
    return names, ids, batch_ids, batch_flags, prev_offsets, array("q", prev_list), id_flags


def event_rows(records: Sequence[Any], room_id: str, orderings: Mapping[str, int],
               redacted_now: set[str] | frozenset[str], visibility: Mapping[str, str],
               received_ts: int, sqlite: bool, events: list[tuple[Any, ...]],
               plain_events: list[tuple[Any, ...]], edges: list[tuple[str, str, str]],
               ) -> tuple[int, list[Any]]:
    """Append the ``events`` and ``event_edges`` rows of one room's *records*;
    return the highest stream ordering among them (0 for none) and the membership
    records (their ``room_memberships`` rows are the caller's).

    An ``events`` row holds, in order: stream ordering, depth, event ID, room ID,
    type, state key, sender, the outlier, rejected, soft-failed and redacted flags
    (0 or 1; redacted: in *redacted_now*), redacts, relates_to, membership, history
    visibility (from *visibility*), *received_ts* and the JSON. With *sqlite*, the
    JSON is a ``bytearray`` (which the sqlite3 module binds without looking up an
    adapter), and a record with no state key, redaction, relation or membership
    goes to *plain_events* without those four columns (binding None costs the
    sqlite3 module an adapter lookup too). Non-outliers get one edge row
    ``(event ID, prev event, room ID)`` per prev event.
    """
    blob = bytearray if sqlite else bytes
    add_plain, add_event, add_edge = plain_events.append, events.append, edges.append
    members = []
    room_max = 0
    for record in records:
        event_id = record.event_id
        stream = orderings[event_id]
        if stream > room_max:
            room_max = stream
        if (sqlite and record.state_key is None and record.redacts is None
                and record.relates_to is None and record.membership is None):
            add_plain((
                stream, record.depth, event_id, room_id, record.type, record.sender,
                int(record.outlier), int(record.rejected), int(record.soft_failed),
                int(event_id in redacted_now), visibility.get(event_id), received_ts,
                blob(record.json)))
        else:
            add_event((
                stream, record.depth, event_id, room_id, record.type, record.state_key,
                record.sender, int(record.outlier), int(record.rejected),
                int(record.soft_failed), int(event_id in redacted_now), record.redacts,
                record.relates_to, record.membership, visibility.get(event_id),
                received_ts, blob(record.json)))
        if not record.outlier:
            for prev in record.prev_events:
                add_edge((event_id, prev, room_id))
        if record.membership is not None and record.state_key is not None:
            members.append(record)
    return room_max, members


def flat_chunks(rows: Sequence[Sequence[Any]], start: int, end: int,
                size: int) -> list[list[Any]]:
    """The values of ``rows[start:end]`` in lists of *size* rows each, row after row
    in each list: the parameters of an ``INSERT`` of *size* rows, once per statement
    (``end - start`` must be a multiple of *size*)."""
    if size < 1 or (end - start) % size:
        raise ValueError(f"{end - start} rows do not make statements of {size}")
    out: list[list[Any]] = []
    if end <= start:
        return out
    width = len(rows[start])
    for first in range(start, end, size):
        values: list[Any] = []
        add = values.extend  # a row at a time: faster than chain.from_iterable
        for i in range(first, first + size):
            add(rows[i])
        if len(values) != size * width:
            raise ValueError(f"rows {first} to {first + size - 1} are not all of {width} values")
        out.append(values)
    return out
