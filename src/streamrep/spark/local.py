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
    STATE_SCHEMA,
    TOPOLOGY_SCHEMA,
    assign_trees,
    expand_table,
)
from streamrep.spark.options import ReconstructOptions, ReconstructResult, Source, prepare_output
from streamrep.spark.tables import locate_table, read_db_table, read_table

__all__ = ["reconstruct_local", "load_tables", "build_topology", "sorted_tree_rows"]

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
    names = list(columns)[:3] + (["event_to_state_groups"] if need_events else [])
    tables = {}
    for name in names:
        if source.input_dir is not None:
            if name == "event_to_state_groups" and locate_table(source.input_dir, name) is None:
                from streamrep.errors import ConfigError

                raise ConfigError(f"{source.input_dir} has no event_to_state_groups to restrict by")
            tables[name] = read_table(source.input_dir, name, columns[name])
        else:
            assert source.db_url is not None
            tables[name] = read_db_table(source.db_url, name).select(columns[name])
    return tables


def build_topology(tables: dict[str, pa.Table], options: ReconstructOptions) -> pa.Table:
    """One row per group with its prev group and whether it is wanted."""
    groups = tables["state_groups"]
    edges = tables["state_group_edges"]
    joined = groups.join(edges, keys="id", right_keys="state_group", join_type="left outer")
    wanted = pa.array(np.ones(joined.num_rows, dtype=np.bool_))
    if options.groups:
        wanted = pc.and_(wanted, pc.is_in(joined.column("id"), pa.array(options.groups, pa.int64())))
    if options.rooms:
        wanted = pc.and_(wanted, pc.fill_null(
            pc.is_in(joined.column("room_id"), pa.array(options.rooms, pa.string())), False))
    if options.referenced_by_events:
        referenced = pc.unique(tables["event_to_state_groups"].column("state_group").combine_chunks())
        wanted = pc.and_(wanted, pc.is_in(joined.column("id"), referenced))
    return pa.table(
        [joined.column("id"), joined.column("prev_state_group"), wanted], schema=TOPOLOGY_SCHEMA
    )


def sorted_tree_rows(trees: pa.Table, state: pa.Table) -> tuple[pa.Table, pa.Array, np.ndarray]:
    """Trees joined with their delta rows, plus the order that sorts them by tree.

    Returns the joined table, sort indices, and the sorted positions where a new
    ``(root, piece)`` starts.
    """
    rows = trees.join(state, keys="state_group", join_type="left outer")
    order = pc.sort_indices(
        rows, sort_keys=[("root", "ascending"), ("piece", "ascending"), ("state_group", "ascending")]
    )
    roots = rows.column("root").take(order).to_numpy()
    pieces = rows.column("piece").take(order).to_numpy()
    starts = np.flatnonzero(np.r_[True, (roots[1:] != roots[:-1]) | (pieces[1:] != pieces[:-1])])
    return rows, order, starts


def _chunks(rows: pa.Table, order: pa.Array, starts: np.ndarray) -> Iterator[pa.Table]:
    total = rows.num_rows
    bounds = np.r_[starts, total]
    lo = 0
    while lo < total:
        # The first tree start at or after lo + CHUNK_ROWS (whole trees only).
        hi = int(bounds[np.searchsorted(bounds, lo + CHUNK_ROWS)]) if lo + CHUNK_ROWS < total else total
        yield rows.take(order.slice(lo, hi - lo))
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
    rows, order, starts = sorted_tree_rows(trees, tables["state_groups_state"])
    del tables
    result.wanted_groups = int(pc.sum(trees.column("wanted")).as_py() or 0)
    result.timings["trees"] = time.perf_counter() - clock

    os.makedirs(options.output, exist_ok=True)
    schema = DIGEST_SCHEMA if options.digest else STATE_SCHEMA
    expand_time = write_time = 0.0
    path = os.path.join(options.output, "part-00000.parquet")
    with pq.ParquetWriter(path, schema, compression="snappy") as writer:
        for chunk in _chunks(rows, order, starts):
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
