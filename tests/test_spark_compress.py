"""State compression on Spark (``local[2]``): Parquet and JDBC input, giant rooms
split into units, corrupt input refused, and the change set applied to PostgreSQL.

Without Java or PySpark the tests skip, unless ``STREAMREP_REQUIRE_SPARK=1``.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from streamrep.errors import StateCorruptionError
from streamrep.spark import Source
from streamrep.spark.compress import CompressOptions
from streamrep.spark.compress_apply import apply_compression
from support.spark import local_session, spark_required
from support.state_forest import Forest, corrupt_forest, load_database, make_forest
from test_compress_local import chain_lengths, compressed_forest, db_forest

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_session(jdbc_jar=jdbc_driver())
    yield session
    session.stop()


def jdbc_driver() -> str | None:
    """The PostgreSQL JDBC driver: the system's, else one in the Maven cache."""
    from streamrep.spark.job import find_jdbc_jar

    found = find_jdbc_jar()
    if found:
        return found
    cached = sorted(glob.glob(os.path.expanduser("~/.m2/repository/org/postgresql/postgresql/*/postgresql-*.jar")))
    return cached[-1] if cached else None


def require_jdbc_driver() -> None:
    """Skip without a JDBC driver (fail where Spark is required)."""
    if jdbc_driver() is None:
        why = "no PostgreSQL JDBC driver (install libpostgresql-jdbc-java)"
        if spark_required():
            pytest.fail(f"STREAMREP_REQUIRE_SPARK is set but {why}", pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="module")
def forest() -> Forest:
    made = make_forest(900, seed=9, rooms=3, fan_out=120)
    # Some leaves no event references any more: those can go.
    parents = {p for _, p in made.edges}
    made.event_to_state_groups = [(e, g) for e, g in made.event_to_state_groups
                                  if g in parents or g % 5 != 0]
    return made


def run(spark: Any, source: Source, options: CompressOptions, **kwargs: Any) -> Any:
    from streamrep.spark.compress_job import compress_spark

    return compress_spark(spark, source, options, **kwargs)


def test_parquet_input_with_giant_rooms_split(spark: Any, forest: Forest, tmp_path: Path) -> None:
    forest.write_parquet(str(tmp_path / "in"))
    out = str(tmp_path / "out")
    # Threshold 150: every room is split into units, the fan-out tree into pieces.
    result = run(spark, Source(input_dir=str(tmp_path / "in")), CompressOptions(out, split_threshold=150))
    after = compressed_forest(forest, out)
    assert after.brute_force() == forest.brute_force()
    assert result.rows_before == len(forest.state) > result.rows_after == len(after.state)
    assert max(chain_lengths(after).values()) <= 100
    assert result.verified_groups == result.changed_groups > 0


def test_corrupt_input_is_refused(spark: Any, forest: Forest, tmp_path: Path) -> None:
    bad = corrupt_forest(forest, "cycle", at=20, missing_group=0)
    bad.write_parquet(str(tmp_path / "in"))
    with pytest.raises(StateCorruptionError, match="cycle") as info:
        run(spark, Source(input_dir=str(tmp_path / "in")), CompressOptions(str(tmp_path / "out")))
    assert str(forest.edges[20][0]) in str(info.value)


@pytest.mark.postgres
def test_jdbc_compress_then_apply(spark: Any, forest: Forest, pg_url: str, tmp_path: Path) -> None:
    require_jdbc_driver()
    load_database(pg_url, forest)
    out = str(tmp_path / "out")
    result = run(spark, Source(db_url=pg_url), CompressOptions(out, find_unreferenced=True), jdbc_partitions=2)
    assert result.unreferenced_groups > 0
    report = apply_compression(pg_url, out, batch_groups=300)
    referenced = sorted({g for _, g in forest.event_to_state_groups})
    after = db_forest(pg_url)
    assert after.brute_force(referenced) == forest.brute_force(referenced)
    assert report.rows_after == len(after.state) < report.rows_before == len(forest.state)
    assert report.deleted == result.unreferenced_groups
    assert max(chain_lengths(after).values()) <= 100


@pytest.mark.postgres
def test_jdbc_rows_per_group_are_counted_by_postgresql_to_split_rooms(spark: Any, forest: Forest, pg_url: str,
                                                                      tmp_path: Path) -> None:
    """With a bound on a unit's rows, a JDBC source's rows per group come from a
    count PostgreSQL makes (only the counts cross the network), and rooms above the
    bound are split and keep every group's full state."""
    from collections import Counter

    from streamrep.spark.job import read_delta_row_counts

    require_jdbc_driver()
    load_database(pg_url, forest)
    counts = read_delta_row_counts(spark, Source(db_url=pg_url))
    assert counts is not None
    assert {r["count_group"]: r["counted"] for r in counts.collect()} == Counter(row[0] for row in forest.state)
    assert read_delta_row_counts(spark, Source(input_dir=str(tmp_path))) is None
    out = str(tmp_path / "out")
    whole = run(spark, Source(db_url=pg_url), CompressOptions(str(tmp_path / "whole")), jdbc_partitions=2)
    split = run(spark, Source(db_url=pg_url), CompressOptions(out, unit_rows=len(forest.state) // 8),
                jdbc_partitions=2)
    after = compressed_forest(forest, out)
    assert after.brute_force() == forest.brute_force()
    assert split.rows_before == whole.rows_before == len(forest.state)
    assert split.rows_after == len(after.state) < len(forest.state)
    assert split.chain_units and not whole.chain_units  # rooms were cut into linked shares
    assert max(chain_lengths(after).values()) <= 100
