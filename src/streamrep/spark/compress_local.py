"""State compression in one process: the Spark job's pipeline without Spark.

Reads the topology (``state_groups``, ``state_group_edges`` and, when asked,
``event_to_state_groups``), groups the trees into units, then handles the delta
rows a bucket of whole units at a time so memory stays bounded as the tables
grow: one streaming pass over ``state_groups_state`` (Parquet/CSV files or
``COPY`` out of the database) writes each row into its bucket's scratch Parquet
file, and each bucket is then read back alone,
interned as it streams in (:mod:`streamrep.spark.interned`: integer columns,
no strings per row) and handed in batches of whole units to
:func:`streamrep.spark.compress.compress_batch`. Inputs of a single bucket skip
the scratch files.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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
from streamrep.spark.interned import InternedSlots, RowInterner, parents_within
from streamrep.spark.local import _int64, group_edges, read_columns
from streamrep.spark.options import Source, prepare_output
from streamrep.spark.tables import SCHEMAS, iter_db_table, require_table, table_dataset

__all__ = ["compress_local", "load_compress_tables", "unit_topology", "interned_bucket", "spill_buckets",
           "BUCKET_GROUPS"]

#: Rows of sorted unit data handed to the core per call.
CHUNK_ROWS = 1_000_000

#: Groups per bucket of units held in memory at once (whole units; a unit is
#: at most ``split_threshold`` groups).
BUCKET_GROUPS = 250_000

#: Rows a bucket buffers before writing them to its scratch file.
_SPILL_ROWS = 131_072

_COLUMNS = {
    "state_groups": ["id", "room_id", "event_id"],
    "state_group_edges": ["state_group", "prev_state_group"],
    "state_groups_state": ["state_group", "type", "state_key", "event_id"],
    "event_to_state_groups": ["state_group"],
}

_STATE_SCHEMA = pa.schema([SCHEMAS["state_groups_state"].field(c) for c in _COLUMNS["state_groups_state"]])


def load_compress_tables(source: Source, find_unreferenced: bool,
                         with_state: bool = True) -> dict[str, pa.Table]:
    """The tables compression reads (``event_to_state_groups`` only when
    asked, ``state_groups_state`` unless *with_state* is False)."""
    names = ["state_groups", "state_group_edges"] + (["state_groups_state"] if with_state else []) \
        + (["event_to_state_groups"] if find_unreferenced else [])
    return read_columns(source, {name: _COLUMNS[name] for name in names})


def unit_topology(tables: dict[str, pa.Table]) -> pa.Table:
    """One row per (group, edge) with room, own event and whether it is referenced."""
    groups = tables["state_groups"]
    group_ids, row_group, prev, has_edge = group_edges(tables)
    if "event_to_state_groups" in tables:
        referenced = np.isin(group_ids, _int64(tables["event_to_state_groups"].column("state_group")))
    else:
        referenced = np.ones(len(group_ids), dtype=np.bool_)
    take = pa.array(row_group)
    return pa.table(
        [pa.array(group_ids), pa.array(prev, mask=~has_edge), pa.array(np.ones(len(group_ids), np.bool_)),
         groups.column("room_id").combine_chunks().take(take),
         groups.column("event_id").combine_chunks().take(take), pa.array(referenced)],
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


def _state_batches(source: Source) -> Iterator[pa.RecordBatch]:
    """``state_groups_state`` (the columns compression uses), streamed."""
    names = _STATE_SCHEMA.names
    if source.input_dir is not None:
        dataset = table_dataset(require_table(source.input_dir, "state_groups_state"))
        # One batch in flight: the scanner would otherwise read many ahead.
        for batch in dataset.to_batches(columns=names, batch_size=_SPILL_ROWS, batch_readahead=0,
                                        fragment_readahead=1, use_threads=False):
            yield batch if batch.schema == _STATE_SCHEMA else batch.cast(_STATE_SCHEMA)
        return
    assert source.db_url is not None
    for batch in iter_db_table(source.db_url, "state_groups_state"):
        yield pa.RecordBatch.from_arrays([batch.column(n) for n in names], schema=_STATE_SCHEMA)


class _Spill:
    """Scratch Parquet files of delta rows, one per bucket."""

    def __init__(self, folder: str, count: int) -> None:
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        self.writers: dict[int, pq.ParquetWriter] = {}
        self.pending: list[list[pa.Table]] = [[] for _ in range(count)]
        self.pending_rows = [0] * count

    def path(self, bucket: int) -> str:
        return os.path.join(self.folder, f"bucket-{bucket:05d}.parquet")

    def add(self, bucket: int, rows: pa.Table) -> None:
        self.pending[bucket].append(rows)
        self.pending_rows[bucket] += rows.num_rows
        if self.pending_rows[bucket] >= _SPILL_ROWS:
            self._flush(bucket)

    def _flush(self, bucket: int) -> None:
        if not self.pending[bucket]:
            return
        if bucket not in self.writers:
            self.writers[bucket] = pq.ParquetWriter(self.path(bucket), _STATE_SCHEMA, compression="lz4")
        self.writers[bucket].write_table(pa.concat_tables(self.pending[bucket]))
        self.pending[bucket], self.pending_rows[bucket] = [], 0

    def close(self) -> None:
        for bucket in range(len(self.pending)):
            self._flush(bucket)
        for writer in self.writers.values():
            writer.close()



def _spill_state(source: Source, slot_groups: np.ndarray, bucket: np.ndarray, spill: _Spill) -> None:
    """Write every delta row into the scratch file of each bucket holding its
    group (a split tree's root is in several units, maybe several buckets)."""
    pairs = np.unique(np.stack([slot_groups, bucket.astype(np.int64)]), axis=1)
    pair_groups, pair_buckets = pairs[0], pairs[1]  # sorted by group
    for batch in _state_batches(source):
        groups = _int64(batch.column("state_group"))
        lo = np.searchsorted(pair_groups, groups, side="left")
        hi = np.searchsorted(pair_groups, groups, side="right")
        counts = hi - lo  # 0 for rows of groups in no unit
        row = np.repeat(np.arange(len(groups)), counts)
        within = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
        row_bucket = pair_buckets[np.repeat(lo, counts) + within]
        order = np.argsort(row_bucket, kind="stable")
        row, row_bucket = row[order], row_bucket[order]
        cuts = np.flatnonzero(np.r_[True, row_bucket[1:] != row_bucket[:-1]]).tolist() if len(row) else []
        table = pa.Table.from_batches([batch])
        for start, end in zip(cuts, cuts[1:] + [len(row)]):
            spill.add(int(row_bucket[start]), table.take(pa.array(row[start:end])))


def bucket_rows(source: Source, spill: _Spill | None, bucket: int) -> Iterator[pa.RecordBatch]:
    """The delta rows of one bucket, streamed (every row without a spill)."""
    if spill is None:
        yield from _state_batches(source)
    elif bucket in spill.writers:
        yield from pq.ParquetFile(spill.path(bucket)).iter_batches(batch_size=_SPILL_ROWS)


def interned_bucket(source: Source, spill: _Spill | None, bucket: int, slot_groups: np.ndarray
                    ) -> InternedSlots:
    """The bucket's delta rows interned as they stream in, as CSR over its slots."""
    interner = RowInterner(slot_groups)
    for batch in bucket_rows(source, spill, bucket):
        interner.add(batch)
    return interner.finish()


def spill_buckets(source: Source, output: str, slot_groups: np.ndarray, bucket: np.ndarray,
                  count: int) -> _Spill | None:
    """Scratch files of each bucket's delta rows, or None for a single bucket."""
    if count <= 1:
        return None
    spill = _Spill(os.path.join(output, "_spill"), count)
    try:
        _spill_state(source, slot_groups, bucket, spill)
        spill.close()
    except BaseException:
        shutil.rmtree(spill.folder, ignore_errors=True)
        raise
    return spill


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
    units = assign_units(unit_topology(tables), options.split_threshold)
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
