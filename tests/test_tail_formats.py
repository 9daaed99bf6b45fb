"""``streamrep tail --format named`` and what a newer writer may send: rows named by
the reference's fields, and streams and commands this version does not know, which
pass through and never stop the follower (over Redis and over TCP)."""

from __future__ import annotations

import pathlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from support.processes import reap_processes, streamrep_process
from support.redis_server import free_port, shared_redis_url, unique_server_name, wait_subscribed


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    yield
    reap_processes()


#: What a newer writer publishes: a stream and a command this version does not know
#: between known rows, a known stream's row of another shape, and commands that
#: carry no fact. Rows count once their writer's position was heard.
NEWER_WRITER = [
    b"POSITION new_stream m 0 0",
    b"POSITION caches m 0 0",
    b"POSITION events m 0 0",
    b'RDATA new_stream m 1 ["x", 2]',
    b"NEW_THING some words 42",
    b'RDATA caches m 1 ["get_user_by_id",["@a:hs"],1700000000000]',
    b'RDATA caches m 2 ["get_user_by_id"]',
    b'LOCK_RELEASED ["m","room_purge","!r:hs"]',
    b'RDATA events m 3 ["ev",["$e:hs","!r:hs","m.room.message",null,null,null,null,false,false]]',
    b'RDATA events m 4 ["state",["!r:hs","m.room.name","","$n:hs"]]',
    b"NEW_ACTIVE_TASK task-7",
    b'RDATA caches m 5 ["cs_cache_fake",null,1700000000001]',
]

#: What ``--format named`` prints for :data:`NEWER_WRITER` (stream, token, row, unnamed).
NAMED = [
    ("new_stream", 1, ["x", 2], "no row format for stream 'new_stream'"),
    ("caches", 1, {"cache_func": "get_user_by_id", "keys": ["@a:hs"], "invalidation_ts": 1700000000000}, None),
    ("caches", 2, ["get_user_by_id"], "1 fields, not the 3 of the format"),
    ("events", 3, {"type": "ev", "data": {
        "event_id": "$e:hs", "room_id": "!r:hs", "type": "m.room.message", "state_key": None, "redacts": None,
        "relates_to": None, "membership": None, "rejected": False, "outlier": False}}, None),
    ("events", 4, {"type": "state", "data": {"room_id": "!r:hs", "type": "m.room.name", "state_key": "",
                                             "event_id": "$n:hs"}}, None),
    ("caches", 5, {"cache_func": "cs_cache_fake", "keys": None, "invalidation_ts": 1700000000001}, None),
]

#: What ``--commands`` prints for :data:`NEWER_WRITER`, in order.
COMMANDS = [
    *({"command": "POSITION", "stream_name": stream, "instance_name": "m", "prev_token": 0, "new_token": 0}
      for stream in ("new_stream", "caches", "events")),
    {"command": "NEW_THING", "unknown": True, "line": "NEW_THING some words 42"},
    {"command": "LOCK_RELEASED", "instance_name": "m", "lock_name": "room_purge", "lock_key": "!r:hs"},
    {"command": "NEW_ACTIVE_TASK", "data": "task-7"},
]


