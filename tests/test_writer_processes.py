"""Whole ``streamrep write`` processes and the database's guarantees to them: a
second writer with the same instance name is refused (SQLite and PostgreSQL), and
writers on PostgreSQL survive every backend of theirs being terminated."""

from __future__ import annotations

import threading
import uuid
import time
from typing import Any

import psycopg2
import pytest

from streamrep.cli.exits import ExitCode

from test_replication_processes import (
    TIMEOUT, Proc, _assert_exactly_once_in_order, _free_port, _serve, _start, _tail,
    _tokens_in_db, _wait, procs)

__all__ = ["procs"]  # the fixture, imported for this module's tests


def _write(started: list[Proc], cwd: str, db: str, port: int, name: str, count: int,
           rate: int) -> Proc:
    return _start(started, cwd, "write", "--connect", f"127.0.0.1:{port}", "--db", db,
                  "--instance-name", name, "--stream", "caches", "--count", str(count),
                  "--rate", str(rate), "--server-name", "test.local")


def _stderr(proc: Proc) -> str:
    with open(proc.log_path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_second_writer_with_the_same_name_refuses_to_start(
        procs: tuple[str, list[Proc]], engine: str, request: pytest.FixtureRequest) -> None:
    cwd, started = procs
    db = (f"sqlite:///{cwd}/streamrep.db" if engine == "sqlite"
          else str(request.getfixturevalue("pg_url")))
    port = _free_port()
    _serve(started, cwd, db, port)
    worker = _tail(started, cwd, port, "--from", "0", "--name", "worker")
    # Long enough (5 s) that the second process surely starts while the first runs.
    count = 500
    first = _write(started, cwd, db, port, "writer1", count, 100)
    _wait(lambda: len(worker.lines) >= 20, "the first writer's first facts")
    second = _write(started, cwd, db, port, "writer1", 100, 1000)
    assert second.proc.wait(TIMEOUT) == ExitCode.LEASE_HELD
    errors = [line for line in _stderr(second).splitlines() if line.startswith("streamrep write: error:")]
    assert len(errors) == 1, _stderr(second)
    assert "writer writer1 is already running" in errors[0]
    assert errors[0].endswith("then start this one again")
    assert f"pid {first.proc.pid}, since " in errors[0]
    assert "Traceback" not in _stderr(second)
    assert first.proc.wait(TIMEOUT) == 0
    tokens = _tokens_in_db(db, "writer1")
    assert len(tokens) == count and len(set(tokens)) == count
    _wait(lambda: len(worker.lines) >= count, "the worker to catch up")
    time.sleep(0.2)
    _assert_exactly_once_in_order(worker.facts(), {"writer1": tokens})
    # Released on the clean stop: the next writer1 starts and goes on from there.
    third = _write(started, cwd, db, port, "writer1", 10, 1000)
    assert third.proc.wait(TIMEOUT) == 0
    # So it is on SIGTERM (a restart by a service manager).
    fourth = _write(started, cwd, db, port, "writer1", 1000, 100)
    _wait(lambda: len(_tokens_in_db(db, "writer1")) >= count + 20, "the fourth writer")
    assert fourth.terminate() == 0
    assert "stopped by a signal after" in _stderr(fourth)
    fifth = _write(started, cwd, db, port, "writer1", 10, 1000)
    assert fifth.proc.wait(TIMEOUT) == 0
    tokens = _tokens_in_db(db, "writer1")
    assert len(tokens) == len(set(tokens)) and tokens == sorted(tokens)
    _wait(lambda: len(worker.lines) >= len(tokens), "the worker to catch up")
    time.sleep(0.2)
    _assert_exactly_once_in_order(worker.facts(), {"writer1": tokens})


class _Terminator:
    """A thread that terminates every backend named *app* every 0.3 seconds."""

    def __init__(self, server_dsn: str, app: str) -> None:
        self.server_dsn, self.app = server_dsn, app
        self.terminated: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "_Terminator":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        conn = psycopg2.connect(self.server_dsn)
        conn.autocommit = True
        try:
            while not self._stop.wait(0.3):
                with conn.cursor() as cur:
                    cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                " WHERE application_name = %s", (self.app,))
                    self.terminated.append(int(cur.fetchone()[0]))
        finally:
            conn.close()

    def assert_struck_often(self) -> None:
        assert sum(1 for n in self.terminated if n > 0) >= 5, self.terminated
        assert sum(self.terminated) >= 10, self.terminated


@pytest.mark.postgres
def test_writers_survive_their_backends_terminated_again_and_again(
        procs: tuple[str, list[Proc]], pg_url: str, pg_server: str) -> None:
    cwd, started = procs
    app = f"streamrep-write-{uuid.uuid4().hex[:10]}"
    db = f"{pg_url}&application_name={app}"
    port = _free_port()
    hub = _serve(started, cwd, db, port)
    worker = _tail(started, cwd, port, "--from", "0", "--name", "worker")
    count = 300
    with _Terminator(pg_server, app) as terminator:
        writers = [_write(started, cwd, db, port, name, count, 120)
                   for name in ("writer1", "writer2")]
        for writer in writers:
            assert writer.proc.wait(TIMEOUT) == 0, _stderr(writer)[-2000:]
    terminator.assert_struck_often()
    expected = {name: _tokens_in_db(pg_url, name) for name in ("writer1", "writer2")}
    assert all(len(tokens) == count for tokens in expected.values()), expected
    _wait(lambda: len(worker.lines) >= 2 * count, "the worker to catch up")
    time.sleep(0.2)
    _assert_exactly_once_in_order(worker.facts(), expected)
    assert any("connection lost" in _stderr(w) for w in writers)
    for proc in (hub, worker, *writers):
        assert "Traceback" not in _stderr(proc), _stderr(proc)[-3000:]


@pytest.mark.postgres
def test_demo_survives_every_database_backend_terminated_again_and_again(
        tmp_path: Any, pg_url: str, pg_server: str) -> None:
    from test_demo import assert_passed, run_demo

    app = f"streamrep-demo-{uuid.uuid4().hex[:10]}"
    with _Terminator(pg_server, app) as terminator:
        proc = run_demo(tmp_path, "--db", f"{pg_url}&application_name={app}")
    assert_passed(proc, 2)
    assert "writers writer1, writer2," in proc.stderr
    # Backends of every process were terminated, many times over.
    terminator.assert_struck_often()
    for log in (tmp_path / "demo").glob("*.log"):
        assert "Traceback" not in log.read_text(errors="replace"), log
