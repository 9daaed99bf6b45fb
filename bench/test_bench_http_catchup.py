"""Catching up missed ``events`` rows from a reference deployment over HTTP.

A reference deployment (support/reference_deployment.py: main and the event
persisters p1 and p2 on PostgreSQL) gets ``ROWS`` ``events`` rows of p1 that nobody
heard: copies of a real message event of p1 (new event IDs, the next stream
orderings), inserted into its database, with the events sequence moved past them,
the table analysed (as autovacuum would do within a minute) and p1 and p2
restarted, so p1's position is past them. The reference then serves them like any
other row; the bench checks it serves every one before timing.

* ``endpoint``: the rows fetched straight from p1's
  ``get_repl_stream_updates`` (50 ``events`` rows a page) with one kept-alive
  connection, decoding nothing but the JSON: what the reference's endpoint takes.
* ``tail``: ``streamrep tail --synapse-config homeserver.yaml --stream events
  --from <before the rows> --limit ROWS`` with its output to /dev/null: from start
  to the last row handed on, the gap filled from p1 over HTTP.

Each prints rows/s (wall), and where the time went: CPU of p1 and of the
PostgreSQL backends of the reference's database (the reference's side), and CPU of
the fetching process (the bench's client, or tail: streamrep's side), each in µs
per row. Run on an otherwise idle machine, both in one run, with
``python -m pytest bench/test_bench_http_catchup.py --benchmark-only -s``
(``STREAMREP_BENCH_CATCHUP_ROWS`` sets ROWS: 100,000 by default, 2,000 with
``--benchmark-disable``).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import pathlib
import resource
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import orjson
import pytest

from support.reference_deployment import PERSISTERS, Deployment, running_deployment
from support.processes import cpu_seconds
from support.reference_homeserver import REPLICATION_SECRET

pytestmark = pytest.mark.slow



@dataclass
class Missed:
    """The deployment and the range of p1's rows nobody heard."""

    deployment: Deployment
    after: int
    upto: int

    @property
    def rows(self) -> int:
        return self.upto - self.after


def _reference_pids(deployment: Deployment) -> dict[str, list[int]]:
    """p1's process, and the PostgreSQL backends serving the reference's database."""
    import psycopg2

    with contextlib.closing(psycopg2.connect(deployment.database_dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()")
        backends = [int(pid) for (pid,) in cur.fetchall()]
    return {"p1": [deployment.processes["p1"].pid], "postgres": backends}


def _insert_missed(deployment: Deployment, count: int) -> tuple[int, int]:
    """*count* copies of p1's last message event after the last stream ordering;
    the events sequence moved past them. Returns (after, upto)."""
    import psycopg2

    with contextlib.closing(psycopg2.connect(deployment.database_dsn)) as conn, conn.cursor() as cur:
        cur.execute("SELECT event_id FROM events WHERE instance_name = 'p1' AND type = 'm.room.message' "
                    "ORDER BY stream_ordering DESC LIMIT 1")
        (model,) = cur.fetchone() or (None,)
        assert model is not None, "p1 persisted no message"
        cur.execute("SELECT GREATEST(MAX(stream_ordering), (SELECT last_value FROM events_stream_seq)) "
                    "FROM events")
        (after,) = cur.fetchone()
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'events' "
                    "AND table_schema = current_schema() ORDER BY ordinal_position")
        columns = [name for (name,) in cur.fetchall()]
        replaced = {"event_id": "'$bench' || %(tag)s || n", "stream_ordering": "%(after)s + n"}
        chosen = ", ".join(replaced.get(name, f"e.{name}") for name in columns)
        cur.execute(f"INSERT INTO events ({', '.join(columns)}) SELECT {chosen} "
                    "FROM events AS e, generate_series(1, %(count)s) AS n WHERE e.event_id = %(model)s",
                    {"tag": uuid.uuid4().hex[:8], "after": after, "count": count, "model": model})
        cur.execute("SELECT setval('events_stream_seq', %s)", (after + count,))
        conn.commit()
        # The statistics autovacuum would gather within a minute: without them the
        # planner takes the table for small, and each page costs the whole range left.
        conn.autocommit = True
        cur.execute("ANALYZE events")
    return int(after), int(after) + count


@pytest.fixture(scope="module")
def missed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Missed]:
    disabled = bool(request.config.getoption("benchmark_disable", False))
    count = int(os.environ.get("STREAMREP_BENCH_CATCHUP_ROWS") or (2_000 if disabled else 100_000))
    with running_deployment(str(tmp_path_factory.mktemp("catchup"))) as deployment:
        token = deployment.register("bench")
        for room in deployment.rooms_on_every_writer(token)["p1"]:
            deployment.send_message(token, room, "the model of every missed row")
        after, upto = _insert_missed(deployment, count)
        deployment.restart(PERSISTERS)
        served = _fetch(deployment, after, upto)
        assert len(served) == count, f"p1 serves {len(served)} of the {count} rows inserted"
        assert {row[1][0] for row in served} == {"ev"}
        yield Missed(deployment, after, upto)


