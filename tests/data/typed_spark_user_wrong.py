"""Mistakes in a pipeline over streamrep.spark.functions that mypy --strict catches
(tests/test_typing.py checks that each is refused)."""

from __future__ import annotations

from pyspark.sql import DataFrame

from streamrep.spark import functions as SF


def wrong(groups: DataFrame, edges: DataFrame, deltas: DataFrame) -> DataFrame:
    SF.full_state(groups, edges, deltas, split_threshold="50k")
    plan = SF.compression_plan(groups, edges, deltas)
    return plan.edges
