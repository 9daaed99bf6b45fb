"""Durable cursors against a real reference homeserver (matrix-synapse, its own venv,
never imported) replicating through a Redis of the test's own.

A raw subscriber captures every ``RDATA`` the homeserver publishes; ``streamrep
tail --redis`` follows it with a cursor, is stopped during a phase of the workload
(messages, receipts, account data) and started again:

* (b) SIGTERM during a phase, restarted with ``--cursor``;
* (c) SIGKILL during a phase, with ``--sink`` (SQLite).

Each run hands on what it heard exactly once, in the homeserver's order; the
resumed run knows exactly where the stopped one ended: what the homeserver
published in between is one gap per writer, from the token the cursor holds to the
writer's position, said on stderr (no catch-up source is given here: these runs
have no database nor HTTP source to fetch it from), and nothing the first run took
comes again.
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Iterator
from urllib.parse import quote

import orjson
import pytest

from support.redis_server import RedisServer, own_redis_server, unique_server_name, wait_subscribed
from support.reference_homeserver import Homeserver, running_homeserver

pytestmark = pytest.mark.slow

#: Streams whose facts the workload makes and the checks compare.
STREAMS = ("events", "receipts", "account_data")

Fact = tuple[str, str, int]


class Capture:
    """Every ``RDATA`` fact published on the channel, in order, by a raw subscriber."""

    def __init__(self, url: str, channel: str) -> None:
        import redis

        self.facts: list[Fact] = []
        #: every message, for the commands that are not facts
        self.messages: list[bytes] = []
        self._pubsub = redis.Redis.from_url(url).pubsub()
        self._pubsub.subscribe(channel)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.2)
            if message is None or message["type"] != "message":
                continue
            self.messages.append(message["data"])
            parts = message["data"].split(b" ", 4)
            if parts[0] == b"RDATA" and parts[3] != b"batch" and parts[1].decode() in STREAMS:
                self.facts.append((parts[1].decode(), parts[2].decode(), int(parts[3])))

    def settle(self, last_event: int) -> None:
        """Until the capture has the ``events`` fact *last_event* and a moment after
        (what was published before it is in by then)."""
        deadline = time.monotonic() + 30
        while not any(s == "events" and t == last_event for s, _i, t in self.facts[-20:]):
            assert time.monotonic() < deadline, f"events {last_event} not published"
            time.sleep(0.05)
        time.sleep(0.3)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, Homeserver, str]]:
    redis_server = own_redis_server()
    try:
        server_name = unique_server_name("cursor-ref")
        directory = tmp_path_factory.mktemp("hs")
        with running_homeserver(str(directory), redis_server.url, server_name) as hs:
            yield redis_server, hs, server_name
    finally:
        redis_server.stop()


class Workload:
    """Messages, read receipts and account data of one user in one room."""

    def __init__(self, hs: Homeserver) -> None:
        self.hs = hs
        localpart = f"u{uuid.uuid4().hex[:8]}"
        self.token = hs.register(localpart)
        self.user = f"@{localpart}:{hs.server_name}"
        self.room = hs.create_room(self.token)

    def step(self, n: int) -> None:
        event_id = self.hs.send_message(self.token, self.room, f"message {n}")
        if n % 3 == 0:
            self.hs.request("POST", f"/_matrix/client/v3/rooms/{quote(self.room)}/receipt/m.read/"
                                    f"{quote(event_id)}", {}, self.token)
        if n % 4 == 0:
            self.hs.request("PUT", f"/_matrix/client/v3/user/{quote(self.user)}/account_data/"
                                   f"org.example.cursor", {"n": n}, self.token)


def _tail(tmp: pathlib.Path, label: str, url: str, server: str, *durable: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.pop("STREAMREP_DEBUG_RESOURCES", None)
    with (tmp / f"{label}.out").open("wb") as out, (tmp / f"{label}.err").open("wb") as err:
        return subprocess.Popen([sys.executable, "-m", "streamrep", "tail", "--redis", url, "--server-name", server,
                                 "--name", "cursor-ref", *(f"--stream={s}" for s in STREAMS), *durable],
                                stdout=out, stderr=err, env=env)


def _printed(path: pathlib.Path) -> list[Fact]:
    facts: list[Fact] = []
    for line in path.read_bytes().split(b"\n")[:-1]:
        item = orjson.loads(line)
        fact = (item["stream"], item["instance"], item["token"])
        if not facts or facts[-1] != fact:
            facts.append(fact)
    return facts


def _answered(capture: Capture, since: int, url: str, server: str, err: pathlib.Path) -> None:
    """Until the homeserver answered a REPLICATE published after message *since*
    (the tail's: its positions then reach the tail before anything published later)."""
    wait_subscribed(url, server, 3, logs=[err])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        messages = capture.messages[since:]
        if b"REPLICATE" in messages:
            after = messages[messages.index(b"REPLICATE"):]
            if any(m.startswith(b"POSITION events ") for m in after):
                return
        time.sleep(0.05)
    raise AssertionError("the homeserver did not answer tail's REPLICATE: " + err.read_text()[-1000:])


def _wait_printed(path: pathlib.Path, want: list[Fact], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not set(want) <= set(_printed(path)) and time.monotonic() < deadline:
        time.sleep(0.1)


def _gaps(err: pathlib.Path) -> dict[tuple[str, str], tuple[int, int]]:
    """The gaps the resumed tail said it could not fill: writer -> (after, upto)."""
    found = {}
    for match in re.finditer(r"missed facts of (\w+)/(\S+) after token (\d+) \(it is at (\d+)\)", err.read_text()):
        found[(match[1], match[2])] = (int(match[3]), int(match[4]))
    return found


@pytest.mark.parametrize("case", ["b-sigterm-cursor", "c-sigkill-sink"])
def test_a_follower_stopped_during_a_phase_resumes_where_it_stopped(
        deployment: tuple[RedisServer, Homeserver, str], tmp_path: pathlib.Path, case: str) -> None:
    redis_server, hs, server = deployment
    url = redis_server.url
    kill = case.startswith("c")
    durable = ["--sink", f"sqlite:///{tmp_path}/sink.db"] if kill else ["--cursor", str(tmp_path / "tail.cursor")]
    rng = random.Random(int(os.environ.get("STREAMREP_STRESS_SEED", "28")))
    workload = Workload(hs)
    capture = Capture(url, server)
    try:
        since = len(capture.messages)
        first = _tail(tmp_path, "first", url, server, *durable)
        _answered(capture, since, url, server, tmp_path / "first.err")
        heard_from = len(capture.facts)
        # Phase 1, with the follower stopped at a random moment during it.
        stop_after = rng.randint(4, 10)
        for n in range(14):
            if n == stop_after:
                first.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                code = first.wait(30)
                assert code == (-signal.SIGKILL if kill else 0), (tmp_path / "first.err").read_text()
            workload.step(n)
        # Phase 2 with nobody following, then the follower again.
        for n in range(14, 20):
            workload.step(n)
        capture.settle(max(hs.stream_orderings()))
        resumed_at, since = len(capture.facts), len(capture.messages)
        second = _tail(tmp_path, "second", url, server, *durable)
        _answered(capture, since, url, server, tmp_path / "second.err")
        for n in range(20, 30):
            workload.step(n)
        phase3 = [f for f in capture.facts[resumed_at:]]
        if kill:
            deadline = time.monotonic() + 30
            while not set(phase3) <= set(_sink(tmp_path)) and time.monotonic() < deadline:
                time.sleep(0.1)
        else:
            _wait_printed(tmp_path / "second.out", phase3)
        time.sleep(1.0)  # anything more would show up now
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0, (tmp_path / "second.err").read_text()
    finally:
        capture.close()
    truth = capture.facts[heard_from:]
    if kill:
        taken = _sink(tmp_path)
        runs = [taken]
    else:
        runs = [_printed(tmp_path / "first.out"), _printed(tmp_path / "second.out")]
        taken = runs[0] + runs[1]
    assert len(taken) == len(set(taken)), "a fact taken twice"
    assert set(taken) <= set(truth), sorted(set(taken) - set(truth))[:10]
    assert set(phase3) <= set(taken), sorted(set(phase3) - set(taken))[:10]
    assert {s for s, _i, _t in truth} == set(STREAMS), truth
    # What the first run took ends where its cursor says; the resumed run says what it
    # missed from exactly there to each writer's position, once per writer.
    gaps = _gaps(tmp_path / "second.err")
    for (stream, instance), (after, upto) in gaps.items():
        before = [t for s, i, t in taken if (s, i) == (stream, instance) and t <= after]
        heard_before = [t for s, i, t in truth[:resumed_at - heard_from] if (s, i) == (stream, instance)]
        assert before == [t for t in heard_before if t <= after], (stream, instance, after)
        assert upto >= after
    events = {i for s, i, _t in truth if s == "events"}
    assert any(key[0] == "events" and key[1] in events for key in gaps), (tmp_path / "second.err").read_text()


def _sink(tmp_path: pathlib.Path) -> list[Fact]:
    import sqlite3

    path = tmp_path / "sink.db"
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        try:
            rows: list[Any] = db.execute("SELECT stream, instance, token FROM streamrep_follow_rows"
                                         " WHERE row_index = 0 ORDER BY id").fetchall()
        except sqlite3.OperationalError:
            return []
    return [(str(s), str(i), int(t)) for s, i, t in rows]
