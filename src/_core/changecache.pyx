# cython: language_level=3
"""Stream change cache (compiled core): when did an entity last change?

Same API and behaviour as :mod:`streamrep._pure.changecache`. The position log is a
C array of int64 searched by binary search; entity lookups are one dict probe.
"""

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from libc.stdint cimport int64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memmove

cimport cython

__all__ = ["StreamChangeCache"]


@cython.final
cdef class StreamChangeCache:
    """Per-entity last-change positions, answering "changed since X?" in memory.

    ``current_position`` is the position up to which the cache has seen every
    change; nothing changed in ``(earliest_known_position, current_position]``
    unless recorded here.
    """

    cdef readonly str name
    cdef readonly Py_ssize_t max_size
    cdef int64_t _earliest
    cdef int64_t _current
    cdef dict _last
    # The position log: positions in a C array, their entities in a list beside it.
    cdef int64_t* _positions
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _head
    cdef list _entities

    def __cinit__(self):
        self._positions = NULL
        self._len = 0
        self._cap = 0
        self._head = 0

    def __init__(self, str name, int64_t current_position, Py_ssize_t max_size=10000):
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.name = name
        self.max_size = max_size
        self._earliest = current_position
        self._current = current_position
        self._last = {}
        self._entities = []

    def __dealloc__(self):
        free(self._positions)

    @property
    def earliest_known_position(self):
        """Changes at or before this position may be missing from the cache."""
        return self._earliest

    @property
    def current_position(self):
        """The highest position recorded (or the starting position)."""
        return self._current

    def __len__(self):
        return len(self._last)

    cdef int _reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t want = self._len + extra
        cdef Py_ssize_t cap
        cdef int64_t* grown
        if want <= self._cap:
            return 0
        cap = max(want, self._cap * 2, 16)
        grown = <int64_t*>realloc(self._positions, cap * sizeof(int64_t))
        if grown == NULL:
            raise MemoryError()
        self._positions = grown
        self._cap = cap
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef Py_ssize_t _bisect_right(self, int64_t position) noexcept:
        cdef Py_ssize_t lo = self._head, hi = self._len, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if position < self._positions[mid]:
                hi = mid
            else:
                lo = mid + 1
        return lo

    cpdef entity_has_changed(self, object entity, int64_t position):
        """Record that *entity* changed at stream *position*."""
        cdef PyObject* old
        cdef Py_ssize_t idx
        if position <= self._earliest:
            return
        old = PyDict_GetItem(self._last, entity)
        if old != NULL and <int64_t>(<object>old) >= position:
            return
        self._last[entity] = position
        self._reserve(1)
        if self._len == self._head or position >= self._positions[self._len - 1]:
            self._positions[self._len] = position
            self._entities.append(entity)
        else:
            idx = self._bisect_right(position)
            memmove(&self._positions[idx + 1], &self._positions[idx],
                    (self._len - idx) * sizeof(int64_t))
            self._positions[idx] = position
            self._entities.insert(idx, entity)
        self._len += 1
        if position > self._current:
            self._current = position
        self._evict()

    cdef int _evict(self) except -1:
        cdef int64_t pos
        cdef object entity
        cdef PyObject* last
        while len(self._last) > self.max_size:
            pos = self._positions[self._head]
            entity = self._entities[self._head]
            self._head += 1
            last = PyDict_GetItem(self._last, entity)
            if last != NULL and <int64_t>(<object>last) == pos:
                del self._last[entity]
            if pos > self._earliest:
                self._earliest = pos
        if self._head > 64 and self._head * 2 > self._len:
            memmove(self._positions, &self._positions[self._head],
                    (self._len - self._head) * sizeof(int64_t))
            del self._entities[:self._head]
            self._len -= self._head
            self._head = 0
        return 0

    cpdef bint has_entity_changed(self, object entity, int64_t position) except -1:
        """True when *entity* may have changed after *position*."""
        cdef PyObject* last
        if position < self._earliest:
            return True
        last = PyDict_GetItem(self._last, entity)
        return last != NULL and <int64_t>(<object>last) > position

    def get_entities_changed(self, entities, int64_t position):
        """The subset of *entities* that may have changed after *position*."""
        cdef PyObject* last
        cdef set out
        if position < self._earliest:
            return set(entities)
        out = set()
        for entity in entities:
            last = PyDict_GetItem(self._last, entity)
            if last != NULL and <int64_t>(<object>last) > position:
                out.add(entity)
        return out

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def get_all_entities_changed(self, int64_t position):
        """Every entity changed after *position*, in order of their last change,
        or None when the cache cannot tell (``position`` is too old)."""
        cdef Py_ssize_t k
        cdef list out
        cdef object entity
        cdef PyObject* last
        if position < self._earliest:
            return None
        out = []
        for k in range(self._bisect_right(position), self._len):
            entity = self._entities[k]
            last = PyDict_GetItem(self._last, entity)
            if last != NULL and <int64_t>(<object>last) == self._positions[k]:
                out.append(entity)
        return out

    def get_max_pos_of_last_change(self, entity):
        """The position of *entity*'s last change, or the earliest known position."""
        return self._last.get(entity, self._earliest)

    def prefill(self, changes):
        """Record many ``(entity, position)`` changes (any order)."""
        for entity, position in sorted(changes, key=lambda c: c[1]):
            self.entity_has_changed(entity, position)
