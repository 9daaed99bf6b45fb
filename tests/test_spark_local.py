"""The reconstruction library without Spark: Arrow steps, single-process mode, export.

The same functions run inside the Spark job's mapInArrow; here they run in this
process against a brute-force walk of every group's chain.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from streamrep import _impl
from streamrep.cli import main
from streamrep.cli.exits import ExitCode
from streamrep.errors import ConfigError, StateCorruptionError, StateVerificationError
from streamrep.spark import ReconstructOptions, Source
from streamrep.spark.batches import TOPOLOGY_SCHEMA, assign_trees, expand_partition
from streamrep.spark.export import export_tables
from streamrep.spark.local import reconstruct_local
from streamrep.spark.tables import SCHEMAS, read_table
from streamrep.spark.verify import read_output_states, walk_states_db
from support.state_forest import Forest, corrupt_forest, load_database, make_forest

digest_state = _impl.load("treewalk").digest_state


@pytest.fixture(scope="module")
def forest() -> Forest:
    return make_forest(1200, seed=3, rooms=6, fan_out=150)


@pytest.fixture(scope="module")
def parquet_dir(forest: Forest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("parquet"))
    forest.write_parquet(path)
    return path


@pytest.fixture(scope="module")
def csv_dir(forest: Forest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("csv"))
    forest.write_csv(path)
    return path


def expected(forest: Forest, digest: bool, groups: list[int] | None = None) -> dict[int, Any]:
    truth = forest.brute_force(groups)
    if digest:
        return {g: digest_state(s) for g, s in truth.items()}
    return {g: s for g, s in truth.items() if s}


def output(path: str, forest: Forest, digest: bool) -> dict[int, Any]:
    return read_output_states(path, [g for g, _, _ in forest.groups], digest)


@pytest.mark.parametrize("digest", [False, True])
@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_single_process_equals_brute_force(
    forest: Forest, parquet_dir: str, csv_dir: str, tmp_path: Path, fmt: str, digest: bool
) -> None:
    source = Source(input_dir=parquet_dir if fmt == "parquet" else csv_dir)
    out = str(tmp_path / "out")
    # A small split threshold makes the fan-out trees split into pieces.
    result = reconstruct_local(source, ReconstructOptions(out, digest=digest, split_threshold=40, verify=25))
    assert result.verified == 25
    assert result.wanted_groups == len(forest.groups)
    assert output(out, forest, digest) == expected(forest, digest)


def test_csv_keeps_empty_state_keys_and_quotes(tmp_path: Path) -> None:
    forest = Forest(
        groups=[(1, "!r", "$c"), (2, "!r", "$d")],
        edges=[(2, 1)],
        state=[(1, "!r", "m.room.create", "", "$c"), (1, "!r", "m.room.member", '@a,"b":x', "$m"),
               (2, "!r", "m.room.name", "", "$n")],
    )
    forest.write_csv(str(tmp_path / "in"))
    out = str(tmp_path / "out")
    reconstruct_local(Source(input_dir=str(tmp_path / "in")), ReconstructOptions(out))
    assert output(out, forest, False) == expected(forest, False)
    assert output(out, forest, False)[2][("m.room.create", "")] == "$c"


def test_restrictions(forest: Forest, parquet_dir: str, tmp_path: Path) -> None:
    room = "!room2:example.org"
    picked = [g for g, r, _ in forest.groups if r == room][::7][:20]
    out = str(tmp_path / "groups")
    result = reconstruct_local(Source(input_dir=parquet_dir), ReconstructOptions(out, groups=tuple(picked)))
    assert result.wanted_groups == len(picked)
    assert output(out, forest, False) == expected(forest, False, picked)

    out = str(tmp_path / "rooms")
    reconstruct_local(Source(input_dir=parquet_dir), ReconstructOptions(out, rooms=(room,), digest=True))
    in_room = [g for g, r, _ in forest.groups if r == room]
    assert output(out, forest, True) == expected(forest, True, in_room)

    out = str(tmp_path / "both")
    reconstruct_local(Source(input_dir=parquet_dir),
                      ReconstructOptions(out, rooms=("!room3:example.org",), groups=tuple(picked)))
    assert output(out, forest, False) == {}

    referenced = sorted({g for _, g in forest.event_to_state_groups})[::3]
    forest_subset = Forest(forest.groups, forest.edges, forest.state,
                           [e for e in forest.event_to_state_groups if e[1] in set(referenced)])
    sub_dir = str(tmp_path / "sub")
    forest_subset.write_parquet(sub_dir)
    out = str(tmp_path / "events")
    result = reconstruct_local(Source(input_dir=sub_dir), ReconstructOptions(out, referenced_by_events=True))
    assert result.wanted_groups == len(referenced)
    assert output(out, forest, False) == expected(forest, False, referenced)


CORRUPT_AT = 10


def corrupt(forest: Forest, kind: str) -> Forest:
    return corrupt_forest(forest, kind, at=CORRUPT_AT, missing_group=999_999_999)


@pytest.mark.parametrize("kind, named", [("cycle", "cycle"), ("missing", "999999999"),
                                          ("dupkey", "more than once")])
def test_corrupt_input_is_an_error(forest: Forest, tmp_path: Path, kind: str, named: str) -> None:
    bad = corrupt(forest, kind)
    bad.write_parquet(str(tmp_path / "in"))
    with pytest.raises(StateCorruptionError, match=named) as info:
        reconstruct_local(Source(input_dir=str(tmp_path / "in")), ReconstructOptions(str(tmp_path / "out")))
    assert info.value.groups  # type: ignore[attr-defined]
    if kind == "dupkey":
        assert info.value.groups == (forest.state[CORRUPT_AT][0],)  # type: ignore[attr-defined]


def test_verify_catches_a_wrong_output(forest: Forest, parquet_dir: str, tmp_path: Path) -> None:
    from streamrep.spark.verify import verify_output

    out = str(tmp_path / "out")
    options = ReconstructOptions(out, verify=len(forest.groups))
    reconstruct_local(Source(input_dir=parquet_dir), ReconstructOptions(out))
    # Drop one row of the output: verification of every group must notice.
    import pyarrow.parquet as pq

    part = os.path.join(out, "part-00000.parquet")
    table = pq.read_table(part)
    pq.write_table(table.slice(1), part)
    with pytest.raises(StateVerificationError) as info:
        verify_output(Source(input_dir=parquet_dir), options, [g for g, _, _ in forest.groups])
    assert info.value.groups == (table.column("state_group")[0].as_py(),)


def test_assign_trees_splits_giant_trees() -> None:
    # One root with 100 children, each with a child: 201 groups in one tree.
    groups = [1] + list(range(2, 102)) + list(range(102, 202))
    prevs = [None] + [1] * 100 + list(range(2, 102))
    topo = pa.table([pa.array(groups, pa.int64()), pa.array(prevs, pa.int64()),
                     pa.array([True] * len(groups))], schema=TOPOLOGY_SCHEMA)
    trees = assign_trees(topo, split_threshold=50)
    pieces = set(trees.column("piece").to_pylist())
    assert len(pieces) == 5
    rows = trees.to_pylist()
    # The root is copied into every piece and wanted in exactly one.
    root_rows = [r for r in rows if r["state_group"] == 1]
    assert len(root_rows) == 5 and sum(r["wanted"] for r in root_rows) == 1
    # A child and its grandchild stay in the same piece.
    piece_of = {r["state_group"]: r["piece"] for r in rows if r["state_group"] != 1}
    assert all(piece_of[g + 100] == piece_of[g] for g in range(2, 102))
    assert {r["root"] for r in rows} == {1}


def test_expand_partition_handles_trees_across_batches(forest: Forest) -> None:
    from streamrep.spark.local import TreeRows, build_topology

    tables = forest.tables()
    trees = assign_trees(build_topology(tables, ReconstructOptions("unused")), split_threshold=30)
    ordered = TreeRows(trees, tables["state_groups_state"]).take(0, 10**9)
    # Small, uneven record batches: trees straddle batch boundaries.
    batches = ordered.to_batches(max_chunksize=37)
    out = pa.Table.from_batches(list(expand_partition(iter(batches), batch_rows=100)))
    got: dict[int, dict[tuple[str, str], str]] = {}
    for g, t, s, e in zip(*(out.column(c).to_pylist() for c in out.column_names)):
        assert (t, s) not in got.setdefault(g, {})
        got[g][(t, s)] = e
    assert got == expected(forest, False)


def test_several_edges_for_one_group_is_corrupt(forest: Forest, tmp_path: Path) -> None:
    edges = list(forest.edges) + [(forest.edges[3][0], forest.groups[0][0])]
    Forest(forest.groups, edges, forest.state).write_parquet(str(tmp_path / "in"))
    with pytest.raises(StateCorruptionError, match="several prev groups"):
        reconstruct_local(Source(input_dir=str(tmp_path / "in")), ReconstructOptions(str(tmp_path / "out")))


def test_output_directory_is_not_clobbered(parquet_dir: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ConfigError):
        reconstruct_local(Source(input_dir=parquet_dir), ReconstructOptions(str(out)))
    assert (out / "keep.txt").exists()


def test_missing_table_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="state_groups"):
        reconstruct_local(Source(input_dir=str(tmp_path)), ReconstructOptions(str(tmp_path / "out")))


# --- databases: export and the single-process mode over a database ---------------


def test_export_and_reconstruct_from_database(forest: Forest, db_url: str, tmp_path: Path) -> None:
    load_database(db_url, forest)
    report = export_tables(db_url, str(tmp_path / "export"))
    assert report["state_groups_state"][0] == len(forest.state)
    exported = read_table(str(tmp_path / "export"), "state_groups_state")
    assert sorted(exported.to_pylist(), key=lambda r: tuple(r.values())) == sorted(
        (dict(zip(SCHEMAS["state_groups_state"].names, r)) for r in forest.state),
        key=lambda r: tuple(r.values()))
    out = str(tmp_path / "out")
    reconstruct_local(Source(input_dir=str(tmp_path / "export")), ReconstructOptions(out))
    assert output(out, forest, False) == expected(forest, False)

    out = str(tmp_path / "direct")
    result = reconstruct_local(Source(db_url=db_url), ReconstructOptions(out, digest=True, verify=20))
    assert result.verified == 20
    assert output(out, forest, True) == expected(forest, True)
    sample = [g for g, _, _ in forest.groups][::97]
    assert walk_states_db(db_url, sample) == forest.brute_force(sample)


def test_cli_single_process_and_export(forest: Forest, sqlite_url: str, tmp_path: Path) -> None:
    load_database(sqlite_url, forest)
    runner = CliRunner()
    res = runner.invoke(main, ["state", "export", "--db", sqlite_url, "--out", str(tmp_path / "exp")])
    assert res.exit_code == 0, res.output
    assert f"state_groups_state: {len(forest.state)} rows" in res.output
    out = str(tmp_path / "out")
    res = runner.invoke(main, ["spark", "reconstruct", "--single-process", "--input", str(tmp_path / "exp"),
                               "--output", out, "--verify", "10"])
    assert res.exit_code == 0, res.output
    assert "verified 10 groups" in res.output
    assert output(out, forest, False) == expected(forest, False)
    res = runner.invoke(main, ["spark", "reconstruct", "--single-process", "--db", sqlite_url,
                               "--output", out])
    assert res.exit_code == 2 and "not empty" in res.output


def test_cli_reports_corruption(forest: Forest, tmp_path: Path) -> None:
    corrupt(forest, "missing").write_parquet(str(tmp_path / "in"))
    res = CliRunner().invoke(main, ["spark", "reconstruct", "--single-process", "--input",
                                    str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    assert res.exit_code == ExitCode.STATE_CORRUPT
    assert "999999999" in res.output and "Traceback" not in res.output


def test_jdbc_url_conversions() -> None:
    from streamrep.spark.job import jdbc_connection, libpq_url

    url, props = jdbc_connection(
        "postgresql://alice:s%40cret@db.example:5433/synapse?application_name=x&options=-csearch_path%3Ds1")
    assert url == "jdbc:postgresql://db.example:5433/synapse"
    assert props == {"driver": "org.postgresql.Driver", "user": "alice", "password": "s@cret",
                     "ApplicationName": "x", "options": "-csearch_path=s1"}
    assert libpq_url("jdbc:postgresql://db:5432/synapse?user=bob&password=p%40w") == \
        "postgresql://bob:p%40w@db:5432/synapse"
    assert libpq_url("postgresql://db/x") == "postgresql://db/x"
    with pytest.raises(ConfigError):
        jdbc_connection("mysql://db/x")
