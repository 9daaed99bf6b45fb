"""Writing one batch of events, in one transaction: the steps in order.

The store has planned the batch (:mod:`~streamrep.events.plan`: its lookup and the
events to write, in topological order) and had the room rules decide on them
(:mod:`~streamrep.events.authorize`); :func:`persist_batch` writes it: the verdict's
flags; stream orderings for the events
   (:mod:`~streamrep.events.orderings`); per room the extremities
   (:mod:`~streamrep.events.dag`), each event's state group and visibility
   (:mod:`~streamrep.events.room_state`) and the events' rows (:class:`EventRows`);
   the rooms' current state (:mod:`~streamrep.events.current_state`); the verdict's
   rows. Everything queued goes out in one round trip
   (:mod:`~streamrep.events.writes`); then redactions mark their targets.

The in-memory caches are only updated through :class:`PersistOutcome` once the
transaction has committed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.events.batch import Batch, BatchCaches, PersistOutcome
from streamrep.events.current_state import update_current_state
from streamrep.events.dag import update_extremities
from streamrep.events.orderings import StreamAllocator
from streamrep.events.plan import BatchPlan
from streamrep.events.resolver import StateResolver
from streamrep.events.roomversions import version_named_by_create
from streamrep.events.rules import Verdict
from streamrep.events.room_state import GroupRows, RoomStateAssigner
from streamrep.events.state import StateGroupStore
from streamrep.events.validation import EventRecord
from streamrep.events.visibility import normalise_visibility
from streamrep.events.writes import Writes, writes_for
from streamrep.matrix.room_versions import RoomVersion

__all__ = ["EventRows", "PersistOutcome", "persist_batch"]

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
else:
    _batchrows = _impl.load("batchrows")


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
                                 int(record.outlier),
                                 self.out.replaces_state.get(record.event_id)))
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
               " stream_ordering, topological_ordering, outlier, replaces_state", self.members)
        insert("room_history_visibility", "event_id, room_id, history_visibility",
               self.history, " ON CONFLICT DO NOTHING")


def flag_records(records: list[EventRecord], verdict: Verdict) -> list[EventRecord]:
    """*records*, those the verdict rejects or soft-fails replaced by copies with
    the flag set (the caller's records are never modified, so a retried transaction
    starts from the flags it was given)."""
    if not verdict.flagged:
        return records
    rejected, soft_failed = verdict.rejected, verdict.soft_failed
    out = []
    for record in records:
        event_id = record.event_id
        reject = event_id in rejected and not record.rejected
        soft_fail = event_id in soft_failed and not record.soft_failed
        if reject or soft_fail:
            record = dataclasses.replace(record, rejected=record.rejected or reject,
                                         soft_failed=record.soft_failed or soft_fail)
        out.append(record)
    return out


def queue_verdict_rows(writes: Writes, verdict: Verdict, deoutliered: list[str]) -> None:
    """Queue on *writes* the rows of the rules' tables that the verdict adds, after
    removing those of the *deoutliered* events (checked again now)."""
    if deoutliered:
        writes.delete_in("event_auth", "event_id", deoutliered)
        writes.delete_in("rejections", "event_id", deoutliered)
    writes.insert("event_auth", "event_id, auth_id, room_id", verdict.auth_rows)
    if verdict.rejected:
        now = int(time.time() * 1000)
        writes.insert("rejections", "event_id, reason, last_check",
                      [(e, r.reason, now) for e, r in verdict.rejected.items()])
    writes.insert("rooms", "room_id, room_version", verdict.room_versions,
                  " ON CONFLICT (room_id) DO NOTHING")


def _created_rooms(todo: list[EventRecord]) -> dict[str, RoomVersion]:
    """The rooms whose create event the batch stores (not rejected), and versions."""
    out: dict[str, RoomVersion] = {}
    for record in todo:
        if record.type == "m.room.create" and record.state_key == "" and not record.rejected:
            version = version_named_by_create(record.content)
            if version is not None:
                out.setdefault(record.room_id, version)
    return out


def rejection_lines(verdict: Verdict) -> dict[str, str]:
    """Each rejected event's reason as ``"<reason>: <detail>"``."""
    return {e: f"{r.reason}: {r.detail}" for e, r in verdict.rejected.items()}


def _apply_redactions(txn: Transaction, todo: list[EventRecord], out: PersistOutcome) -> None:
    """Mark the (stored or just inserted) targets of the batch's redactions."""
    for record in todo:
        if record.redacts is not None and not record.rejected:
            txn.execute("UPDATE events SET redacted = TRUE WHERE event_id = ? AND room_id = ?",
                        (record.redacts, record.room_id))
            if txn.rowcount:
                out.redacted.add(record.redacts)


def persist_batch(txn: Transaction, plan: BatchPlan, verdict: Verdict, backfilled: bool, *,
                  rule_tables: bool, states: StateGroupStore, resolver: StateResolver,
                  allocator: StreamAllocator, caches: BatchCaches) -> PersistOutcome:
    """Write the batch *plan* holds in *txn*, with the flags of *verdict* (the room
    rules' and the event ID check's) and, with *rule_tables* (the store has room
    rules), the rows of the rules' tables it names."""
    out = PersistOutcome()
    if not plan.todo:
        return out
    todo = flag_records(plan.todo, verdict)
    out.rejected = rejection_lines(verdict)
    out.created_rooms = _created_rooms(todo)
    lookup, deoutliered = plan.lookup, plan.deoutliered
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
    if rule_tables:
        queue_verdict_rows(batch.writes, verdict, deoutliered)
    batch.writes.flush()
    _apply_redactions(txn, todo, out)
    out.redacted |= redacted_now
    return out
