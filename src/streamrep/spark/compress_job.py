"""The Spark job of state compression.

1. read ``state_groups``, ``state_group_edges``, ``state_groups_state`` (and
   ``event_to_state_groups`` with ``find_unreferenced``) like reconstruction:
   Parquet/CSV files or partitioned JDBC reads;
2. the topology (a few fields per group, with its count of delta rows when
   ``--executor-memory`` bounds the workers: counted by PostgreSQL over JDBC) goes to one task that checks it
   with the core and groups the trees into units, splitting rooms too big for
   one worker (:func:`streamrep.spark.compress.assign_units`);
3. the delta rows are joined to their unit, repartitioned by unit and sorted
   within partitions, and ``mapInArrow`` hands batches of whole units to the
   compiled core, which plans, verifies and writes the new tables and the
   change set from the Python worker (:func:`streamrep.spark.compress.write_units`).
"""

from __future__ import annotations

import functools
import re
import time
from typing import TYPE_CHECKING, Any, Iterator

from streamrep.spark import functions as SF
from streamrep.spark.compress import REPORT_SCHEMA, CompressOptions, CompressResult, finish_output
from streamrep.spark.job import read_delta_row_counts, read_spark_tables
from streamrep.spark.part_files import absolute_uri, reraise_executor_error, task_attempt
from streamrep.errors import StateVerificationError
from streamrep.spark.options import Source, prepare_output

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = ["compress_spark"]


_VERIFICATION_ERROR = re.compile(r"streamrep\.errors\.StateVerificationError: (.*)")


def _reraise(exc: BaseException) -> None:
    """streamrep's own error for one raised in an executor (verification included)."""
    match = _VERIFICATION_ERROR.search(str(exc))
    if match is not None:
        groups = tuple(int(g) for g in re.findall(r"\b(\d+)\b", match.group(1).split(":", 1)[-1])[:50])
        raise StateVerificationError(match.group(1).strip(), groups) from None
    reraise_executor_error(exc)


def _write_udf(output: str, options: CompressOptions) -> Any:
    def compress_and_write(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        from streamrep.spark.compress import write_units

        partition, attempt = task_attempt()
        yield write_units(batches, output, f"part-{partition:05d}-attempt{attempt}", options)

    return compress_and_write


def compress_spark(spark: "SparkSession", source: Source, options: CompressOptions,
                   jdbc_partitions: int | None = None) -> CompressResult:
    """Run the compression job on *spark*; returns counts and phase timings."""
    prepare_output(options.output, options.overwrite)
    result = CompressResult(options.output)
    clock = time.perf_counter()
    frames = read_spark_tables(spark, source, options.find_unreferenced, jdbc_partitions)
    bound = options.unit_row_bound
    # The delta rows per group are counted only for a bound on a unit's rows.
    topology = SF.unit_topology(frames["state_groups"], frames["state_group_edges"],
                                frames.get("event_to_state_groups") if options.find_unreferenced else None,
                                frames["state_groups_state"] if bound else None,
                                read_delta_row_counts(spark, source) if bound else None)
    # One task checks the topology and assigns the units (a few fields per group).
    units = topology.repartition(1).mapInArrow(
        functools.partial(SF.find_units, split_threshold=options.split_threshold,
                          max_depth=options.max_depth, unit_rows=bound),
        SF.ddl(SF.UNITS_SCHEMA))
    try:
        units = units.localCheckpoint(eager=True)
        unit_rows = units.count()
    except Exception as exc:  # Py4JJavaError / PythonException from the task
        _reraise(exc)
    result.timings["units"] = time.perf_counter() - clock

    clock = time.perf_counter()
    output_uri = absolute_uri(options.output)
    reports = SF.sorted_unit_rows(units, unit_rows, frames["state_groups_state"]).mapInArrow(
        _write_udf(output_uri, options), SF.ddl(REPORT_SCHEMA))
    try:
        written = reports.toArrow()
    except Exception as exc:
        _reraise(exc)
    finish_output(output_uri)
    result.add(written)
    result.timings["compress_verify_write"] = time.perf_counter() - clock
    return result
