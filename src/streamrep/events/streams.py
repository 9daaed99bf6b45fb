"""The ``events`` and ``backfill`` streams: the rows the writer's tables yield, and
the worker-side follower that keeps another process's caches correct from them.

``events`` rows (token = stream ordering, positive):

* ``["ev", [event_id, room_id, type, state_key, redacts, relates_to, membership,
  rejected, outlier]]`` for every event persisted live (or de-outliered);
* ``["state", [room_id, type, state_key, event_id]]`` for every change of a room's
  current state (``event_id`` null when the key left the state).

Followers also accept ``["state-all", [room_id]]`` (every current-state key of the
room may have changed), which other writers of the protocol send.

``backfill`` rows are ``[event_id, room_id, type, state_key, redacts, relates_to]``;
backfilled events have negative, decreasing stream orderings and the stream's token
is ``-stream_ordering`` (so it increases like every other stream token).

Persisting also produces ``caches`` rows (``cs_cache_fake`` with ``[room_id,
*users_whose_membership_changed]`` for current-state changes, ``get_event`` for
redacted events), handed to ``EventStore(on_persisted=...)`` for the ``caches``
stream writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from streamrep.db import Database
from streamrep.events import schema
from streamrep.events.orderings import BACKFILL_STREAM, EVENTS_STREAM, backfill_position, live_position
from streamrep.idgen import BackingTable
from streamrep.streams import RowFormat, StreamDefinition

if TYPE_CHECKING:
    from streamrep.events.store import EventStore

__all__ = [
    "EVENTS_STREAM",
    "BACKFILL_STREAM",
    "StreamRows",
    "get_events_stream_rows",
    "get_backfill_stream_rows",
    "current_events_token",
    "current_backfill_token",
    "EventsStreamFollower",
    "EVENTS_STREAM_DEFINITION",
    "BACKFILL_STREAM_DEFINITION",
    "EVENT_STORE_STREAMS",
]

_EV_COLUMNS = ("event_id, room_id, type, state_key, redacts, relates_to, membership,"
               " rejected, outlier")


@dataclass(frozen=True)
class StreamRows:
    """Rows ``(token, row)`` in token order, the token up to which they are complete,
    and whether the limit cut them short."""

    rows: list[tuple[int, list[Any]]]
    upto_token: int
    limited: bool


def _ev_payload(row: Sequence[Any]) -> list[Any]:
    return [row[0], row[1], row[2], row[3], row[4], row[5], row[6], bool(row[7]), bool(row[8])]


def _backfill_row(row: Sequence[Any]) -> list[Any]:
    return [row[0], row[1], row[2], row[3], row[4], row[5]]


def current_events_token(db: Database) -> int:
    """The highest position on the ``events`` stream."""
    return live_position(db)


def current_backfill_token(db: Database) -> int:
    """The highest position on the ``backfill`` stream (``-MIN(stream_ordering)``)."""
    return backfill_position(db)


def get_events_stream_rows(db: Database, from_token: int, to_token: int,
                           limit: int = 1000) -> StreamRows:
    """``events`` rows with ``from_token < token <= to_token``."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    with db.transaction("events_stream_rows", read_only=True) as txn:
        ev = txn.fetchall(
            f"SELECT {_EV_COLUMNS}, stream_ordering FROM events WHERE stream_ordering > ?"
            " AND stream_ordering <= ? ORDER BY stream_ordering LIMIT ?",
            (from_token, to_token, limit))
        state = txn.fetchall(
            "SELECT stream_id, room_id, type, state_key, event_id FROM current_state_delta_stream"
            " WHERE stream_id > ? AND stream_id <= ? ORDER BY stream_id, room_id, type, state_key"
            " LIMIT ?", (from_token, to_token, limit))
        upto = to_token
        limited = False
        if len(ev) == limit:
            upto, limited = min(upto, int(ev[-1][9])), True
        if len(state) == limit:
            last = int(state[-1][0])
            # Rows of one position travel together: stop before the last position,
            # or take all of it when it is the only one.
            if last - 1 > from_token:
                upto, limited = min(upto, last - 1), True
            else:
                upto, limited = min(upto, last), True
                state = txn.fetchall(
                    "SELECT stream_id, room_id, type, state_key, event_id"
                    " FROM current_state_delta_stream WHERE stream_id = ?"
                    " ORDER BY room_id, type, state_key", (last,))
    rows: list[tuple[int, list[Any]]] = []
    for r in ev:
        if int(r[9]) <= upto:
            rows.append((int(r[9]), ["ev", _ev_payload(r)]))
    for r in state:
        if int(r[0]) <= upto:
            rows.append((int(r[0]), ["state", [r[1], r[2], r[3], r[4]]]))
    rows.sort(key=lambda t: (t[0], t[1][0] != "ev"))
    return StreamRows(rows, upto, limited)


