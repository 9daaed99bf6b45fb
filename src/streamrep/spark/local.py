"""The single-process mode: the same pipeline as the Spark job, without Spark.

Reads the tables with pyarrow (or streams them out of the database), assigns
trees, joins and sorts the delta rows in Arrow, and feeds batches of whole trees
to the compiled core, writing Parquet as it goes. Suits a few million groups on
one machine; the Spark job is for more.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from streamrep.spark.batches import (
    DIGEST_SCHEMA,
    OUTPUT_PARQUET_OPTIONS,
    STATE_OUTPUT_SCHEMA,
    TOPOLOGY_SCHEMA,
    assign_trees,
    expand_table,
)
from streamrep.spark.options import ReconstructOptions, ReconstructResult, Source, prepare_output
from streamrep.spark.tables import locate_table, read_db_table, read_table

__all__ = ["reconstruct_local", "load_tables", "read_columns", "build_topology", "group_edges", "TreeRows"]

#: Rows of sorted tree data handed to the core per call.
CHUNK_ROWS = 1_000_000


def load_tables(source: Source, need_events: bool) -> dict[str, pa.Table]:
    """The state tables as Arrow tables (only the columns the job uses)."""
    columns = {
        "state_groups": ["id", "room_id"],
        "state_group_edges": ["state_group", "prev_state_group"],
        "state_groups_state": ["state_group", "type", "state_key", "event_id"],
        "event_to_state_groups": ["state_group"],
    }
    if not need_events:
        del columns["event_to_state_groups"]
    elif source.input_dir is not None and locate_table(source.input_dir, "event_to_state_groups") is None:
        from streamrep.errors import ConfigError

        raise ConfigError(f"{source.input_dir} has no event_to_state_groups to restrict by")
    return read_columns(source, columns)


def read_columns(source: Source, columns: dict[str, list[str]]) -> dict[str, pa.Table]:
    """These columns of these tables, from the input folder or the database."""
    tables = {}
    for name, wanted in columns.items():
        if source.input_dir is not None:
            tables[name] = read_table(source.input_dir, name, wanted)
        else:
            assert source.db_url is not None
            tables[name] = read_db_table(source.db_url, name).select(wanted)
    return tables


def group_edges(tables: dict[str, pa.Table]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``state_groups`` left-joined with ``state_group_edges`` in numpy.

    Returns, one entry per output row (a group with several edges has one row
    each, a group without any has one): the group ID, the group's row in
    ``state_groups``, its prev group (-1 without an edge) and whether it has an
    edge.
    """
    ids = _int64(tables["state_groups"].column("id"))
    edges = tables["state_group_edges"]
    edge_groups = _int64(edges.column("state_group"))
    edge_prevs = _int64(edges.column("prev_state_group"))
    order = np.argsort(edge_groups, kind="stable")
    sorted_edges = edge_groups[order]
    lo = np.searchsorted(sorted_edges, ids, side="left")
    hi = np.searchsorted(sorted_edges, ids, side="right")
    counts = np.maximum(hi - lo, 1)
    row_group = np.repeat(np.arange(len(ids)), counts)
    within = np.arange(len(row_group)) - np.repeat(np.cumsum(counts) - counts, counts)
    edge_pos = np.repeat(lo, counts) + within
    has_edge = np.repeat(hi > lo, counts)
    prev = np.where(has_edge, edge_prevs[order[np.minimum(edge_pos, max(len(order) - 1, 0))]]
                    if len(order) else -1, -1)
    return ids[row_group], row_group, prev, has_edge


def build_topology(tables: dict[str, pa.Table], options: ReconstructOptions) -> pa.Table:
    """One row per group with its prev group and whether it is wanted.

    A group with several edges keeps them all (one row each), which
    :func:`~streamrep.spark.batches.assign_trees` then reports as corrupt.
    """
    groups = tables["state_groups"]
    group_ids, row_group, prev, has_edge = group_edges(tables)

    wanted = np.ones(len(group_ids), dtype=np.bool_)
    if options.groups:
        wanted &= np.isin(group_ids, np.asarray(options.groups, dtype=np.int64))
    if options.rooms:
        in_rooms = pc.fill_null(pc.is_in(groups.column("room_id"), pa.array(options.rooms, pa.string())), False)
        wanted &= in_rooms.to_numpy(zero_copy_only=False)[row_group]
    if options.referenced_by_events:
        referenced = _int64(tables["event_to_state_groups"].column("state_group"))
        wanted &= np.isin(group_ids, referenced)
    return pa.table(
        [pa.array(group_ids), pa.array(prev, mask=~has_edge), pa.array(wanted)], schema=TOPOLOGY_SCHEMA
    )


def _int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