def _fetch(deployment: Deployment, after: int, upto: int) -> list[Any]:
    """Every row p1 serves in (after, upto], through one kept-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", deployment.replication_ports["p1"], timeout=60)
    headers = {"Authorization": f"Bearer {REPLICATION_SECRET}"}
    rows: list[Any] = []
    try:
        while after < upto:
            connection.request("GET", f"/_synapse/replication/get_repl_stream_updates/events/{uuid.uuid4().hex}"
                                      f"?from_token={after}&upto_token={upto}", headers=headers)
            answer = connection.getresponse()
            body = answer.read()
            assert answer.status == 200, (answer.status, body[:300])
            page = orjson.loads(body)
            rows.extend(page["updates"])
            if not page["limited"]:
                break
            after = int(page["upto_token"])
    finally:
        connection.close()
    return rows


def _report(benchmark: Any, name: str, rows: int, wall: float, cpu: dict[str, float]) -> None:
    per_row = {key: round(seconds / rows * 1e6, 2) for key, seconds in cpu.items()}
    benchmark.extra_info.update({"rows": rows, "rows_per_s": round(rows / wall), **{
        f"{key}_cpu_us_per_row": value for key, value in per_row.items()}})
    spent = ", ".join(f"{key} {value:.2f}" for key, value in per_row.items())
    print(f"\n{name}: {rows} rows in {wall:.2f} s, {rows / wall:,.0f} rows/s; CPU µs per row: {spent}")


@pytest.mark.benchmark(group="http-catchup")
def test_endpoint(benchmark: Any, missed: Missed) -> None:
    pids = _reference_pids(missed.deployment)
    found: dict[str, Any] = {}

    def run() -> None:
        before = {key: cpu_seconds(ids) for key, ids in pids.items()}
        started, client = time.perf_counter(), time.process_time()
        found["rows"] = len(_fetch(missed.deployment, missed.after, missed.upto))
        found["wall"] = time.perf_counter() - started
        found["cpu"] = {"client": time.process_time() - client,
                        **{key: cpu_seconds(ids) - before[key] for key, ids in pids.items()}}

    benchmark.pedantic(run, rounds=1, iterations=1)
    assert found["rows"] == missed.rows
    _report(benchmark, "endpoint", found["rows"], found["wall"], found["cpu"])


@pytest.mark.benchmark(group="http-catchup")
def test_tail(benchmark: Any, missed: Missed, tmp_path: pathlib.Path) -> None:
    pids = _reference_pids(missed.deployment)
    found: dict[str, Any] = {}
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMREP_CONFIG", "STREAMREP_DEBUG_RESOURCES")}
    err = tmp_path / "tail.err"

    def run() -> None:
        before = {key: cpu_seconds(ids) for key, ids in pids.items()}
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        with err.open("wb") as errors:
            done = subprocess.run(
                [sys.executable, "-m", "streamrep", "tail", "--synapse-config", missed.deployment.config_path,
                 "--stream", "events", "--from", str(missed.after), "--limit", str(missed.rows)],
                stdout=subprocess.DEVNULL, stderr=errors, env=env, timeout=1800)
        found["wall"] = time.perf_counter() - started
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        found["cpu"] = {"tail": used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime,
                        **{key: cpu_seconds(ids) - before[key] for key, ids in pids.items()}}
        assert done.returncode == 0, err.read_text()[-2000:]

    benchmark.pedantic(run, rounds=1, iterations=1)
    assert f"tail: {missed.rows} facts" in err.read_text(), err.read_text()[-2000:]
    _report(benchmark, "tail", missed.rows, found["wall"], found["cpu"])
