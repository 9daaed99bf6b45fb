"""Spark functions over a homeserver's state tables, in your own session.

Give them DataFrames with the reference homeserver's table shapes and get
DataFrames back, to join, filter and write as you like; no file is written
in between:

* :func:`full_state` -- every group's full state (or its digest);
* :func:`state_at` -- the same for chosen groups only;
* :func:`write_full_state` -- either of them written as Parquet by the
  executors themselves, through the code ``streamrep spark reconstruct`` writes
  with and at its speed: for output that goes to files rather than into a join;
* :func:`compression_plan` -- shorter deltas for every group, with the change
  set ``streamrep state apply-compression`` applies, as DataFrames.

Input columns (other columns are ignored; IDs may be any integer type):

=======================  ==============================================
``groups``               ``state_groups``: ``id`` (and ``room_id``,
                         ``event_id`` for :func:`compression_plan`)
``edges``                ``state_group_edges``: ``state_group``,
                         ``prev_state_group``
``deltas``               ``state_groups_state``: ``state_group``,
                         ``type``, ``state_key``, ``event_id``
=======================  ==============================================

Underneath are the Arrow-batch functions the executors run
(:func:`expand_states`, :func:`expand_digests`, :func:`compress_units`), usable
with ``DataFrame.mapInArrow`` directly. Their input and output schemas are the
``*_SCHEMA`` constants below (plain Arrow types: strings are never
dictionary-encoded), their Spark DDL is ``ddl(schema)``, and the order each
needs is checked: rows out of order raise :class:`InputOrderError` saying
which order.

This module imports PySpark only when a DataFrame function is called.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Union

import numpy as np
import pyarrow as pa

from streamrep import _impl
from streamrep.spark import batches as _batches
from streamrep.spark import compress as _compress
from streamrep.spark.batches import ddl

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "full_state",
    "state_at",
    "write_full_state",
    "WrittenStates",
    "compression_plan",
    "CompressionPlan",
    "find_trees",
    "expand_states",
    "expand_digests",
    "find_units",
    "compress_units",
    "ddl",
    "digest_state",
    "InputOrderError",
    "TOPOLOGY_SCHEMA",
    "TREES_SCHEMA",
    "TREE_ROWS_SCHEMA",
    "STATE_SCHEMA",
    "DIGEST_SCHEMA",
    "UNIT_TOPOLOGY_SCHEMA",
    "UNITS_SCHEMA",
    "UNIT_ROWS_SCHEMA",
    "PLAN_SCHEMA",
    "PLAN_TABLES",
]

#: Input of :func:`find_trees`: one row per group, with its prev group (null
#: for a root) and whether its state is wanted.
TOPOLOGY_SCHEMA = _batches.TOPOLOGY_SCHEMA

#: Output of :func:`find_trees`: ``root`` and ``piece`` of each group's tree
#: (prev -1 for roots).
TREES_SCHEMA = _batches.TREES_SCHEMA

#: Input of :func:`find_units`: the topology with each group's room, its own
#: event and whether an event references it.
UNIT_TOPOLOGY_SCHEMA = _compress.UNIT_TOPOLOGY_SCHEMA

#: Output of :func:`find_units`.
UNITS_SCHEMA = _compress.UNITS_SCHEMA

#: Input of :func:`expand_states` and :func:`expand_digests`: one row per delta
#: row of every group of the trees to walk, plus one row with a null ``type``
#: (and null ``state_key``, ``event_id``) for each group, so that groups
#: without delta rows exist. ``root`` is the group at the top of the group's
#: tree, ``piece`` numbers the parts of a split tree (0 otherwise),
#: ``prev_state_group`` is -1 or null for a root, ``wanted`` says whether the
#: group's state is output. Rows must arrive sorted by ``root, piece,
#: state_group``, and all rows of one ``(root, piece)`` in one partition.
TREE_ROWS_SCHEMA = _batches.TREE_ROWS_SCHEMA

#: Output of :func:`expand_states`: one row per entry of each wanted group's
#: full state (a group whose whole chain has no rows has none).
STATE_SCHEMA = _batches.STATE_SCHEMA

#: Output of :func:`expand_digests`: one row per wanted group, with the number
#: of entries of its full state and its version 2 digest (64 hex digits; see
#: docs/spark.md).
DIGEST_SCHEMA = _batches.DIGEST_SCHEMA

#: Input of :func:`compress_units`: one row per delta row of every group, plus
#: one row with a null ``type`` per group. ``unit`` numbers the units (a room,
#: or a share of a giant room's trees), ``home`` is False on the copies of a
#: split tree's root in other pieces, ``fixed`` marks such roots (left as they
#: are), ``referenced`` whether an event references the group, ``children``
#: how many groups have it as prev. Rows must arrive sorted by ``unit,
#: state_group``, and all rows of one unit in one partition.
UNIT_ROWS_SCHEMA = _compress.UNIT_ROWS_SCHEMA

#: The tables of a compression plan, by name: the new ``state_group_edges``
#: and ``state_groups_state`` of every kept group, and the change set
#: (``changes``: one row per rewritten or deleted group; ``change_rows``: the
#: delta rows each changed group loses and gains).
PLAN_TABLES: dict[str, pa.Schema] = dict(_compress.OUTPUT_TABLES)


def _plan_schema() -> pa.Schema:
    fields: dict[str, pa.Field] = {"table": pa.field("table", pa.string())}
    for schema in PLAN_TABLES.values():
        for f in schema:
            if f.name in fields and fields[f.name].type != f.type:
                raise TypeError(f"plan column {f.name} has two types")
            fields.setdefault(f.name, f)
    return pa.schema(list(fields.values()))


#: Output of :func:`compress_units`: the rows of every :data:`PLAN_TABLES`
#: table, named by ``table``, with the columns of that table set and the others
#: null.
PLAN_SCHEMA = _plan_schema()

class InputOrderError(ValueError):
    """Rows handed to an Arrow-batch function are not in the order it needs."""


def digest_state(state: Mapping[tuple[str, str], str]) -> str:
    """The digest of one full state ``{(type, state_key): event_id}``, as
    :func:`expand_digests` computes it (for comparing with a state you hold)."""
    digest: str = _impl.load("treewalk").digest_state(state)
    return digest


# --- the Arrow-batch functions -----------------------------------------------------


def _sorted_batches(batches: Iterable[pa.RecordBatch], keys: tuple[str, ...],
                    function: str, hint: str) -> Iterator[pa.RecordBatch]:
    """*batches*, checked to be sorted by *keys* (int columns) across batches."""
    last: tuple[int, ...] | None = None
    for batch in batches:
        if batch.num_rows == 0:
            continue
        columns = [_batches._int64_numpy(batch.column(k), fill=-1) for k in keys]
        if last is not None and tuple(int(c[0]) for c in columns) < last:
            _out_of_order(keys, function, hint, last, tuple(int(c[0]) for c in columns))
        # Row i comes after row i-1 when its first differing key is larger.
        decided = np.zeros(batch.num_rows - 1, dtype=np.bool_)
        for column in columns:
            step = column[1:] - column[:-1]
            bad = ~decided & (step < 0)
            if bad.any():
                at = int(np.flatnonzero(bad)[0])
                _out_of_order(keys, function, hint, tuple(int(c[at]) for c in columns),
                              tuple(int(c[at + 1]) for c in columns))
            decided |= step > 0
        last = tuple(int(c[-1]) for c in columns)
        yield batch


def _out_of_order(keys: tuple[str, ...], function: str, hint: str,
                  before: tuple[int, ...], after: tuple[int, ...]) -> None:
    names = ", ".join(keys)
    raise InputOrderError(
        f"{function} needs its rows sorted by ({names}) within each partition, but "
        f"({', '.join(map(str, after))}) came after ({', '.join(map(str, before))}); "
        f"{hint}")


_TREE_KEYS = ("root", "piece", "state_group")
_TREE_HINT = "use .repartition('root', 'piece').sortWithinPartitions('root', 'piece', 'state_group')"


def _plain(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """*batch* with its dictionary columns decoded into *schema*'s plain types."""
    return pa.RecordBatch.from_arrays(
        [column.cast(f.type) if column.type != f.type else column
         for column, f in zip(batch.columns, schema)], schema=schema)


