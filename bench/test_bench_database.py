"""What exactly-once costs a PostgreSQL write: one-row write transactions per second
through ``db.transaction()`` (plain ``COMMIT``) and through ``db.run`` (``COMMIT``
together with the connection's commit marker, in the same round trip).

Needs the local PostgreSQL server (``STREAMREP_TEST_DSN``).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from streamrep.db import Database
from support.postgres import fresh_schema_dsn, postgres_server_dsn

TRANSACTIONS = 300


@pytest.fixture
def pg_db() -> Iterator[Database]:
    with fresh_schema_dsn(postgres_server_dsn()) as url:
        db = Database.open(url)
        db.execute("CREATE TABLE bench_facts (stream_id BIGINT NOT NULL, body TEXT)")
        yield db
        db.close()


@pytest.mark.benchmark(group="database-postgres-write-transactions")
@pytest.mark.parametrize("commit", ["plain", "marked"])
def test_write_transactions(benchmark: Any, pg_db: Database, commit: str) -> None:
    sql = "INSERT INTO bench_facts (stream_id, body) VALUES (?, ?)"
    counter = iter(range(10**9))

    def plain() -> None:
        for _ in range(TRANSACTIONS):
            with pg_db.transaction("bench") as txn:
                txn.execute(sql, (next(counter), "x"))

    def marked() -> None:
        for _ in range(TRANSACTIONS):
            pg_db.run(lambda txn: txn.execute(sql, (next(counter), "x")), name="bench")

    benchmark.pedantic(plain if commit == "plain" else marked, rounds=5, iterations=1,
                       warmup_rounds=1)
    if benchmark.stats is not None:  # None with --benchmark-disable: ran once, untimed
        benchmark.extra_info["txn_per_s"] = round(TRANSACTIONS / benchmark.stats.stats.mean)
    # Every transaction of every round (one untimed round with --benchmark-disable)
    # left exactly its one row: the counter's next value is how many ran.
    rows = pg_db.fetchval("SELECT COUNT(*) FROM bench_facts")
    assert rows == next(counter) and rows % TRANSACTIONS == 0
