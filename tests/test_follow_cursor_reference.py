"""Following a real reference homeserver (matrix-synapse, its own venv, never
imported) with ``streamrep tail --synapse-config homeserver.yaml``: its Redis (of the
test's own), and every gap fetched over the homeserver's HTTP replication API.

A workload touches nine of its streams (messages, receipts, account data, typing,
to-device messages, device lists, push rules, pushers, presence). A raw
subscriber captures every row the homeserver publishes. The truth is, per writer:

* the rows captured while a run of the follower followed it: past the position
  the writer answered its ``REPLICATE`` with, up to where that run stopped (its
  cursor; for the last run, everything captured);
* the rows the HTTP API serves for the gap between a stopped run's cursor and the
  writer's answer to the next run's ``REPLICATE``, asked right after that answer
  (some streams serve only the current row per key: what they no longer serve is
  not in the truth).

Cases: (a) connected throughout; (b) stopped with SIGTERM during a phase and
restarted with ``--cursor``; (c) SIGKILLed during a phase, with ``--sink`` (SQLite).
Each ends with every row of the truth exactly once, and no other row; no gap is
left unfilled and no writer is held back.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import quote

import orjson
import pytest

from support.redis_server import RedisServer, own_redis_server, unique_server_name, wait_subscribed
from support.reference_homeserver import REPLICATION_SECRET, Homeserver, running_homeserver
from support.replication_truth import Capture, Row, Writer, canonical, served_rows

pytestmark = pytest.mark.slow

#: The streams the workload writes, which the follower follows.
STREAMS = ("events", "receipts", "account_data", "typing", "to_device", "device_lists", "push_rules", "pushers",
           "presence")

def _served(hs: Homeserver, writer: Writer, after: int, upto: int) -> list[Row]:
    """The rows the homeserver's HTTP replication API serves for ``after < token <= upto``."""
    stream, instance = writer
    assert instance == "master", "a single-process deployment: the main process writes every stream"
    return [(stream, instance, token, row) for token, row in
            served_rows(f"http://127.0.0.1:{hs.replication_port}", stream, after, upto, REPLICATION_SECRET)]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, Homeserver]]:
    redis_server = own_redis_server()
    try:
        directory = tmp_path_factory.mktemp("hs")
        with running_homeserver(str(directory), redis_server.url, unique_server_name("follow-ref")) as hs:
            yield redis_server, hs
    finally:
        redis_server.stop()


class Workload:
    """One user in one room touching nine streams; nothing that times out on its
    own (typing is stopped again, presence is set offline with a status), so what
    the homeserver publishes is what the workload did."""

    def __init__(self, hs: Homeserver) -> None:
        self.hs = hs
        localpart = f"u{uuid.uuid4().hex[:8]}"
        self.token = hs.register(localpart)
        self.user = f"@{localpart}:{hs.server_name}"
        self.device = hs.request("GET", "/_matrix/client/v3/account/whoami", None, self.token)["device_id"]
        self.room = hs.create_room(self.token)

    def _call(self, method: str, path: str, body: Any) -> None:
        self.hs.request(method, f"/_matrix/client/v3/{path}", body, self.token)

    def step(self, n: int) -> None:
        room, user = quote(self.room), quote(self.user)
        event_id = self.hs.send_message(self.token, self.room, f"message {n}")
        if n % 3 == 0:
            self._call("POST", f"rooms/{room}/receipt/m.read/{quote(event_id)}", {})
        if n % 4 == 0:
            self._call("PUT", f"user/{user}/account_data/org.example.follow", {"n": n})
        if n % 2 == 0:
            self._call("PUT", f"rooms/{room}/typing/{user}", {"typing": True, "timeout": 30000})
            self._call("PUT", f"rooms/{room}/typing/{user}", {"typing": False})
        if n % 5 == 0:
            self._call("PUT", f"sendToDevice/org.example.follow/{uuid.uuid4().hex}",
                       {"messages": {self.user: {self.device: {"n": n}}}})
        if n % 5 == 2:
            self._call("PUT", f"devices/{quote(self.device)}", {"display_name": f"device {n}"})
        if n % 6 == 1:
            self._call("PUT", f"pushrules/global/override/org.example.rule{n % 3}",
                       {"actions": ["dont_notify"],
                        "conditions": [{"kind": "event_match", "key": "content.body", "pattern": f"x{n}"}]})
        if n % 7 == 3:
            self._call("POST", "pushers/set", {
                "kind": "http", "app_id": "org.example.follow", "app_display_name": "follow",
                "device_display_name": "device", "pushkey": f"key{n}", "lang": "en",
                "data": {"url": "https://push.example.com/_matrix/push/v1/notify"}})
        if n % 4 == 1:
            self._call("PUT", f"presence/{user}/status", {"presence": "offline", "status_msg": f"step {n}"})