def _expand(batches: Iterable[pa.RecordBatch], digest: bool, function: str,
            batch_rows: int) -> Iterator[pa.RecordBatch]:
    checked = _sorted_batches(batches, _TREE_KEYS, function, _TREE_HINT)
    schema = DIGEST_SCHEMA if digest else STATE_SCHEMA
    for batch in _batches.expand_partition(checked, digest, batch_rows):
        yield _plain(batch, schema)


def expand_states(batches: Iterable[pa.RecordBatch],
                  batch_rows: int = 500_000) -> Iterator[pa.RecordBatch]:
    """Full states of the wanted groups of sorted tree rows (a ``mapInArrow`` body).

    Takes :data:`TREE_ROWS_SCHEMA` batches sorted by ``root, piece,
    state_group`` (else :class:`InputOrderError`) and yields
    :data:`STATE_SCHEMA` batches. About *batch_rows* input rows are walked per
    call of the compiled core. Corrupt trees (a prev group missing from its
    tree, a cycle, a key twice in one delta) raise
    :class:`~streamrep.errors.StateCorruptionError` naming the groups.
    """
    return _expand(batches, False, "expand_states", batch_rows)


def expand_digests(batches: Iterable[pa.RecordBatch],
                   batch_rows: int = 500_000) -> Iterator[pa.RecordBatch]:
    """Like :func:`expand_states`, yielding :data:`DIGEST_SCHEMA` batches: one
    row per wanted group with its entry count and digest."""
    return _expand(batches, True, "expand_digests", batch_rows)


