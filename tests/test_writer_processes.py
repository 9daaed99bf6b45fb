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
    count = 300
    first = _write(started, cwd, db, port, "writer1", count, 200)
    _wait(lambda: len(worker.lines) >= 20, "the first writer's first facts")
    second = _write(started, cwd, db, port, "writer1", 100, 1000)
    assert second.proc.wait(TIMEOUT) == 3
    errors = [line for line in _stderr(second).splitlines() if line.startswith("error:")]
    assert len(errors) == 1, _stderr(second)
    assert "writer writer1 is already running" in errors[0]
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


@pytest.mark.postgres
def test_demo_survives_every_database_backend_terminated_again_and_again(
        tmp_path: Any, pg_url: str, pg_server: str) -> None:
    from test_demo import assert_passed, run_demo

    app = f"streamrep-demo-{uuid.uuid4().hex[:10]}"
    stop = threading.Event()
    terminated: list[int] = []

    def terminate_every_backend() -> None:
        conn = psycopg2.connect(pg_server)
        conn.autocommit = True
        try:
            while not stop.wait(0.5):
                with conn.cursor() as cur:
                    cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                " WHERE application_name = %s", (app,))
                    terminated.append(int(cur.fetchone()[0]))
        finally:
            conn.close()

    killer = threading.Thread(target=terminate_every_backend, daemon=True)
    killer.start()
    try:
        proc = run_demo(tmp_path, "--db", f"{pg_url}&application_name={app}")
    finally:
        stop.set()
        killer.join(10)
    assert_passed(proc, 2)
    assert "writers writer1, writer2," in proc.stderr
    # Backends of every process were terminated, many times over.
    assert sum(1 for n in terminated if n > 0) >= 5 and sum(terminated) >= 20, terminated
