"""A room split into shares by ``--split-threshold`` keeps its compression.

Each share is a contiguous run of the room's trees and its top becomes a delta
over a copy of the previous share's top, so the rows after compressing a room
split into k shares stay close to the same room compressed whole. Every check
compares every group's full state (by digest, walked by reconstruction) with
the input's, and the longest chain of the new tables with the bound.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from streamrep.cli import main
from streamrep.spark import Source
from streamrep.spark import compress_apply
from streamrep.spark.compress import (
    UNIT_TOPOLOGY_SCHEMA,
    CompressOptions,
    CompressResult,
    assign_units,
    chain_period,
)
from streamrep.spark.compress_apply import apply_compression
from streamrep.spark.compress_local import compress_local, load_compress_tables, unit_topology
from streamrep.spark.local import reconstruct_local
from streamrep.spark.options import ReconstructOptions
from streamrep.spark.spill import group_row_counts
from support import big_room
from support.state_forest import load_database, make_forest
from test_compress_local import chain_lengths, compressed_forest, db_forest


def _write_forest(directory: str) -> int:
    # Multi-key deltas over a state of about 2,000 members, forks, a fan-out.
    forest = make_forest(1200, seed=1, rooms=1, fan_out=100, initial_members=2000)
    forest.write_parquet(directory)
    return len(forest.groups)


def _write_big_room(directory: str) -> int:
    # Synapse's shape: one-row deltas, a snapshot of 20,000 members every 100.
    big_room.write_parquet(big_room.Shape(members=20_000, groups=1500), directory)
    return 1500


#: Shape -> (writer, rows after compressing split into k = 2..5 shares, at
#: most this much more than the room whole). The cost of a share is the delta
#: of its top over the previous top: the keys that changed over a share,
#: small next to a big room's snapshots, more next to the forest's.
SHAPES: dict[str, tuple[Callable[[str], int], float]] = {
    "forest": (_write_forest, 0.25),
    "big_room": (_write_big_room, 0.05),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shape(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    write, slack = SHAPES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    groups = write(str(folder / "in"))
    whole = compress_local(Source(input_dir=str(folder / "in")), CompressOptions(str(folder / "whole")))
    yield {"name": request.param, "input": str(folder / "in"), "groups": groups, "slack": slack,
           "whole": whole, "digests": digests(str(folder / "in"), str(folder / "digests"))}


def digests(tables: str, out: str) -> dict[int, str]:
    """Every group's digest of its full state, walked by reconstruction."""
    reconstruct_local(Source(input_dir=tables), ReconstructOptions(output=out, digest=True, overwrite=True))
    found = ds.dataset(out, format="parquet").to_table()
    return dict(zip(found.column("state_group").to_pylist(), found.column("state_digest").to_pylist()))


def compressed_tables(shape: dict[str, Any], out: str, folder: str) -> str:
    """The input's state_groups with the job's new edges and delta rows."""
    os.makedirs(folder)
    for name, where in (("state_groups", shape["input"]), ("state_group_edges", out),
                        ("state_groups_state", out)):
        found = [p for p in (os.path.join(where, name), os.path.join(where, f"{name}.parquet"))
                 if os.path.exists(p)]
        table = ds.dataset(found[0], format="parquet").to_table()
        pq.write_table(table, os.path.join(folder, f"{name}.parquet"))
    return folder


def longest_chain(folder: str) -> int:
    edges = pq.read_table(os.path.join(folder, "state_group_edges.parquet")).to_pydict()
    prev = dict(zip(edges["state_group"], edges["prev_state_group"]))
    depth: dict[int, int] = {}

    def of(g: int) -> int:
        path = []
        while g in prev and g not in depth:
            path.append(g)
            g = prev[g]
        d = depth.get(g, 0)
        for h in reversed(path):
            d += 1
            depth[h] = d
        return d

    return max((of(g) for g in prev), default=0)


def shares(input_dir: str, threshold: int, max_depth: int = 99) -> pa.Table:
    topology = unit_topology(load_compress_tables(Source(input_dir=input_dir), False, with_state=False))
    return assign_units(topology, threshold, max_depth)


