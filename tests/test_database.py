"""The database layer on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import sqlite3
import uuid
from typing import Any

import gevent
import pytest

from streamrep.db import Database, Migration, parse_database_url, register_schema
from streamrep.db.migrations import unregister_schema
from streamrep.db.sql import to_pyformat
from streamrep.errors import DatabaseConfigError, SchemaVersionError


def test_sqlite_urls() -> None:
    assert parse_database_url("sqlite:////var/lib/x.db").target == "/var/lib/x.db"
    assert parse_database_url("sqlite:///rel/x.db").target == "rel/x.db"
    assert parse_database_url("sqlite:rel/x.db").target == "rel/x.db"
    assert parse_database_url("sqlite:///:memory:").target == ":memory:"
    assert parse_database_url("sqlite:///x.db?busy_timeout_ms=100").busy_timeout_ms == 100
    for bad in ["", "sqlite://host/x.db", "sqlite:///", "mysql://x/y", "sqlite:///x.db?foo=1",
                "sqlite:///x.db?busy_timeout_ms=abc", "postgresql:x"]:
        with pytest.raises(DatabaseConfigError):
            parse_database_url(bad)


def test_postgres_url_keeps_libpq_parameters() -> None:
    url = ("postgresql://u:secret@h:5432/db?application_name=a"
           "&options=-csearch_path%3Ds1&pool_size=3")
    parsed = parse_database_url(url)
    assert parsed.engine == "postgres"
    assert parsed.pool_size == 3
    assert parsed.target == "postgresql://u:secret@h:5432/db?application_name=a&options=-csearch_path%3Ds1"
    assert "secret" not in parsed.redacted()


def test_placeholder_translation() -> None:
    assert to_pyformat("SELECT ? WHERE a = ?") == "SELECT %s WHERE a = %s"
    assert to_pyformat("SELECT '?', 'it''s ?%' , \"q?\" -- ?%\n, ?") == (
        "SELECT '?', 'it''s ?%%' , \"q?\" -- ?%%\n, %s")
    assert to_pyformat("SELECT a % 2 /* ? */ FROM t") == "SELECT a %% 2 /* ? */ FROM t"


def test_transactions_commit_roll_back_and_call_back(db_url: str) -> None:
    db = Database.open(db_url)
    events: list[str] = []
    with db.transaction() as txn:
        txn.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)")
        txn.executemany("INSERT INTO t (a, b) VALUES (?, ?)", [(i, f"v{i}%") for i in range(5)])
        txn.call_after(events.append, "committed")
        txn.call_on_exception(events.append, "not this")
    assert events == ["committed"]
    with pytest.raises(ZeroDivisionError):
        with db.transaction() as txn:
            txn.execute("INSERT INTO t (a, b) VALUES (?, ?)", (10, "x"))
            txn.call_after(events.append, "not this")
            txn.call_on_finish(events.append, "rolled back")
            1 / 0
    assert events == ["committed", "rolled back"]
    assert db.fetchval("SELECT COUNT(*) FROM t") == 5
    assert db.fetchall("SELECT a, b FROM t WHERE a >= ? ORDER BY a", (3,)) == [(3, "v3%"), (4, "v4%")]
    assert db.fetchone("SELECT b FROM t WHERE a = ?", (99,)) is None
    assert db.fetchval("SELECT b FROM t WHERE a = ?", (99,), "none") == "none"
    assert db.run(lambda txn, a: txn.fetchval("SELECT b FROM t WHERE a = ?", (a,)), 2) == "v2%"
    # One statement without a transaction of its own: same answers, same errors.
    assert db.read_value("SELECT b FROM t WHERE a = ?", (2,)) == "v2%"
    assert db.read_value("SELECT b FROM t WHERE a = ?", (99,), "none") == "none"
    with pytest.raises(Exception, match="no_such_table|does not exist|no such table"):
        db.read_value("SELECT b FROM no_such_table")
    with db.transaction():
        assert db.connections_in_use == 1
    # Every connection lent out came back, also after the failures above.
    assert db.connections_in_use == 0
    db.close()
    assert db.idle_connections == 0
    with pytest.raises(DatabaseConfigError):
        db.fetchall("SELECT 1")


def test_read_only_and_empty_transactions(db_url: str) -> None:
    db = Database.open(db_url)
    db.execute("CREATE TABLE s (a INTEGER PRIMARY KEY)")
    db.execute("INSERT INTO s (a) VALUES (?)", (1,))
    # A transaction that runs nothing commits nothing.
    with db.transaction():
        pass
    if db.engine == "postgres":
        with pytest.raises(Exception, match="read-only"):
            with db.transaction(read_only=True) as txn:
                txn.execute("DELETE FROM s")
    with db.transaction(read_only=True) as txn:
        assert txn.fetchval("SELECT COUNT(*) FROM s") == 1
    db.close()


@pytest.mark.postgres
def test_postgres_transaction_is_one_server_transaction(pg_url: str) -> None:
    """BEGIN travels with the first statement: every statement of the block, the
    first included, runs in one server transaction."""
    db = Database.open(pg_url)
    with db.transaction() as txn:
        first = txn.fetchval("SELECT txid_current()")
        assert txn.fetchval("SELECT txid_current()") == first
    with db.transaction() as txn:
        assert txn.fetchval("SELECT txid_current()") != first
    with db.raw_connection() as conn:  # handed out outside autocommit, as documented
        assert conn.autocommit is False
    db.close()


def test_migrations_are_versioned_and_registrable(db_url: str) -> None:
    component = f"test_{uuid.uuid4().hex[:8]}"
    table = f"widgets_{component}"
    first = Migration(1, sql=[f"CREATE TABLE {table} (id BIGINT PRIMARY KEY)"])
    register_schema(component, [
        first,
        Migration(2, sqlite=[f"ALTER TABLE {table} ADD COLUMN name TEXT"],
                  postgres=[f"ALTER TABLE {table} ADD COLUMN name TEXT NOT NULL DEFAULT ''"]),
    ])
    try:
        register_schema(component, [first])
        with pytest.raises(DatabaseConfigError):
            register_schema(component, [Migration(1, sql=["CREATE TABLE other (id BIGINT)"])])
        with pytest.raises(DatabaseConfigError):
            register_schema(component, [Migration(4, sql=["SELECT 1"])])
        db = Database.open(db_url, migrate=False)
        assert db.schema_version(component) == 0
        assert db.apply_migrations([component]) == {component: 2}
        db.execute(f"INSERT INTO {table} (id, name) VALUES (?, ?)", (1, "a"))
        # A second handle sees the schema as current and does nothing.
        db2 = Database.open(db_url, migrate=False)
        db2.ensure_schema(component)
        assert db2.fetchval(f"SELECT name FROM {table}") == "a"
        db.execute("UPDATE schema_versions SET version = 7 WHERE component = ?", (component,))
        with pytest.raises(SchemaVersionError, match="version 7"):
            db2.apply_migrations([component])
        db.close()
        db2.close()
    finally:
        unregister_schema(component)


def test_multi_writer_refused_on_sqlite(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    db.require_multiple_writers("events", ["master"])
    with pytest.raises(DatabaseConfigError, match="single writer"):
        db.require_multiple_writers("events", ["w1", "w2"])
    assert db.fetchval("PRAGMA journal_mode") == "wal"
    db.close()


def test_sqlite_refuses_nested_transaction(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    with db.transaction():
        with pytest.raises(DatabaseConfigError, match="nested"):
            with db.transaction():
                pass
    db.close()


def test_sqlite_bad_path() -> None:
    with pytest.raises(DatabaseConfigError):
        Database.open("sqlite:///nonexistent-dir-xyz/sub/db.sqlite")


@pytest.mark.postgres
def test_postgres_unreachable_is_a_config_error() -> None:
    with pytest.raises(DatabaseConfigError, match="cannot connect"):
        Database.open("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")


@pytest.mark.postgres
def test_postgres_copy_and_search_path(pg_url: str) -> None:
    db = Database.open(pg_url)
    db.execute("CREATE TABLE c (a INTEGER, b TEXT)")
    with db.copy_connection() as conn:
        with conn.cursor() as cur:
            cur.copy_expert("COPY c FROM STDIN", io.StringIO("1\tx\n2\ty\n"))
        conn.commit()
        out = io.StringIO()
        with conn.cursor() as cur:
            cur.copy_expert("COPY (SELECT a, b FROM c ORDER BY a) TO STDOUT", out)
    assert out.getvalue() == "1\tx\n2\ty\n"
    # Green mode is back after the copy block.
    assert db.fetchall("SELECT a FROM c ORDER BY a") == [(1,), (2,)]
    db.close()


@pytest.mark.postgres
def test_postgres_queries_yield_to_other_greenlets(pg_url: str) -> None:
    db = Database.open(pg_url + "&pool_size=2")
    ticks: list[int] = []

    def ticker() -> None:
        for i in range(1000):
            ticks.append(i)
            gevent.sleep(0.005)

    background = gevent.spawn(ticker)
    gevent.sleep(0)
    db.fetchval("SELECT pg_sleep(0.3)")
    seen_during_query = len(ticks)
    background.kill()
    # A blocking driver would have starved the ticker until the query ended.
    assert seen_during_query > 5
    db.close()


def test_sqlite_raw_connection(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    with db.raw_connection() as conn:
        assert isinstance(conn, sqlite3.Connection)
        conn.execute("CREATE TABLE r (a INTEGER)")
    assert db.fetchval("SELECT COUNT(*) FROM r") == 0
    db.close()


def test_background_checkpoint_parameter() -> None:
    assert parse_database_url("sqlite:///a.db").background_checkpoint is True
    assert parse_database_url("sqlite:///a.db?background_checkpoint=0").background_checkpoint is False
    with pytest.raises(DatabaseConfigError, match="0 or 1"):
        parse_database_url("sqlite:///a.db?background_checkpoint=2")
    with pytest.raises(DatabaseConfigError, match="SQLite setting"):
        parse_database_url("postgresql://u@h/db?background_checkpoint=1")


def _checkpointed(path: str) -> bool:
    """Whether the 50 rows of 2,000 bytes reached the database file itself: until a
    checkpoint copies them there they live in the WAL only."""
    import os

    return os.path.getsize(path) >= 100_000


@pytest.mark.parametrize("background", [1, 0])
def test_sqlite_checkpoints_off_the_commit_path(tmp_path: Any, background: int) -> None:
    """With the background checkpointer, commits leave their frames in the WAL and a
    thread copies them into the database file soon after; without it, frames pile
    up until SQLite's own threshold (1,000 pages) is crossed."""
    import time

    path = str(tmp_path / "ck.db")
    db = Database.open(f"sqlite:///{path}?background_checkpoint={background}")
    assert db._sqlite is not None
    checkpointer = db._sqlite.checkpointer
    try:
        db.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, pad TEXT)")
        for n in range(50):
            db.execute("INSERT INTO t VALUES (?, ?)", (n, "x" * 2000))
        deadline = time.monotonic() + 10
        # The thread counts a checkpoint once SQLite has returned from it, a moment
        # after the frames are in the file: wait for both.
        while background and time.monotonic() < deadline and not (
                _checkpointed(path) and checkpointer is not None
                and checkpointer.checkpoints >= 1):
            time.sleep(0.02)
        if background:
            assert _checkpointed(path)
            assert checkpointer is not None and checkpointer.checkpoints >= 1
        else:
            assert not _checkpointed(path)  # below SQLite's threshold: still in the WAL
            assert checkpointer is None
        assert db.fetchall("SELECT COUNT(*) FROM t") == [(50,)]
    finally:
        db.close()
    # Closing runs a last checkpoint and stops the thread; the data is all there.
    with Database.open(f"sqlite:///{path}") as again:
        assert again.fetchall("SELECT COUNT(*), SUM(LENGTH(pad)) FROM t") == [(50, 100_000)]


