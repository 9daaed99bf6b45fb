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
#: between known rows, and a known stream's row of another shape.
NEWER_WRITER = [
    b'RDATA new_stream m 1 ["x", 2]',
    b"NEW_THING some words 42",
    b'RDATA caches m 1 ["get_user_by_id",["@a:hs"],1700000000000]',
    b'RDATA caches m 2 ["get_user_by_id"]',
    b'RDATA events m 3 ["ev",["$e:hs","!r:hs","m.room.message",null,null,null,null,false,false]]',
    b'RDATA events m 4 ["state",["!r:hs","m.room.name","","$n:hs"]]',
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


def _printed(path: pathlib.Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _rows(path: pathlib.Path) -> list[tuple[str, int, Any, str | None]]:
    return [(item["stream"], item["token"], item["row"], item.get("unnamed"))
            for item in _printed(path) if "stream" in item]


def _wait_for(path: pathlib.Path, count: int, what: str) -> None:
    deadline = time.monotonic() + 30
    while len(_rows(path)) < count:
        assert time.monotonic() < deadline, f"{what}: {_rows(path)}"
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
                             out=out)
    wait_subscribed(url, server, 1, logs=[err])
    publisher = redis.Redis.from_url(url)
    try:
        # Rows count once the writer's position was heard on this subscription.
        for line in [b"POSITION new_stream m 0 0", b"POSITION caches m 0 0", b"POSITION events m 0 0",
                     *NEWER_WRITER]:
            publisher.publish(server, line)
        _wait_for(out, len(NAMED), "tail did not print every row")
        time.sleep(0.3)  # a row printed twice would show up now
    finally:
        publisher.close()
    said = _stop(tail, err)
    assert _rows(out) == NAMED, said
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
                                 "--format", "named", out=out)
        _wait_for(out, len(NAMED), "tail did not print every row")
        time.sleep(0.3)
        said = _stop(tail, err)
    finally:
        hub.close()
    assert _rows(out) == NAMED, said
    # One connection: the unknown command closed nothing.
    assert hub.connections == 1, said
    assert "Traceback" not in said
