"""State compression without Spark: the single-process job and applying its change set.

Every check is against a brute-force walk of every group's chain: after
compressing (and applying), each group's full state is what it was, rows fall
and no chain exceeds the bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner

from streamrep.cli import main
from streamrep.errors import StateCorruptionError
from streamrep.spark import Source
from streamrep.spark.compress import CompressOptions
from streamrep.spark import compress_apply
from streamrep.spark.compress_apply import apply_compression
from streamrep.spark.compress_local import compress_local
from streamrep.spark.tables import read_db_table
from streamrep.spark.manifest import write_manifest
from support.state_forest import Forest, corrupt_forest, load_database, make_forest


@pytest.fixture(scope="module")
def forest() -> Forest:
    # Snapshots, chains up to 100 hops, forks, a fan-out of 150 children; a
    # few groups no event references.
    made = make_forest(1500, seed=5, rooms=4, fan_out=150)
    made.event_to_state_groups = [(e, g) for e, g in made.event_to_state_groups if g % 97 != 0]
    return made


@pytest.fixture(scope="module")
def parquet_dir(forest: Forest, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("parquet"))
    forest.write_parquet(path)
    return path


def compressed_forest(forest: Forest, output: str) -> Forest:
    """*forest* with its edges and delta rows replaced by the job's new tables."""
    edges = ds.dataset(os.path.join(output, "state_group_edges"), format="parquet").to_table()
    state = ds.dataset(os.path.join(output, "state_groups_state"), format="parquet").to_table()
    kept = set(edges.column("state_group").to_pylist()) | set(state.column("state_group").to_pylist())
    return Forest(
        groups=[g for g in forest.groups if g[0] in kept or not _deleted(output, g[0])],
        edges=list(zip(*(edges.column(c).to_pylist() for c in ("state_group", "prev_state_group")))),
        state=list(zip(*(state.column(c).to_pylist()
                         for c in ("state_group", "room_id", "type", "state_key", "event_id")))),
        event_to_state_groups=forest.event_to_state_groups,
    )


def _deleted(output: str, group: int) -> bool:
    changes = ds.dataset(os.path.join(output, "changes"), format="parquet").to_table()
    deleted = {g for g, a in zip(changes.column("state_group").to_pylist(), changes.column("action").to_pylist())
               if a == "delete"}
    return group in deleted


def chain_lengths(forest: Forest) -> dict[int, int]:
    prev = dict(forest.edges)
    lengths = {}
    for g, _, _ in forest.groups:
        hops, v = 0, g
        while v in prev:
            v = prev[v]
            hops += 1
            assert hops <= len(forest.groups), f"cycle through {g}"
        lengths[g] = hops
    return lengths


@pytest.mark.parametrize("max_depth, split_threshold", [(100, 200_000), (10, 200_000), (100, 120)])
def test_compress_keeps_every_state(forest: Forest, parquet_dir: str, tmp_path: Path,
                                    max_depth: int, split_threshold: int) -> None:
    out = str(tmp_path / "out")
    result = compress_local(Source(input_dir=parquet_dir),
                            CompressOptions(out, max_depth=max_depth, split_threshold=split_threshold))
    after = compressed_forest(forest, out)
    assert after.brute_force() == forest.brute_force()
    assert len(after.state) == result.rows_after and result.rows_before == len(forest.state)
    if max_depth >= result.max_depth_before:
        assert result.rows_after < result.rows_before
    # A bound below the input's own chains costs rows, but holds.
    assert max(chain_lengths(after).values()) == result.max_depth_after <= max_depth
    assert result.verified_groups == result.changed_groups > 0


@pytest.mark.parametrize("split_threshold", [200_000, 120])
@pytest.mark.parametrize("from_db", [False, True])
def test_buckets_of_units_give_the_same_output(forest: Forest, parquet_dir: str, tmp_path: Path,
                                               split_threshold: int, from_db: bool) -> None:
    if from_db:
        url = f"sqlite:///{tmp_path}/state.db"
        load_database(url, forest)
        source = Source(db_url=url)
    else:
        source = Source(input_dir=parquet_dir)
    outputs = {}
    for bucket_groups in (0, 300):
        out = str(tmp_path / f"out{bucket_groups}")
        options = CompressOptions(out, split_threshold=split_threshold, find_unreferenced=True)
        result = compress_local(source, options, bucket_groups=bucket_groups)
        assert ("spill" in result.timings) == (bucket_groups == 300)
        assert not os.path.exists(os.path.join(out, "_spill"))
        tables = {name: sorted(ds.dataset(os.path.join(out, name), format="parquet").to_table().to_pylist(),
                               key=lambda r: sorted((k, str(v)) for k, v in r.items()))
                  for name in ("state_group_edges", "state_groups_state", "changes", "change_rows")}
        outputs[bucket_groups] = (tables, result.rows_after, result.changed_groups)
    assert outputs[0] == outputs[300]
    assert outputs[300][2] > 0