@dataclass
class Follower:
    """``streamrep tail --synapse-config`` as a process, and what its runs took."""

    tmp: pathlib.Path
    hs: Homeserver
    durable: list[str]
    runs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        label = f"run{len(self.runs)}"
        env = dict(os.environ)
        env.pop("STREAMREP_DEBUG_RESOURCES", None)
        with (self.tmp / f"{label}.out").open("wb") as out, (self.tmp / f"{label}.err").open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "streamrep", "tail", "--synapse-config", self.hs.config_path,
                 "--name", "follow-ref", *(f"--stream={s}" for s in STREAMS), *self.durable],
                stdout=out, stderr=err, env=env)
        self.runs.append(process)
        return process

    def err(self, index: int) -> str:
        return (self.tmp / f"run{index}.err").read_text(errors="replace")

    @property
    def sink(self) -> pathlib.Path | None:
        return self.tmp / "sink.db" if "--sink" in self.durable else None

    def taken(self) -> list[Row]:
        """Every row every run took: printed, or written into the sink."""
        if self.sink is not None:
            if not self.sink.exists():
                return []
            with sqlite3.connect(self.sink) as db:
                try:
                    found = db.execute("SELECT stream, instance, token, row_json FROM streamrep_follow_rows"
                                       " ORDER BY id").fetchall()
                except sqlite3.OperationalError:
                    return []
            return [(str(s), str(i), int(t), canonical(orjson.loads(r))) for s, i, t, r in found]
        rows: list[Row] = []
        for index in range(len(self.runs)):
            for line in (self.tmp / f"run{index}.out").read_bytes().split(b"\n")[:-1]:
                item = orjson.loads(line)
                rows.append((item["stream"], item["instance"], item["token"], canonical(item["row"])))
        return rows

    def cursor(self) -> dict[Writer, int]:
        """Where the cursor says the follower is, per writer."""
        if self.sink is not None:
            with sqlite3.connect(self.sink) as db:
                found = db.execute("SELECT stream, instance, token FROM streamrep_follow_cursors"
                                   " WHERE cursor_name = 'follow-ref' AND instance <> ''").fetchall()
            return {(str(s), str(i)): int(t) for s, i, t in found}
        doc = json.loads((self.tmp / "tail.cursor").read_text())
        return {(stream, instance): token for stream, writers in doc["positions"].items()
                for instance, token in writers.items()}

    def wait_taken(self, want: list[Row], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not Counter(want) <= Counter(self.taken()) and time.monotonic() < deadline:
            time.sleep(0.1)


def _run(follower: Follower, capture: Capture, url: str, server: str) -> dict[Writer, int]:
    """Start a run; return each writer's answer to its REPLICATE."""
    since = len(capture.messages)
    follower.start()
    wait_subscribed(url, server, 3, logs=[follower.tmp / f"run{len(follower.runs) - 1}.err"])
    return capture.answers(since, STREAMS)


def _stop(process: subprocess.Popen[bytes], sig: int) -> None:
    process.send_signal(sig)
    assert process.wait(30) == (0 if sig == signal.SIGTERM else -sig)


@pytest.mark.parametrize("case", ["a-connected", "b-sigterm-cursor", "c-sigkill-sink"])
def test_every_row_exactly_once_with_gaps_filled_over_http(
        deployment: tuple[RedisServer, Homeserver], tmp_path: pathlib.Path, case: str) -> None:
    redis_server, hs = deployment
    url, server = redis_server.url, hs.server_name
    durable = {"a": [], "b": ["--cursor", str(tmp_path / "tail.cursor")],
               "c": ["--sink", f"sqlite:///{tmp_path}/sink.db"]}[case[0]]
    follower = Follower(tmp_path, hs, durable)
    rng = random.Random(int(os.environ.get("STREAMREP_STRESS_SEED", "28")) + ord(case[0]))
    workload = Workload(hs)
    capture = Capture(url, server, STREAMS)
    truth: list[Row] = []
    try:
        start = _run(follower, capture, url, server)
        stop_after = rng.randint(4, 10) if case[0] != "a" else None
        for n in range(14):  # phase 1, the follower stopped at a random moment of it
            if n == stop_after:
                _stop(follower.runs[0], signal.SIGKILL if case[0] == "c" else signal.SIGTERM)
                stopped_at = follower.cursor()
                for writer, token in start.items():
                    truth += capture.rows_of(writer, token, stopped_at.get(writer, token))
            workload.step(n)
        if stop_after is not None:
            for n in range(14, 20):  # phase 2, nobody following
                workload.step(n)
            time.sleep(1.0)  # what phase 2 published is in the capture by now
            start = _run(follower, capture, url, server)
            gaps = [row for writer, token in start.items()
                    for row in _served(hs, writer, stopped_at.get(writer, 0), token)]
            assert {s for s, _i, _t, _r in gaps} >= {"events", "receipts", "presence"}, gaps
            truth += gaps
            follower.wait_taken(gaps)
        for n in range(20, 30):  # phase 3
            workload.step(n)
        time.sleep(1.0)
        last = capture.last_tokens()
        for writer, token in start.items():
            truth += capture.rows_of(writer, token)
        follower.wait_taken([row for row in truth if row[:2] in start])
        time.sleep(1.0)  # anything more would show up now
        _stop(follower.runs[-1], signal.SIGTERM)
    finally:
        capture.close()
    taken = follower.taken()
    extra, missing = Counter(taken) - Counter(truth), Counter(truth) - Counter(taken)
    assert not extra and not missing, (f"taken but not in the truth (or twice): {sorted(extra)[:5]}; "
                                       f"in the truth, never taken: {sorted(missing)[:5]}")
    assert {s for s, _i, _t, _r in truth} == set(STREAMS)
    for index in range(len(follower.runs)):
        said = follower.err(index)
        assert "holding back" not in said and "missed facts" not in said, said
    final = follower.cursor() if durable else {}
    for writer, token in final.items():
        assert token >= last.get(writer, 0), (writer, token, last.get(writer))
