"""What a batch leaves to write: the first step of persisting it.

:func:`plan_batch` looks the batch up in one query per chunk (:class:`BatchLookup`:
which of its events and prev events are stored, and how; which redactions and
backward extremities name them), keeps the events not stored yet and those stored as
outliers that now join the DAG (de-outliered), and orders them so that each comes
after the batch events it lists as prev events.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import orjson

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.db.inlists import SQLITE_JSON, chunks, in_list, json_values
from streamrep.events.validation import EventRecord

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
else:
    _batchrows = _impl.load("batchrows")

__all__ = ["BatchLookup", "BatchPlan", "plan_batch", "topological_sort"]


@dataclass
class BatchLookup:
    """What the tables say about a batch, from one query."""

    #: the batch's events and prev_events that are stored -> stored as an outlier?
    stored: dict[str, bool] = field(default_factory=dict)
    #: the bytes first received for stored outliers: a de-outliered event keeps them
    outlier_json: dict[str, bytes] = field(default_factory=dict)
    #: ``(event, room)`` of the batch's events that a stored redaction targets
    redaction_targets: set[tuple[str, str]] = field(default_factory=set)
    #: ``(room, event)`` of the batch's events that are backward extremities
    backward: set[tuple[str, str]] = field(default_factory=set)
    #: how many of the batch's own events are stored (usually none)
    batch_stored: int = 0

    @classmethod
    def query(cls, txn: Transaction, records: list[EventRecord]) -> "BatchLookup":
        """Look up *records* (and their prev_events) in one statement per chunk."""
        found = cls()
        record_ids = {r.event_id: r for r in records}
        extra_prevs = sorted({p for r in records if not r.outlier for p in r.prev_events
                              if p not in record_ids})
        for chunk in chunks([*record_ids, *extra_prevs]):
            params: list[Any] = []
            sql = _lookup_sql(txn, record_ids, chunk, params)
            for kind, event_id, outlier, room_id, raw in txn.fetchall(sql, params):
                if kind == 0:
                    found.stored[event_id] = bool(outlier)
                    if event_id in record_ids:
                        found.batch_stored += 1
                        if raw is not None:
                            found.outlier_json[event_id] = bytes(raw)
                elif kind == 1:
                    found.redaction_targets.add((event_id, room_id))
                else:
                    found.backward.add((room_id, event_id))
        return found


def _lookup_sql(txn: Transaction, record_ids: dict[str, EventRecord], chunk: Sequence[str],
                params: list[Any]) -> str:
    """The lookup of one chunk: stored events (kind 0), redactions aimed at the
    batch's events (1), the batch's events that are backward extremities (2)."""
    batch_chunk = [e for e in chunk if e in record_ids]
    by_room = _batchrows.by_room([record_ids[e] for e in batch_chunk
                                  if not record_ids[e].outlier])
    if not txn.is_postgres and SQLITE_JSON:
        return _sqlite_lookup_sql(chunk, batch_chunk, by_room, params)
    sql = ["SELECT 0, event_id, outlier, NULL, CASE WHEN outlier THEN json END"
           " FROM events WHERE " + in_list(txn, "event_id", chunk, params)]
    if batch_chunk:
        sql.append("SELECT 1, redacts, NULL, room_id, NULL FROM events WHERE redacts"
                   " IS NOT NULL AND NOT rejected AND "
                   + in_list(txn, "redacts", batch_chunk, params))
    for room_id, room_records in by_room.items():
        params.append(room_id)
        sql.append("SELECT 2, event_id, NULL, room_id, NULL FROM event_backward_extremities"
                   " WHERE room_id = ? AND "
                   + in_list(txn, "event_id", [r.event_id for r in room_records], params))
    return " UNION ALL ".join(sql)


def _sqlite_lookup_sql(chunk: Sequence[str], batch_chunk: list[str],
                       by_room: dict[str, list[EventRecord]], params: list[Any]) -> str:
    """:func:`_lookup_sql` on SQLite: each list of IDs is one JSON parameter, and
    each probe reads it first (``CROSS JOIN`` keeps that order) and looks each ID up
    in the table's index."""
    sql = ["SELECT 0, e.event_id, e.outlier, NULL, CASE WHEN e.outlier THEN e.json END"
           " FROM json_each(?) j CROSS JOIN events e ON e.event_id = j.value"]
    params.append(json_values(chunk))
    if batch_chunk:
        sql.append("SELECT 1, e.redacts, NULL, e.room_id, NULL FROM json_each(?) j"
                   " CROSS JOIN events e ON e.redacts = j.value"
                   " WHERE e.redacts IS NOT NULL AND NOT e.rejected")
        params.append(json_values(batch_chunk))
    for room_id, room_records in by_room.items():
        sql.append("SELECT 2, b.event_id, NULL, b.room_id, NULL FROM json_each(?) j"
                   " CROSS JOIN event_backward_extremities b"
                   " ON b.room_id = ? AND b.event_id = j.value")
        params.append(json_values([r.event_id for r in room_records]))
        params.append(room_id)
    return " UNION ALL ".join(sql)


