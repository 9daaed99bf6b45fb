"""Writing one batch of events, in one transaction: the steps in order.

1. :class:`BatchLookup`: one query for what the batch needs to know of the tables.
2. Stream orderings for the events not stored yet (:mod:`~streamrep.events.orderings`).
3. Per room: the extremities (:mod:`~streamrep.events.dag`), each event's state
   group and visibility (:mod:`~streamrep.events.room_state`), the events' rows
   (:class:`EventRows`).
4. The rooms' current state (:mod:`~streamrep.events.current_state`).
5. Everything queued goes out in one round trip (:mod:`~streamrep.events.writes`);
   then redactions mark their targets.

The in-memory caches are only updated through :class:`PersistOutcome` once the
transaction has committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import orjson

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.events.batch import Batch, BatchCaches, PersistOutcome
from streamrep.events.current_state import update_current_state
from streamrep.events.dag import topological_sort, update_extremities
from streamrep.events.orderings import StreamAllocator
from streamrep.events.resolver import StateResolver
from streamrep.events.room_state import GroupRows, RoomStateAssigner
from streamrep.events.state import StateGroupStore
from streamrep.events.validation import EventRecord
from streamrep.events.visibility import normalise_visibility
from streamrep.events.writes import Writes, writes_for

__all__ = ["BatchLookup", "EventRows", "PersistOutcome", "persist_batch"]

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
else:
    _batchrows = _impl.load("batchrows")


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
                    if raw is not None and event_id in record_ids:
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
    sql = ["SELECT 0, event_id, outlier, NULL, CASE WHEN outlier THEN json END"
           " FROM events WHERE " + in_list(txn, "event_id", chunk, params)]
    if batch_chunk:
        sql.append("SELECT 1, redacts, NULL, room_id, NULL FROM events WHERE redacts"
                   " IS NOT NULL AND NOT rejected AND "
                   + in_list(txn, "redacts", batch_chunk, params))
    by_room = _batchrows.by_room([record_ids[e] for e in batch_chunk
                                  if not record_ids[e].outlier])
    for room_id, room_records in by_room.items():
        params.append(room_id)
        sql.append("SELECT 2, event_id, NULL, room_id, NULL FROM event_backward_extremities"
                   " WHERE room_id = ? AND "
                   + in_list(txn, "event_id", [r.event_id for r in room_records], params))
    return " UNION ALL ".join(sql)


def _events_to_write(records: list[EventRecord],
                     lookup: BatchLookup) -> tuple[list[EventRecord], list[str]]:
    """The records not stored yet, and those stored as outliers that now arrive as
    non-outliers (de-outliered: written again, with the bytes first received)."""
    todo: list[EventRecord] = []
    deoutliered: list[str] = []
    stored = lookup.stored
    for record in records:
        if record.event_id in stored:
            if stored[record.event_id] and not record.outlier:
                deoutliered.append(record.event_id)
                first = lookup.outlier_json.get(record.event_id)
                if first is not None and first != record.json:
                    # The fields follow the bytes kept (a retried transaction's room
                    # rules read them).
                    record.json, record.body = first, orjson.loads(first)
                todo.append(record)
            continue
        todo.append(record)
    return todo, sorted(deoutliered)


def _allocate_orderings(batch: Batch, todo: list[EventRecord], backfilled: bool) -> None:
    allocator, txn, out = batch.allocator, batch.txn, batch.out
    streams = (allocator.next_backfill_mult(txn, len(todo)) if backfilled
               else allocator.next_live_mult(txn, len(todo)))
    out.event_orderings = _batchrows.orderings_of(todo, streams, batch.orderings)
    out.max_stream = max(streams)
    out.max_live = max(out.max_stream, 0)


class EventRows:
    """The rows a batch's events add to ``events``, ``event_edges``,
    ``room_memberships`` and ``room_history_visibility``, and the stream positions
    they move in *out*."""

    def __init__(self, txn: Transaction, out: PersistOutcome, backfilled: bool,
                 redacted_now: set[str]) -> None:
        self.out = out
        self.backfilled = backfilled
        self.redacted_now = redacted_now
        # SQLite binds some types faster than others (see batchrows.event_rows).
        self.sqlite = not txn.is_postgres
        self.events: list[tuple[Any, ...]] = []
        # On SQLite, events with no state key, redaction, relation or membership,
        # without those four NULL columns.
        self.plain_events: list[tuple[Any, ...]] = []
        self.edges: list[tuple[str, str, str]] = []
        self.members: list[tuple[Any, ...]] = []
        self.history: list[tuple[str, str, str]] = []
        self.received_ts = int(time.time() * 1000)

    def add_history_visibility(self, records: list[EventRecord]) -> None:
        """The settings of *records*' ``m.room.history_visibility`` events (also
        needed by the state assignment, so added before any room)."""
        for record in records:
            if record.type == "m.room.history_visibility" and record.state_key == "":
                value = normalise_visibility(record.content)
                self.out.visibility_values[record.event_id] = value
                self.history.append((record.event_id, record.room_id, value))

    def add_room(self, room_id: str, records: list[EventRecord],
                 visibility: dict[str, str]) -> None:
        """The rows of one room's events (*visibility*: each one's setting)."""
        out = self.out
        orderings = out.event_orderings
        room_max, members = _batchrows.event_rows(
            records, room_id, orderings, self.redacted_now, visibility, self.received_ts,
            self.sqlite, self.events, self.plain_events, self.edges)
        for record in members:
            self._add_membership(record, record.state_key, orderings[record.event_id])
        out.persisted.extend([r.event_id for r in records])
        if not self.backfilled:
            out.room_positions[room_id] = max(out.room_positions.get(room_id, room_max),
                                              room_max)

    def _add_membership(self, record: EventRecord, user_id: str, stream: int) -> None:
        if not record.rejected and not record.soft_failed:
            self.members.append((record.event_id, user_id, record.sender,
                                 record.room_id, record.membership, stream, record.depth,
                                 int(record.outlier)))
        if not record.rejected and not self.backfilled:
            # Same rule as a worker applying the ``ev`` row (which has no soft-failed
            # flag): conservative for soft-failed events.
            positions = self.out.membership_positions
            positions[user_id] = max(positions.get(user_id, stream), stream)

    def queue(self, writes: Writes) -> None:
        """Queue the rows' inserts on *writes*."""
        insert = writes.insert
        insert("events", "stream_ordering, topological_ordering, event_id, room_id, type,"
               " state_key, sender, outlier, rejected, soft_failed, redacted, redacts,"
               " relates_to, membership, history_visibility, received_ts, json", self.events)
        insert("events", "stream_ordering, topological_ordering, event_id, room_id, type,"
               " sender, outlier, rejected, soft_failed, redacted, history_visibility,"
               " received_ts, json", self.plain_events)
        insert("event_edges", "event_id, prev_event_id, room_id", self.edges)
        insert("room_memberships", "event_id, user_id, sender, room_id, membership,"
               " stream_ordering, topological_ordering, outlier", self.members)
        insert("room_history_visibility", "event_id, room_id, history_visibility",
               self.history, " ON CONFLICT DO NOTHING")


