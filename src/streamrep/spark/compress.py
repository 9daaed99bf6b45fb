"""Arrow-level steps of state compression, shared by Spark and the local mode.

Nothing here imports PySpark. Compression works on **units**: all trees of one
room (a snapshot of a room may then become a delta over the room's earlier
groups), or, for a room with more groups than the split threshold, a share of
its trees: a contiguous run of them in root order, which also gets a copy of
the previous share's top root so its own top can become a delta over it
(:func:`assign_units`); a single tree above the threshold is cut by branch as
reconstruction cuts it, its root copied into every piece and left as it is.

Per batch of whole units (:func:`compress_units`):

1. the delta rows are interned and the batch checked by the state core;
2. the tree walker core plans a new prev and delta per group, priced along
   each tree from the deltas (no group's full state is ever expanded);
3. the old and the new trees are walked again and the digest of every changed
   group's full state compared (any difference raises
   :class:`~streamrep.errors.StateVerificationError` naming the groups);
4. with ``find_unreferenced``, groups no event references and no referenced
   group reaches through the new prev pointers are listed for deletion.

Output per batch: the new ``state_group_edges`` and ``state_groups_state`` rows
and the change set (:data:`CHANGES_SCHEMA`, :data:`CHANGE_ROWS_SCHEMA`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamrep import _impl
from streamrep.errors import ConfigError, StateCorruptionError, StateVerificationError
from streamrep.spark.batches import (
    TOPOLOGY_SCHEMA,
    _bool_numpy,
    _delta_rows,
    _int64_numpy,
    _Interned,
    _mix,
    _pointer_jump,
    assign_trees,
    string_tables,
    walk_digests,
)
from streamrep.spark.interned import SortedRowInterner, parents_within
from streamrep.spark.memory import GIB, ExecutorMemory

if TYPE_CHECKING:
    from streamrep._pure import treewalk as _core_walk
else:
    _core_walk = _impl.load("treewalk")

__all__ = [
    "CompressOptions",
    "CompressResult",
    "UNIT_TOPOLOGY_SCHEMA",
    "UNITS_SCHEMA",
    "CHANGES_SCHEMA",
    "CHANGE_ROWS_SCHEMA",
    "EDGES_SCHEMA",
    "NEW_STATE_SCHEMA",
    "REPORT_SCHEMA",
    "OUTPUT_TABLES",
    "assign_units",
    "chain_period",
    "compress_units",
    "compress_batch",
    "GroupBatch",
    "write_units",
]


@dataclass(frozen=True)
class CompressOptions:
    """What the compression job does and where it writes."""

    output: str
    max_depth: int = 99
    candidates: int = 16
    split_threshold: int = 200_000
    find_unreferenced: bool = False
    overwrite: bool = False
    #: The bound on each Spark executor process (bytes; 0: none). Rooms are
    #: split so that each unit fits a Python worker within it; a unit that
    #: still does not fit (one tree, or piece of one, too big) fails the job.
    worker_memory: int = 0
    #: Most rows one unit may hand its worker (0: what a Python worker holds
    #: within ``worker_memory``, or no bound); see :func:`assign_units`.
    unit_rows: int = 0

    @property
    def unit_row_bound(self) -> int:
        """The rows per unit :func:`assign_units` splits rooms to (0: none)."""
        if self.unit_rows:
            return self.unit_rows
        return ExecutorMemory(self.worker_memory).worker_rows if self.worker_memory else 0


@dataclass
class CompressResult:
    """Counts, the longest chains before and after, and phase timings (seconds)."""

    output: str
    groups: int = 0
    changed_groups: int = 0
    unreferenced_groups: int = 0
    rows_before: int = 0
    rows_after: int = 0
    max_depth_before: int = 0
    max_depth_after: int = 0
    verified_groups: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    #: unit -> (its top's depth over its copy or -1, its deepest group over
    #: its copy or -1), for the units at a position > 0 of a chain.
    chain_units: dict[int, tuple[int, int]] = field(default_factory=dict)
    _local_depth_after: int = 0

    def add(self, report: pa.Table) -> None:
        """Add up the per-task reports (:data:`REPORT_SCHEMA`)."""
        for name in ("groups", "changed_groups", "unreferenced_groups", "rows_before",
                     "rows_after", "verified_groups"):
            setattr(self, name, getattr(self, name) + int(pc.sum(report.column(name)).as_py() or 0))
        self.max_depth_before = max(self.max_depth_before,
                                    int(pc.max(report.column("max_depth_before")).as_py() or 0))
        self._local_depth_after = max(self._local_depth_after,
                                      int(pc.max(report.column("max_depth_after")).as_py() or 0))
        if "chain_units" in report.column_names:
            for units, tops, deepest in zip(*(report.column(c).to_pylist()
                                              for c in ("chain_units", "chain_tops", "chain_deepest"))):
                self.chain_units.update(zip(units or (), zip(tops or (), deepest or ())))
        self.max_depth_after = max(self._local_depth_after, chain_depth(self.chain_units))

    def summary(self) -> str:
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items())
        change = 100.0 * (self.rows_after - self.rows_before) / self.rows_before if self.rows_before else 0.0
        line = (f"{self.groups} groups, {self.changed_groups} changed; state_groups_state "
                f"{self.rows_before} -> {self.rows_after} rows ({change:+.1f}%); longest chain "
                f"{self.max_depth_before} -> {self.max_depth_after} hops; verified "
                f"{self.verified_groups} groups")
        if self.unreferenced_groups:
            line += f"; {self.unreferenced_groups} unreferenced groups to delete"
        return f"{line}; written to {self.output} ({phases})"


#: Input of :func:`assign_units`: :data:`TOPOLOGY_SCHEMA` (wanted unused) plus
#: the room, the group's own event, whether an event references it and its
#: count of delta rows (null: not counted, taken as 0).
UNIT_TOPOLOGY_SCHEMA = pa.schema(
    list(TOPOLOGY_SCHEMA)
    + [("room_id", pa.string()), ("group_event_id", pa.string()), ("referenced", pa.bool_()),
       ("delta_rows", pa.int64())]
)

#: Output of :func:`assign_units`. ``home`` is False on the extra copies of a
#: split tree's root and of the top of the previous share of a chain;
#: ``fixed`` marks those roots (left as they are). ``chain`` is the unit's
#: position in its room's chain of shares (0: first, or no chain): its copy of
#: the previous top is at most ``chain - 1`` hops deep in the new tables.
UNITS_SCHEMA = pa.schema(
    [
        ("unit", pa.int64()),
        ("state_group", pa.int64()),
        ("prev_state_group", pa.int64()),
        ("room_id", pa.string()),
        ("group_event_id", pa.string()),
        ("referenced", pa.bool_()),
        ("home", pa.bool_()),
        ("fixed", pa.bool_()),
        ("children", pa.int64()),
        ("chain", pa.int64()),
    ]
)

#: Rows handed to :func:`compress_units`: the units joined with the delta rows
#: (``type`` null on the one row of a group without delta rows).
UNIT_ROWS_SCHEMA = pa.schema(
    list(UNITS_SCHEMA) + [("type", pa.string()), ("state_key", pa.string()), ("event_id", pa.string())]
)

#: One row per changed group (``action`` "rewrite") or group to delete
#: (``action`` "delete"). ``old_*`` is what the group looked like when read:
#: applying re-checks it. ``children`` is how many groups had it as prev
#: (one more for a share's top copied into the next share, whose top may
#: become its child). ``depth`` is its prev hops in the new tables, counting
#: a copied top of a previous share at its bound (``chain - 1`` of
#: :data:`UNITS_SCHEMA`), so at most ``max_depth``; the report's
#: ``max_depth_after`` is exact (:func:`chain_depth`).
CHANGES_SCHEMA = pa.schema(
    [
        ("unit", pa.int64()),
        ("state_group", pa.int64()),
        ("action", pa.string()),
        ("room_id", pa.string()),
        ("group_event_id", pa.string()),
        ("old_prev", pa.int64()),
        ("new_prev", pa.int64()),
        ("old_rows", pa.int64()),
        ("new_rows", pa.int64()),
        ("children", pa.int64()),
        ("depth", pa.int64()),
        ("state_digest", pa.string()),
        ("old_rows_hash", pa.int64()),
        ("new_rows_hash", pa.int64()),
    ]
)

#: The delta rows of each changed group: ``delete`` (what it had) and
#: ``insert`` (what it gets). Deleted groups have only ``delete`` rows.
CHANGE_ROWS_SCHEMA = pa.schema(
    [
        ("unit", pa.int64()),
        ("state_group", pa.int64()),
        ("op", pa.string()),
        ("room_id", pa.string()),
        ("type", pa.string()),
        ("state_key", pa.string()),
        ("event_id", pa.string()),
    ]
)

#: The new ``state_group_edges`` and ``state_groups_state`` (every kept group).
EDGES_SCHEMA = pa.schema([("state_group", pa.int64()), ("prev_state_group", pa.int64())])
NEW_STATE_SCHEMA = pa.schema(
    [("state_group", pa.int64()), ("room_id", pa.string()), ("type", pa.string()),
     ("state_key", pa.string()), ("event_id", pa.string())]
)

#: Output folder name -> schema.
OUTPUT_TABLES: dict[str, pa.Schema] = {
    "state_group_edges": EDGES_SCHEMA,
    "state_groups_state": NEW_STATE_SCHEMA,
    "changes": CHANGES_SCHEMA,
    "change_rows": CHANGE_ROWS_SCHEMA,
}

def chain_depth(chain_units: dict[int, tuple[int, int]]) -> int:
    """The longest chain in the new tables through copies of previous tops.

    *chain_units* maps each unit at a position > 0 of a chain to its top's
    depth over its copy (-1: not under it, so the top stays a root) and the
    deepest kept group's depth over its copy (-1: none). The copy of unit
    u - 1's top is that top itself; a unit at position 0 (not listed) has its
    top at depth 0.
    """
    longest = 0
    top_depth: dict[int, int] = {}
    for unit in sorted(chain_units):
        over_copy, deepest = chain_units[unit]
        copy_depth = top_depth.get(unit - 1, 0)
        top_depth[unit] = over_copy + copy_depth if over_copy >= 0 else 0
        if deepest >= 0:
            longest = max(longest, deepest + copy_depth)
    return longest


#: What each batch (and each Spark task) reports. ``max_depth_after`` counts
#: the groups hanging under no copy of a previous share's top; the
#: ``chain_*`` lists give, per unit at a position > 0 of a chain, what
#: :func:`chain_depth` needs for the others.
REPORT_SCHEMA = pa.schema(
    [
        ("groups", pa.int64()),
        ("changed_groups", pa.int64()),
        ("unreferenced_groups", pa.int64()),
        ("rows_before", pa.int64()),
        ("rows_after", pa.int64()),
        ("max_depth_before", pa.int64()),
        ("max_depth_after", pa.int64()),
        ("verified_groups", pa.int64()),
        ("chain_units", pa.list_(pa.int64())),
        ("chain_tops", pa.list_(pa.int64())),
        ("chain_deepest", pa.list_(pa.int64())),
    ]
)


# --- units ----------------------------------------------------------------------


def chain_period(max_depth: int) -> int:
    """Shares per chain of a split room (see :func:`assign_units`).

    A share at position p of a chain hangs under a copy of the previous
    share's top, which is at most p - 1 hops deep in the new tables, and its
    own top one hop under that copy, so the share is planned with
    ``max_depth - p`` hops of its own. Restarting the chain (a snapshot) every
    ``max_depth // 4`` shares keeps at least three quarters of ``max_depth``
    for every share, and a snapshot every that many shares is a small cost
    next to the deltas of so many shares. At least two, where ``max_depth``
    allows, so a split room always links one share to the next.
    """
    return min(max_depth, max(2, max_depth // 4))


def assign_units(topology: pa.Table, split_threshold: int = 200_000, max_depth: int = 99,
                 unit_rows: int = 0) -> pa.Table:
    """Group the trees into units (rooms, or shares of big rooms).

    *topology* has :data:`UNIT_TOPOLOGY_SCHEMA`. Checks it with the core
    (duplicates, missing prev groups, cycles raise StateCorruptionError naming
    the groups) and returns :data:`UNITS_SCHEMA` rows.

    A unit's **rows** are what its task is handed: each group's delta rows
    plus one row standing for the group. A room is cut into
    ``max(ceil(groups / split_threshold), ceil(rows / unit_rows))`` shares
    (*unit_rows* 0: no bound on rows): contiguous runs of whole trees in the
    order of their roots, balanced by rows (by groups where the topology
    has no row counts); a single tree above *split_threshold* groups is cut
    by branch, its root copied into every piece and left as it is. While a
    share of several trees, with its copy of the previous share's top, has
    more than *unit_rows* rows, its room is cut into more shares; what is
    left above the bound is a single tree (or piece) too big on its own.

    Shares form chains (:func:`chain_period`): share s at position ``chain``
    > 0 also gets a copy of the top root of share s - 1 (its first root,
    whose delta rows are its full state), not home and fixed, so its own
    first roots can become deltas over it instead of snapshots; the copy's
    group is marked referenced in its home share, as the next share may need
    it, and its ``children`` count one more.
    """
    marked = topology.select(TOPOLOGY_SCHEMA.names).set_column(
        2, "wanted", pa.array(np.ones(topology.num_rows, dtype=np.bool_))
    )
    trees = assign_trees(marked, split_threshold)
    if trees.num_rows == 0:
        return UNITS_SCHEMA.empty_table()
    ids = _int64_numpy(topology.column("state_group"))
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]

    def lookup(groups: np.ndarray) -> np.ndarray:
        return order[np.searchsorted(sorted_ids, groups)]

    t_group = _int64_numpy(trees.column("state_group"))
    t_root = _int64_numpy(trees.column("root"))
    t_piece = _int64_numpy(trees.column("piece"))
    t_home = _bool_numpy(trees.column("wanted"))
    t_prev = _int64_numpy(trees.column("prev_state_group"), fill=-1)
    at = lookup(t_group)
    room_text = topology.column("room_id").combine_chunks().take(pa.array(lookup(t_root)))
    room_code = pc.dictionary_encode(room_text.fill_null("")).indices
    room_num = _int64_numpy(room_code)
    room_size = np.bincount(room_num, weights=t_home.astype(np.float64)).astype(np.int64)
    shares = np.maximum(1, -(-room_size // max(1, split_threshold)))
    split_tree = np.isin(t_root, t_root[t_piece > 0]) if (t_piece > 0).any() else np.zeros(len(t_root), np.bool_)
    if "delta_rows" in topology.column_names:
        delta_rows = np.maximum(_int64_numpy(topology.column("delta_rows"), fill=0), 0)
    else:
        delta_rows = np.zeros(len(ids), np.int64)
    t_rows = delta_rows[at] + 1

    share, shares = _room_shares(t_root, t_piece, t_home, t_rows, delta_rows[lookup(t_root)] + 1, room_num,
                                 shares, unit_rows)
    unit_key = room_num * np.int64(int(shares.max()) + 1) + share
    _, unit = np.unique(unit_key, return_inverse=True)
    unit = unit.astype(np.int64)
    fixed = split_tree & (t_group == t_root)
    chain, copies = _chains(unit, room_num, t_group, t_root, t_home, split_tree, chain_period(max_depth))
    return _units_table(topology, lookup, at, room_text, t_group, t_prev, t_home, unit, fixed, chain, copies)


def _room_shares(t_root: np.ndarray, t_piece: np.ndarray, t_home: np.ndarray, t_rows: np.ndarray,
                 root_rows: np.ndarray, room_num: np.ndarray, shares: np.ndarray,
                 unit_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Each tree row's share within its room, and each room's number of shares
    (at least *shares*; more where a share would pass *unit_rows*): contiguous
    runs of (tree, piece) items in root order, balanced by rows. *t_rows* is
    what each row weighs, *root_rows* what its tree's root does."""
    # Items: the (tree, piece) pairs in root order, a room's consecutive.
    item_order = np.lexsort((t_piece, t_root, room_num))
    new_item = np.r_[True, (t_root[item_order][1:] != t_root[item_order][:-1])
                     | (t_piece[item_order][1:] != t_piece[item_order][:-1])]
    item_start = np.flatnonzero(new_item)
    item_id = np.cumsum(new_item) - 1
    item_room = room_num[item_order][item_start]
    # Balanced by the home groups' rows; every row counts for the bound (a
    # split root's copies too), and so does the item's root, which the next
    # share gets a copy of when the item is its share's top.
    # (At least 1: a piece of a cut tree may hold only its root's copy.)
    item_weight = np.maximum(np.add.reduceat(np.where(t_home, t_rows, 0)[item_order], item_start), 1)
    item_load = np.add.reduceat(t_rows[item_order], item_start)
    item_top = root_rows[item_order][item_start]
    room_weight = np.bincount(item_room, weights=item_weight).astype(np.int64)
    before = np.cumsum(item_weight) - item_weight - np.r_[0, np.cumsum(room_weight)[:-1]][item_room]
    if unit_rows > 0:
        room_load = np.bincount(item_room, weights=item_load).astype(np.int64)
        shares = np.maximum(shares, -(-room_load // unit_rows))
    item_share = _cut_shares(before, item_room, room_weight, shares)
    over = (_rooms_over(item_room, item_share, item_load, item_top, unit_rows, len(room_weight))
            if unit_rows > 0 else np.zeros(len(room_weight), np.bool_))
    if over.any():
        # The fewest shares that fit, searched between too few and one share
        # per item (a share per unit of weight puts every item alone).
        lo, hi = shares, np.where(over, np.maximum(room_weight, shares), shares)
        while (hi - lo > 1).any():
            searching = hi - lo > 1
            mid = np.where(searching, (lo + hi) // 2, hi)
            bad = _rooms_over(item_room, _cut_shares(before, item_room, room_weight, mid), item_load,
                              item_top, unit_rows, len(room_weight))
            lo = np.where(searching & bad, mid, lo)
            hi = np.where(searching & ~bad, mid, hi)
        shares = hi
        item_share = _cut_shares(before, item_room, room_weight, shares)
    share = np.empty(len(t_root), dtype=np.int64)
    share[item_order] = item_share[item_id]
    return share, shares


def _units_table(topology: pa.Table, lookup: Any, at: np.ndarray, room_text: pa.Array, t_group: np.ndarray,
                 t_prev: np.ndarray, t_home: np.ndarray, unit: np.ndarray, fixed: np.ndarray,
                 chain: np.ndarray, copies: np.ndarray) -> pa.Table:
    """:data:`UNITS_SCHEMA` rows: each tree row once per unit, then the copies
    of the tops into the next shares of their chains."""
    # A split root copied into two pieces of the same unit is kept once.
    keep_order = np.lexsort((~t_home, t_group, unit))
    first = np.r_[True, (unit[keep_order][1:] != unit[keep_order][:-1])
                  | (t_group[keep_order][1:] != t_group[keep_order][:-1])]
    rows = keep_order[first]
    rows.sort()
    # The copies of the tops into the next shares of their chains.
    out_unit = np.r_[unit[rows], copies[:, 1]]
    out_home = np.r_[t_home[rows], np.zeros(len(copies), np.bool_)]
    out_fixed = np.r_[fixed[rows], np.ones(len(copies), np.bool_)]
    rows = np.r_[rows, copies[:, 0]]

    prev_all = _int64_numpy(topology.column("prev_state_group"), fill=-1)
    has_prev = prev_all[prev_all != -1]
    child_counts = np.zeros(topology.num_rows, dtype=np.int64)
    if len(has_prev):
        np.add.at(child_counts, lookup(has_prev), 1)
    # A copied top may gain a child from the next share, whichever order the
    # change set is applied in.
    np.add.at(child_counts, at[copies[:, 0]], 1)
    referenced = _bool_numpy(topology.column("referenced")).copy()
    referenced[at[copies[:, 0]]] = True
    return pa.table(
        [
            pa.array(out_unit),
            pa.array(t_group[rows]),
            pa.array(t_prev[rows], mask=t_prev[rows] == -1),
            room_text.take(pa.array(rows)),
            topology.column("group_event_id").combine_chunks().take(pa.array(at[rows])),
            pa.array(referenced[at[rows]]),
            pa.array(out_home),
            pa.array(out_fixed),
            pa.array(child_counts[at[rows]]),
            pa.array(chain[out_unit]),
        ],
        schema=UNITS_SCHEMA,
    )




def _cut_shares(before: np.ndarray, item_room: np.ndarray, room_weight: np.ndarray,
                shares: np.ndarray) -> np.ndarray:
    """Each item's share: its room's items cut where the running weight
    (*before* each item) crosses a multiple of the room's weight / shares."""
    k = shares[item_room]
    weight = np.maximum(room_weight[item_room], 1)
    if len(before) and int(before.max()) * int(k.max()) < 1 << 62:
        cut: np.ndarray = np.minimum(before * k // weight, k - 1)
    else:  # beyond int64: still monotone, so shares stay contiguous
        cut = np.minimum(np.floor(before / weight * k).astype(np.int64), k - 1)
    return cut


def _rooms_over(item_room: np.ndarray, item_share: np.ndarray, item_load: np.ndarray,
               item_top: np.ndarray, unit_rows: int, rooms: int) -> np.ndarray:
    """Whether each room has a share of several items above *unit_rows* rows
    (its items' and those of its copy of the previous share's top)."""
    starts = np.flatnonzero(np.r_[True, (item_room[1:] != item_room[:-1])
                                  | (item_share[1:] != item_share[:-1])])
    load = np.add.reduceat(item_load, starts)
    follows = np.r_[False, item_room[starts][1:] == item_room[starts][:-1]]
    load += np.where(follows, np.r_[0, item_top[starts[:-1]]], 0)
    items = np.diff(np.r_[starts, len(item_room)])
    over = np.zeros(rooms, np.bool_)
    over[item_room[starts[(load > unit_rows) & (items > 1)]]] = True
    return over


def _chains(unit: np.ndarray, room: np.ndarray, group: np.ndarray, root: np.ndarray, home: np.ndarray,
            split_tree: np.ndarray, period: int) -> tuple[np.ndarray, np.ndarray]:
    """Each unit's position in its room's chain of shares, and the copies:
    ``(row of the top, unit it is copied into)`` pairs.

    Units are numbered in room order, a room's shares consecutive. A share
    takes part in a chain only when its top (smallest root) is also its
    smallest group, so the top comes first in batch order (with only the copy
    before it) and its depth in the new tables stays within the chain's
    bound; and when it holds no piece of a cut tree.
    """
    units = int(unit.max()) + 1
    smallest = np.full(units, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(smallest, unit, group)
    top = np.full(units, np.iinfo(np.int64).max, dtype=np.int64)
    is_root = home & (group == root)
    np.minimum.at(top, unit[is_root], group[is_root])
    has_split = np.zeros(units, np.bool_)
    has_split[unit[split_tree]] = True
    eligible = (top == smallest) & ~has_split
    unit_room = np.zeros(units, np.int64)
    unit_room[unit] = room
    # Runs of linkable neighbours; the position in a run, restarted every
    # *period* units.
    linked = np.r_[False, (unit_room[1:] == unit_room[:-1]) & eligible[1:] & eligible[:-1]]
    at = np.arange(units, dtype=np.int64)
    run_start = np.maximum.accumulate(np.where(linked, 0, at))
    chain = (at - run_start) % max(1, period)
    receivers = np.flatnonzero(chain > 0)
    top_row = np.full(units, -1, np.int64)
    roots = np.flatnonzero(is_root)
    # The home row of each unit's top.
    mine = roots[group[roots] == top[unit[roots]]]
    top_row[unit[mine]] = mine
    copies = np.stack([top_row[receivers - 1], receivers], axis=1) if len(receivers) else np.zeros((0, 2), np.int64)
    return chain, copies.astype(np.int64)


# --- compressing batches of whole units -------------------------------------------


@dataclass
class UnitsOutput:
    """What one batch of units reports, and its output tables as pieces of a
    bounded number of rows (produced as they are written)."""

    report: dict[str, Any]
    pieces: Iterator[dict[str, pa.Table]]

    @property
    def tables(self) -> dict[str, pa.Table]:
        """Every piece's tables, concatenated (small batches and tests)."""
        found: dict[str, list[pa.Table]] = {}
        for piece in self.pieces:
            for name, table in piece.items():
                found.setdefault(name, []).append(table)
        return {name: pa.concat_tables(tables) for name, tables in found.items()}


@dataclass
class GroupBatch:
    """One row per group of a batch of whole units, sorted by ``unit, state_group``."""

    unit: np.ndarray
    groups: np.ndarray
    prevs: np.ndarray  # group IDs, -1 for none
    home: np.ndarray
    fixed: np.ndarray
    referenced: np.ndarray
    children: np.ndarray
    room_ids: pa.Array
    group_events: pa.Array
    chain: np.ndarray | None = None  # the unit's position in its chain of shares

    def __post_init__(self) -> None:
        if self.chain is None:
            self.chain = np.zeros(len(self.groups), np.int64)

    @classmethod
    def from_table(cls, head: pa.Table) -> "GroupBatch":
        """From rows of :data:`UNITS_SCHEMA` columns, one per group."""
        return cls(
            _int64_numpy(head.column("unit")), _int64_numpy(head.column("state_group")),
            _int64_numpy(head.column("prev_state_group"), fill=-1), _bool_numpy(head.column("home")),
            _bool_numpy(head.column("fixed")), _bool_numpy(head.column("referenced")),
            _int64_numpy(head.column("children")), head.column("room_id").combine_chunks(),
            head.column("group_event_id").combine_chunks(),
            _int64_numpy(head.column("chain")) if "chain" in head.column_names else None)


#: Rows per output piece (bounds the strings materialised at once).
PIECE_ROWS = 262_144


def _rows_hashes(offsets: np.ndarray, keys: np.ndarray, events: np.ndarray, idx: np.ndarray,
                 interned: _Interned) -> np.ndarray:
    """The rows hash (``treewalk.rows_hash``) of the deltas of groups *idx*."""
    hashes = _core_walk.group_rows_hashes(offsets, keys, events, interned.stride,
                                          *string_tables(interned))
    every: np.ndarray = np.frombuffer(hashes, dtype=np.int64) if len(offsets) > 1 else np.zeros(0, np.int64)
    picked: np.ndarray = every[idx]
    return picked


def _strings(interned: _Interned, keys: np.ndarray, events: np.ndarray) -> list[pa.Array]:
    stride = interned.stride
    type_ids = keys // stride
    return [
        interned.types.take(pa.array(type_ids)).cast(pa.string()),
        interned.state_keys.take(pa.array(keys - type_ids * stride)).cast(pa.string()),
        interned.events.take(pa.array(events)).cast(pa.string()),
    ]


def compress_units(segment: pa.Table, options: CompressOptions) -> UnitsOutput:
    """Plan, verify and produce the output of rows of whole units.

    *segment* has :data:`UNIT_ROWS_SCHEMA` columns sorted by ``unit,
    state_group``.
    """
    units_all = _int64_numpy(segment.column("unit"))
    g_all = _int64_numpy(segment.column("state_group"))
    starts = np.flatnonzero(np.r_[True, (g_all[1:] != g_all[:-1]) | (units_all[1:] != units_all[:-1])])
    batch = GroupBatch.from_table(segment.select(UNITS_SCHEMA.names).take(pa.array(starts)))
    del units_all, g_all
    parent = parents_within(batch.unit, batch.groups, batch.prevs)
    offsets, interned = _delta_rows(segment, starts)
    return compress_batch(batch, parent, offsets, interned, options)


def _plan_part(parent: np.ndarray, unit: np.ndarray, offsets: np.ndarray, keys: np.ndarray,
               events: np.ndarray, fixed: np.ndarray, max_depth: int, candidates: int) -> tuple[np.ndarray, ...]:
    """One call of the core's planner, its buffers as int64 arrays."""
    planned = _core_walk.plan_compression(parent, unit, offsets, keys, events, fixed.view(np.uint8),
                                          max_depth, candidates)
    return tuple(np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64) for a in planned)


def _chain_copies(batch: GroupBatch) -> np.ndarray:
    """Which groups of the batch are copies of a previous share's top."""
    assert batch.chain is not None
    copies: np.ndarray = ~batch.home & batch.fixed & (batch.chain > 0)
    return copies


def _plan_budgets(batch: GroupBatch, parent: np.ndarray, offsets: np.ndarray, interned: _Interned,
                  options: CompressOptions) -> tuple[np.ndarray, ...]:
    """The plan of every unit with its own depth budget, one core call per
    budget: ``max_depth`` less ``chain`` for a unit at a position > 0 of a
    chain (its top goes one hop under the copy of the previous top, which is
    at most ``chain - 1`` hops deep). The copies are left out of the plan."""
    assert batch.chain is not None
    copy = _chain_copies(batch)
    budget = np.where(batch.chain > 0, options.max_depth - batch.chain, options.max_depth)
    values = np.unique(budget[~copy])
    if len(values) == 1 and not copy.any():
        return _plan_part(parent, batch.unit, offsets, interned.keys, interned.event_ids, batch.fixed,
                          int(values[0]), options.candidates)
    n = len(batch.groups)
    sizes = np.diff(offsets)
    new_parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    new_sizes = sizes.copy()
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def rows_of(idx: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sub_offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        return sub_offsets, np.repeat(offsets[idx] - sub_offsets[:-1], lengths) + np.arange(sub_offsets[-1])

    for value in values:
        chosen = (budget == value) & ~copy  # whole units, parents among them
        idx = np.flatnonzero(chosen)
        position = np.cumsum(chosen) - 1
        sub_parent = np.where(parent[idx] >= 0, position[np.maximum(parent[idx], 0)], -1)
        sub_offsets, rows = rows_of(idx, sizes[idx])
        try:
            planned = _plan_part(sub_parent, batch.unit[idx], sub_offsets, interned.keys[rows],
                                 interned.event_ids[rows], batch.fixed[idx], int(value), options.candidates)
        except StateCorruptionError as exc:
            named = getattr(exc, "groups", ())
            exc.groups = tuple(int(idx[i]) for i in named if 0 <= i < len(idx))  # type: ignore[attr-defined]
            raise
        p_parent, p_depth, p_offsets, p_keys, p_events = planned
        new_parent[idx] = np.where(p_parent >= 0, idx[np.maximum(p_parent, 0)], -1)
        depth[idx] = p_depth
        new_sizes[idx] = np.diff(p_offsets)
        parts.append((idx, p_offsets, p_keys, p_events))
    idx = np.flatnonzero(copy)
    sub_offsets, rows = rows_of(idx, sizes[idx])
    parts.append((idx, sub_offsets, interned.keys[rows], interned.event_ids[rows]))
    new_offsets = np.r_[0, np.cumsum(new_sizes)].astype(np.int64)
    new_keys = np.empty(int(new_offsets[-1]), np.int64)
    new_events = np.empty(int(new_offsets[-1]), np.int64)
    for idx, p_offsets, p_keys, p_events in parts:
        to = np.repeat(new_offsets[idx] - p_offsets[:-1], np.diff(p_offsets)) + np.arange(p_offsets[-1])
        new_keys[to] = p_keys
        new_events[to] = p_events
    if copy.any():
        return _link_tops(batch, copy, new_parent, depth, new_offsets, new_keys, new_events)
    return new_parent, depth, new_offsets, new_keys, new_events


def _link_tops(batch: GroupBatch, copy: np.ndarray, new_parent: np.ndarray, depth: np.ndarray,
               new_offsets: np.ndarray, new_keys: np.ndarray,
               new_events: np.ndarray) -> tuple[np.ndarray, ...]:
    """The top of each share at a position > 0 of a chain made a delta over
    the copy of the previous top when that leaves fewer rows than its
    snapshot; its tree then hangs one hop deeper.

    The top was planned as a root (it is the smallest group of its unit), so
    the new rows of both are their full states. The top is linked after
    planning rather than offered to the planner as a candidate so that its
    tree's depths count from the top, not from the copy: the levels the
    planner re-hangs groups to then fall on the share's own groups, never on
    the copy, a whole share earlier.
    """
    copy_at = np.flatnonzero(copy)
    home_at = np.flatnonzero(batch.home & (batch.chain > 0))  # type: ignore[operator]
    firsts = home_at[np.unique(batch.unit[home_at], return_index=True)[1]]
    top_of_unit = dict(zip(batch.unit[firsts].tolist(), firsts.tolist()))
    replaced: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for c in copy_at.tolist():
        t = top_of_unit.get(int(batch.unit[c]))
        if t is None or new_parent[t] != -1:
            continue
        ck = new_keys[new_offsets[c]:new_offsets[c + 1]]
        ce = new_events[new_offsets[c]:new_offsets[c + 1]]
        tk = new_keys[new_offsets[t]:new_offsets[t + 1]]
        te = new_events[new_offsets[t]:new_offsets[t + 1]]
        order = np.argsort(ck, kind="stable")
        ck, ce = ck[order], ce[order]
        at = np.minimum(np.searchsorted(ck, tk), max(len(ck) - 1, 0))
        found = (ck[at] == tk) if len(ck) else np.zeros(len(tk), np.bool_)
        if int(found.sum()) != len(ck):
            continue  # the copy has a key the top lacks: no delta over it
        need = ~(found & (ce[at] == te))
        if int(need.sum()) >= len(tk):
            continue
        keep = np.flatnonzero(need)
        keep = keep[np.argsort(tk[keep], kind="stable")]
        replaced[t] = (tk[keep], te[keep])
        new_parent[t] = c
    if not replaced:
        return new_parent, depth, new_offsets, new_keys, new_events
    sizes = np.diff(new_offsets)
    for t, (keys, _) in replaced.items():
        sizes[t] = len(keys)
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    keys = np.empty(int(offsets[-1]), np.int64)
    events = np.empty(int(offsets[-1]), np.int64)
    same = np.ones(len(sizes), np.bool_)
    same[list(replaced)] = False
    idx = np.flatnonzero(same)
    lengths = sizes[idx]
    to = np.repeat(offsets[idx] - np.r_[0, np.cumsum(lengths)][:-1], lengths) + np.arange(int(lengths.sum()))
    start = np.repeat(new_offsets[idx] - np.r_[0, np.cumsum(lengths)][:-1], lengths) + np.arange(int(lengths.sum()))
    keys[to] = new_keys[start]
    events[to] = new_events[start]
    for t, (k, e) in replaced.items():
        keys[offsets[t]:offsets[t + 1]] = k
        events[offsets[t]:offsets[t + 1]] = e
    # The linked tops' trees: one hop deeper.
    top = _pointer_jump(new_parent)[0]
    depth = depth + (copy[top] & ~copy)
    return new_parent, depth, offsets, keys, events


def _plan(batch: GroupBatch, parent: np.ndarray, offsets: np.ndarray, interned: _Interned,
          options: CompressOptions) -> tuple[np.ndarray, ...]:
    """The core's plan (new parents, depths, offsets, keys, events); a key twice
    in one delta is reported with its group and key. Depths are in the new
    tables: a group under the copy of the previous share's top counts that
    copy's depth at its bound (``chain - 1``)."""
    n = len(batch.groups)
    if not n:
        return (np.zeros(0, np.int64),) * 2 + (np.zeros(1, np.int64), np.zeros(0, np.int64),
                                                np.zeros(0, np.int64))
    try:
        new_parent, depth, *rest = _plan_budgets(batch, parent, offsets, interned, options)
    except StateCorruptionError as exc:
        named = tuple(int(batch.groups[i]) for i in getattr(exc, "groups", ()) if 0 <= i < len(batch.groups))
        key = getattr(exc, "key", None)
        if key is None or not named:
            raise
        err = StateCorruptionError(f"state group {named[0]} has key {interned.key_text(key)} more than "
                                   "once in state_groups_state")
        err.groups = named  # type: ignore[attr-defined]
        raise err from None
    return (new_parent, depth, *rest)


def _under_copies(batch: GroupBatch, new_parent: np.ndarray) -> np.ndarray:
    """Whether each group hangs, in the new tables, under the copy of the
    previous share's top (its unit's chain position is then > 0)."""
    copy = _chain_copies(batch)
    if not copy.any():
        return np.zeros(len(batch.groups), np.bool_)
    under: np.ndarray = copy[_pointer_jump(new_parent)[0]]
    return under


def _chain_report(batch: GroupBatch, depth: np.ndarray, under: np.ndarray,
                  kept: np.ndarray) -> dict[str, list[int]]:
    """The ``chain_*`` lists of :data:`REPORT_SCHEMA` for the batch's units at
    a position > 0 of a chain."""
    assert batch.chain is not None
    in_chain = batch.chain > 0
    if not in_chain.any():
        return {"chain_units": [], "chain_tops": [], "chain_deepest": []}
    units, first = np.unique(batch.unit[in_chain], return_index=True)
    rows = np.flatnonzero(in_chain)
    # The top is the unit's first home group (after its copy).
    home_rows = rows[batch.home[rows]]
    top_at = home_rows[np.unique(batch.unit[home_rows], return_index=True)[1]]
    tops = np.full(len(units), -1, np.int64)
    slot = np.searchsorted(units, batch.unit[top_at])
    tops[slot] = np.where(under[top_at], depth[top_at], -1)
    deepest = np.full(len(units), -1, np.int64)
    counted = rows[under[rows] & kept[rows]]
    np.maximum.at(deepest, np.searchsorted(units, batch.unit[counted]), depth[counted])
    return {"chain_units": units.tolist(), "chain_tops": tops.tolist(), "chain_deepest": deepest.tolist()}


def _unreferenced(batch: GroupBatch, new_parent: np.ndarray) -> np.ndarray:
    """Groups no event references and no referenced group reaches through the
    new prev pointers (fixed roots are always kept)."""
    kept = batch.referenced | batch.fixed
    frontier = np.flatnonzero(kept)
    while len(frontier):
        up = new_parent[frontier]
        up = up[up >= 0]
        up = up[~kept[up]]
        kept[up] = True
        frontier = np.unique(up)
    unreferenced: np.ndarray = ~kept
    return unreferenced


def compress_batch(batch: GroupBatch, parent: np.ndarray, offsets: np.ndarray, interned: _Interned,
                   options: CompressOptions) -> UnitsOutput:
    """Plan and verify a batch of whole units given as interned CSR deltas
    (*parent*: each group's prev as a batch index); the output comes in pieces."""
    n = len(batch.groups)
    new_parent, depth, new_offsets, new_keys, new_events = _plan(batch, parent, offsets, interned, options)
    under = _under_copies(batch, new_parent)
    old_sizes = np.diff(offsets)
    new_sizes = np.diff(new_offsets)
    changed = ((new_parent != parent) | (new_sizes != old_sizes)) & ~batch.fixed
    unreferenced = _unreferenced(batch, new_parent) if options.find_unreferenced else np.zeros(n, np.bool_)
    changed &= ~unreferenced

    # Verification: the full state of every changed group, walked in the old
    # and in the new tables.
    digest_by_index = np.full(n, None, dtype=object)
    if changed.any():
        _, old_digest = walk_digests(parent, offsets, interned.keys, interned.event_ids, changed, interned)
        _, new_digest = walk_digests(new_parent, new_offsets, new_keys, new_events, changed, interned)
        differ = _bool_numpy(pc.not_equal(old_digest, new_digest))
        if differ.any():
            bad = batch.groups[changed][differ]
            raise StateVerificationError(
                f"the compressed tables give {len(bad)} state groups a different full state: "
                + ", ".join(str(g) for g in bad[:20].tolist()),
                tuple(int(g) for g in bad),
            )
        digest_by_index[np.flatnonzero(changed)] = np.asarray(new_digest.to_pylist(), dtype=object)

    home = batch.home
    out_home = home & ~unreferenced
    old_depth = _pointer_jump(parent)[1]
    report = {
        "groups": int(home.sum()),
        "changed_groups": int((changed & home).sum()),
        "unreferenced_groups": int((unreferenced & home).sum()),
        "rows_before": int(old_sizes[home].sum()),
        "rows_after": int(new_sizes[out_home].sum()),
        "max_depth_before": int(old_depth.max()) if n else 0,
        "max_depth_after": int(depth[~unreferenced & ~under].max()) if (~unreferenced & ~under).any() else 0,
        "verified_groups": int(changed.sum()),
        **_chain_report(batch, depth, under, ~unreferenced),
    }
    assert batch.chain is not None
    # The change set's depths count a copy of a previous top at its bound.
    depth = depth + np.where(under, batch.chain - 1, 0)
    listed = (changed & home) | (unreferenced & home)
    idx = np.flatnonzero(listed)
    is_delete = unreferenced[idx]
    new_prev_ids = np.where(new_parent[idx] >= 0, batch.groups[np.maximum(new_parent[idx], 0)], -1)
    changes = pa.table(
        [
            pa.array(batch.unit[idx]),
            pa.array(batch.groups[idx]),
            pa.array(np.where(is_delete, "delete", "rewrite").tolist(), pa.string()),
            batch.room_ids.take(pa.array(idx)),
            batch.group_events.take(pa.array(idx)),
            pa.array(batch.prevs[idx], mask=batch.prevs[idx] == -1),
            pa.array(new_prev_ids, mask=(new_prev_ids == -1) | is_delete),
            pa.array(old_sizes[idx]),
            pa.array(np.where(is_delete, 0, new_sizes[idx])),
            pa.array(batch.children[idx]),
            pa.array(np.where(is_delete, -1, depth[idx])),
            pa.array(digest_by_index[idx].tolist(), pa.string()),
            pa.array(_rows_hashes(offsets, interned.keys, interned.event_ids, idx, interned)),
            pa.array(np.where(is_delete, 0, _rows_hashes(new_offsets, new_keys, new_events, idx,
                                                           interned))),
        ],
        schema=CHANGES_SCHEMA,
    )
    edge_rows = out_home & (new_parent >= 0)
    first = {
        "state_group_edges": pa.table([pa.array(batch.groups[edge_rows]),
                                       pa.array(batch.groups[new_parent[edge_rows]])], schema=EDGES_SCHEMA),
        "changes": changes,
    }
    return UnitsOutput(report, _pieces(batch, interned, first, offsets, new_offsets, new_keys, new_events,
                                       out_home, listed, changed & home))


def _pieces(batch: GroupBatch, interned: _Interned, first: dict[str, pa.Table], offsets: np.ndarray,
            new_offsets: np.ndarray, new_keys: np.ndarray, new_events: np.ndarray, out_home: np.ndarray,
            listed: np.ndarray, rewritten: np.ndarray) -> Iterator[dict[str, pa.Table]]:
    """The output tables a bounded number of rows at a time: the new delta rows
    of every kept group, and the rows each listed group loses and gains."""
    yield first
    local = np.arange(len(batch.groups), dtype=np.int64)
    new_owner = np.repeat(local, np.diff(new_offsets))
    kept_rows = np.flatnonzero(out_home[new_owner])
    for lo in range(0, len(kept_rows), PIECE_ROWS):
        rows = kept_rows[lo:lo + PIECE_ROWS]
        owner = new_owner[rows]
        yield {"state_groups_state": pa.table(
            [pa.array(batch.groups[owner]), batch.room_ids.take(pa.array(owner))]
            + _strings(interned, new_keys[rows], new_events[rows]), schema=NEW_STATE_SCHEMA)}
    del kept_rows
    for op, owners, keys, events in (
            ("delete", np.repeat(local, np.diff(offsets)), interned.keys, interned.event_ids),
            ("insert", new_owner, new_keys, new_events)):
        taken = np.flatnonzero((listed if op == "delete" else rewritten)[owners])
        for lo in range(0, len(taken), PIECE_ROWS):
            rows = taken[lo:lo + PIECE_ROWS]
            owner = owners[rows]
            yield {"change_rows": pa.table(
                [pa.array(batch.unit[owner]), pa.array(batch.groups[owner]),
                 pa.array(np.full(len(rows), op, dtype=object), pa.string()),
                 batch.room_ids.take(pa.array(owner))] + _strings(interned, keys[rows], events[rows]),
                schema=CHANGE_ROWS_SCHEMA)}


#: Delta rows a Spark task compresses at a time (whole units, so a larger
#: unit goes alone).
TASK_BATCH_ROWS = 1_000_000


def _output_filesystem(output: str) -> tuple[Any, str]:
    """The filesystem and root path of *output* (a URI, or a local path)."""
    import pyarrow.fs as pafs

    if "://" in output:
        found: tuple[Any, str] = pafs.FileSystem.from_uri(output)
        return found
    return pafs.LocalFileSystem(), os.path.abspath(output)


class OutputWriter:
    """One Parquet file per output table, written as batches come."""

    def __init__(self, output: str, part: str) -> None:
        self.fs: Any
        self.root: str
        self.fs, self.root = _output_filesystem(output)
        self.part = part
        self.writers: dict[str, Any] = {}
        self.partials: dict[str, str] = {}

    def write(self, tables: dict[str, pa.Table]) -> None:
        import pyarrow.parquet as pq

        for name, table in tables.items():
            if name not in self.writers:
                self.fs.create_dir(f"{self.root}/{name}/_temporary", recursive=True)
                partial = f"{self.root}/{name}/_temporary/{self.part}.parquet"
                self.partials[name] = partial
                self.writers[name] = pq.ParquetWriter(
                    partial, OUTPUT_TABLES[name], filesystem=self.fs, compression="zstd"
                )
            self.writers[name].write_table(table.cast(OUTPUT_TABLES[name]))

    def close(self) -> None:
        """Close every file and move it into place (a retried attempt replaces it whole)."""
        for name, writer in self.writers.items():
            writer.close()
            self.fs.move(self.partials[name], f"{self.root}/{name}/{self.part.split('-attempt')[0]}.parquet")
        self.writers.clear()


def bounded_units(batches: Iterable[pa.RecordBatch], worker_memory: int) -> Iterator[pa.RecordBatch]:
    """*batches* (rows sorted by unit, state_group) as they come; raises
    ConfigError, naming the room, as soon as one unit has more rows than a
    Python worker holds within *worker_memory* bytes, before the unit is read
    whole. Rooms are split to fit (:func:`assign_units`), so such a unit is a
    single tree or piece too big on its own."""
    bound = ExecutorMemory(worker_memory)
    limit = bound.worker_rows
    # The unit and group the previous batch ended in, and what it held of them.
    current, group, held, held_groups, held_biggest, group_held = -1, -1, 0, 0, 0, 0
    for batch in batches:
        if batch.num_rows:
            units = _int64_numpy(batch.column("unit"))
            groups = _int64_numpy(batch.column("state_group"))
            runs = np.flatnonzero(np.r_[True, (units[1:] != units[:-1]) | (groups[1:] != groups[:-1])])
            per_group = np.diff(np.r_[runs, len(units)])
            same_group = int(units[0]) == current and int(groups[0]) == group
            if same_group:
                per_group[0] += group_held
            run_units = units[runs]
            starts = np.flatnonzero(np.r_[True, run_units[1:] != run_units[:-1]])
            counts = np.add.reduceat(per_group, starts)
            group_counts = np.diff(np.r_[starts, len(runs)])
            biggest = np.maximum.reduceat(per_group, starts)
            if int(units[0]) == current:
                counts[0] += held - (group_held if same_group else 0)
                group_counts[0] += held_groups - (1 if same_group else 0)
                biggest[0] = max(int(biggest[0]), held_biggest)
            current, group = int(units[-1]), int(groups[-1])
            held, held_groups, held_biggest = int(counts[-1]), int(group_counts[-1]), int(biggest[-1])
            group_held = int(per_group[-1])
            worst = int(counts.argmax())
            if counts[worst] > limit:
                room = batch.column("room_id")[int(runs[starts[worst]])].as_py()
                raise ConfigError(_too_big(room, int(counts[worst]), bound, int(group_counts[worst]),
                                           int(biggest[worst])))
        yield batch


def _too_big(room: str, rows: int, bound: ExecutorMemory, groups: int, biggest: int) -> str:
    """What to do about a unit of *rows* rows (more than a worker holds),
    *groups* groups and a group of *biggest* rows, as far as it was read."""
    limit = bound.worker_rows
    need = bound.worker_holds(rows) / GIB
    advice = "give a larger --executor-memory"
    # A tree is cut by branch with its root in every piece: a lower threshold
    # helps a tree of many groups, each well within the bound.
    if groups > 2 and 2 * biggest <= limit:
        advice += (f", or a --split-threshold below its {groups} groups so that its tree is cut "
                   "into smaller pieces")
    return (f"room {room} has more than {limit} delta rows in one unit that splitting the room "
            f"cannot make smaller (one tree, or one piece of a tree): the Python worker compressing "
            f"it would hold over {need:.2f} GiB, more than --executor-memory "
            f"{bound.total / GIB:.2f} GiB; {advice}")


def write_units(batches: Iterable[pa.RecordBatch], output: str, part: str,
                options: CompressOptions) -> pa.RecordBatch:
    """The ``mapInArrow`` body: compress sorted rows of whole units, write the
    output tables under *output* as ``<table>/<part>.parquet``, report."""
    totals: dict[str, Any] = {name: [] if name.startswith("chain_") else 0 for name in REPORT_SCHEMA.names}
    writer = OutputWriter(output, part)
    try:
        # Rows are interned as they arrive: a worker holds integer columns
        # (about 20 bytes a row) of the units it compresses, never their strings.
        stream = SortedRowInterner(("unit", "state_group"), UNITS_SCHEMA.names)
        if options.worker_memory:
            batches = bounded_units(batches, options.worker_memory)
        for heads, slots in stream.runs(iter(batches), TASK_BATCH_ROWS):
            batch = GroupBatch.from_table(heads)
            parent = parents_within(batch.unit, batch.groups, batch.prevs)
            interned = _Interned.of(slots.types, slots.state_keys, slots.event_ids, slots.keys, slots.events)
            produced = compress_batch(batch, parent, slots.offsets, interned, options)
            for piece in produced.pieces:
                writer.write(piece)
            for name, value in produced.report.items():
                if name.startswith("chain_"):
                    totals[name].extend(value)
                elif name.startswith("max_"):
                    totals[name] = max(totals[name], value)
                else:
                    totals[name] += value
            del heads, slots, produced, interned
            # Hand the batch's Arrow buffers back to the system rather than
            # keep them in the worker for the next one.
            pa.default_memory_pool().release_unused()
    finally:
        writer.close()
    return pa.RecordBatch.from_arrays([pa.array([totals[f.name]], f.type) for f in REPORT_SCHEMA],
                                      schema=REPORT_SCHEMA)


def finish_output(output: str) -> None:
    """Drop the attempts' scratch folders, create empty tables where no task
    wrote one, and mark the output complete."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, root = _output_filesystem(output)
    for name, schema in OUTPUT_TABLES.items():
        folder = f"{root}/{name}"
        fs.create_dir(folder, recursive=True)
        scratch = f"{folder}/_temporary"
        if fs.get_file_info(scratch).type != pafs.FileType.NotFound:
            fs.delete_dir(scratch)
        files = fs.get_file_info(pafs.FileSelector(folder))
        if not any(f.path.endswith(".parquet") for f in files):
            pq.write_table(schema.empty_table(), f"{folder}/part-empty.parquet", filesystem=fs)
    with fs.open_output_stream(f"{root}/_SUCCESS"):
        pass


def elapsed(clock: float) -> float:
    return time.perf_counter() - clock
