"""Arrow-level steps of bulk state reconstruction, shared by Spark and the local mode.

Nothing here imports PySpark: the same functions run inside ``mapInArrow`` on the
executors and in the single-process mode. Per-row work happens in pyarrow, numpy
and the compiled cores (``state.expand_groups`` checks a batch,
``treewalk.StateWalk`` and ``treewalk.digest_groups`` walk its trees); Python
only loops over batches.

Two steps:

* :func:`assign_trees` takes the topology (every group with its prev group and
  whether it is wanted), checks it with the core, finds each group's tree root by
  pointer jumping, drops trees without wanted groups and splits giant trees into
  pieces by the branch under the root (the root is copied into every piece).
* :func:`expand_partition` takes the rows of whole trees (topology joined with
  the delta rows, sorted by ``root, piece, state_group``), interns the strings per
  batch and walks each batch of whole trees once: a path's state at a time, so
  memory follows the largest state, not groups x state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamrep import _impl
from streamrep.errors import StateCorruptionError
from streamrep.spark.interned import parents_within

if TYPE_CHECKING:
    from streamrep._pure import state as _core_state
    from streamrep._pure import treewalk as _core_walk
else:
    _core_state = _impl.load("state")
    _core_walk = _impl.load("treewalk")

__all__ = [
    "ddl",
    "TOPOLOGY_SCHEMA",
    "TREES_SCHEMA",
    "TREE_ROWS_SCHEMA",
    "STATE_SCHEMA",
    "STATE_OUTPUT_SCHEMA",
    "OUTPUT_PARQUET_OPTIONS",
    "DIGEST_SCHEMA",
    "assign_trees",
    "expand_partition",
    "expand_table",
    "expand_groups",
    "write_partition",
    "WRITTEN_SCHEMA",
]

#: Spark's name of each Arrow type the Arrow-batch schemas of streamrep.spark use.
_SPARK_TYPES = {"int64": "bigint", "int32": "int", "bool": "boolean", "string": "string",
                "double": "double", "list<item: int64>": "array<bigint>"}


def ddl(schema: pa.Schema) -> str:
    """The Spark DDL string of *schema* (what ``mapInArrow`` takes as its schema)."""
    return ", ".join(f"`{f.name}` {_SPARK_TYPES[str(f.type)]}" for f in schema)


#: Input of :func:`assign_trees`: one row per group (prev null for a root).
TOPOLOGY_SCHEMA = pa.schema(
    [("state_group", pa.int64()), ("prev_state_group", pa.int64()), ("wanted", pa.bool_())]
)

#: Output of :func:`assign_trees`: prev is -1 for roots; piece numbers a split tree's parts.
TREES_SCHEMA = pa.schema(
    [
        ("root", pa.int64()),
        ("piece", pa.int32()),
        ("state_group", pa.int64()),
        ("prev_state_group", pa.int64()),
        ("wanted", pa.bool_()),
    ]
)

#: Input of :func:`expand_partition`: the trees joined with the delta rows. Rows
#: whose ``type`` is null only carry the group (every group needs at least one
#: row; extra such rows beside a group's delta rows are ignored).
TREE_ROWS_SCHEMA = pa.schema(
    list(TREES_SCHEMA)
    + [("type", pa.string()), ("state_key", pa.string()), ("event_id", pa.string())]
)

#: Full-state output: one row per entry of each wanted group's state.
STATE_SCHEMA = pa.schema(
    [
        ("state_group", pa.int64()),
        ("type", pa.string()),
        ("state_key", pa.string()),
        ("event_id", pa.string()),
    ]
)

#: What :func:`expand_table` yields for full states: :data:`STATE_SCHEMA` with
#: the strings dictionary-encoded. Parquet files written from it without the
#: Arrow schema (``store_schema=False``) read back as :data:`STATE_SCHEMA`.
_STRING_DICTIONARY = pa.dictionary(pa.int32(), pa.string())
STATE_OUTPUT_SCHEMA = pa.schema(
    [
        ("state_group", pa.int64()),
        ("type", _STRING_DICTIONARY),
        ("state_key", _STRING_DICTIONARY),
        ("event_id", _STRING_DICTIONARY),
    ]
)

#: How output Parquet is written. Without the Arrow schema the dictionary
#: columns read back as plain strings. Column statistics are kept for
#: ``state_group`` (what readers filter on): min/max over every string row
#: would double the writing time.
OUTPUT_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "snappy",
    "store_schema": False,
    "write_statistics": ["state_group"],
}

#: Digest output: one row per wanted group.
DIGEST_SCHEMA = pa.schema(
    [("state_group", pa.int64()), ("entries", pa.int64()), ("state_digest", pa.string())]
)

#: Rows per output record batch (bounds the strings materialised at once).
OUTPUT_BATCH_ROWS = 262_144


def _int64_numpy(column: pa.Array | pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    column = column.cast(pa.int64())
    if fill is not None:
        column = column.fill_null(fill)
    return np.ascontiguousarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _bool_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.ascontiguousarray(column.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _check_topology(groups: np.ndarray, prevs: np.ndarray) -> None:
    """Raise the core's StateCorruptionError for duplicates, missing prevs, cycles."""
    n = len(groups)
    empty = np.zeros(0, dtype=np.int64)
    try:
        _core_state.expand_groups(
            groups, prevs, np.zeros(n + 1, dtype=np.int64), empty, empty, np.zeros(n, dtype=np.uint8)
        )
    except StateCorruptionError as exc:
        if "listed more than once" in str(exc):
            named = tuple(getattr(exc, "groups", ()))
            shown = ", ".join(str(g) for g in named[: _core_state.MAX_NAMED_GROUPS])
            err = StateCorruptionError(
                "state groups listed more than once in state_groups, or with several prev "
                f"groups in state_group_edges: {shown}"
            )
            err.groups = named  # type: ignore[attr-defined]
            raise err from None
        raise


