"""State compression benchmarks: the planner core (compiled vs pure) and, on the
same small forest in PostgreSQL, the reference compressor against
``streamrep spark compress --single-process`` plus ``state apply-compression``.

    python -m pytest bench/test_bench_compress.py --benchmark-only -s

The reference side needs ``synapse-auto-compressor`` (0.1.2) in its own
virtualenv, named by ``STREAMREP_COMPRESSOR_PYTHON``; without it that case is
skipped. Each side-by-side case records rows left and the longest chain in
``extra_info``. The full-size comparison (200,000 groups, Spark included) is
``bench/compress_state_forest.py``.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from array import array
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from support.impls import core_module
from support.state_forest import Forest, make_forest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compress_state_forest import MAX_CHAIN_SQL, Databases, default_compressor_python  # noqa: E402


def planner_input(groups: int = 10_000) -> tuple[Any, ...]:
    """A forest of rooms of chains with snapshots, expanded into full states."""
    from support.impls import IMPLEMENTATIONS

    forest = make_forest(groups, seed=4, rooms=groups // 500, snapshot_share=0.05)
    ids = sorted(g for g, _, _ in forest.groups)
    room_of = {g: r for g, r, _ in forest.groups}
    ids.sort(key=lambda g: (room_of[g], g))
    index = {g: i for i, g in enumerate(ids)}
    prev = dict(forest.edges)
    keys: dict[tuple[str, str], int] = {}
    rows: dict[int, list[tuple[int, int]]] = {}
    for g, _, t, s, e in forest.state:
        rows.setdefault(g, []).append((keys.setdefault((t, s), len(keys)), int(e[3:].split(":")[0])))
    gids, prevs, offsets, dkeys, devents = (array("q") for _ in range(5))
    offsets.append(0)
    for g in ids:
        gids.append(index[g])
        prevs.append(index[prev[g]] if g in prev else -1)
        for k, e in sorted(rows.get(g, [])):
            dkeys.append(k)
            devents.append(e)
        offsets.append(len(dkeys))
    state = core_module("state", IMPLEMENTATIONS[0])
    out_groups, out_keys, out_events = state.expand_groups(gids, prevs, offsets, dkeys, devents)
    full_offsets = array("q", [0])
    counts = [0] * len(ids)
    for g in out_groups:
        counts[g] += 1
    for c in counts:
        full_offsets.append(full_offsets[-1] + c)
    rooms = array("q", [int(room_of[g].split(":")[0][5:]) for g in ids])
    return prevs, rooms, full_offsets, out_keys, out_events, len(dkeys)


@pytest.fixture(scope="module")
def planned() -> tuple[Any, ...]:
    return planner_input()


def test_plan_compression(benchmark: Any, impl_kind: str, planned: tuple[Any, ...]) -> None:
    core: ModuleType = core_module("compress", impl_kind)
    *buffers, rows_before = planned
    result = benchmark.pedantic(core.plan_compression, args=tuple(buffers), rounds=3, iterations=1)
    assert max(result[1]) <= 100
    assert len(result[3]) < rows_before
    benchmark.extra_info["rows"] = f"{rows_before} -> {len(result[3])}"


# --- side by side on PostgreSQL ---------------------------------------------------------

GROUPS = 1_000


@pytest.fixture(scope="module")
def forest() -> Forest:
    # The reconstruction bench's shape: rooms of ~50 groups, 8% snapshots.
    return make_forest(GROUPS, seed=1, rooms=GROUPS // 50, snapshot_share=0.08,
                       initial_members=55, member_pool=120, fan_out=200)


@pytest.fixture
def fresh_db(forest: Forest) -> Iterator[str]:
    from support.postgres import postgres_server_dsn

    try:
        dsn = postgres_server_dsn()
    except Exception as exc:  # no server: the side-by-side cases need one
        pytest.skip(f"no PostgreSQL server ({exc})")
    dbs = Databases(dsn)
    try:
        yield dbs.create(forest)
    finally:
        dbs.close()


def _outcome(benchmark: Any, url: str) -> None:
    left = Databases.sql(url, "SELECT count(*) FROM state_groups_state")
    chain = Databases.sql(url, MAX_CHAIN_SQL)
    benchmark.extra_info["rows_left"] = left
    benchmark.extra_info["longest_chain"] = chain
    print(f"\n{benchmark.name}: {left} rows left, longest chain {chain} hops")


@pytest.mark.postgres
def test_reference_compressor(benchmark: Any, fresh_db: str, forest: Forest) -> None:
    python = default_compressor_python()
    if python is None:
        pytest.skip("synapse-auto-compressor is not installed (set STREAMREP_COMPRESSOR_PYTHON)")
    code = ("import synapse_auto_compressor as c; c.compress_state_events_table("
            f"db_url={fresh_db!r}, chunk_size=500, default_levels='100,50,25', "
            f"number_of_chunks={GROUPS // 500 + GROUPS // 50 + 10})")
    benchmark.pedantic(subprocess.run, args=([python, "-c", code],), kwargs={"check": True},
                       rounds=1, iterations=1)
    _outcome(benchmark, fresh_db)
    assert int(Databases.sql(fresh_db, "SELECT count(*) FROM state_groups_state")) < len(forest.state)  # type: ignore[arg-type]


@pytest.mark.postgres
def test_streamrep_single_process(benchmark: Any, fresh_db: str, forest: Forest, tmp_path: Path) -> None:
    from streamrep.spark import Source
    from streamrep.spark.compress import CompressOptions
    from streamrep.spark.compress_apply import apply_compression
    from streamrep.spark.compress_local import compress_local

    def compress_and_apply() -> None:
        out = str(tmp_path / f"out-{uuid.uuid4().hex[:6]}")
        compress_local(Source(db_url=fresh_db), CompressOptions(out))
        apply_compression(fresh_db, out)

    benchmark.pedantic(compress_and_apply, rounds=1, iterations=1)
    _outcome(benchmark, fresh_db)
    assert int(Databases.sql(fresh_db, MAX_CHAIN_SQL)) <= 100  # type: ignore[arg-type]
    assert int(Databases.sql(fresh_db, "SELECT count(*) FROM state_groups_state")) < len(forest.state)  # type: ignore[arg-type]
