# cython: language_level=3
"""Stream ID completion tracking (compiled core; twin: ``streamrep._pure.tracker``).

:class:`CompletionTracker` is the writer's side: IDs are reserved (tracked), complete
in any order (a rollback is a completion too), and the position advances only once
every smaller tracked ID has completed; each advance reports the IDs that became
visible, ascending. :class:`WriterPositions` is the reader's side: the position of
every writer of a stream, their minimum (the linear position) and their maximum.

Both work on increasing IDs; a stream whose IDs decrease (backfill) tracks their
negations. The in-flight IDs live in a C array kept sorted: in the usual case IDs are
tracked in increasing order and complete near the head, so both ends are O(1).
A completion copies the IDs it makes visible into a second array, reused from call to
call, so it allocates nothing: the list is built only when asked for.
"""

cimport cython
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memmove, memset

from streamrep.errors import NotAWriterError, StreamIdError

__all__ = ["CompletionTracker", "WriterPositions"]

cdef enum:
    _INITIAL_CAPACITY = 64


cdef class CompletionTracker:
    """Tracks one writer's reserved stream IDs and its current position."""

    cdef int64_t _position
    cdef int64_t _last_reserved
    # Tracked IDs not yet visible, ascending, in _ids[_head:_tail]; _done flags the
    # ones already completed (waiting for a smaller ID).
    cdef int64_t* _ids
    cdef uint8_t* _done
    cdef Py_ssize_t _head
    cdef Py_ssize_t _tail
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _in_flight
    # The IDs the last completion call made visible, ascending (room for _cap).
    cdef int64_t* _visible
    cdef Py_ssize_t _n_visible

    def __cinit__(self, position):
        self._ids = <int64_t*>malloc(_INITIAL_CAPACITY * sizeof(int64_t))
        self._done = <uint8_t*>malloc(_INITIAL_CAPACITY * sizeof(uint8_t))
        self._visible = <int64_t*>malloc(_INITIAL_CAPACITY * sizeof(int64_t))
        if self._ids == NULL or self._done == NULL or self._visible == NULL:
            raise MemoryError()
        self._n_visible = 0
        self._cap = _INITIAL_CAPACITY
        self._head = 0
        self._tail = 0
        self._in_flight = 0

    def __init__(self, position):
        self._position = position
        self._last_reserved = self._position

    def __dealloc__(self):
        free(self._ids)
        free(self._done)
        free(self._visible)

    @property
    def position(self):
        """Largest ID such that every tracked ID at or below it has completed."""
        return self._position

    @property
    def last_reserved(self):
        """The largest ID tracked so far (or the position, if larger)."""
        return self._last_reserved

    @property
    def in_flight(self):
        """How many tracked IDs have not completed yet."""
        return self._in_flight

    @property
    def first_in_flight(self):
        """The smallest tracked ID that has not completed, or None."""
        if self._head < self._tail:
            return self._ids[self._head]
        return None

    cdef int _reserve_slots(self, Py_ssize_t extra) except -1:
        """Make room for *extra* more IDs at the tail."""
        cdef Py_ssize_t live = self._tail - self._head
        cdef Py_ssize_t new_cap
        cdef int64_t* ids
        cdef uint8_t* done
        cdef int64_t* visible
        if self._tail + extra <= self._cap:
            return 0
        if self._head > 0:
            memmove(self._ids, self._ids + self._head, live * sizeof(int64_t))
            memmove(self._done, self._done + self._head, live * sizeof(uint8_t))
            self._head = 0
            self._tail = live
            if live + extra <= self._cap and live * 2 <= self._cap:
                return 0
        new_cap = self._cap * 2
        while new_cap < live + extra:
            new_cap *= 2
        ids = <int64_t*>realloc(self._ids, new_cap * sizeof(int64_t))
        if ids == NULL:
            raise MemoryError()
        self._ids = ids
        done = <uint8_t*>realloc(self._done, new_cap * sizeof(uint8_t))
        if done == NULL:
            raise MemoryError()
        self._done = done
        # The visible IDs of the last call are kept: they fit, since new_cap > _cap.
        visible = <int64_t*>realloc(self._visible, new_cap * sizeof(int64_t))
        if visible == NULL:
            raise MemoryError()
        self._visible = visible
        self._cap = new_cap
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef Py_ssize_t _find(self, int64_t stream_id) noexcept:
        """Index of the first slot in [head, tail) whose ID is >= *stream_id*."""
        cdef Py_ssize_t lo = self._head
        cdef Py_ssize_t hi = self._tail
        cdef Py_ssize_t mid
        cdef int64_t offset
        if lo < hi:
            # IDs of one writer are usually dense: try the slot they would have
            # without gaps before searching.
            offset = stream_id - self._ids[lo]
            if 0 <= offset < hi - lo and self._ids[lo + offset] == stream_id:
                return lo + offset
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._ids[mid] < stream_id:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef int _track_one(self, int64_t stream_id) except -1:
        cdef Py_ssize_t i
        if stream_id <= self._position:
            raise StreamIdError(
                f"stream ID {stream_id} is not ahead of the position {self._position}"
            )
        if stream_id > self._last_reserved:
            self._reserve_slots(1)
            self._ids[self._tail] = stream_id
            self._done[self._tail] = 0
            self._tail += 1
            self._last_reserved = stream_id
        else:
            i = self._find(stream_id)
            if i < self._tail and self._ids[i] == stream_id:
                raise StreamIdError(f"stream ID {stream_id} is already tracked")
            self._reserve_slots(1)
            i = self._find(stream_id)
            memmove(self._ids + i + 1, self._ids + i, (self._tail - i) * sizeof(int64_t))
            memmove(self._done + i + 1, self._done + i, (self._tail - i) * sizeof(uint8_t))
            self._ids[i] = stream_id
            self._done[i] = 0
            self._tail += 1
        self._in_flight += 1
        return 0

    def is_in_flight(self, int64_t stream_id):
        """True when *stream_id* is tracked and not completed."""
        cdef Py_ssize_t i = self._find(stream_id)
        return i < self._tail and self._ids[i] == stream_id and not self._done[i]

    def track(self, int64_t stream_id, /):
        """Record that *stream_id* (reserved elsewhere, e.g. by a sequence) is in flight."""
        self._track_one(stream_id)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def track_range(self, int64_t first, Py_ssize_t count):
        """Track the *count* consecutive IDs starting at *first*."""
        cdef Py_ssize_t k
        if count < 0:
            raise StreamIdError(f"cannot track {count} stream IDs")
        if count and first > self._last_reserved and first > self._position:
            self._reserve_slots(count)
            for k in range(count):
                self._ids[self._tail + k] = first + k
            memset(self._done + self._tail, 0, count * sizeof(uint8_t))
            self._tail += count
            self._last_reserved = first + count - 1
            self._in_flight += count
            return
        for k in range(count):
            self._track_one(first + k)

    def reserve(self, Py_ssize_t count=1):
        """Track the next *count* IDs after :attr:`last_reserved`; return the first."""
        if count < 1:
            raise StreamIdError(f"cannot reserve {count} stream IDs")
        cdef int64_t first = self._last_reserved + 1
        self.track_range(first, count)
        return first

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _complete_one(self, int64_t stream_id) except -1:
        """Complete *stream_id*, appending the IDs it makes visible to ``_visible``."""
        cdef Py_ssize_t head = self._head
        cdef Py_ssize_t tail = self._tail
        cdef Py_ssize_t i
        cdef Py_ssize_t n = self._n_visible
        cdef int64_t* ids = self._ids
        cdef uint8_t* done = self._done
        cdef int64_t* visible = self._visible
        if head < tail and ids[head] == stream_id:
            self._in_flight -= 1
            visible[n] = stream_id
            n += 1
            head += 1
            while head < tail and done[head]:
                visible[n] = ids[head]
                n += 1
                head += 1
            self._n_visible = n
            self._position = ids[head - 1]
            if head == tail:
                self._head = 0
                self._tail = 0
            else:
                self._head = head
            return 0
        i = self._find(stream_id)
        if i >= tail or ids[i] != stream_id or done[i]:
            raise StreamIdError(f"stream ID {stream_id} is not in flight")
        done[i] = 1
        self._in_flight -= 1
        return 0

    def complete(self, int64_t stream_id, /):
        """Mark *stream_id* completed; return how many IDs became visible (0 while a
        smaller tracked ID is in flight). :meth:`last_visible` lists them."""
        self._n_visible = 0
        self._complete_one(stream_id)
        return self._n_visible

    def complete_many(self, stream_ids):
        """Complete each of *stream_ids*; return how many IDs became visible.

        If one of them is not in flight, :class:`StreamIdError` is raised after the
        ones before it completed; its ``visible`` attribute lists what they made
        visible.
        """
        self._n_visible = 0
        try:
            if isinstance(stream_ids, list):
                for item in <list>stream_ids:
                    self._complete_one(item)
            else:
                for item in stream_ids:
                    self._complete_one(item)
        except StreamIdError as exc:
            exc.visible = self.last_visible()
            raise
        return self._n_visible

    def last_visible(self):
        """The IDs the last :meth:`complete` or :meth:`complete_many` call made
        visible, ascending (a new list)."""
        cdef Py_ssize_t k
        cdef object item
        cdef list out = PyList_New(self._n_visible)
        for k in range(self._n_visible):
            item = self._visible[k]
            Py_INCREF(item)
            PyList_SET_ITEM(out, k, item)
        return out

    def advance_to(self, int64_t stream_id):
        """Move the position forward to *stream_id* over IDs this writer never tracked.

        The position stops short of the first ID still in flight, so it never passes
        an incomplete ID. Returns the new position. A writer with nothing in flight
        uses this to catch up with the stream (e.g. the sequence's current value), so
        readers' linear position is not held back by an idle writer.
        """
        if self._head < self._tail and stream_id >= self._ids[self._head]:
            stream_id = self._ids[self._head] - 1
        if stream_id > self._position:
            self._position = stream_id
            if stream_id > self._last_reserved:
                self._last_reserved = stream_id
        return self._position

    def __repr__(self):
        return (f"<CompletionTracker position={self._position} in_flight={self._in_flight} "
                f"last_reserved={self._last_reserved}>")


