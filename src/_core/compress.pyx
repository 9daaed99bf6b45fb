# cython: language_level=3
"""Choosing shorter state deltas under a hop bound (compiled core).

Same plan, API and error messages as ``streamrep._pure.compress`` (read its
docstring for the two passes: links, then levels). Here every per-group array
is a C array and the state comparisons are merges over the sorted full states,
without the GIL.
"""

from cpython cimport array
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy

import array as _pyarray

from streamrep._core.state cimport Int64s, raw_flags

__all__ = ["DEFAULT_MAX_DEPTH", "DEFAULT_CANDIDATES", "plan_compression", "level_radices"]

DEFAULT_MAX_DEPTH = 100
DEFAULT_CANDIDATES = 16

cdef array.array _INT64_TEMPLATE = _pyarray.array("q")


def level_radices(height, max_depth):
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
    found = [[max_depth + 1]]
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


def _reach(radices):
    product = 1
    for s in radices:
        product *= s
    return product


cdef int64_t _step(int64_t depth, const int64_t* radices, Py_ssize_t m) noexcept nogil:
    cdef int64_t place = 1
    cdef Py_ssize_t k
    for k in range(m):
        if depth % radices[k]:
            return place
        depth //= radices[k]
        place *= radices[k]
    return 0


cdef int64_t _digit_sum(int64_t depth, const int64_t* radices, Py_ssize_t m) noexcept nogil:
    cdef int64_t total = 0
    cdef Py_ssize_t k
    for k in range(m):
        total += depth % radices[k]
        depth //= radices[k]
    return total


cdef int64_t _diff(const int64_t* keys, const int64_t* events, int64_t a_lo, int64_t a_hi,
                   int64_t b_lo, int64_t b_hi) noexcept nogil:
    """Rows group A needs over group B, or -1 when B has a key A lacks."""
    cdef int64_t x = a_lo, y = b_lo, rows = 0
    while x < a_hi and y < b_hi:
        if keys[x] < keys[y]:
            rows += 1
            x += 1
        elif keys[x] > keys[y]:
            return -1
        else:
            if events[x] != events[y]:
                rows += 1
            x += 1
            y += 1
    if y < b_hi:
        return -1
    return rows + (a_hi - x)


cdef class _Scratch:
    """One plan_compression call: its input's pointers and the C arrays it owns
    (freed however the call ends)."""
    cdef Py_ssize_t n
    cdef const int64_t* parent
    cdef const int64_t* room
    cdef const uint8_t* keep
    cdef const int64_t* offsets
    cdef const int64_t* keys
    cdef const int64_t* events
    cdef int64_t* tree_root
    cdef int64_t* link
    cdef int64_t* depth
    cdef int64_t* top
    cdef int64_t* height
    cdef int64_t* new_parent
    cdef int64_t* new_depth
    cdef int64_t* path
    cdef int64_t* members
    cdef int64_t* member_start
    cdef int64_t* radices
    cdef int64_t* out_offsets
    cdef int64_t* out_keys
    cdef int64_t* out_events

    def __dealloc__(self):
        free(self.tree_root); free(self.link); free(self.depth); free(self.top)
        free(self.height); free(self.new_parent); free(self.new_depth); free(self.path)
        free(self.members); free(self.member_start); free(self.radices)
        free(self.out_offsets); free(self.out_keys); free(self.out_events)


cdef int64_t* _alloc(Py_ssize_t count) except NULL:
    cdef void* p = malloc((count if count > 0 else 1) * sizeof(int64_t))
    if p == NULL:
        raise MemoryError()
    return <int64_t*>p


cdef Py_ssize_t _load_radices(_Scratch s, list radices) except -1:
    """Put *radices* into ``s.radices`` (replacing what it held); their count."""
    cdef Py_ssize_t k, m = len(radices)
    free(s.radices)
    s.radices = NULL
    s.radices = _alloc(m)
    for k in range(m):
        s.radices[k] = radices[k]
    return m


