"""Whole ``streamrep write`` processes and the database's guarantees to them: a
second writer with the same instance name is refused (SQLite and PostgreSQL), and
writers on PostgreSQL survive every backend of theirs being terminated."""

from __future__ import annotations

import threading
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