def _plan_batch(name: str, table: pa.Table) -> pa.RecordBatch:
    rows = table.num_rows
    columns = []
    for f in PLAN_SCHEMA:
        if f.name == "table":
            columns.append(pa.array([name] * rows, pa.string()))
        elif f.name in table.column_names:
            columns.append(table.column(f.name).combine_chunks().cast(f.type))
        else:
            columns.append(pa.nulls(rows, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=PLAN_SCHEMA)


def compress_units(batches: Iterable[pa.RecordBatch], max_depth: int = 99, candidates: int = 16,
                   find_unreferenced: bool = False,
                   batch_rows: int = _compress.TASK_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The compression plan of sorted unit rows (a ``mapInArrow`` body).

    Takes :data:`UNIT_ROWS_SCHEMA` batches sorted by ``unit, state_group``
    (else :class:`InputOrderError`) and yields :data:`PLAN_SCHEMA` batches.
    Every changed group's full state is checked against its old one before
    its batch is yielded; a difference raises
    :class:`~streamrep.errors.StateVerificationError` naming the groups.
    Bind the settings with ``functools.partial`` for ``mapInArrow``.
    """
    from streamrep.spark.interned import SortedRowInterner, parents_within

    options = _compress.CompressOptions(output="", max_depth=max_depth, candidates=candidates,
                                        find_unreferenced=find_unreferenced)
    checked = _sorted_batches(batches, ("unit", "state_group"), "compress_units",
                              "use .repartition('unit').sortWithinPartitions('unit', 'state_group')")
    # As the compress job's tasks do: rows interned as they arrive, whole units
    # planned together, the output in pieces of a bounded number of rows.
    stream = SortedRowInterner(("unit", "state_group"), _compress.UNITS_SCHEMA.names)
    for heads, slots in stream.runs(checked, batch_rows):
        batch = _compress.GroupBatch.from_table(heads)
        parent = parents_within(batch.unit, batch.groups, batch.prevs)
        interned = _batches._Interned.of(slots.types, slots.state_keys, slots.event_ids,
                                         slots.keys, slots.events)
        produced = _compress.compress_batch(batch, parent, slots.offsets, interned, options)
        for piece in produced.pieces:
            for name, part in piece.items():
                if part.num_rows:
                    yield _plan_batch(name, part)


def _whole_input(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    received = list(batches)
    table = pa.Table.from_batches(received) if received else schema.empty_table()
    # Spark marks some columns NOT NULL; the values are what matter.
    return table.select(schema.names).cast(schema)


def find_trees(batches: Iterable[pa.RecordBatch],
               split_threshold: int = 200_000) -> Iterator[pa.RecordBatch]:
    """Every group's tree (a ``mapInArrow`` body for a single partition).

    Takes the whole topology as :data:`TOPOLOGY_SCHEMA` batches in one
    partition (``.repartition(1)``), checks it (duplicate groups, missing prev
    groups and cycles raise :class:`~streamrep.errors.StateCorruptionError`),
    and yields :data:`TREES_SCHEMA` batches: the trees holding a wanted group,
    a tree above *split_threshold* groups cut into pieces with its root copied
    into each.
    """
    table = _batches.assign_trees(_whole_input(batches, TOPOLOGY_SCHEMA), split_threshold)
    yield from table.to_batches(max_chunksize=500_000)


def find_units(batches: Iterable[pa.RecordBatch], split_threshold: int = 200_000, max_depth: int = 99,
               unit_rows: int = 0) -> Iterator[pa.RecordBatch]:
    """The compression units (a ``mapInArrow`` body for a single partition):
    :data:`UNIT_TOPOLOGY_SCHEMA` in, :data:`UNITS_SCHEMA` out, checked as
    :func:`find_trees` checks; rooms split as
    :func:`~streamrep.spark.compress.assign_units` splits them."""
    table = _compress.assign_units(_whole_input(batches, UNIT_TOPOLOGY_SCHEMA), split_threshold,
                                     max_depth, unit_rows)
    yield from table.to_batches(max_chunksize=500_000)


# --- DataFrames --------------------------------------------------------------------

#: Up to this many tree (or unit) rows, they are broadcast to the join with the
#: delta rows, which are then shuffled once instead of twice.
BROADCAST_TREE_ROWS = 3_000_000

#: Column of driver-built trees giving each group's rank in (root, piece,
#: state_group) order: the partition sort then compares one long.
TREE_ORDER = "tree_order"

Wanted = Union["DataFrame", Iterable[int]]


def _long(name: str, alias: str | None = None) -> "Column":
    from pyspark.sql import functions as F

    return F.col(name).cast("long").alias(alias or name)


def _topology(groups: "DataFrame", edges: "DataFrame", wanted: Wanted | None) -> pa.Table:
    """:data:`TOPOLOGY_SCHEMA` rows of the tables, built in the driver.

    The IDs and the edges are collected as they are (two scans, no shuffle)
    and joined with numpy; a group with several edges keeps them all, which
    :func:`~streamrep.spark.batches.assign_trees` reports as corrupt.
    """
    from pyspark.sql import DataFrame

    from streamrep.spark.local import group_edges

    tables = {
        "state_groups": _collected(groups.select(_long("id")), pa.schema([("id", pa.int64())])),
        "state_group_edges": _collected(
            edges.select(_long("state_group"), _long("prev_state_group")), _compress.EDGES_SCHEMA),
    }
    group_ids, _, prev, has_edge = group_edges(tables)
    if wanted is None:
        marks = np.ones(len(group_ids), dtype=np.bool_)
    else:
        if isinstance(wanted, DataFrame):
            chosen = _batches._int64_numpy(_collected(
                wanted.select(_long("state_group")).distinct(),
                pa.schema([("state_group", pa.int64())])).column(0))
        else:
            chosen = np.fromiter((int(g) for g in wanted), dtype=np.int64)
        marks = np.isin(group_ids, chosen)
    return pa.table([pa.array(group_ids, pa.int64()), pa.array(prev, pa.int64(), mask=~has_edge),
                     pa.array(marks)], schema=TOPOLOGY_SCHEMA)


def _collected(frame: "DataFrame", schema: pa.Schema) -> pa.Table:
    """*frame* collected to the driver as an Arrow table of *schema*."""
    table = frame.toArrow()
    return table.select(schema.names).cast(schema)


def ordered_trees(spark: "SparkSession", trees: pa.Table) -> "DataFrame":
    """The trees (:data:`~streamrep.spark.batches.TREES_SCHEMA`) found in the
    driver as a DataFrame with their :data:`TREE_ORDER` rank."""
    rows = trees.num_rows
    order = np.empty(rows, dtype=np.int64)
    order[np.lexsort([trees.column(n).to_numpy() for n in ("state_group", "piece", "root")])] = (
        np.arange(rows, dtype=np.int64))
    return spark.createDataFrame(trees.append_column(TREE_ORDER, pa.array(order)))


def rows_with_deltas(deltas: "DataFrame", groups: "DataFrame", group_rows: int,
                     columns: list[str]) -> "DataFrame":
    """The delta rows joined to *groups* (trees or units, by ``state_group``),
    plus every row of *groups* once with null delta columns (so groups without
    delta rows exist). *groups* is broadcast when it has at most
    :data:`BROADCAST_TREE_ROWS` rows."""
    from pyspark.sql import functions as F

    state = deltas.select(_long("state_group", "delta_group"), "type", "state_key", "event_id")
    group_side = F.broadcast(groups) if group_rows <= BROADCAST_TREE_ROWS else groups
    with_deltas = state.join(group_side, F.col("state_group") == F.col("delta_group"), "inner").select(
        *columns, "type", "state_key", "event_id")
    placeholders = groups.select(
        *columns, *(F.lit(None).cast("string").alias(c) for c in ("type", "state_key", "event_id")))
    return with_deltas.unionByName(placeholders)


def sorted_tree_rows(trees: "DataFrame", tree_rows: int, deltas: "DataFrame") -> "DataFrame":
    """:data:`TREE_ROWS_SCHEMA` rows of *trees* (with or without a
    :data:`TREE_ORDER` column) partitioned by tree and sorted as
    :func:`expand_states` needs them."""
    ordered = TREE_ORDER in trees.columns
    columns = list(_batches.TREES_SCHEMA.names) + ([TREE_ORDER] if ordered else [])
    return (rows_with_deltas(deltas, trees, tree_rows, columns)
            .repartition("root", "piece")
            .sortWithinPartitions(*([TREE_ORDER] if ordered else list(_TREE_KEYS)))
            .select(*TREE_ROWS_SCHEMA.names))


def _trees(groups: "DataFrame", edges: "DataFrame", wanted: Wanted | None,
           split_threshold: int) -> pa.Table:
    return _batches.assign_trees(_topology(groups, edges, wanted), split_threshold)


def state_at(groups: "DataFrame", edges: "DataFrame", deltas: "DataFrame", wanted: Wanted,
             digest: bool = False, *, split_threshold: int = 200_000) -> "DataFrame":
    """The full state (or digest) of the *wanted* groups only.

    *wanted* is a DataFrame with a ``state_group`` column, or state group IDs.
    Only the trees holding a wanted group are walked; their other groups' delta
    rows are read but not output. Returns a DataFrame of
    ``state_group, type, state_key, event_id`` (:data:`STATE_SCHEMA`), or with
    *digest* ``state_group, entries, state_digest`` (:data:`DIGEST_SCHEMA`).

    The topology (``id``, ``state_group``, ``prev_state_group``: a few fields
    per group) is collected and checked in the driver at once: corrupt tables
    (a cycle, a missing prev group, a group listed twice) raise
    :class:`~streamrep.errors.StateCorruptionError` here, naming the groups.
    The delta rows are read when an action runs on the result. A tree with
    more than *split_threshold* groups is walked in pieces.
    """
    trees = _trees(groups, edges, wanted, split_threshold)
    rows = sorted_tree_rows(ordered_trees(groups.sparkSession, trees), trees.num_rows, deltas)
    if digest:
        return rows.mapInArrow(expand_digests, ddl(DIGEST_SCHEMA))
    return rows.mapInArrow(expand_states, ddl(STATE_SCHEMA))


def full_state(groups: "DataFrame", edges: "DataFrame", deltas: "DataFrame", digest: bool = False,
               *, split_threshold: int = 200_000) -> "DataFrame":
    """The full state of every group of *groups*, or with *digest* its digest.

    As :func:`state_at` with every group wanted.
    """
    trees = _trees(groups, edges, None, split_threshold)
    rows = sorted_tree_rows(ordered_trees(groups.sparkSession, trees), trees.num_rows, deltas)
    if digest:
        return rows.mapInArrow(expand_digests, ddl(DIGEST_SCHEMA))
    return rows.mapInArrow(expand_states, ddl(STATE_SCHEMA))


@dataclass(frozen=True)
class WrittenStates:
    """What :func:`write_full_state` wrote."""

    #: the output folder, as a URI (``file://`` for a local path)
    path: str
    #: rows written: state entries, or one per wanted group with *digest*
    rows: int
    #: groups whose state was wanted
    groups: int


def write_full_state(groups: "DataFrame", edges: "DataFrame", deltas: "DataFrame", path: str,
                     digest: bool = False, *, wanted: Wanted | None = None,
                     overwrite: bool = False, split_threshold: int = 200_000) -> WrittenStates:
    """Write the full state (or digest) of every group, or of the *wanted* ones,
    as Parquet under *path*, and return once it is complete.

    The rows are those :func:`full_state` and :func:`state_at` return
    (:data:`STATE_SCHEMA` or :data:`DIGEST_SCHEMA`; strings dictionary-encoded
    in the files, plain when read back). Each task writes its own
    ``part-NNNNN.parquet`` from its Python worker, so the rows never become
    Spark rows: this is how ``streamrep spark reconstruct`` writes, and about
    twice as fast as ``full_state(...).write.parquet(path)`` for full states
    (docs/performance.md). A retried task replaces its file whole; ``_SUCCESS``
    marks the output complete.

    *path* is a local folder or any URI pyarrow's filesystems resolve on every
    executor (``hdfs://``, ``s3://``...). A non-empty local folder is refused
    with :class:`~streamrep.errors.ConfigError` unless *overwrite*. Corrupt
    tables raise :class:`~streamrep.errors.StateCorruptionError` naming the
    groups, as :func:`state_at` does.
    """
    from streamrep.spark.options import prepare_output
    from streamrep.spark.part_files import absolute_uri, write_states

    prepare_output(path, overwrite)
    trees = _trees(groups, edges, wanted, split_threshold)
    rows = sorted_tree_rows(ordered_trees(groups.sparkSession, trees), trees.num_rows, deltas)
    uri = absolute_uri(path)
    written = write_states(rows, uri, digest)
    wanted_groups = int(np.count_nonzero(trees.column("wanted").to_numpy(zero_copy_only=False)))
    return WrittenStates(uri, int(written.column("rows").to_numpy().sum()), wanted_groups)


# --- compression -------------------------------------------------------------------


@dataclass(frozen=True)
class CompressionPlan:
    """A compression plan as DataFrames, all views of one persisted DataFrame.

    ``state_group_edges`` and ``state_groups_state`` are the new tables (every
    kept group); ``changes`` and ``change_rows`` are the change set, with the
    columns ``streamrep spark compress`` writes (docs/spark.md). Call
    :meth:`unpersist` when done with them.
    """

    rows: "DataFrame"

    def table(self, name: str) -> "DataFrame":
        """The rows of plan table *name* (a key of :data:`PLAN_TABLES`)."""
        from pyspark.sql import functions as F

        if name not in PLAN_TABLES:
            raise KeyError(f"no plan table {name!r}; the tables are {', '.join(PLAN_TABLES)}")
        return self.rows.where(F.col("table") == name).select(*PLAN_TABLES[name].names)

    @property
    def state_group_edges(self) -> "DataFrame":
        return self.table("state_group_edges")

    @property
    def state_groups_state(self) -> "DataFrame":
        return self.table("state_groups_state")

    @property
    def changes(self) -> "DataFrame":
        return self.table("changes")

    @property
    def change_rows(self) -> "DataFrame":
        return self.table("change_rows")

    def unpersist(self) -> None:
        """Drop the cached plan rows from the executors."""
        self.rows.unpersist()


def unit_topology(groups: "DataFrame", edges: "DataFrame", references: "DataFrame | None",
                  deltas: "DataFrame | None" = None, counts: "DataFrame | None" = None) -> "DataFrame":
    """The :data:`~streamrep.spark.compress.UNIT_TOPOLOGY_SCHEMA` rows of the
    tables; ``delta_rows`` is taken from *counts* (``count_group``, ``counted``)
    or counted from *deltas* when either is given (null otherwise)."""
    from pyspark.sql import functions as F

    topology = groups.select(_long("id", "state_group"), "room_id",
                             F.col("event_id").alias("group_event_id")).join(
        edges.select(_long("state_group", "edge_group"), _long("prev_state_group")),
        F.col("state_group") == F.col("edge_group"), "left")
    if references is not None:
        refs = references.select(_long("state_group", "ref_group")).distinct()
        topology = topology.join(refs, F.col("state_group") == F.col("ref_group"), "left").withColumn(
            "referenced", F.col("ref_group").isNotNull())
    else:
        topology = topology.withColumn("referenced", F.lit(True))
    if counts is None and deltas is not None:
        # Counted per partition first: one row per group and partition is shuffled.
        counts = deltas.groupBy(_long("state_group", "count_group")).agg(F.count(F.lit(1)).alias("counted"))
    if counts is not None:
        topology = topology.join(counts, F.col("state_group") == F.col("count_group"), "left").withColumn(
            "delta_rows", F.coalesce(F.col("counted"), F.lit(0)).cast("long"))
    else:
        topology = topology.withColumn("delta_rows", F.lit(None).cast("long"))
    return topology.withColumn("wanted", F.lit(True)).select(*_compress.UNIT_TOPOLOGY_SCHEMA.names)


def sorted_unit_rows(units: "DataFrame", unit_rows: int, deltas: "DataFrame") -> "DataFrame":
    """:data:`UNIT_ROWS_SCHEMA` rows of *units*, partitioned by unit and sorted
    as :func:`compress_units` needs them."""
    return (rows_with_deltas(deltas, units, unit_rows, list(_compress.UNITS_SCHEMA.names))
            .repartition("unit").sortWithinPartitions("unit", "state_group")
            .select(*UNIT_ROWS_SCHEMA.names))


def compression_plan(groups: "DataFrame", edges: "DataFrame", deltas: "DataFrame",
                     references: "DataFrame | None" = None, *, max_depth: int = 99,
                     candidates: int = 16, split_threshold: int = 200_000,
                     unit_rows: int = 0) -> CompressionPlan:
    """Shorter deltas for every group, as ``streamrep spark compress`` plans them.

    *groups* needs ``id``, ``room_id`` and ``event_id``. With *references*
    (``event_to_state_groups``: a ``state_group`` column), groups no event
    references and no referenced group needs are listed for deletion. Every
    changed group's full state is verified when the plan is computed (a
    difference fails the action with ``StateVerificationError``). As in
    :func:`state_at`, the topology is checked in the driver at once.
    A room with more than *split_threshold* groups, or (with *unit_rows*)
    more rows than *unit_rows*, is planned in shares
    (:func:`~streamrep.spark.compress.assign_units`); *unit_rows* costs a
    count of the delta rows per group.
    """
    topology = _collected(unit_topology(groups, edges, references, deltas if unit_rows else None),
                          _compress.UNIT_TOPOLOGY_SCHEMA)
    units = _compress.assign_units(topology, split_threshold, max_depth, unit_rows)
    frame = groups.sparkSession.createDataFrame(units)
    body: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]] = functools.partial(
        compress_units, max_depth=max_depth, candidates=candidates,
        find_unreferenced=references is not None)
    rows = sorted_unit_rows(frame, units.num_rows, deltas).mapInArrow(body, ddl(PLAN_SCHEMA))
    return CompressionPlan(rows.persist())
