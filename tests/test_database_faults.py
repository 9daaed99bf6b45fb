"""Lost PostgreSQL connections: ``Database.run`` retries on a new connection, and a
write whose ``COMMIT`` was cut off happens exactly once (commit markers)."""

from __future__ import annotations

import dataclasses
import pathlib
import time
import uuid
from typing import Any, Iterator

import psycopg2
import pytest

from streamrep.db import Database, markers
from streamrep.errors import DatabaseUnavailableError
from streamrep.idgen import BackingTable, MultiWriterIdGenerator

pytestmark = pytest.mark.postgres


@pytest.fixture
def tagged(pg_url: str) -> Iterator[tuple[str, str]]:
    """A URL whose connections carry an application_name of their own (so this test
    terminates its own backends only), and that name."""
    app = f"streamrep-faults-{uuid.uuid4().hex[:10]}"
    yield f"{pg_url}&application_name={app}&reconnect_timeout=10", app


def terminate_backends(server_dsn: str, app: str) -> int:
    """``pg_terminate_backend`` every backend named *app*; how many there were."""
    conn = psycopg2.connect(server_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE application_name = %s", (app,))
            (count,) = cur.fetchone()
        return int(count)
    finally:
        conn.close()


@pytest.fixture
def db(tagged: tuple[str, str]) -> Iterator[Database]:
    database = Database.open(tagged[0])
    database.execute("CREATE TABLE facts (id BIGINT PRIMARY KEY, body TEXT)")
    yield database
    database.close()


def count(db: Database, fact_id: int) -> int:
    return int(db.fetchval("SELECT COUNT(*) FROM facts WHERE id = ?", (fact_id,)))


def test_writes_and_reads_survive_terminated_backends(
        db: Database, tagged: tuple[str, str], pg_server: str) -> None:
    # Several pooled connections, all idle when their backends are terminated.
    import gevent

    gevent.joinall([gevent.spawn(db.fetchval, "SELECT pg_sleep(0.05)") for _ in range(4)])
    assert db.idle_connections >= 2
    assert terminate_backends(pg_server, tagged[1]) >= 2
    after: list[str] = []
    db.run(lambda txn: (txn.execute("INSERT INTO facts VALUES (1, 'a')"),
                        txn.call_after(after.append, "committed")), name="write")
    assert after == ["committed"]
    assert count(db, 1) == 1
    terminate_backends(pg_server, tagged[1])
    assert db.fetchall("SELECT id FROM facts") == [(1,)]
    assert db.connections_in_use == 0


def _commit_then_die(marker: tuple[int, int]) -> str:
    # The server commits, then the backend ends before the client hears back.
    return (markers.MARK_SQL.format(*marker)
            + ";\nSELECT pg_terminate_backend(pg_backend_pid())")


def _die_before_commit(marker: tuple[int, int]) -> str:
    return "SELECT pg_terminate_backend(pg_backend_pid());\n" + markers.MARK_SQL.format(*marker)


@pytest.mark.parametrize("cut", [_commit_then_die, _die_before_commit],
                         ids=["committed", "rolled-back"])
def test_a_write_whose_commit_was_cut_off_happens_once(
        db: Database, monkeypatch: pytest.MonkeyPatch, cut: Any) -> None:
    real = markers.commit_with_marker
    calls: list[int] = []

    def flaky(marker: tuple[int, int]) -> str:
        calls.append(1)
        return cut(marker) if len(calls) == 1 else real(marker)

    monkeypatch.setattr(markers, "commit_with_marker", flaky)
    outcomes: list[str] = []

    def write(txn: Any) -> str:
        txn.execute("INSERT INTO facts VALUES (7, 'x')")  # a second run would collide
        txn.call_after(outcomes.append, "committed")
        txn.call_on_exception(outcomes.append, "rolled back")
        return "done"

    assert db.run(write, name="cut") == "done"
    assert count(db, 7) == 1
    if cut is _commit_then_die:
        assert len(calls) == 1 and outcomes == ["committed"]
    else:
        assert len(calls) == 2 and outcomes == ["rolled back", "committed"]


def test_a_database_that_stays_away_is_one_line(db: Database) -> None:
    gone = dataclasses.replace(db.config, target="postgresql://postgres@127.0.0.1:1/test",
                               reconnect_timeout=1)
    db.config = gone
    assert db._pool is not None
    db._pool.drop_idle()
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError) as caught:
        db.execute("INSERT INTO facts VALUES (2, 'b')")
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "\n" not in message and "unavailable for" in message and "during execute" in message
    assert db.connections_in_use == 0


