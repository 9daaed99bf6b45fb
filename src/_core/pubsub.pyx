# cython: language_level=3, boundscheck=False, wraparound=False
"""Messages out of what a Redis subscription sends, in bulk, compiled (twin of
``streamrep._pure.pubsub``, whose docstrings say what each piece does).

RESP2 only (what Redis speaks unless a client asks for RESP3): RESP3's types are
refused as soon as their type byte arrives. The replies are parsed in place: a first pass finds where each message's payload
lies, a second copies them into one buffer, so no object is made per message.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy

from streamrep._pure import pubsub as _ref
from streamrep.errors import MalformedReplyError

__all__ = list(_ref.__all__)

MAX_BULK = _ref.MAX_BULK

DEF _INCOMPLETE = -1


cdef struct Span:
    Py_ssize_t start
    Py_ssize_t length


cdef class _Cursor:
    """Where the parser is in the buffer, and the payload spans found so far."""
    cdef const char* data
    cdef Py_ssize_t size
    cdef Py_ssize_t pos
    cdef Py_ssize_t max_bulk
    cdef Span* spans
    cdef Py_ssize_t count
    cdef Py_ssize_t capacity
    cdef Py_ssize_t total
    cdef Py_ssize_t subscribed
    cdef Py_ssize_t error_start
    cdef Py_ssize_t error_length

    def __dealloc__(self):
        free(self.spans)

    cdef int add(self, Py_ssize_t start, Py_ssize_t length) except -1:
        cdef Span* grown
        if self.count == self.capacity:
            self.capacity = self.capacity * 2 if self.capacity else 256
            grown = <Span*>realloc(self.spans, self.capacity * sizeof(Span))
            if grown == NULL:
                raise MemoryError()
            self.spans = grown
        self.spans[self.count].start = start
        self.spans[self.count].length = length
        self.count += 1
        self.total += length + 1
        return 0


cdef Py_ssize_t _number(_Cursor c, Py_ssize_t at, long long* out) except -2:
    """The integer at *at* up to its CRLF: where what follows starts."""
    cdef long long value = 0
    cdef bint negative = False
    cdef Py_ssize_t i = at
    cdef char ch
    if i < c.size and c.data[i] == c'-':
        negative = True
        i += 1
    if i >= c.size:
        return _INCOMPLETE
    while i < c.size:
        ch = c.data[i]
        if ch == c'\r':
            break
        if ch < c'0' or ch > c'9' or value > 100000000000000000:
            raise MalformedReplyError("Redis sent a malformed length or integer")
        value = value * 10 + (ch - c'0')
        i += 1
    if i + 1 >= c.size:
        return _INCOMPLETE
    if c.data[i + 1] != c'\n' or i == at + negative:
        raise MalformedReplyError("Redis sent a malformed length or integer")
    out[0] = -value if negative else value
    return i + 2


cdef Py_ssize_t _line(_Cursor c, Py_ssize_t at) except -2:
    """A simple string or error: where what follows its CRLF starts."""
    cdef Py_ssize_t i = at
    while i + 1 < c.size:
        if c.data[i] == c'\r' and c.data[i + 1] == c'\n':
            return i + 2
        i += 1
    return _INCOMPLETE


cdef Py_ssize_t _value(_Cursor c, Py_ssize_t at, Py_ssize_t* bulk_start,
                       Py_ssize_t* bulk_length) except -2:
    """One value that is not an array: where what follows starts; a bulk string's
    place in *bulk_start*, *bulk_length* (-1: not a bulk string, or null)."""
    cdef long long length
    cdef Py_ssize_t after
    bulk_length[0] = -1
    if at >= c.size:
        return _INCOMPLETE
    cdef char kind = c.data[at]
    if kind == c'-':
        return _line(c, at + 1)
    if kind == c'+':  # a simple string: a value as a bulk string is
        after = _line(c, at + 1)
        if after != _INCOMPLETE:
            bulk_start[0] = at + 1
            bulk_length[0] = after - 2 - (at + 1)
        return after
    if kind == c':':
        return _number(c, at + 1, &length)
    if kind != c'$':
        if kind == c'*':
            raise MalformedReplyError("Redis sent a nested array to a subscription")
        raise MalformedReplyError(f"Redis sent something that is not a reply (type byte {bytes([<unsigned char>kind])!r})")
    after = _number(c, at + 1, &length)
    if after == _INCOMPLETE or length == -1:  # -1: the null bulk string
        return after
    if length < 0:
        raise MalformedReplyError("Redis sent a negative length")
    if length > c.max_bulk:
        raise MalformedReplyError(f"Redis sent a bulk string of {length} bytes (more than {c.max_bulk})")
    if after + length + 2 > c.size:
        return _INCOMPLETE
    if c.data[after + length] != c'\r' or c.data[after + length + 1] != c'\n':
        raise MalformedReplyError("Redis sent a bulk string without its CRLF")
    bulk_start[0] = after
    bulk_length[0] = length
    return after + length + 2


cdef Py_ssize_t _reply(_Cursor c, Py_ssize_t at, const char* skip, Py_ssize_t skip_length) except -2:
    """One reply at *at*: where the next starts. A ``message`` adds its payload's
    span (unless it starts with *skip*)."""
    cdef long long items
    cdef Py_ssize_t i, start = -1, length = -1, payload_start = -1, payload_length = -1
    cdef bint message = True
    cdef Py_ssize_t after
    if c.data[at] == c'-':
        after = _line(c, at + 1)
        if after != _INCOMPLETE and c.error_length < 0:
            c.error_start, c.error_length = at + 1, after - 2 - (at + 1)
        return after
    if c.data[at] != c'*':
        return _value(c, at, &start, &length)
    at = _number(c, at + 1, &items)
    if at == _INCOMPLETE or items == -1:  # -1: the null array
        return at
    if items < 0:
        raise MalformedReplyError("Redis sent a negative length")
    for i in range(items):
        at = _value(c, at, &start, &length)
        if at == _INCOMPLETE:
            return at
        if i == 0:
            message = length == 7 and memcmp(c.data + start, b"message", 7) == 0
            if length == 9 and memcmp(c.data + start, b"subscribe", 9) == 0:
                c.subscribed += 1
        elif i == 2:
            payload_start, payload_length = start, length
    if message and items == 3 and payload_length >= 0 and not (
            skip != NULL and payload_length >= skip_length
            and memcmp(c.data + payload_start, skip, skip_length) == 0):
        c.add(payload_start, payload_length)
    return at


cdef class MessageSplitter:
    cdef bytes _held
    cdef Py_ssize_t _max_bulk
    cdef public Py_ssize_t subscribed
    cdef public object refusal

    def __init__(self, Py_ssize_t max_bulk=MAX_BULK):
        self._held = b""
        self._max_bulk = max_bulk
        self.subscribed = 0
        self.refusal = None

    def feed(self, bytes data, bytes skip=None):
        cdef bytes buffer = self._held + data if self._held else data
        cdef _Cursor c = _Cursor()
        cdef Py_ssize_t replies = 0, after, i
        cdef const char* skip_data = NULL
        cdef Py_ssize_t skip_length = 0
        if skip is not None:
            skip_data = PyBytes_AS_STRING(skip)
            skip_length = PyBytes_GET_SIZE(skip)
        c.data = PyBytes_AS_STRING(buffer)
        c.size = PyBytes_GET_SIZE(buffer)
        c.max_bulk = self._max_bulk
        c.error_length = -1
        while c.pos < c.size:
            after = _reply(c, c.pos, skip_data, skip_length)
            if after == _INCOMPLETE:
                break
            c.pos = after
            replies += 1
        self._held = buffer[c.pos:] if c.pos < c.size else b""
        self.subscribed += c.subscribed
        if c.error_length >= 0 and self.refusal is None:
            self.refusal = buffer[c.error_start:c.error_start + c.error_length]
        if c.count == 0:
            return b"", replies
        out = PyBytes_FromStringAndSize(NULL, c.total)
        cdef char* write = PyBytes_AS_STRING(out)
        for i in range(c.count):
            memcpy(write, c.data + c.spans[i].start, c.spans[i].length)
            write += c.spans[i].length
            write[0] = c'\n'
            write += 1
        return out, replies
