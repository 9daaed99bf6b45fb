"""Multi-writer streams on PostgreSQL with real processes: concurrent writers with
failures and readers following along, and a writer killed mid-transaction."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gevent
import pytest

from streamrep.db import Database
from streamrep.streams import Streams

WRITER = str(Path(__file__).parent / "support" / "stream_writer.py")
pytestmark = pytest.mark.postgres


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, WRITER, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "error"})


def _follow(streams: Streams, seen: dict[str, list[int]], upto: dict[str, int]) -> None:
    """Read every writer's new rows up to its known position, checking order."""
    gen = streams.generator("caches")
    gen.refresh_positions()  # type: ignore[attr-defined]
    for writer in ("w1", "w2"):
        target = gen.get_current_token_for_writer(writer)
        while upto[writer] < target:
            rows, limited = streams.get_updates_since("caches", writer, upto[writer], target, 7)
            tokens = [token for token, _ in rows]
            assert tokens == sorted(tokens) and all(t > upto[writer] for t in tokens)
            assert all(row == ["c", [writer], 0] for _, row in rows)
            seen[writer].extend(tokens)
            upto[writer] = tokens[-1] if limited else target


def test_writers_with_failures_and_a_following_reader(pg_url: str) -> None:
    db = Database.open(pg_url)
    writers = {"caches": ["w1", "w2"]}
    reader = Streams(db, "reader", writers)
    reader.get("caches")  # creates the sequence and tables before the writers race
    procs = {name: _spawn(pg_url, name, "w1,w2", "work", "25", str(seed))
             for seed, name in enumerate(["w1", "w2"])}
    seen: dict[str, list[int]] = {"w1": [], "w2": []}
    upto = {"w1": 0, "w2": 0}
    deadline = time.monotonic() + 90
    while any(p.poll() is None for p in procs.values()):
        assert time.monotonic() < deadline, "writers did not finish"
        _follow(reader, seen, upto)
        time.sleep(0.02)
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        results[name] = json.loads(out.strip().splitlines()[-1])
    _follow(reader, seen, upto)

    all_committed: set[int] = set()
    for name, result in results.items():
        committed, rolled_back = set(result["committed"]), set(result["rolled_back"])
        assert len(committed) + len(rolled_back) == 75 and not committed & rolled_back
        # The writer reported each completed ID once, in order, up to its position.
        assert result["visible"] == sorted(committed | rolled_back)
        assert result["position"] == max(committed | rolled_back)
        # The reader saw every committed row of this writer exactly once, none rolled back.
        assert len(seen[name]) == len(set(seen[name]))
        assert set(seen[name]) == committed
        assert reader.current_token("caches", name) >= max(committed)
        all_committed |= committed
    assert not set(results["w1"]["committed"]) & set(results["w2"]["committed"])
    # Every committed row is at or below the reader's linear position once idle
    # writers have caught up with the sequence.
    for name in ("w1", "w2"):
        idle = Streams(db, name, writers)
        idle.open_all(["caches"])  # a restarted idle writer starts at the sequence
        idle.close()
    reader.generator("caches").refresh_positions()  # type: ignore[attr-defined]
    assert reader.current_token("caches") >= max(all_committed)
    reader.close()
    assert db.connections_in_use == 0
    db.close()


def test_writer_killed_mid_transaction_recovers(pg_url: str) -> None:
    db = Database.open(pg_url)
    writers = {"caches": ["w1", "w2"]}
    reader = Streams(db, "reader", writers)
    reader.get("caches")
    proc = _spawn(pg_url, "w1", "w1,w2", "hang")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        state = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    committed, hanging = state["committed"], state["hanging"]
    assert hanging > committed[0]
    # The orphaned transaction can never commit: the server rolls it back.
    assert reader.wait_for_stream_position("w1", "caches", committed[0], timeout=5)

    restarted = Streams(db, "w1", writers)
    gen = restarted.generator("caches")
    assert gen.get_current_token_for_writer("w1") >= hanging
    token = restarted.add_cache_invalidation("c", ["w1"], 0)
    assert token > hanging
    restarted.close()
    assert reader.wait_for_stream_position("w1", "caches", token, timeout=5)
    rows, limited = reader.get_updates_since("caches", "w1", 0, token, 100)
    assert [t for t, _ in rows] == [committed[0], token] and not limited
    reader.close()
    db.close()


def test_writers_starting_at_the_same_moment(pg_url: str) -> None:
    db = Database.open(pg_url)
    names = [f"w{i}" for i in range(6)]
    writers = {"caches": names}
    Streams(db, "reader", writers).get("caches")  # the sequence and tables exist

    def start(name: str) -> int:
        streams = Streams(db, name, writers)
        try:
            return streams.add_cache_invalidation("c", [name], 0)
        finally:
            streams.close()

    tokens: list[int] = []
    for _ in range(3):
        jobs = [gevent.spawn(start, name) for name in names]
        gevent.joinall(jobs, timeout=60, raise_error=True)
        assert all(job.ready() for job in jobs), "writers did not start"
        tokens.extend(job.value for job in jobs)
    assert len(set(tokens)) == len(tokens) == 3 * len(names)
    assert db.connections_in_use == 0
    db.close()
