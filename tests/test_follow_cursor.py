"""Durable cursors in one process: the cursor's format and file, a follower that is
held, and links resumed from a cursor (a file, or a database table written in the
handler's transaction) against a real hub over loopback."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterator

import orjson
import pytest

from streamrep.db import Database
from streamrep.db.transaction import Transaction
from streamrep.replication import ConnectionSettings, LinkSettings, MemorySource, ReplicationHub, StreamFollower
from streamrep.replication.cursor import Cursor, CursorError, CursorFile, SaveAfterHandler
from streamrep.replication.db_cursor import DatabaseCursor, SaveInTransaction
from streamrep.replication.sink import RowSink, open_sink
from support.replication import wait_until

FAST = ConnectionSettings(ping_interval=0.1, ping_timeout=0.5)
Fact = tuple[str, str, int, list[Any]]


# --- the cursor and its file ------------------------------------------------------------------


def test_a_cursor_survives_its_file_and_resumes_exactly_there(tmp_path: pathlib.Path) -> None:
    cursor = Cursor({("events", "p1"): 12, ("events", "p2"): 9, ("caches", "main"): 3}, {"typing": 0})
    store = CursorFile(tmp_path / "c.json")
    assert store.load() is None
    store.save(cursor)
    assert store.load() == cursor
    assert os.listdir(tmp_path) == ["c.json"]  # no temporary file left behind
    assert cursor.start_from() == {"typing": 0, ("events", "p1"): 12, ("events", "p2"): 9,
                                   ("caches", "main"): 3}
    # A stream's start only until a writer of it is known.
    assert Cursor({("events", "p1"): 12}, {"events": 0}).start_from() == {("events", "p1"): 12}
    # Through the hub every followed stream is asked for from a token.
    assert cursor.hub_start_from(["events", "caches", "receipts", "typing"]) == {
        **cursor.start_from(), "receipts": 0}


@pytest.mark.parametrize("content, says", [
    (b"not json", "not JSON"),
    (b'{"format": 2}', "not a cursor of format 1"),
    (b'{"format": 1, "positions": {"events": {"p1": -4}}}', "not a non-negative integer"),
    (b'{"format": 1, "positions": {"events": 3}}', "must be an object"),
])
def test_a_file_that_is_not_a_cursor_is_refused_in_one_line(tmp_path: pathlib.Path, content: bytes,
                                                            says: str) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(content)
    with pytest.raises(CursorError) as caught:
        CursorFile(path).load()
    message = str(caught.value)
    assert says in message and str(path) in message and "\n" not in message


def test_a_cursor_that_cannot_be_saved_stops_the_follower(tmp_path: pathlib.Path) -> None:
    store = CursorFile(tmp_path / "missing-dir" / "c.json")
    got: list[Fact] = []
    keeper = SaveAfterHandler(store, lambda *fact: got.append(fact))
    follower = StreamFollower(keeper.handler(), after_read=keeper.after_read)
    follower.on_position("caches", "main", 0, 0)  # the first position to save
    assert isinstance(keeper.failure, OSError) and "cannot save the cursor file" in str(keeper.failure)
    assert follower.held
    follower.on_rdata("caches", "main", 1, ["a"])
    assert got == [] and follower.positions[("caches", "main")] == 0


# --- a held follower --------------------------------------------------------------------------


def test_a_held_follower_takes_no_more_of_the_read_and_rewinds_it() -> None:
    got: list[Fact] = []
    follower: StreamFollower

    def handler(*fact: Any) -> None:
        got.append(fact)
        if fact[2] == 2:
            follower.hold()

    follower = StreamFollower(handler)
    follower.on_position("caches", "main", 0, 0)
    follower.on_position("events", "w1", 0, 0)
    follower.on_rdata("caches", "main", 1, ["w"])
    # One read holding three facts: the protocol moved the positions past all of them.
    actions: list[Any] = []
    for stream, instance, token in (("caches", "main", 2), ("caches", "main", 3), ("events", "w1", 7)):
        follower.state.rdata(stream, instance, token, [token], actions)
    assert follower.positions == {("caches", "main"): 3, ("events", "w1"): 7}
    follower.run(actions)
    assert [fact[2] for fact in got] == [1, 2]
    assert follower.positions == {("caches", "main"): 2, ("events", "w1"): 0}
    follower.on_rdata("caches", "main", 3, ["y"])  # still held
    follower.release()
    follower.on_rdata("caches", "main", 3, ["y"])
    assert [fact[2] for fact in got] == [1, 2, 3]


# --- links resumed from a cursor, against a hub -------------------------------------------------


@pytest.fixture
def source() -> MemorySource:
    return MemorySource(["caches", "events"])


@pytest.fixture
def hub(source: MemorySource) -> Iterator[ReplicationHub]:
    hub = ReplicationHub("hub.example", source, port=0, settings=FAST)
    hub.start()
    yield hub
    hub.stop()


def _write(hub: ReplicationHub, source: MemorySource, stream: str, instance: str, tokens: range) -> None:
    for token in tokens:
        source.append(stream, instance, token, [[stream, str(token), token], [instance, token]])
        hub.writer_advanced(stream, instance, token)


def _settings(hub: ReplicationHub) -> LinkSettings:
    return LinkSettings("worker", "hub.example", hub=("127.0.0.1", hub.address[1]), connection=FAST,
                        backoff_base=0.02, backoff_max=0.2)


def _tokens(got: list[Fact], stream: str, instance: str) -> list[int]:
    return [fact[2] for fact in got if fact[:2] == (stream, instance)]


@pytest.mark.parametrize("with_database", [True, False], ids=["database", "through-hub"])
def test_a_link_resumed_from_its_cursor_file_takes_each_fact_once(
        tmp_path: pathlib.Path, hub: ReplicationHub, source: MemorySource, with_database: bool) -> None:
    """Stopped and started again three times while two writers write (one of them
    first met by the second run): every fact once, in order; a fourth run over an
    idle deployment takes nothing."""
    got: list[Fact] = []
    path = tmp_path / "cursor.json"
    _write(hub, source, "events", "w1", range(1, 6))
    first = 0
    for run in range(3):
        keeper = SaveAfterHandler(CursorFile(path), lambda *fact: got.append(fact), start_from={"events": 0})
        assert (keeper.resumed is None) == (run == 0)
        link = keeper.open_link(_settings(hub), source=source if with_database else None,
                                streams=["events"])
        link.start()
        try:
            assert link.wait_connected(5)
            _write(hub, source, "events", "w1", range(first + 6, first + 16))
            if run == 1:
                _write(hub, source, "events", "w2", range(1, 4))
            wait_until(lambda: _tokens(got, "events", "w1")[-1:] == [first + 15])
        finally:
            link.stop()
        saved = CursorFile(path).load()
        assert saved is not None and saved.positions[("events", "w1")] == first + 15
        _write(hub, source, "events", "w1", range(first + 16, first + 21))  # while nobody follows
        first += 15
    assert _tokens(got, "events", "w1") == list(range(1, first + 1))
    # w2 met while the follower ran: from its first fact; its last token arrives
    # before w1's last one of that run only when the hub sends it first, so wait.
    keeper = SaveAfterHandler(CursorFile(path), lambda *fact: got.append(fact))
    link = keeper.open_link(_settings(hub), source=source if with_database else None, streams=["events"])
    link.start()
    try:
        wait_until(lambda: _tokens(got, "events", "w1")[-1:] == [first + 5])
    finally:
        link.stop()
    assert _tokens(got, "events", "w1") == list(range(1, first + 6))
    assert _tokens(got, "events", "w2") == [1, 2, 3]


def test_the_handler_raising_leaves_its_fact_to_come_again(tmp_path: pathlib.Path, hub: ReplicationHub,
                                                            source: MemorySource) -> None:
    got: list[Fact] = []
    failures = {4}

    def handler(*fact: Any) -> None:
        if fact[2] in failures:
            failures.discard(fact[2])
            raise RuntimeError("not now")
        got.append(fact)

    keeper = SaveAfterHandler(CursorFile(tmp_path / "c"), handler, start_from={"caches": 0})
    link = keeper.open_link(_settings(hub), source=source, streams=["caches"])
    link.start()
    try:
        assert link.wait_connected(5)
        _write(hub, source, "caches", "main", range(1, 8))
        wait_until(lambda: _tokens(got, "caches", "main")[-1:] == [7])
    finally:
        link.stop()
    assert _tokens(got, "caches", "main") == list(range(1, 8))
    saved = keeper.store.load()
    assert saved is not None and saved.positions == {("caches", "main"): 7}


# --- the cursor in the handler's transaction, and the row sink ------------------------------------


def test_a_transactional_handler_commits_its_rows_with_the_cursor(db_url: str, hub: ReplicationHub,
                                                                   source: MemorySource) -> None:
    """The sink's table gets each fact once across restarts; a fact whose transaction
    failed is not in the table nor in the cursor, and comes again."""
    fail = {("events", "w1", 3)}

    def flaky_sink(txn: Transaction, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        sink(txn, stream, instance, token, rows)
        if (stream, instance, token) in fail:
            fail.discard((stream, instance, token))
            raise RuntimeError("rolled back after writing its rows")

    _write(hub, source, "events", "w1", range(1, 4))
    for run in range(2):
        keeper = open_sink(db_url, "audit", start_from={"events": 0})
        sink = keeper.application_handler
        keeper.application_handler = flaky_sink
        link = keeper.open_link(_settings(hub), source=source, streams=["events"])
        link.start()
        try:
            assert link.wait_connected(5)
            _write(hub, source, "events", "w1", range(4 + 5 * run, 9 + 5 * run))
            last = 8 + 5 * run
            wait_until(lambda: keeper.database.fetchval(
                "SELECT MAX(token) FROM streamrep_follow_rows", (), 0) == last)
        finally:
            link.stop()
            keeper.database.close()
    database = Database.open(db_url, migrate=False)
    try:
        rows = database.fetchall("SELECT cursor_name, stream, instance, token, row_index, row_json"
                                 " FROM streamrep_follow_rows ORDER BY id")
        facts = [(r[3], r[4]) for r in rows]
        assert facts == [(t, i) for t in range(1, 14) for i in (0, 1)]
        assert {r[:3] for r in rows} == {("audit", "events", "w1")}
        # SQLite gives the JSON text back; psycopg2 decodes a JSON column.
        first = rows[0][5]
        assert (orjson.loads(first) if isinstance(first, str) else first) == ["events", "1", 1]
        assert DatabaseCursor(database, "audit").load() == Cursor({("events", "w1"): 13}, {"events": 0})
    finally:
        database.close()


def test_a_transactional_handler_whose_database_fails_stops_the_link(tmp_path: pathlib.Path,
                                                                      hub: ReplicationHub,
                                                                      source: MemorySource) -> None:
    database = Database.open(f"sqlite:///{tmp_path}/sink.db", migrate=False)

    def handler(txn: Transaction, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        txn.execute("CREATE TABLE IF NOT EXISTS taken (token INTEGER)")
        txn.execute("INSERT INTO taken VALUES (?)", (token,))
        if token == 3:
            txn.execute("INSERT INTO no_such_table VALUES (1)")

    try:
        keeper = SaveInTransaction(database, "t", handler, start_from={"caches": 0})
        link = keeper.open_link(_settings(hub), source=source, streams=["caches"])
        link.start()
        try:
            assert link.wait_connected(5)
            _write(hub, source, "caches", "main", range(1, 3))
            wait_until(lambda: DatabaseCursor(database, "t").load() == Cursor({("caches", "main"): 2},
                                                                               {"caches": 0}))
            _write(hub, source, "caches", "main", range(3, 6))
            wait_until(lambda: keeper.failure is not None)
            wait_until(lambda: not link.connected)
        finally:
            link.stop()
        assert "no_such_table" in str(keeper.failure)
        # Nothing of the failed transaction stayed, nothing after it was taken.
        assert [r[0] for r in database.fetchall("SELECT token FROM taken ORDER BY token")] == [1, 2]
        assert DatabaseCursor(database, "t").load() == Cursor({("caches", "main"): 2}, {"caches": 0})
    finally:
        database.close()


def test_the_sink_tables_are_all_it_creates(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path}/sink.db"
    keeper = open_sink(url, "x")
    keeper.database.close()
    database = Database.open(url, migrate=False)
    try:
        tables = {r[0] for r in database.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        database.close()
    assert tables - {"sqlite_sequence"} == {"schema_versions", "streamrep_follow_cursors", "streamrep_follow_rows"}
    assert isinstance(RowSink, type)


def test_a_long_read_commits_as_it_goes_and_a_failing_fact_rolls_back_only_its_batch(
        tmp_path: pathlib.Path) -> None:
    database = Database.open(f"sqlite:///{tmp_path}/sink.db", migrate=False)
    fail = {8}

    def handler(txn: Transaction, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        txn.execute("CREATE TABLE IF NOT EXISTS taken (token INTEGER)")
        txn.execute("INSERT INTO taken VALUES (?)", (token,))
        if token in fail:
            fail.discard(token)
            raise RuntimeError("not now")

    try:
        keeper = SaveInTransaction(database, "t", handler, start_from={"caches": 0}, batch_limit=3)
        follower = StreamFollower(keeper.handler(), start_from={"caches": 0}, after_read=keeper.after_read)
        follower.on_position("caches", "main", 0, 0)  # a first read: the follower is known from here
        actions: list[Any] = []
        for token in range(1, 11):
            follower.state.rdata("caches", "main", token, [token], actions)
        with pytest.raises(RuntimeError):
            follower.run(actions)
        # 1-3 and 4-6 committed as the read went on; 7-9 rolled back with 8.
        assert follower.positions[("caches", "main")] == 6
        assert DatabaseCursor(database, "t").load() == Cursor({("caches", "main"): 6}, {"caches": 0})
        actions = []
        for token in range(7, 11):
            follower.state.rdata("caches", "main", token, [token], actions)
        follower.run(actions)
        assert [r[0] for r in database.fetchall("SELECT token FROM taken ORDER BY token")] == list(range(1, 11))
        assert DatabaseCursor(database, "t").load() == Cursor({("caches", "main"): 10}, {"caches": 0})
    finally:
        database.close()


def test_a_writer_met_while_stopped_comes_whole_through_the_hub(tmp_path: pathlib.Path, hub: ReplicationHub,
                                                                 source: MemorySource) -> None:
    """Resumed through the hub (no database), a writer of a known stream that first
    wrote while the follower was stopped, below the token the stream is asked for
    from: its facts come all the same, once, and the other writer's none again."""
    got: list[Fact] = []
    path = tmp_path / "cursor.json"
    _write(hub, source, "events", "w1", range(1, 21))
    for run in range(2):
        keeper = SaveAfterHandler(CursorFile(path), lambda *fact: got.append(fact), start_from={"events": 0})
        link = keeper.open_link(_settings(hub), streams=["events"])
        link.start()
        try:
            wait_until(lambda: _tokens(got, "events", "w1")[-1:] == [20]
                       and (run == 0 or _tokens(got, "events", "w2")[-1:] == [6]))
        finally:
            link.stop()
        if run == 0:
            _write(hub, source, "events", "w2", range(5, 7))
    assert _tokens(got, "events", "w1") == list(range(1, 21))
    assert _tokens(got, "events", "w2") == [5, 6]


