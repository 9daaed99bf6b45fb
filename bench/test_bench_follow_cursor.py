"""What a durable cursor costs a follower, side by side in one run.

* ``save``: one save of a cursor of 4 writers to its file (temporary file, fsync,
  rename, fsync of the directory), and the same without the fsyncs.
* ``per-fact``: a follower handed 500 one-row facts, one per read (so the cursor
  is saved after every fact, the most a cursor file costs), against the same
  follower without a cursor and with a cursor saved once per 250-fact read.
* ``sink``: the same 500 facts written into ``streamrep_follow_rows`` of SQLite
  and PostgreSQL with the cursor, one transaction per read: one fact a read, and
  250 facts a read.

Each row prints ``us_per_fact`` (or ``us_per_save``); run with
``python -m pytest bench/test_bench_follow_cursor.py --benchmark-only -s``.
"""

from __future__ import annotations

import pathlib
from typing import Any, Callable

import pytest

from streamrep.replication import StreamFollower
from streamrep.replication.cursor import Cursor, CursorFile, SaveAfterHandler
from streamrep.replication.protocol import Fact
from streamrep.replication.sink import open_sink
from support.postgres import fresh_schema_dsn, postgres_server_dsn

FACTS = 500
ROW = ["synthetic_cache", ["w1:0"], 1795293123285]


def _feed(follower: StreamFollower, per_read: int) -> Callable[[], None]:
    """A function handing *FACTS* facts to *follower*, *per_read* facts a read."""
    state = {"token": 0}

    def run() -> None:
        token = state["token"]
        for start in range(token, token + FACTS, per_read):
            actions: list[Any] = [Fact("caches", "w1", t + 1, [ROW], t) for t in range(start, start + per_read)]
            follower.state.positions[("caches", "w1")] = start + per_read
            follower.run(actions)
        state["token"] = token + FACTS

    return run


def _report(benchmark: Any, per: int, key: str) -> None:
    if benchmark.stats is not None:  # None with --benchmark-disable
        value = benchmark.stats.stats.median / per * 1e6
        benchmark.extra_info[key] = round(value, 2)
        print(f"\n{benchmark.name}: {value:.2f} {key.replace('_', ' ')}")


@pytest.mark.benchmark(group="follow-cursor-save")
@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "no-fsync"])
def test_save(benchmark: Any, tmp_path: pathlib.Path, fsync: bool) -> None:
    store = CursorFile(tmp_path / "tail.cursor", fsync=fsync)
    cursor = Cursor({("events", f"p{n}"): 1_000_000 + n for n in range(4)}, {"events": 0})
    benchmark.pedantic(store.save, args=(cursor,), rounds=200, iterations=1, warmup_rounds=5)
    _report(benchmark, 1, "us_per_save")
    assert store.load() == cursor


@pytest.mark.benchmark(group="follow-cursor-per-fact")
@pytest.mark.parametrize("kind", ["no-cursor", "cursor-every-fact", "cursor-every-250-facts"])
def test_per_fact(benchmark: Any, tmp_path: pathlib.Path, kind: str) -> None:
    taken: list[int] = []

    def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
        taken.append(token)

    if kind == "no-cursor":
        follower = StreamFollower(handler)
    else:
        keeper = SaveAfterHandler(CursorFile(tmp_path / "tail.cursor"), handler)
        follower = StreamFollower(keeper.handler(), after_read=keeper.after_read)
    per_read = 250 if kind == "cursor-every-250-facts" else 1
    benchmark.pedantic(_feed(follower, per_read), rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, FACTS, "us_per_fact")
    assert taken == list(range(1, len(taken) + 1))
    if kind != "no-cursor":
        saved = CursorFile(tmp_path / "tail.cursor").load()
        assert saved is not None and saved.positions == {("caches", "w1"): len(taken)}


@pytest.mark.benchmark(group="follow-cursor-sink")
@pytest.mark.parametrize("per_read", [1, 250], ids=["every-fact", "every-250-facts"])
@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_sink(benchmark: Any, tmp_path: pathlib.Path, engine: str, per_read: int) -> None:
    def run_with(url: str) -> None:
        keeper = open_sink(url, "bench")
        try:
            follower = StreamFollower(keeper.handler(), after_read=keeper.after_read)
            benchmark.pedantic(_feed(follower, per_read), rounds=3, iterations=1, warmup_rounds=1)
            _report(benchmark, FACTS, "us_per_fact")
            written = keeper.database.fetchval("SELECT COUNT(*) FROM streamrep_follow_rows")
            assert written > 0 and written % FACTS == 0
        finally:
            keeper.database.close()

    if engine == "sqlite":
        run_with(f"sqlite:///{tmp_path}/sink.db")
    else:
        with fresh_schema_dsn(postgres_server_dsn()) as url:
            run_with(url)
