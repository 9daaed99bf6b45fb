"""``--executor-memory``: the settings it chooses for the JVM, and the unit a Python
worker cannot hold within it refused with a one-line error naming the room.

No Spark needed: the settings are a value, and the bound is checked on the
Arrow batches a task receives.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from streamrep.cli import main
from streamrep.errors import ConfigError
from streamrep.spark import memory
from streamrep.spark.compress import UNIT_ROWS_SCHEMA, bounded_units
from streamrep.spark.memory import ExecutorMemory, parse_size


@pytest.mark.parametrize("text, size", [("2g", 2 << 30), ("1536m", 1536 << 20), ("1.5GiB", 3 << 29),
                                        ("2147483648", 2 << 30), (" 4 G ", 4 << 30)])
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_not_a_size() -> None:
    with pytest.raises(ConfigError, match="not a size"):
        parse_size("two gigs")


def test_local_mode_bounds_the_one_jvm() -> None:
    conf = ExecutorMemory.parse("2g").spark_conf(local=True)
    assert conf["spark.driver.memory"] == "1408m"
    options = conf["spark.driver.extraJavaOptions"].split()
    assert "-XX:MaxDirectMemorySize=128m" in options
    assert "-XX:MaxMetaspaceSize=256m" in options
    assert "-XX:ReservedCodeCacheSize=128m" in options
    assert not any(key.startswith("spark.executor.memory") for key in conf)
    # The heap and the allowance beside it add up to the bound.
    assert ExecutorMemory.parse("2g").heap + 640 * memory.MIB == 2 << 30


def test_cluster_executors_get_heap_and_overhead() -> None:
    conf = ExecutorMemory.parse("4g").spark_conf(local=False)
    # The collector's allowance grows with the heap: 512 MiB and a sixteenth.
    assert conf["spark.executor.memory"] == "3328m"
    assert conf["spark.executor.memoryOverhead"] == "768m"
    assert "spark.driver.memory" not in conf


def test_too_small_a_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 1024 MiB"):
        ExecutorMemory.parse("512m")


def test_cli_refuses_a_bad_size() -> None:
    result = CliRunner().invoke(main, ["spark", "compress", "--input", ".", "--output", "/nonexistent/x",
                                       "--executor-memory", "lots"])
    assert result.exit_code != 0
    assert "not a size" in result.output


def _batch(units: list[int], rooms: list[str]) -> pa.RecordBatch:
    n = len(units)
    columns = {name: pa.nulls(n, field.type) for name, field in zip(UNIT_ROWS_SCHEMA.names, UNIT_ROWS_SCHEMA)}
    columns["unit"] = pa.array(units, pa.int64())
    columns["state_group"] = pa.array(np.arange(n), pa.int64())
    columns["room_id"] = pa.array(rooms, pa.string())
    return pa.RecordBatch.from_arrays(list(columns.values()), schema=UNIT_ROWS_SCHEMA)


def test_units_within_the_bound_pass_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bound of 1 GiB holds 768 MiB of rows; at 100 MiB a row, 7 rows a unit.
    monkeypatch.setattr(memory, "WORKER_BYTES_PER_ROW", 100 << 20)
    batches = [_batch([1, 1, 1, 2, 2], ["!a"] * 3 + ["!b"] * 2), _batch([2] * 5 + [3] * 7, ["!b"] * 5 + ["!c"] * 7)]
    passed = list(bounded_units(iter(batches), 1 << 30))
    assert [b.num_rows for b in passed] == [5, 12]


def test_a_unit_too_big_names_its_room_across_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "WORKER_BYTES_PER_ROW", 100 << 20)
    batches = iter([_batch([1, 2, 2, 2], ["!a"] + ["!big"] * 3), _batch([2] * 5 + [3], ["!big"] * 5 + ["!c"]),
                    _batch([3], ["!c"])])
    passed = []
    with pytest.raises(ConfigError, match=r"room !big has more than 7 delta rows in one unit.*"
                                          r"--executor-memory 1\.00 GiB; give a larger --executor-memory"):
        for batch in bounded_units(batches, 1 << 30):
            passed.append(batch)
    # Refused on the batch that crossed the bound, before the rest was read.
    assert len(passed) == 1


def test_a_smaller_split_threshold_is_advised_only_where_it_helps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "WORKER_BYTES_PER_ROW", 100 << 20)
    # A tree of many one-row groups: cutting it by branch helps.
    with pytest.raises(ConfigError, match=r"--executor-memory, or a --split-threshold below its 8 groups"):
        list(bounded_units(iter([_batch([1] * 8, ["!tree"] * 8)]), 1 << 30))
    # One group of 8 rows (a snapshot): only more memory helps.
    one_group = _batch([1] * 8, ["!snapshot"] * 8).set_column(
        1, "state_group", pa.array([5] * 8, pa.int64()))
    with pytest.raises(ConfigError, match=r"room !snapshot .*give a larger --executor-memory$"):
        list(bounded_units(iter([one_group]), 1 << 30))
