"""Pure-Python twin of ``streamrep._core.compress``: choosing shorter state deltas.

Input is a closed batch of state groups with every group's *full* state already
expanded (``streamrep._core.state.expand_groups``), keys and events interned as
int64 IDs and each state sorted by key. The plan keeps every full state as it
is and only changes how it is stored: each group gets a new prev group and the
delta over it, so that

* no group is more than ``max_depth`` prev hops from its root, and
* the total number of delta rows is small.

Two passes, per room (groups of a room are contiguous in the batch, and the
batch order is the order in which a group may take an earlier one as prev):

1. **Links.** A group with a prev keeps it (its delta over its prev is the
   smallest it can have among its ancestors); only redundant rows, equal to
   the prev's value, are dropped. A root (a snapshot holding the whole state)
   looks back at up to ``candidates`` earlier groups of its room, of other
   trees that started before it, whose keys its state contains, and takes the
   one that leaves the smallest delta, if that is smaller than the snapshot.
   Trees only ever link to trees whose root comes earlier, so no cycle forms.
2. **Levels.** Linked trees can be far deeper than ``max_depth``. In such a
   tree a group at depth ``D`` (written in mixed radix ``s1, s2, ...`` with
   ``sum(s - 1) <= max_depth``) takes as prev its ancestor ``D - P`` levels up,
   where ``P`` is the place value of the lowest non-zero digit of ``D``; its new
   depth is the digit sum of ``D``. A depth whose digits are all zero starts a
   new root. Several radix choices, plain snapshots every ``max_depth + 1`` hops
   among them, are priced (the rows their re-hung groups need) and the
   cheapest is kept.

Groups flagged ``fixed`` keep their prev and delta (a split tree's root, which
other pieces depend on); they must be roots.
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence

from streamrep._pure.state import _bytes_flags, _int64s

__all__ = ["DEFAULT_MAX_DEPTH", "DEFAULT_CANDIDATES", "plan_compression", "level_radices"]

#: The reference system's own limit on prev hops from a group to its root.
DEFAULT_MAX_DEPTH = 100

#: How many earlier groups of its room a root considers as its new prev.
DEFAULT_CANDIDATES = 16


def level_radices(height: int, max_depth: int) -> list[list[int]]:
    """Radix vectors (deepest level first, ``sum(s - 1) <= max_depth``) for
    numbering the depths ``0..height`` of a linked tree; the candidates the plan
    prices. A depth that is a multiple of the product of a vector starts a new
    root (a snapshot): ``[max_depth + 1]`` is plain snapshots every
    ``max_depth + 1`` hops, and is always a candidate.

    Empty when ``height <= max_depth`` (no levels needed).
    """
    if height <= max_depth:
        return []
    if max_depth < 1:
        raise ValueError("max_depth must be at least 1")
    found: list[list[int]] = [[max_depth + 1]]
    reaching = 0
    m = 2
    while reaching < 2 and m <= min(max_depth, 64):
        base = max_depth // m
        uniform = [base + 1] * m
        for k in range(max_depth - m * base):
            uniform[k] += 1
        found.append(uniform)
        if _reach(uniform) > height:
            reaching += 1
            # A long deepest level and short upper ones: fewer re-hung groups.
            top = list(uniform)
            while True:
                trial = list(top)
                trial[0] += 1
                for k in range(len(trial) - 1, 0, -1):
                    if trial[k] > 2:
                        trial[k] -= 1
                        break
                else:
                    break
                if _reach(trial) <= height:
                    break
                top = trial
            if top not in found:
                found.append(top)
        m += 1
    return found


def _reach(radices: Sequence[int]) -> int:
    product = 1
    for s in radices:
        product *= s
    return product


def _step(depth: int, radices: Sequence[int]) -> int:
    """Hops up to the new prev of a group at *depth*: the place value of the
    lowest non-zero digit (mixed radix), or 0 when it starts a new root."""
    place = 1
    for s in radices:
        if depth % s:
            return place
        depth //= s
        place *= s
    return 0


def _digit_sum(depth: int, radices: Sequence[int]) -> int:
    total = 0
    for s in radices:
        total += depth % s
        depth //= s
    return total


def _diff(
    keys: Sequence[int], events: Sequence[int], a_lo: int, a_hi: int, b_lo: int, b_hi: int
) -> int:
    """Rows group A needs over group B, or -1 when B has a key A lacks."""
    x, y, rows = a_lo, b_lo, 0
    while x < a_hi and y < b_hi:
        ka, kb = keys[x], keys[y]
        if ka < kb:
            rows += 1
            x += 1
        elif ka > kb:
            return -1
        else:
            if events[x] != events[y]:
                rows += 1
            x += 1
            y += 1
    if y < b_hi:
        return -1
    return rows + (a_hi - x)


def plan_compression(
    parents: Any,
    rooms: Any,
    full_offsets: Any,
    full_keys: Any,
    full_events: Any,
    fixed: Any = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    candidates: int = DEFAULT_CANDIDATES,
) -> tuple[array[int], array[int], array[int], array[int], array[int]]:
    """Choose a new prev and delta for every group of a batch.

    ``parents`` (n int64) is each group's current prev as a batch index, -1 for
    a root; the batch must be acyclic (check it with ``expand_groups`` first).
    ``rooms`` (n int64) numbers the rooms; a room's groups are contiguous.
    ``full_offsets`` (n+1, CSR) delimits each group's full state in
    ``full_keys``/``full_events``, sorted by key. ``fixed`` (n uint8 or None)
    marks roots that must stay as they are.

    Returns ``(new_parents, new_depths, delta_offsets, delta_keys,
    delta_events)``: the new prev of each group as a batch index (-1: root),
    its hops to its root, and its new delta (CSR, sorted by key).
    """
    if max_depth < 1:
        raise ValueError("max_depth must be at least 1")
    if candidates < 0:
        raise ValueError("candidates must not be negative")
    batch = _Batch(parents, rooms, full_offsets, full_keys, full_events, fixed)
    link = _links(batch, _tree_roots(batch.parent), candidates)
    shape = _Linked(link)
    new_parent, new_depth = _levels(batch, shape, max_depth)
    out_offsets, out_keys, out_events = _deltas(batch, new_parent)
    return array("q", new_parent), array("q", new_depth), out_offsets, out_keys, out_events


class _Batch:
    """The checked input of a plan: prevs, rooms, fixed flags and full states."""

    def __init__(self, parents: Any, rooms: Any, full_offsets: Any, full_keys: Any,
                 full_events: Any, fixed: Any) -> None:
        self.parent = parent = _int64s(parents, "parents")
        self.room = room = _int64s(rooms, "rooms")
        self.offsets = offsets = _int64s(full_offsets, "full_offsets")
        self.keys = keys = _int64s(full_keys, "full_keys")
        self.events = events = _int64s(full_events, "full_events")
        self.n = n = len(parent)
        if len(room) != n:
            raise ValueError(f"rooms has {len(room)} entries for {n} groups")
        if len(offsets) != n + 1:
            raise ValueError(f"full_offsets has {len(offsets)} entries, expected {n + 1}")
        if len(keys) != len(events):
            raise ValueError(f"full_keys has {len(keys)} entries but full_events {len(events)}")
        if n and (offsets[0] != 0 or offsets[n] != len(keys)):
            raise ValueError("full_offsets must start at 0 and end at len(full_keys)")
        keep: Sequence[int] = b"\x00" * n if fixed is None else _bytes_flags(fixed, "fixed")
        if len(keep) != n:
            raise ValueError(f"fixed has {len(keep)} entries for {n} groups")
        self.keep = keep
        for i in range(n):
            p = parent[i]
            if p < -1 or p >= n:
                raise ValueError(f"parents[{i}] = {p} is not a batch index")
            if keep[i] and p != -1:
                raise ValueError(f"group index {i} is fixed but not a root")
            if offsets[i] > offsets[i + 1]:
                raise ValueError(f"full_offsets decreases at group index {i}")

    def rows(self, i: int) -> int:
        """Rows of group *i*'s full state (its delta as a snapshot)."""
        return self.offsets[i + 1] - self.offsets[i]

    def rows_over(self, i: int, j: int) -> int:
        """Rows group *i* needs over group *j*, or -1 when *j* has a key *i* lacks."""
        offsets = self.offsets
        return _diff(self.keys, self.events, offsets[i], offsets[i + 1], offsets[j], offsets[j + 1])


