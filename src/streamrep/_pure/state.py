"""Pure-Python twin of ``streamrep._core.state``: expanding state-group deltas.

State groups form a forest. Each group stores only its delta over its ``prev``
group; its full state is the deltas from the root down to it, later ones
overriding earlier ones per key. Keys ``(type, state_key)`` and event IDs arrive
interned as int64 IDs: the caller owns the string tables, this module only
walks the forest. The compiled module has the same API and the same error
messages; tests compare the two.
"""

from __future__ import annotations

from typing import Any, Sequence

from array import array

from streamrep.errors import StateCorruptionError

__all__ = ["MAX_NAMED_GROUPS", "expand_groups"]

#: How many offending groups an error message lists before summarising the rest.
MAX_NAMED_GROUPS = 10


_INT64_FORMATS = frozenset({"q", "l", "<q", "<l", "=q", "=l", "@q", "@l"})
_BYTE_FORMATS = frozenset({"B", "b", "c", "?", "<B", "=B", "@B"})


def _int64s(obj: Any, name: str) -> Sequence[int]:
    """View *obj* (any buffer of int64, or of raw bytes) as a sequence of ints."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{name} must support the buffer protocol, not {type(obj).__name__}")
    if view.format in _INT64_FORMATS and view.itemsize == 8:
        pass
    elif view.format in _BYTE_FORMATS and view.itemsize == 1:
        if view.nbytes % 8:
            raise ValueError(f"{name} holds {view.nbytes} bytes, not a whole number of int64s")
    else:
        raise TypeError(f"{name} must be a buffer of int64, not format {view.format!r}")
    if not view.c_contiguous:
        raise ValueError(f"{name} must be a contiguous buffer")
    return view.cast("B").cast("q")


def _bytes_flags(obj: Any, name: str) -> Sequence[int]:
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{name} must support the buffer protocol, not {type(obj).__name__}")
    if view.itemsize != 1 or view.format not in _BYTE_FORMATS:
        raise TypeError(f"{name} must be a buffer of uint8, not format {view.format!r}")
    if not view.c_contiguous:
        raise ValueError(f"{name} must be a contiguous buffer")
    return view.cast("B")


def _named(groups: Sequence[int]) -> str:
    shown = ", ".join(str(g) for g in groups[:MAX_NAMED_GROUPS])
    if len(groups) > MAX_NAMED_GROUPS:
        shown += f" and {len(groups) - MAX_NAMED_GROUPS} more"
    return shown


def _corruption(message: str, groups: Sequence[int], key: int | None = None) -> StateCorruptionError:
    exc = StateCorruptionError(message)
    exc.groups = tuple(groups)  # type: ignore[attr-defined]
    exc.key = key  # type: ignore[attr-defined]
    return exc


def expand_groups(
    group_ids: Any,
    prev_ids: Any,
    delta_offsets: Any,
    delta_keys: Any,
    delta_events: Any,
    wanted: Any = None,
) -> tuple[array[int], array[int], array[int]]:
    """Expand the full state of the wanted groups of a closed batch of state groups.

    ``group_ids`` and ``prev_ids`` are int64 buffers of length n; ``prev_ids[i]``
    is the parent of group i or -1 for a root, and every parent must be in the
    batch. ``delta_offsets`` (n+1 int64, CSR) delimits group i's own rows in
    ``delta_keys`` / ``delta_events`` (interned int64 IDs). ``wanted`` is a
    uint8 buffer of length n (None: every group).

    Returns ``(out_groups, out_keys, out_events)`` as ``array('q')``: for each
    wanted group in batch order, its full state sorted by key ID.

    Raises :class:`~streamrep.errors.StateCorruptionError` (with ``.groups``)
    for a group ID listed twice, a prev group missing from the batch, a cycle,
    or a key twice in one group's delta; :class:`ValueError`/:class:`TypeError`
    for buffers of the wrong shape.
    """
    groups = _int64s(group_ids, "group_ids")
    prevs = _int64s(prev_ids, "prev_ids")
    offsets = _int64s(delta_offsets, "delta_offsets")
    keys = _int64s(delta_keys, "delta_keys")
    events = _int64s(delta_events, "delta_events")
    want = _checked_shapes(groups, prevs, offsets, keys, events, wanted)
    parent = _parents(groups, prevs, _batch_index(groups))
    order = _topological_order(groups, parent)
    _check_deltas(groups, offsets, keys)
    results = _full_states(order, parent, want, offsets, keys, events)

    out_groups: array[int] = array("q")
    out_keys: array[int] = array("q")
    out_events: array[int] = array("q")
    for i in range(len(groups)):
        if want[i]:
            rows = results[i]
            out_groups.extend([groups[i]] * len(rows))
            out_keys.extend(k for k, _ in rows)
            out_events.extend(e for _, e in rows)
    return out_groups, out_keys, out_events


def _checked_shapes(
    groups: Sequence[int], prevs: Sequence[int], offsets: Sequence[int], keys: Sequence[int],
    events: Sequence[int], wanted: Any,
) -> Sequence[int]:
    """Check the buffers agree in length and the offsets are a CSR; the wanted flags."""
    n = len(groups)
    if len(prevs) != n:
        raise ValueError(f"prev_ids has {len(prevs)} entries for {n} groups")
    if len(offsets) != n + 1:
        raise ValueError(f"delta_offsets has {len(offsets)} entries, expected {n + 1}")
    if len(keys) != len(events):
        raise ValueError(f"delta_keys has {len(keys)} entries but delta_events {len(events)}")
    if wanted is None:
        want: Sequence[int] = b"\x01" * n
    else:
        want = _bytes_flags(wanted, "wanted")
        if len(want) != n:
            raise ValueError(f"wanted has {len(want)} entries for {n} groups")
    if offsets[0] != 0 or offsets[n] != len(keys):
        raise ValueError("delta_offsets must start at 0 and end at len(delta_keys)")
    for i in range(n):
        if offsets[i] > offsets[i + 1]:
            raise ValueError(f"delta_offsets decreases at group index {i}")
    return want


def _batch_index(groups: Sequence[int]) -> dict[int, int]:
    """Group ID -> batch index; a group listed twice cannot have one state."""
    index: dict[int, int] = {}
    duplicates = []
    for i, gid in enumerate(groups):
        if gid in index:
            duplicates.append(gid)
        else:
            index[gid] = i
    if duplicates:
        dup = sorted(set(duplicates))
        raise _corruption(f"state groups listed more than once: {_named(dup)}", dup)
    return index


def _parents(groups: Sequence[int], prevs: Sequence[int], index: dict[int, int]) -> list[int]:
    """Each group's prev as a batch index (-1: a root); every prev must be in the batch."""
    parent = [-1] * len(groups)
    missing = []
    for i in range(len(groups)):
        p = prevs[i]
        if p == -1:
            continue
        j = index.get(p)
        if j is None:
            missing.append(i)
        else:
            parent[i] = j
    if missing:
        named = [groups[i] for i in missing]
        pairs = ", ".join(f"{groups[i]} (prev {prevs[i]})" for i in missing[:MAX_NAMED_GROUPS])
        if len(missing) > MAX_NAMED_GROUPS:
            pairs += f" and {len(missing) - MAX_NAMED_GROUPS} more"
        raise _corruption(f"state groups whose prev group does not exist: {pairs}", named)
    return parent


