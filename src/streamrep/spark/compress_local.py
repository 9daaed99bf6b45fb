"""State compression in one process: the Spark job's pipeline without Spark.

Reads the topology (``state_groups``, ``state_group_edges`` and, when asked,
``event_to_state_groups``), groups the trees into units, then handles the delta
rows a bucket of whole units at a time so memory stays bounded as the tables
grow: one streaming pass over ``state_groups_state`` (Parquet/CSV files or
``COPY`` out of the database) writes each row into its bucket's scratch Parquet
file (:mod:`streamrep.spark.spill`), and each bucket is then read back alone,
interned as it streams in (:mod:`streamrep.spark.interned`: integer columns,
no strings per row) and handed in batches of whole units to
:func:`streamrep.spark.compress.compress_batch`. Inputs of a single bucket skip
the scratch files.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Callable

import numpy as np
import pyarrow as pa

from streamrep.spark.batches import _Interned
from streamrep.spark.compress import (
    UNIT_TOPOLOGY_SCHEMA,
    CompressOptions,
    CompressResult,
    GroupBatch,
    OutputWriter,
    assign_units,
    compress_batch,
    finish_output,
)
from streamrep.spark.interned import InternedSlots, _int64, parents_within
from streamrep.spark.local import group_edges, read_columns
from streamrep.spark.options import Source, prepare_output
from streamrep.spark.spill import BUCKET_GROUPS, group_row_counts, interned_bucket, spill_buckets

__all__ = ["compress_local", "load_compress_tables", "unit_topology"]

#: Rows of sorted unit data handed to the core per call.
CHUNK_ROWS = 1_000_000

_COLUMNS = {
    "state_groups": ["id", "room_id", "event_id"],
    "state_group_edges": ["state_group", "prev_state_group"],
    "state_groups_state": ["state_group", "type", "state_key", "event_id"],
    "event_to_state_groups": ["state_group"],
}


def load_compress_tables(source: Source, find_unreferenced: bool,
                         with_state: bool = True) -> dict[str, pa.Table]:
    """The tables compression reads (``event_to_state_groups`` only when
    asked, ``state_groups_state`` unless *with_state* is False)."""
    names = ["state_groups", "state_group_edges"] + (["state_groups_state"] if with_state else []) \
        + (["event_to_state_groups"] if find_unreferenced else [])
    return read_columns(source, {name: _COLUMNS[name] for name in names})


def unit_topology(tables: dict[str, pa.Table], source: Source | None = None) -> pa.Table:
    """One row per (group, edge) with room, own event and whether it is
    referenced; with *source*, also its count of delta rows (one more pass
    over ``state_group`` of ``state_groups_state``)."""
    groups = tables["state_groups"]
    group_ids, row_group, prev, has_edge = group_edges(tables)
    if source is not None:
        order = np.argsort(group_ids, kind="stable")
        counts = np.empty(len(group_ids), np.int64)
        counts[order] = group_row_counts(source, group_ids[order])
        rows = pa.array(counts)
    else:
        rows = pa.nulls(len(group_ids), pa.int64())
    if "event_to_state_groups" in tables:
        referenced = np.isin(group_ids, _int64(tables["event_to_state_groups"].column("state_group")))
    else:
        referenced = np.ones(len(group_ids), dtype=np.bool_)
    take = pa.array(row_group)
    return pa.table(
        [pa.array(group_ids), pa.array(prev, mask=~has_edge), pa.array(np.ones(len(group_ids), np.bool_)),
         groups.column("room_id").combine_chunks().take(take),
         groups.column("event_id").combine_chunks().take(take), pa.array(referenced), rows],
        schema=UNIT_TOPOLOGY_SCHEMA,
    )


def _buckets(units: pa.Table, bucket_groups: int) -> np.ndarray:
    """The bucket of each row of *units*: consecutive whole units of about
    *bucket_groups* groups."""
    unit = _int64(units.column("unit"))
    ids, first, sizes = np.unique(unit, return_index=True, return_counts=True)
    ends = np.cumsum(sizes)
    # A unit goes into the bucket its first group falls in.
    of_unit = (ends - sizes) // max(1, bucket_groups)
    # Number the buckets densely.
    of_unit = np.unique(of_unit, return_inverse=True)[1]
    bucket: np.ndarray = of_unit[np.searchsorted(ids, unit)]
    return bucket


def _compress_bucket(mine: pa.Table, slots: InternedSlots, options: CompressOptions,
                     writer: OutputWriter, result: CompressResult) -> None:
    """Compress one bucket's units (*mine*, sorted by unit and group) in
    batches of whole units of about :data:`CHUNK_ROWS` delta rows."""
    batch_all = GroupBatch.from_table(mine)
    unit_starts = np.flatnonzero(np.r_[True, batch_all.unit[1:] != batch_all.unit[:-1]])
    for lo, hi in slots.spans(unit_starts, CHUNK_ROWS):
        batch = GroupBatch.from_table(mine.slice(lo, hi - lo))
        parent = parents_within(batch.unit, batch.groups, batch.prevs)
        row_lo, row_hi = int(slots.offsets[lo]), int(slots.offsets[hi])
        interned = _Interned.of(slots.types, slots.state_keys, slots.event_ids,
                                slots.keys[row_lo:row_hi], slots.events[row_lo:row_hi])
        produced = compress_batch(batch, parent, slots.offsets[lo:hi + 1] - row_lo, interned, options)
        result.add(pa.table({k: [v] for k, v in produced.report.items()}))
        for piece in produced.pieces:
            writer.write(piece)
        del produced, interned


def compress_local(source: Source, options: CompressOptions, bucket_groups: int = 0,
                   progress: Callable[[int, int], None] | None = None) -> CompressResult:
    """Compress every room's state groups into ``options.output`` in this process.

    *bucket_groups* (default :data:`BUCKET_GROUPS`) bounds the groups whose
    delta rows are in memory at once; those rows are held interned (about 20
    bytes each), never as strings. *progress* is called with the groups done
    and the groups in all after each bucket.
    """
    prepare_output(options.output, options.overwrite)
    result = CompressResult(options.output)
    clock = time.perf_counter()
    tables = load_compress_tables(source, options.find_unreferenced, with_state=False)
    result.timings["read"] = time.perf_counter() - clock

    clock = time.perf_counter()
    # Rows are counted only for a bound on them: the count is one more pass.
    bound = options.unit_row_bound
    units = assign_units(unit_topology(tables, source if bound else None), options.split_threshold,
                         options.max_depth, bound)
    del tables
    units = units.take(pa.array(np.lexsort((_int64(units.column("state_group")), _int64(units.column("unit"))))))
    bucket = _buckets(units, bucket_groups or BUCKET_GROUPS)
    count = int(bucket.max()) + 1 if len(bucket) else 1
    result.timings["units"] = time.perf_counter() - clock

    os.makedirs(options.output, exist_ok=True)
    clock = time.perf_counter()
    spill = spill_buckets(source, options.output, _int64(units.column("state_group")), bucket, count)
    if spill is not None:
        result.timings["spill"] = time.perf_counter() - clock
    try:
        read = work = 0.0
        done = 0
        writer = OutputWriter(options.output, "part-00000")
        try:
            for b in range(count):
                clock = time.perf_counter()
                mine = units if spill is None else units.filter(pa.array(bucket == b))
                slots = interned_bucket(source, spill, b, _int64(mine.column("state_group")))
                read += time.perf_counter() - clock
                clock = time.perf_counter()
                _compress_bucket(mine, slots, options, writer, result)
                del slots
                work += time.perf_counter() - clock
                if progress is not None:
                    done += mine.num_rows
                    progress(done, units.num_rows)
        finally:
            writer.close()
    finally:
        if spill is not None:
            shutil.rmtree(spill.folder, ignore_errors=True)
    finish_output(options.output)
    result.timings["intern"] = read
    result.timings["compress_verify_write"] = work
    return result