def _tree_roots(parent: Sequence[int]) -> list[int]:
    """The root of each group's original tree (iterative, memoised)."""
    n = len(parent)
    tree_root = [-1] * n
    for i in range(n):
        path = []
        v = i
        while tree_root[v] == -1 and parent[v] != -1:
            path.append(v)
            v = parent[v]
            if len(path) > n:
                raise ValueError("parents form a cycle")
        r = v if tree_root[v] == -1 else tree_root[v]
        tree_root[v] = r
        for u in path:
            tree_root[u] = r
    return tree_root


def _links(batch: _Batch, tree_root: list[int], candidates: int) -> list[int]:
    """Pass 1: each group's prev after linking, a root taking the earlier group of
    its room (of a tree that started before it) that leaves the smallest delta."""
    parent, room = batch.parent, batch.room
    link = [parent[i] for i in range(batch.n)]
    for i in range(batch.n):
        if parent[i] != -1 or batch.keep[i] or candidates == 0:
            continue
        best, best_rows = -1, batch.rows(i)
        j = i - 1
        looked = 0
        while j >= 0 and room[j] == room[i] and looked < candidates:
            if tree_root[j] < i:
                looked += 1
                rows = batch.rows_over(i, j)
                if 0 <= rows < best_rows:
                    best, best_rows = j, rows
            j -= 1
        link[i] = best
    return link