def _events_to_write(records: list[EventRecord],
                     lookup: BatchLookup) -> tuple[list[EventRecord], list[str]]:
    """The records not stored yet, and those stored as outliers that now arrive as
    non-outliers (de-outliered: written again, with the bytes first received)."""
    if not lookup.batch_stored:
        return list(records), []
    todo: list[EventRecord] = []
    deoutliered: list[str] = []
    stored = lookup.stored
    for record in records:
        if record.event_id in stored:
            if stored[record.event_id] and not record.outlier:
                deoutliered.append(record.event_id)
                first = lookup.outlier_json.get(record.event_id)
                if first is not None and first != record.json:
                    # The event as first received goes on (the rules check it).
                    record = dataclasses.replace(record, json=first, body=orjson.loads(first))
                todo.append(record)
            continue
        todo.append(record)
    return todo, sorted(deoutliered)


@dataclass
class BatchPlan:
    """What a batch leaves to write once its lookup is done."""

    lookup: BatchLookup
    #: the events to write (new, or de-outliered), in topological order
    todo: list[EventRecord]
    #: those of them stored before as outliers
    deoutliered: list[str]


def plan_batch(txn: Transaction, records: list[EventRecord]) -> BatchPlan:
    """Look *records* (validated, distinct IDs) up and order the ones to write."""
    if not records:
        return BatchPlan(BatchLookup(), [], [])
    lookup = BatchLookup.query(txn, records)
    todo, deoutliered = _events_to_write(records, lookup)
    return BatchPlan(lookup, topological_sort(todo) if todo else todo, deoutliered)


def topological_sort(records: Sequence[EventRecord]) -> list[EventRecord]:
    """Order *records* so that each comes after the batch events it lists as
    prev_events (stable otherwise; cycles keep their input order)."""
    if _batchrows.in_prev_order(records):
        return list(records)  # already in order (the usual case)
    by_id = {r.event_id: i for i, r in enumerate(records)}
    indegree = [0] * len(records)
    children: list[list[int]] = [[] for _ in records]
    for i, record in enumerate(records):
        for prev in record.prev_events:
            j = by_id.get(prev)
            if j is not None:
                indegree[i] += 1
                children[j].append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    out: list[EventRecord] = []
    done = [False] * len(records)
    while len(out) < len(records):
        if not ready:  # a cycle: release the earliest remaining event
            ready = [min(i for i in range(len(records)) if not done[i])]
        i = heapq.heappop(ready)
        if done[i]:
            continue
        done[i] = True
        out.append(records[i])
        for c in children[i]:
            indegree[c] -= 1
            if indegree[c] == 0 and not done[c]:
                heapq.heappush(ready, c)
    return out
