"""Stream sets, the built-in streams' rows and get_updates_since."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from streamrep.db import Database, Transaction
from streamrep.errors import DatabaseConfigError, NotAWriterError, UnknownStreamError
from streamrep.idgen import BackingTable
from streamrep.streams import (
    BUILTIN_STREAMS,
    RowFormat,
    StreamDefinition,
    StreamRow,
    Streams,
    StreamSet,
)


def test_a_handle_serves_the_builtin_streams_by_default(sqlite_url: str) -> None:
    assert {d.name for d in BUILTIN_STREAMS} == {
        "caches", "account_data", "to_device", "receipts", "typing"}
    db = Database.open(sqlite_url)
    assert Streams(db, "master").names() == sorted(d.name for d in BUILTIN_STREAMS)
    db.close()


def test_write_and_read_each_stream(db_url: str) -> None:
    db = Database.open(db_url)
    streams = Streams(db, "master")
    heard: list[tuple[str, list[int]]] = []
    streams.add_listener(lambda stream, instance, visible, pos: heard.append((stream, visible)))

    t1 = streams.add_cache_invalidation("get_user", ["@a:hs"], invalidation_ts_ms=1000)
    t2 = streams.add_cache_invalidation("get_rooms", None, invalidation_ts_ms=2000)
    assert streams.get_updates_since("caches", "master", 0, t2, 100) == (
        [(t1, ["get_user", ["@a:hs"], 1000]), (t2, ["get_rooms", None, 2000])], False)
    assert heard == [("caches", [t1]), ("caches", [t2])]

    a1 = streams.add_account_data("@a:hs", "m.push_rules", {"x": 1})
    a2 = streams.add_account_data("@a:hs", "m.tag", {"t": 2}, room_id="!r:hs")
    a3 = streams.add_account_data("@a:hs", "m.push_rules", {"x": 2})  # replaces a1
    rows, limited = streams.get_updates_since("account_data", "master", 0, a3, 10)
    assert rows == [(a2, ["@a:hs", "!r:hs", "m.tag"]), (a3, ["@a:hs", None, "m.push_rules"])]
    assert not limited

    d1 = streams.send_to_device([("@b:hs", "DEV2", {"m": 1}), ("@b:hs", "DEV1", {"m": 1}),
                                 ("@c:hs", "X", {"m": 1})])
    d2 = streams.send_to_device([("@d:hs", "Y", {"m": 2})])
    # One row per recipient user; the devices and messages stay in the table.
    assert streams.get_updates_since("to_device", "master", 0, d2, 10) == (
        [(d1, ["@b:hs"]), (d1, ["@c:hs"]), (d2, ["@d:hs"])], False)
    # Rows sharing a stream ID come together, even across the limit.
    assert streams.get_updates_since("to_device", "master", 0, d2, 1) == (
        [(d1, ["@b:hs"]), (d1, ["@c:hs"])], True)
    assert streams.get_updates_since("to_device", "master", d1, d2, 1) == (
        [(d2, ["@d:hs"])], False)
    assert streams.get_device_messages("@b:hs", 0, d2) == [
        (d1, "DEV1", {"m": 1}), (d1, "DEV2", {"m": 1})]
    assert streams.get_device_messages("@d:hs", d1, d2) == [(d2, "Y", {"m": 2})]
    assert streams.get_device_messages("@d:hs", d2, d2) == []

    r1 = streams.add_receipt("!r:hs", "m.read", "@a:hs", "$e1", {"ts": 5})
    r2 = streams.add_receipt("!r:hs", "m.read", "@a:hs", "$e2", {"ts": 6}, thread_id="$t")
    assert streams.get_updates_since("receipts", "master", 0, r2, 10)[0] == [
        (r1, ["!r:hs", "m.read", "@a:hs", "$e1", None, {"ts": 5}]),
        (r2, ["!r:hs", "m.read", "@a:hs", "$e2", "$t", {"ts": 6}]),
    ]
    assert streams.get_updates_since("receipts", "master", r2, r2, 10) == ([], False)
    assert streams.current_token("receipts") == r2 == streams.current_token("receipts", "master")

    # Every reserved ID completed: nothing is left in flight.
    assert all(streams.generator(name).in_flight == 0
               for name in ("caches", "account_data", "to_device", "receipts"))
    # A restarted instance starts from what is stored.
    again = Streams(db, "master")
    assert again.current_token("caches") == t2
    assert again.current_token("to_device") == d2
    streams.close()
    again.close()
    db.close()


def test_typing_is_in_memory(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    streams = Streams(db, "master")
    t1 = streams.set_typing("!r:hs", ["@b:hs", "@a:hs"])
    t2 = streams.set_typing("!s:hs", ["@c:hs"])
    t3 = streams.set_typing("!r:hs", [])
    stream = streams.get("typing")
    assert stream.get_updates_since("master", 0, t3, 10) == (
        [(t1, ["!r:hs", ["@a:hs", "@b:hs"]]), (t2, ["!s:hs", ["@c:hs"]]), (t3, ["!r:hs", []])],
        False)
    assert stream.get_updates_since("master", 0, t3, 2)[1] is True
    assert streams.current_token("typing") == t3
    db.close()


def test_unknown_and_misconfigured_streams(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    with pytest.raises(UnknownStreamError, match="nope"):
        Streams(db, "master").get("nope")
    with pytest.raises(DatabaseConfigError, match="single writer"):
        Streams(db, "w1", {"caches": ["w1", "w2"]})
    reader = Streams(db, "reader", {"caches": ["w1"]})
    with pytest.raises(NotAWriterError):
        reader.add_cache_invalidation("c", None)
    with pytest.raises(DatabaseConfigError, match="exactly one writer"):
        Streams(db, "w1", {"typing": []}).get("typing")
    db.close()


@dataclass(frozen=True)
class _NotesStream(StreamDefinition):
    def fetch_rows(self, txn: Transaction, instance: str, from_token: int, upto_token: int,
                   limit: int | None) -> list[StreamRow]:
        rows = txn.fetchall(
            "SELECT stream_id, body FROM notes WHERE stream_id > ? AND stream_id <= ?"
            " ORDER BY stream_id" + ("" if limit is None else f" LIMIT {limit}"),
            (from_token, upto_token))
        return [(int(sid), [body]) for sid, body in rows]


NOTES = _NotesStream("notes", (BackingTable("notes", instance_column=None),),
                     row=RowFormat.flat(("body", "string")))


def test_a_handle_serves_the_streams_it_is_given(db_url: str) -> None:
    db = Database.open(db_url)
    db.execute("CREATE TABLE notes (stream_id BIGINT NOT NULL, body TEXT)")
    served = StreamSet(BUILTIN_STREAMS).with_streams(NOTES)
    streams = Streams(db, "master", definitions=served)
    gen = streams.generator("notes")
    for body in ("a", "b", "c"):
        with gen.get_next() as sid:
            db.execute("INSERT INTO notes (stream_id, body) VALUES (?, ?)", (sid, body))
    assert streams.get_updates_since("notes", "master", 1, 3, 5) == (
        [(2, ["b"]), (3, ["c"])], False)
    # Other handles serve only what they were given.
    with pytest.raises(UnknownStreamError, match="notes"):
        Streams(db, "master").get("notes")
    db.close()


def test_stream_sets() -> None:
    served = StreamSet([*BUILTIN_STREAMS, NOTES, NOTES])
    assert served.names() == ("account_data", "caches", "notes", "receipts", "to_device",
                              "typing")
    assert served["notes"] is NOTES and "notes" in served and len(served) == 6
    assert served.only(["notes", "caches"]).names() == ("caches", "notes")
    with pytest.raises(DatabaseConfigError, match="two different definitions"):
        served.with_streams(_NotesStream("notes", (BackingTable("other"),)))
    with pytest.raises(UnknownStreamError, match=r"unknown stream 'nope' \(known: account_data"):
        served.get("nope")
    # Every row is checked against the stream's declared format.
    assert served.check_row("notes", b'["hi"]') is None
    assert served.check_row("notes", b'["hi",1]') == "notes row has 2 fields, expected 1 (body)"
    assert served.check_row("nope", b'[]') == "unknown stream 'nope'"
    bare = _NotesStream("bare", (BackingTable("notes"),))
    assert StreamSet([bare]).check_row("bare", b'["hi"]') == (
        "stream 'bare' declares no row format")


@pytest.mark.postgres
def test_multi_writer_streams_on_postgres(pg_url: str) -> None:
    db = Database.open(pg_url)
    writers = {"caches": ["w1", "w2"], "to_device": ["w1", "w2"]}
    s1, s2 = Streams(db, "w1", writers), Streams(db, "w2", writers)
    a = s1.add_cache_invalidation("c", ["k1"], 1)
    b = s2.add_cache_invalidation("c", ["k2"], 2)
    c = s1.add_cache_invalidation("c", None, 3)
    assert a < b < c
    assert s1.get_updates_since("caches", "w1", 0, c, 10) == (
        [(a, ["c", ["k1"], 1]), (c, ["c", None, 3])], False)
    assert s1.get_updates_since("caches", "w2", 0, c, 10) == ([(b, ["c", ["k2"], 2])], False)
    s2.generator("caches").persist_position()  # type: ignore[attr-defined]
    assert s1.wait_for_stream_position("w2", "caches", b, timeout=5)
    s1.close()
    s2.close()
    db.close()


@pytest.mark.postgres
def test_a_writer_whose_rows_another_replaced_still_holds_its_position(pg_url: str) -> None:
    """Receipts keep one row per key: a receipt of w2 replaces w1's, so w1 has no
    row left. The hub's check of w1's announced position reads its persisted
    position, and does not refuse a position w1 really reached."""
    from streamrep.replication.sources.database import DatabaseSource

    db = Database.open(pg_url)
    writers = {"receipts": ["w1", "w2"]}
    s1, s2, hub = Streams(db, "w1", writers), Streams(db, "w2", writers), Streams(db, "hub", writers)
    try:
        source = DatabaseSource(hub, ["receipts"])
        first = s1.add_receipt("!r:x", "m.read", "@u:x", "$e1")
        assert source.stored_token("receipts", "w1") == first
        second = s2.add_receipt("!r:x", "m.read", "@u:x", "$e2")
        assert second > first
        assert s1.get_updates_since("receipts", "w1", 0, second, 10) == ([], False)
        s1.generator("receipts").persist_position()  # type: ignore[attr-defined]
        assert source.stored_token("receipts", "w1") >= first
        assert source.stored_token("receipts", "w2") == second
    finally:
        s1.close()
        s2.close()
        hub.close()
        db.close()