def get_backfill_stream_rows(db: Database, from_token: int, to_token: int,
                             limit: int = 1000) -> StreamRows:
    """``backfill`` rows with ``from_token < token <= to_token`` (token =
    ``-stream_ordering``)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    ev = db.fetchall(
        f"SELECT {_EV_COLUMNS}, stream_ordering FROM events WHERE stream_ordering < ?"
        " AND stream_ordering >= ? ORDER BY stream_ordering DESC LIMIT ?",
        (-from_token, -to_token, limit))
    rows = [(-int(r[9]), _backfill_row(r)) for r in ev]
    limited = len(ev) == limit
    return StreamRows(rows, rows[-1][0] if limited else to_token, limited)


class EventsStreamFollower:
    """Applies ``events``/``backfill``/``caches`` rows to a worker's :class:`EventStore`:
    its change caches, event cache, forward extremity and current-state caches."""

    def __init__(self, store: "EventStore") -> None:
        self.store = store

    def on_events_row(self, token: int, row: Sequence[Any]) -> None:
        """One ``events`` stream row at *token*."""
        kind, data = row[0], row[1]
        store = self.store
        if kind == "ev":
            (event_id, room_id, _type, state_key, redacts, _rel, membership, rejected,
             outlier) = data
            store.event_cache.pop(event_id)
            if redacts:
                store.event_cache.pop(redacts)
            store.room_changes.entity_has_changed(room_id, token)
            if membership is not None and state_key is not None and not rejected:
                store.membership_changes.entity_has_changed(state_key, token)
            if not outlier:
                store.invalidate_extremities(room_id)
        elif kind in ("state", "state-all"):
            store.invalidate_current_state(data[0])
        else:
            raise ValueError(f"unknown events stream row kind {kind!r}")
        store.advance_position(token)

    def on_backfill_row(self, token: int, row: Sequence[Any]) -> None:
        """One ``backfill`` stream row (backfill never moves the change caches).

        The row does not say whether the event is an outlier, so the room's cached
        extremities are always dropped (re-read on next use)."""
        event_id, room_id, _type, _state_key, redacts, _rel = row
        self.store.event_cache.pop(event_id)
        if redacts:
            self.store.event_cache.pop(redacts)
        self.store.invalidate_extremities(room_id)

    def on_caches_row(self, cache_name: str, key: Sequence[Any] | None) -> None:
        """One ``caches`` stream row this store cares about."""
        if cache_name == "cs_cache_fake":
            self.store.invalidate_current_state(key[0] if key else None)
        elif cache_name == "get_event":
            if key is None:
                self.store.event_cache.clear()
            else:
                self.store.event_cache.pop(key[0])

    def catch_up(self, from_token: int, to_token: int, batch: int = 1000) -> int:
        """Apply every ``events`` row in ``(from_token, to_token]`` read from the
        database; returns the token reached."""
        token = from_token
        while token < to_token:
            chunk = get_events_stream_rows(self.store.db, token, to_token, batch)
            for row_token, row in chunk.rows:
                self.on_events_row(row_token, row)
            if chunk.upto_token <= token:
                break
            token = chunk.upto_token
            self.store.advance_position(token)
        return token


def _events_rows(txn: Any, from_token: int, upto_token: int,
                 limit: int | None) -> list[tuple[int, list[Any]]]:
    lim = "" if limit is None else f" LIMIT {int(limit)}"
    ev = txn.fetchall(
        f"SELECT {_EV_COLUMNS}, stream_ordering FROM events WHERE stream_ordering > ?"
        f" AND stream_ordering <= ? ORDER BY stream_ordering{lim}", (from_token, upto_token))
    state = txn.fetchall(
        "SELECT stream_id, room_id, type, state_key, event_id FROM current_state_delta_stream"
        " WHERE stream_id > ? AND stream_id <= ? ORDER BY stream_id, room_id, type, state_key"
        f"{lim}", (from_token, upto_token))
    rows = [(int(r[9]), ["ev", _ev_payload(r)]) for r in ev]
    rows += [(int(r[0]), ["state", [r[1], r[2], r[3], r[4]]]) for r in state]
    rows.sort(key=lambda t: (t[0], t[1][0] != "ev"))
    return rows if limit is None else rows[:limit]


@dataclass(frozen=True)
class EventsStream(StreamDefinition):
    """The ``events`` stream (single writer): ``ev`` and ``state`` rows."""

    def fetch_rows(self, txn: Any, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[tuple[int, list[Any]]]:
        return _events_rows(txn, from_token, upto_token, limit)


@dataclass(frozen=True)
class BackfillStream(StreamDefinition):
    """The ``backfill`` stream: ``[event_id, room_id, type, state_key, redacts,
    relates_to]`` rows; tokens are ``-stream_ordering``."""

    def fetch_rows(self, txn: Any, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[tuple[int, list[Any]]]:
        lim = "" if limit is None else f" LIMIT {int(limit)}"
        ev = txn.fetchall(
            f"SELECT {_EV_COLUMNS}, stream_ordering FROM events WHERE stream_ordering < ?"
            f" AND stream_ordering >= ? ORDER BY stream_ordering DESC{lim}",
            (-from_token, -upto_token))
        return [(-int(r[9]), _backfill_row(r)) for r in ev]


EVENTS_STREAM_DEFINITION = EventsStream(
    EVENTS_STREAM,
    tables=(BackingTable("events", "stream_ordering", None),
            BackingTable("current_state_delta_stream", "stream_id", None)),
    schema_component=schema.COMPONENT,
    row=RowFormat.tagged({
        # streamrep sends booleans; the reference on SQLite sends 0 and 1.
        "ev": (("event_id", "string"), ("room_id", "string"), ("type", "string"),
               ("state_key", "string|null"), ("redacts", "string|null"),
               ("relates_to", "string|null"), ("membership", "string|null"),
               ("rejected", "flag"), ("outlier", "flag")),
        "state": (("room_id", "string"), ("type", "string"), ("state_key", "string"),
                  ("event_id", "string|null")),
        "state-all": (("room_id", "string"),),
    }),
)
BACKFILL_STREAM_DEFINITION = BackfillStream(
    BACKFILL_STREAM,
    tables=(BackingTable("events", "stream_ordering", None),),
    negative=True,
    # Backfilled rows are written in the events writer's transactions.
    writers_follow=EVENTS_STREAM,
    schema_component=schema.COMPONENT,
    row=RowFormat.flat(("event_id", "string"), ("room_id", "string"), ("type", "string"),
                       ("state_key", "string|null"), ("redacts", "string|null"),
                       ("relates_to", "string|null")),
)

#: The event store's streams, for a :class:`~streamrep.streams.StreamSet`.
EVENT_STORE_STREAMS: tuple[StreamDefinition, ...] = (EVENTS_STREAM_DEFINITION,
                                                     BACKFILL_STREAM_DEFINITION)
