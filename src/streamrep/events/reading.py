"""Queries that read events back: orders, sync, initial sync and back pagination.

Every timeline query leaves out outliers, rejected and soft-failed events and keeps
the events the user may see by the history visibility rule on the room's DAG state
(:class:`~streamrep.events.visibility.UserView`), reading the room's events a page
at a time in the timeline's order until it has enough. Redacted events are pruned
by their room's version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.events.redaction import prune_event_json
from streamrep.events.roomversions import RoomVersions
from streamrep.events.state import StateGroupStore
from streamrep.events.tokens import TopologicalToken
from streamrep.events.visibility import UserView
from streamrep.lru import Lru

__all__ = ["StoredEvent", "EVENT_COLUMNS", "NEWEST_FIRST", "Readers", "STREAM_ORDER",
           "events_from_rows", "fetch_events", "visible_timeline", "user_membership_changes"]

EVENT_COLUMNS = (
    "e.event_id, e.room_id, e.type, e.state_key, e.sender, e.topological_ordering,"
    " e.stream_ordering, e.outlier, e.rejected, e.soft_failed, e.redacted, e.membership,"
    " e.history_visibility, e.json"
)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as stored. ``json`` is exactly the bytes received, unless the event
    is redacted: then it is the event as its room version's redaction algorithm
    prunes it."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str
    topological_ordering: int
    stream_ordering: int
    outlier: bool
    rejected: bool
    soft_failed: bool
    redacted: bool
    membership: str | None
    history_visibility: str | None
    json: bytes

    @property
    def token(self) -> TopologicalToken:
        """The event's position in its room's topological order."""
        return TopologicalToken(self.topological_ordering, self.stream_ordering)

    def as_dict(self) -> dict[str, Any]:
        """The event JSON decoded (pruned when redacted)."""
        value = orjson.loads(self.json)
        assert isinstance(value, dict)
        return value


def events_from_rows(txn: Transaction, rows: Sequence[Sequence[Any]],
                     versions: RoomVersions) -> list[StoredEvent]:
    """The events of *rows* (``EVENT_COLUMNS``), the redacted ones pruned by their
    rooms' versions."""
    redacted_rooms = {row[1] for row in rows if row[10]}
    by_room = versions.of(txn, redacted_rooms) if redacted_rooms else {}
    out = []
    for row in rows:
        raw = bytes(row[13])
        redacted = bool(row[10])
        out.append(StoredEvent(
            event_id=row[0], room_id=row[1], type=row[2], state_key=row[3], sender=row[4],
            topological_ordering=int(row[5]), stream_ordering=int(row[6]),
            outlier=bool(row[7]), rejected=bool(row[8]), soft_failed=bool(row[9]),
            redacted=redacted, membership=row[11], history_visibility=row[12],
            json=prune_event_json(raw, by_room[row[1]]) if redacted else raw))
    return out


def fetch_events(txn: Transaction, event_ids: Sequence[str],
                 versions: RoomVersions) -> dict[str, StoredEvent]:
    rows: list[Sequence[Any]] = []
    for chunk in chunks(list(event_ids)):
        params: list[Any] = []
        rows.extend(txn.fetchall(
            f"SELECT {EVENT_COLUMNS} FROM events e WHERE "
            + in_list(txn, "e.event_id", chunk, params), params))
    return {event.event_id: event for event in events_from_rows(txn, rows, versions)}


@dataclass(frozen=True)
class Readers:
    """What the timeline readers read through besides the transaction: the store's
    state groups, its cache of visibility settings and its rooms' versions."""

    states: StateGroupStore
    settings: Lru[str, str]
    versions: RoomVersions


#: Timeline orders: ascending stream order (sync), or newest first in topological
#: order (initial sync, back pagination).
STREAM_ORDER = "stream"
NEWEST_FIRST = "newest_first"

_ORDER_BY = {STREAM_ORDER: "e.stream_ordering",
             NEWEST_FIRST: "e.topological_ordering DESC, e.stream_ordering DESC"}
#: Rows read at a time while a timeline is filtered.
_PAGE = 100


def _after_clause(order: str, last: Sequence[Any]) -> tuple[str, list[Any]]:
    """The condition for the rows after *last* (a row read) in *order*."""
    if order == STREAM_ORDER:
        return " AND e.stream_ordering > ?", [last[6]]
    return (" AND (e.topological_ordering < ? OR (e.topological_ordering = ?"
            " AND e.stream_ordering < ?))", [last[5], last[5], last[6]])


def visible_timeline(txn: Transaction, room_id: str, user_id: str, *, where: str,
                     params: Sequence[Any], order: str, limit: int,
                     readers: Readers) -> list[StoredEvent]:
    """The room's timeline events that *user_id* may see (:class:`UserView`),
    filtered by *where* (over the events ``e``), in *order*, at most *limit*.
    Outliers, rejected and soft-failed events are never in a timeline."""
    view = UserView(txn, room_id, user_id, readers.states, readers.settings)
    out: list[StoredEvent] = []
    after: str = ""
    after_params: list[Any] = []
    while len(out) < limit:
        rows = txn.fetchall(
            f"SELECT {EVENT_COLUMNS}, g.state_group, m.replaces_state FROM events e"
            " LEFT JOIN event_to_state_groups g ON g.event_id = e.event_id"
            " LEFT JOIN room_memberships m ON m.event_id = e.event_id AND m.user_id = ?"
            " WHERE e.room_id = ? AND NOT e.outlier AND NOT e.rejected AND NOT e.soft_failed"
            f" AND {where}{after} ORDER BY {_ORDER_BY[order]} LIMIT ?",
            [user_id, room_id, *params, *after_params, _PAGE])
        if not rows:
            break
        view.prepare([r[14] for r in rows], [r[15] for r in rows])
        events = events_from_rows(txn, rows, readers.versions)
        for row, event in zip(rows, events):
            if view.allows(event, row[14], row[15]):
                out.append(event)
                if len(out) == limit:
                    break
        if len(rows) < _PAGE:
            break
        after, after_params = _after_clause(order, rows[-1])
    return out


def user_membership_changes(txn: Transaction, user_id: str, since: int, until: int,
                            limit: int, versions: RoomVersions) -> list[StoredEvent]:
    """The user's membership events (out-of-band ones included) after *since*."""
    rows = txn.fetchall(
        f"SELECT {EVENT_COLUMNS} FROM room_memberships m"
        " JOIN events e ON e.event_id = m.event_id"
        " WHERE m.user_id = ? AND m.stream_ordering > ? AND m.stream_ordering <= ?"
        " ORDER BY m.stream_ordering LIMIT ?", (user_id, since, until, limit))
    return events_from_rows(txn, rows, versions)