def test_find_unreferenced(forest: Forest, parquet_dir: str, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    result = compress_local(Source(input_dir=parquet_dir), CompressOptions(out, find_unreferenced=True))
    referenced = {g for _, g in forest.event_to_state_groups}
    after = compressed_forest(forest, out)
    kept = {g for g, _, _ in after.groups}
    assert referenced <= kept
    deleted = {g for g, _, _ in forest.groups} - kept
    assert len(deleted) == result.unreferenced_groups > 0
    assert not deleted & referenced
    truth = forest.brute_force(sorted(referenced))
    assert after.brute_force(sorted(referenced)) == truth


@pytest.mark.parametrize("kind, named", [("cycle", "cycle"), ("missing", "888888888"),
                                          ("dupkey", "more than once")])
def test_corrupt_input_is_refused_naming_groups(forest: Forest, tmp_path: Path, kind: str, named: str) -> None:
    bad = corrupt_forest(forest, kind, at=20, missing_group=888_888_888)
    bad.write_parquet(str(tmp_path / "in"))
    with pytest.raises(StateCorruptionError, match=named) as info:
        compress_local(Source(input_dir=str(tmp_path / "in")), CompressOptions(str(tmp_path / "out")))
    if kind == "dupkey":
        assert str(forest.state[20][0]) in str(info.value)
    if kind == "cycle":
        assert str(forest.edges[20][0]) in str(info.value)


def test_cli_compress_single_process(parquet_dir: str, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    result = CliRunner().invoke(main, ["spark", "compress", "--input", parquet_dir, "--output", out,
                                       "--single-process", "--max-depth", "50"])
    assert result.exit_code == 0, result.output
    assert "longest chain 100 -> " in result.output
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    again = CliRunner().invoke(main, ["spark", "compress", "--input", parquet_dir, "--output", out,
                                      "--single-process"])
    assert again.exit_code == 2 and "not empty" in again.output


# --- applying to a database ---------------------------------------------------------


def db_forest(url: str) -> Forest:
    tables = {name: read_db_table(url, name) for name in
              ("state_groups", "state_group_edges", "state_groups_state", "event_to_state_groups")}
    rows = {name: list(zip(*(t.column(c).to_pylist() for c in t.column_names))) for name, t in tables.items()}
    return Forest(rows["state_groups"], rows["state_group_edges"], rows["state_groups_state"],
                  rows["event_to_state_groups"])


def compress_db(url: str, out: str, **kwargs: object) -> None:
    compress_local(Source(db_url=url), CompressOptions(out, **kwargs))  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def loaded_url(request: pytest.FixtureRequest, forest: Forest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/state.db"
    else:
        url = request.getfixturevalue("pg_url")
    load_database(url, forest)
    return url


@pytest.mark.parametrize("window_groups", [20_000, 100])
def test_apply_keeps_every_state_and_reruns_as_a_no_op(forest: Forest, loaded_url: str, tmp_path: Path,
                                                       window_groups: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # A window of 100 changed groups reads the change set a unit at a time.
    monkeypatch.setattr(compress_apply, "WINDOW_GROUPS", window_groups)
    out = str(tmp_path / "out")
    compress_db(loaded_url, out, find_unreferenced=True, split_threshold=120)
    report = apply_compression(loaded_url, out, batch_groups=200)
    after = db_forest(loaded_url)
    referenced = sorted({g for _, g in forest.event_to_state_groups})
    assert after.brute_force(referenced) == forest.brute_force(referenced)
    assert report.rows_before == len(forest.state) > report.rows_after == len(after.state)
    assert max(chain_lengths(after).values()) <= 100
    assert report.deleted > 0 and report.rewritten > 0 and report.verified == report.rewritten
    assert not report.skipped
    again = apply_compression(loaded_url, out)
    assert again.rewritten == 0 and again.deleted == 0
    assert again.already_rewritten == report.rewritten and again.already_deleted == report.deleted
    assert again.rows_after == report.rows_after


@pytest.mark.postgres
def test_group_gaining_a_child_is_skipped(forest: Forest, pg_url: str, tmp_path: Path) -> None:
    import psycopg2

    load_database(pg_url, forest)
    out = str(tmp_path / "out")
    compress_db(pg_url, out, find_unreferenced=True)
    changes = ds.dataset(os.path.join(out, "changes"), format="parquet").to_table().to_pylist()
    rewrite = next(c for c in changes if c["action"] == "rewrite" and c["new_prev"] is not None)
    delete = next(c for c in changes if c["action"] == "delete")
    # Meanwhile the server creates children of both (and references the deleted one).
    new_child, other_child = 900_000_001, 900_000_002
    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
        for child, parent in ((new_child, rewrite["state_group"]), (other_child, delete["state_group"])):
            cur.execute("INSERT INTO state_groups VALUES (%s, %s, %s)", (child, rewrite["room_id"], "$new"))
            cur.execute("INSERT INTO state_group_edges VALUES (%s, %s)", (child, parent))
            cur.execute("INSERT INTO state_groups_state VALUES (%s, %s, 'm.room.topic', '', '$t')",
                        (child, rewrite["room_id"]))
    conn.close()
    before = db_forest(pg_url).brute_force()
    report = apply_compression(pg_url, out)
    assert report.skipped.get("gained a child") == 1
    assert report.skipped.get("needed by a group that stays", 0) >= 1
    after = db_forest(pg_url)
    assert after.brute_force() .keys() >= {new_child, other_child}
    survivors = sorted({g for g, _, _ in after.groups})
    assert after.brute_force(survivors) == {g: before[g] for g in survivors}
    prev = dict(after.edges)
    assert prev[rewrite["state_group"]] == rewrite["old_prev"]


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_small_rooms_share_a_transaction_and_a_changed_group_is_skipped_alone(
        engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    small = make_forest(600, seed=7, rooms=12, fan_out=0, snapshot_share=0.08, initial_members=55,
                        member_pool=120)
    url = f"sqlite:///{tmp_path}/state.db" if engine == "sqlite" else request.getfixturevalue("pg_url")
    load_database(url, small)
    out = str(tmp_path / "out")
    compress_db(url, out)
    changes = ds.dataset(os.path.join(out, "changes"), format="parquet").to_table().to_pylist()
    assert len({c["unit"] for c in changes}) > 1 and len(changes) < 1000
    # Meanwhile something else gives a rewritten snapshot its new prev but
    # keeps all its rows: it differs from what compress read and from what
    # apply would write, and every full state stays the same.
    truth = small.brute_force()
    changed = next(c for c in changes if c["action"] == "rewrite" and c["old_prev"] is None
                   and c["new_prev"] is not None and truth[c["new_prev"]].keys() <= truth[c["state_group"]].keys())
    group = changed["state_group"]
    if engine == "sqlite":
        import sqlite3

        with sqlite3.connect(url[len("sqlite:///"):]) as lite:
            lite.execute("INSERT INTO state_group_edges VALUES (?, ?)", (group, changed["new_prev"]))
        lite.close()
    else:
        import psycopg2

        with psycopg2.connect(url) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO state_group_edges VALUES (%s, %s)", (group, changed["new_prev"]))
        conn.close()
    before = db_forest(url)
    report = apply_compression(url, out, batch_groups=1000)
    assert report.transactions == 1
    assert report.skipped == {"changed since compress": 1}
    assert report.rewritten == len(changes) - 1 == report.verified
    after = db_forest(url)
    assert after.brute_force() == before.brute_force()
    assert report.rows_after == len(after.state) < len(before.state)
    assert dict(after.edges)[group] == changed["new_prev"]
    assert sorted(r for r in after.state if r[0] == group) == sorted(r for r in before.state if r[0] == group)


def test_a_unit_that_fails_verification_stops_after_the_units_before_it(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from streamrep.errors import StateVerificationError

    small = make_forest(600, seed=7, rooms=12, fan_out=0, snapshot_share=0.08, initial_members=55,
                        member_pool=120)
    url = f"sqlite:///{tmp_path}/state.db"
    load_database(url, small)
    out = str(tmp_path / "out")
    compress_db(url, out)
    path = next(p for p in Path(out, "changes").glob("*.parquet"))
    changes = pq.read_table(path)
    units = sorted(set(changes.column("unit").to_pylist()))
    bad_unit = units[len(units) // 2]
    # The job's digest of one group of a middle unit is wrong.
    rows = changes.to_pylist()
    bad = next(r for r in rows if r["unit"] == bad_unit and r["action"] == "rewrite")
    bad["state_digest"] = "0" * 64
    pq.write_table(type(changes).from_pylist(rows, schema=changes.schema), path)
    with pytest.raises(StateVerificationError, match=str(bad["state_group"])):
        apply_compression(url, out, batch_groups=1000)
    prev = dict(db_forest(url).edges)
    for r in rows:
        assert prev.get(r["state_group"]) == (r["new_prev"] if r["unit"] < bad_unit else r["old_prev"])


@pytest.mark.postgres
def test_apply_killed_mid_way_and_rerun_ends_consistent(forest: Forest, pg_url: str, tmp_path: Path) -> None:
    load_database(pg_url, forest)
    out = str(tmp_path / "out")
    compress_db(pg_url, out, find_unreferenced=True)
    before = forest.brute_force(sorted({g for _, g in forest.event_to_state_groups}))
    # SIGKILL inside the fourth transaction, after its writes, before its commit.
    script = textwrap.dedent(f"""
        import os, signal
        from streamrep.spark import compress_apply
        commits = 0
        original = compress_apply._Store.commit
        def commit(self):
            global commits
            commits += 1
            if commits == 4:
                os.kill(os.getpid(), signal.SIGKILL)
            original(self)
        compress_apply._Store.commit = commit
        compress_apply.apply_compression({pg_url!r}, {out!r}, batch_groups=50)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    middle = db_forest(pg_url)
    assert middle.brute_force(sorted(before)) == before
    report = apply_compression(pg_url, out, batch_groups=50)
    assert report.already_rewritten > 0 and report.rewritten > 0
    after = db_forest(pg_url)
    assert after.brute_force(sorted(before)) == before
    assert max(chain_lengths(after).values()) <= 100
    assert report.rows_after == len(after.state) < len(forest.state)


def test_cli_apply_compression(forest: Forest, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    load_database(url, forest)
    out = str(tmp_path / "out")
    runner = CliRunner()
    result = runner.invoke(main, ["spark", "compress", "--db", url, "--output", out, "--single-process"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["state", "apply-compression", "--db", url, "--changes", out])
    assert result.exit_code == 0, result.output
    assert f"state_groups_state {len(forest.state)} -> " in result.output
    assert db_forest(url).brute_force() == forest.brute_force()
    # A folder that is no change set has no manifest: refused before anything else.
    missing = runner.invoke(main, ["state", "apply-compression", "--db", url, "--changes", str(tmp_path)])
    assert missing.exit_code == 17 and "has no MANIFEST.json" in missing.output


def test_undo_puts_the_tables_back(forest: Forest, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    load_database(url, forest)
    out = str(tmp_path / "out")
    compress_db(url, out, find_unreferenced=True)
    write_manifest(out)  # as `spark compress` does last
    done = apply_compression(url, out, batch_groups=100)
    assert done.deleted > 0 and done.rewritten > 0
    result = CliRunner().invoke(main, ["state", "apply-compression", "--db", url, "--changes", out,
                                       "--undo", "--batch-groups", "100"])
    assert result.exit_code == 0, result.output
    assert f"restored {done.deleted} (0 already)" in result.output
    back = db_forest(url)
    assert sorted(back.groups) == sorted(forest.groups)
    assert sorted(back.edges) == sorted(forest.edges)
    assert sorted(back.state) == sorted(forest.state)
    again = apply_compression(url, out, undo=True)
    assert again.already_restored == done.deleted and again.already_rewritten == done.rewritten


def test_apply_on_streamrep_own_schema(forest: Forest, tmp_path: Path) -> None:
    import sqlite3

    from streamrep.events.schema import MIGRATIONS

    path = tmp_path / "streamrep.db"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0].sqlite:
        conn.execute(statement)
    rows = {"state_groups": forest.groups, "state_group_edges": forest.edges,
            "state_groups_state": forest.state, "event_to_state_groups": forest.event_to_state_groups}
    for table, data in rows.items():
        marks = ",".join("?" * len(data[0]))
        conn.executemany(f"INSERT INTO {table} VALUES ({marks})", data)
    conn.commit()
    conn.close()
    url = f"sqlite:///{path}"
    out = str(tmp_path / "out")
    compress_db(url, out, find_unreferenced=True)
    report = apply_compression(url, out)
    assert report.rewritten > 0 and report.deleted > 0 and not report.skipped
    referenced = sorted({g for _, g in forest.event_to_state_groups})
    after = db_forest(url)
    assert after.brute_force(referenced) == forest.brute_force(referenced)
    assert len(after.state) < len(forest.state)


#: Data segment limit for compressing the million-row room: the interned
#: pipeline stays well below it, the pipeline that held every delta row's
#: strings needed about 1.1 GiB of it on the same room.
_MILLION_ROW_LIMIT = 800 << 20

_LIMITED_COMPRESS = """
import resource, sys
import pyarrow as pa
pa.set_cpu_count(2)
pa.set_io_thread_count(2)
resource.setrlimit(resource.RLIMIT_DATA, ({limit}, {limit}))
from streamrep.spark import Source
from streamrep.spark.compress import CompressOptions
from streamrep.spark.compress_local import compress_local
result = compress_local(Source(input_dir=sys.argv[1]), CompressOptions(sys.argv[2]))
print(result.groups, result.rows_before, result.rows_after, result.max_depth_after, result.verified_groups)
"""


def test_a_million_row_room_compresses_under_a_memory_limit(tmp_path: Path) -> None:
    """One room of 1.17 million delta rows (snapshots of 10,000 members every
    100 groups) compressed in a process whose data segment is capped with
    setrlimit: memory follows the interned rows and one path's state."""
    from support.big_room import Shape, write_parquet

    counts = write_parquet(Shape(members=10_000, groups=10_000), str(tmp_path / "room"))
    assert counts["state_groups_state"] > 1_000_000
    env = dict(os.environ, MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED_COMPRESS.format(limit=_MILLION_ROW_LIMIT), str(tmp_path / "room"),
         str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    groups, before, after, depth, verified = map(int, done.stdout.split())
    assert (groups, before) == (10_000, counts["state_groups_state"])
    # Snapshots became deltas; every changed group was verified; chains stay bounded.
    assert after < before // 10 and verified > 0 and depth <= 99


def test_sorted_rows_are_interned_in_runs_of_whole_units() -> None:
    """The Spark workers' stream: rows sorted by unit and group, cut into runs
    of whole units whatever the record batches, each decoding to its rows."""
    import numpy as np
    import pyarrow as pa

    from streamrep.spark.interned import SortedRowInterner

    rows = [(0, 1, "t", "a", "$1"), (0, 1, "t", "b", "$2"), (0, 2, None, None, None),
            (1, 3, "t", "a", "$3"), (1, 4, "u", "", "$1"), (1, 4, "t", "b", "$2"),
            (1, 5, "t", "a", "$4"), (2, 6, "t", "c", "$5"), (2, 7, "t", "a", "$1")]
    table = pa.table({name: [r[i] for r in rows] for i, name in
                      enumerate(["unit", "state_group", "type", "state_key", "event_id"])})
    stream = SortedRowInterner(("unit", "state_group"), ["unit", "state_group"])
    runs = list(stream.runs(iter(table.to_batches(max_chunksize=2)), run_rows=2))
    got, units_seen = [], []
    for heads, slots in runs:
        units = heads.column("unit").to_pylist()
        units_seen.append(sorted(set(units)))
        groups = heads.column("state_group").to_pylist()
        for s in range(len(groups)):
            lo, hi = int(slots.offsets[s]), int(slots.offsets[s + 1])
            if lo == hi:
                got.append((units[s], groups[s], None, None, None))
            for k, e in zip(slots.keys[lo:hi].tolist(), slots.events[lo:hi].tolist()):
                got.append((units[s], groups[s], slots.types[k // slots.stride].as_py(),
                            slots.state_keys[k % slots.stride].as_py(), slots.event_ids[e].as_py()))
        assert list(slots.types.to_pylist()) == sorted(slots.types.to_pylist())
        assert np.all(np.diff(slots.offsets) >= 0)
    assert got == rows
    # Runs end at unit boundaries only, and a unit is never split.
    assert len(runs) > 1 and sum(len(u) for u in units_seen) == 3
