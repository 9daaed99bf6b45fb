# cython: language_level=3
"""Expanding state-group deltas into full states (compiled core).

State groups form a forest: each group stores only its delta over its prev
group, and its full state is the deltas from the root down to it, later ones
overriding earlier ones per key. Keys and event IDs arrive interned as int64.

The walk visits each tree depth first and builds a group's sorted state by
merging its parent's sorted state with its own sorted delta, so no chain is
walked twice. A parent's buffer is freed as soon as its last needed child is
built, and the child with the largest subtree is built last: the live buffers
at any moment are those of the light edges on one root path (at most log2 n)
plus the current one, whatever the shape of the forest.

Same API and error messages as ``streamrep._pure.state``.
"""

from cpython cimport array
from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.stdlib cimport malloc, realloc, free, qsort
from libc.string cimport memcpy

import array as _pyarray

from streamrep.errors import StateCorruptionError

__all__ = ["MAX_NAMED_GROUPS", "expand_groups"]

MAX_NAMED_GROUPS = 10

cdef array.array _INT64_TEMPLATE = _pyarray.array("q")

_INT64_FORMATS = frozenset({"q", "l", "<q", "<l", "=q", "=l", "@q", "@l"})
_BYTE_FORMATS = frozenset({"B", "b", "c", "?", "<B", "=B", "@B"})


cdef struct IdIndex:
    int64_t gid
    int64_t index


cdef Py_ssize_t merge_sorted(const Entry* base, Py_ssize_t base_len,
                             const Entry* delta, Py_ssize_t delta_len,
                             Entry* out) noexcept nogil:
    """Merge two key-sorted states into *out* (room for base_len + delta_len
    entries); on equal keys the delta wins. Returns the merged length."""
    cdef Py_ssize_t x = 0, y = 0, n = 0
    while x < base_len and y < delta_len:
        if base[x].key < delta[y].key:
            out[n] = base[x]
            x += 1
        elif base[x].key > delta[y].key:
            out[n] = delta[y]
            y += 1
        else:
            out[n] = delta[y]
            x += 1
            y += 1
        n += 1
    while x < base_len:
        out[n] = base[x]
        x += 1
        n += 1
    while y < delta_len:
        out[n] = delta[y]
        y += 1
        n += 1
    return n


cdef int _cmp_entry(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const Entry*>a).key
    cdef int64_t y = (<const Entry*>b).key
    return (x > y) - (x < y)


cdef int _cmp_id_index(const void* a, const void* b) noexcept nogil:
    cdef const IdIndex* x = <const IdIndex*>a
    cdef const IdIndex* y = <const IdIndex*>b
    if x.gid != y.gid:
        return (x.gid > y.gid) - (x.gid < y.gid)
    return (x.index > y.index) - (x.index < y.index)


cdef const unsigned char[::1] _raw_int64s(object obj, str name):
    """The bytes of *obj*, checked to be a contiguous buffer of int64."""
    cdef object view
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
    return view.cast("B")


cdef const unsigned char[::1] raw_flags(object obj, str name):
    """The bytes of *obj*, checked to be a contiguous buffer of uint8."""
    cdef object view
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{name} must support the buffer protocol, not {type(obj).__name__}")
    if view.itemsize != 1 or view.format not in _BYTE_FORMATS:
        raise TypeError(f"{name} must be a buffer of uint8, not format {view.format!r}")
    if not view.c_contiguous:
        raise ValueError(f"{name} must be a contiguous buffer")
    return view.cast("B")


cdef class Int64s:
    """An aligned int64 view of a byte buffer (copied only if misaligned)."""

    def __cinit__(self, object obj, str name):
        self.raw = _raw_int64s(obj, name)
        self.length = self.raw.shape[0] // 8
        self.ptr = NULL
        if self.length:
            if (<size_t>&self.raw[0]) % 8:
                self.copy = bytes(self.raw)
                self.ptr = <const int64_t*><const char*>self.copy
            else:
                self.ptr = <const int64_t*>&self.raw[0]


cdef str _named(list groups):
    shown = ", ".join([str(g) for g in groups[:MAX_NAMED_GROUPS]])
    if len(groups) > MAX_NAMED_GROUPS:
        shown += f" and {len(groups) - MAX_NAMED_GROUPS} more"
    return shown


