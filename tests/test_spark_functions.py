"""streamrep.spark.functions: state as DataFrames in the caller's own session.

The Arrow-batch functions run here in plain Python on both cores. The DataFrame
functions run in one session this module builds, in ``local-cluster`` (two
executors in their own JVMs, each with its own Python workers), with
``STREAMREP_NO_EXTENSIONS=1`` in the executors' environment: the pure twins run
there while this process (the driver) runs the compiled core. They are checked
against brute force over a generated forest and over tables the event store
wrote for real rooms, and composed with a join and a filter.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest

from streamrep import _impl
from streamrep.errors import ConfigError, StateCorruptionError
from streamrep.spark import functions as SF
from streamrep.spark.batches import assign_trees
from support.spark import spark_missing, spark_required
from support.state_forest import Forest, State, corrupt_forest, make_forest

digest_state = _impl.load("treewalk").digest_state

# PySpark's collect() leaves its local result socket for the garbage collector.
pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")


@pytest.fixture(scope="module")
def forest() -> Forest:
    # Snapshots, chains up to 100 hops, forks, a fan-out of 120 children.
    return make_forest(700, seed=11, rooms=4, fan_out=120)


def states_of(rows: list[dict[str, Any]]) -> dict[int, State]:
    found: dict[int, State] = {}
    for r in rows:
        found.setdefault(r["state_group"], {})[(r["type"], r["state_key"])] = r["event_id"]
    return found


def nonempty(truth: dict[int, State]) -> dict[int, State]:
    return {g: s for g, s in truth.items() if s}


# --- the Arrow-batch functions, without Spark ------------------------------------------


def tree_rows(forest: Forest, split_threshold: int = 60) -> pa.Table:
    """TREE_ROWS_SCHEMA rows of *forest*, sorted as expand_states needs them."""
    ids = [g for g, _, _ in forest.groups]
    prev = dict(forest.edges)
    topology = pa.table([ids, [prev.get(g) for g in ids], [True] * len(ids)],
                        schema=SF.TOPOLOGY_SCHEMA)
    trees = assign_trees(topology, split_threshold).to_pylist()
    deltas: dict[int, list[tuple[str, str, str]]] = {}
    for g, _room, t, s, e in forest.state:
        deltas.setdefault(g, []).append((t, s, e))
    rows = []
    for tree in trees:
        rows.append({**tree, "type": None, "state_key": None, "event_id": None})
        for t, s, e in deltas.get(tree["state_group"], []):
            rows.append({**tree, "type": t, "state_key": s, "event_id": e})
    rows.sort(key=lambda r: (r["root"], r["piece"], r["state_group"]))
    return pa.Table.from_pylist(rows, schema=SF.TREE_ROWS_SCHEMA)


def test_arrow_functions_equal_brute_force_with_plain_output(forest: Forest) -> None:
    table = tree_rows(forest)
    batches = table.to_batches(max_chunksize=997)  # trees cut across batches
    out = list(SF.expand_states(batches, batch_rows=5_000))
    assert all(b.schema == SF.STATE_SCHEMA for b in out)  # no dictionary columns
    assert states_of(pa.Table.from_batches(out).to_pylist()) == nonempty(forest.brute_force())
    digests = pa.Table.from_batches(list(SF.expand_digests(batches, batch_rows=5_000)))
    assert digests.schema == SF.DIGEST_SCHEMA
    assert {r["state_group"]: r["state_digest"] for r in digests.to_pylist()} == {
        g: digest_state(s) for g, s in forest.brute_force().items()}


def test_out_of_order_rows_are_refused_naming_the_order(forest: Forest) -> None:
    table = tree_rows(forest)
    swapped = pa.concat_tables([table.slice(400), table.slice(0, 400)])
    with pytest.raises(SF.InputOrderError, match=r"sorted by \(root, piece, state_group\).*"
                       r"sortWithinPartitions\('root', 'piece', 'state_group'\)"):
        list(SF.expand_states(swapped.to_batches(max_chunksize=1000)))
    # Out of order inside one batch too.
    with pytest.raises(SF.InputOrderError):
        list(SF.expand_digests([swapped.combine_chunks().to_batches()[0]]))


def test_ddl_is_plain_spark_types() -> None:
    assert SF.ddl(SF.STATE_SCHEMA) == (
        "`state_group` bigint, `type` string, `state_key` string, `event_id` string")
    assert "table` string" in SF.ddl(SF.PLAN_SCHEMA)


# --- DataFrames in a session of the test's own -------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    reason = spark_missing()
    if reason:
        if spark_required():
            pytest.fail(f"STREAMREP_REQUIRE_SPARK is set but {reason}", pytrace=False)
        pytest.skip(reason)
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The driver names the Python its workers run.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from streamrep.spark.job import find_jdbc_jar

    builder = (
        SparkSession.builder.master("local-cluster[2,1,1024]").appName("streamrep-functions-test")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m").config("spark.sql.shuffle.partitions", "3")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.STREAMREP_NO_EXTENSIONS", "1")
    )
    # The first session of the process fixes the JVM's class path: the other
    # modules' JDBC tests need the driver on it whichever runs first.
    jar = find_jdbc_jar()
    if jar:
        builder = builder.config("spark.jars", jar)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def frames(spark: Any, forest: Forest) -> tuple[Any, Any, Any]:
    tables = forest.tables()
    return tuple(spark.createDataFrame(tables[name]) for name in
                 ("state_groups", "state_group_edges", "state_groups_state"))


@pytest.mark.spark
def test_executors_are_separate_and_run_the_pure_twin(spark: Any) -> None:
    def _executor_core(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Nested, so it is pickled by value (executors cannot import tests/).
        import os

        import pyarrow as pa

        from streamrep import _impl as impl

        for batch in batches:
            module = impl.load("treewalk").__name__
            yield pa.RecordBatch.from_pydict({"module": [module] * batch.num_rows,
                                              "pid": [os.getpid()] * batch.num_rows})

    found = spark.range(0, 64, numPartitions=4).mapInArrow(
        _executor_core, "module string, pid bigint").collect()
    # Two executors besides the driver, each its own JVM.
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    deadline = time.monotonic() + 60
    while status.size() < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    assert status.size() == 3
    assert {r["module"] for r in found} == {"streamrep._pure.treewalk"}
    assert os.getpid() not in {r["pid"] for r in found}
    assert _impl.load("treewalk").__name__ == (
        "streamrep._pure.treewalk" if _impl.NO_EXTENSIONS else "streamrep._core.treewalk")


@pytest.mark.spark
def test_full_state_and_digest_equal_brute_force(spark: Any, forest: Forest) -> None:
    groups, edges, deltas = frames(spark, forest)
    truth = forest.brute_force()
    full = SF.full_state(groups, edges, deltas, split_threshold=60)
    assert full.schema.simpleString() == (
        "struct<state_group:bigint,type:string,state_key:string,event_id:string>")
    assert states_of(full.toArrow().to_pylist()) == nonempty(truth)
    digests = SF.full_state(groups, edges, deltas, digest=True).toArrow().to_pylist()
    assert {r["state_group"]: (r["entries"], r["state_digest"]) for r in digests} == {
        g: (len(s), digest_state(s)) for g, s in truth.items()}


@pytest.mark.spark
def test_state_at_chosen_groups_joined_and_filtered(spark: Any, forest: Forest) -> None:
    from pyspark.sql import functions as F

    groups, edges, deltas = frames(spark, forest)
    ids = [g for g, _, _ in forest.groups]
    chosen = ids[::37]
    # The caller's own table: a label per chosen group.
    labels = spark.createDataFrame([(g, f"label{g % 5}") for g in chosen], "state_group long, label string")
    states = SF.state_at(groups, edges, deltas, labels)
    members = (states.where(F.col("type") == "m.room.member")
               .join(labels, "state_group").where(F.col("label") != "label0"))
    got = states_of(members.toArrow().to_pylist())
    truth = forest.brute_force(chosen)
    assert got == nonempty({g: {k: v for k, v in s.items() if k[0] == "m.room.member"}
                            for g, s in truth.items() if g % 5 != 0})
    by_ids = SF.state_at(groups, edges, deltas, chosen[:3], digest=True).toArrow().to_pylist()
    assert {r["state_group"]: r["state_digest"] for r in by_ids} == {
        g: digest_state(truth[g]) for g in chosen[:3]}


def read_back(path: str) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds

    return ds.dataset(path, format="parquet").to_table().to_pylist()


@pytest.mark.spark
def test_write_full_state_writes_what_full_state_returns(spark: Any, forest: Forest, tmp_path: Path) -> None:
    groups, edges, deltas = frames(spark, forest)
    truth = forest.brute_force()
    out = tmp_path / "states"
    written = SF.write_full_state(groups, edges, deltas, str(out), split_threshold=60)
    assert written.path == f"file://{out}"
    assert written.groups == len(truth)
    rows = read_back(str(out))
    assert written.rows == len(rows) == sum(len(s) for s in truth.values())
    assert states_of(rows) == nonempty(truth)
    assert (out / "_SUCCESS").exists() and not (out / "_temporary").exists()
    # The files hold plain strings once read back, as full_state's rows.
    assert spark.read.parquet(str(out)).schema.simpleString() == (
        "struct<state_group:bigint,type:string,state_key:string,event_id:string>")

    with pytest.raises(ConfigError, match="is not empty"):
        SF.write_full_state(groups, edges, deltas, str(out))
    chosen = [g for g, _, _ in forest.groups][::29]
    again = SF.write_full_state(groups, edges, deltas, str(out), digest=True, wanted=chosen, overwrite=True)
    digests = read_back(str(out))
    assert again.groups == again.rows == len(chosen)
    assert {r["state_group"]: (r["entries"], r["state_digest"]) for r in digests} == {
        g: (len(truth[g]), digest_state(truth[g])) for g in chosen}


@pytest.mark.spark
def test_write_full_state_of_a_corrupt_forest_names_the_groups(spark: Any, forest: Forest, tmp_path: Path) -> None:
    # A key twice in one group's delta is found by the executors while they walk.
    bad = corrupt_forest(forest, "dupkey", at=20, missing_group=0)
    with pytest.raises(StateCorruptionError, match="more than once") as caught:
        SF.write_full_state(*frames(spark, bad), str(tmp_path / "out"))
    assert getattr(caught.value, "groups", ())


@pytest.mark.spark
def test_corrupt_topology_raises_at_the_call(spark: Any, forest: Forest) -> None:
    bad = corrupt_forest(forest, "cycle", at=20, missing_group=0)
    with pytest.raises(StateCorruptionError, match="cycle"):
        SF.full_state(*frames(spark, bad))


@pytest.mark.spark
def test_mapinarrow_with_the_arrow_functions_directly(spark: Any, forest: Forest) -> None:
    rows = spark.createDataFrame(tree_rows(forest))
    sorted_rows = rows.repartition("root", "piece").sortWithinPartitions("root", "piece", "state_group")
    out = sorted_rows.mapInArrow(SF.expand_states, SF.ddl(SF.STATE_SCHEMA))
    assert states_of(out.toArrow().to_pylist()) == nonempty(forest.brute_force())
    unsorted = rows.repartition("root", "piece").sortWithinPartitions(
        "root", "piece", rows["state_group"].desc())
    with pytest.raises(Exception, match="InputOrderError.*sortWithinPartitions"):
        unsorted.mapInArrow(SF.expand_digests, SF.ddl(SF.DIGEST_SCHEMA)).collect()


def plan_forest(plan: Any, forest: Forest) -> Forest:
    """The tables after applying *plan*'s new edges and delta rows."""
    edges = [(r["state_group"], r["prev_state_group"]) for r in plan.state_group_edges.collect()]
    state = [(r["state_group"], r["room_id"], r["type"], r["state_key"], r["event_id"])
             for r in plan.state_groups_state.collect()]
    return Forest(list(forest.groups), edges, state, forest.event_to_state_groups)