def _apply_redactions(txn: Transaction, todo: list[EventRecord], out: PersistOutcome) -> None:
    """Mark the (stored or just inserted) targets of the batch's redactions."""
    for record in todo:
        if record.redacts is not None and not record.rejected:
            txn.execute("UPDATE events SET redacted = TRUE WHERE event_id = ? AND room_id = ?",
                        (record.redacts, record.room_id))
            if txn.rowcount:
                out.redacted.add(record.redacts)


def persist_batch(txn: Transaction, records: list[EventRecord], backfilled: bool, *,
                  states: StateGroupStore, resolver: StateResolver,
                  allocator: StreamAllocator, caches: BatchCaches,
                  more_rows: Callable[[Writes, PersistOutcome], None] | None = None,
                  ) -> PersistOutcome:
    """Persist *records* (validated, distinct IDs) in *txn*; *more_rows* queues rows
    of its own to go out with the batch's (the room rules' tables)."""
    out = PersistOutcome()
    if not records:
        return out
    lookup = BatchLookup.query(txn, records)
    todo, deoutliered = _events_to_write(records, lookup)
    if not todo:
        return out
    todo = topological_sort(todo)
    # The only BYTEA written is event JSON, which validation has checked is UTF-8.
    batch = Batch(txn, writes_for(txn, utf8_bytea=True), states, resolver, allocator,
                  caches, out)
    _allocate_orderings(batch, todo, backfilled)
    if deoutliered:
        batch.writes.delete_in("events", "event_id", deoutliered)
        batch.writes.delete_in("room_memberships", "event_id", deoutliered)

    # Redactions already stored for events of this batch (same room only).
    targets = lookup.redaction_targets
    redacted_now = {r.event_id for r in todo if (r.event_id, r.room_id) in targets} \
        if targets else set()
    event_rows = EventRows(txn, out, backfilled, redacted_now)
    event_rows.add_history_visibility(todo)
    group_rows = GroupRows()
    rooms = _batchrows.by_room(todo)
    for room_id, room_records in rooms.items():
        forward = update_extremities(batch, room_id, room_records, lookup.stored,
                                     lookup.backward)
        if forward is not None:
            out.forward[room_id] = forward
        visibility = RoomStateAssigner(batch, room_id, group_rows).assign(room_records)
        event_rows.add_room(room_id, room_records, visibility)
    event_rows.queue(batch.writes)
    group_rows.queue(batch.writes)

    # Current state goes out with the same round trip as the events.
    batch_memberships = {r.event_id: r.membership for r in todo if r.membership is not None}
    for room_id in rooms:
        if room_id in out.forward:
            update_current_state(batch, room_id, batch_memberships)
    if more_rows is not None:
        more_rows(batch.writes, out)
    batch.writes.flush()
    _apply_redactions(txn, todo, out)
    out.redacted |= redacted_now
    return out