cdef object _corruption(str message, list groups, object key=None):
    exc = StateCorruptionError(message)
    exc.groups = tuple(groups)
    exc.key = key
    return exc


cdef class _Scratch:
    """One expand_groups call: its input's pointers and the C arrays it owns
    (freed however the call ends)."""
    cdef Py_ssize_t n
    cdef Py_ssize_t delta_rows
    cdef const int64_t* gids
    cdef const int64_t* prevs
    cdef const int64_t* offsets
    cdef const int64_t* keys
    cdef const int64_t* events
    cdef const uint8_t* want
    cdef IdIndex* by_id
    cdef int64_t* parent
    cdef int64_t* child_start
    cdef int64_t* child_list
    cdef int64_t* order
    cdef uint8_t* flag
    cdef int64_t* weight
    cdef int64_t* remaining
    cdef Entry* sorted_delta
    cdef Entry** state
    cdef int64_t* state_len
    cdef int64_t* stack
    cdef int64_t* out_start
    cdef Entry* out
    cdef Py_ssize_t out_len
    cdef Py_ssize_t out_cap

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.state != NULL:
            for i in range(self.n):
                free(self.state[i])
        free(self.by_id); free(self.parent); free(self.child_start); free(self.child_list)
        free(self.order); free(self.flag); free(self.weight); free(self.remaining)
        free(self.sorted_delta); free(self.state); free(self.state_len); free(self.stack)
        free(self.out_start); free(self.out)


cdef void* _alloc(size_t count, size_t size) except NULL:
    cdef void* p = malloc((count if count else 1) * size)
    if p == NULL:
        raise MemoryError()
    return p


cdef int _append_out(_Scratch s, const Entry* rows, Py_ssize_t count) except -1:
    cdef Py_ssize_t cap
    cdef Entry* grown
    if s.out_len + count > s.out_cap:
        cap = s.out_cap * 2 if s.out_cap else 1024
        while cap < s.out_len + count:
            cap *= 2
        grown = <Entry*>realloc(s.out, cap * sizeof(Entry))
        if grown == NULL:
            raise MemoryError()
        s.out = grown
        s.out_cap = cap
    if count:
        memcpy(s.out + s.out_len, rows, count * sizeof(Entry))
    s.out_len += count
    return 0


def expand_groups(group_ids, prev_ids, delta_offsets, delta_keys, delta_events, wanted=None):
    """Expand the full state of the wanted groups of a closed batch of state groups.

    ``group_ids`` and ``prev_ids`` are int64 buffers of length n; ``prev_ids[i]``
    is the parent of group i or -1 for a root, and every parent must be in the
    batch. ``delta_offsets`` (n+1 int64, CSR) delimits group i's own rows in
    ``delta_keys`` / ``delta_events`` (interned int64 IDs). ``wanted`` is a
    uint8 buffer of length n (None: every group). Read-only buffers (Arrow)
    are fine.

    Returns ``(out_groups, out_keys, out_events)`` as ``array('q')``: for each
    wanted group in batch order, its full state sorted by key ID.

    Raises :class:`~streamrep.errors.StateCorruptionError` (with ``.groups``)
    for a group ID listed twice, a prev group missing from the batch, a cycle,
    or a key twice in one group's delta; :class:`ValueError`/:class:`TypeError`
    for buffers of the wrong shape.
    """
    cdef Int64s groups = Int64s(group_ids, "group_ids")
    cdef Int64s prevs = Int64s(prev_ids, "prev_ids")
    cdef Int64s offsets = Int64s(delta_offsets, "delta_offsets")
    cdef Int64s keys = Int64s(delta_keys, "delta_keys")
    cdef Int64s events = Int64s(delta_events, "delta_events")
    cdef const unsigned char[::1] want_view
    cdef bytes all_wanted
    cdef Py_ssize_t n = groups.length
    cdef Py_ssize_t i, top
    cdef _Scratch s = _Scratch()

    if prevs.length != n:
        raise ValueError(f"prev_ids has {prevs.length} entries for {n} groups")
    if offsets.length != n + 1:
        raise ValueError(f"delta_offsets has {offsets.length} entries, expected {n + 1}")
    if keys.length != events.length:
        raise ValueError(f"delta_keys has {keys.length} entries but delta_events {events.length}")
    if wanted is None:
        all_wanted = b"\x01" * n
        s.want = <const uint8_t*><const char*>all_wanted
    else:
        want_view = raw_flags(wanted, "wanted")
        if want_view.shape[0] != n:
            raise ValueError(f"wanted has {want_view.shape[0]} entries for {n} groups")
        s.want = &want_view[0] if n else NULL
    if offsets.ptr[0] != 0 or offsets.ptr[n] != keys.length:
        raise ValueError("delta_offsets must start at 0 and end at len(delta_keys)")
    for i in range(n):
        if offsets.ptr[i] > offsets.ptr[i + 1]:
            raise ValueError(f"delta_offsets decreases at group index {i}")

    s.n = n
    s.delta_rows = keys.length
    s.gids = groups.ptr
    s.prevs = prevs.ptr
    s.offsets = offsets.ptr
    s.keys = keys.ptr
    s.events = events.ptr
    _allocate(s)
    _index_groups(s)
    _link_prevs(s)
    _order_topologically(s)
    _sort_deltas(s)
    with nogil:
        top = _weigh_subtrees(s)
    _walk_states(s, top)
    return _flatten(s)