def test_forked_child_closes_without_the_checkpoint_thread(tmp_path: Any) -> None:
    """The checkpoint thread stays with the parent; a forked child that writes and
    closes its copy of the handle must not wait for it."""
    import os
    import warnings

    db = Database.open(f"sqlite:///{tmp_path / 'fork.db'}")
    db.execute("CREATE TABLE t (n INTEGER)")
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process that runs threads: that is
        # the situation under test.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            db.execute("INSERT INTO t VALUES (1)")
            db.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db.fetchall("SELECT n FROM t") == [(1,)]
    db.close()


class _CountingCursor:
    """A psycopg2 cursor that counts the texts it sends (one round trip each)."""

    sent: list[str] = []

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, sql: Any, *args: Any) -> None:
        _CountingCursor.sent.append(sql if isinstance(sql, str) else sql.decode())
        self._cursor.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


@pytest.fixture
def counted_pg(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from streamrep.db import markers

    plain_cursor = markers.MarkedConnection.cursor
    monkeypatch.setattr(markers.MarkedConnection, "cursor",
                        lambda self, *a, **k: _CountingCursor(plain_cursor(self, *a, **k)))
    db = Database.open(pg_url)
    db.execute("CREATE TABLE d (k BIGINT PRIMARY KEY, v TEXT)")
    _CountingCursor.sent = []
    yield db
    db.close()


def test_a_deferred_write_goes_with_the_commit(counted_pg: Any) -> None:
    """A read, then a write nothing reads: two round trips, the second the write
    with the COMMIT and the transaction's commit marker."""
    db = counted_pg

    def body(txn: Any) -> list[Any]:
        rows = txn.fetchall("SELECT k FROM d WHERE v = ?", ("it's",))
        txn.defer("INSERT INTO d (k, v) VALUES (?, ?), (?, ?)", (1, "it's", -2, "100%"))
        return rows

    assert db.run(body) == []
    assert len(_CountingCursor.sent) == 2
    assert _CountingCursor.sent[0].startswith("BEGIN")
    assert "INSERT INTO d" in _CountingCursor.sent[1]
    assert _CountingCursor.sent[1].rstrip().endswith("COMMIT")
    assert db.fetchall("SELECT k, v FROM d ORDER BY k") == [(-2, "100%"), (1, "it's")]


def test_a_deferred_write_goes_before_the_next_statement(counted_pg: Any) -> None:
    db = counted_pg

    def body(txn: Any) -> Any:
        txn.defer("INSERT INTO d (k, v) VALUES (?, ?)", (1, "a"))
        txn.defer("UPDATE d SET v = ? WHERE k = ?", ("b", 1))
        return txn.fetchval("SELECT v FROM d WHERE k = ?", (1,))

    assert db.run(body) == "b"
    assert len(_CountingCursor.sent) == 2  # BEGIN + both writes + the read; COMMIT


def test_a_failing_deferred_write_fails_the_transaction_at_commit(counted_pg: Any) -> None:
    db = counted_pg
    db.execute("INSERT INTO d (k, v) VALUES (1, 'kept')")
    after: list[bool] = []

    def body(txn: Any) -> None:
        txn.call_on_exception(after.append, True)
        txn.defer("INSERT INTO d (k, v) VALUES (?, ?)", (2, "new"))
        txn.defer("INSERT INTO d (k, v) VALUES (?, ?)", (1, "duplicate"))

    with pytest.raises(Exception, match="(?i)duplicate|unique"):
        db.run(body)
    assert after == [True]
    assert db.fetchall("SELECT k, v FROM d ORDER BY k") == [(1, "kept")]


def test_a_deferred_write_on_sqlite_runs_at_once(sqlite_url: str) -> None:
    db = Database.open(sqlite_url)
    try:
        db.execute("CREATE TABLE d (k BIGINT PRIMARY KEY, v TEXT)")

        def body(txn: Any) -> Any:
            txn.defer("INSERT INTO d (k, v) VALUES (?, ?)", (1, "a"))
            return txn.fetchval("SELECT v FROM d WHERE k = 1")

        assert db.run(body) == "a"
    finally:
        db.close()


class _RefusingConnection:
    """A sqlite3 connection whose switch to WAL is refused *refusals* times, as SQLite
    refuses it (at once) while another process is switching the same new file."""

    def __init__(self, conn: sqlite3.Connection, refusals: int) -> None:
        self._conn = conn
        self.refusals = refusals

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("PRAGMA journal_mode") and self.refusals:
            self.refusals -= 1
            raise sqlite3.OperationalError("database is locked")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.mark.parametrize("refusals", [1, 3])
def test_opening_a_new_sqlite_file_waits_while_another_process_switches_it_to_wal(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, refusals: int) -> None:
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect",
                        lambda *a, **k: _RefusingConnection(connect(*a, **k), refusals))
    db = Database.open(f"sqlite:///{tmp_path}/new.db")
    try:
        db.execute("CREATE TABLE t (k INTEGER)")
        assert db.fetchval("PRAGMA journal_mode") == "wal"
    finally:
        db.close()


