"""Exactly once over Redis between streamrep processes, with real processes.

Readers (``streamrep tail --redis``) start before, during and after writers
(``streamrep write --redis``), with and without a database. Every reader must print
each fact of each writer exactly once, from where it started to the writer's last
fact, with no hole: a reader started before a writer gets all of its facts, one
that joined later an unbroken run up to the end.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import time
from collections import Counter
from typing import Iterator

import orjson
import pytest

from support.processes import reap_processes, streamrep_process
from support.redis_server import deployment_database, shared_redis_url, unique_server_name, wait_subscribed

pytestmark = pytest.mark.slow

@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    yield
    reap_processes()


def _streamrep(err: pathlib.Path, out: pathlib.Path, *args: str) -> subprocess.Popen[bytes]:
    return streamrep_process(err, *args, out=out)


def _tail(tmp: pathlib.Path, name: str, url: str, server: str, db: str | None) -> subprocess.Popen[bytes]:
    args = ["tail", "--redis", url, "--server-name", server, "--name", name]
    if db is not None:
        args += ["--db", deployment_database(db, server)]
    return _streamrep(tmp / f"{name}.err", tmp / f"{name}.out", *args)


def _write(tmp: pathlib.Path, instance: str, stream: str, url: str, server: str, db: str, count: int,
           rate: float) -> subprocess.Popen[bytes]:
    return _streamrep(tmp / f"{instance}.err", tmp / f"{instance}.out", "write", "--redis", url,
                      "--server-name", server, "--db", db, "--instance-name", instance, "--stream", stream,
                      "--count", str(count), "--rate", str(rate))


def _printed(path: pathlib.Path) -> Counter[tuple[str, str, int]]:
    """Facts a tail printed (rows of one fact share its token: counted once)."""
    seen: list[tuple[str, str, int]] = []
    for line in path.read_bytes().splitlines():
        item = orjson.loads(line)
        key = (item["stream"], item["instance"], item["token"])
        if not seen or seen[-1] != key:
            seen.append(key)
    return Counter(seen)


def _stop(proc: subprocess.Popen[bytes], what: str) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not stop within 30s") from None


def _finish(proc: subprocess.Popen[bytes], what: str, err: pathlib.Path) -> None:
    try:
        code = proc.wait(90)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not finish within 90s") from None
    assert code == 0, err.read_text()


def _wait_printed(path: pathlib.Path, want: dict[tuple[str, str], int], timeout: float = 20) -> None:
    """Until the tail printed each writer's last token (or *timeout*)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        printed = _printed(path)
        if all((s, i, t) in printed for (s, i), t in want.items()):
            return
        time.sleep(0.1)


def _assert_unbroken(printed: Counter[tuple[str, str, int]], writer: tuple[str, str], last: int,
                     whole: bool, who: str) -> None:
    """Each fact once, an unbroken run of tokens ending at *last* (from 1 if *whole*)."""
    tokens = sorted(t for (s, i, t) in printed if (s, i) == writer)
    dups = [k for k, n in printed.items() if n > 1]
    assert not dups, f"{who}: printed twice: {dups[:5]}"
    assert tokens, f"{who}: printed nothing of {writer}"
    first = 1 if whole else tokens[0]
    missing = sorted(set(range(first, last + 1)) - set(tokens))
    assert not missing and tokens[-1] == last, (
        f"{who}: {len(missing)} facts of {writer} missing ({missing[:10]}...), printed {len(tokens)} "
        f"from {tokens[0]} to {tokens[-1]}, the writer reached {last}")


@pytest.mark.parametrize("with_db", [True, False], ids=["db", "no-db"])
def test_a_reader_started_before_the_writer_prints_all_of_its_facts(tmp_path: pathlib.Path,
                                                                     with_db: bool) -> None:
    """A tail started first, then a writer persisting 400 facts at 400/s: every fact,
    once, with no --from (the facts the writer committed before its own subscription
    was confirmed are announced once it is)."""
    url, server = shared_redis_url(), unique_server_name("first")
    db = f"sqlite:///{tmp_path}/deployment.db"
    tail = _tail(tmp_path, "reader", url, server, db if with_db else None)
    wait_subscribed(url, server, 1, logs=[tmp_path / "reader.err"])
    writer = _write(tmp_path, "w1", "caches", url, server, db, 400, 400)
    _finish(writer, "write", tmp_path / "w1.err")
    _wait_printed(tmp_path / "reader.out", {("caches", "w1"): 400})
    _stop(tail, "tail")
    _assert_unbroken(_printed(tmp_path / "reader.out"), ("caches", "w1"), 400, True, "reader")
    assert "missed facts" not in (tmp_path / "reader.err").read_text()


