"""State compression in one process: the Spark job's pipeline without Spark.

Reads the topology (``state_groups``, ``state_group_edges`` and, when asked,
``event_to_state_groups``), groups the trees into units, then handles the delta
rows a bucket of whole units at a time so memory stays bounded as the tables
grow: one streaming pass over ``state_groups_state`` (Parquet/CSV files or
``COPY`` out of the database) writes each row into its bucket's scratch Parquet
file, and each bucket is then read back alone, ordered by unit in numpy and
handed in batches of whole units to
:func:`streamrep.spark.compress.compress_units`. Inputs of a single bucket skip
the scratch files.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streamrep.spark.compress import (
    UNIT_TOPOLOGY_SCHEMA,
    CompressOptions,
    CompressResult,
    OutputWriter,
    assign_units,
    compress_units,
    finish_output,
)
from streamrep.spark.local import TreeRows, _int64, group_edges, read_columns
from streamrep.spark.options import Source, prepare_output
from streamrep.spark.tables import SCHEMAS, iter_db_table, require_table, table_dataset

__all__ = ["compress_local", "load_compress_tables", "unit_topology", "BUCKET_GROUPS"]

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
        for batch in dataset.to_batches(columns=names):
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

    def read(self, bucket: int) -> pa.Table:
        if bucket not in self.writers:
            return _STATE_SCHEMA.empty_table()
        return pq.read_table(self.path(bucket))


def _spill_state(source: Source, units: pa.Table, bucket: np.ndarray, spill: _Spill) -> None:
    """Write every delta row into the scratch file of each bucket holding its
    group (a split tree's root is in several units, maybe several buckets)."""
    pairs = np.unique(np.stack([_int64(units.column("state_group")), bucket.astype(np.int64)]), axis=1)
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


def compress_local(source: Source, options: CompressOptions, bucket_groups: int = 0) -> CompressResult:
    """Compress every room's state groups into ``options.output`` in this process.

    *bucket_groups* (default :data:`BUCKET_GROUPS`) bounds the groups whose
    delta rows are in memory at once.
    """
    prepare_output(options.output, options.overwrite)
    result = CompressResult(options.output)
    clock = time.perf_counter()
    tables = load_compress_tables(source, options.find_unreferenced, with_state=False)
    result.timings["read"] = time.perf_counter() - clock

    clock = time.perf_counter()
    units = assign_units(unit_topology(tables), options.split_threshold)
    del tables
    bucket = _buckets(units, bucket_groups or BUCKET_GROUPS)
    count = int(bucket.max()) + 1 if len(bucket) else 1
    result.timings["units"] = time.perf_counter() - clock

    os.makedirs(options.output, exist_ok=True)
    spill = _Spill(os.path.join(options.output, "_spill"), count) if count > 1 else None
    try:
        clock = time.perf_counter()
        if spill is not None:
            _spill_state(source, units, bucket, spill)
            spill.close()
            result.timings["spill"] = time.perf_counter() - clock
        clock = time.perf_counter()
        writer = OutputWriter(options.output, "part-00000")
        try:
            for b in range(count):
                if spill is None:
                    state = read_columns(source, {"state_groups_state": _COLUMNS["state_groups_state"]})[
                        "state_groups_state"]
                    mine = units
                else:
                    state = spill.read(b)
                    mine = units.filter(pa.array(bucket == b))
                trees = mine.append_column("root", mine.column("unit")).append_column(
                    "piece", pa.array(np.zeros(mine.num_rows, dtype=np.int32)))
                rows = TreeRows(trees, state)
                del state
                for chunk in rows.chunks(CHUNK_ROWS):
                    produced = compress_units(chunk, options)
                    writer.write(produced.tables)
                    result.add(pa.table({k: [v] for k, v in produced.report.items()}))
                del rows, trees
        finally:
            writer.close()
    finally:
        if spill is not None:
            shutil.rmtree(spill.folder, ignore_errors=True)
    finish_output(options.output)
    result.timings["compress_verify_write"] = time.perf_counter() - clock
    return result
