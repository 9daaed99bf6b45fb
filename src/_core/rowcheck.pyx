# cython: language_level=3
"""Stream row shapes, compiled (twin of ``streamrep._pure.rowcheck``).

A row in the common compact form (no whitespace, ASCII strings without escapes,
integers of at most 18 digits) is checked in place on its raw bytes, allocating
nothing. Any other row, and every row that does not fit, is decoded and explained
by the pure twin, so both implementations accept the same rows and return the same
messages.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcmp

from streamrep._core.compactjson cimport skip_integer, skip_string, skip_value, skip_word

from streamrep._pure import rowcheck as _ref
from streamrep._core.wire import RdataCommand as _RdataCommand

__all__ = list(_ref.__all__)

KINDS = _ref.KINDS

cdef enum Kind:
    K_STRING = 0
    K_STRING_OR_NULL
    K_INTEGER
    K_BOOLEAN
    K_FLAG
    K_OBJECT
    K_ARRAY
    K_ARRAY_OR_NULL
    K_STRING_ARRAY
    K_ANY

@cython.final
cdef class RowShape:
    """The shape of one stream's rows.

    *fields* is a sequence of ``(name, kind)`` for rows that are a flat JSON array;
    *variants* maps each ``kind`` tag to such a sequence for rows ``[tag, [fields]]``
    (give one or the other). *name* (the stream) starts every message.
    """

    cdef readonly str name
    cdef readonly tuple fields
    cdef readonly dict variants
    # One Kind per field, as bytes so the check reads them through a char pointer.
    cdef bytes _kinds
    # The UTF-8 tags and their shapes, in the same order.
    cdef tuple _tags
    cdef tuple _shapes

    def __init__(self, str name, fields=(), variants=None):
        if variants is not None and fields:
            raise ValueError("a row shape has fields or variants, not both")
        self.name = name
        self.fields = tuple((str(field), str(kind)) for field, kind in fields)
        for field, kind in self.fields:
            if kind not in KINDS:
                raise ValueError(f"field {field!r} of {name!r} has unknown kind {kind!r} "
                                 f"(known: {', '.join(KINDS)})")
        self._kinds = bytes([KINDS.index(kind) for _field, kind in self.fields])
        self.variants = None
        self._tags = ()
        self._shapes = ()
        if variants is not None:
            if not variants:
                raise ValueError("a tagged row shape needs at least one variant")
            self.variants = {str(tag): RowShape(f"{name} {tag}", shape)
                             for tag, shape in variants.items()}
            self._tags = tuple(tag.encode() for tag in self.variants)
            self._shapes = tuple(self.variants.values())

    def __repr__(self):
        if self.variants is not None:
            return f"RowShape({self.name!r}, variants={sorted(self.variants)!r})"
        return f"RowShape({self.name!r}, {list(self.fields)!r})"


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bint _skip_strings(const char** cursor, const char* end) noexcept nogil:
    """Past a compact array of strings."""
    cdef const char* p = cursor[0]
    if p >= end or p[0] != c'[':
        return False
    p += 1
    if p < end and p[0] == c']':
        cursor[0] = p + 1
        return True
    while True:
        if not skip_string(&p, end) or p >= end:
            return False
        if p[0] == c']':
            cursor[0] = p + 1
            return True
        if p[0] != c',':
            return False
        p += 1


cdef bint _skip_flag(const char** cursor, const char* end) noexcept nogil:
    """Past ``true``, ``false``, ``0`` or ``1`` (a one-digit integer)."""
    cdef const char* p = cursor[0]
    if p[0] == c'0' or p[0] == c'1':
        if skip_integer(&p, end) and p == cursor[0] + 1:
            cursor[0] = p
            return True
        return False
    return skip_word(cursor, end, b"true", 4) or skip_word(cursor, end, b"false", 5)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bint _skip_kind(const char** cursor, const char* end, char kind) noexcept nogil:
    """Past a value of *kind*; False when it is not one (or the decoder must decide)."""
    cdef const char* p = cursor[0]
    if p >= end:
        return False
    if kind == K_STRING:
        return skip_string(cursor, end)
    if kind == K_STRING_OR_NULL:
        return skip_word(cursor, end, b"null", 4) or skip_string(cursor, end)
    if kind == K_INTEGER:
        return (p[0] == c'-' or c'0' <= p[0] <= c'9') and skip_integer(cursor, end)
    if kind == K_BOOLEAN:
        return skip_word(cursor, end, b"true", 4) or skip_word(cursor, end, b"false", 5)
    if kind == K_FLAG:
        return _skip_flag(cursor, end)
    if kind == K_OBJECT:
        return p[0] == c'{' and skip_value(cursor, end, 1)
    if kind == K_ARRAY:
        return p[0] == c'[' and skip_value(cursor, end, 1)
    if kind == K_ARRAY_OR_NULL:
        return skip_word(cursor, end, b"null", 4) or (p[0] == c'[' and skip_value(cursor, end, 1))
    if kind == K_STRING_ARRAY:
        return _skip_strings(cursor, end)
    return skip_value(cursor, end, 1)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bint _fits_flat(const char** cursor, const char* end, const char* kinds,
                     Py_ssize_t count) noexcept nogil:
    """Past an array of exactly *count* values of *kinds*."""
    cdef const char* p = cursor[0]
    cdef Py_ssize_t i
    if p >= end or p[0] != c'[':
        return False
    p += 1
    if count == 0:
        if p < end and p[0] == c']':
            cursor[0] = p + 1
            return True
        return False
    for i in range(count):
        if not _skip_kind(&p, end, kinds[i]) or p >= end:
            return False
        if p[0] != (c']' if i == count - 1 else c','):
            return False
        p += 1
    cursor[0] = p
    return True


cdef bint _fits(RowShape shape, const char* p, const char* end):
    """Whether the compact row ``p[:end]`` fits *shape* (False: ask the twin)."""
    cdef const char* tag_start
    cdef Py_ssize_t tag_size, i
    cdef bytes tag
    cdef RowShape variant
    if shape.variants is None:
        return (_fits_flat(&p, end, PyBytes_AS_STRING(shape._kinds),
                           PyBytes_GET_SIZE(shape._kinds)) and p == end)
    if p >= end or p[0] != c'[':
        return False
    p += 1
    tag_start = p + 1
    if not skip_string(&p, end) or p >= end or p[0] != c',':
        return False
    tag_size = p - tag_start - 1
    p += 1
    for i in range(len(shape._tags)):
        tag = <bytes>shape._tags[i]
        if PyBytes_GET_SIZE(tag) == tag_size and memcmp(PyBytes_AS_STRING(tag), tag_start,
                                                        tag_size) == 0:
            variant = <RowShape>shape._shapes[i]
            return (_fits_flat(&p, end, PyBytes_AS_STRING(variant._kinds),
                               PyBytes_GET_SIZE(variant._kinds))
                    and p + 1 == end and p[0] == c']')
    return False


def check_row(RowShape shape, row_json):
    """None when the JSON row *row_json* has *shape*, else what is wrong."""
    if type(row_json) is not bytes:
        row_json = bytes(row_json)
    cdef const char* p = PyBytes_AS_STRING(row_json)
    if _fits(shape, p, p + PyBytes_GET_SIZE(row_json)):
        return None
    return _ref.check_row(shape, row_json)


cdef const char* _past_rdata_head(const char* p, const char* end) noexcept nogil:
    """Where the row starts in an RDATA line: past ``RDATA``, the stream, the
    instance and the token, four words that never hold a space (NULL if absent)."""
    cdef int spaces = 0
    while p < end:
        if p[0] == c' ':
            spaces += 1
            if spaces == 4:
                return p + 1
        p += 1
    return NULL


def check_rows(RowShape shape, commands):
    """The first error of :func:`check_row` over the ``row_json`` of each command."""
    cdef object error, line
    cdef const char* start
    cdef const char* end
    cdef const char* row
    for command in commands:
        # A decoded RDATA's row is checked inside its line: no copy of it per command.
        if type(command) is _RdataCommand:
            line = command.to_bytes()
            start = PyBytes_AS_STRING(line)
            end = start + PyBytes_GET_SIZE(line)
            row = _past_rdata_head(start, end)
            if row is not NULL and _fits(shape, row, end):
                continue
        error = _ref.check_row(shape, command.row_json)
        if error is not None:
            return error
    return None
