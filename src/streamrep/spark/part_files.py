"""Output written by the executors themselves, one part file per task.

The state jobs and :func:`streamrep.spark.functions.write_full_state` expand
state in the Python workers and write each task's Parquet from there, so the
(large) output never passes through the JVM: only a one-row report per task
goes back to the driver. A task writes under ``_temporary`` and moves its file
into place when complete, so a retried or speculative attempt replaces it
whole; the driver then drops the scratch folder and writes ``_SUCCESS``.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Iterator

from streamrep.errors import ConfigError, StateCorruptionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["absolute_uri", "finish_output", "reraise_executor_error", "task_attempt", "write_states"]


def task_attempt() -> tuple[int, int]:
    """The running Spark task's partition and attempt numbers (0, 0 outside one)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


def absolute_uri(output: str) -> str:
    """*output* as a URI the executors resolve the same way (local paths made absolute)."""
    if "://" in output:
        return output
    return "file://" + os.path.abspath(output)


def finish_output(output_uri: str) -> None:
    """Drop the attempts' scratch folder and mark the output complete."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(output_uri)
    fs.create_dir(root, recursive=True)
    scratch = f"{root}/_temporary"
    if fs.get_file_info(scratch).type != pafs.FileType.NotFound:
        fs.delete_dir(scratch)
    with fs.open_output_stream(f"{root}/_SUCCESS"):
        pass


_PYTHON_ERROR = re.compile(r"streamrep\.errors\.(StateCorruptionError|ConfigError): (.*)")


def reraise_executor_error(exc: BaseException) -> None:
    """Turn a Python error raised in an executor back into streamrep's own error
    (with the groups it names); any other error is raised as it is."""
    match = _PYTHON_ERROR.search(str(exc))
    if match is None:
        raise exc
    kind = StateCorruptionError if match.group(1) == "StateCorruptionError" else ConfigError
    groups = tuple(int(g) for g in re.findall(r"\b(\d+)\b", match.group(2))[:50])
    err = kind(match.group(2).strip())
    setattr(err, "groups", groups)
    raise err from None


def _expand_and_write(output_uri: str, digest: bool) -> Any:
    def expand_and_write(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        from streamrep.spark.batches import write_partition

        partition, attempt = task_attempt()
        yield write_partition(batches, output_uri, partition, attempt, digest)

    return expand_and_write


def write_states(tree_rows: "DataFrame", output_uri: str, digest: bool) -> "pa.Table":
    """Expand *tree_rows* (sorted as :func:`~streamrep.spark.functions.expand_states`
    needs them) into full states, or digests, written under *output_uri* by the
    tasks; returns the tasks' reports (:data:`~streamrep.spark.batches.WRITTEN_SCHEMA`)
    once the output is complete. Errors raised in the executors come back as
    streamrep's own."""
    from streamrep.spark.batches import WRITTEN_SCHEMA, ddl

    reports = tree_rows.mapInArrow(_expand_and_write(output_uri, digest), ddl(WRITTEN_SCHEMA))
    try:
        written = reports.toArrow()
    except Exception as exc:  # Py4JJavaError / PythonException from a task
        reraise_executor_error(exc)
        raise
    finish_output(output_uri)
    return written
