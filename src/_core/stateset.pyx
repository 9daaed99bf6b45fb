# cython: language_level=3
"""Splitting state sets into conflicted keys and the unconflicted state (compiled core).

Same API and results as :mod:`streamrep._pure.stateset`; see there for the
definitions. Each set is walked alongside the first one in insertion order: while
both yield the same key at the same step, one comparison of the values decides that
entry (sets copied from one another and then changed stay aligned); the same event
object at the same step is the same entry, since an event ID names one key. From the
first step where the orders part, the set's remaining entries are looked up in the
first set instead.
"""

from cpython.array cimport array, clone, resize
from cpython.dict cimport PyDict_Next
from cpython.object cimport Py_EQ, PyObject_RichCompareBool
from cpython.ref cimport PyObject, Py_XDECREF, Py_XINCREF
from libc.stdint cimport int64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memset

__all__ = ["NumberMemo", "differing_events", "split_state_sets"]

cdef array _Q_TEMPLATE = array("q")


cdef inline bint _same(object a, object b) except -1:
    return a is b or PyObject_RichCompareBool(a, b, Py_EQ)


cdef class NumberMemo:
    """The first set's event IDs and their numbers from the previous split, by
    position. The IDs are held, so the same object at a position has that number
    (an event's number never changes). They are held in a C array: strings make no
    reference cycles, and the garbage collector need not visit one per event."""

    cdef PyObject** values
    cdef int64_t* numbers
    cdef Py_ssize_t size

    def __cinit__(self):
        self.values = NULL
        self.numbers = NULL
        self.size = 0

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.values != NULL:
            for i in range(self.size):
                Py_XDECREF(self.values[i])
            free(self.values)
        free(self.numbers)

    cdef int reserve(self, Py_ssize_t size) except -1:
        """Room for *size* positions (new ones hold nothing)."""
        cdef Py_ssize_t i
        cdef PyObject** values
        cdef int64_t* numbers
        if size <= self.size:
            return 0
        values = <PyObject**>realloc(self.values, size * sizeof(PyObject*))
        if values == NULL:
            raise MemoryError()
        self.values = values
        numbers = <int64_t*>realloc(self.numbers, size * sizeof(int64_t))
        if numbers == NULL:
            raise MemoryError()
        self.numbers = numbers
        for i in range(self.size, size):
            self.values[i] = NULL
            self.numbers[i] = -1
        self.size = size
        return 0

    cdef inline void remember(self, Py_ssize_t i, PyObject* value, int64_t number):
        Py_XINCREF(value)
        Py_XDECREF(self.values[i])
        self.values[i] = value
        self.numbers[i] = number


ctypedef struct _Differences:
    # What one set maps to another event than the first set, at positions where the
    # two walk aligned (ascending), as new references; and where the alignment ends.
    Py_ssize_t stop
    Py_ssize_t count
    Py_ssize_t cap
    Py_ssize_t cursor
    Py_ssize_t* positions
    PyObject** values


cdef int _record(_Differences* d, Py_ssize_t position, PyObject* value) except -1:
    cdef Py_ssize_t cap
    if d.count == d.cap:
        cap = d.cap * 2 + 16
        d.positions = <Py_ssize_t*>_grown(d.positions, cap * sizeof(Py_ssize_t))
        d.values = <PyObject**>_grown(d.values, cap * sizeof(PyObject*))
        d.cap = cap
    Py_XINCREF(value)
    d.positions[d.count] = position
    d.values[d.count] = value
    d.count += 1
    return 0


cdef void* _grown(void* block, size_t size) except NULL:
    cdef void* grown = realloc(block, size)
    if grown == NULL:
        raise MemoryError()
    return grown


