"""Delta rows a bucket of whole trees (or units) at a time, for the single-process modes.

The topology is read first and cut into buckets of about :data:`BUCKET_GROUPS`
groups. One streaming pass over ``state_groups_state`` (Parquet/CSV files or
``COPY`` out of the database) writes each row into its bucket's scratch Parquet
file (:func:`spill_buckets`); each bucket is then read back alone and interned
as it streams in (:func:`interned_bucket`), so memory follows the largest bucket,
not the table. Inputs of a single bucket skip the scratch files.
"""

from __future__ import annotations

import os
import shutil
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streamrep.spark.interned import InternedSlots, RowInterner, _int64
from streamrep.spark.options import Source
from streamrep.spark.tables import (
    DELTA_ROW_COUNTS_SCHEMA,
    DELTA_ROW_COUNTS_SQL,
    SCHEMAS,
    iter_db_query,
    iter_db_table,
    require_table,
    table_dataset,
)

__all__ = ["BUCKET_GROUPS", "bucket_rows", "group_row_counts", "interned_bucket", "spill_buckets"]

#: Groups per bucket held in memory at once (whole trees or units; a unit is
#: at most ``split_threshold`` groups).
BUCKET_GROUPS = 250_000

#: Rows a bucket buffers before writing them to its scratch file.
_SPILL_ROWS = 131_072

_STATE_SCHEMA = pa.schema([SCHEMAS["state_groups_state"].field(c)
                           for c in ("state_group", "type", "state_key", "event_id")])


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


def group_row_counts(source: Source, group_ids: np.ndarray) -> np.ndarray:
    """The delta rows of each of *group_ids* (sorted); rows of other groups are
    not counted. A database counts them itself (a row per group comes back);
    files are read in one streaming pass over ``state_group``."""
    counts = np.zeros(len(group_ids), np.int64)
    if source.db_url is not None:
        for batch in iter_db_query(source.db_url, DELTA_ROW_COUNTS_SQL, DELTA_ROW_COUNTS_SCHEMA):
            _add_counts(counts, group_ids, _int64(batch.column("count_group")),
                        _int64(batch.column("counted")))
        return counts
    assert source.input_dir is not None
    dataset = table_dataset(require_table(source.input_dir, "state_groups_state"))
    for batch in dataset.to_batches(columns=["state_group"], batch_size=_SPILL_ROWS, batch_readahead=0,
                                    fragment_readahead=1, use_threads=False):
        _add_counts(counts, group_ids, _int64(batch.column("state_group")), None)
    return counts


def _add_counts(counts: np.ndarray, group_ids: np.ndarray, groups: np.ndarray,
                weights: np.ndarray | None) -> None:
    """Add to *counts* (one per sorted *group_ids*) a row per entry of *groups*,
    or *weights* rows each; groups not in *group_ids* are left out."""
    if not len(group_ids):
        return
    at = np.minimum(np.searchsorted(group_ids, groups), len(group_ids) - 1)
    known = group_ids[at] == groups
    counts += np.bincount(at[known], weights=None if weights is None else weights[known],
                          minlength=len(group_ids)).astype(np.int64)


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
