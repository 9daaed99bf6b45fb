"""Following a multi-writer reference deployment (matrix-synapse, its own venv, never
imported) with ``streamrep tail --synapse-config``: main and two event persisters on
PostgreSQL, Redis of the test's own (support/reference_deployment.py).

The follower is given main's ``homeserver.yaml`` and nothing else, follows the
``events`` stream over Redis with a cursor file, and fills each gap from the writer
the gap belongs to over the HTTP replication API. A workload sends messages into
rooms of both persisters while, depending on the case:

* the follower is stopped with SIGTERM and started again with its cursor;
* (d) Redis is SIGKILLed and started again;
* (e) main is restarted, and later every process.

The truth comes without streamrep: every ``events`` row a raw subscriber heard
(support/replication_truth.py) from the writers' positions when the follower first
started to the end, plus every row each writer's HTTP API serves for that span (so
for every gap in it). Every row heard is served too, and a gap really happened.
The follower hands on each row of the truth exactly once, each carrying its writer
(p1 or p2), and no other row.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import threading
import time
from collections import Counter
from typing import Iterator

import orjson
import pytest

from support.processes import reap_processes, streamrep_process
from support.reference_deployment import PERSISTERS, PROCESSES, Deployment, running_deployment
from support.replication_truth import Capture, Row, canonical

pytestmark = pytest.mark.slow


@pytest.fixture
def deployment(tmp_path: pathlib.Path) -> Iterator[Deployment]:
    with running_deployment(str(tmp_path / "deployment")) as running:
        yield running


@pytest.fixture
def capture(deployment: Deployment) -> Iterator[Capture]:
    heard = Capture(deployment.redis.url, deployment.server_name, ["events"])
    try:
        yield heard
    finally:
        heard.close()
        reap_processes()


class Workload:
    """Messages sent round-robin into rooms of both persisters from a thread of its
    own; a message refused while a process is down is sent again until it goes
    through (what the deployment persisted is the truth, not what was sent)."""

    def __init__(self, deployment: Deployment, steps: int, pause: float = 0.05) -> None:
        self.deployment = deployment
        self.token = deployment.register("writer")
        rooms = deployment.rooms_on_every_writer(self.token, per_writer=2)
        self.rooms = [room for writer in PERSISTERS for room in rooms[writer]]
        self.steps = steps
        self.pause = pause
        self.sent = 0
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _send(self, n: int) -> None:
        deadline = time.monotonic() + 180
        while True:
            try:
                self.deployment.send_message(self.token, self.rooms[n % len(self.rooms)], f"message {n}")
                return
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _run(self) -> None:
        try:
            for n in range(self.steps):
                self._send(n)
                self.sent = n + 1
                time.sleep(self.pause)
        except BaseException as exc:  # handed to the test by join()
            self.failure = exc

    def wait_sent(self, count: int, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while self.sent < count:
            assert self.failure is None, self.failure
            assert time.monotonic() < deadline, f"{self.sent} of {count} messages sent"
            time.sleep(0.05)

    def join(self) -> None:
        self._thread.join(600)
        assert not self._thread.is_alive(), "the workload did not end"
        assert self.failure is None, self.failure


class Follower:
    """``streamrep tail --synapse-config`` runs sharing one cursor file."""

    def __init__(self, deployment: Deployment, capture: Capture, tmp_path: pathlib.Path) -> None:
        self.deployment = deployment
        self.capture = capture
        self.tmp_path = tmp_path
        self.cursor = tmp_path / "follow.cursor"
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None

    def out(self, run: int) -> pathlib.Path:
        return self.tmp_path / f"run{run}.out"

    def err(self, run: int) -> pathlib.Path:
        return self.tmp_path / f"run{run}.err"

    def start(self) -> dict[str, int]:
        """A new run; once the writers answered its REPLICATE, their positions then."""
        self.runs += 1
        since = len(self.capture.messages)
        self.process = streamrep_process(
            self.err(self.runs), "tail", "--synapse-config", self.deployment.config_path,
            "--stream", "events", "--cursor", str(self.cursor), out=self.out(self.runs))
        self._wait_subscribed()
        try:
            return {instance: token for (_s, instance), token in self.capture.answers(since, ["events"]).items()}
        except AssertionError as exc:
            raise AssertionError(f"{exc}: " + self.err(self.runs).read_text()[-2000:]) from None

    def _wait_subscribed(self, timeout: float = 60.0) -> None:
        """Until the channel has its five subscribers (main, p1, p2, the capture and
        the follower); fails at once when the follower exits."""
        import redis

        client = redis.Redis.from_url(self.deployment.redis.url)
        channel = self.deployment.server_name
        deadline = time.monotonic() + timeout
        try:
            while dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) < len(PROCESSES) + 2:
                assert self.process is not None
                code = self.process.poll()
                assert code is None, f"tail exited with status {code}: {self.err(self.runs).read_text()[-2000:]}"
                assert time.monotonic() < deadline, (f"tail did not subscribe in {timeout:g}s: "
                                                     + self.err(self.runs).read_text()[-2000:])
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM; the run must end cleanly."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        assert code == 0, (code, self.err(self.runs).read_text()[-2000:])
        self.process = None

    def rows(self) -> list[Row]:
        """Every row the runs so far handed on."""
        rows: list[Row] = []
        for run in range(1, self.runs + 1):
            if not self.out(run).exists():
                continue
            for line in self.out(run).read_bytes().split(b"\n")[:-1]:
                item = orjson.loads(line)
                rows.append((item["stream"], item["instance"], int(item["token"]), canonical(item["row"])))
        return rows

    def wait_rows(self, want: Counter[Row], timeout: float = 90.0) -> None:
        """Until the runs handed on every row of *want*, then a moment for any extra."""
        deadline = time.monotonic() + timeout
        while not want <= Counter(self.rows()) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)


def _truth(deployment: Deployment, capture: Capture, start: dict[str, int]) -> tuple[Counter[Row], Counter[Row]]:
    """(every row of the truth, the rows of it the capture did not hear), once the
    deployment persisted and published everything."""
    last, writer = deployment.events()[-1]
    capture.settle("events", writer, last)
    truth: Counter[Row] = Counter()
    unheard: Counter[Row] = Counter()
    for writer in PERSISTERS:
        served = Counter(("events", writer, token, row)
                         for token, row in deployment.served_rows("events", writer, start[writer], last))
        heard = Counter(row for row in capture.rows
                        if row[1] == writer and start[writer] < row[2] <= last)
        assert not heard - served, f"{writer} published rows it does not serve: {sorted(heard - served)[:5]}"
        assert served, f"{writer} persisted nothing after {start[writer]}"
        truth += served
        unheard += served - heard
    assert max(truth.values()) == 1
    return truth, unheard


def _check(follower: Follower, truth: Counter[Row]) -> None:
    taken = Counter(follower.rows())
    doubled = sorted(row for row, n in taken.items() if n > 1)
    missing = sorted(truth - taken)
    extra = sorted(taken - truth)
    said = " | ".join(follower.err(run).read_text()[-800:] for run in range(1, follower.runs + 1))
    assert not doubled, f"{len(doubled)} rows handed on twice, first {doubled[:3]}; {said}"
    assert not missing, f"{len(missing)} of {sum(truth.values())} rows missing, first {missing[:3]}; {said}"
    assert not extra, f"{len(extra)} rows not in the truth, first {extra[:3]}; {said}"
    assert {instance for _s, instance, _t, _r in taken} == set(PERSISTERS)


class Case:
    """A workload under way with a follower that started before it."""

    def __init__(self, deployment: Deployment, capture: Capture, tmp_path: pathlib.Path, steps: int) -> None:
        self.deployment = deployment
        self.capture = capture
        self.workload = Workload(deployment, steps)
        self.follower = Follower(deployment, capture, tmp_path)
        self.start = self.follower.start()
        assert set(PERSISTERS) <= set(self.start), f"positions after the follower's REPLICATE: {self.start}"
        self.workload.start()
        self.workload.wait_sent(15)

    def finish(self) -> Counter[Row]:
        """Once the workload ended, check what the follower handed on against the
        truth; returns the rows of the truth the capture did not hear."""
        self.workload.join()
        truth, unheard = _truth(self.deployment, self.capture, self.start)
        self.follower.wait_rows(truth)
        self.follower.stop()
        _check(self.follower, truth)
        return unheard


def test_a_follower_stopped_and_restarted_with_its_cursor_gets_every_row_of_both_writers_once(
        deployment: Deployment, capture: Capture, tmp_path: pathlib.Path) -> None:
    case = Case(deployment, capture, tmp_path, steps=60)
    case.follower.stop()
    stopped_at = len(capture.rows)
    case.workload.wait_sent(35)
    resumed_at = len(capture.rows)
    case.follower.start()
    case.finish()
    # The follower was away while both writers persisted rows: each of them had a gap.
    assert {row[1] for row in capture.rows[stopped_at:resumed_at]} == set(PERSISTERS)


def test_d_redis_killed_and_restarted_while_the_workload_runs(
        deployment: Deployment, capture: Capture, tmp_path: pathlib.Path) -> None:
    case = Case(deployment, capture, tmp_path, steps=50)
    persisted = len(deployment.events())
    before = {name: deployment.replicates_sent(name) for name in PROCESSES}
    deployment.redis.kill()
    # Events persisted while nobody can publish them: only the HTTP API has them.
    deadline = time.monotonic() + 120
    while len(deployment.events()) < persisted + 3:
        assert time.monotonic() < deadline, "nothing persisted while Redis was down"
        time.sleep(0.2)
    deployment.redis.start()
    deployment.wait_replicating(PROCESSES, before)
    unheard = case.finish()
    assert unheard, "every row was published: Redis was not down while rows were persisted"


def test_e_the_deployment_restarted_while_the_follower_runs(
        deployment: Deployment, capture: Capture, tmp_path: pathlib.Path) -> None:
    case = Case(deployment, capture, tmp_path, steps=60)
    deployment.restart(("main",))
    case.workload.wait_sent(30)
    deployment.restart()
    case.finish()