@pytest.mark.spark
def test_compression_plan_keeps_every_state(spark: Any, forest: Forest) -> None:
    groups, edges, deltas = frames(spark, forest)
    # Rooms split by groups, and by rows (each group's delta rows counted).
    plan = SF.compression_plan(groups, edges, deltas, max_depth=20, split_threshold=200, unit_rows=500)
    try:
        after = plan_forest(plan, forest)
        assert after.brute_force() == forest.brute_force()
        changes = plan.changes.toArrow()
        by_groups = SF._compress.assign_units(
            SF._collected(SF.unit_topology(groups, edges, None), SF.UNIT_TOPOLOGY_SCHEMA), 200, 20)
        assert len(set(changes.column("unit").to_pylist())) > len(set(by_groups.column("unit").to_pylist()))
        assert changes.num_rows > 0 and max(changes.column("depth").to_pylist()) <= 20
        assert set(changes.column("action").to_pylist()) == {"rewrite"}
        # The change set accounts for every row the new tables differ by.
        assert len(after.state) == (len(forest.state) - sum(changes.column("old_rows").to_pylist())
                                    + sum(changes.column("new_rows").to_pylist()))
        lost = plan.change_rows.where("op = 'delete'").count()
        assert lost == sum(changes.column("old_rows").to_pylist())
    finally:
        plan.unpersist()