cdef array.array _to_array(const int64_t* data, Py_ssize_t count):
    cdef array.array out = array.clone(_INT64_TEMPLATE, count, zero=False)
    if count:
        memcpy(out.data.as_voidptr, data, count * sizeof(int64_t))
    return out


def plan_compression(parents, rooms, full_offsets, full_keys, full_events, fixed=None,
                     max_depth=DEFAULT_MAX_DEPTH, candidates=DEFAULT_CANDIDATES):
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
    cdef Int64s parent_buf = Int64s(parents, "parents")
    cdef Int64s room_buf = Int64s(rooms, "rooms")
    cdef Int64s offset_buf = Int64s(full_offsets, "full_offsets")
    cdef Int64s key_buf = Int64s(full_keys, "full_keys")
    cdef Int64s event_buf = Int64s(full_events, "full_events")
    cdef Py_ssize_t n = parent_buf.length
    cdef const unsigned char[::1] fixed_view
    cdef bytes no_fixed
    cdef _Scratch s = _Scratch()
    cdef int64_t bound = max_depth
    cdef int64_t look = candidates
    cdef Py_ssize_t used

    if room_buf.length != n:
        raise ValueError(f"rooms has {room_buf.length} entries for {n} groups")
    if offset_buf.length != n + 1:
        raise ValueError(f"full_offsets has {offset_buf.length} entries, expected {n + 1}")
    if key_buf.length != event_buf.length:
        raise ValueError(f"full_keys has {key_buf.length} entries but full_events {event_buf.length}")
    if n and (offset_buf.ptr[0] != 0 or offset_buf.ptr[n] != key_buf.length):
        raise ValueError("full_offsets must start at 0 and end at len(full_keys)")
    if fixed is None:
        no_fixed = bytes(n if n else 1)
        s.keep = <const uint8_t*><const char*>no_fixed
    else:
        fixed_view = raw_flags(fixed, "fixed")
        if fixed_view.shape[0] != n:
            raise ValueError(f"fixed has {fixed_view.shape[0]} entries for {n} groups")
        s.keep = <const uint8_t*>&fixed_view[0] if n else <const uint8_t*>b"\0"
    s.n = n
    s.parent = parent_buf.ptr
    s.room = room_buf.ptr
    s.offsets = offset_buf.ptr
    s.keys = key_buf.ptr
    s.events = event_buf.ptr
    _check_groups(s)

    _tree_roots(s)
    with nogil:
        _links(s, look)
        _linked_depths(s)
    _levels(s, bound)
    used = _deltas(s, key_buf.length)
    return (
        _to_array(s.new_parent, n),
        _to_array(s.new_depth, n),
        _to_array(s.out_offsets, n + 1),
        _to_array(s.out_keys, used),
        _to_array(s.out_events, used),
    )


cdef int _check_groups(_Scratch s) except -1:
    """Each prev is a batch index, each fixed group a root, the offsets a CSR."""
    cdef Py_ssize_t i
    cdef int64_t p
    for i in range(s.n):
        p = s.parent[i]
        if p < -1 or p >= s.n:
            raise ValueError(f"parents[{i}] = {p} is not a batch index")
        if s.keep[i] and p != -1:
            raise ValueError(f"group index {i} is fixed but not a root")
        if s.offsets[i] > s.offsets[i + 1]:
            raise ValueError(f"full_offsets decreases at group index {i}")
    return 0


cdef int _tree_roots(_Scratch s) except -1:
    """The original tree root of every group; allocates the per-group arrays."""
    cdef Py_ssize_t n = s.n, i, k, v, plen
    cdef int64_t r
    cdef const int64_t* parent = s.parent
    s.tree_root = _alloc(n)
    s.link = _alloc(n)
    s.depth = _alloc(n)
    s.top = _alloc(n)
    s.height = _alloc(n)
    s.new_parent = _alloc(n)
    s.new_depth = _alloc(n)
    s.path = _alloc(n + 1)
    for i in range(n):
        s.tree_root[i] = -1
        s.depth[i] = -1
        s.height[i] = -1
    for i in range(n):
        plen = 0
        v = i
        while s.tree_root[v] == -1 and parent[v] != -1:
            if plen >= n:
                raise ValueError("parents form a cycle")
            s.path[plen] = v
            plen += 1
            v = parent[v]
        r = v if s.tree_root[v] == -1 else s.tree_root[v]
        s.tree_root[v] = r
        for k in range(plen):
            s.tree_root[s.path[k]] = r
    return 0