cdef class WriterPositions:
    """A reader's view of a stream: the position of each of its writers.

    Positions only move forward. ``linear_position`` is the minimum over the writers
    (every fact at or below it, from any writer, has completed); ``max_position`` the
    maximum. Together they are the range of current stream IDs.
    """

    cdef dict _positions
    cdef int64_t _min
    cdef int64_t _max

    def __init__(self, positions):
        if not positions:
            raise NotAWriterError("a stream needs at least one writer")
        self._positions = {str(k): int(v) for k, v in positions.items()}
        self._recompute()

    cdef int _recompute(self) except -1:
        values = self._positions.values()
        self._min = min(values)
        self._max = max(values)
        return 0

    @property
    def writers(self):
        """The writer instances, sorted."""
        return sorted(self._positions)

    def positions(self):
        """A copy of ``{writer: position}``."""
        return dict(self._positions)

    def get_position(self, instance):
        """The position of writer *instance*."""
        try:
            return self._positions[instance]
        except KeyError:
            raise NotAWriterError(f"{instance!r} is not a writer of this stream") from None

    def advance(self, instance, position):
        """Move *instance*'s position forward to *position*; True if it moved.

        Older (smaller) positions are ignored: messages may arrive late.
        """
        cdef int64_t current = self.get_position(instance)
        cdef int64_t new = position
        if new <= current:
            return False
        self._positions[instance] = new
        if new > self._max:
            self._max = new
        if current == self._min:
            self._min = min(self._positions.values())
        return True

    def apply_position(self, instance, prev_token, new_token):
        """Apply a ``POSITION`` (the writer had nothing in flight between *prev_token*
        and *new_token*).

        If this reader already holds everything up to *prev_token*, the writer's
        position jumps to *new_token* and None is returned. Otherwise facts in
        ``(position, prev_token]`` were missed: the position is left alone and the
        token to catch up from is returned; fetch those rows, then :meth:`advance`
        to *new_token*.
        """
        cdef int64_t current = self.get_position(instance)
        if current < prev_token:
            return current
        self.advance(instance, new_token)
        return None

    def add_writer(self, instance, position):
        """Start following a new writer from *position* (no-op if already known)."""
        instance = str(instance)
        if instance not in self._positions:
            self._positions[instance] = int(position)
            self._recompute()

    @property
    def linear_position(self):
        """Largest ID at or below which every writer's facts have completed."""
        return self._min

    @property
    def max_position(self):
        """The furthest position of any writer."""
        return self._max

    def __repr__(self):
        return f"<WriterPositions {self._positions!r}>"