def test_after_a_crash_what_was_handed_on_since_the_last_save_comes_again(
        tmp_path: pathlib.Path, hub: ReplicationHub, source: MemorySource) -> None:
    """The cursor file as a crash leaves it (saved at most every 60 s here): the next
    start hands on again exactly the facts after it, and loses none."""
    got: list[Fact] = []
    path = tmp_path / "cursor.json"
    keeper = SaveAfterHandler(CursorFile(path), lambda *fact: got.append(fact), start_from={"caches": 0},
                              save_interval=60.0)
    link = keeper.open_link(_settings(hub), source=source, streams=["caches"])
    link.start()
    try:
        assert link.wait_connected(5)
        wait_until(lambda: path.exists())
        _write(hub, source, "caches", "main", range(1, 4))
        wait_until(lambda: _tokens(got, "caches", "main")[-1:] == [3])
        crashed = path.read_bytes()  # the last save, and facts handed on after it
    finally:
        link.stop()
    saved_before = Cursor.decode(crashed).positions.get(("caches", "main"), 0)
    assert saved_before < 3
    path.write_bytes(crashed)
    again: list[Fact] = []
    keeper = SaveAfterHandler(CursorFile(path), lambda *fact: again.append(fact))
    link = keeper.open_link(_settings(hub), source=source, streams=["caches"])
    link.start()
    try:
        wait_until(lambda: _tokens(again, "caches", "main")[-1:] == [3])
    finally:
        link.stop()
    assert _tokens(again, "caches", "main") == list(range(saved_before + 1, 4))


def test_a_long_read_is_saved_as_it_goes(tmp_path: pathlib.Path) -> None:
    """A catch-up is one read: the cursor is saved every 1,000 facts within it, so a
    crash in the middle repeats at most that many."""
    store = CursorFile(tmp_path / "c.json")
    seen_saved: dict[int, int] = {}

    def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
        if token in (999, 1001, 2500):
            saved = store.load()
            seen_saved[token] = saved.positions.get(("caches", "main"), 0) if saved is not None else 0

    keeper = SaveAfterHandler(store, handler, within_read_seconds=3600)
    follower = StreamFollower(keeper.handler(), after_read=keeper.after_read)
    follower.on_position("caches", "main", 0, 0)
    actions: list[Any] = []
    for token in range(1, 2501):
        follower.state.rdata("caches", "main", token, [token], actions)
    follower.run(actions)
    assert seen_saved == {999: 0, 1001: 1000, 2500: 2000}
    saved = store.load()
    assert saved is not None and saved.positions == {("caches", "main"): 2500}