class _Linked:
    """The forest after the links pass: each group's prev, depth and top root,
    and the height of each tree."""

    def __init__(self, link: list[int]) -> None:
        n = len(link)
        self.link = link
        self.depth = [-1] * n
        self.top = [-1] * n
        for i in range(n):
            path = []
            v = i
            while self.depth[v] == -1 and link[v] != -1:
                path.append(v)
                v = link[v]
            if self.depth[v] == -1:
                self.depth[v] = 0
                self.top[v] = v
            d, t = self.depth[v], self.top[v]
            for u in reversed(path):
                d += 1
                self.depth[u] = d
                self.top[u] = t
        self.height: dict[int, int] = {}
        for i in range(n):
            if self.depth[i] > self.height.get(self.top[i], -1):
                self.height[self.top[i]] = self.depth[i]

    def ancestor(self, v: int, hops: int) -> int:
        for _ in range(hops):
            v = self.link[v]
        return v


def _levels(batch: _Batch, shape: _Linked, max_depth: int) -> tuple[list[int], list[int]]:
    """Pass 2: the new prev and depth of every group, the linked trees deeper
    than *max_depth* re-hung by the cheapest of their radix choices."""
    new_parent = list(shape.link)
    new_depth = list(shape.depth)
    members: dict[int, list[int]] = {}
    for i in range(batch.n):
        if shape.height[shape.top[i]] > max_depth:
            members.setdefault(shape.top[i], []).append(i)
    for t, group_list in members.items():
        radices = _cheapest_radices(batch, shape, group_list,
                                    level_radices(shape.height[t], max_depth))
        for i in group_list:
            if shape.depth[i] == 0:
                continue
            step = _step(shape.depth[i], radices)
            new_parent[i] = shape.ancestor(i, step) if step else -1
            new_depth[i] = _digit_sum(shape.depth[i], radices)
    return new_parent, new_depth


def _cheapest_radices(batch: _Batch, shape: _Linked, group_list: list[int],
                      radix_lists: list[list[int]]) -> list[int]:
    """The radix choice whose re-hung groups add the fewest rows over keeping
    their linked prev (the first of equal ones)."""
    best_plan: tuple[int, list[int]] | None = None
    for radices in radix_lists:
        cost = 0
        for i in group_list:
            if shape.depth[i] == 0:
                continue
            step = _step(shape.depth[i], radices)
            if step == 1:
                continue
            cost -= batch.rows_over(i, shape.link[i])
            if step == 0:
                cost += batch.rows(i)
            else:
                cost += batch.rows_over(i, shape.ancestor(i, step))
            if best_plan is not None and cost >= best_plan[0]:
                break
        if best_plan is None or cost < best_plan[0]:
            best_plan = (cost, radices)
    assert best_plan is not None
    return best_plan[1]


def _deltas(batch: _Batch, new_parent: list[int]) -> tuple[array[int], array[int], array[int]]:
    """Each group's delta over its new prev (CSR, sorted by key): the rows of its
    full state its prev does not hold as they are."""
    offsets, keys, events = batch.offsets, batch.keys, batch.events
    out_offsets: array[int] = array("q", [0])
    out_keys: array[int] = array("q")
    out_events: array[int] = array("q")
    for i in range(batch.n):
        p = new_parent[i]
        lo, hi = offsets[i], offsets[i + 1]
        if p == -1:
            out_keys.extend(keys[lo:hi])
            out_events.extend(events[lo:hi])
        else:
            y, y_hi = offsets[p], offsets[p + 1]
            for x in range(lo, hi):
                k = keys[x]
                while y < y_hi and keys[y] < k:
                    y += 1
                if y < y_hi and keys[y] == k and events[y] == events[x]:
                    continue
                out_keys.append(k)
                out_events.append(events[x])
        out_offsets.append(len(out_keys))
    return out_offsets, out_keys, out_events
