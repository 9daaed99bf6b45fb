"""Tables of the Matrix room rules (schema component ``matrix``), reference names.

* ``rooms(room_id, room_version)`` - each room's version, from its create event;
* ``event_auth(event_id, auth_id, room_id)`` - each stored event's auth events
  (in room version 12 including the create event the room ID names);
* ``rejections(event_id, reason, last_check)`` - why an event was rejected and
  when (milliseconds since the epoch) that was decided.

Migration 1 also fills ``rooms`` and ``event_auth`` from the events already stored,
so a database written before these tables existed gets them complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from streamrep.db import Migration, register_schema

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


def _backfill(txn: "Transaction") -> None:
    """Rooms and auth edges of the events stored before these tables existed."""
    rows = txn.fetchall("SELECT event_id, room_id, type, state_key, json FROM events")
    auth_rows: list[tuple[str, str, str]] = []
    rooms: list[tuple[str, str]] = []
    for event_id, room_id, etype, state_key, raw in rows:
        try:
            body = orjson.loads(bytes(raw))
        except orjson.JSONDecodeError:
            continue
        auth_rows.extend((event_id, a, room_id) for a in _auth_ids(body))
        if etype == "m.room.create" and state_key == "":
            content = body.get("content") if isinstance(body, dict) else None
            version = content.get("room_version", "1") if isinstance(content, dict) else "1"
            rooms.append((room_id, str(version)))
    if auth_rows:
        txn.executemany("INSERT INTO event_auth (event_id, auth_id, room_id) VALUES (?, ?, ?)",
                        auth_rows)
    if rooms:
        txn.executemany("INSERT INTO rooms (room_id, room_version) VALUES (?, ?)"
                        " ON CONFLICT (room_id) DO NOTHING", rooms)


MIGRATIONS = [
    Migration(version=1, sql=_TABLES, run=_backfill,
              description="room versions, auth events, rejections"),
]

register_schema(COMPONENT, MIGRATIONS)
