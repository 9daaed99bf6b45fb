"""A local Spark session for the Spark job tests, or why there is none."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest


def spark_required() -> bool:
    """Whether a missing Spark fails the tests (CI sets STREAMREP_REQUIRE_SPARK=1)."""
    return os.environ.get("STREAMREP_REQUIRE_SPARK", "") not in ("", "0")


def spark_missing() -> str | None:
    """Why Spark cannot run here (no PySpark, no Java), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"pyspark is not installed ({exc})"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (java not on PATH, JAVA_HOME unset)"
    return None


def local_session(**settings: Any) -> Any:
    """A ``local[2]`` session with two shuffle partitions and a 1 GiB heap
    (executors of 1664 MiB; *settings* go to ``build_session`` too). Skips the calling test where Spark
    cannot run, or fails it when :func:`spark_required`."""
    reason = spark_missing()
    if reason:
        if spark_required():
            pytest.fail(f"STREAMREP_REQUIRE_SPARK is set but {reason}", pytrace=False)
        pytest.skip(reason)
    from streamrep.spark.job import build_session
    from streamrep.spark.memory import ExecutorMemory

    settings.setdefault("executor_memory", ExecutorMemory.parse("1664m"))
    return build_session("local[2]", shuffle_partitions=2, **settings)