# --- tables the event store wrote ---------------------------------------------------


@pytest.fixture(scope="module")
def store_tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, pa.Table], Any]:
    """State tables of real rooms: the demo's workload persisted by the event store
    (short chains, so it snapshots)."""
    from streamrep.demo.workload import Workload
    from streamrep.events import EventStore
    from streamrep.spark.tables import read_db_table

    url = f"sqlite:///{tmp_path_factory.mktemp('store')}/events.db"
    store = EventStore(url, max_delta_hops=6)
    workload = Workload(seed=5, rooms=4)
    persisted = 0
    while persisted < 400:
        op = workload.next_op()
        if op.kind in ("events", "backfill"):
            store.persist_events(op.events, backfilled=op.kind == "backfill")
            persisted += len(op.events)
    tables = {name: read_db_table(url, name) for name in
              ("state_groups", "state_group_edges", "state_groups_state", "event_to_state_groups")}
    return tables, store


@pytest.mark.spark
def test_full_state_of_event_store_tables(spark: Any, store_tables: tuple[dict[str, pa.Table], Any]) -> None:
    tables, store = store_tables
    groups, edges, deltas = (spark.createDataFrame(tables[n]) for n in
                             ("state_groups", "state_group_edges", "state_groups_state"))
    assert tables["state_group_edges"].num_rows > 0 and tables["state_groups"].num_rows > 20
    got = states_of(SF.full_state(groups, edges, deltas).toArrow().to_pylist())
    # The store's own answer: the state after each event that has a group.
    refs = tables["event_to_state_groups"].to_pylist()
    assert refs
    for ref in refs:
        assert got.get(ref["state_group"], {}) == dict(store.get_state_after_event(ref["event_id"]))
    plan = SF.compression_plan(groups, edges, deltas, max_depth=3)
    try:
        rows = {n: [tuple(r.values()) for r in tables[n].to_pylist()] for n in tables}
        before = Forest(rows["state_groups"], rows["state_group_edges"], rows["state_groups_state"])
        assert plan_forest(plan, before).brute_force() == before.brute_force()
    finally:
        plan.unpersist()


def test_binding_settings_with_partial_keeps_a_plain_function() -> None:
    # What the docs show for mapInArrow: settings bound with functools.partial.
    body = functools.partial(SF.compress_units, max_depth=10)
    assert list(body(iter(()))) == []
    assert list(SF.find_trees(iter(()))) == []