def check_split(shape: dict[str, Any], k: int, result: CompressResult, out: str, tmp: Path,
                max_depth: int = 99) -> None:
    whole: CompressResult = shape["whole"]
    assert result.rows_before == whole.rows_before and result.groups == whole.groups == shape["groups"]
    assert result.rows_after <= whole.rows_after * (1 + shape["slack"]), (k, result.rows_after, whole.rows_after)
    tables = compressed_tables(shape, out, str(tmp / "tables"))
    assert digests(tables, str(tmp / "digests")) == shape["digests"]
    assert longest_chain(tables) == result.max_depth_after <= max_depth


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_a_split_room_keeps_its_compression(shape: dict[str, Any], k: int, tmp_path: Path) -> None:
    threshold = -(-shape["groups"] // k)
    units = shares(shape["input"], threshold)
    home = units.filter(units.column("home"))
    assert len(set(home.column("unit").to_pylist())) == k
    # Contiguous shares: each unit's groups come after the previous unit's top.
    chain = units.column("chain").to_pylist()
    assert sorted(set(chain)) == list(range(k))
    out = str(tmp_path / "out")
    result = compress_local(Source(input_dir=shape["input"]), CompressOptions(out, split_threshold=threshold))
    check_split(shape, k, result, out, tmp_path)


def test_chains_restart_and_tight_bounds_hold(shape: dict[str, Any], tmp_path: Path) -> None:
    # max_depth 12: a chain restarts (a snapshot) every 3 shares, and every
    # share still keeps its groups within 12 hops.
    assert chain_period(12) == 3 and chain_period(1) == 1 and chain_period(8) == 2
    threshold = -(-shape["groups"] // 7)
    chain = shares(shape["input"], threshold, 12).column("chain").to_pylist()
    assert max(chain) == 2 and chain.count(0) > 1
    out = str(tmp_path / "out")
    result = compress_local(Source(input_dir=shape["input"]),
                            CompressOptions(out, max_depth=12, split_threshold=threshold))
    # Each restart costs a snapshot, so no bound on rows beyond the input's.
    assert result.rows_after < result.rows_before
    tables = compressed_tables(shape, out, str(tmp_path / "tables"))
    assert digests(tables, str(tmp_path / "digests")) == shape["digests"]
    assert longest_chain(tables) == result.max_depth_after <= 12
    # The change set's depths count each copied top at its bound.
    changes = ds.dataset(os.path.join(out, "changes"), format="parquet").to_table()
    assert 0 < max(changes.column("depth").to_pylist()) <= 12


@pytest.mark.parametrize("reverse", [False, True])
def test_compress_apply_reconstruct_a_split_room_on_sqlite(tmp_path: Path, reverse: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    forest = make_forest(900, seed=3, rooms=2, fan_out=60, initial_members=300)
    # Some groups no event references: deleted unless a share needs them.
    forest.event_to_state_groups = [(e, g) for e, g in forest.event_to_state_groups if g % 7 != 0]
    url = f"sqlite:///{tmp_path}/state.db"
    load_database(url, forest)
    runner = CliRunner()

    def digest_of_db(name: str) -> dict[int, str]:
        done = runner.invoke(main, ["spark", "reconstruct", "--single-process", "--db", url, "--output",
                                    str(tmp_path / name), "--digest", "--referenced-by-events"])
        assert done.exit_code == 0, done.output
        table = ds.dataset(str(tmp_path / name), format="parquet").to_table()
        return dict(zip(table.column("state_group").to_pylist(), table.column("state_digest").to_pylist()))

    before = digest_of_db("before")
    out = str(tmp_path / "changes")
    done = runner.invoke(main, ["spark", "compress", "--single-process", "--db", url, "--output", out,
                                "--split-threshold", "150", "--find-unreferenced"])
    assert done.exit_code == 0, done.output
    chained = ds.dataset(os.path.join(out, "changes"), format="parquet").to_table()
    assert len(set(chained.column("unit").to_pylist())) >= 6
    if reverse:
        # The shares applied last first, a unit per window.
        monkeypatch.setattr(compress_apply, "WINDOW_GROUPS", 1)
        windows = compress_apply._unit_windows
        monkeypatch.setattr(compress_apply, "_unit_windows", lambda d, w: windows(d, w)[::-1])
    report = apply_compression(url, out, batch_groups=100)
    assert not report.skipped and report.rewritten > 0 and report.deleted > 0
    assert report.verified == report.rewritten
    assert digest_of_db("after") == before
    after = db_forest(url)
    assert max(chain_lengths(after).values()) <= 99
    referenced = sorted({g for _, g in forest.event_to_state_groups})
    assert after.brute_force(referenced) == forest.brute_force(referenced)
    again = apply_compression(url, out)
    assert again.rewritten == 0 and again.already_rewritten == report.rewritten and not again.skipped


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
def test_spark_split_room_keeps_its_compression(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from streamrep.spark.compress_job import compress_spark
    from support.spark import local_session

    folder = tmp_path / "big"
    groups = _write_big_room(str(folder / "in"))
    shape = {"input": str(folder / "in"), "groups": groups, "slack": SHAPES["big_room"][1],
             "whole": compress_local(Source(input_dir=str(folder / "in")), CompressOptions(str(folder / "whole"))),
             "digests": digests(str(folder / "in"), str(folder / "digests"))}
    # Split by groups, then by the rows a worker holds (counted by the job).
    by_rows = -(-(shape["whole"].rows_before + groups) // 3)
    settings = {"groups": CompressOptions("", split_threshold=-(-groups // 3)),
                "rows": CompressOptions("", unit_rows=by_rows)}
    session = local_session()
    try:
        results = {name: compress_spark(session, Source(input_dir=shape["input"]),
                                        dataclasses.replace(options, output=str(tmp_path / name / "out")))
                   for name, options in settings.items()}
    finally:
        session.stop()
    for name, options in settings.items():
        out = str(tmp_path / name / "out")
        check_split(shape, 3, results[name], out, tmp_path / name)
        changes = ds.dataset(os.path.join(out, "changes"), format="parquet").to_table()
        assert len(set(changes.column("unit").to_pylist())) >= 3
        local = compress_local(Source(input_dir=shape["input"]),
                               dataclasses.replace(options, output=str(tmp_path / name / "local")))
        assert ((results[name].rows_after, results[name].max_depth_after)
                == (local.rows_after, local.max_depth_after))


# --- rooms split by the rows a worker holds ---------------------------------------


def _chains(trees: list[tuple[int, int]]) -> pa.Table:
    """The topology of one room of chains: per tree, its groups and the delta
    rows of its root (the others have one row each)."""
    groups, prevs, rows = [], [], []
    for size, root_rows in trees:
        first = len(groups) + 1
        for g in range(first, first + size):
            groups.append(g)
            prevs.append(None if g == first else g - 1)
            rows.append(root_rows if g == first else 1)
    n = len(groups)
    return pa.table([pa.array(groups, pa.int64()), pa.array(prevs, pa.int64()), pa.array([True] * n),
                     pa.array(["!r"] * n), pa.array([f"$e{g}" for g in groups]), pa.array([True] * n),
                     pa.array(rows, pa.int64())], schema=UNIT_TOPOLOGY_SCHEMA)


def unit_loads(units: pa.Table, topology: pa.Table) -> dict[int, int]:
    """Rows each unit hands its worker: its groups' delta rows and one per
    group, its copied top's included."""
    rows = dict(zip(topology.column("state_group").to_pylist(), topology.column("delta_rows").to_pylist()))
    loads: dict[int, int] = {}
    for unit, group in zip(units.column("unit").to_pylist(), units.column("state_group").to_pylist()):
        loads[unit] = loads.get(unit, 0) + (rows[group] or 0) + 1
    return loads


def test_a_room_is_split_by_the_rows_a_worker_holds() -> None:
    # Four trees with snapshots of 1,000 rows, then four of 10: by groups,
    # two shares would put every big snapshot in the first.
    topology = _chains([(10, 1000)] * 4 + [(10, 10)] * 4)
    whole = assign_units(topology)
    assert set(whole.column("unit").to_pylist()) == {0}
    total = sum(unit_loads(whole, topology).values())
    units = assign_units(topology, unit_rows=2500)
    loads = unit_loads(units, topology)
    assert len(loads) >= -(-total // 2500) and max(loads.values()) <= 2500
    # Contiguous runs of whole trees, linked into a chain.
    home = units.filter(units.column("home"))
    by_unit: dict[int, list[int]] = {}
    for unit, group in zip(home.column("unit").to_pylist(), home.column("state_group").to_pylist()):
        by_unit.setdefault(unit, []).append(group)
    spans = sorted((min(g), max(g)) for g in by_unit.values())
    assert all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:]))
    assert all((lo - 1) % 10 == 0 and hi % 10 == 0 for lo, hi in spans)
    assert sorted(set(units.column("chain").to_pylist())) == list(range(len(loads)))
    # Without row counts, by groups as before.
    unknown = topology.set_column(6, "delta_rows", pa.nulls(topology.num_rows, pa.int64()))
    assert set(assign_units(unknown, unit_rows=2500).column("unit").to_pylist()) == {0}


def test_shares_are_balanced_by_rows() -> None:
    # Snapshots growing from 100 to 2,000 rows: shares of equal rows hold
    # more trees early than late.
    trees = [(20, 100 * (i + 1)) for i in range(20)]
    topology = _chains(trees)
    total = sum(unit_loads(assign_units(topology), topology).values())
    bound = -(-total // 4)
    units = assign_units(topology, unit_rows=bound)
    assert max(unit_loads(units, topology).values()) <= bound
    home = units.filter(units.column("home"))
    loads = unit_loads(home, topology)
    assert len(loads) >= 4
    # Within one tree of each other (the copied tops aside).
    biggest_tree = 2000 + 19 * 2
    assert max(loads.values()) - min(loads.values()) <= biggest_tree
    sizes = [n for _, n in sorted(zip(*np.unique(home.column("unit").to_numpy(), return_counts=True)))]
    assert sizes[0] > sizes[-1]
    # A tree bigger than the bound on its own stays whole, in a share of its own.
    lone = assign_units(_chains([(5, 10), (5, 5000), (5, 10)]), unit_rows=1000)
    assert max(unit_loads(lone, _chains([(5, 10), (5, 5000), (5, 10)])).values()) > 1000
    assert len(set(lone.column("unit").to_pylist())) == 3


@pytest.mark.parametrize("k", [3])
def test_a_room_split_by_rows_keeps_its_compression(shape: dict[str, Any], k: int, tmp_path: Path) -> None:
    whole: CompressResult = shape["whole"]
    bound = -(-(whole.rows_before + shape["groups"]) // k)
    out = str(tmp_path / "out")
    result = compress_local(Source(input_dir=shape["input"]), CompressOptions(out, unit_rows=bound))
    changes = ds.dataset(os.path.join(out, "changes"), format="parquet").to_table()
    assert len(set(changes.column("unit").to_pylist())) >= k
    check_split(shape, k, result, out, tmp_path)


@pytest.mark.parametrize("where", ["parquet", "csv", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_each_groups_delta_rows_are_counted_wherever_the_tables_are(
        where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """group_row_counts, which the split by rows reads: from files in a pass over
    ``state_group``, from a database by its own ``GROUP BY``. A group without
    rows counts 0; rows of groups not asked about are left out."""
    forest = make_forest(300, seed=5, rooms=4)
    if where in ("parquet", "csv"):
        getattr(forest, f"write_{where}")(str(tmp_path / "in"))
        source = Source(input_dir=str(tmp_path / "in"))
    else:
        url = (f"sqlite:///{tmp_path}/state.db" if where == "sqlite"
               else request.getfixturevalue("pg_url"))
        load_database(url, forest)
        source = Source(db_url=url)
    per_group: dict[int, int] = {}
    for group, *_ in forest.state:
        per_group[group] = per_group.get(group, 0) + 1
    asked = sorted([g for g, *_ in forest.groups][::2] + [10**9])  # one group that does not exist
    counts = group_row_counts(source, np.array(asked, np.int64))
    assert counts.tolist() == [per_group.get(g, 0) for g in asked]
    assert counts.sum() < len(forest.state)  # the other half's rows were not counted
    assert group_row_counts(source, np.array([], np.int64)).tolist() == []