cdef int _allocate(_Scratch s) except -1:
    cdef Py_ssize_t i, n = s.n
    s.by_id = <IdIndex*>_alloc(n, sizeof(IdIndex))
    s.parent = <int64_t*>_alloc(n, sizeof(int64_t))
    s.child_start = <int64_t*>_alloc(n + 1, sizeof(int64_t))
    s.child_list = <int64_t*>_alloc(n, sizeof(int64_t))
    s.order = <int64_t*>_alloc(n, sizeof(int64_t))
    s.flag = <uint8_t*>_alloc(n, sizeof(uint8_t))
    s.weight = <int64_t*>_alloc(n, sizeof(int64_t))
    s.remaining = <int64_t*>_alloc(n, sizeof(int64_t))
    s.sorted_delta = <Entry*>_alloc(s.delta_rows, sizeof(Entry))
    s.state = <Entry**>_alloc(n, sizeof(Entry*))
    s.state_len = <int64_t*>_alloc(n, sizeof(int64_t))
    s.stack = <int64_t*>_alloc(n, sizeof(int64_t))
    s.out_start = <int64_t*>_alloc(n, sizeof(int64_t))
    for i in range(n):
        s.state[i] = NULL
    return 0


cdef int _index_groups(_Scratch s) except -1:
    """The group IDs sorted with their batch index (``by_id``); a group listed
    twice cannot have one state."""
    cdef Py_ssize_t i, n = s.n
    with nogil:
        for i in range(n):
            s.by_id[i].gid = s.gids[i]
            s.by_id[i].index = i
        qsort(s.by_id, n, sizeof(IdIndex), _cmp_id_index)
    dup = []
    for i in range(1, n):
        if s.by_id[i].gid == s.by_id[i - 1].gid and (not dup or dup[-1] != s.by_id[i].gid):
            dup.append(s.by_id[i].gid)
    if dup:
        raise _corruption(f"state groups listed more than once: {_named(dup)}", dup)
    return 0


cdef int _link_prevs(_Scratch s) except -1:
    """Each prev group ID as a batch index, by binary search on the sorted IDs;
    every prev must be in the batch."""
    cdef Py_ssize_t i, lo, hi, mid, n = s.n
    cdef int64_t gid
    missing = []
    for i in range(n):
        gid = s.prevs[i]
        s.parent[i] = -1
        if gid == -1:
            continue
        lo = 0
        hi = n
        while lo < hi:
            mid = (lo + hi) >> 1
            if s.by_id[mid].gid < gid:
                lo = mid + 1
            else:
                hi = mid
        if lo < n and s.by_id[lo].gid == gid:
            s.parent[i] = s.by_id[lo].index
        else:
            missing.append(i)
    if missing:
        named = [s.gids[i] for i in missing]
        pairs = ", ".join([f"{s.gids[i]} (prev {s.prevs[i]})" for i in missing[:MAX_NAMED_GROUPS]])
        if len(missing) > MAX_NAMED_GROUPS:
            pairs += f" and {len(missing) - MAX_NAMED_GROUPS} more"
        raise _corruption(f"state groups whose prev group does not exist: {pairs}", named)
    return 0