def _printed(path: pathlib.Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _rows(path: pathlib.Path) -> list[tuple[str, int, Any, str | None]]:
    return [(item["stream"], item["token"], item["row"], item.get("unnamed"))
            for item in _printed(path) if "stream" in item]


def _commands(path: pathlib.Path) -> list[dict[str, Any]]:
    return [item for item in _printed(path) if "command" in item]


def _in_order(commands: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Known commands, then unknown ones, each in the order they came (within one
    read, the unknown ones of the read are handed on after its known ones)."""
    return ([c for c in commands if not c.get("unknown")], [c for c in commands if c.get("unknown")])


def _wait_for(path: pathlib.Path, count: int, what: str, commands: int = 0) -> None:
    deadline = time.monotonic() + 30
    while len(_rows(path)) < count or len(_commands(path)) < commands:
        assert time.monotonic() < deadline, f"{what}: {_printed(path)}"
        time.sleep(0.05)


def _stop(proc: Any, err: pathlib.Path) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, err.read_text()
    return err.read_text()


def test_named_rows_and_what_a_newer_writer_adds_over_redis(tmp_path: pathlib.Path) -> None:
    import redis

    url = shared_redis_url()
    server = unique_server_name("named")
    out, err = tmp_path / "tail.out", tmp_path / "tail.err"
    tail = streamrep_process(err, "tail", "--redis", url, "--server-name", server, "--format", "named",
                             "--commands", out=out)
    wait_subscribed(url, server, 1, logs=[err])
    publisher = redis.Redis.from_url(url)
    try:
        for line in NEWER_WRITER:
            publisher.publish(server, line)
        _wait_for(out, len(NAMED), "tail did not print every row and command", len(COMMANDS))
        time.sleep(0.3)  # a line printed twice would show up now
    finally:
        publisher.close()
    said = _stop(tail, err)
    assert _rows(out) == NAMED, said
    assert _in_order(_commands(out)) == _in_order(COMMANDS), said
    assert "Traceback" not in said


class _Hub:
    """A hub that greets one follower and sends it what a newer writer sends."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.port = free_port()
        self.connections = 0
        self.heard: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            self.connections += 1
            with conn:
                conn.sendall(b"SERVER hs\n")
                conn.settimeout(0.2)
                data = b""
                while b"REPLICATE" not in data and not self._stop.is_set():
                    try:
                        data += conn.recv(4096)
                    except socket.timeout:
                        continue
                self.heard = data.splitlines()
                conn.sendall(b"".join(line + b"\n" for line in self.lines))
                while not self._stop.is_set():
                    try:
                        if not conn.recv(4096):
                            break  # the follower left
                    except socket.timeout:
                        continue
                    except OSError:
                        break

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._listener.close()


def test_named_rows_and_what_a_newer_writer_adds_over_tcp(tmp_path: pathlib.Path) -> None:
    hub = _Hub(NEWER_WRITER)
    out, err = tmp_path / "tail.out", tmp_path / "tail.err"
    try:
        tail = streamrep_process(err, "tail", "--connect", f"127.0.0.1:{hub.port}", "--server-name", "hs",
                                 "--format", "named", "--commands", out=out)
        _wait_for(out, len(NAMED), "tail did not print every row and command", len(COMMANDS))
        time.sleep(0.3)
        said = _stop(tail, err)
    finally:
        hub.close()
    assert _rows(out) == NAMED, said
    assert _in_order(_commands(out)) == _in_order(COMMANDS), said
    # One connection: the unknown command closed nothing.
    assert hub.connections == 1, said
    assert "Traceback" not in said


def test_a_cursor_resumes_a_stream_it_has_no_format_for(tmp_path: pathlib.Path) -> None:
    """A writer of a stream this version does not know is followed per (stream,
    instance) like any other: a position it reached with no fact is recorded, and
    the next run resumes there (no gap, no replay)."""
    import redis

    url = shared_redis_url()
    server = unique_server_name("future")
    cursor = tmp_path / "tail.cursor"
    publisher = redis.Redis.from_url(url)
    runs = [
        [b"POSITION future_stream m 0 7", b'RDATA future_stream m 8 ["a"]', b"POSITION future_stream m 8 12"],
        # Resumed: the writer says where it is again; a row at or below the cursor's
        # token is one the first run had.
        [b"POSITION future_stream m 12 12", b'RDATA future_stream m 12 ["a"]', b'RDATA future_stream m 13 ["b"]'],
    ]
    printed = []
    try:
        for run, lines in enumerate(runs):
            out, err = tmp_path / f"tail{run}.out", tmp_path / f"tail{run}.err"
            tail = streamrep_process(err, "tail", "--redis", url, "--server-name", server, "--cursor", str(cursor),
                                     "--format", "named", out=out)
            wait_subscribed(url, server, 1, logs=[err])
            for line in lines:
                publisher.publish(server, line)
            _wait_for(out, 1, "tail did not print the row")
            # The position reached without a fact is in the cursor within a second or so.
            deadline = time.monotonic() + 30
            while b'"m":12' not in (cursor.read_bytes() if cursor.exists() else b"") and run == 0:
                assert time.monotonic() < deadline, cursor.read_bytes() if cursor.exists() else "no cursor"
                time.sleep(0.05)
            time.sleep(0.3)
            said = _stop(tail, err)
            assert "missed" not in said, said
            printed.append(_rows(out))
            wait_subscribed(url, server, 0)
    finally:
        publisher.close()
    unnamed = "no row format for stream 'future_stream'"
    assert printed == [[("future_stream", 8, ["a"], unnamed)], [("future_stream", 13, ["b"], unnamed)]]
    assert orjson.loads(cursor.read_bytes())["positions"] == {"future_stream": {"m": 13}}