cdef void _links(_Scratch s, int64_t look) noexcept nogil:
    """Pass 1: a root takes as prev the earlier group of its room (of a tree that
    started before it) that leaves the smallest delta, if smaller than its own."""
    cdef Py_ssize_t n = s.n, i, j, looked, best
    cdef int64_t best_rows, rows
    cdef const int64_t* parent = s.parent
    cdef const int64_t* room = s.room
    cdef const uint8_t* keep = s.keep
    cdef const int64_t* offsets = s.offsets
    cdef const int64_t* keys = s.keys
    cdef const int64_t* events = s.events
    for i in range(n):
        s.link[i] = parent[i]
        if parent[i] != -1 or keep[i] or look == 0:
            continue
        best = -1
        best_rows = offsets[i + 1] - offsets[i]
        j = i - 1
        looked = 0
        while j >= 0 and room[j] == room[i] and looked < look:
            if s.tree_root[j] < i:
                looked += 1
                rows = _diff(keys, events, offsets[i], offsets[i + 1], offsets[j], offsets[j + 1])
                if 0 <= rows < best_rows:
                    best = j
                    best_rows = rows
            j -= 1
        s.link[i] = best


cdef void _linked_depths(_Scratch s) noexcept nogil:
    """Depth in the linked forest, its roots and their heights; the new prevs
    and depths start as the links."""
    cdef Py_ssize_t n = s.n, i, k, v, plen
    cdef int64_t d, t
    for i in range(n):
        plen = 0
        v = i
        while s.depth[v] == -1 and s.link[v] != -1:
            s.path[plen] = v
            plen += 1
            v = s.link[v]
        if s.depth[v] == -1:
            s.depth[v] = 0
            s.top[v] = v
        d = s.depth[v]
        t = s.top[v]
        for k in range(plen - 1, -1, -1):
            d += 1
            s.depth[s.path[k]] = d
            s.top[s.path[k]] = t
    for i in range(n):
        if s.depth[i] > s.height[s.top[i]]:
            s.height[s.top[i]] = s.depth[i]
    for i in range(n):
        s.new_parent[i] = s.link[i]
        s.new_depth[i] = s.depth[i]


cdef int _list_deep_members(_Scratch s, int64_t bound) except -1:
    """Members of each linked tree deeper than *bound*, listed contiguously
    (counting sort by tree): ``members[member_start[t]:member_start[t + 1]]``."""
    cdef Py_ssize_t n = s.n, i
    cdef int64_t t
    s.member_start = _alloc(n + 1)
    s.members = _alloc(n)
    with nogil:
        for i in range(n + 1):
            s.member_start[i] = 0
        for i in range(n):
            if s.height[s.top[i]] > bound:
                s.member_start[s.top[i] + 1] += 1
        for i in range(n):
            s.member_start[i + 1] += s.member_start[i]
        for i in range(n):
            s.path[i] = s.member_start[i]
        for i in range(n):
            if s.height[s.top[i]] > bound:
                t = s.top[i]
                s.members[s.path[t]] = i
                s.path[t] += 1
    return 0


