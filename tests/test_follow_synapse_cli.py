"""``streamrep tail --synapse-config`` as a process, with a writer that cannot be
reached: two writers publish on Redis as the reference's do (the test speaks for
them), and answer over HTTP from listeners that answer as the reference's do
(support/repl_http.py). ``persister1`` is down when the follower resumes: it is held
back, said once on stderr and in the metrics, while ``master``'s facts go on; once
it is up, what it held back comes, once, in order, and the cursor records it."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any, Iterator

import orjson
import pytest
import yaml

from support.redis_server import RedisServer, free_port, own_redis_server, unique_server_name, wait_subscribed
from support.repl_http import FakeWriter


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = own_redis_server()
    try:
        yield server
    finally:
        server.stop()


def _event(token: int) -> list[Any]:
    return ["ev", [f"$e{token}", "!room:example.com", "m.room.message", "", None, None, None, False, 0]]


def _receipt(token: int) -> list[Any]:
    return ["!room:example.com", "m.read", f"@u{token}:example.com", f"$e{token}", None, {}]


def _printed(path: pathlib.Path) -> list[tuple[str, str, int]]:
    return [(item["stream"], item["instance"], item["token"])
            for item in map(orjson.loads, path.read_bytes().split(b"\n")[:-1])]


def _wait(predicate: Any, what: str, err: pathlib.Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}; tail said: {err.read_text()}"
        time.sleep(0.05)


def _metric(port: int, name: str, labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name}{{{labels}}} "):
                return float(line.rpartition(" ")[2])
    return None


def test_an_unreachable_writer_is_held_back_alone_and_resumes(redis_server: RedisServer,
                                                              tmp_path: pathlib.Path) -> None:
    import redis

    server = unique_server_name("synapse-cli")
    master = FakeWriter("master", secret="s3cret", page=3).start()
    persister = FakeWriter("persister1", secret="s3cret", page=3)  # down for now
    for token in range(1, 6):
        master.add("receipts", token, _receipt(token))
        persister.add("events", token, _event(token))
    homeserver = tmp_path / "homeserver.yaml"
    homeserver.write_text(yaml.safe_dump({
        "server_name": server,
        "redis": {"enabled": True, "host": "127.0.0.1", "port": redis_server.port},
        "instance_map": {"main": {"host": "127.0.0.1", "port": master.port},
                         "persister1": {"host": "127.0.0.1", "port": persister.port}},
        "stream_writers": {"events": ["persister1"]},
        "worker_replication_secret": "s3cret"}))
    # Where an earlier run stopped: before every fact of both writers.
    cursor = tmp_path / "tail.cursor"
    cursor.write_text(json.dumps({"format": 1, "positions": {"events": {"persister1": 0},
                                                             "receipts": {"master": 0}}, "starts": {}}))
    metrics_port = free_port()
    out, err = tmp_path / "tail.out", tmp_path / "tail.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        tail = subprocess.Popen(
            [sys.executable, "-m", "streamrep", "tail", "--synapse-config", str(homeserver), "--cursor", str(cursor),
             "--stream", "events", "--stream", "receipts", "--metrics-listen", f"127.0.0.1:{metrics_port}"],
            stdout=stdout, stderr=stderr, env=dict(os.environ))
    bus = redis.Redis.from_url(redis_server.url)
    try:
        wait_subscribed(redis_server.url, server, 1, logs=[err])
        # The writers' answers to its REPLICATE: both moved on while it was away.
        bus.publish(server, "POSITION events persister1 5 5")
        bus.publish(server, "POSITION receipts master 5 5")
        _wait(lambda: len(_printed(out)) >= 5, "master's gap not filled", err)
        for token in (6, 7):  # both go on publishing
            master.add("receipts", token, _receipt(token))
            persister.add("events", token, _event(token))
            bus.publish(server, f"RDATA receipts master {token} {orjson.dumps(_receipt(token)).decode()}")
            bus.publish(server, f"RDATA events persister1 {token} {orjson.dumps(_event(token)).decode()}")
        _wait(lambda: len(_printed(out)) >= 7, "master's facts stopped", err)
        assert [t for s, _i, t in _printed(out) if s == "events"] == []
        assert _metric(metrics_port, "streamrep_replication_client_stalled_seconds",
                       'instance="persister1",stream="events"') is not None
        persister.start()
        _wait(lambda: "answers again" in err.read_text(), "persister1 did not resume", err)
        bus.publish(server, f"RDATA events persister1 7 {orjson.dumps(_event(7)).decode()}")  # a replay
        persister.add("events", 8, _event(8))
        bus.publish(server, f"RDATA events persister1 8 {orjson.dumps(_event(8)).decode()}")
        _wait(lambda: ("events", "persister1", 8) in _printed(out), "persister1's next fact", err)
        tail.send_signal(signal.SIGTERM)
        assert tail.wait(30) == 0, err.read_text()
    finally:
        if tail.poll() is None:
            tail.kill()
        bus.close()
        master.stop()
        persister.stop()
    printed = _printed(out)
    assert [t for s, _i, t in printed if s == "receipts"] == [1, 2, 3, 4, 5, 6, 7]
    assert [t for s, _i, t in printed if s == "events"] == [1, 2, 3, 4, 5, 6, 7, 8]
    said = err.read_text()
    assert said.count("holding back events/persister1 at token 0") == 1, said
    assert "the other writers go on" in said and "connection refused" in said
    assert json.loads(cursor.read_text())["positions"] == {"events": {"persister1": 8}, "receipts": {"master": 7}}
