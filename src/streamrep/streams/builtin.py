"""The built-in database streams: ``caches``, ``account_data``, ``to_device``,
``receipts`` (and the in-memory ``typing``).

Row formats (the JSON list in each RDATA; docs/streams.md has the full table):

* ``caches``: ``[cache_func, keys or null, invalidation_ts]`` (milliseconds)
* ``account_data``: ``[user_id, room_id or null, data_type]``
* ``to_device``: ``[entity]`` (one row per recipient user of a fact)
* ``receipts``: ``[room_id, receipt_type, user_id, event_id, thread_id or null, data]``
* ``typing``: ``[room_id, [user_id, ...]]``
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import orjson

from streamrep.db import Database, Migration, Transaction, register_schema
from streamrep.errors import StreamIdError
from streamrep.idgen import BackingTable
from streamrep.streams.definition import RowFormat, Stream, StreamDefinition, StreamRow
from streamrep.streams.memory import InMemoryStream

SCHEMA = "streams"

register_schema(SCHEMA, [
    Migration(
        1,
        sql=[
            "CREATE TABLE IF NOT EXISTS cache_invalidations ("
            " stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL,"
            " cache_name TEXT NOT NULL, keys_json TEXT, invalidation_ts BIGINT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS cache_invalidations_id"
            " ON cache_invalidations (instance_name, stream_id)",
            # One row per (user, room, type): a change replaces the row and its stream ID.
            "CREATE TABLE IF NOT EXISTS account_data ("
            " stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL,"
            " user_id TEXT NOT NULL, room_id TEXT NOT NULL, account_data_type TEXT NOT NULL,"
            " content_json TEXT NOT NULL,"
            " PRIMARY KEY (user_id, room_id, account_data_type))",
            "CREATE INDEX IF NOT EXISTS account_data_id ON account_data (instance_name, stream_id)",
            "CREATE TABLE IF NOT EXISTS device_inbox ("
            " stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL,"
            " user_id TEXT NOT NULL, device_id TEXT NOT NULL, message_json TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS device_inbox_id ON device_inbox (instance_name, stream_id)",
            "CREATE INDEX IF NOT EXISTS device_inbox_device ON device_inbox"
            " (user_id, device_id, stream_id)",
            # The latest receipt per (room, type, user, thread).
            "CREATE TABLE IF NOT EXISTS receipts ("
            " stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL,"
            " room_id TEXT NOT NULL, receipt_type TEXT NOT NULL, user_id TEXT NOT NULL,"
            " thread_id TEXT NOT NULL, event_id TEXT NOT NULL, data_json TEXT NOT NULL,"
            " PRIMARY KEY (room_id, receipt_type, user_id, thread_id))",
            "CREATE INDEX IF NOT EXISTS receipts_id ON receipts (instance_name, stream_id)",
        ],
        description="caches, account_data, to_device and receipts streams",
    ),
])


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _check_limit(limit: int | None) -> str:
    return "" if limit is None else f" LIMIT {int(limit)}"


@dataclass(frozen=True)
class CachesStream(StreamDefinition):
    """Cache invalidations: ``[cache_func, keys or null, invalidation_ts]``."""

    def fetch_rows(self, txn: Transaction, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[StreamRow]:
        rows = txn.fetchall(
            "SELECT stream_id, cache_name, keys_json, invalidation_ts FROM cache_invalidations"
            " WHERE instance_name = ? AND stream_id > ? AND stream_id <= ?"
            " ORDER BY stream_id" + _check_limit(limit),
            (instance, from_token, upto_token),
        )
        return [(int(sid), [name, None if keys is None else orjson.loads(keys), int(ts)])
                for sid, name, keys, ts in rows]


@dataclass(frozen=True)
class AccountDataStream(StreamDefinition):
    """Account data changes: ``[user_id, room_id or null, data_type]``."""

    def fetch_rows(self, txn: Transaction, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[StreamRow]:
        rows = txn.fetchall(
            "SELECT stream_id, user_id, room_id, account_data_type FROM account_data"
            " WHERE instance_name = ? AND stream_id > ? AND stream_id <= ?"
            " ORDER BY stream_id" + _check_limit(limit),
            (instance, from_token, upto_token),
        )
        return [(int(sid), [user, room or None, kind]) for sid, user, room, kind in rows]


@dataclass(frozen=True)
class ToDeviceStream(StreamDefinition):
    """To-device messages: ``[entity]``, one row per recipient user of a fact (the
    recipient devices and the messages stay in ``device_inbox``)."""

    def fetch_rows(self, txn: Transaction, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[StreamRow]:
        rows = txn.fetchall(
            "SELECT DISTINCT stream_id, user_id FROM device_inbox"
            " WHERE instance_name = ? AND stream_id > ? AND stream_id <= ?"
            " ORDER BY stream_id, user_id" + _check_limit(limit),
            (instance, from_token, upto_token),
        )
        return [(int(sid), [user]) for sid, user in rows]


@dataclass(frozen=True)
class ReceiptsStream(StreamDefinition):
    """Receipts: ``[room_id, receipt_type, user_id, event_id, thread_id or null, data]``."""

    def fetch_rows(self, txn: Transaction, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[StreamRow]:
        rows = txn.fetchall(
            "SELECT stream_id, room_id, receipt_type, user_id, event_id, thread_id, data_json"
            " FROM receipts WHERE instance_name = ? AND stream_id > ? AND stream_id <= ?"
            " ORDER BY stream_id" + _check_limit(limit),
            (instance, from_token, upto_token),
        )
        return [(int(sid), [room, rtype, user, event, thread or None, orjson.loads(data)])
                for sid, room, rtype, user, event, thread, data in rows]


CACHES = CachesStream(
    "caches", (BackingTable("cache_invalidations"),), "cache_invalidation_stream_seq",
    schema_component=SCHEMA,
    row=RowFormat.flat(("cache_func", "string"), ("keys", "array|null"),
                       ("invalidation_ts", "integer")),
)
ACCOUNT_DATA = AccountDataStream(
    "account_data", (BackingTable("account_data"),), "account_data_sequence",
    schema_component=SCHEMA,
    row=RowFormat.flat(("user_id", "string"), ("room_id", "string|null"),
                       ("data_type", "string")),
)
TO_DEVICE = ToDeviceStream(
    "to_device", (BackingTable("device_inbox"),), "device_inbox_sequence",
    schema_component=SCHEMA, row=RowFormat.flat(("entity", "string")),
)
RECEIPTS = ReceiptsStream(
    "receipts", (BackingTable("receipts"),), "receipts_sequence",
    schema_component=SCHEMA,
    row=RowFormat.flat(("room_id", "string"), ("receipt_type", "string"),
                       ("user_id", "string"), ("event_id", "string"),
                       ("thread_id", "string|null"), ("data", "object")),
)
TYPING = InMemoryStream.Definition(
    "typing", row=RowFormat.flat(("room_id", "string"), ("user_ids", "string[]")))

#: The built-in streams, for a :class:`~streamrep.streams.StreamSet`.
BUILTIN_STREAMS: tuple[StreamDefinition, ...] = (CACHES, ACCOUNT_DATA, TO_DEVICE, RECEIPTS,
                                                 TYPING)


# -- writing ---------------------------------------------------------------------------


def _writer_database(stream: Stream) -> Database:
    """The database *stream* writes to; refuses a process that does not write it."""
    stream.id_gen._require_writer()
    assert stream.db is not None
    return stream.db


def add_cache_invalidation(stream: Stream, instance_name: str, cache_name: str,
                           keys: Sequence[Any] | None,
                           invalidation_ts_ms: int | None = None) -> int:
    """Append one cache invalidation to ``caches``; return its token."""
    db = _writer_database(stream)
    ts = int(time.time() * 1000) if invalidation_ts_ms is None else int(invalidation_ts_ms)
    keys_json = None if keys is None else _json(list(keys))
    # Database.run writes the fact exactly once, on a new connection if one drops;
    # the ID completes when the block exits, whatever the outcome.
    with stream.id_gen.get_next() as stream_id:
        db.run(lambda txn: txn.execute(
            "INSERT INTO cache_invalidations"
            " (stream_id, instance_name, cache_name, keys_json, invalidation_ts)"
            " VALUES (?, ?, ?, ?, ?)",
            (stream_id, instance_name, cache_name, keys_json, ts),
        ), name="add_cache_invalidation")
    return int(stream_id)


def add_account_data(stream: Stream, instance_name: str, user_id: str, data_type: str,
                     content: Mapping[str, Any], room_id: str | None = None) -> int:
    """Set account data (replacing the previous value); return its token."""
    db = _writer_database(stream)
    content_json = _json(dict(content))
    with stream.id_gen.get_next() as stream_id:
        db.run(lambda txn: txn.execute(
            "INSERT INTO account_data (stream_id, instance_name, user_id, room_id,"
            " account_data_type, content_json) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (user_id, room_id, account_data_type) DO UPDATE SET"
            " stream_id = excluded.stream_id, instance_name = excluded.instance_name,"
            " content_json = excluded.content_json",
            (stream_id, instance_name, user_id, room_id or "", data_type,
             content_json),
        ), name="add_account_data")
    return int(stream_id)


def send_to_device(stream: Stream, instance_name: str,
                   messages: Sequence[tuple[str, str, Mapping[str, Any]]]) -> int:
    """Queue to-device messages as one fact (one stream row per recipient user); return
    its token."""
    if not messages:
        raise StreamIdError("send_to_device needs at least one message")
    db = _writer_database(stream)
    with stream.id_gen.get_next() as stream_id:
        db.run(lambda txn: txn.executemany(
            "INSERT INTO device_inbox (stream_id, instance_name, user_id, device_id,"
            " message_json) VALUES (?, ?, ?, ?, ?)",
            [(stream_id, instance_name, user, device, _json(dict(message)))
             for user, device, message in messages],
        ), name="send_to_device")
    return int(stream_id)


def add_receipt(stream: Stream, instance_name: str, room_id: str, receipt_type: str,
                user_id: str, event_id: str, data: Mapping[str, Any] | None = None,
                thread_id: str | None = None) -> int:
    """Record a receipt (replacing the user's previous one in that room and thread)."""
    db = _writer_database(stream)
    with stream.id_gen.get_next() as stream_id:
        db.run(lambda txn: txn.execute(
            "INSERT INTO receipts (stream_id, instance_name, room_id, receipt_type,"
            " user_id, thread_id, event_id, data_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (room_id, receipt_type, user_id, thread_id) DO UPDATE SET"
            " stream_id = excluded.stream_id, instance_name = excluded.instance_name,"
            " event_id = excluded.event_id, data_json = excluded.data_json",
            (stream_id, instance_name, room_id, receipt_type, user_id,
             thread_id or "", event_id, _json(dict(data or {}))),
        ), name="add_receipt")
    return int(stream_id)


def get_device_messages(db: Database, user_id: str, from_token: int,
                        upto_token: int) -> list[tuple[int, str, dict[str, Any]]]:
    """The to-device messages for *user_id* with ``from_token < token <= upto_token``,
    as ``(token, device_id, message)`` in token order: what a ``to_device`` row for
    that user announces."""
    rows = db.fetchall(
        "SELECT stream_id, device_id, message_json FROM device_inbox"
        " WHERE user_id = ? AND stream_id > ? AND stream_id <= ?"
        " ORDER BY stream_id, device_id",
        (user_id, from_token, upto_token),
    )
    return [(int(sid), device, orjson.loads(message)) for sid, device, message in rows]
