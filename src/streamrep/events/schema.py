"""The event store's tables (schema component ``events``) on SQLite and PostgreSQL.

The four state tables keep the reference system's table and column names so
state tooling written for its databases also runs here.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamrep.db import Migration, Transaction, register_schema
from streamrep.matrix.visibility import normalise_visibility

COMPONENT = "events"

# {pk} is the events table's primary key column type: on SQLite an INTEGER PRIMARY
# KEY aliases the rowid (one B-tree fewer per insert). {wr} makes key-only tables
# clustered on their primary key on SQLite.
_TEMPLATE = [
    # One row per stored event; stream_ordering < 0 for backfilled events.
    """CREATE TABLE events (
        stream_ordering {pk},
        topological_ordering BIGINT NOT NULL,
        event_id TEXT NOT NULL UNIQUE,
        room_id TEXT NOT NULL,
        type TEXT NOT NULL,
        state_key TEXT,
        sender TEXT NOT NULL,
        outlier BOOLEAN NOT NULL,
        rejected BOOLEAN NOT NULL,
        soft_failed BOOLEAN NOT NULL,
        redacted BOOLEAN NOT NULL,
        redacts TEXT,
        relates_to TEXT,
        membership TEXT,
        history_visibility TEXT,
        received_ts BIGINT NOT NULL
    )""",
    "CREATE INDEX events_room_topo ON events (room_id, topological_ordering, stream_ordering)",
    "CREATE INDEX events_room_stream ON events (room_id, stream_ordering)",
    "CREATE INDEX events_redacts ON events (redacts) WHERE redacts IS NOT NULL",
    "CREATE TABLE event_edges (event_id TEXT NOT NULL, prev_event_id TEXT NOT NULL,"
    " room_id TEXT NOT NULL, PRIMARY KEY (event_id, prev_event_id)){wr}",
    "CREATE INDEX event_edges_prev ON event_edges (prev_event_id)",
    "CREATE TABLE event_forward_extremities (event_id TEXT NOT NULL, room_id TEXT NOT NULL,"
    " PRIMARY KEY (room_id, event_id)){wr}",
    "CREATE TABLE event_backward_extremities (event_id TEXT NOT NULL, room_id TEXT NOT NULL,"
    " PRIMARY KEY (room_id, event_id)){wr}",
    "CREATE TABLE current_state_events (event_id TEXT NOT NULL, room_id TEXT NOT NULL,"
    " type TEXT NOT NULL, state_key TEXT NOT NULL, membership TEXT,"
    " PRIMARY KEY (room_id, type, state_key))",
    "CREATE INDEX current_state_members ON current_state_events (state_key, type, membership)",
    # The ``state`` rows of the events stream: one per current-state key change.
    "CREATE TABLE current_state_delta_stream (stream_id BIGINT NOT NULL, room_id TEXT NOT NULL,"
    " type TEXT NOT NULL, state_key TEXT NOT NULL, event_id TEXT, prev_event_id TEXT)",
    "CREATE INDEX current_state_delta_stream_id ON current_state_delta_stream (stream_id)",
    "CREATE TABLE room_memberships (event_id TEXT NOT NULL PRIMARY KEY, user_id TEXT NOT NULL,"
    " sender TEXT NOT NULL, room_id TEXT NOT NULL, membership TEXT NOT NULL,"
    " stream_ordering BIGINT NOT NULL, topological_ordering BIGINT NOT NULL,"
    " outlier BOOLEAN NOT NULL)",
    "CREATE INDEX room_memberships_user ON room_memberships (user_id, stream_ordering)",
    "CREATE INDEX room_memberships_room_user ON room_memberships"
    " (room_id, user_id, topological_ordering, stream_ordering)",
    "CREATE TABLE room_history_visibility (event_id TEXT NOT NULL PRIMARY KEY,"
    " room_id TEXT NOT NULL, history_visibility TEXT NOT NULL)",
    "CREATE TABLE state_groups (id BIGINT NOT NULL PRIMARY KEY, room_id TEXT NOT NULL,"
    " event_id TEXT NOT NULL)",
    "CREATE TABLE state_group_edges (state_group BIGINT NOT NULL, prev_state_group BIGINT NOT NULL)",
    "CREATE UNIQUE INDEX state_group_edges_unique ON state_group_edges (state_group)",
    "CREATE INDEX state_group_edges_prev ON state_group_edges (prev_state_group)",
    "CREATE TABLE state_groups_state (state_group BIGINT NOT NULL, room_id TEXT NOT NULL,"
    " type TEXT NOT NULL, state_key TEXT NOT NULL, event_id TEXT NOT NULL)",
    "CREATE INDEX state_groups_state_group ON state_groups_state (state_group)",
    "CREATE TABLE event_to_state_groups (event_id TEXT NOT NULL PRIMARY KEY,"
    " state_group BIGINT NOT NULL){wr}",
]


def _statements(pk: str, wr: str) -> list[str]:
    return [sql.replace("{pk}", pk).replace("{wr}", wr) for sql in _TEMPLATE]


MIGRATIONS = [
    Migration(
        version=1,
        # The exact bytes received are kept in event_json, so signatures stay valid.
        sqlite=[*_statements("INTEGER PRIMARY KEY", " WITHOUT ROWID"),
                "CREATE TABLE event_json (event_id TEXT NOT NULL PRIMARY KEY,"
                " room_id TEXT NOT NULL, json BLOB NOT NULL)"],
        postgres=[*_statements("BIGINT NOT NULL PRIMARY KEY", ""),
                  "CREATE TABLE event_json (event_id TEXT NOT NULL PRIMARY KEY,"
                  " room_id TEXT NOT NULL, json BYTEA NOT NULL)"],
        description="events, edges, extremities, current state, memberships, state groups",
    ),
    Migration(
        version=2,
        # The JSON moves into the events row: one table and one unique index fewer to
        # write per persisted event, and reads of an event touch one row.
        sqlite=["ALTER TABLE events ADD COLUMN json BLOB NOT NULL DEFAULT x''",
                "UPDATE events SET json = COALESCE((SELECT j.json FROM event_json j"
                " WHERE j.event_id = events.event_id), json)",
                "DROP TABLE event_json"],
        postgres=["ALTER TABLE events ADD COLUMN json BYTEA",
                  "UPDATE events e SET json = j.json FROM event_json j WHERE j.event_id = e.event_id",
                  "UPDATE events SET json = '' WHERE json IS NULL",
                  "ALTER TABLE events ALTER COLUMN json SET NOT NULL",
                  "DROP TABLE event_json"],
        description="event JSON stored in the events row",
    ),
]

def _settings_as_read_now(txn: Transaction) -> None:
    """Every ``room_history_visibility`` value as its event's JSON names it now (a
    value streamrep does not know counts as ``shared``, which an earlier release
    recorded as ``joined``)."""
    changed: list[tuple[str, str]] = []
    for event_id, raw, recorded in txn.fetchall(
            "SELECT e.event_id, e.json, v.history_visibility FROM room_history_visibility v"
            " JOIN events e ON e.event_id = v.event_id", ()):
        try:
            body: Any = orjson.loads(bytes(raw))
        except orjson.JSONDecodeError:
            continue
        setting = normalise_visibility(body.get("content") if isinstance(body, dict) else None)
        if setting != recorded:
            changed.append((setting, event_id))
    if changed:
        txn.executemany("UPDATE room_history_visibility SET history_visibility = ?"
                        " WHERE event_id = ?", changed)


MIGRATIONS.append(Migration(
    version=3,
    # Each membership event names the one it replaced in the state before it, for the
    # history visibility of a user's own membership events. Rows stored before take
    # the user's previous membership event in topological order (the same for linear
    # history).
    sql=["ALTER TABLE room_memberships ADD COLUMN replaces_state TEXT",
         "UPDATE room_memberships SET replaces_state = (SELECT p.event_id FROM room_memberships p"
         " WHERE p.room_id = room_memberships.room_id AND p.user_id = room_memberships.user_id"
         " AND NOT p.outlier AND (p.topological_ordering < room_memberships.topological_ordering"
         " OR (p.topological_ordering = room_memberships.topological_ordering"
         " AND p.stream_ordering < room_memberships.stream_ordering))"
         " ORDER BY p.topological_ordering DESC, p.stream_ordering DESC LIMIT 1)"
         " WHERE NOT outlier"],
    run=_settings_as_read_now,
    description="membership events name the one they replace; visibility values read anew",
))

register_schema(COMPONENT, MIGRATIONS)