cdef int _levels(_Scratch s, int64_t bound) except -1:
    """Pass 2: each linked tree deeper than *bound* re-hung by the cheapest of
    its radix choices (the first of equal ones)."""
    cdef Py_ssize_t t, m, start, stop
    cdef int64_t cost, best_cost
    cdef bint have_best
    _list_deep_members(s, bound)
    for t in range(s.n):
        if s.height[t] <= bound or s.top[t] != t:
            continue
        start = s.member_start[t]
        stop = s.member_start[t + 1]
        best_cost = 0
        chosen = None
        have_best = False
        for radix_list in level_radices(s.height[t], bound):
            m = _load_radices(s, radix_list)
            with nogil:
                cost = _radix_cost(s, start, stop, m, have_best, best_cost)
            if not have_best or cost < best_cost:
                have_best = True
                best_cost = cost
                chosen = radix_list
        m = _load_radices(s, chosen)
        with nogil:
            _rehang(s, start, stop, m)
    return 0


cdef int64_t _radix_cost(_Scratch s, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t m,
                         bint have_best, int64_t best_cost) noexcept nogil:
    """Rows the members ``start:stop`` re-hung by ``s.radices`` add over keeping
    their linked prev; stops early once it reaches *best_cost* (if *have_best*)."""
    cdef Py_ssize_t k, i, hop
    cdef int64_t cost = 0, step, p, a
    cdef const int64_t* offsets = s.offsets
    cdef const int64_t* keys = s.keys
    cdef const int64_t* events = s.events
    for k in range(start, stop):
        i = s.members[k]
        if s.depth[i] == 0:
            continue
        step = _step(s.depth[i], s.radices, m)
        if step == 1:
            continue
        p = s.link[i]
        cost -= _diff(keys, events, offsets[i], offsets[i + 1], offsets[p], offsets[p + 1])
        if step == 0:
            cost += offsets[i + 1] - offsets[i]
        else:
            a = i
            for hop in range(step):
                a = s.link[a]
            cost += _diff(keys, events, offsets[i], offsets[i + 1], offsets[a], offsets[a + 1])
        if have_best and cost >= best_cost:
            break
    return cost


cdef void _rehang(_Scratch s, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t m) noexcept nogil:
    """The new prev and depth of the members ``start:stop`` under ``s.radices``."""
    cdef Py_ssize_t k, i, hop
    cdef int64_t step, a
    for k in range(start, stop):
        i = s.members[k]
        if s.depth[i] == 0:
            continue
        step = _step(s.depth[i], s.radices, m)
        a = i if step else -1
        for hop in range(step):
            a = s.link[a]
        s.new_parent[i] = a
        s.new_depth[i] = _digit_sum(s.depth[i], s.radices, m)


cdef Py_ssize_t _deltas(_Scratch s, Py_ssize_t full_rows) except -1:
    """Each group's delta over its new prev (CSR, sorted by key): the rows of its
    full state its prev does not hold as they are. Returns the rows written."""
    cdef Py_ssize_t n = s.n, i, used = 0
    cdef int64_t p, x, y, y_hi, lo, hi
    cdef const int64_t* offsets = s.offsets
    cdef const int64_t* keys = s.keys
    cdef const int64_t* events = s.events
    cdef int64_t* out_keys
    cdef int64_t* out_events
    s.out_offsets = _alloc(n + 1)
    # A delta is never longer than the full state, so full_rows always holds them.
    s.out_keys = out_keys = _alloc(full_rows)
    s.out_events = out_events = _alloc(full_rows)
    s.out_offsets[0] = 0
    with nogil:
        for i in range(n):
            p = s.new_parent[i]
            lo = offsets[i]
            hi = offsets[i + 1]
            if p == -1:
                for x in range(lo, hi):
                    out_keys[used] = keys[x]
                    out_events[used] = events[x]
                    used += 1
            else:
                y = offsets[p]
                y_hi = offsets[p + 1]
                for x in range(lo, hi):
                    while y < y_hi and keys[y] < keys[x]:
                        y += 1
                    if y < y_hi and keys[y] == keys[x] and events[y] == events[x]:
                        continue
                    out_keys[used] = keys[x]
                    out_events[used] = events[x]
                    used += 1
            s.out_offsets[i + 1] = used
    return used
