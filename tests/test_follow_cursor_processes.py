"""Durable cursors with real processes: ``streamrep tail --cursor`` and ``--sink``
stopped at random moments and started again while ``streamrep write`` writes,
over the TCP hub and over Redis.

* SIGTERM and SIGINT with a cursor file: every fact printed exactly once over all
  the runs together.
* SIGKILL with a cursor file: every fact printed at least once; a fact printed
  twice is one the killed run printed after its last save, so it comes again first
  thing in the next run (counted, and checked to be only that).
* SIGKILL with a database sink: every fact exactly once in ``streamrep_follow_rows``.

``STREAMREP_STRESS_SEED`` picks the kill moments; the rounds are few and short so
the whole module stays within a minute or two.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import orjson
import pytest

from support.processes import reap_processes, streamrep_process
from support.redis_server import deployment_database, shared_redis_url, unique_server_name, wait_subscribed

pytestmark = pytest.mark.slow

ROUNDS = 3
SERVER = "cursor.test"

@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    yield
    reap_processes()


def _streamrep(tmp: pathlib.Path, label: str, *args: str) -> subprocess.Popen[bytes]:
    return streamrep_process(tmp / f"{label}.err", *args, out=tmp / f"{label}.out")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Deployment:
    """Where the processes meet: a hub (``serve``) on a port, or a Redis channel."""

    tmp: pathlib.Path
    transport: str
    db: str
    link: list[str] = field(default_factory=list)

    def start(self) -> None:
        if self.transport == "tcp":
            port = _free_port()
            _streamrep(self.tmp, "serve", "serve", "--db", self.db, "--listen", f"127.0.0.1:{port}",
                       "--server-name", SERVER)
            self.link = ["--connect", f"127.0.0.1:{port}", "--server-name", SERVER]
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError((self.tmp / "serve.err").read_text()) from None
                    time.sleep(0.05)
        self.server = unique_server_name("cursor")
        self.link = ["--redis", shared_redis_url(), "--server-name", self.server]

    def tail_args(self) -> list[str]:
        # Over Redis a restarted tail fills what it missed from the database.
        extra = ["--db", deployment_database(self.db, self.server)] if self.transport == "redis" else []
        return ["tail", *self.link, *extra, "--stream", "caches", "--from", "0", "--name", "durable"]

    def writer(self) -> subprocess.Popen[bytes]:
        proc = _streamrep(self.tmp, "w1", "write", *self.link, "--db", self.db, "--instance-name", "w1",
                          "--stream", "caches", "--count", "1000000", "--rate", "250")
        if self.transport == "redis":
            wait_subscribed(self.link[1], self.server, 1, logs=[self.tmp / "w1.err"])
        deadline = time.monotonic() + 60
        while self.written() == 0:  # writing, so its signal handlers are in place
            assert proc.poll() is None and time.monotonic() < deadline, (self.tmp / "w1.err").read_text()
            time.sleep(0.05)
        return proc

    def written(self) -> int:
        import sqlite3

        try:
            with sqlite3.connect(self.db.removeprefix("sqlite:///")) as db:
                return int(db.execute("SELECT COUNT(*) FROM cache_invalidations").fetchone()[0])
        except sqlite3.Error:  # not created yet
            return 0


def _stop_writer(tmp: pathlib.Path, writer: subprocess.Popen[bytes]) -> int:
    writer.send_signal(signal.SIGTERM)
    assert writer.wait(60) == 0, (tmp / "w1.err").read_text()
    text = (tmp / "w1.err").read_text()
    return int(text.rsplit("up to token ", 1)[1].split(";")[0])


def _printed(path: pathlib.Path) -> list[int]:
    """Tokens of the facts a tail printed, in order (a fact's rows share a token; a
    line cut by SIGKILL is not a fact printed)."""
    tokens: list[int] = []
    for line in path.read_bytes().split(b"\n")[:-1]:
        token = orjson.loads(line)["token"]
        if not tokens or tokens[-1] != token:
            tokens.append(token)
    return tokens


@dataclass
class Loop:
    """What the rounds measured."""

    rounds: int = 0
    facts: int = 0
    lost: int = 0
    duplicated: int = 0


def _kill_loop(tmp: pathlib.Path, deployment: Deployment, durable: list[str], kill: list[signal.Signals],
               rng: random.Random, last_seen: Callable[[], int]) -> tuple[int, list[subprocess.Popen[bytes]]]:
    """Run the tail *len(kill)* times, each stopped by its signal at a random moment
    while the writer writes; then once more until it has taken the writer's last fact."""
    writer = deployment.writer()
    runs = []
    for number, signum in enumerate(kill):
        proc = _streamrep(tmp, f"tail{number}", *deployment.tail_args(), *durable)
        runs.append(proc)
        if signum == signal.SIGKILL and rng.random() < 0.3:
            time.sleep(rng.uniform(0.2, 1.0))  # during start-up, or soon after
        else:
            # Before its handlers are installed SIGTERM ends the process at once
            # (nothing taken yet): aim at the following.
            _wait_for(tmp / f"tail{number}.err", b"tail: following", proc)
            time.sleep(rng.uniform(0.0, 1.0))
        proc.send_signal(signum)
        code = proc.wait(30)
        if signum != signal.SIGKILL:
            assert code == 0, (tmp / f"tail{number}.err").read_text()
    last = _stop_writer(tmp, writer)
    final = _streamrep(tmp, "tail-final", *deployment.tail_args(), *durable)
    runs.append(final)
    deadline = time.monotonic() + 60
    while last_seen() < last:
        assert final.poll() is None, (tmp / "tail-final.err").read_text()
        assert time.monotonic() < deadline, f"the last run took up to {last_seen()} of {last}"
        time.sleep(0.1)
    time.sleep(0.3)  # nothing more may come
    final.send_signal(signal.SIGTERM)
    assert final.wait(30) == 0, (tmp / "tail-final.err").read_text()
    return last, runs