def _topological_order(groups: Sequence[int], parent: list[int]) -> list[int]:
    """Breadth-first from the roots: a topological order. Groups it misses sit
    on or below a cycle of prev pointers, which is named."""
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i in range(n):
        if parent[i] == -1:
            roots.append(i)
        else:
            children[parent[i]].append(i)
    order = list(roots)
    seen = [False] * n
    for r in roots:
        seen[r] = True
    head = 0
    while head < len(order):
        v = order[head]
        head += 1
        for c in children[v]:
            seen[c] = True
            order.append(c)
    if len(order) < n:
        raise _cycle(groups, parent, next(i for i in range(n) if not seen[i]))
    return order


def _cycle(groups: Sequence[int], parent: list[int], start: int) -> StateCorruptionError:
    """The cycle reached by following prev pointers from *start*."""
    on_walk: dict[int, int] = {}
    v = start
    while v not in on_walk:
        on_walk[v] = len(on_walk)
        v = parent[v]
    cycle = [v]
    u = parent[v]
    while u != v:
        cycle.append(u)
        u = parent[u]
    named = [groups[c] for c in cycle]
    chain = " -> ".join(str(g) for g in named[:MAX_NAMED_GROUPS] + [named[0]])
    if len(named) > MAX_NAMED_GROUPS:
        chain = " -> ".join(str(g) for g in named[:MAX_NAMED_GROUPS]) + " -> ..."
    return _corruption(f"state groups form a cycle of prev groups: {chain}", named)


def _check_deltas(groups: Sequence[int], offsets: Sequence[int], keys: Sequence[int]) -> None:
    """A key twice in one group's delta is corrupt."""
    for i in range(len(groups)):
        delta_keys_i = sorted(keys[offsets[i]:offsets[i + 1]])
        for a, b in zip(delta_keys_i, delta_keys_i[1:]):
            if a == b:
                raise _corruption(
                    f"state group {groups[i]} has key {a} twice in its delta", [groups[i]], a
                )


def _full_states(
    order: list[int], parent: list[int], want: Sequence[int], offsets: Sequence[int],
    keys: Sequence[int], events: Sequence[int],
) -> dict[int, list[tuple[int, int]]]:
    """The sorted full state of each wanted group, built down the topological
    order over only the groups with a wanted group at or below them."""
    needed = [bool(want[i]) for i in range(len(parent))]
    for v in reversed(order):
        if needed[v] and parent[v] != -1:
            needed[parent[v]] = True

    states: dict[int, dict[int, int]] = {}
    results: dict[int, list[tuple[int, int]]] = {}
    for v in order:
        if not needed[v]:
            continue
        p = parent[v]
        state = dict(states[p]) if p != -1 else {}
        for k in range(offsets[v], offsets[v + 1]):
            state[keys[k]] = events[k]
        states[v] = state
        if want[v]:
            results[v] = sorted(state.items())
    return results
