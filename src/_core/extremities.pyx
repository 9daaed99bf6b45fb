# cython: language_level=3
"""Forward and backward extremity upkeep for one batch of events (compiled core).

Same API and results as :mod:`streamrep._pure.extremities`; see there for the
definitions. The caller interns event IDs into dense integers, so the inner loops
run over int64/uint8 buffers and a scratch mark array, never over Python objects.
"""

from cpython.array cimport array, clone
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free

cimport cython

__all__ = [
    "BATCH_NON_OUTLIER",
    "BATCH_COUNTED",
    "ID_STORED_NON_OUTLIER",
    "ID_HAS_COUNTED_CHILD",
    "ID_FORWARD",
    "update_extremities",
]

BATCH_NON_OUTLIER = 1
BATCH_COUNTED = 2
ID_STORED_NON_OUTLIER = 1
ID_HAS_COUNTED_CHILD = 2
ID_FORWARD = 4

cdef array _Q_TEMPLATE = array("q")


cdef inline array _take(int64_t* buf, Py_ssize_t count):
    cdef array out = clone(_Q_TEMPLATE, count, False)
    cdef Py_ssize_t k
    for k in range(count):
        out.data.as_longlongs[k] = buf[k]
    return out


cdef int _check(const int64_t[::1] batch_ids, const uint8_t[::1] batch_flags,
                const int64_t[::1] prev_offsets, const int64_t[::1] prev_ids,
                Py_ssize_t n_ids) except -1:
    cdef Py_ssize_t n = batch_ids.shape[0], i
    if batch_flags.shape[0] != n:
        raise ValueError("batch_flags must have one entry per batch event")
    if prev_offsets.shape[0] != n + 1:
        raise ValueError("prev_offsets must have len(batch_ids) + 1 entries")
    if prev_offsets[0] != 0 or prev_offsets[n] != prev_ids.shape[0]:
        raise ValueError("prev_offsets must start at 0 and end at len(prev_ids)")
    for i in range(n):
        if prev_offsets[i] > prev_offsets[i + 1]:
            raise ValueError("prev_offsets must not decrease")
        if batch_ids[i] < 0 or batch_ids[i] >= n_ids:
            raise ValueError(f"batch id {batch_ids[i]} outside 0..{n_ids - 1}")
    for i in range(prev_ids.shape[0]):
        if prev_ids[i] < 0 or prev_ids[i] >= n_ids:
            raise ValueError(f"prev id {prev_ids[i]} outside 0..{n_ids - 1}")
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def update_extremities(const int64_t[::1] batch_ids, const uint8_t[::1] batch_flags,
                       const int64_t[::1] prev_offsets, const int64_t[::1] prev_ids,
                       const uint8_t[::1] id_flags):
    """update_extremities(batch_ids, batch_flags, prev_offsets, prev_ids, id_flags)
    -> (forward_added, forward_removed, backward_added, backward_removed)

    Compute the extremity changes a batch makes; see the pure twin for the buffers'
    meaning. Returns four ``array('q')`` of interned IDs.
    """
    cdef Py_ssize_t n = batch_ids.shape[0]
    cdef Py_ssize_t n_ids = id_flags.shape[0]
    cdef Py_ssize_t n_prev = prev_ids.shape[0]
    _check(batch_ids, batch_flags, prev_offsets, prev_ids, n_ids)

    cdef uint8_t* mark = <uint8_t*>calloc(n_ids + 1, 1)
    # One scratch block holds the four outputs: each is bounded by n or n_prev.
    cdef int64_t* scratch = <int64_t*>calloc(2 * n + 2 * n_prev + 4, sizeof(int64_t))
    if mark == NULL or scratch == NULL:
        free(mark)
        free(scratch)
        raise MemoryError()
    cdef int64_t* f_add = scratch
    cdef int64_t* b_rem = scratch + n + 1
    cdef int64_t* f_rem = scratch + 2 * n + 2
    cdef int64_t* b_add = scratch + 2 * n + n_prev + 3
    cdef Py_ssize_t nf_add = 0, nb_rem = 0, nf_rem = 0, nb_add = 0
    cdef Py_ssize_t i, j
    cdef int64_t eid, p
    cdef uint8_t flags
    try:
        for i in range(n):
            flags = batch_flags[i]
            if flags & 1:
                mark[batch_ids[i]] |= 2
            if flags & 2:
                for j in range(prev_offsets[i], prev_offsets[i + 1]):
                    mark[prev_ids[j]] |= 1
        for i in range(n):
            eid = batch_ids[i]
            flags = batch_flags[i]
            if (flags & 2) and not (mark[eid] & 1) and not (id_flags[eid] & 6):
                f_add[nf_add] = eid
                nf_add += 1
            if flags & 1:
                b_rem[nb_rem] = eid
                nb_rem += 1
                for j in range(prev_offsets[i], prev_offsets[i + 1]):
                    p = prev_ids[j]
                    if (mark[p] & 6) == 0 and not (id_flags[p] & 1):
                        mark[p] |= 4
                        b_add[nb_add] = p
                        nb_add += 1
            if flags & 2:
                for j in range(prev_offsets[i], prev_offsets[i + 1]):
                    p = prev_ids[j]
                    if (id_flags[p] & 4) and not (mark[p] & 8):
                        mark[p] |= 8
                        f_rem[nf_rem] = p
                        nf_rem += 1
        return (_take(f_add, nf_add), _take(f_rem, nf_rem),
                _take(b_add, nb_add), _take(b_rem, nb_rem))
    finally:
        free(mark)
        free(scratch)
