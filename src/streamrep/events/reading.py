"""Queries that read events back: orders, sync, initial sync and back pagination.

Every timeline query applies the visibility rule of :mod:`visibility` in SQL and
leaves out outliers, rejected and soft-failed events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.events.redaction import prune_event_json
from streamrep.events.tokens import TopologicalToken
from streamrep.events.visibility import MEMBERSHIP_AT_EVENT_SQL, VISIBLE_TO_USER_SQL

__all__ = ["StoredEvent", "EVENT_COLUMNS", "event_from_row", "fetch_events",
           "visible_timeline", "user_membership_changes", "currently_joined"]

EVENT_COLUMNS = (
    "e.event_id, e.room_id, e.type, e.state_key, e.sender, e.topological_ordering,"
    " e.stream_ordering, e.outlier, e.rejected, e.soft_failed, e.redacted, e.membership,"
    " e.history_visibility, e.json"
)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as stored. ``json`` is exactly the bytes received, unless the event
    is redacted: then it is the pruned event."""

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


def event_from_row(row: Sequence[Any]) -> StoredEvent:
    raw = bytes(row[13])
    redacted = bool(row[10])
    return StoredEvent(
        event_id=row[0], room_id=row[1], type=row[2], state_key=row[3], sender=row[4],
        topological_ordering=int(row[5]), stream_ordering=int(row[6]), outlier=bool(row[7]),
        rejected=bool(row[8]), soft_failed=bool(row[9]), redacted=redacted, membership=row[11],
        history_visibility=row[12], json=prune_event_json(raw) if redacted else raw,
    )


def fetch_events(txn: Transaction, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
    out: dict[str, StoredEvent] = {}
    for chunk in chunks(list(event_ids)):
        params: list[Any] = []
        for row in txn.fetchall(
                f"SELECT {EVENT_COLUMNS} FROM events e WHERE "
                + in_list(txn, "e.event_id", chunk, params), params):
            event = event_from_row(row)
            out[event.event_id] = event
    return out


def currently_joined(txn: Transaction, room_id: str, user_id: str) -> bool:
    membership = txn.fetchval(
        "SELECT membership FROM current_state_events WHERE room_id = ? AND type = ?"
        " AND state_key = ?", (room_id, "m.room.member", user_id))
    return bool(membership == "join")


def visible_timeline(txn: Transaction, room_id: str, user_id: str, *, where: str,
                     params: Sequence[Any], order: str, limit: int) -> list[StoredEvent]:
    """The room's timeline events that *user_id* may see, filtered by *where*
    (over the events ``e``), in *order*, at most *limit*."""
    joined = 1 if currently_joined(txn, room_id, user_id) else 0
    sql = (
        f"SELECT x.* FROM (SELECT {EVENT_COLUMNS}, {MEMBERSHIP_AT_EVENT_SQL} AS mem"
        " FROM events e"
        " WHERE e.room_id = ? AND NOT e.outlier AND NOT e.rejected AND NOT e.soft_failed"
        f" AND {where}) x WHERE {VISIBLE_TO_USER_SQL} ORDER BY {order} LIMIT ?"
    )
    rows = txn.fetchall(sql, [user_id, room_id, *params, user_id, joined, limit])
    return [event_from_row(r) for r in rows]


def user_membership_changes(txn: Transaction, user_id: str, since: int, until: int,
                            limit: int) -> list[StoredEvent]:
    """The user's membership events (out-of-band ones included) after *since*."""
    rows = txn.fetchall(
        f"SELECT {EVENT_COLUMNS} FROM room_memberships m"
        " JOIN events e ON e.event_id = m.event_id"
        " WHERE m.user_id = ? AND m.stream_ordering > ? AND m.stream_ordering <= ?"
        " ORDER BY m.stream_ordering LIMIT ?", (user_id, since, until, limit))
    return [event_from_row(r) for r in rows]
