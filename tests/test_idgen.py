"""Stream ID generators on SQLite and PostgreSQL."""

from __future__ import annotations

import gevent
import gevent.event
import pytest
from click.testing import CliRunner

from streamrep.cli import main as cli_main
from streamrep.db import Database
from streamrep.errors import DatabaseConfigError, NotAWriterError, SequenceMismatchError
from streamrep.idgen import (
    BackingTable,
    MultiWriterIdGenerator,
    StreamIdGenerator,
    make_id_generator,
)

TABLES = [BackingTable("facts_a"), BackingTable("facts_b", "pos", None)]


def _make_tables(db: Database) -> None:
    with db.transaction() as txn:
        txn.execute("CREATE TABLE facts_a (stream_id BIGINT NOT NULL, instance_name TEXT, v TEXT)")
        txn.execute("CREATE TABLE facts_b (pos BIGINT NOT NULL, v TEXT)")


def test_single_writer_starts_from_max_and_completes_after_the_block(db_url: str) -> None:
    db = Database.open(db_url)
    _make_tables(db)
    db.execute("INSERT INTO facts_a (stream_id, instance_name, v) VALUES (4, 'master', 'x')")
    db.execute("INSERT INTO facts_b (pos, v) VALUES (7, 'y')")
    gen = StreamIdGenerator(db, "facts", TABLES)
    assert gen.get_current_token() == 7
    heard: list[tuple[str, str, list[int], int]] = []
    gen.add_listener(lambda *args: heard.append(args))

    with gen.get_next() as first:
        assert first == 8
        with gen.get_next_mult(2) as more:
            assert more == [9, 10]
            with db.transaction() as txn:
                txn.executemany("INSERT INTO facts_a (stream_id, v) VALUES (?, 'z')",
                                [(i,) for i in more])
        # 9 and 10 completed but 8 is still in flight: nothing visible yet.
        assert gen.get_current_token() == 7 and heard == []
        assert gen.in_flight == 1
    assert heard == [("facts", "master", [8, 9, 10], 10)]

    with pytest.raises(RuntimeError):
        with gen.get_next() as failed:
            with db.transaction() as txn:
                txn.execute("INSERT INTO facts_a (stream_id, v) VALUES (?, 'r')", (failed,))
                raise RuntimeError("rolled back")
    # A rollback completes the ID too.
    assert gen.get_current_token() == 11 and gen.in_flight == 0

    with db.transaction() as txn:
        in_txn = gen.get_next_txn(txn)
        txn.execute("INSERT INTO facts_a (stream_id, v) VALUES (?, 't')", (in_txn,))
        assert gen.get_current_token() == 11
    assert gen.get_current_token() == 12
    # A restart starts from the largest stored ID (the rolled-back 11 left no row).
    assert StreamIdGenerator(db, "facts", TABLES).get_current_token() == 12
    db.close()


def test_backfill_counts_down_with_positive_tokens(db_url: str) -> None:
    db = Database.open(db_url)
    _make_tables(db)
    db.execute("INSERT INTO facts_a (stream_id, v) VALUES (-3, 'x')")
    gen = StreamIdGenerator(db, "backfill", [BackingTable("facts_a")], negative=True)
    assert gen.get_current_token() == 3
    heard: list[list[int]] = []
    gen.add_listener(lambda s, i, visible, pos: heard.append(visible))
    with gen.get_next_mult(2) as ids:
        assert ids == [-4, -5]
    assert heard == [[4, 5]] and gen.get_current_token() == 5
    db.close()


