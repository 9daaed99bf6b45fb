"""The Spark job end to end: Parquet, CSV and JDBC input, digests, corruption, local-cluster.

One SparkSession (``local[2]``) serves the module. Without Java or PySpark the
tests skip, unless ``STREAMREP_REQUIRE_SPARK=1`` (CI), which turns that into a
failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from streamrep import _impl
from streamrep.errors import StateCorruptionError
from streamrep.spark import ReconstructOptions, Source
from streamrep.spark.verify import read_output_states
from support.spark import local_session, spark_missing, spark_required
from support.state_forest import Forest, corrupt_forest, load_database, make_forest

pytestmark = [
    pytest.mark.spark,
    # PySpark's collect() leaves its local result socket for the garbage
    # collector (pyspark/sql/pandas/serializers & util _load_from_socket).
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

digest_state = _impl.load("treewalk").digest_state


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session()
    yield session
    session.stop()


def test_spark_is_available_when_required() -> None:
    # CI sets STREAMREP_REQUIRE_SPARK=1: then a missing Java or PySpark fails here.
    reason = spark_missing()
    if spark_required():
        assert reason is None, reason
    elif reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def forest() -> Forest:
    # Snapshots, chains up to 100 hops, forks, a fan-out of 150 children.
    return make_forest(900, seed=7, rooms=5, fan_out=120)


@pytest.fixture(scope="module")
def inputs(forest: Forest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("spark-input")
    forest.write_parquet(str(base / "parquet"))
    forest.write_csv(str(base / "csv"))
    return {"parquet": str(base / "parquet"), "csv": str(base / "csv")}


def expected(forest: Forest, digest: bool, groups: list[int] | None = None) -> dict[int, Any]:
    truth = forest.brute_force(groups)
    if digest:
        return {g: digest_state(s) for g, s in truth.items()}
    return {g: s for g, s in truth.items() if s}


def output(path: str, forest: Forest, digest: bool) -> dict[int, Any]:
    return read_output_states(path, [g for g, _, _ in forest.groups], digest)


def run(spark: Any, source: Source, options: ReconstructOptions) -> Any:
    from streamrep.spark.job import reconstruct_spark

    return reconstruct_spark(spark, source, options)


@pytest.fixture(scope="module")
def parquet_full(spark: Any, forest: Forest, inputs: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    out = str(tmp_path_factory.mktemp("spark-full") / "out")
    # split_threshold 60 splits the fan-out trees into pieces.
    result = run(spark, Source(input_dir=inputs["parquet"]), ReconstructOptions(out, split_threshold=60))
    return out, result


def test_full_state_from_parquet_equals_brute_force(forest: Forest, parquet_full: tuple[str, Any]) -> None:
    out, result = parquet_full
    assert result.wanted_groups == len(forest.groups)
    assert result.rows == sum(len(s) for s in forest.brute_force().values())
    assert output(out, forest, False) == expected(forest, False)


def test_full_state_from_csv_equals_brute_force(spark: Any, forest: Forest, inputs: dict[str, str],
                                                tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    result = run(spark, Source(input_dir=inputs["csv"]), ReconstructOptions(out, split_threshold=60, verify=15))
    assert result.verified == 15
    assert output(out, forest, False) == expected(forest, False)


def test_digest_agrees_with_full_output(spark: Any, forest: Forest, inputs: dict[str, str],
                                        parquet_full: tuple[str, Any], tmp_path: Path) -> None:
    out = str(tmp_path / "digest")
    run(spark, Source(input_dir=inputs["parquet"]), ReconstructOptions(out, digest=True))
    digests = output(out, forest, True)
    assert digests == expected(forest, True)
    states = output(parquet_full[0], forest, False)
    assert {g: digest_state(states.get(g, {})) for g in digests} == digests


def test_restricted_to_rooms_and_groups(spark: Any, forest: Forest, inputs: dict[str, str],
                                        tmp_path: Path) -> None:
    room = "!room1:example.org"
    in_room = [g for g, r, _ in forest.groups if r == room]
    picked = tuple(in_room[::5])
    out = str(tmp_path / "out")
    result = run(spark, Source(input_dir=inputs["parquet"]),
                 ReconstructOptions(out, rooms=(room,), groups=picked))
    assert result.wanted_groups == len(picked)
    assert output(out, forest, False) == expected(forest, False, list(picked))


CORRUPT_AT = 20


def corrupt(forest: Forest, kind: str) -> Forest:
    return corrupt_forest(forest, kind, at=CORRUPT_AT, missing_group=888_888_888)


@pytest.mark.parametrize("kind, named", [("cycle", "cycle"), ("missing", "888888888"),
                                          ("dupkey", "more than once")])
def test_corrupt_input_fails_naming_groups(spark: Any, forest: Forest, tmp_path: Path,
                                           kind: str, named: str) -> None:
    bad = corrupt(forest, kind)
    bad.write_parquet(str(tmp_path / "in"))
    out = str(tmp_path / "out")
    with pytest.raises(StateCorruptionError, match=named) as info:
        run(spark, Source(input_dir=str(tmp_path / "in")), ReconstructOptions(out))
    if kind == "dupkey":
        assert str(forest.state[CORRUPT_AT][0]) in str(info.value)
    if kind == "cycle":
        a, b = forest.edges[CORRUPT_AT][0], forest.edges[CORRUPT_AT + 1][0]
        assert str(a) in str(info.value) and str(b) in str(info.value)


@pytest.mark.postgres
def test_jdbc_input(spark: Any, forest: Forest, pg_url: str, tmp_path: Path) -> None:
    load_database(pg_url, forest)
    out = str(tmp_path / "out")
    from streamrep.spark.job import reconstruct_spark

    result = reconstruct_spark(spark, Source(db_url=pg_url), ReconstructOptions(out, verify=10),
                               jdbc_partitions=3)
    assert result.verified == 10
    assert output(out, forest, False) == expected(forest, False)


@pytest.mark.slow
def test_local_cluster_executors_import_the_installed_wheel(
    spark: Any, forest: Forest, inputs: dict[str, str], tmp_path: Path
) -> None:
    # Executors are separate JVMs with their own Python workers: they can only
    # run the job if streamrep (and its compiled core) is importable there.
    out = str(tmp_path / "out")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "streamrep", "spark", "reconstruct", "--master", "local-cluster[2,1,1024]",
         "--input", inputs["parquet"], "--output", out, "--digest", "--verify", "5", "--shuffle-partitions", "2",
         "--conf", "spark.executor.memory=512m"],
        capture_output=True, text=True, timeout=400, env=env, cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verified 5 groups" in proc.stdout
    assert output(out, forest, True) == expected(forest, True)
