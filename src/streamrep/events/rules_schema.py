"""The tables of the room rules' verdicts (schema component ``matrix``), with the
reference system's names.

* ``rooms(room_id, room_version)`` - each room's version, from its create event;
* ``event_auth(event_id, auth_id, room_id)`` - each stored state event's auth
  events (in room version 12 including the create event the room ID names), one row
  per auth event. As in the reference system's databases, only state events have
  rows: auth chains are made of state events, and state resolution reads nothing
  else. On PostgreSQL it is the reference's table with its index on ``event_id``;
  on SQLite (migration 3) a table clustered on ``(event_id, auth_id)``;
* ``rejections(event_id, reason, last_check)`` - why an event was rejected and
  when (milliseconds since the epoch) that was decided.

Migration 1 also fills ``rooms`` and ``event_auth`` from the events already stored,
so a database written before these tables existed gets them complete. Migration 2
brings ``event_auth`` as an earlier release left it (rows for every event, version
12 state events without their create event) to the rows above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import orjson

from streamrep.db import Migration, register_schema
# Registered first: this component's migrations read the events tables.
from streamrep.events import schema as _events_schema  # noqa: F401
from streamrep.db.inlists import chunks, in_list
from streamrep.matrix.errors import MatrixError
from streamrep.matrix.events import CREATE, create_event_id_for_room
from streamrep.matrix.room_versions import room_version

if TYPE_CHECKING:
    from streamrep.db.database import Transaction

__all__ = ["COMPONENT"]

COMPONENT = "matrix"

_TABLES = [
    "CREATE TABLE rooms (room_id TEXT NOT NULL PRIMARY KEY, room_version TEXT NOT NULL)",
    "CREATE TABLE event_auth (event_id TEXT NOT NULL, auth_id TEXT NOT NULL,"
    " room_id TEXT NOT NULL)",
    "CREATE INDEX event_auth_id ON event_auth (event_id)",
    "CREATE TABLE rejections (event_id TEXT NOT NULL PRIMARY KEY, reason TEXT NOT NULL,"
    " last_check BIGINT NOT NULL)",
]


def _auth_ids(body: Any) -> list[str]:
    out = []
    for item in body.get("auth_events", ()) if isinstance(body, dict) else ():
        if isinstance(item, list) and item:  # versions 1-2: [event_id, hashes]
            item = item[0]
        if isinstance(item, str):
            out.append(item)
    return out


def _names_create_event(version: str) -> bool:
    """Whether the room ID of a room of *version* names its create event."""
    try:
        return room_version(version).room_id_from_create_event
    except MatrixError:
        return False


#: State events read at a time by the migrations (their JSON is held meanwhile).
_PAGE = 5000


def _fill(txn: "Transaction", room_ids: Sequence[str] | None = None) -> None:
    """The ``rooms`` rows and the state events' ``event_auth`` rows of the events
    stored (of *room_ids* only, when given), reading the state events a page at a
    time."""
    where = ""
    params: list[Any] = []
    if room_ids is not None:
        where = " AND " + in_list(txn, "room_id", room_ids, params)
    versions: dict[str, str] = {}
    for room_id, raw in txn.fetchall(
            "SELECT room_id, json FROM events WHERE type = ? AND state_key = ''" + where,
            [CREATE, *params]):
        try:
            body = orjson.loads(bytes(raw))
        except orjson.JSONDecodeError:
            continue
        content = body.get("content") if isinstance(body, dict) else None
        version = content.get("room_version", "1") if isinstance(content, dict) else "1"
        versions.setdefault(room_id, str(version))
    if versions:
        txn.executemany("INSERT INTO rooms (room_id, room_version) VALUES (?, ?)"
                        " ON CONFLICT (room_id) DO NOTHING", sorted(versions.items()))
    after = None
    while True:
        page = txn.fetchall(
            "SELECT event_id, room_id, type, state_key, json FROM events"
            " WHERE state_key IS NOT NULL" + where
            + ("" if after is None else " AND event_id > ?") + " ORDER BY event_id LIMIT ?",
            [*params, *(() if after is None else (after,)), _PAGE])
        auth_rows: list[tuple[str, str, str]] = []
        for event_id, room_id, etype, state_key, raw in page:
            try:
                body = orjson.loads(bytes(raw))
            except orjson.JSONDecodeError:
                continue
            ids = _auth_ids(body)
            if not (etype == CREATE and state_key == "") and _names_create_event(
                    versions.get(room_id, "1")):
                create_id = create_event_id_for_room(room_id)
                if create_id not in ids:
                    ids.append(create_id)
            auth_rows.extend((event_id, a, room_id) for a in ids)
        if auth_rows:
            txn.executemany(
                "INSERT INTO event_auth (event_id, auth_id, room_id) VALUES (?, ?, ?)",
                auth_rows)
        if len(page) < _PAGE:
            return
        after = page[-1][0]


def _state_events_only(txn: "Transaction") -> None:
    """Drop the rows of events that are not state events; write the rows of the
    rooms whose state events lack their create event again."""
    txn.execute("DELETE FROM event_auth WHERE event_id IN"
                " (SELECT event_id FROM events WHERE state_key IS NULL)")
    rooms = sorted(room_id for room_id, version in txn.fetchall(
        "SELECT room_id, room_version FROM rooms") if _names_create_event(version))
    for chunk in chunks(rooms):
        params: list[Any] = []
        txn.execute("DELETE FROM event_auth WHERE " + in_list(txn, "room_id", chunk, params),
                    params)
        _fill(txn, chunk)


MIGRATIONS = [
    Migration(version=1, sql=_TABLES, run=_fill,
              description="room versions, auth events, rejections"),
    Migration(version=2, run=_state_events_only,
              description="auth events of state events only, version 12's create event included"),
    Migration(
        version=3,
        # SQLite: the rows kept in order of (event_id, auth_id), one B-tree where the
        # table and its index were two. Each B-tree a batch touches costs its commit
        # pages written to the WAL and copied back at the checkpoint. PostgreSQL keeps
        # the reference's layout.
        sqlite=["CREATE TABLE event_auth_by_event (event_id TEXT NOT NULL,"
                " auth_id TEXT NOT NULL, room_id TEXT NOT NULL,"
                " PRIMARY KEY (event_id, auth_id)) WITHOUT ROWID",
                "INSERT INTO event_auth_by_event SELECT event_id, auth_id, room_id"
                " FROM event_auth WHERE true ON CONFLICT DO NOTHING",
                "DROP TABLE event_auth",
                "ALTER TABLE event_auth_by_event RENAME TO event_auth"],
        description="SQLite: auth events clustered by event",
    ),
]

register_schema(COMPONENT, MIGRATIONS)
