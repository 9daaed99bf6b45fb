"""Pure-Python twin of ``streamrep._core.treewalk``: walking state-group trees.

A state group's full state is the deltas from the root of its tree down to it.
Expanding every group's full state at once costs groups x state; these
routines instead walk each tree depth first holding the state of the current
path only: one map from key to event, changed in place, with an undo log that
puts it back on the way up. Memory then follows the largest state and the
topology, never their product.

* :func:`digest_groups`: the digest of each wanted group's full state. The
  digest is updated per changed key: it is the sum, modulo 2**256, of the
  SHA-256 of every entry (the entry written as three 4-byte big-endian lengths
  each followed by the UTF-8 bytes of ``type``, ``state_key`` and
  ``event_id``), so the order in which keys arrive does not matter. This is
  digest version 2 (:data:`DIGEST_VERSION`); :func:`digest_state` computes the
  same value from a mapping.
* :class:`StateWalk`: the full state of each wanted group, a bounded number
  of rows at a time.
* :func:`plan_compression`: the compression plan of
  ``streamrep._pure.compress`` (same links, levels and deltas) priced along the
  trees from the deltas, without full states.

Inputs are batches of groups: ``parents`` (int64 batch indices, -1 for a
root; acyclic), the deltas in CSR form (``delta_offsets`` of n+1 entries into
``delta_keys``/``delta_events``, interned int64 IDs, no key twice in one
delta) and optional uint8 flags. Deltas never remove a key: a group's state
holds every key of its prev group's.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any, Iterable, Mapping, Sequence

from streamrep._pure.compress import (
    DEFAULT_CANDIDATES,
    DEFAULT_MAX_DEPTH,
    _digit_sum,
    _Linked,
    _step,
    _tree_roots,
    level_radices,
)
from streamrep._pure.state import _bytes_flags, _int64s
from streamrep.errors import StateCorruptionError

__all__ = [
    "DIGEST_VERSION",
    "EMPTY_STATE_DIGEST",
    "digest_state",
    "digest_groups",
    "StateWalk",
    "plan_compression",
    "rows_hash",
    "group_rows_hashes",
    "StringInterner",
]

#: Version of the state digest encoding (order-independent sum of entry hashes).
DIGEST_VERSION = 2

#: Digest of a state with no entries.
EMPTY_STATE_DIGEST = "0" * 64

_MASK = (1 << 256) - 1
_ABSENT = -1


def _entry_hash(typ: bytes, state_key: bytes, event_id: bytes) -> int:
    blob = b"".join(len(p).to_bytes(4, "big") + p for p in (typ, state_key, event_id))
    return int.from_bytes(hashlib.sha256(blob).digest(), "big")


def digest_state(
    state: Mapping[tuple[str, str], str] | Iterable[tuple[tuple[str, str], str]],
) -> str:
    """The digest of one full state given as ``{(type, state_key): event_id}``.

    Agrees with :func:`digest_groups` for the same state; an empty state gives
    :data:`EMPTY_STATE_DIGEST`.
    """
    items = state.items() if isinstance(state, Mapping) else state
    total = 0
    for (t, s), e in items:
        total += _entry_hash(t.encode("utf-8"), s.encode("utf-8"), e.encode("utf-8"))
    return f"{total & _MASK:064x}"


def _signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def rows_hash(rows: Iterable[tuple[str, str, str]]) -> int:
    """The hash of a multiset of delta rows ``(type, state_key, event_id)``: the
    sum, as a signed 64-bit integer with wraparound, of the first 8 bytes
    (big-endian) of each row's entry hash. :func:`group_rows_hashes` computes it
    per group of a batch; the database computes it with SQL."""
    total = 0
    for t, s, e in rows:
        total += _entry_hash(t.encode("utf-8"), s.encode("utf-8"), e.encode("utf-8")) >> 192
    return _signed64(total)


class _Strings:
    """One ``(offsets, data)`` string table (int64 offsets into UTF-8 bytes)."""

    def __init__(self, table: Any, name: str) -> None:
        try:
            offsets, data = table
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be an (offsets, data) pair")
        self.offsets = _int64s(offsets, f"{name} offsets")
        self.data = bytes(memoryview(data if data is not None else b"").cast("B"))
        self.name = name

    def get(self, i: int) -> bytes:
        if i < 0 or i >= len(self.offsets) - 1:
            raise ValueError(f"{self.name} index {i} is outside its string table")
        start, end = self.offsets[i], self.offsets[i + 1]
        if start < 0 or end < start or end > len(self.data):
            raise ValueError(f"{self.name} offsets at index {i} are outside the string data")
        return self.data[start:end]


class _Forest:
    """A checked batch: parents, CSR deltas, children and dense key IDs."""

    def __init__(self, parents: Any, delta_offsets: Any, delta_keys: Any, delta_events: Any) -> None:
        self.parent = _int64s(parents, "parents")
        self.offsets = _int64s(delta_offsets, "delta_offsets")
        self.keys = _int64s(delta_keys, "delta_keys")
        self.events = _int64s(delta_events, "delta_events")
        n = self.n = len(self.parent)
        if len(self.offsets) != n + 1:
            raise ValueError(f"delta_offsets has {len(self.offsets)} entries, expected {n + 1}")
        if len(self.keys) != len(self.events):
            raise ValueError(
                f"delta_keys has {len(self.keys)} entries but delta_events {len(self.events)}")
        if self.offsets[0] != 0 or self.offsets[n] != len(self.keys):
            raise ValueError("delta_offsets must start at 0 and end at len(delta_keys)")
        for i in range(n):
            if self.offsets[i] > self.offsets[i + 1]:
                raise ValueError(f"delta_offsets decreases at group index {i}")
            p = self.parent[i]
            if p < -1 or p >= n:
                raise ValueError(f"parents[{i}] = {p} is not a batch index")
        for x in range(len(self.events)):
            if self.events[x] < 0:
                raise ValueError(f"delta_events[{x}] = {self.events[x]} is negative")
        self.key_values = sorted(set(self.keys))
        rank = {k: r for r, k in enumerate(self.key_values)}
        self.dense = [rank[k] for k in self.keys]
        for i in range(n):
            seen: set[int] = set()
            for x in range(self.offsets[i], self.offsets[i + 1]):
                if self.keys[x] in seen:
                    exc = StateCorruptionError(f"group index {i} has key {self.keys[x]} twice in its delta")
                    exc.groups = (i,)  # type: ignore[attr-defined]
                    exc.key = self.keys[x]  # type: ignore[attr-defined]
                    raise exc
                seen.add(self.keys[x])
        self._link(self.parent)
        reached = len(self.roots)
        stack = list(self.roots)
        while stack:
            v = stack.pop()
            reached += len(self.children[v])
            stack.extend(self.children[v])
        if reached != n:
            raise ValueError("parents form a cycle")

    def _link(self, parent: Sequence[int]) -> None:
        self.parent = parent
        self.children: list[list[int]] = [[] for _ in range(self.n)]
        self.roots: list[int] = []
        for i in range(self.n):
            (self.roots if parent[i] == -1 else self.children[parent[i]]).append(i)

    def relinked(self, parent: list[int]) -> "_Forest":
        """The same groups and deltas with *parent* as prevs (acyclic)."""
        other = object.__new__(_Forest)
        other.__dict__.update(self.__dict__)
        other._link(parent)
        return other


def _flags(obj: Any, n: int, name: str) -> Sequence[int]:
    if obj is None:
        return b"\x01" * n
    flags = _bytes_flags(obj, name)
    if len(flags) != n:
        raise ValueError(f"{name} has {len(flags)} entries for {n} groups")
    return flags


def _needed(children: list[list[int]], roots: list[int], wanted: Sequence[int]) -> list[bool]:
    """Whether each group is wanted or has a wanted descendant."""
    order: list[int] = []
    stack = list(roots)
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(children[v])
    need = [False] * len(children)
    for v in reversed(order):
        need[v] = bool(wanted[v]) or any(need[c] for c in children[v])
    return need


class _Path:
    """The state of the current path: a map, its undo log, size and digest."""

    def __init__(self, keys: int, hasher: Any = None) -> None:
        self.value = [_ABSENT] * keys
        self.log: list[tuple[int, int]] = []  # (dense key, previous event)
        self.size = 0
        self.digest = 0
        self.hasher = hasher

    def apply(self, forest: _Forest, v: int) -> None:
        for x in range(forest.offsets[v], forest.offsets[v + 1]):
            k, e = forest.dense[x], forest.events[x]
            old = self.value[k]
            if old == e:
                continue
            self.log.append((k, old))
            self.value[k] = e
            if self.hasher is not None:
                key = forest.key_values[k]
                if old != _ABSENT:
                    self.digest -= self.hasher(key, old)
                self.digest += self.hasher(key, e)
            if old == _ABSENT:
                self.size += 1

    def undo(self, mark: int) -> None:
        while len(self.log) > mark:
            k, old = self.log.pop()
            self.value[k] = old
            if old == _ABSENT:
                self.size -= 1

    def entries(self) -> list[tuple[int, int]]:
        """The current state as (dense key, event), sorted by key."""
        return sorted((k, self.value[k]) for k, old in self.log if old == _ABSENT)


def _walk(forest: _Forest, need: list[bool], visit: Any, path: _Path) -> None:
    """Depth-first over the needed groups: ``visit(v)`` with the path at ``v``."""
    stack: list[tuple[int, bool, int, int]] = [
        (r, True, 0, 0) for r in reversed(forest.roots) if need[r]]
    while stack:
        v, entering, mark, digest = stack.pop()
        if not entering:
            path.undo(mark)
            path.digest = digest
            continue
        mark, digest = len(path.log), path.digest
        path.apply(forest, v)
        visit(v)
        stack.append((v, False, mark, digest))
        stack.extend((c, True, 0, 0) for c in reversed(forest.children[v]) if need[c])


def digest_groups(
    parents: Any, delta_offsets: Any, delta_keys: Any, delta_events: Any, wanted: Any,
    key_stride: int, types: Any, state_keys: Any, event_ids: Any,
) -> tuple[array[int], bytes]:
    """Entries and digest of the full state of each wanted group (``wanted``
    uint8 or None for every group), in batch order.

    Key ID ``k`` stands for ``(types[k // key_stride], state_keys[k %
    key_stride])`` and event ID ``e`` for ``event_ids[e]``; each string table
    is an ``(offsets, data)`` pair (int64 offsets of m+1 entries into UTF-8
    ``data``, as an Arrow large_string array holds them).

    Returns ``(entries, hex_digests)``: an ``array('q')`` of entry counts and
    the 64-character lowercase hex digests, concatenated.
    """
    if key_stride <= 0:
        raise ValueError("key_stride must be positive")
    forest = _Forest(parents, delta_offsets, delta_keys, delta_events)
    want = _flags(wanted, forest.n, "wanted")
    t_table = _Strings(types, "type")
    s_table = _Strings(state_keys, "state_key")
    e_table = _Strings(event_ids, "event_id")

    def hasher(key: int, event: int) -> int:
        if key < 0:
            raise ValueError(f"key index {key} is negative")
        return _entry_hash(t_table.get(key // key_stride), s_table.get(key % key_stride),
                           e_table.get(event))

    path = _Path(len(forest.key_values), hasher)
    found: dict[int, tuple[int, int]] = {}

    def visit(v: int) -> None:
        if want[v]:
            found[v] = (path.size, path.digest & _MASK)

    _walk(forest, _needed(forest.children, forest.roots, want), visit, path)
    entries: array[int] = array("q")
    hexes = bytearray()
    for v in range(forest.n):
        if want[v]:
            size, digest = found[v]
            entries.append(size)
            hexes += f"{digest:064x}".encode("ascii")
    return entries, bytes(hexes)


def group_rows_hashes(delta_offsets: Any, delta_keys: Any, delta_events: Any, key_stride: int,
                      types: Any, state_keys: Any, event_ids: Any) -> array[int]:
    """:func:`rows_hash` of each group's delta rows (CSR, interned as for
    :func:`digest_groups`)."""
    if key_stride <= 0:
        raise ValueError("key_stride must be positive")
    offsets = _int64s(delta_offsets, "delta_offsets")
    keys = _int64s(delta_keys, "delta_keys")
    events = _int64s(delta_events, "delta_events")
    if len(keys) != len(events) or not len(offsets) or offsets[-1] != len(keys):
        raise ValueError("delta_offsets must end at len(delta_keys) == len(delta_events)")
    t_table = _Strings(types, "type")
    s_table = _Strings(state_keys, "state_key")
    e_table = _Strings(event_ids, "event_id")
    out: array[int] = array("q")
    for i in range(len(offsets) - 1):
        total = 0
        for x in range(offsets[i], offsets[i + 1]):
            k = keys[x]
            if k < 0:
                raise ValueError(f"key index {k} is negative")
            total += _entry_hash(t_table.get(k // key_stride), s_table.get(k % key_stride),
                                 e_table.get(events[x])) >> 192
        out.append(_signed64(total))
    return out


class StateWalk:
    """The full state of each wanted group of a batch, a bounded chunk at a time.

    Groups come in depth-first order, each state sorted by key. Memory holds
    the current path's state and one chunk, whatever the size of the batch.
    """

    def __init__(self, parents: Any, delta_offsets: Any, delta_keys: Any, delta_events: Any,
                 wanted: Any = None) -> None:
        self._forest = forest = _Forest(parents, delta_offsets, delta_keys, delta_events)
        self._want = _flags(wanted, forest.n, "wanted")
        self._need = _needed(forest.children, forest.roots, self._want)
        self._path = _Path(len(forest.key_values))
        self._stack: list[tuple[int, int, int]] = [
            (r, 1, 0) for r in reversed(forest.roots) if self._need[r]]

    def next_states(self, max_rows: int) -> tuple[array[int], array[int], array[int]]:
        """``(groups, keys, events)`` of the next wanted groups (batch indices),
        at least one group and about *max_rows* rows; empty arrays at the end."""
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        forest, path, stack = self._forest, self._path, self._stack
        out_groups: array[int] = array("q")
        out_keys: array[int] = array("q")
        out_events: array[int] = array("q")
        while stack and (not out_groups or len(out_groups) < max_rows):
            v, entering, mark = stack.pop()
            if not entering:
                path.undo(mark)
                continue
            mark = len(path.log)
            path.apply(forest, v)
            if self._want[v]:
                start = len(out_groups)
                for k, e in path.entries():
                    out_keys.append(forest.key_values[k])
                    out_events.append(e)
                out_groups.extend([v] * (len(out_keys) - start))
            stack.append((v, 0, mark))
            stack.extend((c, 1, 0) for c in reversed(forest.children[v]) if self._need[c])
        return out_groups, out_keys, out_events


# --- the compression plan, priced along the trees ----------------------------------


def _segment_rows(path: _Path, start: int, stamp: list[int], mark: int) -> list[int]:
    """Keys changed in ``log[start:]`` whose value now differs from their value
    before ``start`` (the rows a group needs over that ancestor)."""
    rows = []
    for k, old in path.log[start:]:
        if stamp[k] == mark:
            continue
        stamp[k] = mark
        if path.value[k] != old:
            rows.append(k)
    return rows


def _candidate_pairs(parent: Sequence[int], room: Sequence[int], keep: Sequence[int],
                     tree_root: list[int], candidates: int) -> dict[int, list[int]]:
    """Root index -> earlier groups of its room it may take as prev, nearest first."""
    found: dict[int, list[int]] = {}
    if candidates == 0:
        return found
    for i in range(len(parent)):
        if parent[i] != -1 or keep[i]:
            continue
        listed: list[int] = []
        j = i - 1
        while j >= 0 and room[j] == room[i] and len(listed) < candidates:
            if tree_root[j] < i:
                listed.append(j)
            j -= 1
        found[i] = listed
    return found


def _pair_rows(forest: _Forest, pairs: dict[int, list[int]]) -> dict[tuple[int, int], int]:
    """Rows each root needs over each of its candidates (-1: a key it lacks),
    each priced when the walk of the original trees stands at the candidate."""
    by_candidate: dict[int, list[int]] = {}
    for i, listed in pairs.items():
        for j in listed:
            by_candidate.setdefault(j, []).append(i)
    wanted = [1 if j in by_candidate else 0 for j in range(forest.n)]
    path = _Path(len(forest.key_values))
    priced: dict[tuple[int, int], int] = {}

    def visit(j: int) -> None:
        for i in by_candidate.get(j, ()):
            rows = matched = 0
            for x in range(forest.offsets[i], forest.offsets[i + 1]):
                held = path.value[forest.dense[x]]
                if held == _ABSENT:
                    rows += 1
                else:
                    matched += 1
                    if held != forest.events[x]:
                        rows += 1
            priced[(i, j)] = rows if matched == path.size else -1

    _walk(forest, _needed(forest.children, forest.roots, wanted), visit, path)
    return priced


def _walk_linked(linked: _Forest, shape: _Linked, tops: Any, visit: Any) -> _Path:
    """Depth-first over the linked trees whose top is in *tops*, calling
    ``visit(v, path, starts, nodes)`` where ``starts[d]``/``nodes[d]`` are the
    log position and the group at depth d of the current path."""
    path = _Path(len(linked.key_values))
    starts: list[int] = []
    nodes: list[int] = []
    stack: list[tuple[int, int]] = [(r, 1) for r in reversed(linked.roots) if r in tops]
    while stack:
        v, entering = stack.pop()
        d = shape.depth[v]
        if not entering:
            path.undo(starts[d])
            del starts[d:], nodes[d:]
            continue
        starts.append(len(path.log))
        nodes.append(v)
        path.apply(linked, v)
        visit(v, path, starts, nodes)
        stack.append((v, 0))
        stack.extend((c, 1) for c in reversed(linked.children[v]))
    return path


def plan_compression(
    parents: Any,
    rooms: Any,
    delta_offsets: Any,
    delta_keys: Any,
    delta_events: Any,
    fixed: Any = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    candidates: int = DEFAULT_CANDIDATES,
) -> tuple[array[int], array[int], array[int], array[int], array[int]]:
    """The plan of ``streamrep._pure.compress.plan_compression``, from the deltas.

    ``parents`` (n int64) is each group's prev as a batch index (-1: root);
    ``rooms`` (n int64) numbers the rooms, a room's groups contiguous; the
    deltas are CSR (``delta_offsets`` n+1) with no key twice in one delta;
    ``fixed`` (n uint8 or None) marks roots to leave as they are.

    Returns ``(new_parents, new_depths, delta_offsets, delta_keys,
    delta_events)``, the new deltas sorted by key.
    """
    if max_depth < 1:
        raise ValueError("max_depth must be at least 1")
    if candidates < 0:
        raise ValueError("candidates must not be negative")
    forest = _Forest(parents, delta_offsets, delta_keys, delta_events)
    n = forest.n
    room = _int64s(rooms, "rooms")
    if len(room) != n:
        raise ValueError(f"rooms has {len(room)} entries for {n} groups")
    keep = b"\x00" * n if fixed is None else _flags(fixed, n, "fixed")
    for i in range(n):
        if keep[i] and forest.parent[i] != -1:
            raise ValueError(f"group index {i} is fixed but not a root")

    shape = _Linked(_links(forest, room, keep, candidates))
    linked = forest.relinked(shape.link)
    chosen = _chosen_radices(linked, shape, max_depth)
    new_parent, new_depth, rows_of = _new_deltas(linked, shape, chosen)
    out_offsets: array[int] = array("q", [0])
    out_keys: array[int] = array("q")
    out_events: array[int] = array("q")
    for v in range(n):
        for k, e in rows_of[v]:
            out_keys.append(k)
            out_events.append(e)
        out_offsets.append(len(out_keys))
    return array("q", new_parent), array("q", new_depth), out_offsets, out_keys, out_events


def _links(forest: _Forest, room: Sequence[int], keep: Sequence[int], candidates: int) -> list[int]:
    """Pass 1: each group's prev after linking, a root becoming a delta over the
    earlier group of its room that leaves the smallest delta, if any is smaller."""
    pairs = _candidate_pairs(forest.parent, room, keep, _tree_roots(forest.parent), candidates)
    priced = _pair_rows(forest, pairs)
    link = list(forest.parent)
    for i, listed in pairs.items():
        best, best_rows = -1, forest.offsets[i + 1] - forest.offsets[i]
        for j in listed:
            rows = priced[(i, j)]
            if 0 <= rows < best_rows:
                best, best_rows = j, rows
        link[i] = best
    return link


def _chosen_radices(linked: _Forest, shape: _Linked, max_depth: int) -> dict[int, list[int]]:
    """Pass 2: the cheapest radices of each linked tree deeper than the bound,
    priced along it (the rows its re-hung groups add over their linked prev)."""
    deep = {t: level_radices(h, max_depth) for t, h in shape.height.items() if h > max_depth}
    costs = {t: [0] * len(radix_lists) for t, radix_lists in deep.items()}
    stamp = [0] * len(linked.key_values)
    marks = [0]

    def price(v: int, path: _Path, starts: list[int], nodes: list[int]) -> None:
        d = shape.depth[v]
        if d == 0:
            return
        own = len(path.log) - starts[d]
        for r, radices in enumerate(deep[shape.top[v]]):
            step = _step(d, radices)
            if step == 1:
                continue
            if step == 0:
                extra = path.size
            else:
                marks[0] += 1
                extra = len(_segment_rows(path, starts[d - step + 1], stamp, marks[0]))
            costs[shape.top[v]][r] += extra - own

    _walk_linked(linked, shape, deep, price)
    return {t: deep[t][min(range(len(c)), key=lambda r: (c[r], r))] for t, c in costs.items()}


def _new_deltas(
    linked: _Forest, shape: _Linked, chosen: dict[int, list[int]],
) -> tuple[list[int], list[int], list[list[tuple[int, int]]]]:
    """Pass 3: the new prev, depth and delta rows (sorted by key) of every group."""
    new_parent = list(shape.link)
    new_depth = list(shape.depth)
    rows_of: list[list[tuple[int, int]]] = [[] for _ in range(linked.n)]
    stamp = [0] * len(linked.key_values)
    marks = [0]

    def emit(v: int, path: _Path, starts: list[int], nodes: list[int]) -> None:
        d = shape.depth[v]
        radices = chosen.get(shape.top[v])
        step = 1 if radices is None or d == 0 else _step(d, radices)
        if step == 1:
            keys = [k for k, _ in path.log[starts[d]:]]
        elif step == 0:
            keys = [k for k, old in path.log if old == _ABSENT]
        else:
            marks[0] += 1
            keys = _segment_rows(path, starts[d - step + 1], stamp, marks[0])
        if radices is not None and d:
            new_parent[v] = nodes[d - step] if step else -1
            new_depth[v] = _digit_sum(d, radices)
        rows_of[v] = sorted((linked.key_values[k], path.value[k]) for k in keys)

    _walk_linked(linked, shape, set(linked.roots), emit)
    return new_parent, new_depth, rows_of


class StringInterner:
    """Strings to dense IDs (0, 1, ...) in the order they first arrive."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        self._data = bytearray()
        self._starts = [0]

    def __len__(self) -> int:
        return len(self._ids)

    def intern(self, offsets: Any, data: Any) -> array[int]:
        """The ID of each string of an ``(offsets, data)`` pair (int64 offsets
        of m+1 entries into UTF-8 *data*, as an Arrow large_string holds
        them), as an ``array('q')``; new strings get the next IDs."""
        bounds = _int64s(offsets, "strings offsets")
        blob = bytes(memoryview(data if data is not None else b"").cast("B"))
        for i in range(len(bounds) - 1):
            if bounds[i] < 0 or bounds[i + 1] < bounds[i] or bounds[i + 1] > len(blob):
                raise ValueError(f"strings offsets at index {i} are outside the string data")
        out = array("q")
        for i in range(len(bounds) - 1):
            text = blob[bounds[i]:bounds[i + 1]]
            found = self._ids.get(text)
            if found is None:
                found = self._ids[text] = len(self._ids)
                self._data += text
                self._starts.append(len(self._data))
            out.append(found)
        return out

    def table(self) -> tuple[bytes, bytes]:
        """``(offsets, data)`` of the interned strings in ID order: int64
        offsets of len(self)+1 entries and the UTF-8 bytes."""
        return array("q", self._starts).tobytes(), bytes(self._data)