cdef void _release(_Differences* d, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i, k
    if d == NULL:
        return
    for i in range(n):
        for k in range(d[i].count):
            Py_XDECREF(d[i].values[k])
        free(d[i].positions)
        free(d[i].values)
    free(d)


cdef int _compare(dict base, dict state, Py_ssize_t n_base, unsigned char* flags,
                  set extra, _Differences* record, Py_ssize_t* entries) except -1:
    """Flag the first set's positions that *state* maps to another event or lacks, and
    add to *extra* the keys found off the aligned walk that differ. With *record*,
    keep there the other events at the flagged aligned positions and where the
    alignment ends (positions before it carry the first set's keys, in its order);
    with *entries*, the first set's entry (``PyDict_Next``'s cursor) at each flagged
    position, so that its flagged entries are read again without a walk."""
    cdef Py_ssize_t pb = 0, ps = 0, i = 0, matched = 0, at
    cdef PyObject* bk_p
    cdef PyObject* bv_p
    cdef PyObject* k_p
    cdef PyObject* v_p
    cdef bint aligned = True
    while PyDict_Next(state, &ps, &k_p, &v_p):
        if aligned:
            # Pointers first: touching the objects costs a cache miss each.
            at = pb
            if PyDict_Next(base, &pb, &bk_p, &bv_p) and (
                    bv_p == v_p or bk_p == k_p or _same(<object>bk_p, <object>k_p)):
                matched += 1
                if bv_p != v_p and not _same(<object>bv_p, <object>v_p):
                    flags[i] = 1
                    if entries != NULL:
                        entries[i] = at
                    if record != NULL:
                        _record(record, i, v_p)
                i += 1
                continue
            aligned = False
        key = <object>k_p
        held = base.get(key, _MISSING)
        if held is _MISSING:
            extra.add(key)
            continue
        matched += 1
        if not _same(held, <object>v_p):
            extra.add(key)
    if record != NULL:
        record.stop = i
    if matched < n_base:
        # Keys of the first set this one lacks.
        pb = 0
        i = 0
        at = 0
        while PyDict_Next(base, &pb, &bk_p, &bv_p):
            if not flags[i] and <object>bk_p not in state:
                flags[i] = 1
                if entries != NULL:
                    entries[i] = at
            i += 1
            at = pb
    return 0


cdef unsigned char* _flags(Py_ssize_t n) except NULL:
    cdef unsigned char* flags = <unsigned char*>malloc(n + 1)
    if flags == NULL:
        raise MemoryError()
    memset(flags, 0, n + 1)
    return flags


def split_state_sets(states, numbers, NumberMemo memo=None):
    """``(differing keys, numbers of unconflicted events, unconflicted events without
    a number)`` of *states* (see the pure twin); *numbers* None: the differing keys
    alone."""
    cdef list sets = [s if type(s) is dict else dict(s) for s in states]
    cdef dict base, state
    cdef object index = None
    cdef set differing = set(), extra = set()
    cdef Py_ssize_t n_base, i, pb, n_common = 0
    cdef PyObject* bk_p
    cdef PyObject* bv_p
    cdef unsigned char* flags
    cdef array common
    cdef list unknown = []
    if not sets:
        return differing, clone(_Q_TEMPLATE, 0, False), unknown
    base = sets[0]
    if numbers is not None:
        index = numbers if type(numbers) is dict else dict(numbers)
    n_base = len(base)
    flags = _flags(n_base)
    try:
        for state in sets[1:]:
            if state is not base:
                _compare(base, state, n_base, flags, extra, NULL, NULL)
        common = clone(_Q_TEMPLATE, n_base, False)
        if memo is None:
            memo = NumberMemo()
        if index is not None:
            memo.reserve(n_base)
        pb = 0
        i = 0
        while PyDict_Next(base, &pb, &bk_p, &bv_p):
            if flags[i] or (extra and <object>bk_p in extra):
                differing.add(<object>bk_p)
            elif index is None:
                pass
            elif memo.values[i] == bv_p and memo.numbers[i] >= 0:
                common.data.as_longlongs[n_common] = memo.numbers[i]
                n_common += 1
            else:
                number = (<dict>index).get(<object>bv_p)
                if number is None:
                    unknown.append(<object>bv_p)
                else:
                    common.data.as_longlongs[n_common] = <int64_t>number
                    n_common += 1
                    memo.remember(i, bv_p, <int64_t>number)
            i += 1
        resize(common, n_common)
        differing |= extra
        return differing, common, unknown
    finally:
        free(flags)


def differing_events(states):
    """``(differing keys, per set the events it maps them to)`` of *states* (see the
    pure twin). A set walked aligned with the first is read at the flagged positions
    from what the comparison kept, without a lookup."""
    cdef list sets = [s if type(s) is dict else dict(s) for s in states]
    cdef Py_ssize_t n_sets = len(sets), n_base, i, j, pb
    cdef Py_ssize_t* entries = NULL
    cdef dict base
    cdef set differing = set(), extra = set()
    cdef list per_set
    cdef PyObject* bk_p
    cdef PyObject* bv_p
    cdef _Differences* d
    cdef _Differences* diffs
    cdef unsigned char* flags
    if not sets:
        return differing, []
    base = sets[0]
    n_base = len(base)
    per_set = [set() for _ in range(n_sets)]
    flags = _flags(n_base)
    diffs = <_Differences*>calloc(n_sets, sizeof(_Differences))
    try:
        entries = <Py_ssize_t*>malloc((n_base + 1) * sizeof(Py_ssize_t))
        if diffs == NULL or entries == NULL:
            raise MemoryError()
        diffs[0].stop = n_base
        for j in range(1, n_sets):
            if sets[j] is base:
                diffs[j].stop = n_base
            else:
                _compare(base, sets[j], n_base, flags, extra, &diffs[j], entries)
        for i in range(n_base):
            pb = entries[i]
            if flags[i] and PyDict_Next(base, &pb, &bk_p, &bv_p):
                differing.add(<object>bk_p)
                for j in range(n_sets):
                    d = &diffs[j]
                    if i >= d.stop:
                        _add_held(per_set[j], sets[j], <object>bk_p)
                    elif d.cursor < d.count and d.positions[d.cursor] == i:
                        (<set>per_set[j]).add(<object>d.values[d.cursor])
                        d.cursor += 1
                    else:
                        (<set>per_set[j]).add(<object>bv_p)
        for key in extra:
            for j in range(n_sets):
                _add_held(per_set[j], sets[j], key)
        differing |= extra
        return differing, per_set
    finally:
        free(flags)
        free(entries)
        _release(diffs, n_sets)


cdef inline int _add_held(set into, dict state, object key) except -1:
    value = state.get(key, _MISSING)
    if value is not _MISSING:
        into.add(value)
    return 0


cdef object _MISSING = object()
