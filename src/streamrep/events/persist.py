"""Writing one batch of events: orderings, edges, extremities, state, visibility.

Everything for a batch happens in one transaction; the in-memory caches are only
updated through :class:`PersistOutcome` once it has committed.
"""

from __future__ import annotations

import heapq
import time
from array import array
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import orjson

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.lru import Lru
from streamrep.events.resolver import StateKey, StateResolver, conflicted_ids
from streamrep.events.state import (EMPTY_STATE, GroupState, StateGroupStore, StateOverlay,
                                    mutable_copy)
from streamrep.events.validation import EventRecord
from streamrep.events.visibility import DEFAULT_VISIBILITY, more_permissive, normalise_visibility

if TYPE_CHECKING:
    from streamrep._pure import extremities as _core_ext
else:
    _core_ext = _impl.load("extremities")

__all__ = ["PersistOutcome", "StreamAllocator", "persist_batch", "topological_sort",
           "current_state_of"]

HISTORY_VISIBILITY_KEY: StateKey = ("m.room.history_visibility", "")


def _ph(n: int) -> str:
    """*n* placeholders for an ``IN (...)`` list; ``NULL`` (matching nothing) for none."""
    return ",".join("?" * n) if n else "NULL"


def _in_list(txn: Transaction, column: str, values: Sequence[Any], params: list[Any]) -> str:
    """SQL that tests *column* against *values*, whose parameters go on *params*.

    On PostgreSQL the values travel as one JSON array: psycopg2 quotes one string
    instead of adapting each value, and the server plans one parameter however
    many values there are (a long ``IN`` list costs it more to plan than to run).
    """
    if txn.is_postgres:
        params.append(orjson.dumps(list(values)).decode())
        return f"{column} = ANY(ARRAY(SELECT json_array_elements_text(?::json)))"
    params.extend(values)
    return f"{column} IN ({_ph(len(values))})"


# Columns of the tables written here whose PostgreSQL type is not TEXT.
_PG_COLUMN_TYPES = {
    "stream_ordering": "bigint", "topological_ordering": "bigint", "received_ts": "bigint",
    "stream_id": "bigint", "id": "bigint", "state_group": "bigint",
    "prev_state_group": "bigint", "outlier": "boolean", "rejected": "boolean",
    "soft_failed": "boolean", "redacted": "boolean", "json": "bytea",
}


@lru_cache(maxsize=64)
def _pg_json_insert(table: str, columns: str, suffix: str, utf8_bytea: bool) -> str:
    """An INSERT taking its rows as one JSON array of arrays.

    BYTEA columns travel as UTF-8 text when *utf8_bytea* (every value there is
    UTF-8: event JSON), else as hex. ``jsonb``, not ``json``: the text is parsed
    once, where ``->>`` on ``json`` would parse each row again for every column it
    extracts."""
    exprs = [_pg_json_column(column.strip(), i, utf8_bytea)
             for i, column in enumerate(columns.split(","))]
    return (f"INSERT INTO {table} ({columns}) SELECT {', '.join(exprs)}"
            f" FROM jsonb_array_elements(?::jsonb) AS r{suffix}")


def _pg_json_column(column: str, index: int, utf8_bytea: bool) -> str:
    """The value of *column* from element *index* of the JSON row ``r``."""
    pg_type = _PG_COLUMN_TYPES.get(column)
    if pg_type is None:
        return f"r->>{index}"
    if pg_type == "bytea":
        return (f"convert_to(r->>{index}, 'UTF8')" if utf8_bytea
                else f"decode(r->>{index}, 'hex')")
    return f"(r->>{index})::{pg_type}"