cdef int _order_topologically(_Scratch s) except -1:
    """Children in CSR form, in batch order; then a breadth-first order from the
    roots, which is topological. Groups it misses sit on or below a cycle."""
    cdef Py_ssize_t tail
    with nogil:
        _list_children(s)
        tail = _breadth_first(s)
    if tail < s.n:
        raise _cycle(s)
    return 0


cdef void _list_children(_Scratch s) noexcept nogil:
    cdef Py_ssize_t i, p, n = s.n
    for i in range(n + 1):
        s.child_start[i] = 0
    for i in range(n):
        if s.parent[i] != -1:
            s.child_start[s.parent[i] + 1] += 1
    for i in range(n):
        s.child_start[i + 1] += s.child_start[i]
    for i in range(n):
        s.weight[i] = s.child_start[i]  # fill cursor
    for i in range(n):
        p = s.parent[i]
        if p != -1:
            s.child_list[s.weight[p]] = i
            s.weight[p] += 1


cdef Py_ssize_t _breadth_first(_Scratch s) noexcept nogil:
    """Fill ``order`` from the roots, flagging each group reached; how many."""
    cdef Py_ssize_t i, j, v, c, head = 0, tail = 0, n = s.n
    for i in range(n):
        s.flag[i] = 0
        if s.parent[i] == -1:
            s.order[tail] = i
            s.flag[i] = 1
            tail += 1
    while head < tail:
        v = s.order[head]
        head += 1
        for j in range(s.child_start[v], s.child_start[v + 1]):
            c = s.child_list[j]
            s.flag[c] = 1
            s.order[tail] = c
            tail += 1
    return tail


cdef object _cycle(_Scratch s):
    """The cycle reached by following prev pointers from the first unreached
    group (flag 2 marks the walk)."""
    cdef Py_ssize_t i = 0, v, c
    while s.flag[i]:
        i += 1
    v = i
    while s.flag[v] != 2:
        s.flag[v] = 2
        v = s.parent[v]
    cycle = [s.gids[v]]
    c = s.parent[v]
    while c != v:
        cycle.append(s.gids[c])
        c = s.parent[c]
    if len(cycle) > MAX_NAMED_GROUPS:
        chain = " -> ".join([str(g) for g in cycle[:MAX_NAMED_GROUPS]]) + " -> ..."
    else:
        chain = " -> ".join([str(g) for g in cycle + [cycle[0]]])
    return _corruption(f"state groups form a cycle of prev groups: {chain}", cycle)


cdef int _sort_deltas(_Scratch s) except -1:
    """Each group's delta sorted by key; a key twice in one delta is corrupt."""
    cdef Py_ssize_t i, x, bad = -1
    cdef int64_t d_lo, d_hi, a
    cdef const int64_t* offsets = s.offsets
    with nogil:
        for i in range(s.delta_rows):
            s.sorted_delta[i].key = s.keys[i]
            s.sorted_delta[i].event = s.events[i]
        for i in range(s.n):
            d_lo = offsets[i]
            d_hi = offsets[i + 1]
            if d_hi - d_lo > 1:
                qsort(s.sorted_delta + d_lo, d_hi - d_lo, sizeof(Entry), _cmp_entry)
                for x in range(d_lo + 1, d_hi):
                    if s.sorted_delta[x].key == s.sorted_delta[x - 1].key:
                        bad = i
                        break
                if bad != -1:
                    break
    if bad != -1:
        a = -1
        for x in range(offsets[bad] + 1, offsets[bad + 1]):
            if s.sorted_delta[x].key == s.sorted_delta[x - 1].key:
                a = s.sorted_delta[x].key
                break
        raise _corruption(
            f"state group {s.gids[bad]} has key {a} twice in its delta", [s.gids[bad]], a
        )
    return 0


