"""streamrep.spark.functions against the reconstruct job, in one run.

    python bench/spark_functions.py --groups 200000

On one synthetic forest written as Parquet, in one Spark session (``local[2]``
unless ``--master``), each contender runs ``--rounds`` times, the order
alternating between rounds, and the best wall time of each is reported:

* ``job``: ``streamrep spark reconstruct``'s job (``reconstruct_spark``), which
  reads the topology with pyarrow in the driver and writes Parquet from the
  Python workers;
* ``full_state``: the public function over ``spark.read.parquet`` DataFrames,
  its result written with ``DataFrame.write.parquet``;
* ``consumed``: the same function, its rows consumed by Spark's ``noop`` sink
  (every row made and handed to Spark, nothing written): the function's own cost,
  without Spark's Parquet writer;
* ``write_full_state``: the public function that writes Parquet from the
  executors, over the same DataFrames as ``full_state``;

each with and without ``--digest``. The function's input is read with
``spark.read.schema(...).parquet``, as the job reads it. Every output is checked to hold the same
number of rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support.state_forest import make_forest  # noqa: E402


def run_job(spark: Any, base: str, out: str, digest: bool) -> int:
    from streamrep.spark import ReconstructOptions, Source
    from streamrep.spark.job import reconstruct_spark

    result = reconstruct_spark(spark, Source(input_dir=base), ReconstructOptions(out, digest=digest))
    return result.rows


def run_function(spark: Any, base: str, out: str, digest: bool) -> int:
    import pyarrow.dataset as ds

    from streamrep.spark.functions import full_state

    # Read with the schema given, as the job reads (Spark then skips a job
    # that reads the footers).
    tables = [spark.read.schema(_ddl(f"{base}/{name}")).parquet(f"{base}/{name}") for name in
              ("state_groups", "state_group_edges", "state_groups_state")]
    full_state(*tables, digest=digest).write.parquet(out)
    return ds.dataset(out, format="parquet").count_rows()


def run_consumed(spark: Any, base: str, out: str, digest: bool) -> int | None:
    """None: the rows are not counted (counting them would cost a pass of its own);
    the sink takes every row the function makes."""
    from streamrep.spark.functions import full_state

    tables = [spark.read.schema(_ddl(f"{base}/{name}")).parquet(f"{base}/{name}") for name in
              ("state_groups", "state_group_edges", "state_groups_state")]
    full_state(*tables, digest=digest).write.format("noop").mode("overwrite").save()
    return None


def run_written(spark: Any, base: str, out: str, digest: bool) -> int:
    from streamrep.spark.functions import write_full_state

    tables = [spark.read.schema(_ddl(f"{base}/{name}")).parquet(f"{base}/{name}") for name in
              ("state_groups", "state_group_edges", "state_groups_state")]
    return write_full_state(*tables, out, digest=digest).rows


def _ddl(path: str) -> str:
    import pyarrow.dataset as ds

    kinds = {"int64": "bigint", "string": "string"}
    return ", ".join(f"`{f.name}` {kinds[str(f.type)]}"
                     for f in ds.dataset(path, format="parquet").schema)


def timed(run: Callable[[Any, str, str, bool], int | None], spark: Any, base: str, scratch: str,
          digest: bool) -> tuple[float, int | None]:
    out = os.path.join(scratch, "out")
    shutil.rmtree(out, ignore_errors=True)
    clock = time.perf_counter()
    rows = run(spark, base, out, digest)
    return time.perf_counter() - clock, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    from streamrep.spark.job import build_session

    scratch = tempfile.mkdtemp(prefix="spark-functions-bench-")
    try:
        # The forest of bench/reconstruct_state_forest.py.
        forest = make_forest(args.groups, seed=args.seed, rooms=max(1, args.groups // 50),
                             snapshot_share=0.08, initial_members=55, member_pool=120,
                             fan_out=2000)
        base = os.path.join(scratch, "in")
        forest.write_parquet(base)
        print(f"forest: {len(forest.groups)} groups, {len(forest.state)} delta rows; "
              f"master {args.master}, best of {args.rounds} rounds; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        spark = build_session(args.master, shuffle_partitions=4, conf={"spark.ui.showConsoleProgress": "false"})
        contenders = {"job": run_job, "full_state": run_function, "consumed": run_consumed,
                      "write_full_state": run_written}
        best: dict[tuple[str, bool], float] = {}
        rows: dict[tuple[str, bool], int | None] = {}
        # A first small run warms the JVM and the Python workers for both.
        for name, run in contenders.items():
            timed(run, spark, base, scratch, True)
        for round_no in range(args.rounds):
            order = list(contenders) if round_no % 2 == 0 else list(reversed(contenders))
            for digest in (False, True):
                for name in order:
                    seconds, count = timed(contenders[name], spark, base, scratch, digest)
                    key = (name, digest)
                    best[key] = min(best.get(key, seconds), seconds)
                    rows[key] = count
                    print(f"round {round_no + 1}: {name:<16} digest={digest!s:<5} {seconds:7.2f} s "
                          f"{count} rows", flush=True)
        spark.stop()
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
        print("| output | job | full_state, written | / job | full_state, consumed | / job "
              "| write_full_state | / job |")
        print("|---|---|---|---|---|---|---|---|")
        for digest in (False, True):
            job = best[("job", digest)]
            assert rows[("job", digest)] == rows[("full_state", digest)] == rows[("write_full_state", digest)], rows
            label = "digests" if digest else "full states"
            cells = [f"{best[(name, digest)]:.2f} s | {best[(name, digest)] / job:.2f}"
                     for name in ("full_state", "consumed", "write_full_state")]
            print(f"| {label} ({rows[('job', digest)]} rows) | {job:.2f} s | " + " | ".join(cells) + " |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