def _hex_bytes(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    raise TypeError(f"cannot store {type(value).__name__} in a JSON row")


def _utf8_bytes(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()  # strict: anything else is a bug, not data to mangle
    raise TypeError(f"cannot store {type(value).__name__} in a JSON row")


def _chunks(items: Sequence[Any], size: int = 500) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class Writes:
    """Write statements queued for one round trip.

    On PostgreSQL the queued statements go to the server as one multi-statement
    ``execute`` (each insert's rows as one JSON parameter); on SQLite, where a
    statement costs no round trip, they run one by one at :meth:`flush`, inserts
    through ``executemany``.
    """

    def __init__(self, txn: Transaction, utf8_bytea: bool = False) -> None:
        """*utf8_bytea*: every BYTEA value inserted is UTF-8 (event JSON, validated),
        so on a UTF-8 PostgreSQL database it may travel as text, a third shorter
        than hex."""
        self.txn = txn
        self._utf8_bytea = utf8_bytea and txn.database.text_is_utf8
        self._sql: list[str] = []
        self._params: list[Any] = []
        self._sqlite: list[tuple[str, Sequence[Sequence[Any]]]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if self.txn.is_postgres:
            self._sql.append(sql)
            self._params.extend(params)
        else:
            self._sqlite.append((sql, [params]))

    def delete_in(self, table: str, column: str, values: Sequence[Any],
                  room_id: str | None = None) -> None:
        """Queue ``DELETE FROM table WHERE [room_id = ? AND] column IN values``."""
        where = "" if room_id is None else "room_id = ? AND "
        for chunk in _chunks(values):
            params: list[Any] = [] if room_id is None else [room_id]
            self.execute(f"DELETE FROM {table} WHERE {where}"
                         + _in_list(self.txn, column, chunk, params), params)

    def delete_rows(self, table: str, columns: str, keys: Sequence[Sequence[Any]]) -> None:
        """Queue the deletion of the rows of *table* whose *columns* (comma-separated)
        equal one of *keys*: on PostgreSQL one statement whatever their number."""
        if not keys:
            return
        names = [c.strip() for c in columns.split(",")]
        if not self.txn.is_postgres:
            where = " AND ".join(f"{c} = ?" for c in names)
            self._sqlite.append((f"DELETE FROM {table} WHERE {where}", keys))
            return
        self.execute(f"DELETE FROM {table} WHERE ({', '.join(names)}) IN (SELECT "
                     + ", ".join(_pg_json_column(c, i, False) for i, c in enumerate(names))
                     + " FROM jsonb_array_elements(?::jsonb) AS r)",
                     [orjson.dumps(keys).decode()])

    def insert(self, table: str, columns: str, rows: Sequence[Sequence[Any]],
               suffix: str = "") -> None:
        if not rows:
            return
        if not self.txn.is_postgres:
            one = "(" + ",".join("?" * len(rows[0])) + ")"
            self._sqlite.append((f"INSERT INTO {table} ({columns}) VALUES {one}{suffix}", rows))
            return
        # One JSON parameter for all the rows: adapting thousands of parameters one
        # by one costs psycopg2 more than the server spends inserting them.
        self.execute(_pg_json_insert(table, columns, suffix, self._utf8_bytea),
                     [orjson.dumps(rows, default=_utf8_bytes if self._utf8_bytea
                                   else _hex_bytes).decode()])

    def flush(self) -> None:
        if self._sql:
            self.txn.execute(";\n".join(self._sql), self._params)
            self._sql, self._params = [], []
        for sql, rows in self._sqlite:
            if len(rows) == 1:
                self.txn.execute(sql, rows[0])
            else:
                self.txn.executemany(sql, rows)
        self._sqlite = []


class StreamAllocator:
    """Stream orderings for this (single) writer of events: live events count up
    from the highest stored ordering, backfilled ones down from -1."""

    def __init__(self) -> None:
        self._live: int | None = None
        self._backfill: int | None = None

    def _load(self, txn: Transaction) -> None:
        if self._live is None or self._backfill is None:
            self._live = max(
                int(txn.fetchval("SELECT MAX(stream_ordering) FROM events", (), 0)),
                int(txn.fetchval("SELECT MAX(stream_id) FROM current_state_delta_stream", (), 0)),
                0)
            self._backfill = min(
                int(txn.fetchval("SELECT MIN(stream_ordering) FROM events", (), 0)), 0)

    def current(self, txn: Transaction) -> tuple[int, int]:
        """``(highest live ordering, lowest backfill ordering)`` handed out so far."""
        self._load(txn)
        assert self._live is not None and self._backfill is not None
        return self._live, self._backfill

    def next_live(self, txn: Transaction) -> int:
        self._load(txn)
        assert self._live is not None
        self._live += 1
        return self._live

    def next_backfill(self, txn: Transaction) -> int:
        self._load(txn)
        assert self._backfill is not None
        self._backfill -= 1
        return self._backfill

    def next_live_mult(self, txn: Transaction, count: int) -> list[int]:
        self._load(txn)
        assert self._live is not None
        first = self._live + 1
        self._live += count
        return list(range(first, first + count))

    def next_backfill_mult(self, txn: Transaction, count: int) -> list[int]:
        self._load(txn)
        assert self._backfill is not None
        first = self._backfill - 1
        self._backfill -= count
        return list(range(first, first - count, -1))

    def reset(self) -> None:
        self._live = self._backfill = None


class GeneratorAllocator(StreamAllocator):
    """Stream orderings from the stream registry's ID generators of the ``events``
    and ``backfill`` streams: each ID completes when the transaction that
    reserved it commits or rolls back, and the generators' listeners announce it."""

    def __init__(self, events: Any, backfill: Any) -> None:
        super().__init__()
        self.events_gen = events
        self.backfill_gen = backfill

    def current(self, txn: Transaction) -> tuple[int, int]:
        return (int(self.events_gen.get_current_token()),
                -int(self.backfill_gen.get_current_token()))

    def next_live(self, txn: Transaction) -> int:
        return int(self.events_gen.get_next_txn(txn))

    def next_backfill(self, txn: Transaction) -> int:
        return int(self.backfill_gen.get_next_txn(txn))

    def next_live_mult(self, txn: Transaction, count: int) -> list[int]:
        return [int(i) for i in self.events_gen.get_next_mult_txn(txn, count)]

    def next_backfill_mult(self, txn: Transaction, count: int) -> list[int]:
        return [int(i) for i in self.backfill_gen.get_next_mult_txn(txn, count)]


@dataclass
class PersistOutcome:
    """What a committed batch changes in the in-memory caches and streams."""

    event_orderings: dict[str, int] = field(default_factory=dict)
    event_groups: dict[str, int] = field(default_factory=dict)
    new_groups: dict[int, tuple[GroupState, int]] = field(default_factory=dict)
    # new group -> (the group its delta is over, or None for a snapshot; the delta's keys)
    group_parents: dict[int, tuple[int | None, tuple[StateKey, ...]]] = \
        field(default_factory=dict)
    forward: dict[str, frozenset[str]] = field(default_factory=dict)
    current_state: dict[str, GroupState] = field(default_factory=dict)
    # room -> users whose current membership changed
    current_state_changes: dict[str, set[str]] = field(default_factory=dict)
    visibility_values: dict[str, str] = field(default_factory=dict)
    room_positions: dict[str, int] = field(default_factory=dict)
    membership_positions: dict[str, int] = field(default_factory=dict)
    redacted: set[str] = field(default_factory=set)
    max_stream: int = 0
    max_live: int = 0
    persisted: list[str] = field(default_factory=list)


def _group_by_room(records: list[EventRecord]) -> dict[str, list[EventRecord]]:
    """*records* by room, in order (a batch is mostly one room: no loop then)."""
    if not records:
        return {}
    first = records[0].room_id
    if all(r.room_id == first for r in records):
        return {first: records}
    rooms: dict[str, list[EventRecord]] = {}
    for record in records:
        rooms.setdefault(record.room_id, []).append(record)
    return rooms


def topological_sort(records: Sequence[EventRecord]) -> list[EventRecord]:
    """Order *records* so that each comes after the batch events it lists as
    prev_events (stable otherwise; cycles keep their input order)."""
    by_id = {r.event_id: i for i, r in enumerate(records)}
    if all(by_id.get(p, -1) < i for i, r in enumerate(records) for p in r.prev_events):
        return list(records)  # already in order (the usual case)
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


def current_state_of(txn: Transaction, states: StateGroupStore, resolver: StateResolver,
                     room_id: str, extremities: Iterable[str],
                     known_groups: dict[str, int], known_states: dict[int, tuple[GroupState, int]],
                     orderings: dict[str, tuple[int, int]]) -> GroupState:
    """The room state at *extremities*, resolved where they disagree."""
    ext = sorted(extremities)
    missing = [e for e in ext if e not in known_groups]
    groups = dict(known_groups)
    if missing:
        groups.update(states.groups_for_events(txn, missing))
    group_ids = sorted({groups[e] for e in ext if e in groups})
    if not group_ids:
        return EMPTY_STATE
    sets = [known_states[g][0] if g in known_states else states.load(txn, g)[0]
            for g in group_ids]
    if len(sets) == 1:
        state = sets[0]
        if type(state) is StateOverlay:
            # The room's current state: made whole once, kept (and cached) as the
            # group's state, and the base of the next batch's overlays.
            state = state.materialize()
            known_states[group_ids[0]] = (state, known_states[group_ids[0]][1])
        return state
    return MappingProxyType(_resolve(txn, resolver, room_id, sets, orderings))


def _resolve(txn: Transaction, resolver: StateResolver, room_id: str,
             sets: list[GroupState], orderings: dict[str, tuple[int, int]]) -> dict[StateKey, str]:
    conflicted = conflicted_ids(sets)
    wanted = [e for e in conflicted if e not in orderings]
    for chunk in _chunks(wanted):
        params: list[Any] = []
        for event_id, topo, stream in txn.fetchall(
            "SELECT event_id, topological_ordering, stream_ordering FROM events"
            " WHERE " + _in_list(txn, "event_id", chunk, params), params):
            orderings[event_id] = (int(topo), int(stream))
    return resolver.resolve(room_id, sets, {e: orderings[e] for e in conflicted if e in orderings})


def persist_batch(
    txn: Transaction,
    records: list[EventRecord],
    backfilled: bool,
    *,
    states: StateGroupStore,
    resolver: StateResolver,
    allocator: StreamAllocator,
    forward_cache: Lru[str, frozenset[str]],
    current_state_cache: Lru[str, GroupState],
    visibility_cache: Lru[str, str],
) -> PersistOutcome:
    """Persist *records* (validated, distinct IDs) in *txn*."""
    out = PersistOutcome()
    if not records:
        return out

    # One query for what the batch needs to know: which of its events and of their
    # prev_events are stored (and whether as outliers), which stored redactions
    # target its events, and which of its events are backward extremities.
    stored: dict[str, bool] = {}
    # The bytes first received for stored outliers: a de-outliered event keeps them.
    outlier_json: dict[str, bytes] = {}
    redaction_targets: set[tuple[str, str]] = set()
    backward: set[tuple[str, str]] = set()
    record_ids = {r.event_id: r for r in records}
    extra_prevs = sorted({p for r in records if not r.outlier for p in r.prev_events
                          if p not in record_ids})
    for chunk in _chunks([*record_ids, *extra_prevs]):
        batch_chunk = [e for e in chunk if e in record_ids]
        params: list[Any] = []
        sql = ["SELECT 0, event_id, outlier, NULL, CASE WHEN outlier THEN json END"
               " FROM events WHERE " + _in_list(txn, "event_id", chunk, params)]
        if batch_chunk:
            sql.append("SELECT 1, redacts, NULL, room_id, NULL FROM events WHERE redacts"
                       " IS NOT NULL AND NOT rejected AND "
                       + _in_list(txn, "redacts", batch_chunk, params))
        by_room = _group_by_room([record_ids[e] for e in batch_chunk if not record_ids[e].outlier])
        for room_id, room_records in by_room.items():
            room_ids = [r.event_id for r in room_records]
            params.append(room_id)
            sql.append("SELECT 2, event_id, NULL, room_id, NULL FROM event_backward_extremities"
                       " WHERE room_id = ? AND " + _in_list(txn, "event_id", room_ids, params))
        for kind, event_id, outlier, room_id, raw in txn.fetchall(" UNION ALL ".join(sql),
                                                                   params):
            if kind == 0:
                stored[event_id] = bool(outlier)
                if raw is not None and event_id in record_ids:
                    outlier_json[event_id] = bytes(raw)
            elif kind == 1:
                redaction_targets.add((event_id, room_id))
            else:
                backward.add((room_id, event_id))
    todo: list[EventRecord] = []
    deoutliered: set[str] = set()
    for record in records:
        if record.event_id in stored:
            if stored[record.event_id] and not record.outlier:
                deoutliered.add(record.event_id)
                record.json = outlier_json.get(record.event_id, record.json)
                todo.append(record)
            continue
        todo.append(record)
    if not todo:
        return out
    todo = topological_sort(todo)
    # The only BYTEA written is event JSON, which validation has checked is UTF-8.
    writes = Writes(txn, utf8_bytea=True)

    streams = (allocator.next_backfill_mult(txn, len(todo)) if backfilled
               else allocator.next_live_mult(txn, len(todo)))
    out.event_orderings = dict(zip([r.event_id for r in todo], streams))
    orderings: dict[str, tuple[int, int]] = {
        r.event_id: (r.depth, stream) for r, stream in zip(todo, streams)}
    out.max_stream = max(streams)
    out.max_live = max(out.max_stream, 0)

    if deoutliered:
        ids = sorted(deoutliered)
        writes.delete_in("events", "event_id", ids)
        writes.delete_in("room_memberships", "event_id", ids)

    rooms = _group_by_room(todo)

    # Redactions already stored for events of this batch (same room only).
    redacted_now = {r.event_id for r in todo if (r.event_id, r.room_id) in redaction_targets}

    history_rows: list[tuple[str, str, str]] = []
    for record in [r for r in todo if r.type == "m.room.history_visibility"]:
        if record.state_key == "":
            value = normalise_visibility(record.content)
            out.visibility_values[record.event_id] = value
            history_rows.append((record.event_id, record.room_id, value))

    event_rows: list[tuple[Any, ...]] = []
    # Events with no state key, redaction, relation or membership, without those four
    # NULL columns: on SQLite, binding None (or a bool, or bytes) costs the sqlite3
    # module a failed adapter lookup per value, several times an int's or a str's cost.
    plain_event_rows: list[tuple[Any, ...]] = []
    sqlite = not txn.is_postgres
    blob = bytearray if sqlite else bytes
    edge_rows: list[tuple[str, str, str]] = []
    member_rows: list[tuple[Any, ...]] = []
    group_rows: list[tuple[int, str, str]] = []
    group_edge_rows: list[tuple[int, int]] = []
    group_state_rows: list[tuple[int, str, str, str, str]] = []
    event_group_rows: list[tuple[str, int]] = []
    now_ms = int(time.time() * 1000)

    for room_id, room_records in rooms.items():
        _extremities(txn, writes, room_id, room_records, forward_cache, out, stored, backward)
        visibility = _assign_state(txn, room_id, room_records, states, resolver, orderings,
                                   visibility_cache, out, group_rows, group_edge_rows,
                                   group_state_rows, event_group_rows)
        event_orderings = out.event_orderings
        room_max = 0
        for record in room_records:
            event_id = record.event_id
            stream = event_orderings[event_id]
            if stream > room_max:
                room_max = stream
            if (sqlite and record.state_key is None and record.redacts is None
                    and record.relates_to is None and record.membership is None):
                plain_event_rows.append((
                    stream, record.depth, event_id, room_id, record.type, record.sender,
                    int(record.outlier), int(record.rejected), int(record.soft_failed),
                    int(event_id in redacted_now), visibility.get(event_id), now_ms,
                    blob(record.json)))
            else:
                event_rows.append((
                    stream, record.depth, event_id, room_id, record.type, record.state_key,
                    record.sender, int(record.outlier), int(record.rejected),
                    int(record.soft_failed), int(event_id in redacted_now), record.redacts,
                    record.relates_to, record.membership, visibility.get(event_id), now_ms,
                    blob(record.json)))
            if not record.outlier:
                prev_events = record.prev_events
                if len(prev_events) == 1:
                    edge_rows.append((event_id, prev_events[0], room_id))
                else:
                    edge_rows.extend((event_id, p, room_id) for p in prev_events)
            if record.membership is not None and record.state_key is not None:
                if not record.rejected and not record.soft_failed:
                    member_rows.append((event_id, record.state_key, record.sender, room_id,
                                        record.membership, stream, record.depth,
                                        int(record.outlier)))
                if not record.rejected and not backfilled:
                    # Same rule as a worker applying the ``ev`` row (which has no
                    # soft-failed flag): conservative for soft-failed events.
                    prev = out.membership_positions.get(record.state_key, stream)
                    out.membership_positions[record.state_key] = max(prev, stream)
        out.persisted.extend([r.event_id for r in room_records])
        if not backfilled:
            out.room_positions[room_id] = max(out.room_positions.get(room_id, room_max),
                                              room_max)

    insert_many = writes.insert
    insert_many("events", "stream_ordering, topological_ordering, event_id, room_id, type,"
                " state_key, sender, outlier, rejected, soft_failed, redacted, redacts,"
                " relates_to, membership, history_visibility, received_ts, json", event_rows)
    insert_many("events", "stream_ordering, topological_ordering, event_id, room_id, type,"
                " sender, outlier, rejected, soft_failed, redacted, history_visibility,"
                " received_ts, json", plain_event_rows)
    insert_many("event_edges", "event_id, prev_event_id, room_id", edge_rows)
    insert_many("room_memberships", "event_id, user_id, sender, room_id, membership,"
                " stream_ordering, topological_ordering, outlier", member_rows)
    insert_many("room_history_visibility", "event_id, room_id, history_visibility",
                history_rows, " ON CONFLICT DO NOTHING")
    insert_many("state_groups", "id, room_id, event_id", group_rows)
    insert_many("state_group_edges", "state_group, prev_state_group", group_edge_rows)
    insert_many("state_groups_state", "state_group, room_id, type, state_key, event_id",
                group_state_rows)
    insert_many("event_to_state_groups", "event_id, state_group", event_group_rows)

    # Current state goes out with the same round trip as the events.
    batch_memberships = {r.event_id: r.membership for r in todo if r.membership is not None}
    for room_id in rooms:
        if room_id in out.forward:
            _update_current_state(txn, writes, room_id, states, resolver, orderings, out,
                                  current_state_cache, allocator, batch_memberships)
    writes.flush()

    # Redactions in this batch mark their (stored or just inserted) targets.
    for record in todo:
        if record.redacts is not None and not record.rejected:
            txn.execute("UPDATE events SET redacted = TRUE WHERE event_id = ? AND room_id = ?",
                        (record.redacts, record.room_id))
            if txn.rowcount:
                out.redacted.add(record.redacts)
    out.redacted |= redacted_now
    return out


def _extremities(txn: Transaction, writes: Writes, room_id: str, records: list[EventRecord],
                 forward_cache: Lru[str, frozenset[str]], out: PersistOutcome,
                 stored: dict[str, bool], backward: set[tuple[str, str]]) -> None:
    """Run the extremity core for one room's share of the batch and write the changes.

    *stored* tells, for the batch's events and prev_events, which are stored and
    whether as outliers; *backward* holds the ``(room, event)`` backward extremities
    among the batch's events."""
    non_outliers = [r for r in records if not r.outlier]
    if not non_outliers:
        return
    forward = forward_cache.get(room_id)
    if forward is None:
        forward = frozenset(e for (e,) in txn.fetchall(
            "SELECT event_id FROM event_forward_extremities WHERE room_id = ?", (room_id,)))
    # Batch events are interned first, in order: batch event k has ID k.
    ids: dict[str, int] = {r.event_id: k for k, r in enumerate(non_outliers)}
    names: list[str] = [r.event_id for r in non_outliers]
    if len(ids) != len(names):  # the same event twice: keep the first ID of each
        ids = {}
        names = []
        for record in non_outliers:
            if record.event_id not in ids:
                ids[record.event_id] = len(names)
                names.append(record.event_id)
    setdefault = ids.setdefault

    non_outlier_flag = _core_ext.BATCH_NON_OUTLIER
    counted_flag = _core_ext.BATCH_NON_OUTLIER | _core_ext.BATCH_COUNTED
    batch_ids = array("q", [ids[r.event_id] for r in non_outliers])
    batch_flags = bytes([counted_flag if not (r.rejected or r.soft_failed) else non_outlier_flag
                         for r in non_outliers])
    offsets = array("q", [0])
    prev_list: list[int] = []
    for record in non_outliers:
        for p in record.prev_events:
            i = setdefault(p, len(names))
            if i == len(names):
                names.append(p)
            prev_list.append(i)
        offsets.append(len(prev_list))
    prev_ids = array("q", prev_list)
    n_batch_known = len(names)
    for event_id in forward:
        if setdefault(event_id, len(names)) == len(names):
            names.append(event_id)
    id_flags = bytearray(len(names))
    for event_id in forward:
        id_flags[ids[event_id]] |= _core_ext.ID_FORWARD

    batch_set = {r.event_id for r in non_outliers}
    stored_flag = _core_ext.ID_STORED_NON_OUTLIER
    for i in range(n_batch_known):
        name = names[i]
        if name not in batch_set and stored.get(name) is False:
            id_flags[i] |= stored_flag
    # Only batch events that are backward extremities can have a stored child.
    backward_hits = {e for e in batch_set if (room_id, e) in backward}
    counted = sorted(r.event_id for r in non_outliers if r.counts and r.event_id in backward_hits)
    for chunk in _chunks(counted):
        params: list[Any] = [room_id]
        for (event_id,) in txn.fetchall(
                "SELECT DISTINCT ee.prev_event_id FROM event_edges ee"
                " JOIN events e ON e.event_id = ee.event_id"
                " WHERE NOT e.outlier AND NOT e.rejected AND NOT e.soft_failed"
                " AND ee.room_id = ? AND " + _in_list(txn, "ee.prev_event_id", chunk, params),
                params):
            id_flags[ids[event_id]] |= _core_ext.ID_HAS_COUNTED_CHILD

    f_add, f_rem, b_add, b_rem = _core_ext.update_extremities(
        batch_ids, batch_flags, offsets, prev_ids, bytes(id_flags))
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
        new_forward = (forward - {names[i] for i in f_rem}) | {names[i] for i in f_add}
        out.forward[room_id] = frozenset(new_forward)


def _visibility_value(txn: Transaction, event_id: str, visibility_cache: Lru[str, str],
                      out: PersistOutcome) -> str:
    value = out.visibility_values.get(event_id) or visibility_cache.get(event_id)
    if value is None:
        value = txn.fetchval(
            "SELECT history_visibility FROM room_history_visibility WHERE event_id = ?",
            (event_id,), "joined")
        visibility_cache.put(event_id, str(value))
    return str(value)


def _assign_state(txn: Transaction, room_id: str, records: list[EventRecord],
                  states: StateGroupStore, resolver: StateResolver,
                  orderings: dict[str, tuple[int, int]], visibility_cache: Lru[str, str],
                  out: PersistOutcome, group_rows: list[tuple[int, str, str]],
                  group_edge_rows: list[tuple[int, int]],
                  group_state_rows: list[tuple[int, str, str, str, str]],
                  event_group_rows: list[tuple[str, int]]) -> dict[str, str]:
    """Give each non-outlier event the group of the state after it; return each
    event's history visibility."""
    visibility: dict[str, str] = {}
    non_outliers = [r for r in records if not r.outlier]
    if not non_outliers:
        return visibility
    batch_ids = {r.event_id for r in non_outliers}
    outside = sorted({p for r in non_outliers for p in r.prev_events if p not in batch_ids})
    groups = states.groups_for_events(txn, outside) if outside else {}

    def group_state(group: int) -> tuple[GroupState, int]:
        return out.new_groups.get(group) or states.load(txn, group)

    event_groups = out.event_groups
    # Visibility setting per m.room.history_visibility event, looked up once a batch.
    vis_of: dict[str, str] = {}
    # Visibility at each group already met in this batch (the state a group holds
    # never changes), so the run of messages after a state event costs a lookup each.
    vis_at_group: dict[int, str] = {}
    for record in non_outliers:
        prev_events = record.prev_events
        if len(prev_events) == 1 and (record.state_key is None or record.rejected):
            g = event_groups.get(prev_events[0])
            if g is None:
                g = groups.get(prev_events[0])
            if g is not None:
                known = vis_at_group.get(g)
                if known is not None:
                    # Changes no state: the event shares its prev event's group.
                    visibility[record.event_id] = known
                    event_groups[record.event_id] = g
                    event_group_rows.append((record.event_id, g))
                    continue
        prev_groups: list[int] = []
        for p in prev_events:
            g = event_groups.get(p)
            if g is None:
                g = groups.get(p)
            if g is not None and g not in prev_groups:
                prev_groups.append(g)
        base_group: int | None
        if not prev_groups:
            before: GroupState = EMPTY_STATE
            base_group = None
        elif len(prev_groups) == 1:
            base_group = prev_groups[0]
            before = group_state(base_group)[0]
        else:
            sets = [group_state(g)[0] for g in sorted(prev_groups)]
            resolved = _resolve(txn, resolver, room_id, sets, orderings)
            base_group = next((g for g, s in zip(sorted(prev_groups), sets) if s == resolved),
                              None)
            before = group_state(base_group)[0] if base_group is not None else \
                MappingProxyType(resolved)

        changes_state = record.is_state and not record.rejected
        key: StateKey = (record.type, record.state_key or "")
        vis_id = before.get(HISTORY_VISIBILITY_KEY)
        if vis_id:
            known = vis_of.get(vis_id)
            if known is None:
                known = vis_of[vis_id] = _visibility_value(txn, vis_id, visibility_cache, out)
            vis = known
        else:
            vis = DEFAULT_VISIBILITY
        if base_group is not None and base_group not in vis_at_group:
            vis_at_group[base_group] = vis
        if changes_state and key == HISTORY_VISIBILITY_KEY:
            vis = more_permissive(vis, out.visibility_values[record.event_id])
        visibility[record.event_id] = vis

        if base_group is not None and (not changes_state or before.get(key) == record.event_id):
            event_groups[record.event_id] = base_group
            event_group_rows.append((record.event_id, base_group))
            continue
        after: GroupState
        if len(prev_groups) == 1 and changes_state:
            after = StateOverlay.over(before, key, record.event_id)
        else:
            full = mutable_copy(before)
            if changes_state:
                full[key] = record.event_id
            after = MappingProxyType(full)
        group = states.next_group_id(txn)
        # Store over the prev group that needs the smallest delta, unless its chain is
        # already max_delta_hops long: then store a full snapshot.
        best: tuple[int, int, dict[StateKey, str]] | None = None
        if len(prev_groups) == 1 and changes_state:
            # One prev group whose state is `before`: the delta is the one new key,
            # found without walking the whole state.
            g_hops = group_state(prev_groups[0])[1]
            if g_hops + 1 <= states.max_delta_hops:
                best = (prev_groups[0], g_hops + 1, {key: record.event_id})
            prev_groups_to_try: list[int] = []
        else:
            prev_groups_to_try = prev_groups
        for g in prev_groups_to_try:
            g_state, g_hops = group_state(g)
            if g_hops + 1 > states.max_delta_hops or any(k not in after for k in g_state):
                continue
            candidate = {k: v for k, v in after.items() if g_state.get(k) != v}
            if best is None or len(candidate) < len(best[2]):
                best = (g, g_hops + 1, candidate)
        written: GroupState
        if best is None:  # a snapshot: the group's whole state is written anyway
            if type(after) is StateOverlay:
                after = after.materialize()
            written, hops = after, 0
            out.group_parents[group] = (None, ())
        else:
            group_edge_rows.append((group, best[0]))
            written, hops = best[2], best[1]
            out.group_parents[group] = (best[0], tuple(written))
        group_rows.append((group, room_id, record.event_id))
        group_state_rows.extend((group, room_id, t, sk, e) for (t, sk), e in written.items())
        out.new_groups[group] = (after, hops)
        event_groups[record.event_id] = group
        event_group_rows.append((record.event_id, group))
    return visibility


def _keys_changed_since(old_state: GroupState, room_id: str, states: StateGroupStore,
                        out: PersistOutcome) -> set[StateKey] | None:
    """The keys that may differ between *old_state* and the room's new current state,
    from the deltas of the groups this batch made, or None when the new state does
    not descend from the old one through them.

    Saves comparing two whole room states (thousands of members) per batch."""
    forward = out.forward[room_id]
    if len(forward) != 1:
        return None
    group = out.event_groups.get(next(iter(forward)))
    keys: set[StateKey] = set()
    while group is not None and group in out.group_parents:
        parent, delta_keys = out.group_parents[group]
        keys.update(delta_keys)
        group = parent
    if group is None:
        return None
    cached = out.new_groups.get(group) or states.group_cache.get(group)
    if cached is None or cached[0] is not old_state:
        return None
    return keys


def _update_current_state(txn: Transaction, writes: Writes, room_id: str,
                          states: StateGroupStore, resolver: StateResolver,
                          orderings: dict[str, tuple[int, int]], out: PersistOutcome,
                          current_state_cache: Lru[str, GroupState],
                          allocator: StreamAllocator,
                          batch_memberships: dict[str, str]) -> None:
    """Queue on *writes* the room's current-state changes the batch makes."""
    new_state = current_state_of(txn, states, resolver, room_id, out.forward[room_id],
                                 out.event_groups, out.new_groups, orderings)
    old_state = current_state_cache.get(room_id)
    if old_state is None:
        old_state = MappingProxyType({
            (t, sk): e for t, sk, e in txn.fetchall(
                "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
                (room_id,))})
    out.current_state[room_id] = new_state
    if new_state is old_state:
        return
    candidates = _keys_changed_since(old_state, room_id, states, out)
    if candidates is None:  # not a descendant of the old state: compare them whole
        candidates = set(old_state) | set(new_state)
    changed = sorted(k for k in candidates if old_state.get(k) != new_state.get(k))
    if not changed:
        return
    memberships: dict[str, str] = {}
    member_ids = []
    for k in changed:
        if k[0] == "m.room.member" and k in new_state:
            event_id = new_state[k]
            if event_id in batch_memberships:
                memberships[event_id] = batch_memberships[event_id]
            else:
                member_ids.append(event_id)
    for chunk in _chunks(member_ids):
        params: list[Any] = []
        for event_id, membership in txn.fetchall(
                "SELECT event_id, membership FROM events WHERE "
                + _in_list(txn, "event_id", chunk, params), params):
            memberships[event_id] = membership
    # A backfill can move extremities too; its state rows still need a live position.
    stream_id = out.max_stream if out.max_stream > 0 else allocator.next_live(txn)
    out.max_live = max(out.max_live, stream_id)
    users = out.current_state_changes.setdefault(room_id, set())
    current_rows = []
    delta_rows = []
    writes.delete_rows("current_state_events", "room_id, type, state_key",
                       [(room_id, etype, state_key) for etype, state_key in changed])
    for etype, state_key in changed:
        new_id = new_state.get((etype, state_key))
        if new_id is not None:
            current_rows.append((new_id, room_id, etype, state_key, memberships.get(new_id)))
        delta_rows.append((stream_id, room_id, etype, state_key, new_id,
                           old_state.get((etype, state_key))))
        if etype == "m.room.member":
            users.add(state_key)
    writes.insert("current_state_events", "event_id, room_id, type, state_key, membership",
                  current_rows)
    writes.insert("current_state_delta_stream", "stream_id, room_id, type, state_key, event_id,"
                  " prev_event_id", delta_rows)
