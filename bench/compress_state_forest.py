"""State compression on one synthetic forest in PostgreSQL, three ways, in one run.

    python bench/compress_state_forest.py --groups 200000

The forest is the reconstruction bench's (``reconstruct_state_forest.py``: rooms
of about 50 groups, 8% snapshots), loaded into one fresh PostgreSQL database per
contender, indexed as Synapse indexes it (``state_groups`` by room, edges both
ways, delta rows and event references by group):

1. the reference compressor (``synapse_auto_compressor``, run from its own
   virtualenv, ``--compressor-python``) over every room, its default levels
   ``100,50,25``; with ``--reference-share 0.01`` over only that share of the
   rooms (the first it picks: it walks the rooms in order of their lowest
   group), reporting the measured time of the sample and, labelled as an
   estimate, that time scaled to every room, and comparing the rows left in
   the sampled rooms only;
2. ``streamrep spark compress --single-process`` then
   ``streamrep state apply-compression`` (both timed; both verify);
3. ``streamrep spark compress --master local[2]`` over JDBC, then the same apply.

Each reports the rows left in ``state_groups_state``, the longest prev chain,
wall time and peak memory (largest sum of RSS over the process tree, polled
every 50 ms), and, untimed, whether every group's full state digest is what it
was before (computed with ``streamrep spark reconstruct --digest``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from reconstruct_state_forest import BackendCpu, run_measured  # noqa: E402
from support.state_forest import Forest, load_database, make_forest  # noqa: E402

#: Longest chain, walking from every root (PostgreSQL).
MAX_CHAIN_SQL = """
WITH RECURSIVE walk(state_group, hops) AS (
    SELECT id, 0 FROM state_groups g
    WHERE NOT EXISTS (SELECT 1 FROM state_group_edges e WHERE e.state_group = g.id)
    UNION ALL
    SELECT e.state_group, w.hops + 1 FROM state_group_edges e JOIN walk w ON e.prev_state_group = w.state_group
)
SELECT max(hops) FROM walk
"""


def default_compressor_python() -> str | None:
    """The interpreter of a virtualenv holding ``synapse_auto_compressor``, if any."""
    configured = os.environ.get("STREAMREP_COMPRESSOR_PYTHON")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    candidates = [configured] if configured else [f"{cache}/streamrep/compressor-venv/bin/python"]
    for python in candidates:
        if python and os.path.exists(python):
            probe = subprocess.run([python, "-c", "import synapse_auto_compressor"], capture_output=True)
            if probe.returncode == 0:
                return python
    return None


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def database_url(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))


class Databases:
    """Fresh databases on the server of *dsn*, dropped at the end."""

    def __init__(self, dsn: str) -> None:
        import psycopg2

        self.admin = psycopg2.connect(dsn)
        self.admin.autocommit = True
        self.dsn = dsn
        self.names: list[str] = []

    def create(self, forest: Forest) -> str:
        name = f"bench_compress_{uuid.uuid4().hex[:8]}"
        with self.admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        self.names.append(name)
        url = database_url(self.dsn, name)
        load_database(url, forest)
        self.sql(url, "CREATE INDEX ON state_groups (room_id)",
                 "CREATE INDEX ON state_group_edges (state_group)",
                 "CREATE INDEX ON state_group_edges (prev_state_group)",
                 "CREATE INDEX ON state_groups_state (state_group)",
                 "CREATE INDEX ON event_to_state_groups (state_group)", "ANALYZE")
        return url

    @staticmethod
    def sql(url: str, *statements: str) -> object:
        import psycopg2

        conn = psycopg2.connect(url)
        result = None
        with conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                result = cur.fetchone() if cur.description else None
        conn.close()
        return result[0] if result else None

    def close(self) -> None:
        with self.admin.cursor() as cur:
            for name in self.names:
                cur.execute(f"DROP DATABASE IF EXISTS {name}")
        self.admin.close()


def sampled_rooms(url: str) -> list[str]:
    """The rooms the reference compressor has finished (its progress table)."""
    import psycopg2

    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT room_id FROM state_compressor_progress ORDER BY room_id")
        found = [room for (room,) in cur.fetchall()]
    conn.close()
    return found


def rows_in_rooms(url: str, rooms: list[str]) -> int:
    """Delta rows of the groups of *rooms*."""
    import psycopg2

    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM state_groups_state WHERE room_id = ANY(%s)", (rooms,))
        count = int(cur.fetchone()[0])
    conn.close()
    return count


def digests(url: str, out: Path, env: dict[str, str]) -> dict[int, str]:
    """Every group's full-state digest, by the reconstruction job (untimed)."""
    import pyarrow.dataset as ds

    subprocess.run([sys.executable, "-m", "streamrep", "spark", "reconstruct", "--single-process",
                    "--db", url, "--output", str(out), "--digest", "--overwrite"],
                   check=True, capture_output=True, env=env)
    table = ds.dataset(str(out), format="parquet").to_table()
    return dict(zip(table.column("state_group").to_pylist(), table.column("state_digest").to_pylist()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=200_000)
    parser.add_argument("--dsn", default=os.environ.get("STREAMREP_TEST_DSN",
                                                        "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--compressor-python", default=default_compressor_python(),
                        help="python of a virtualenv with synapse-auto-compressor (0.1.2)")
    parser.add_argument("--reference-share", type=float, default=1.0,
                        help="run the reference compressor over only this share of the rooms and "
                             "scale its time to all of them (an estimate)")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--jdbc-jar", default=None, help="PostgreSQL JDBC driver for the Spark run")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)

    work = Path(tempfile.mkdtemp(prefix="streamrep-bench-compress-"))
    rooms = max(1, args.groups // 50)
    forest = make_forest(args.groups, seed=1, rooms=rooms, snapshot_share=0.08,
                         initial_members=55, member_pool=120, fan_out=2000)
    print(f"forest: {len(forest.groups)} groups in {rooms} rooms, {len(forest.state)} delta rows", flush=True)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    dbs = Databases(args.dsn)
    rows: list[tuple[str, int, int, float, int, str, float | None]] = []
    reference_estimate: tuple[float, int] | None = None
    try:
        reference_url = dbs.create(forest)
        truth = digests(reference_url, work / "truth", env)
        start_chain = Databases.sql(reference_url, MAX_CHAIN_SQL)
        print(f"before: {len(forest.state)} rows, longest chain {start_chain} hops", flush=True)

        def finish(name: str, url: str, wall: float, peak: int, cpu: float | None) -> None:
            left = int(Databases.sql(url, "SELECT count(*) FROM state_groups_state"))  # type: ignore[arg-type]
            chain = int(Databases.sql(url, MAX_CHAIN_SQL))  # type: ignore[arg-type]
            after = digests(url, work / f"check-{len(rows)}", env)
            same = sum(1 for g, d in truth.items() if after.get(g) == d)
            verdict = f"{same}/{len(truth)} groups keep their full state"
            rows.append((name, left, chain, wall, peak, verdict, cpu))
            print(f"{name}: {left} rows left, longest chain {chain} hops, {wall:.1f}s wall, "
                  f"peak RSS {peak / 2**30:.2f} GiB, "
                  + ("" if cpu is None else f"CPU {cpu:.1f}s (command and database backends); ")
                  + verdict, flush=True)
            if sample is not None:
                print(f"  rows left in the reference's sampled rooms: {rows_in_rooms(url, sample)}", flush=True)

        sample: list[str] | None = None
        if args.compressor_python and not args.skip_reference:
            share = min(1.0, max(0.0, args.reference_share))
            chunks = len(forest.groups) // 500 + rooms + 10
            if share < 1.0:
                # One chunk per room here (rooms are far below chunk_size).
                chunks = max(1, round(rooms * share))
            code = ("import synapse_auto_compressor as c; c.compress_state_events_table("
                    f"db_url={reference_url!r}, chunk_size=500, default_levels='100,50,25', "
                    f"number_of_chunks={chunks})")
            with BackendCpu(database_name(reference_url)) as backend:
                wall, peak, _, cpu = run_measured([args.compressor_python, "-c", code], env)
            if share < 1.0:
                sample = sampled_rooms(reference_url)
                picked = set(sample)
                sample_before = sum(1 for row in forest.state if row[1] in picked)
                left = rows_in_rooms(reference_url, sample)
                estimate = wall * rooms / max(1, len(sample))
                print(f"synapse-auto-compressor 0.1.2 over a sample of {len(sample)} of {rooms} rooms: "
                      f"{wall:.1f}s wall MEASURED, peak RSS {peak / 2**30:.2f} GiB; rows in the sampled "
                      f"rooms {sample_before} -> {left}; ESTIMATE for all rooms (sample time x "
                      f"{rooms / max(1, len(sample)):.1f}, not measured): {estimate:.0f}s", flush=True)
                reference_estimate = (estimate, left)
            else:
                finish("synapse-auto-compressor 0.1.2", reference_url, wall, peak, cpu + backend.seconds)
        elif not args.skip_reference:
            print("reference compressor: not installed (give --compressor-python)", flush=True)

        local_url = dbs.create(forest)
        cli = [sys.executable, "-m", "streamrep"]
        with BackendCpu(database_name(local_url)) as backend:
            wall_c, peak_c, out_c, cpu_c = run_measured(
                cli + ["spark", "compress", "--single-process", "--db", local_url, "--output", str(work / "local")],
                env)
            wall_a, peak_a, out_a, cpu_a = run_measured(
                cli + ["state", "apply-compression", "--db", local_url, "--changes", str(work / "local")], env)
        print(f"  compress: {out_c.strip()}\n  apply: {out_a.strip()}", flush=True)
        finish("streamrep single-process", local_url, wall_c + wall_a, max(peak_c, peak_a),
               cpu_c + cpu_a + backend.seconds)

        if not args.skip_spark:
            spark_url = dbs.create(forest)
            extra: list[str] = []
            if args.jdbc_jar:
                extra = ["--conf", f"spark.jars={args.jdbc_jar}"]
            wall_c, peak_c, out_c, _ = run_measured(
                cli + ["spark", "compress", "--master", "local[2]", "--jdbc-url", spark_url,
                       "--output", str(work / "spark")] + extra, env)
            wall_a, peak_a, out_a, _ = run_measured(
                cli + ["state", "apply-compression", "--db", spark_url, "--changes", str(work / "spark")], env)
            print(f"  compress: {out_c.strip()}\n  apply: {out_a.strip()}", flush=True)
            # The JVM exits on its own after the command: its CPU is not counted.
            finish("streamrep spark local[2]", spark_url, wall_c + wall_a, max(peak_c, peak_a), None)
    finally:
        dbs.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    if rows and rows[0][0].startswith("synapse"):
        ref = rows[0]
        for name, left, chain, wall, _, _, cpu in rows[1:]:
            spent = "" if cpu is None or ref[6] is None else f", {ref[6] / cpu:.1f}x less CPU"
            print(f"{name} vs reference: {left / ref[1]:.3f}x the rows, {ref[3] / wall:.1f}x faster{spent}")
    elif reference_estimate is not None:
        for name, left, chain, wall, _, _, _ in rows:
            print(f"{name} vs the reference's ESTIMATED time for all rooms: "
                  f"{reference_estimate[0] / wall:.1f}x faster (estimate, not measured)")


if __name__ == "__main__":
    main()
