"""Bulk state reconstruction on one synthetic forest, four ways, in one run.

    python bench/reconstruct_state_forest.py --groups 200000

1. one recursive SQL query per group on PostgreSQL (timed on ``--sql-groups``
   random groups and scaled to the whole forest; the figure says so);
2. the compiled walk alone: ``expand_groups`` over the whole forest, interned
   in advance, in closed batches of about 250,000 groups (no reading, no writing);
3. the single-process mode: ``streamrep spark reconstruct --single-process``
   from Parquet to Parquet;
4. the Spark job in ``local[2]``: ``streamrep spark reconstruct --master local[2]``.

Peak memory is the largest sum of RSS over the process tree of each run (the
JVM and Python workers for Spark), polled every 50 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from array import array
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support.state_forest import Forest, load_database, make_forest  # noqa: E402

from streamrep import _impl  # noqa: E402


def tree_processes(pid: int) -> list[tuple[int, int, str]]:
    """``(pid, RSS bytes, command name)`` of *pid* and all its descendants."""
    children: dict[int, list[int]] = {}
    seen: dict[int, tuple[int, str]] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                name, fields = f.read().split(" (", 1)[1].rsplit(")", 1)
            with open(f"/proc/{entry}/statm") as f:
                resident = int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(int(fields.split()[1]), []).append(int(entry))
        seen[int(entry)] = (resident, name)
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        if p in seen:
            found.append((p, *seen[p]))
        stack.extend(children.get(p, []))
    return found


def tree_rss(pid: int) -> int:
    """Sum of RSS (bytes) of *pid* and all its descendants."""
    return sum(rss for _, rss, _ in tree_processes(pid))


def process_kind(root: int, pid: int, name: str) -> str:
    """What a process of a measured tree is: the command itself, a JVM (Spark's
    driver and its local executor), or a worker it started (Spark's Python
    workers)."""
    if pid == root:
        return "command"
    return "jvm" if name == "java" else "worker"


def run_measured(cmd: list[str], env: dict[str, str],
                 parts: dict[str, int] | None = None) -> tuple[float, int, str, float]:
    """Run *cmd*; return (wall seconds, peak tree RSS bytes, stdout, CPU seconds).

    With *parts*, also fill it with the peak RSS of the largest single process
    of each :func:`process_kind`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    clock = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            found = tree_processes(proc.pid)
            peak[0] = max(peak[0], sum(rss for _, rss, _ in found))
            if parts is not None:
                for pid, rss, name in found:
                    kind = process_kind(proc.pid, pid, name)
                    parts[kind] = max(parts.get(kind, 0), rss)
            done.wait(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out, err = proc.communicate()
    done.set()
    poller.join()
    wall = time.perf_counter() - clock
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, peak[0], out, cpu


class BackendCpu:
    """CPU seconds of the PostgreSQL backends serving one database (on this
    machine), polled while a contender runs: the reference compressor works in
    its own process, streamrep's apply mostly in the server."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.seen: dict[tuple[int, int], float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "BackendCpu":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())

    def _poll(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        needle = f" {self.database} ".encode()
        while True:
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        command = f.read().replace(b"\0", b" ")
                    if not command.startswith(b"postgres:") or needle not in command:
                        continue
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except (OSError, ValueError):
                    continue
                self.seen[(int(entry), int(fields[19]))] = (int(fields[11]) + int(fields[12])) / tick
            if self.done.wait(0.2):
                return


def interned_batches(forest: Forest, chunk_groups: int = 250_000) -> list[tuple[array, ...]]:
    """The forest as expand_groups buffers (strings interned in Python), cut at
    room boundaries into closed batches of about *chunk_groups* groups."""
    prev = dict(forest.edges)
    rows: dict[int, list[tuple[int, int]]] = {}
    keys: dict[tuple[str, str], int] = {}
    events: dict[str, int] = {}
    for g, _room, t, s, e in forest.state:
        k = keys.setdefault((t, s), len(keys))
        rows.setdefault(g, []).append((k, events.setdefault(e, len(events))))
    by_room: dict[str, list[int]] = {}
    for g, room, _event in forest.groups:
        by_room.setdefault(room, []).append(g)
    batches = []
    pending: list[int] = []
    for room_groups in by_room.values():
        pending.extend(room_groups)
        if len(pending) >= chunk_groups:
            batches.append(_batch(pending, prev, rows))
            pending = []
    if pending:
        batches.append(_batch(pending, prev, rows))
    return batches


def _batch(groups_in: list[int], prev: dict[int, int], rows: dict[int, list[tuple[int, int]]]) -> tuple[array, ...]:
    groups, prevs, offsets, dkeys, devents = (array("q") for _ in range(5))
    offsets.append(0)
    for g in groups_in:
        groups.append(g)
        prevs.append(prev.get(g, -1))
        for k, e in rows.get(g, []):
            dkeys.append(k)
            devents.append(e)
        offsets.append(len(dkeys))
    return groups, prevs, offsets, dkeys, devents


def phases(summary: str) -> str:
    found = re.search(r"\((.*)\)", summary)
    return found.group(1) if found else summary.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=200_000)
    parser.add_argument("--sql-groups", type=int, default=10_000,
                        help="groups timed with the per-group recursive query (0: skip)")
    parser.add_argument("--dsn", default=os.environ.get("STREAMREP_TEST_DSN",
                                                        "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="streamrep-bench-state-"))
    rooms = max(1, args.groups // 50)
    clock = time.perf_counter()
    forest = make_forest(args.groups, seed=1, rooms=rooms, snapshot_share=0.08,
                         initial_members=55, member_pool=120, fan_out=2000)
    forest.write_parquet(str(work / "input"))
    print(f"forest: {len(forest.groups)} groups, {len(forest.edges)} edges, "
          f"{len(forest.state)} delta rows (generated in {time.perf_counter() - clock:.1f}s)")

    state = _impl.load_compiled("state")
    batches = interned_batches(forest)
    walk = walk_cpu = 0.0
    output_rows = 0
    for batch in batches:
        clock = time.perf_counter()
        cpu_clock = time.process_time()
        out_groups, _, _ = state.expand_groups(*batch, None)
        walk += time.perf_counter() - clock
        walk_cpu += time.process_time() - cpu_clock
        output_rows += len(out_groups)
        del out_groups
    del batches
    print(f"output: {output_rows} rows")
    print(f"compiled walk ({len(forest.groups)} groups pre-interned, expand_groups only): "
          f"{walk:.2f}s wall, {walk_cpu:.2f}s CPU")

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    results: dict[str, tuple[float, int, str, float]] = {}
    cmd = [sys.executable, "-m", "streamrep", "spark", "reconstruct", "--input", str(work / "input")]
    results["single-process"] = run_measured(
        cmd + ["--single-process", "--output", str(work / "out-local")], env)
    if not args.skip_spark:
        results["spark local[2]"] = run_measured(
            cmd + ["--master", "local[2]", "--output", str(work / "out-spark")], env)
    for name, (wall, peak, out, cpu) in results.items():
        # The Spark JVM is not a waited-for child of the CLI: no CPU figure for it.
        cpu_text = f", {cpu:.2f}s CPU" if name == "single-process" else ""
        print(f"{name}: {wall:.2f}s wall{cpu_text}, peak RSS {peak / 2**30:.2f} GiB ({phases(out)})")

    if args.sql_groups:
        import psycopg2

        from streamrep.spark.verify import walk_state_sql

        schema = f"bench_{uuid.uuid4().hex[:8]}"
        admin = psycopg2.connect(args.dsn)
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"CREATE SCHEMA {schema}")
        url = f"{args.dsn}?options=-csearch_path%3D{schema}"
        try:
            load_database(url, forest)
            conn = psycopg2.connect(url)
            with conn, conn.cursor() as cur:
                cur.execute("CREATE INDEX ON state_group_edges (state_group)")
                cur.execute("CREATE INDEX ON state_groups_state (state_group)")
                cur.execute("ANALYZE")
            sample = random.Random(2).sample([g for g, _, _ in forest.groups],
                                             min(args.sql_groups, len(forest.groups)))
            clock = time.perf_counter()
            for g in sample:
                walk_state_sql(conn, "postgres", g)
            sql = time.perf_counter() - clock
            conn.close()
            scaled = sql * len(forest.groups) / len(sample)
            print(f"per-group recursive SQL: {sql:.2f}s for {len(sample)} groups, "
                  f"{scaled:.1f}s scaled to {len(forest.groups)} groups")
            if "spark local[2]" in results:
                print(f"spark local[2] vs per-group SQL: {scaled / results['spark local[2]'][0]:.1f}x faster")
        finally:
            with admin.cursor() as cur:
                cur.execute(f"DROP SCHEMA {schema} CASCADE")
            admin.close()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    local_wall = results["single-process"][0]
    print(f"single-process vs compiled walk: {local_wall / walk:.1f}x the walk's time")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
