"""State tables shaped like a Synapse deployment's biggest rooms.

    python bench/big_room_forest.py --members 100000 --groups 10000            # compare
    python bench/big_room_forest.py --members 100000 --groups 10000 --keep-database   # and keep it
    python bench/big_room_forest.py --database NAME --skip-spark                # on a kept one
    python bench/big_room_forest.py --database NAME --skip-reference --skip-single-process --jdbc-jar JAR
    python bench/big_room_forest.py --members 100000 --groups 50500 --parquet DIR --only-generate

A big room starts from a snapshot of ``--members`` joined members (plus its
create, power levels, join rules and name). Every later state event (a join, a
leave, a rejoin, a profile change, a power-level change) makes one state group
with a one-row delta over the room's latest group, as Synapse persists them;
about ``--fork-rate`` of them hang off a group a few steps back instead. As in
Synapse, a group whose prev chain already holds ``--snapshot-interval`` deltas
is stored as a snapshot of the room's whole state instead. ``--small-rooms``
adds rooms of 20 to 60 members and 40 groups beside the big ones.

The comparison loads the tables into one PostgreSQL database (indexed as
Synapse indexes them), copies it once per contender (``CREATE DATABASE ...
TEMPLATE``) and runs, in one run, one after the other:

1. the reference compressor (``synapse_auto_compressor`` 0.1.2, from its own
   virtualenv: ``--compressor-python``; chunks of 500, levels 100,50,25, and
   as many chunks as the rooms need: it compresses one chunk of one room per
   step, so a room of N groups takes ceil(N / 500) of them);
2. ``streamrep spark compress --single-process`` then ``streamrep state
   apply-compression``, then ``streamrep spark reconstruct --single-process
   --digest``;
3. the same with ``--master local[2]`` (compress over JDBC, reconstruct from
   the database over JDBC).

``--split-threshold N`` hands the same option to both streamrep compress runs.

Each row reports the rows left in ``state_groups_state``, the longest chain
counted as the reference counts it (the group and all its ancestors), wall
time and peak RSS of the process tree (JVM and Python workers included:
``/proc`` polled every 50 ms, summing every descendant's resident set; on
Spark also the largest JVM and the largest Python worker alone), and CPU
seconds spent by the command and by the PostgreSQL backends serving its copy
(on a machine shared with other work, CPU compares better than wall time).
Every group's full state digest is compared with the one it had before.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from reconstruct_state_forest import BackendCpu, run_measured  # noqa: E402
from support.big_room import Shape, generate, write_parquet  # noqa: E402

from streamrep.spark.tables import SCHEMAS  # noqa: E402

#: Longest chain as the reference counts it on PostgreSQL: a group and its ancestors.
LONGEST_CHAIN_SQL = """
WITH RECURSIVE walk(state_group, groups) AS (
    SELECT id, 1 FROM state_groups g
    WHERE NOT EXISTS (SELECT 1 FROM state_group_edges e WHERE e.state_group = g.id)
    UNION ALL
    SELECT e.state_group, w.groups + 1 FROM state_group_edges e
    JOIN walk w ON e.prev_state_group = w.state_group
)
SELECT max(groups) FROM walk
"""

INDEXES = (
    "CREATE INDEX ON state_groups (room_id)",
    "CREATE UNIQUE INDEX ON state_group_edges (state_group)",
    "CREATE INDEX ON state_group_edges (prev_state_group)",
    "CREATE INDEX ON state_groups_state (state_group)",
    "CREATE INDEX ON event_to_state_groups (state_group)",
    "ANALYZE",
)


def load_postgres(shape: Shape, url: str) -> dict[str, int]:
    """Create the four tables at *url*, fill them with COPY and index them."""
    import io

    import psycopg2

    from support.state_forest import STATE_DDL

    conn = psycopg2.connect(url)
    counts = {name: 0 for name in SCHEMAS}
    with conn, conn.cursor() as cur:
        for ddl in STATE_DDL:
            cur.execute(ddl)
        buffers = {name: io.StringIO() for name in SCHEMAS}

        def flush(name: str) -> None:
            buffers[name].seek(0)
            cur.copy_expert(f"COPY {name} FROM STDIN", buffers[name])
            buffers[name] = io.StringIO()

        for name, rows in generate(shape):
            out = buffers[name]
            for row in rows:
                out.write("\t".join(str(v) for v in row) + "\n")
            counts[name] += len(rows)
            if out.tell() > 64 << 20:
                flush(name)
        for name in SCHEMAS:
            flush(name)
        for statement in INDEXES:
            cur.execute(statement)
    conn.close()
    return counts


# --- the comparison ----------------------------------------------------------------------


def _sql(url: str, statement: str) -> int:
    import psycopg2

    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute(statement)
        value = int(cur.fetchone()[0])
    conn.close()
    return value


def _digests(directory: Path) -> dict[int, str]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(directory), format="parquet").to_table(columns=["state_group", "state_digest"])
    return dict(zip(table.column("state_group").to_pylist(), table.column("state_digest").to_pylist()))


def _parts(parts: dict[str, int]) -> str:
    """Peaks per process kind: the command (Spark's driver program), the JVM
    (driver and local executor) and the largest Python worker."""
    names = {"command": "driver Python", "jvm": "JVM", "worker": "largest Python worker"}
    return ", ".join(f"{names[k]} {v / 2**30:.2f} GiB" for k, v in sorted(parts.items()))


class _Server:
    """Databases on the server of *dsn*: a template and its copies, dropped at the end."""

    def __init__(self, dsn: str) -> None:
        import psycopg2
        from urllib.parse import urlsplit, urlunsplit

        self.admin = psycopg2.connect(dsn)
        self.admin.autocommit = True
        parts = urlsplit(dsn)
        self.url = lambda name: urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))
        self.names: list[str] = []

    def create(self, template: str | None = None) -> str:
        name = f"bench_bigroom_{uuid.uuid4().hex[:8]}"
        with self.admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        self.names.append(name)
        return name

    def close(self) -> None:
        with self.admin.cursor() as cur:
            for name in self.names:
                cur.execute(f"DROP DATABASE IF EXISTS {name}")
        self.admin.close()


def compare(shape: Shape, args: argparse.Namespace) -> None:
    """Every contender on its own copy of one generated database."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    work = Path(tempfile.mkdtemp(prefix="streamrep-bench-bigroom-"))
    server = _Server(args.dsn)
    cli = [sys.executable, "-m", "streamrep"]
    table: list[tuple[str, str, str, str, str, str]] = []

    def report(contender: str, phase: str, wall: float, peak: int, rows: str = "", chain: str = "",
               cpu: tuple[float, float] | None = None) -> None:
        table.append((contender, phase, rows, chain, f"{wall:.1f} s", f"{peak / 2**30:.2f} GiB"))
        spent = "" if cpu is None else (f" | CPU {cpu[0]:.1f} s in the command, {cpu[1]:.1f} s in its "
                                         "database's backends")
        print(f"{contender} | {phase} | rows {rows} | chain {chain} | {wall:.1f} s | "
              f"peak RSS {peak / 2**30:.2f} GiB{spent}", flush=True)

    try:
        clock = time.perf_counter()
        if args.database:
            template = args.database
            counts = {name: _sql(server.url(template), f"SELECT count(*) FROM {name}") for name in SCHEMAS}
        else:
            template = server.create()
            counts = load_postgres(shape, server.url(template))
            if args.keep_database:
                server.names.remove(template)
                print(f"kept the generated database as {template} (give it to --database)", flush=True)
        print(f"database: {counts} (ready in {time.perf_counter() - clock:.0f} s); "
              f"longest chain {_sql(server.url(template), LONGEST_CHAIN_SQL)} groups", flush=True)
        spark_conf = ["--conf", f"spark.jars={args.jdbc_jar}"] if args.jdbc_jar else []
        spark_conf += ["--executor-memory", args.executor_memory]
        for item in args.spark_conf:
            spark_conf += ["--conf", item]
        wall, peak, _, _ = run_measured(cli + ["spark", "reconstruct", "--single-process", "--db",
                                               server.url(template), "--digest", "--output",
                                               str(work / "truth")], env)
        report("before", "reconstruct --single-process --digest", wall, peak)
        truth = _digests(work / "truth")
        totals: dict[str, float] = {}
        cpu_totals: dict[str, float] = {}

        def check(contender: str, url: str, digest_dir: Path) -> None:
            after = _digests(digest_dir)
            same = sum(1 for g, d in after.items() if truth.get(g) == d)
            print(f"{contender}: {same} of {len(after)} groups keep exactly their full state "
                  f"({len(truth) - len(after)} deleted)", flush=True)
            if same != len(after):
                raise SystemExit(f"{contender}: {len(after) - same} groups changed their full state")

        if args.compressor_python and not args.skip_reference:
            name = server.create(template)
            url = server.url(name)
            # The reference takes one chunk per call and room: a room of N
            # groups needs ceil(N / 500) of them, so fewer chunks than that
            # sum leave rooms (or all of them) untouched.
            chunks = _sql(url, "SELECT sum(ceil(n / 500.0)) FROM (SELECT count(*) AS n FROM state_groups "
                               "GROUP BY room_id) AS rooms") + 1
            code = ("import synapse_auto_compressor as c; c.compress_state_events_table("
                    f"db_url={url!r}, chunk_size=500, default_levels='100,50,25', "
                    f"number_of_chunks={chunks})")
            with BackendCpu(name) as backend:
                wall, peak, _, cpu = run_measured([args.compressor_python, "-c", code], env)
            totals["reference"] = wall
            cpu_totals["reference"] = cpu + backend.seconds
            report("synapse-auto-compressor 0.1.2", "compress", wall, peak,
                   str(_sql(url, "SELECT count(*) FROM state_groups_state")), str(_sql(url, LONGEST_CHAIN_SQL)), (cpu, backend.seconds))
            run_measured(cli + ["spark", "reconstruct", "--single-process", "--db", url, "--digest",
                                "--output", str(work / "ref-after")], env)
            check("reference", url, work / "ref-after")

        split = ["--split-threshold", str(args.split_threshold)] if args.split_threshold else []
        modes = [] if args.skip_single_process else [("single-process", ["--single-process", "--db"])]
        if not args.skip_spark:
            modes.append(("spark local[2]", ["--master", "local[2]"] + spark_conf + ["--jdbc-url"]))
        for mode, flags in modes:
            name = server.create(template)
            url = server.url(name)
            out = work / f"changes-{mode[:5]}"
            parts: dict[str, int] = {}
            with BackendCpu(name) as backend:
                wall_c, peak_c, text, cpu_c = run_measured(
                    cli + ["spark", "compress"] + flags + [url, "--output", str(out)] + split, env, parts)
            print(f"  {text.strip()}", flush=True)
            # A JVM the command leaves to exit on its own is not in its CPU figure.
            report(f"streamrep {mode}", "compress", wall_c, peak_c,
                   cpu=None if "jvm" in parts else (cpu_c, backend.seconds))
            cpu_totals[mode] = cpu_c + backend.seconds
            if "jvm" in parts:
                print(f"  peak RSS per process: {_parts(parts)}", flush=True)
            with BackendCpu(name) as backend:
                wall_a, peak_a, text, cpu_a = run_measured(cli + ["state", "apply-compression", "--db", url,
                                                              "--changes", str(out)], env)
            print(f"  {text.strip()}", flush=True)
            totals[mode] = wall_c + wall_a
            cpu_totals[mode] += cpu_a + backend.seconds
            report(f"streamrep {mode}", "apply-compression", wall_a, peak_a,
                   str(_sql(url, "SELECT count(*) FROM state_groups_state")), str(_sql(url, LONGEST_CHAIN_SQL)), (cpu_a, backend.seconds))
            digest_dir = work / f"after-{mode[:5]}"
            parts = {}
            wall_r, peak_r, _, _ = run_measured(cli + ["spark", "reconstruct", "--digest"] + flags +
                                                [url, "--output", str(digest_dir)], env, parts)
            report(f"streamrep {mode}", "reconstruct --digest", wall_r, peak_r)
            if "jvm" in parts:
                print(f"  peak RSS per process: {_parts(parts)}", flush=True)
            check(mode, url, digest_dir)
        if "reference" in totals:
            for mode in ("single-process", "spark local[2]"):
                if mode not in totals:
                    continue
                cpu = "" if "spark" in mode else (
                    f"; CPU (command and database backends) {cpu_totals[mode]:.1f} s against "
                    f"{cpu_totals['reference']:.1f} s, {cpu_totals['reference'] / cpu_totals[mode]:.1f}x")
                print(f"{mode}: compress + apply {totals[mode]:.1f} s, "
                      f"{totals['reference'] / totals[mode]:.1f}x faster than the reference{cpu}")
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    print("\n| contender | phase | rows after | longest chain | wall | peak RSS |\n|---|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    from compress_state_forest import default_compressor_python

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=10_000, help="state groups per big room")
    parser.add_argument("--big-rooms", type=int, default=1)
    parser.add_argument("--small-rooms", type=int, default=0)
    parser.add_argument("--fork-rate", type=float, default=0.02)
    parser.add_argument("--snapshot-interval", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parquet", default=None, help="write the tables as Parquet here")
    parser.add_argument("--only-generate", action="store_true", help="write --parquet and stop")
    parser.add_argument("--database", default=None,
                        help="compare on this already loaded database (kept) instead of generating one")
    parser.add_argument("--keep-database", action="store_true", help="keep the generated database")
    parser.add_argument("--dsn", default=os.environ.get("STREAMREP_TEST_DSN",
                                                        "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--compressor-python", default=default_compressor_python())
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--skip-single-process", action="store_true")
    parser.add_argument("--jdbc-jar", default=None)
    parser.add_argument("--split-threshold", type=int, default=0,
                        help="--split-threshold of streamrep's compress (default: the command's own)")
    parser.add_argument("--executor-memory", default="2g",
                        help="--executor-memory of the Spark commands (the bound per executor process)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a --conf for the Spark commands (repeatable)")
    args = parser.parse_args()
    shape = Shape(args.members, args.groups, args.big_rooms, args.small_rooms, args.fork_rate,
                  args.snapshot_interval, args.seed)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {shape}", flush=True)
    if args.parquet:
        clock = time.perf_counter()
        counts = write_parquet(shape, args.parquet)
        print(f"parquet: {counts} in {time.perf_counter() - clock:.0f} s", flush=True)
        if args.only_generate:
            return
    compare(shape, args)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
