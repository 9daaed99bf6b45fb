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


class Deployment:
    """Two writers answering over HTTP as the reference's do (``persister1`` not
    started), a homeserver.yaml naming them, a cursor before all their facts, and
    ``tail --synapse-config --cursor`` following them."""

    def __init__(self, redis_server: RedisServer, tmp_path: pathlib.Path) -> None:
        import redis

        self.server = unique_server_name("synapse-cli")
        self.master = FakeWriter("master", secret="s3cret", page=3).start()
        self.persister = FakeWriter("persister1", secret="s3cret", page=3)
        for token in range(1, 6):
            self.master.add("receipts", token, _receipt(token))
            self.persister.add("events", token, _event(token))
        homeserver = tmp_path / "homeserver.yaml"
        homeserver.write_text(yaml.safe_dump({
            "server_name": self.server,
            "redis": {"enabled": True, "host": "127.0.0.1", "port": redis_server.port},
            "instance_map": {"main": {"host": "127.0.0.1", "port": self.master.port},
                             "persister1": {"host": "127.0.0.1", "port": self.persister.port}},
            "stream_writers": {"events": ["persister1"]},
            "worker_replication_secret": "s3cret"}))
        # Where an earlier run stopped: before every fact of both writers.
        self.cursor = tmp_path / "tail.cursor"
        self.cursor.write_text(json.dumps({"format": 1, "positions": {"events": {"persister1": 0},
                                                                      "receipts": {"master": 0}}, "starts": {}}))
        self.metrics_port = free_port()
        self.out, self.err = tmp_path / "tail.out", tmp_path / "tail.err"
        with self.out.open("wb") as stdout, self.err.open("wb") as stderr:
            self.tail = subprocess.Popen(
                [sys.executable, "-m", "streamrep", "tail", "--synapse-config", str(homeserver),
                 "--cursor", str(self.cursor), "--stream", "events", "--stream", "receipts",
                 "--metrics-listen", f"127.0.0.1:{self.metrics_port}"],
                stdout=stdout, stderr=stderr, env=dict(os.environ))
        self.bus = redis.Redis.from_url(redis_server.url)
        wait_subscribed(redis_server.url, self.server, 1, logs=[self.err])

    def publish(self, line: str) -> None:
        self.bus.publish(self.server, line)

    def go_on(self, token: int) -> None:
        """Both writers write and publish one more fact."""
        self.master.add("receipts", token, _receipt(token))
        self.persister.add("events", token, _event(token))
        self.publish(f"RDATA receipts master {token} {orjson.dumps(_receipt(token)).decode()}")
        self.publish(f"RDATA events persister1 {token} {orjson.dumps(_event(token)).decode()}")

    def printed(self, stream: str) -> list[int]:
        return [t for s, _i, t in _printed(self.out) if s == stream]

    def wait(self, predicate: Any, what: str) -> None:
        _wait(predicate, what, self.err)

    def stop(self) -> None:
        self.tail.send_signal(signal.SIGTERM)
        assert self.tail.wait(30) == 0, self.err.read_text()

    def close(self) -> None:
        if self.tail.poll() is None:
            self.tail.kill()
            self.tail.wait(10)
        self.bus.close()
        self.master.stop()
        self.persister.stop()


@pytest.fixture
def deployment(redis_server: RedisServer, tmp_path: pathlib.Path) -> Iterator[Deployment]:
    running = Deployment(redis_server, tmp_path)
    try:
        yield running
    finally:
        running.close()


def _held_back_then_resumed(d: Deployment, resume: Any) -> None:
    """The writers' answers to tail's REPLICATE (both moved on while it was away);
    master's facts go on while persister1 is held back; *resume* brings it back."""
    d.publish("POSITION events persister1 5 5")
    d.publish("POSITION receipts master 5 5")
    d.wait(lambda: len(d.printed("receipts")) >= 5, "master's gap not filled")
    for token in (6, 7):
        d.go_on(token)
    d.wait(lambda: len(d.printed("receipts")) >= 7, "master's facts stopped")
    assert d.printed("events") == []
    assert _metric(d.metrics_port, "streamrep_replication_client_stalled_seconds",
                   'instance="persister1",stream="events"') is not None
    resume()
    d.wait(lambda: "answers again" in d.err.read_text(), "persister1 did not resume")
    d.publish(f"RDATA events persister1 7 {orjson.dumps(_event(7)).decode()}")  # a replay
    d.persister.add("events", 8, _event(8))
    d.publish(f"RDATA events persister1 8 {orjson.dumps(_event(8)).decode()}")
    d.wait(lambda: 8 in d.printed("events"), "persister1's next fact")
    d.stop()
    assert d.printed("receipts") == [1, 2, 3, 4, 5, 6, 7]
    assert d.printed("events") == [1, 2, 3, 4, 5, 6, 7, 8]
    said = d.err.read_text()
    assert said.count("holding back events/persister1 at token 0") == 1, said
    assert "the other writers go on" in said
    assert json.loads(d.cursor.read_text())["positions"] == {"events": {"persister1": 8},
                                                            "receipts": {"master": 7}}


def test_a_writer_that_is_down_is_held_back_alone_and_resumes(deployment: Deployment) -> None:
    _held_back_then_resumed(deployment, deployment.persister.start)
    assert "connection refused" in deployment.err.read_text()


def test_a_writer_that_does_not_answer_is_held_back_alone(deployment: Deployment) -> None:
    """A writer that takes connections and never answers: held back once its page
    took longer than the follower's patience, not after every retry's timeout."""
    deployment.persister.scripted = ["hang"] * 1000
    deployment.persister.start()
    _held_back_then_resumed(deployment, deployment.persister.scripted.clear)
    assert f"the writer persister1 at http://127.0.0.1:{deployment.persister.port} did not answer for events " \
           "within 5s" in deployment.err.read_text()