class TreeRows:
    """The delta rows of every kept tree, in ``(root, piece, state_group)`` order.

    Built with numpy instead of a hash join: each delta row finds its tree rows
    by binary search (a split tree's root has one tree row per piece), groups
    without delta rows get one placeholder row, and one stable argsort on the
    trees' rank orders everything.
    """

    def __init__(self, trees: pa.Table, state: pa.Table) -> None:
        self.trees = trees
        self.state = state
        roots = _int64(trees.column("root"))
        pieces = _int64(trees.column("piece"))
        t_groups = _int64(trees.column("state_group"))
        rank = np.empty(len(t_groups), dtype=np.int64)
        rank[np.lexsort((t_groups, pieces, roots))] = np.arange(len(t_groups))

        s_groups = _int64(state.column("state_group"))
        order = np.argsort(t_groups, kind="stable")
        sorted_groups = t_groups[order]
        lo = np.searchsorted(sorted_groups, s_groups, side="left")
        hi = np.searchsorted(sorted_groups, s_groups, side="right")
        counts = hi - lo  # 0 for rows of groups outside the kept trees
        state_row = np.repeat(np.arange(len(s_groups)), counts)
        within = np.arange(len(state_row)) - np.repeat(np.cumsum(counts) - counts, counts)
        tree_row = order[np.repeat(lo, counts) + within]

        has_rows = np.zeros(len(t_groups), dtype=np.bool_)
        has_rows[tree_row] = True
        empty = np.flatnonzero(~has_rows)
        tree_row = np.concatenate([tree_row, empty])
        state_row = np.concatenate([state_row, np.full(len(empty), -1, dtype=np.int64)])
        ordering = np.argsort(rank[tree_row], kind="stable")
        self.tree_row = tree_row[ordering]
        self.state_row = state_row[ordering]
        sorted_rank = rank[self.tree_row]
        key_roots = roots[self.tree_row]
        key_pieces = pieces[self.tree_row]
        change = (key_roots[1:] != key_roots[:-1]) | (key_pieces[1:] != key_pieces[:-1])
        self.tree_starts = np.flatnonzero(np.r_[True, change]) if len(sorted_rank) else np.zeros(0, np.int64)

    @property
    def num_rows(self) -> int:
        return len(self.tree_row)

    def take(self, lo: int, hi: int) -> pa.Table:
        """Sorted rows ``lo:hi`` as a table of TREE_ROWS_SCHEMA columns."""
        tree_part = self.trees.take(pa.array(self.tree_row[lo:hi]))
        rows = self.state_row[lo:hi]
        missing = rows < 0
        indices = pa.array(np.where(missing, 0, rows), mask=missing)
        state_part = self.state.select(["type", "state_key", "event_id"]).take(indices)
        return pa.Table.from_arrays(
            tree_part.columns + state_part.columns, names=tree_part.column_names + state_part.column_names
        )

    def chunks(self, rows: int = 0) -> Iterator[pa.Table]:
        """Consecutive tables of whole trees, about *rows* rows each."""
        rows = rows or CHUNK_ROWS
        total = self.num_rows
        bounds = np.r_[self.tree_starts, total]
        lo = 0
        while lo < total:
            target = lo + rows
            hi = int(bounds[np.searchsorted(bounds, target)]) if target < total else total
            yield self.take(lo, hi)
            lo = hi


def reconstruct_local(source: Source, options: ReconstructOptions) -> ReconstructResult:
    """Reconstruct full states (or digests) into ``options.output`` in this process."""
    prepare_output(options.output, options.overwrite)
    result = ReconstructResult(options.output, digest=options.digest)
    clock = time.perf_counter()
    tables = load_tables(source, options.referenced_by_events)
    result.timings["read"] = time.perf_counter() - clock

    clock = time.perf_counter()
    trees = assign_trees(build_topology(tables, options), options.split_threshold)
    tree_rows = TreeRows(trees, tables["state_groups_state"])
    del tables
    result.wanted_groups = int(pc.sum(trees.column("wanted")).as_py() or 0)
    result.timings["trees"] = time.perf_counter() - clock

    os.makedirs(options.output, exist_ok=True)
    schema = DIGEST_SCHEMA if options.digest else STATE_OUTPUT_SCHEMA
    expand_time = write_time = 0.0
    path = os.path.join(options.output, "part-00000.parquet")
    with pq.ParquetWriter(path, schema, **OUTPUT_PARQUET_OPTIONS) as writer:
        for chunk in tree_rows.chunks():
            batches = expand_table(chunk, options.digest)
            while True:
                clock = time.perf_counter()
                batch = next(batches, None)
                expand_time += time.perf_counter() - clock
                if batch is None:
                    break
                clock = time.perf_counter()
                writer.write_batch(batch)
                write_time += time.perf_counter() - clock
                result.rows += batch.num_rows
    open(os.path.join(options.output, "_SUCCESS"), "w").close()
    result.timings["expand"] = expand_time
    result.timings["write"] = write_time
    if options.verify:
        from streamrep.spark.verify import verify_output

        clock = time.perf_counter()
        wanted = trees.filter(trees.column("wanted")).column("state_group").to_numpy()
        result.verified = verify_output(source, options, wanted)
        result.timings["verify"] = time.perf_counter() - clock
    return result
