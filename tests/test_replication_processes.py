"""Whole processes on loopback: ``streamrep serve``, ``write`` and ``tail``.

Hubs and workers are killed with SIGKILL at points chosen by progress (not by
time), then restarted; every worker must end with every committed fact exactly
once, in order per writer.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import orjson
import pytest

TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(predicate: Any, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Proc:
    """A streamrep subprocess whose stdout lines are collected by a thread."""

    def __init__(self, args: list[str], cwd: str) -> None:
        self.args = args
        self.lines: list[bytes] = []
        self.log_path = os.path.join(cwd, f"{args[0]}-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamrep", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=self._log,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith(b"\n"):
                self.lines.append(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)
        self._log.close()

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(10)
        self._reader.join(10)
        self._log.close()
        return code

    def facts(self) -> list[tuple[str, str, int]]:
        out = []
        for line in list(self.lines):
            fact = orjson.loads(line)
            out.append((fact["stream"], fact["instance"], fact["token"]))
        return out


@pytest.fixture
def procs(tmp_path: Any) -> Iterator[tuple[str, list[Proc]]]:
    started: list[Proc] = []
    yield str(tmp_path), started
    for proc in started:
        proc.kill()
        if proc.proc.stdout is not None:
            proc.proc.stdout.close()


def _start(started: list[Proc], cwd: str, *args: str) -> Proc:
    proc = Proc(list(args), cwd)
    started.append(proc)
    return proc


def _serve(started: list[Proc], cwd: str, db: str, port: int) -> Proc:
    hub = _start(started, cwd, "serve", "--db", db, "--listen", f"127.0.0.1:{port}",
                 "--server-name", "test.local")
    def listening() -> bool:
        if hub.proc.poll() is not None:
            with open(hub.log_path, "rb") as log:
                said = log.read().decode(errors="replace").strip().splitlines()[-5:]
            raise AssertionError(f"hub exited with {hub.proc.returncode}: " + " | ".join(said))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    _wait(listening, "the hub to listen")
    return hub


def _tail(started: list[Proc], cwd: str, port: int, *extra: str) -> Proc:
    return _start(started, cwd, "tail", "--connect", f"127.0.0.1:{port}", "--server-name", "test.local",
                  "--stream", "caches", *extra)


def _assert_exactly_once_in_order(facts: list[tuple[str, str, int]], expected: dict[str, list[int]]) -> None:
    for instance, tokens in expected.items():
        assert [t for (_s, i, t) in facts if i == instance] == tokens, instance
    assert len(facts) == sum(len(v) for v in expected.values())


def _tokens_in_db(db_url: str, instance: str) -> list[int]:
    from streamrep.db import open_database

    db = open_database(db_url)
    try:
        rows = db.fetchall(
            "SELECT stream_id FROM cache_invalidations WHERE instance_name = ? ORDER BY stream_id", (instance,))
        return [int(r[0]) for r in rows]
    finally:
        db.close()


def test_hub_killed_while_writing_workers_get_everything_once(procs: tuple[str, list[Proc]]) -> None:
    cwd, started = procs
    db = f"sqlite:///{cwd}/streamrep.db"
    port = _free_port()
    hub = _serve(started, cwd, db, port)
    via_hub = _tail(started, cwd, port, "--from", "0", "--name", "via-hub")
    via_db = _tail(started, cwd, port, "--from", "0", "--name", "via-db", "--db", db)
    count = 1500
    writer = _start(started, cwd, "write", "--connect", f"127.0.0.1:{port}", "--db", db,
                    "--instance-name", "writer1", "--stream", "caches", "--count", str(count),
                    "--rate", "1000", "--server-name", "test.local")
    _wait(lambda: len(via_hub.lines) >= 200 and len(via_db.lines) >= 200, "the first facts")
    hub.kill()
    # The writer keeps persisting while the hub is gone.
    before = len(_tokens_in_db(db, "writer1"))
    _wait(lambda: len(_tokens_in_db(db, "writer1")) >= before + 200, "writes while the hub is down")
    hub = _serve(started, cwd, db, port)
    assert writer.proc.wait(TIMEOUT) == 0
    expected = _tokens_in_db(db, "writer1")
    assert len(expected) == count
    for worker in (via_hub, via_db):
        _wait(lambda: len(worker.lines) >= count, f"{worker.args} to catch up")
    time.sleep(0.2)  # nothing more may arrive
    for worker in (via_hub, via_db):
        _assert_exactly_once_in_order(worker.facts(), {"writer1": expected})
    assert hub.terminate() == 0


def test_worker_killed_and_restarted_from_its_last_token(procs: tuple[str, list[Proc]]) -> None:
    cwd, started = procs
    db = f"sqlite:///{cwd}/streamrep.db"
    port = _free_port()
    _serve(started, cwd, db, port)
    worker = _tail(started, cwd, port, "--from", "0")
    count = 1200
    writer = _start(started, cwd, "write", "--connect", f"127.0.0.1:{port}", "--db", db,
                    "--instance-name", "writer1", "--stream", "caches", "--count", str(count),
                    "--rate", "1500", "--server-name", "test.local")
    _wait(lambda: len(worker.lines) >= 300, "the first facts")
    worker.kill()
    first = worker.facts()
    last = first[-1][2]
    restarted = _tail(started, cwd, port, "--from", f"writer1={last}")
    assert writer.proc.wait(TIMEOUT) == 0
    expected = _tokens_in_db(db, "writer1")
    _wait(lambda: len(first) + len(restarted.lines) >= count, "the restarted worker to catch up")
    time.sleep(0.2)
    _assert_exactly_once_in_order(first + restarted.facts(), {"writer1": expected})


@pytest.mark.postgres
def test_two_writers_on_postgres_share_a_stream_through_hub_restarts(
    procs: tuple[str, list[Proc]], pg_url: str
) -> None:
    cwd, started = procs
    port = _free_port()
    hub = _serve(started, cwd, pg_url, port)
    via_hub = _tail(started, cwd, port, "--from", "0", "--name", "via-hub")
    via_db = _tail(started, cwd, port, "--from", "0", "--name", "via-db", "--db", pg_url)
    count = 600
    writers = [
        _start(started, cwd, "write", "--connect", f"127.0.0.1:{port}", "--db", pg_url,
               "--instance-name", name, "--stream", "caches", "--count", str(count),
               "--rate", "400", "--server-name", "test.local")
        for name in ("writer1", "writer2")
    ]
    _wait(lambda: len(via_hub.lines) >= 150 and len(via_db.lines) >= 150, "the first facts")
    hub.kill()
    time.sleep(0.3)
    hub = _serve(started, cwd, pg_url, port)
    for writer in writers:
        assert writer.proc.wait(TIMEOUT) == 0
    expected = {name: _tokens_in_db(pg_url, name) for name in ("writer1", "writer2")}
    assert all(len(tokens) == count for tokens in expected.values())
    for worker in (via_hub, via_db):
        _wait(lambda: len(worker.lines) >= 2 * count, f"{worker.args} to catch up")
    time.sleep(0.2)
    for worker in (via_hub, via_db):
        _assert_exactly_once_in_order(worker.facts(), expected)


def test_serve_stops_gracefully_on_sigterm(procs: tuple[str, list[Proc]]) -> None:
    cwd, started = procs
    port = _free_port()
    hub = _serve(started, cwd, f"sqlite:///{cwd}/streamrep.db", port)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        reader = sock.makefile("rb")
        assert reader.readline() == b"SERVER test.local\n"
        sock.sendall(b"NAME probe\nREPLICATE\n")
        assert reader.readline().startswith(b"PING ")
        hub.proc.send_signal(signal.SIGTERM)
        lines = reader.readlines()
        reader.close()
    assert lines[-1] == b"ERROR server stopping\n"
    assert hub.terminate() == 0


def test_serve_write_and_tail_share_one_configuration_file(procs: tuple[str, list[Proc]]) -> None:
    cwd, started = procs
    port = _free_port()
    config = os.path.join(cwd, "streamrep.yaml")
    with open(config, "w") as fh:
        fh.write(
            "server_name: config.local\n"
            f"database: sqlite:///{cwd}/streamrep.db\n"
            f"listen: 127.0.0.1:{port}\n"
            "instance_name: main\n"
            "instance_map: {main: {}, writer1: {}, writer2: {}}\n"
            "stream_writers:\n"
            "  caches: [writer1]\n"
        )
    hub = _start(started, cwd, "serve", "--config", config)

    def listening() -> bool:
        if hub.proc.poll() is not None:
            with open(hub.log_path, "rb") as log:
                said = log.read().decode(errors="replace").strip().splitlines()[-5:]
            raise AssertionError(f"hub exited with {hub.proc.returncode}: " + " | ".join(said))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    _wait(listening, "the hub to listen")
    worker = _start(started, cwd, "tail", "--config", config, "--stream", "caches", "--from", "0")
    writer = _start(started, cwd, "write", "--config", config, "--instance-name", "writer1",
                    "--stream", "caches", "--count", "30")
    assert writer.proc.wait(TIMEOUT) == 0
    _wait(lambda: len(worker.lines) >= 30, "the worker to print 30 facts")
    tokens = _tokens_in_db(f"sqlite:///{cwd}/streamrep.db", "writer1")
    _assert_exactly_once_in_order(worker.facts(), {"writer1": tokens})
    assert len(tokens) == 30
    # An instance the file does not make a writer of the stream is refused.
    refused = _start(started, cwd, "write", "--config", config, "--instance-name", "writer2",
                     "--stream", "caches", "--count", "1")
    assert refused.proc.wait(TIMEOUT) == 2
