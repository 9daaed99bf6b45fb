"""The Spark job of state compression.

1. read ``state_groups``, ``state_group_edges``, ``state_groups_state`` (and
   ``event_to_state_groups`` with ``find_unreferenced``) like reconstruction:
   Parquet/CSV files or partitioned JDBC reads;
2. the topology (a few fields per group) goes to one task that checks it with
   the core and groups the trees into units
   (:func:`streamrep.spark.compress.assign_units`);
3. the delta rows are joined to their unit, repartitioned by unit and sorted
   within partitions, and ``mapInArrow`` hands batches of whole units to the
   compiled core, which plans, verifies and writes the new tables and the
   change set from the Python worker (:func:`streamrep.spark.compress.write_units`).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Iterator

from streamrep.spark.compress import (
    REPORT_SCHEMA,
    UNIT_TOPOLOGY_SCHEMA,
    UNITS_SCHEMA,
    CompressOptions,
    CompressResult,
    finish_output,
)
from streamrep.spark.job import (
    _absolute_uri,
    _arrow_to_spark_schema,
    _reraise_executor_error,
    _rows_with_deltas,
    _task_attempt,
    _whole_table_udf,
    read_spark_tables,
)
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
    _reraise_executor_error(exc)


def _units_udf(split_threshold: int) -> Any:
    from streamrep.spark.compress import assign_units

    return _whole_table_udf(UNIT_TOPOLOGY_SCHEMA, assign_units, split_threshold)


def _write_udf(output: str, options: CompressOptions) -> Any:
    def compress_and_write(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        from streamrep.spark.compress import write_units

        partition, attempt = _task_attempt()
        yield write_units(batches, output, f"part-{partition:05d}-attempt{attempt}", options)

    return compress_and_write


def compress_spark(spark: "SparkSession", source: Source, options: CompressOptions,
                   jdbc_partitions: int | None = None) -> CompressResult:
    """Run the compression job on *spark*; returns counts and phase timings."""
    from pyspark.sql import functions as F

    prepare_output(options.output, options.overwrite)
    result = CompressResult(options.output)
    clock = time.perf_counter()
    frames = read_spark_tables(spark, source, options.find_unreferenced, jdbc_partitions)
    groups = frames["state_groups"].select(
        F.col("id").cast("long").alias("state_group"), "room_id",
        F.col("event_id").alias("group_event_id"),
    )
    edges = frames["state_group_edges"].select(
        F.col("state_group").cast("long").alias("edge_group"),
        F.col("prev_state_group").cast("long").alias("prev_state_group"),
    )
    topology = groups.join(edges, F.col("state_group") == F.col("edge_group"), "left")
    if options.find_unreferenced:
        refs = frames["event_to_state_groups"].select(F.col("state_group").alias("ref_group")).distinct()
        topology = topology.join(refs, F.col("state_group") == F.col("ref_group"), "left").withColumn(
            "referenced", F.col("ref_group").isNotNull()
        )
    else:
        topology = topology.withColumn("referenced", F.lit(True))
    topology = topology.withColumn("wanted", F.lit(True)).select(*UNIT_TOPOLOGY_SCHEMA.names)
    units = topology.repartition(1).mapInArrow(
        _units_udf(options.split_threshold), _arrow_to_spark_schema(UNITS_SCHEMA)
    )
    try:
        units = units.localCheckpoint(eager=True)
        unit_rows = units.count()
    except Exception as exc:  # Py4JJavaError / PythonException from the task
        _reraise(exc)
    result.timings["units"] = time.perf_counter() - clock

    clock = time.perf_counter()
    output_uri = _absolute_uri(options.output)
    reports = (
        _rows_with_deltas(frames, units, unit_rows, list(UNITS_SCHEMA.names))
        .repartition("unit")
        .sortWithinPartitions("unit", "state_group")
        .mapInArrow(_write_udf(output_uri, options), _arrow_to_spark_schema(REPORT_SCHEMA))
    )
    try:
        written = reports.toArrow()
    except Exception as exc:
        _reraise(exc)
    finish_output(output_uri)
    result.add(written)
    result.timings["compress_verify_write"] = time.perf_counter() - clock
    return result
