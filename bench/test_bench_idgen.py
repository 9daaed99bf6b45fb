"""The multi-writer ID generator on PostgreSQL: stream IDs per second reserved and
completed through ``get_next_mult(100)`` (one ``nextval`` round trip per 100 IDs),
with the compiled and the pure completion tracker.

Needs the local PostgreSQL server (``STREAMREP_TEST_DSN``).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from streamrep.db import Database
from streamrep.idgen import BackingTable, MultiWriterIdGenerator
from support.impls import core_module
from support.postgres import fresh_schema_dsn, postgres_server_dsn

BATCHES = 50


@pytest.fixture
def pg_db() -> Iterator[Database]:
    with fresh_schema_dsn(postgres_server_dsn()) as url:
        db = Database.open(url)
        db.execute("CREATE TABLE bench_facts (stream_id BIGINT NOT NULL, instance_name TEXT)")
        yield db
        db.close()


@pytest.mark.benchmark(group="idgen-postgres-get_next_mult-100")
def test_get_next_mult_100(benchmark: Any, impl_kind: str, pg_db: Database,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = core_module("tracker", impl_kind)
    monkeypatch.setattr("streamrep.idgen.multi.CompletionTracker", tracker.CompletionTracker)
    monkeypatch.setattr("streamrep.idgen.multi.WriterPositions", tracker.WriterPositions)
    gen = MultiWriterIdGenerator(pg_db, "bench", "w1", ["w1", "w2"],
                                 [BackingTable("bench_facts")], "bench_seq")
    assert type(gen._tracker) is tracker.CompletionTracker

    def run() -> None:
        for _ in range(BATCHES):
            with gen.get_next_mult(100) as ids:
                assert len(ids) == 100

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    if benchmark.stats is not None:  # None with --benchmark-disable: ran once, untimed
        benchmark.extra_info["ids_per_s"] = round(BATCHES * 100 / benchmark.stats.stats.mean)
        benchmark.extra_info["ids_per_s_best"] = round(BATCHES * 100 / benchmark.stats.stats.min)
    gen.close()
