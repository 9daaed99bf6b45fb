"""A data engineer's pipeline over streamrep.spark.functions, for mypy --strict.

Not run: tests/test_typing.py type-checks it as a user's code.
"""

from __future__ import annotations

import functools
from typing import Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamrep.spark import functions as SF
from streamrep.spark.functions import CompressionPlan, InputOrderError


def member_counts(spark: SparkSession, base: str) -> DataFrame:
    groups = spark.read.parquet(f"{base}/state_groups")
    edges = spark.read.parquet(f"{base}/state_group_edges")
    deltas = spark.read.parquet(f"{base}/state_groups_state")
    rooms = spark.read.parquet(f"{base}/my_rooms")
    state: DataFrame = SF.full_state(groups, edges, deltas)
    digests: DataFrame = SF.full_state(groups, edges, deltas, digest=True, split_threshold=50_000)
    some: DataFrame = SF.state_at(groups, edges, deltas, [1, 2, 3], digest=True)
    chosen: DataFrame = SF.state_at(groups, edges, deltas, rooms.select("state_group"))
    joined = state.where(F.col("type") == "m.room.member").join(groups.select(
        F.col("id").alias("state_group"), "room_id"), "state_group").join(rooms, "room_id")
    return joined.groupBy("room_id").count().unionByName(
        digests.select("state_group").union(some.select("state_group")).union(
            chosen.select("state_group")).withColumnRenamed("state_group", "room_id")
        .withColumn("count", F.lit(0)))


def plan_tables(spark: SparkSession, groups: DataFrame, edges: DataFrame,
                deltas: DataFrame, refs: DataFrame) -> list[DataFrame]:
    plan: CompressionPlan = SF.compression_plan(groups, edges, deltas, refs, max_depth=49,
                                                candidates=8)
    tables = [plan.state_group_edges, plan.state_groups_state, plan.changes, plan.change_rows]
    tables.extend(plan.table(name) for name in SF.PLAN_TABLES)
    plan.unpersist()
    return tables


def by_hand(rows: DataFrame) -> DataFrame:
    ordered = rows.repartition("root", "piece").sortWithinPartitions("root", "piece", "state_group")
    states = ordered.mapInArrow(SF.expand_states, SF.ddl(SF.STATE_SCHEMA))
    digests = ordered.mapInArrow(SF.expand_digests, SF.ddl(SF.DIGEST_SCHEMA))
    return states.select("state_group").union(digests.select("state_group"))


def compress_by_hand(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    body = functools.partial(SF.compress_units, max_depth=20, candidates=4)
    try:
        yield from body(batches)
    except InputOrderError as exc:
        raise RuntimeError(str(exc)) from exc


SCHEMAS: list[pa.Schema] = [SF.TOPOLOGY_SCHEMA, SF.TREES_SCHEMA, SF.TREE_ROWS_SCHEMA,
                            SF.STATE_SCHEMA, SF.DIGEST_SCHEMA, SF.UNIT_TOPOLOGY_SCHEMA,
                            SF.UNITS_SCHEMA, SF.UNIT_ROWS_SCHEMA, SF.PLAN_SCHEMA]