def test_stream_ids_survive_a_terminated_sequence_connection(
        db: Database, tagged: tuple[str, str], pg_server: str) -> None:
    db.execute("CREATE TABLE notes (stream_id BIGINT NOT NULL, instance_name TEXT)")
    gen = MultiWriterIdGenerator(db, "notes", "w1", ["w1", "w2"],
                                 [BackingTable("notes")], "notes_seq")
    try:
        written = []
        for _ in range(3):
            terminate_backends(pg_server, tagged[1])
            with gen.get_next() as stream_id:
                db.run(lambda txn: txn.execute(
                    "INSERT INTO notes VALUES (?, 'w1')", (stream_id,)), name="note")
            written.append(stream_id)
        assert written == sorted(set(written))
        assert gen.get_current_token_for_writer("w1") == written[-1]
        assert gen.in_flight == 0
        stored = [r[0] for r in db.fetchall("SELECT stream_id FROM notes ORDER BY 1")]
        assert stored == written
    finally:
        gen.close()


def test_only_lost_connections_are_retried(db: Database) -> None:
    db.execute("INSERT INTO facts VALUES (3, 'c')")
    calls: list[int] = []

    def duplicate(txn: Any) -> None:
        calls.append(1)
        txn.execute("INSERT INTO facts VALUES (3, 'again')")

    with pytest.raises(psycopg2.errors.UniqueViolation):
        db.run(duplicate, name="duplicate")
    assert calls == [1]
    assert db.fetchall("SELECT body FROM facts WHERE id = 3") == [("c",)]


def test_a_single_read_survives_terminated_backends(
        db: Database, tagged: tuple[str, str], pg_server: str) -> None:
    # read_value runs its statement without BEGIN/COMMIT: a lost connection
    # still falls back to run()'s retry on a new one.
    db.execute("INSERT INTO facts VALUES (4, 'd')")
    assert db.read_value("SELECT body FROM facts WHERE id = ?", (4,)) == "d"
    assert terminate_backends(pg_server, tagged[1]) >= 1
    assert db.read_value("SELECT body FROM facts WHERE id = ?", (4,)) == "d"
    assert db.read_value("SELECT body FROM facts WHERE id = ?", (5,), "none") == "none"
    assert db.connections_in_use == 0


def test_the_schema_version_is_read_again_after_terminated_backends(
        db: Database, tagged: tuple[str, str], pg_server: str) -> None:
    # What `streamrep demo` asks of a database before anything else (is a
    # deployment recorded?): a terminated backend made it fail with exit 3.
    from streamrep.db import deployment

    version = db.schema_version(deployment.COMPONENT)
    assert db.idle_connections >= 1
    assert terminate_backends(pg_server, tagged[1]) >= 1
    assert db.schema_version(deployment.COMPONENT) == version
    assert db.connections_in_use == 0


def test_work_outside_a_transaction_waits_out_another_process_s_lock(tmp_path: pathlib.Path) -> None:
    """Database.retry (migrations, stream ID startup) starts its work again while
    another process holds a SQLite database's write lock past busy_timeout_ms, and
    goes on once it is released."""
    import sqlite3
    import threading

    from streamrep.db import Database

    path = tmp_path / "locked.db"
    db = Database(f"sqlite:///{path}?busy_timeout_ms=50")
    try:
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        released = threading.Timer(0.5, holder.execute, args=("COMMIT",))
        attempts = []

        def write() -> int:
            attempts.append(1)
            with db.transaction("write") as txn:
                txn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            return len(attempts)

        released.start()
        assert db.retry(write, name="write") > 1
        released.join()
        holder.close()
    finally:
        db.close()


def test_a_lock_held_for_good_is_one_line_naming_the_fix(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from streamrep.cli.exits import ExitCode, describe
    from streamrep.db import Database, transactions
    from streamrep.errors import DatabaseUnavailableError

    monkeypatch.setattr(transactions, "BUSY_RETRY_SECONDS", 0.3)
    path = tmp_path / "locked.db"
    db = Database(f"sqlite:///{path}?busy_timeout_ms=20")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")

        def write() -> None:
            with db.transaction("write") as txn:
                txn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")

        with pytest.raises(DatabaseUnavailableError) as raised:
            db.retry(write, name="write")
        failure = describe(raised.value)
        assert failure.code == ExitCode.DATABASE_UNAVAILABLE
        assert "locked by another process" in failure.message and "busy_timeout_ms" in failure.message
        raw = describe(sqlite3.OperationalError("database is locked"))
        assert raw.code == ExitCode.DATABASE_UNAVAILABLE and "busy_timeout_ms" in raw.message
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        db.close()
