# C-level API of streamrep._core.state, for other Cython modules to cimport.

from libc.stdint cimport int64_t


cdef struct Entry:
    # One state entry: interned (type, state_key) ID and interned event ID.
    int64_t key
    int64_t event


cdef Py_ssize_t merge_sorted(const Entry* base, Py_ssize_t base_len,
                             const Entry* delta, Py_ssize_t delta_len,
                             Entry* out) noexcept nogil


cdef class Int64s:
    # An aligned int64 view of a buffer argument (copied only if misaligned).
    cdef const unsigned char[::1] raw
    cdef bytes copy
    cdef const int64_t* ptr
    cdef Py_ssize_t length


cdef const unsigned char[::1] raw_flags(object obj, str name)