def test_multi_writer_refused_on_sqlite(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    _make_tables(db)
    with pytest.raises(DatabaseConfigError, match="single writer"):
        make_id_generator(db, "events", "w1", ["w1", "w2"], TABLES, "events_seq")
    with pytest.raises(DatabaseConfigError):
        MultiWriterIdGenerator(db, "events", "w1", ["w1"], TABLES, "events_seq")
    single = make_id_generator(db, "events", "w1", ["w1"], TABLES, "events_seq")
    assert isinstance(single, StreamIdGenerator)
    reader = make_id_generator(db, "events", "r", ["w1"], TABLES, "events_seq")
    assert not reader.is_writer
    with pytest.raises(NotAWriterError):
        with reader.get_next():
            pass
    db.close()


@pytest.mark.postgres
def test_multi_writer_positions_readers_and_waiting(pg_url: str) -> None:
    db = Database.open(pg_url)
    _make_tables(db)
    w1 = MultiWriterIdGenerator(db, "facts", "w1", ["w1", "w2"], TABLES, "facts_seq")
    w2 = MultiWriterIdGenerator(db, "facts", "w2", ["w1", "w2"], TABLES, "facts_seq")
    reader = MultiWriterIdGenerator(db, "facts", "r", ["w1", "w2"], TABLES, "facts_seq")
    with pytest.raises(NotAWriterError):
        with reader.get_next():
            pass

    with w1.get_next() as a:
        with w2.get_next() as b:
            assert b > a
        assert w2.get_current_token_for_writer("w2") == b
    assert w1.get_current_token_for_writer("w1") == a

    def later() -> None:
        gevent.sleep(0.05)
        w2.persist_position()

    waiter = gevent.spawn(later)
    # The reader learns w2's position from stream_positions while it waits.
    assert reader.wait_for_stream_position("w2", "facts", b, timeout=5, poll_interval=0.02)
    waiter.join()
    assert not reader.wait_for_stream_position("w2", "facts", b + 100, timeout=0.1,
                                               poll_interval=0.02)
    # Replication can tell a reader directly too.
    reader.advance_writer("w1", a)
    assert not reader.advance_writer("w1", a - 1)  # stale news never moves back
    assert reader.get_current_token_for_writer("w1") == a
    assert reader.get_current_token() == min(a, b) and reader.get_max_token() == b
    # An idle w1 catches up with the sequence, so the linear position is not held back.
    assert w1.advance_idle_position() == (a, b)
    reader.advance_writer("w1", b)
    assert reader.get_current_token() == b
    for gen in (w1, w2, reader):
        gen.close()
    db.close()


@pytest.mark.postgres
def test_sequence_mismatch_refused_then_repaired(pg_url: str) -> None:
    db = Database.open(pg_url)
    _make_tables(db)
    gen = MultiWriterIdGenerator(db, "facts", "w1", ["w1", "w2"], TABLES, "facts_seq")
    with gen.get_next_mult(5) as ids:
        with db.transaction() as txn:
            txn.executemany("INSERT INTO facts_a (stream_id, instance_name) VALUES (?, 'w1')",
                            [(i,) for i in ids])
    gen.close()
    # A restore from an older backup: the sequence is back at 2.
    db.run(lambda txn: txn.fetchval("SELECT setval('facts_seq', 2)"), name="rewind")
    with pytest.raises(SequenceMismatchError) as info:
        MultiWriterIdGenerator(db, "facts", "w1", ["w1", "w2"], TABLES, "facts_seq")
    message = str(info.value)
    assert "'facts'" in message and "'facts_seq'" in message
    assert "is at 2" in message and "facts_a.stream_id holds 5" in message

    runner = CliRunner()
    dry = runner.invoke(cli_main, ["db", "repair-sequences", "--db", pg_url, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would move from 2 to 5" in dry.output
    result = runner.invoke(cli_main, ["db", "repair-sequences", "--db", pg_url])
    assert result.exit_code == 0, result.output
    assert "facts: sequence facts_seq moved from 2 to 5" in result.output
    restarted = MultiWriterIdGenerator(db, "facts", "w1", ["w1", "w2"], TABLES, "facts_seq")
    with restarted.get_next() as next_id:
        assert next_id == 6
    restarted.close()
    again = runner.invoke(cli_main, ["db", "repair-sequences", "--db", pg_url])
    assert "is fine" in again.output
    db.close()


def test_killed_greenlet_still_completes_its_id(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    _make_tables(db)
    gen = StreamIdGenerator(db, "facts", TABLES)
    started = gevent.event.Event()

    def stuck() -> None:
        with gen.get_next():
            started.set()
            gevent.sleep(30)

    task = gevent.spawn(stuck)
    assert started.wait(5)
    assert gen.in_flight == 1 and gen.get_current_token() == 0
    task.kill(block=True, timeout=5)
    assert gen.in_flight == 0 and gen.get_current_token() == 1
    db.close()


@pytest.mark.postgres
def test_repair_covers_registered_streams_never_started(pg_url: str) -> None:
    import streamrep.streams  # noqa: F401  (registers the built-in streams)

    db = Database.open(pg_url)  # creates the built-in streams' tables
    db.execute("CREATE SEQUENCE cache_invalidation_stream_seq")
    db.execute("INSERT INTO cache_invalidations (stream_id, instance_name, cache_name,"
               " invalidation_ts) VALUES (40, 'w1', 'c', 0)")
    result = CliRunner().invoke(cli_main, ["db", "repair-sequences", "--db", pg_url])
    assert result.exit_code == 0, result.output
    assert "caches: sequence cache_invalidation_stream_seq moved from 0 to 40" in result.output
    assert db.run(lambda txn: txn.fetchval("SELECT nextval('cache_invalidation_stream_seq')"),
                  name="next") == 41
    db.close()


def test_a_failing_position_listener_stops_the_writer_at_its_next_reservation(tmp_path: Any) -> None:
    """A listener's error is never only logged: the fact that triggered it is
    committed, and the next stream ID is refused with the error as the cause."""
    from streamrep.db import open_database
    from streamrep.errors import ListenerFailedError
    from streamrep.streams import Streams

    db = open_database(f"sqlite:///{tmp_path}/l.db")
    streams = Streams(db, "w1")
    try:
        def bad_listener(stream: str, instance: str, visible: list[int], position: int) -> None:
            raise TypeError("rows must be bytes")

        streams.add_listener(bad_listener)
        token = streams.add_cache_invalidation("c", ["k"])
        assert streams.current_token("caches", "w1") == token
        with pytest.raises(ListenerFailedError, match="rows must be bytes") as info:
            streams.add_cache_invalidation("c", ["k2"])
        assert isinstance(info.value.__cause__, TypeError)
        assert streams.current_token("caches", "w1") == token
    finally:
        streams.close()
        db.close()