def _last_token(err: pathlib.Path) -> int:
    """The token a finished ``write`` says it reached ("... up to token N; ...")."""
    text = err.read_text()
    return int(text.rsplit("up to token ", 1)[1].split(";")[0])


def test_readers_joining_at_random_moments_print_an_unbroken_run_of_every_writer(tmp_path: pathlib.Path) -> None:
    """Short rounds of two writers and readers with and without a database joining at
    random moments while both write: 0 lost, 0 duplicated, for each reader from where
    it joined to the end."""
    rng = random.Random(int(os.environ.get("STREAMREP_STRESS_SEED", "2026")))
    url = shared_redis_url()
    for round_number in range(3):
        tmp = tmp_path / f"round{round_number}"
        tmp.mkdir()
        server = unique_server_name(f"join{round_number}")
        db = f"sqlite:///{tmp}/deployment.db"
        first = _tail(tmp, "first", url, server, db)
        wait_subscribed(url, server, 1, logs=[tmp / "first.err"])
        # Writers that write until told to stop, so every reader joins while they write.
        writers = {("caches", "w1"): _write(tmp, "w1", "caches", url, server, db, 1_000_000, 100),
                   ("account_data", "w2"): _write(tmp, "w2", "account_data", url, server, db, 1_000_000, 100)}
        wait_subscribed(url, server, 3, logs=[tmp / "w1.err", tmp / "w2.err"])
        readers = {"first": (first, True)}
        for n in range(4):
            time.sleep(rng.uniform(0.05, 0.5))
            name, with_db = f"r{n}", n % 2 == 0
            readers[name] = (_tail(tmp, name, url, server, db if with_db else None), with_db)
        wait_subscribed(url, server, 3 + 4, logs=[tmp / f"r{n}.err" for n in range(4)])
        time.sleep(rng.uniform(0.5, 1.5))
        lasts = {}
        for (stream, instance), proc in writers.items():
            _stop(proc, f"write {instance}")
            assert proc.returncode == 0, (tmp / f"{instance}.err").read_text()
            lasts[(stream, instance)] = _last_token(tmp / f"{instance}.err")
        for name, (proc, _with_db) in readers.items():
            _wait_printed(tmp / f"{name}.out", lasts)
            _stop(proc, f"tail {name}")
        for name, (_proc, with_db) in readers.items():
            printed = _printed(tmp / f"{name}.out")
            for writer, last in lasts.items():
                _assert_unbroken(printed, writer, last, name == "first",
                                 f"round {round_number} reader {name} ({'db' if with_db else 'no db'})")


def test_a_reader_with_a_database_gets_facts_nobody_announced(tmp_path: pathlib.Path) -> None:
    """A writer that lost Redis for good (here: pointed at a Redis that is not there)
    still commits; a reader with the deployment's database delivers those facts from
    it within its poll interval, exactly once."""
    url, server = shared_redis_url(), unique_server_name("silent")
    db = f"sqlite:///{tmp_path}/deployment.db"
    tail = _tail(tmp_path, "reader", url, server, db)
    wait_subscribed(url, server, 1, logs=[tmp_path / "reader.err"])
    writer = _streamrep(tmp_path / "w1.err", tmp_path / "w1.out", "write", "--redis", "redis://127.0.0.1:1",
                        "--server-name", server, "--db", db, "--instance-name", "w1", "--stream", "caches",
                        "--count", "50", "--announce-timeout", "1")
    assert writer.wait(60) != 0  # its facts were never accepted by any Redis
    _wait_printed(tmp_path / "reader.out", {("caches", "w1"): 50}, timeout=60)
    _stop(tail, "tail")
    _assert_unbroken(_printed(tmp_path / "reader.out"), ("caches", "w1"), 50, True, "reader")
