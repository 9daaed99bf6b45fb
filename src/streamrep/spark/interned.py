"""Delta rows interned as they stream in, for the single-process modes.

The single-process jobs never hold a delta row's strings: each record batch of
``state_groups_state`` (out of ``COPY`` or the input files) is interned at once
by the tree walker core's :class:`StringInterner` (``type``, ``state_key`` and
``event_id`` into IDs, each distinct string held once) and kept as four
integer columns, about 20 bytes a row. :meth:`RowInterner.finish` then orders
the rows by *slot* (a group's place in the batch the core walks: a unit's or a
tree's groups in order) and ranks ``type`` and ``state_key`` in bytewise order,
giving the CSR deltas and string tables the cores read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamrep import _impl
from streamrep.errors import StateCorruptionError

if TYPE_CHECKING:
    from streamrep._pure import treewalk as _core_walk
else:
    _core_walk = _impl.load("treewalk")

__all__ = ["RowInterner", "InternedSlots", "parents_within"]

#: Rows converted to int64 keys at a time (bounds numpy's temporaries).
_CONVERT_ROWS = 1 << 22


def _int64(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _large(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    large = column.cast(pa.large_string())
    if large.offset:
        large = pa.concat_arrays([large])
    return large


def _intern(interner: object, column: pa.Array) -> np.ndarray:
    buffers = column.buffers()
    offsets = buffers[1] if buffers[1] is not None else pa.py_buffer(bytes(8))
    ids = interner.intern(offsets, buffers[2] if buffers[2] is not None else b"")  # type: ignore[attr-defined]
    return np.frombuffer(ids, dtype=np.int64).astype(np.int32) if len(ids) else np.zeros(0, np.int32)


def _table(interner: object) -> pa.Array:
    offsets, data = interner.table()  # type: ignore[attr-defined]
    return pa.Array.from_buffers(pa.large_string(), len(interner),  # type: ignore[arg-type]
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


@dataclass
class InternedSlots:
    """Every slot's delta as CSR over interned IDs, and the string tables.

    ``keys`` are ``type_rank * stride + state_key_rank`` (ranks in bytewise
    order), ``events`` index ``event_ids``.
    """

    offsets: np.ndarray
    keys: np.ndarray
    events: np.ndarray
    types: pa.Array
    state_keys: pa.Array
    event_ids: pa.Array
    stride: int

    def spans(self, starts: np.ndarray, rows: int) -> Iterator[tuple[int, int]]:
        """Slot ranges ``(lo, hi)`` of whole units (a unit begins at each of
        *starts*), about *rows* delta rows each."""
        n = len(self.offsets) - 1
        bounds = np.r_[starts, n].astype(np.int64)
        at = self.offsets[bounds]
        lo = 0
        while lo < n:
            target = int(self.offsets[lo]) + rows
            k = int(np.searchsorted(at, target, side="left"))
            hi = int(bounds[min(k, len(bounds) - 1)])
            if hi <= lo:
                hi = int(bounds[np.searchsorted(bounds, lo, side="right")])
            yield lo, hi
            lo = hi


class RowInterner:
    """Collects the delta rows of given groups, interned, batch by batch.

    *slot_groups* holds the group of each slot, in the order the core wants;
    a group may fill several slots (a split tree's root copied into several
    pieces), and then its rows go to each. Rows of other groups are dropped.
    """

    def __init__(self, slot_groups: np.ndarray) -> None:
        self.slots = len(slot_groups)
        self._order = np.argsort(slot_groups, kind="stable")
        self._sorted = slot_groups[self._order]
        self.types = _core_walk.StringInterner()
        self.state_keys = _core_walk.StringInterner()
        self.events = _core_walk.StringInterner()
        # Slot, type, state_key and event ID columns, one array per batch.
        self._parts: tuple[list[np.ndarray], ...] = ([], [], [], [])

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Intern one batch of ``state_group, type, state_key, event_id`` rows."""
        groups = _int64(batch.column("state_group"))
        lo = np.searchsorted(self._sorted, groups, side="left")
        hi = np.searchsorted(self._sorted, groups, side="right")
        counts = hi - lo
        kept = counts > 0
        if not kept.all():
            batch = batch.filter(pa.array(kept))
            lo, counts, groups = lo[kept], counts[kept], groups[kept]
        if len(groups) == 0:
            return
        for name in ("type", "state_key", "event_id"):
            if batch.column(name).null_count:
                bad = np.unique(groups[~_bool(batch.column(name).is_valid())])
                shown = ", ".join(str(g) for g in bad[:10].tolist())
                err = StateCorruptionError(f"state_groups_state rows with a null {name} in groups {shown}")
                err.groups = tuple(int(g) for g in bad)  # type: ignore[attr-defined]
                raise err
        columns = [_intern(interner, _large(batch.column(name))) for interner, name in
                   ((self.types, "type"), (self.state_keys, "state_key"), (self.events, "event_id"))]
        if counts.max() == 1:
            slot = self._order[lo].astype(np.int32)
        else:
            row = np.repeat(np.arange(len(groups)), counts)
            within = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
            slot = self._order[np.repeat(lo, counts) + within].astype(np.int32)
            columns = [c[row] for c in columns]
        for part, column in zip(self._parts, [slot] + columns):
            part.append(column)

    def finish(self) -> InternedSlots:
        """The rows in slot order (a slot's rows in arrival order) as CSR."""
        slot, type_ids, key_ids, event_ids = (_joined(part) for part in self._parts)
        if len(slot) > 1 and not bool(np.all(slot[1:] >= slot[:-1])):
            order = np.argsort(slot, kind="stable")
            slot = slot[order]
            type_ids = type_ids[order]
            key_ids = key_ids[order]
            event_ids = event_ids[order]
            del order
        offsets = np.searchsorted(slot, np.arange(self.slots + 1), side="left").astype(np.int64)
        del slot
        types, type_rank = _ranked(_table(self.types))
        state_keys, key_rank = _ranked(_table(self.state_keys))
        stride = max(1, len(state_keys))
        keys = np.empty(len(type_ids), dtype=np.int64)
        for lo in range(0, len(keys), _CONVERT_ROWS):
            hi = lo + _CONVERT_ROWS
            keys[lo:hi] = type_rank[type_ids[lo:hi]] * np.int64(stride) + key_rank[key_ids[lo:hi]]
        del type_ids, key_ids
        events = event_ids.astype(np.int64)
        return InternedSlots(offsets, keys, events, types, state_keys, _table(self.events), stride)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The arrays of *parts* as one, emptying the list (one column's copy at a time)."""
    joined = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    parts.clear()
    return joined


def _bool(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _ranked(strings: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """*strings* sorted bytewise, and each original ID's rank."""
    order = _int64(pc.sort_indices(strings))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return strings.take(pa.array(order)), rank


def parents_within(segment: np.ndarray, groups: np.ndarray, prevs: np.ndarray) -> np.ndarray:
    """Each slot's prev as a slot index within its segment (-1: a root).

    Slots are sorted by ``(segment, group)``; *prevs* are group IDs (-1 for
    none). A prev missing from its segment raises StateCorruptionError.
    """
    n = len(groups)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    base = int(groups.min())
    span = int(groups.max()) - base + 1
    seg = segment - int(segment.min())
    if (int(seg.max()) + 1) * span >= (1 << 62):
        raise StateCorruptionError("state group IDs span too wide a range to handle in one batch")
    composite = seg * span + (groups - base)
    has_prev = prevs != -1
    in_range = (prevs >= base) & (prevs - base < span)
    wanted = seg[has_prev] * span + np.where(in_range[has_prev], prevs[has_prev] - base, 0)
    found = np.minimum(np.searchsorted(composite, wanted), n - 1)
    ok = (composite[found] == wanted) & in_range[has_prev]
    if not ok.all():
        bad = groups[has_prev][~ok]
        shown = ", ".join(str(g) for g in bad[:10].tolist())
        err = StateCorruptionError(f"state groups whose prev group is not in their unit: {shown}")
        err.groups = tuple(int(g) for g in bad)  # type: ignore[attr-defined]
        raise err
    parent[has_prev] = found
    return parent


class SortedRowInterner:
    """Rows already sorted by slot (one slot per new value of *slot_columns*),
    interned as they come; rows whose ``type`` is null only mark their slot.

    :meth:`runs` cuts the stream into runs of whole units (a unit is a value
    of the first slot column) of about *run_rows* delta rows; each run has
    its own string tables and comes with the first row of each of its slots.
    """

    def __init__(self, slot_columns: tuple[str, str], head_columns: list[str]) -> None:
        self.slot_columns = slot_columns
        self.head_columns = head_columns
        self._start()

    def _start(self) -> None:
        self.types = _core_walk.StringInterner()
        self.state_keys = _core_walk.StringInterner()
        self.events = _core_walk.StringInterner()
        self._parts: tuple[list[np.ndarray], ...] = ([], [], [], [])
        self._heads: list[pa.Table] = []
        self.slots = 0
        self.rows = 0
        self._last: tuple[int, int] | None = None

    def runs(self, batches: Iterator[pa.RecordBatch], run_rows: int
             ) -> Iterator[tuple[pa.Table, InternedSlots]]:
        """``(heads, slots)`` of each run of whole units."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if self.rows >= run_rows and self._last is not None:
                units = _int64(batch.column(self.slot_columns[0]))
                later = np.flatnonzero(units != self._last[0])
                if len(later):
                    cut = int(later[0])
                    if cut:
                        self._take(batch.slice(0, cut))
                    yield self._finish()
                    batch = batch.slice(cut)
            self._take(batch)
        if self.slots:
            yield self._finish()

    def _take(self, batch: pa.RecordBatch) -> None:
        first = _int64(batch.column(self.slot_columns[0]))
        second = _int64(batch.column(self.slot_columns[1]))
        new = np.r_[True, (first[1:] != first[:-1]) | (second[1:] != second[:-1])]
        if self._last is not None and (int(first[0]), int(second[0])) == self._last:
            new[0] = False
        slot = (self.slots + np.cumsum(new) - 1).astype(np.int32)
        self._heads.append(pa.Table.from_batches([batch]).select(self.head_columns).filter(pa.array(new)))
        self.slots += int(new.sum())
        self._last = (int(first[-1]), int(second[-1]))
        has_row = _bool(batch.column("type").is_valid())
        rows = batch.filter(pa.array(has_row)) if not has_row.all() else batch
        if rows.num_rows == 0:
            return
        for name in ("state_key", "event_id"):
            if rows.column(name).null_count:
                groups = _int64(rows.column(self.slot_columns[1]))
                bad = np.unique(groups[~_bool(rows.column(name).is_valid())])
                err = StateCorruptionError(f"state_groups_state rows with a null {name} in groups "
                                           + ", ".join(str(g) for g in bad[:10].tolist()))
                err.groups = tuple(int(g) for g in bad)  # type: ignore[attr-defined]
                raise err
        columns = [slot[has_row]] + [_intern(interner, _large(rows.column(name))) for interner, name in
                                     ((self.types, "type"), (self.state_keys, "state_key"),
                                      (self.events, "event_id"))]
        for part, column in zip(self._parts, columns):
            part.append(column)
        self.rows += rows.num_rows

    def _finish(self) -> tuple[pa.Table, InternedSlots]:
        heads = pa.concat_tables(self._heads)
        slot, type_ids, key_ids, event_ids = (_joined(part) for part in self._parts)
        offsets = np.searchsorted(slot, np.arange(self.slots + 1), side="left").astype(np.int64)
        del slot
        types, type_rank = _ranked(_table(self.types))
        state_keys, key_rank = _ranked(_table(self.state_keys))
        stride = max(1, len(state_keys))
        keys = type_rank[type_ids] * np.int64(stride) + key_rank[key_ids] if len(type_ids) else \
            np.zeros(0, np.int64)
        found = InternedSlots(offsets, keys, event_ids.astype(np.int64), types, state_keys,
                              _table(self.events), stride)
        self._start()
        return heads, found