cdef Py_ssize_t _weigh_subtrees(_Scratch s) noexcept nogil:
    """``weight[v]``: needed groups at or below v, where a group is needed if it
    is wanted or has a wanted descendant (0: skip the subtree); ``remaining[v]``:
    needed children not built yet. Pushes the needed roots; the stack's height."""
    cdef Py_ssize_t i, j, v, p, top = 0, n = s.n
    cdef const uint8_t* want = s.want
    for i in range(n):
        s.weight[i] = 0
    for j in range(n - 1, -1, -1):
        v = s.order[j]
        if want[v] or s.weight[v]:
            s.weight[v] += 1
            p = s.parent[v]
            if p != -1:
                s.weight[p] += s.weight[v]
    for v in range(n):
        s.remaining[v] = 0
        for j in range(s.child_start[v], s.child_start[v + 1]):
            if s.weight[s.child_list[j]]:
                s.remaining[v] += 1
    for i in range(n - 1, -1, -1):
        if s.parent[i] == -1 and s.weight[i]:
            s.stack[top] = i
            top += 1
    return top


cdef int _walk_states(_Scratch s, Py_ssize_t top) except -1:
    """Depth-first from the stacked roots, each group's sorted state merged from
    its parent's and its own sorted delta; a parent's buffer is freed once its
    last needed child is built. The heaviest child is pushed first so it is
    popped last, when its parent's buffer is about to be freed."""
    cdef Py_ssize_t v, p, plen, dlen, rlen
    cdef Entry* base
    cdef Entry* result
    cdef const int64_t* offsets = s.offsets
    cdef const uint8_t* want = s.want
    s.out_len = 0
    while top > 0:
        top -= 1
        v = s.stack[top]
        p = s.parent[v]
        if p == -1:
            base = NULL
            plen = 0
        else:
            base = s.state[p]
            plen = s.state_len[p]
        dlen = offsets[v + 1] - offsets[v]
        result = <Entry*>_alloc(plen + dlen, sizeof(Entry))
        rlen = merge_sorted(base, plen, s.sorted_delta + offsets[v], dlen, result)
        if p != -1:
            s.remaining[p] -= 1
            if s.remaining[p] == 0:
                free(s.state[p])
                s.state[p] = NULL
        if want[v]:
            s.out_start[v] = s.out_len
            _append_out(s, result, rlen)
        s.state_len[v] = rlen
        if s.remaining[v] == 0:
            free(result)
            continue
        s.state[v] = result
        top = _push_children(s, v, top)
    return 0


cdef Py_ssize_t _push_children(_Scratch s, Py_ssize_t v, Py_ssize_t top) noexcept nogil:
    """Push v's needed children, the heaviest first; the stack's new height."""
    cdef Py_ssize_t j, c, heavy = -1
    for j in range(s.child_start[v], s.child_start[v + 1]):
        c = s.child_list[j]
        if s.weight[c] and (heavy == -1 or s.weight[c] > s.weight[heavy]):
            heavy = c
    s.stack[top] = heavy
    top += 1
    for j in range(s.child_start[v + 1] - 1, s.child_start[v] - 1, -1):
        c = s.child_list[j]
        if s.weight[c] and c != heavy:
            s.stack[top] = c
            top += 1
    return top


cdef tuple _flatten(_Scratch s):
    """``(out_groups, out_keys, out_events)``: each wanted group's state in batch order."""
    cdef Py_ssize_t i, x, total = 0, pos = 0, n = s.n
    cdef int64_t gid
    cdef Entry* rows
    for i in range(n):
        if s.want[i]:
            total += s.state_len[i]
    cdef array.array out_groups = array.clone(_INT64_TEMPLATE, total, zero=False)
    cdef array.array out_keys = array.clone(_INT64_TEMPLATE, total, zero=False)
    cdef array.array out_events = array.clone(_INT64_TEMPLATE, total, zero=False)
    cdef int64_t* og = <int64_t*>out_groups.data.as_longlongs
    cdef int64_t* ok = <int64_t*>out_keys.data.as_longlongs
    cdef int64_t* oe = <int64_t*>out_events.data.as_longlongs
    with nogil:
        for i in range(n):
            if not s.want[i]:
                continue
            rows = s.out + s.out_start[i]
            gid = s.gids[i]
            for x in range(s.state_len[i]):
                og[pos] = gid
                ok[pos] = rows[x].key
                oe[pos] = rows[x].event
                pos += 1
    return out_groups, out_keys, out_events
