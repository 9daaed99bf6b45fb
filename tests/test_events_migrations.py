"""The event store's schema migrations carry stored events forward."""

from __future__ import annotations

import pytest

from streamrep import EventStore
from streamrep.db import Database
from streamrep.events import schema

RAW = b'{"room_id":"!r:x","type":"m.room.create","state_key":"","sender":"@a:x",' \
      b'"depth":1,"prev_events":[],"content":{"creator":"@a:x"}}'


@pytest.mark.parametrize("db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_version_1_database_keeps_event_json(db_url: str) -> None:
    db = Database.open(db_url, migrate=False)
    try:
        with db.transaction("v1") as txn:
            txn.execute("CREATE TABLE IF NOT EXISTS schema_versions ("
                        " component TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL)")
            for statement in schema.MIGRATIONS[0].statements(db.engine):
                txn.execute(statement)
            txn.execute("INSERT INTO schema_versions (component, version) VALUES (?, ?)",
                        (schema.COMPONENT, 1))
            txn.execute(
                "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id,"
                " type, state_key, sender, outlier, rejected, soft_failed, redacted,"
                " received_ts) VALUES (1, 1, '$c', '!r:x', 'm.room.create', '', '@a:x',"
                " ?, ?, ?, ?, 0)", (False, False, False, False))
            txn.execute("INSERT INTO event_json (event_id, room_id, json) VALUES (?, ?, ?)",
                        ("$c", "!r:x", RAW))
        store = EventStore(db)
        assert db.schema_version(schema.COMPONENT) == schema.MIGRATIONS[-1].version
        assert store.get_event_json("$c") == RAW
        assert store.get_event("$c").json == RAW
        store.persist_events([{"event_id": "$m", "room_id": "!r:x", "type": "m.room.message",
                               "sender": "@a:x", "depth": 2, "prev_events": ["$c"],
                               "content": {"body": "hi"}}])
        assert store.get_room_events("!r:x", order="stream") == ["$c", "$m"]
    finally:
        db.close()
