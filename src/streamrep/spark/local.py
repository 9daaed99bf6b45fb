"""The single-process mode: the same pipeline as the Spark job, without Spark.

Reads the topology with pyarrow (or out of the database), assigns trees, then
streams the delta rows a bucket of whole trees at a time, interning them as
they come, and feeds batches of whole trees to the compiled core, writing
Parquet as it goes. Suits a few million groups on
one machine; the Spark job is for more.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from streamrep.spark.batches import (
    DIGEST_SCHEMA,
    OUTPUT_PARQUET_OPTIONS,
    STATE_OUTPUT_SCHEMA,
    TOPOLOGY_SCHEMA,
    _Interned,
    assign_trees,
    expand_groups,
)
from streamrep.spark.interned import InternedSlots, _int64, parents_within
from streamrep.spark.options import ReconstructOptions, ReconstructResult, Source, prepare_output
from streamrep.spark.spill import BUCKET_GROUPS, interned_bucket, spill_buckets
from streamrep.spark.tables import locate_table, read_db_table, read_table

__all__ = ["reconstruct_local", "load_tables", "read_columns", "build_topology", "group_edges", "TreeRows"]

#: Rows of sorted tree data handed to the core per call.
CHUNK_ROWS = 1_000_000


def load_tables(source: Source, need_events: bool, with_state: bool = True) -> dict[str, pa.Table]:
    """The state tables as Arrow tables (only the columns the job uses;
    ``state_groups_state`` unless *with_state* is False)."""
    columns = {
        "state_groups": ["id", "room_id"],
        "state_group_edges": ["state_group", "prev_state_group"],
        "state_groups_state": ["state_group", "type", "state_key", "event_id"],
        "event_to_state_groups": ["state_group"],
    }
    if not with_state:
        del columns["state_groups_state"]
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


def _tree_buckets(trees: pa.Table, bucket_groups: int) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """*trees* sorted by ``(root, piece, state_group)``, each row's segment
    (its ``(root, piece)``, numbered) and bucket (consecutive whole segments
    of about *bucket_groups* groups)."""
    roots = _int64(trees.column("root"))
    pieces = _int64(trees.column("piece"))
    groups = _int64(trees.column("state_group"))
    order = np.lexsort((groups, pieces, roots))
    trees = trees.take(pa.array(order))
    roots, pieces = roots[order], pieces[order]
    change = np.r_[True, (roots[1:] != roots[:-1]) | (pieces[1:] != pieces[:-1])] if len(roots) else \
        np.zeros(0, np.bool_)
    segment = np.cumsum(change) - 1
    starts = np.flatnonzero(change)
    bucket_of_segment = np.unique(starts // max(1, bucket_groups), return_inverse=True)[1]
    return trees, segment, bucket_of_segment[segment] if len(segment) else segment


def _expand_bucket(trees: pa.Table, segment: np.ndarray, slots: InternedSlots,
                   digest: bool) -> Iterator[pa.RecordBatch]:
    """Walk one bucket's trees (sorted, with their segments) in batches of
    whole trees of about :data:`CHUNK_ROWS` delta rows."""
    groups = _int64(trees.column("state_group"))
    parents = parents_within(segment, groups, _int64(trees.column("prev_state_group")))
    wanted = np.asarray(trees.column("wanted").combine_chunks().fill_null(False).to_numpy(zero_copy_only=False),
                        dtype=np.bool_)
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]]) if len(segment) else segment
    for lo, hi in slots.spans(starts, CHUNK_ROWS):
        row_lo, row_hi = int(slots.offsets[lo]), int(slots.offsets[hi])
        interned = _Interned.of(slots.types, slots.state_keys, slots.event_ids,
                                slots.keys[row_lo:row_hi], slots.events[row_lo:row_hi])
        local = parents[lo:hi]
        yield from expand_groups(groups[lo:hi], np.where(local >= 0, local - lo, -1), wanted[lo:hi],
                                 slots.offsets[lo:hi + 1] - row_lo, interned, digest)


def reconstruct_local(source: Source, options: ReconstructOptions,
                      progress: Callable[[int, int], None] | None = None) -> ReconstructResult:
    """Reconstruct full states (or digests) into ``options.output`` in this process.

    The delta rows are read once per bucket of whole trees (about
    250,000 groups; scratch files when there are several) and held interned,
    never as strings per row. *progress* is called with the groups done and
    the groups in all after each bucket.
    """
    prepare_output(options.output, options.overwrite)
    result = ReconstructResult(options.output, digest=options.digest)
    clock = time.perf_counter()
    tables = load_tables(source, options.referenced_by_events, with_state=False)
    result.timings["read"] = time.perf_counter() - clock

    clock = time.perf_counter()
    trees = assign_trees(build_topology(tables, options), options.split_threshold)
    del tables
    trees, segment, bucket = _tree_buckets(trees, BUCKET_GROUPS)
    count = int(bucket.max()) + 1 if len(bucket) else 1
    result.wanted_groups = int(pc.sum(trees.column("wanted")).as_py() or 0)
    result.timings["trees"] = time.perf_counter() - clock

    os.makedirs(options.output, exist_ok=True)
    schema = DIGEST_SCHEMA if options.digest else STATE_OUTPUT_SCHEMA
    expand_time = write_time = 0.0
    path = os.path.join(options.output, "part-00000.parquet")
    groups = _int64(trees.column("state_group"))
    spill = spill_buckets(source, options.output, groups, bucket, count)
    try:
        with pq.ParquetWriter(path, schema, **OUTPUT_PARQUET_OPTIONS) as writer:
            for b in range(count):
                clock = time.perf_counter()
                mine = np.flatnonzero(bucket == b) if spill is not None else np.arange(len(groups))
                part = trees.take(pa.array(mine)) if spill is not None else trees
                slots = interned_bucket(source, spill, b, groups[mine])
                batches = _expand_bucket(part, segment[mine], slots, options.digest)
                expand_time += time.perf_counter() - clock
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
                del slots, batches
                if progress is not None:
                    progress(len(groups) if spill is None else int((bucket <= b).sum()), len(groups))
    finally:
        if spill is not None:
            shutil.rmtree(spill.folder, ignore_errors=True)
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