def test_a_new_sqlite_file_locked_past_the_busy_timeout_is_one_clear_error(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrep.errors import DatabaseUnavailableError

    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect",
                        lambda *a, **k: _RefusingConnection(connect(*a, **k), 10**6))
    with pytest.raises(DatabaseUnavailableError, match="locked by another process.*"
                       "busy_timeout_ms") as caught:
        Database.open(f"sqlite:///{tmp_path}/new.db?busy_timeout_ms=100")
    assert "\n" not in str(caught.value)


def test_a_query_in_progress_does_not_hold_the_sqlite_write_lock(tmp_path: Any) -> None:
    """A reader stopped or slow inside ``fetchall`` (a follower polling the stream
    tables) must not stop a writer: the helpers' transactions are read-only."""
    url = f"sqlite:///{tmp_path}/shared.db"
    reader, writer = Database.open(url), Database.open(url + "?busy_timeout_ms=200")
    writer.execute("CREATE TABLE s (a INTEGER PRIMARY KEY)")
    writer.execute("INSERT INTO s (a) VALUES (1)")
    written: list[int] = []

    def write_meanwhile(a: int) -> int:
        # Runs inside the reader's query, so inside its transaction.
        writer.execute("INSERT INTO s (a) VALUES (?)", (a + 100,))
        written.append(a + 100)
        return a

    reader._sqlite.conn.create_function("write_meanwhile", 1, write_meanwhile)
    for fetch in (reader.fetchall, reader.fetchone, reader.fetchval):
        fetch("SELECT write_meanwhile(MIN(a)) FROM s")
        assert written == [101]
        assert writer.fetchall("SELECT a FROM s ORDER BY a") == [(1,), (101,)]
        writer.execute("DELETE FROM s WHERE a > 100")
        written.clear()
    reader.close()
    writer.close()