def _mix(values: np.ndarray) -> np.ndarray:
    """Spread int64 IDs evenly over uint64 (a multiplicative hash)."""
    mixed: np.ndarray = (values.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(33)
    return mixed


def _pointer_jump(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Root index and depth of every node; ``parent`` is -1 for roots (acyclic)."""
    n = len(parent)
    idx = np.arange(n, dtype=np.int64)
    has_parent = parent >= 0
    ptr = np.where(has_parent, parent, idx)
    depth = has_parent.astype(np.int64)
    for _ in range(max(1, math.ceil(math.log2(n + 1))) + 2):
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            break
        depth = depth + depth[ptr]
        ptr = nxt
    return ptr, depth


def assign_trees(topology: pa.Table, split_threshold: int = 200_000) -> pa.Table:
    """Find every group's tree, keep trees with a wanted group, split giant ones.

    *topology* has :data:`TOPOLOGY_SCHEMA` (one row per group, wanted may be
    null for False). Returns a table of :data:`TREES_SCHEMA`. A tree with more
    than *split_threshold* groups is cut into ``ceil(size / threshold)`` pieces
    by the branch under its root; the root is copied into every piece (wanted
    only in piece 0) so each piece is a closed batch on its own.

    Raises :class:`StateCorruptionError` naming the groups for duplicate groups,
    a prev group that does not exist, or a cycle.
    """
    groups = _int64_numpy(topology.column("state_group"))
    if topology.column("state_group").null_count:
        raise StateCorruptionError("state_groups has rows with a null id")
    prevs = _int64_numpy(topology.column("prev_state_group"), fill=-1)
    wanted = _bool_numpy(topology.column("wanted"))
    n = len(groups)
    _check_topology(groups, prevs)
    if n == 0:
        return TREES_SCHEMA.empty_table()

    order = np.argsort(groups, kind="stable")
    sorted_ids = groups[order]
    parent = np.full(n, -1, dtype=np.int64)
    has_parent = prevs != -1
    parent[has_parent] = order[np.searchsorted(sorted_ids, prevs[has_parent])]
    root, depth = _pointer_jump(parent)

    # Trees without a wanted group need no work at all.
    tree_wanted = np.zeros(n, dtype=np.bool_)
    np.logical_or.at(tree_wanted, root, wanted)
    keep = tree_wanted[root]
    size = np.bincount(root[keep], minlength=n)
    pieces = np.where(size > split_threshold, -(-size // max(1, split_threshold)), 1)
    tree_pieces = pieces[root]

    piece = np.zeros(n, dtype=np.int32)
    giant = keep & (tree_pieces > 1) & (depth > 0)
    if giant.any():
        # The branch of a group is its ancestor at depth 1 (itself at depth 1).
        bptr = np.where(depth > 1, parent, np.arange(n, dtype=np.int64))
        for _ in range(max(1, math.ceil(math.log2(n + 1))) + 2):
            nxt = bptr[bptr]
            if np.array_equal(nxt, bptr):
                break
            bptr = nxt
        branch_ids = groups[bptr[giant]]
        piece[giant] = _mix(branch_ids) % tree_pieces[giant].astype(np.uint64)

    kept = np.flatnonzero(keep)
    out_root = groups[root[kept]]
    out_piece = piece[kept]
    out_group = groups[kept]
    out_prev = prevs[kept]
    out_wanted = wanted[kept]

    # Copies of the roots of split trees, one per extra piece, never wanted there.
    split_roots = np.flatnonzero(keep & (depth == 0) & (tree_pieces > 1))
    if len(split_roots):
        copies = tree_pieces[split_roots] - 1
        rep = np.repeat(split_roots, copies)
        extra_piece = np.concatenate([np.arange(1, c + 1, dtype=np.int32) for c in copies])
        out_root = np.concatenate([out_root, groups[rep]])
        out_piece = np.concatenate([out_piece, extra_piece])
        out_group = np.concatenate([out_group, groups[rep]])
        out_prev = np.concatenate([out_prev, prevs[rep]])
        out_wanted = np.concatenate([out_wanted, np.zeros(len(rep), dtype=np.bool_)])

    return pa.table(
        [
            pa.array(out_root, pa.int64()),
            pa.array(out_piece, pa.int32()),
            pa.array(out_group, pa.int64()),
            pa.array(out_prev, pa.int64()),
            pa.array(out_wanted, pa.bool_()),
        ],
        schema=TREES_SCHEMA,
    )


# --- expanding batches of whole trees ------------------------------------------


def _sorted_dictionary(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Intern *values* into IDs ranked in bytewise order: (dictionary, ids)."""
    unique = pc.unique(values)
    dictionary = unique.take(pc.sort_indices(unique))
    ids = pc.index_in(values, value_set=dictionary)
    return dictionary, _int64_numpy(ids)


def _string_table(values: pa.Array) -> tuple[pa.Buffer, pa.Buffer | bytes]:
    large = values.cast(pa.large_string())
    if large.offset:
        large = pa.concat_arrays([large])
    buffers = large.buffers()
    data = buffers[2] if buffers[2] is not None else b""
    offsets = buffers[1] if buffers[1] is not None else pa.py_buffer(bytes(8))
    return offsets, data


class _Interned:
    """The string tables of one batch and its interned delta rows."""

    def __init__(self, delta: pa.Table) -> None:
        self.types, type_ids = _sorted_dictionary(delta.column("type").combine_chunks())
        self.state_keys, key_ids = _sorted_dictionary(delta.column("state_key").combine_chunks())
        encoded = delta.column("event_id").combine_chunks().dictionary_encode()
        self.events = encoded.dictionary
        self.stride = max(1, len(self.state_keys))
        self.keys = type_ids * self.stride + key_ids
        self.event_ids = _int64_numpy(encoded.indices)

    @classmethod
    def of(cls, types: pa.Array, state_keys: pa.Array, events: pa.Array, keys: np.ndarray,
           event_ids: np.ndarray) -> "_Interned":
        """From string tables (``types`` and ``state_keys`` in bytewise order)
        and the rows' interned IDs."""
        self = cls.__new__(cls)
        self.types, self.state_keys, self.events = types, state_keys, events
        self.stride = max(1, len(state_keys))
        self.keys, self.event_ids = keys, event_ids
        return self

    def key_text(self, key: int) -> str:
        t = self.types[key // self.stride].as_py()
        s = self.state_keys[key % self.stride].as_py()
        return f"({t!r}, {s!r})"


def _delta_rows(segment: pa.Table, starts: np.ndarray) -> tuple[np.ndarray, _Interned]:
    """The delta offsets (CSR over the groups starting at *starts*) and the
    interned delta rows of *segment*, whose rows with a null ``type`` only
    carry their group."""
    has_row = _bool_numpy(segment.column("type").combine_chunks().is_valid())
    cumulative = np.concatenate([[0], np.cumsum(has_row, dtype=np.int64)])
    offsets = cumulative[np.r_[starts, segment.num_rows]]
    delta = segment.filter(pa.array(has_row))
    for column in ("state_key", "event_id"):
        if delta.column(column).null_count:
            bad = pc.unique(delta.filter(pc.is_null(delta.column(column))).column("state_group"))
            named = tuple(sorted(bad.to_pylist()))
            shown = ", ".join(str(g) for g in named[:10])
            err = StateCorruptionError(f"state_groups_state rows with a null {column} in groups {shown}")
            err.groups = named  # type: ignore[attr-defined]
            raise err
    return offsets, _Interned(delta)


def string_tables(interned: _Interned) -> tuple[Any, Any, Any]:
    """The ``(offsets, data)`` string tables of *interned*, as the core reads them."""
    return (_string_table(interned.types), _string_table(interned.state_keys),
            _string_table(interned.events))


def walk_digests(parents: np.ndarray, offsets: np.ndarray, keys: np.ndarray, events: np.ndarray,
                 wanted: np.ndarray, interned: _Interned) -> tuple[np.ndarray, pa.Array]:
    """Entries and hex digest of the full state of each wanted group (batch
    order), walking the trees given by *parents* (batch indices)."""
    entries, hexes = _core_walk.digest_groups(
        parents, offsets, keys, events, wanted.view(np.uint8), interned.stride,
        *string_tables(interned))
    m = len(entries)
    hex_array = pa.Array.from_buffers(
        pa.string(), m, [None, pa.py_buffer(np.arange(0, 64 * m + 1, 64, dtype=np.int32)),
                         pa.py_buffer(hexes)])
    counts = np.frombuffer(entries, dtype=np.int64) if m else np.zeros(0, np.int64)
    return counts, hex_array


def _expand_segment(segment: pa.Table, digest: bool) -> Iterator[pa.RecordBatch]:
    """Walk one closed batch of whole trees (group IDs unique within it)."""
    g_all = _int64_numpy(segment.column("state_group"))
    if len(g_all) == 0:
        return
    starts = np.flatnonzero(np.r_[True, g_all[1:] != g_all[:-1]])
    group_ids = g_all[starts]
    prev_ids = _int64_numpy(segment.column("prev_state_group"), fill=-1)[starts]
    wanted = _bool_numpy(segment.column("wanted"))[starts]
    offsets, interned = _delta_rows(segment, starts)
    # Rows come sorted by (root, piece, state_group): number each tree piece.
    roots = _int64_numpy(segment.column("root"))[starts]
    pieces = _int64_numpy(segment.column("piece"))[starts]
    tree = np.cumsum(np.r_[True, (roots[1:] != roots[:-1]) | (pieces[1:] != pieces[:-1])]) - 1
    parents = parents_within(tree, group_ids, prev_ids)
    yield from expand_groups(group_ids, parents, wanted, offsets, interned, digest)


def expand_groups(group_ids: np.ndarray, parents: np.ndarray, wanted: np.ndarray, offsets: np.ndarray,
                  interned: _Interned, digest: bool) -> Iterator[pa.RecordBatch]:
    """Digests or full states of the wanted groups of a batch of whole trees
    (*parents*: batch indices, -1 for a root; deltas as CSR *offsets* into
    *interned*)."""
    try:
        yield from _walk_groups(group_ids, parents, wanted, offsets, interned, digest)
    except StateCorruptionError as exc:
        named = tuple(int(group_ids[i]) for i in getattr(exc, "groups", ()) if 0 <= i < len(group_ids))
        key = getattr(exc, "key", None)
        if key is None or not named:
            raise
        err = StateCorruptionError(f"state group {named[0]} has key {interned.key_text(key)} more than "
                                   "once in state_groups_state")
        err.groups = named  # type: ignore[attr-defined]
        raise err from None


def _walk_groups(group_ids: np.ndarray, parents: np.ndarray, wanted: np.ndarray, offsets: np.ndarray,
                 interned: _Interned, digest: bool) -> Iterator[pa.RecordBatch]:
    if digest:
        counts, hexes = walk_digests(parents, offsets, interned.keys, interned.event_ids, wanted,
                                     interned)
        yield pa.RecordBatch.from_arrays(
            [pa.array(group_ids[wanted], pa.int64()), pa.array(counts, pa.int64()), hexes],
            schema=DIGEST_SCHEMA)
        return
    walker = _core_walk.StateWalk(parents, offsets, interned.keys, interned.event_ids,
                                  wanted.view(np.uint8))
    stride = interned.stride
    while True:
        out_groups, out_keys, out_events = walker.next_states(OUTPUT_BATCH_ROWS)
        total = len(out_groups)
        if total == 0:
            return
        keys = np.frombuffer(out_keys, dtype=np.int64)
        events = np.frombuffer(out_events, dtype=np.int64)
        type_ids = keys // stride
        key_ids = keys - type_ids * stride
        # Output strings stay dictionary-encoded over the batch's own string
        # tables: no string is copied per output row, and Parquet writes the
        # dictionaries as they are.
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(group_ids[np.frombuffer(out_groups, dtype=np.int64)], pa.int64()),
                _dictionary_column(type_ids, interned.types),
                _dictionary_column(key_ids, interned.state_keys),
                _dictionary_column(events, interned.events),
            ],
            schema=STATE_OUTPUT_SCHEMA,
        )


def _dictionary_column(ids: np.ndarray, strings: pa.Array) -> pa.DictionaryArray:
    """*ids* into *strings* as a dictionary array holding only the strings used.

    Each output batch becomes its own Parquet row group, which carries its
    dictionary: trimming it keeps the file from repeating a whole batch's
    string table in every row group.
    """
    used = np.zeros(len(strings), dtype=np.bool_)
    used[ids] = True
    if used.all():
        return pa.DictionaryArray.from_arrays(ids.astype(np.int32), strings.cast(pa.string()))
    renumber = np.cumsum(used, dtype=np.int32) - 1
    return pa.DictionaryArray.from_arrays(renumber[ids], strings.filter(pa.array(used)).cast(pa.string()))


def _segments(table: pa.Table) -> Iterator[pa.Table]:
    """Cut sorted rows where a tree's next piece starts: its root is copied there."""
    roots = _int64_numpy(table.column("root"))
    pieces = _int64_numpy(table.column("piece"))
    if len(roots) == 0:
        return
    cuts = np.flatnonzero((roots[1:] == roots[:-1]) & (pieces[1:] != pieces[:-1])) + 1
    lo = 0
    for cut in cuts.tolist() + [len(roots)]:
        yield table.slice(lo, cut - lo)
        lo = cut


def expand_table(table: pa.Table, digest: bool = False) -> Iterator[pa.RecordBatch]:
    """Expand rows of whole trees sorted by ``root, piece, state_group``."""
    for segment in _segments(table):
        yield from _expand_segment(segment, digest)


def expand_partition(
    batches: Iterable[pa.RecordBatch], digest: bool = False, batch_rows: int = 500_000
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body: expand a partition sorted by ``root, piece, state_group``.

    Record batches arrive in any size; rows are buffered until about
    *batch_rows* are held, then every complete tree among them goes to the core
    in one call and the last (possibly incomplete) tree waits for more rows.
    """
    for table in whole_tables(batches, _last_tree_start, batch_rows):
        yield from expand_table(table, digest)


def _last_tree_start(table: pa.Table) -> int:
    """Where the rows of the last ``(root, piece)`` of sorted *table* start."""
    roots = table.column("root")
    pieces = table.column("piece")
    tail = pc.sum(pc.and_(pc.equal(roots, roots[-1]), pc.equal(pieces, pieces[-1]))).as_py()
    return int(table.num_rows - int(tail))


def whole_tables(
    batches: Iterable[pa.RecordBatch], last_start: Callable[[pa.Table], int], batch_rows: int
) -> Iterator[pa.Table]:
    """Tables of about *batch_rows* sorted rows out of record batches of any size.

    Rows are buffered until *batch_rows* are held; *last_start* says where the
    last (possibly incomplete) tree or unit of the buffer starts, and those rows
    wait for more. The rest of the buffer is yielded at the end.
    """
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        held += batch.num_rows
        if held < batch_rows:
            continue
        table = pa.Table.from_batches(pending).combine_chunks()
        split = last_start(table)
        if split > 0:
            yield table.slice(0, split)
        rest = table.slice(split)
        pending = rest.to_batches()
        held = rest.num_rows
    if pending:
        yield pa.Table.from_batches(pending).combine_chunks()


#: What each task reports after writing its part file itself.
WRITTEN_SCHEMA = pa.schema(
    [("partition", pa.int32()), ("rows", pa.int64()),
     ("expand_seconds", pa.float64()), ("write_seconds", pa.float64())]
)


def write_partition(
    batches: Iterable[pa.RecordBatch], output: str, partition: int, attempt: int,
    digest: bool = False,
) -> pa.RecordBatch:
    """Expand a sorted partition and write it as ``part-NNNNN.parquet`` under *output*.

    Writing from the Python worker keeps the (large) output out of the JVM: only
    a one-row report goes back. The file is written under ``_temporary`` and
    moved into place when complete, so a retried or speculative attempt replaces
    it whole. *output* may be any URI pyarrow's filesystems understand.
    """
    import time

    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, root = pafs.FileSystem.from_uri(output)
    final = f"{root}/part-{partition:05d}.parquet"
    partial = f"{root}/_temporary/part-{partition:05d}-{attempt}.parquet"
    schema = DIGEST_SCHEMA if digest else STATE_OUTPUT_SCHEMA
    rows = 0
    expand_seconds = write_seconds = 0.0
    writer = None
    produced = expand_partition(batches, digest)
    try:
        while True:
            clock = time.perf_counter()
            batch = next(produced, None)
            expand_seconds += time.perf_counter() - clock
            if batch is None:
                break
            clock = time.perf_counter()
            if writer is None:
                fs.create_dir(f"{root}/_temporary", recursive=True)
                writer = pq.ParquetWriter(partial, schema, filesystem=fs, **OUTPUT_PARQUET_OPTIONS)
            writer.write_batch(batch)
            write_seconds += time.perf_counter() - clock
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is not None:
        fs.move(partial, final)
    return pa.RecordBatch.from_arrays(
        [pa.array([partition], pa.int32()), pa.array([rows], pa.int64()),
         pa.array([expand_seconds]), pa.array([write_seconds])],
        schema=WRITTEN_SCHEMA,
    )