def _wait_for(path: pathlib.Path, text: bytes, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while text not in path.read_bytes():
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()
        time.sleep(0.02)


def _signals(rng: random.Random, kind: str) -> list[signal.Signals]:
    if kind == "kill":
        return [signal.SIGKILL] * ROUNDS
    return [rng.choice([signal.SIGTERM, signal.SIGINT]) for _ in range(ROUNDS)]


def _rng() -> random.Random:
    return random.Random(int(os.environ.get("STREAMREP_STRESS_SEED", "28")))


def _report(what: str, loop: Loop) -> None:
    # Shown with -s (the figures quoted in docs/following.md come from here).
    print(f"\n{what}: {loop.rounds} rounds, {loop.facts} facts, {loop.lost} lost, {loop.duplicated} duplicated")


@pytest.mark.parametrize("transport", ["tcp", "redis"])
@pytest.mark.parametrize("kind", ["term", "kill"])
def test_tail_with_a_cursor_file_stopped_at_random_moments(tmp_path: pathlib.Path, transport: str,
                                                           kind: str) -> None:
    """SIGTERM/SIGINT: exactly once; SIGKILL: at least once, and what comes twice is
    only what the killed run printed after its last save."""
    rng = _rng()
    deployment = Deployment(tmp_path, transport, f"sqlite:///{tmp_path}/deployment.db")
    deployment.start()
    cursor = str(tmp_path / "tail.cursor")
    last, runs = _kill_loop(tmp_path, deployment, ["--cursor", cursor], _signals(rng, kind), rng,
                            lambda: max(_printed(tmp_path / "tail-final.out"), default=0))
    outputs = [_printed(tmp_path / f"tail{n}.out") for n in range(ROUNDS)] + [_printed(tmp_path / "tail-final.out")]
    everything = [token for output in outputs for token in output]
    counts = Counter(everything)
    loop = Loop(ROUNDS, len(counts), len(set(range(1, last + 1)) - set(counts)),
                sum(n - 1 for n in counts.values()))
    _report(f"tail --cursor over {transport}, {kind}", loop)
    assert loop.lost == 0, f"lost {sorted(set(range(1, last + 1)) - set(counts))[:10]}"
    assert set(counts) == set(range(1, last + 1))
    for output in outputs:
        assert output == sorted(output) and len(set(output)) == len(output)  # in order within a run
    if kind == "term":
        assert loop.duplicated == 0, [t for t, n in counts.items() if n > 1][:10]
        return
    # A run starts where the previous one's last save was: every repeat is a fact the
    # previous run printed last, never anything older.
    seen: set[int] = set()
    for before, output in zip(outputs, outputs[1:]):
        seen.update(before)
        repeated = [t for t in output if t in seen]
        assert repeated == output[:len(repeated)], f"repeats are not the previous run's last facts: {repeated[:10]}"
        assert len(repeated) <= 1000, "more than 1,000 facts since the last save"
        assert not before or not repeated or repeated[-1] == before[-1]


def _sink_rows(url: str) -> list[tuple[str, str, int, int]]:
    from streamrep.db import Database

    database = Database.open(url, migrate=False)
    try:
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in database.fetchall(
            "SELECT stream, instance, token, row_index FROM streamrep_follow_rows ORDER BY id")]
    finally:
        database.close()


@pytest.mark.parametrize("transport, engine", [("tcp", "sqlite"), ("redis", "postgres")])
def test_tail_into_a_sink_killed_at_random_moments_writes_each_fact_once(
        tmp_path: pathlib.Path, request: pytest.FixtureRequest, transport: str, engine: str) -> None:
    rng = _rng()
    deployment = Deployment(tmp_path, transport, f"sqlite:///{tmp_path}/deployment.db")
    deployment.start()
    if engine == "sqlite":
        sink = f"sqlite:///{tmp_path}/sink.db"
    else:
        sink = request.getfixturevalue("pg_url")

    def last_seen() -> int:
        try:
            return max((row[2] for row in _sink_rows(sink)), default=0)
        except Exception:  # the table does not exist before the first run created it
            return 0

    last, _runs = _kill_loop(tmp_path, deployment, ["--sink", sink], [signal.SIGKILL] * ROUNDS, rng, last_seen)
    rows = _sink_rows(sink)
    counts = Counter((stream, instance, token, index) for stream, instance, token, index in rows)
    tokens = {token for (_s, _i, token, _n) in counts}
    loop = Loop(ROUNDS, len(tokens), len(set(range(1, last + 1)) - tokens), sum(n - 1 for n in counts.values()))
    _report(f"tail --sink {engine} over {transport}, kill", loop)
    assert loop.lost == 0 and loop.duplicated == 0, loop
    assert {(s, i) for (s, i, _t, _n) in counts} == {("caches", "w1")}
    assert [token for (_s, _i, token, _n) in rows] == sorted(token for (_s, _i, token, _n) in rows)
