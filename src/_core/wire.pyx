"""The replication wire format, compiled (twin of ``streamrep._pure.wire``).

Bytes in, commands out, and back: no sockets here. The decoder finds newlines
with ``memchr``, parses each line in place with C pointers, interns stream and
instance names, and copies each line once into the command that keeps it. RDATA
rows stay raw JSON until ``.row`` is read.

Lines it rejects are explained by the pure twin's parser, so both
implementations raise the same errors with the same messages.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_Append, PyList_New
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport isfinite
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

from streamrep._core.compactjson cimport MAX_JSON_DEPTH, skip_value

import orjson

from streamrep._pure import wire as _ref
from streamrep.errors import MalformedCommandError
from streamrep.wire_commands import command_table

cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char* mem, Py_ssize_t size, int flags)
    int PyBUF_READ

__all__ = list(_ref.__all__)

DEFAULT_MAX_LINE_LENGTH = _ref.DEFAULT_MAX_LINE_LENGTH

cdef object _loads = orjson.loads
cdef object _dumps = orjson.dumps
cdef object _JSONDecodeError = orjson.JSONDecodeError
cdef object _MISSING = _ref._MISSING
cdef object _explain = _ref._explain
cdef object _too_long = _ref._too_long
cdef object _word = _ref._word
cdef object _text = _ref._text
cdef object _str = _ref._str
cdef object _int64 = _ref._int64
cdef object _decode_json = _ref._decode_json
cdef object _raise_collected = _ref._raise_collected

cdef Py_ssize_t _PREFIX_LIMIT = _ref._PREFIX_LIMIT


cdef enum CommandKind:
    CMD_UNKNOWN = 0
    CMD_SERVER
    CMD_RDATA
    CMD_POSITION
    CMD_ERROR
    CMD_PING
    CMD_NAME
    CMD_REPLICATE
    CMD_USER_SYNC
    CMD_CLEAR_USER_SYNC
    CMD_FEDERATION_ACK
    CMD_USER_IP
    CMD_REMOTE_SERVER_UP
    CMD_LOCK_RELEASED
    CMD_NEW_ACTIVE_TASK
    CMD_CANCEL_TASK
    CMD_AUTH_CHALLENGE
    CMD_AUTH_RESPONSE
    CMD_AUTH_OK


# --- small C helpers --------------------------------------------------------------


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline bint _is_ascii(const char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0
    cdef uint64_t word, w1, w2, w3
    while i + 32 <= n:
        # One test per 32 bytes: rows are long and almost always ASCII.
        memcpy(&word, p + i, 8)
        memcpy(&w1, p + i + 8, 8)
        memcpy(&w2, p + i + 16, 8)
        memcpy(&w3, p + i + 24, 8)
        if (word | w1 | w2 | w3) & 0x8080808080808080ULL:
            return False
        i += 32
    while i + 8 <= n:
        memcpy(&word, p + i, 8)
        if word & 0x8080808080808080ULL:
            return False
        i += 8
    while i < n:
        if <unsigned char>p[i] & 0x80:
            return False
        i += 1
    return True


cdef bint _valid_utf8(const char* p, Py_ssize_t n):
    # Fast for the usual all-ASCII line; a full check otherwise.
    if _is_ascii(p, n):
        return True
    try:
        PyUnicode_DecodeUTF8(<char*>p, n, "strict")
    except UnicodeDecodeError:
        return False
    return True


cdef inline bint _parse_int(const char* p, Py_ssize_t n, int64_t* out) noexcept nogil:
    """Strict decimal int64: ``-?(0|[1-9][0-9]*)``, no ``-0``. False if invalid."""
    cdef bint negative = False
    cdef uint64_t value = 0
    cdef uint64_t limit
    cdef Py_ssize_t i = 0
    cdef unsigned char c
    if n > 0 and p[0] == b'-':
        negative = True
        i = 1
    if i >= n or n - i > 19:
        return False
    if p[i] == b'0' and n - i > 1:
        return False
    while i < n:
        c = <unsigned char>p[i] - <unsigned char>b'0'
        if c > 9:
            return False
        value = value * 10 + c
        i += 1
    limit = 9223372036854775808ULL if negative else 9223372036854775807ULL
    if value > limit:
        return False
    if negative:
        if value == 0:
            return False
        out[0] = <int64_t>(0 - value)
    else:
        out[0] = <int64_t>value
    return True


cdef inline uint64_t _short_hash(const char* p, Py_ssize_t n) noexcept nogil:
    """A cheap hash of a short byte string: its length, first and last 8 bytes."""
    cdef uint64_t head = 0
    cdef uint64_t tail = 0
    cdef Py_ssize_t i
    if n >= 8:
        memcpy(&head, p, 8)
        memcpy(&tail, p + n - 8, 8)
    else:
        # Byte by byte in a register: a short memcpy then a wide load would stall.
        for i in range(n):
            head = (head << 8) | <unsigned char>p[i]
    head = (head ^ (tail * 0x9E3779B97F4A7C15ULL) ^ <uint64_t>n) * 0xFF51AFD7ED558CCDULL
    return head ^ (head >> 32)


# Stream, instance and user names repeat on nearly every line: decode each once.
cdef enum:
    _NAME_CACHE_SIZE = 512
    _NAME_CACHE_MAX = 64
cdef PyObject* _cache_keys[_NAME_CACHE_SIZE]
cdef PyObject* _cache_values[_NAME_CACHE_SIZE]


@cython.boundscheck(False)
@cython.wraparound(False)
cdef str _name(const char* p, Py_ssize_t n):
    """The str of UTF-8 bytes already validated, from the cache when seen before."""
    cdef uint64_t h
    cdef PyObject* key
    cdef bytes new_key
    cdef str value
    if n > _NAME_CACHE_MAX:
        return PyUnicode_DecodeUTF8(<char*>p, n, NULL)
    h = _short_hash(p, n) & (_NAME_CACHE_SIZE - 1)
    key = _cache_keys[h]
    if key is not NULL and PyBytes_GET_SIZE(<object>key) == n and \
            memcmp(PyBytes_AS_STRING(<object>key), p, n) == 0:
        return <str>_cache_values[h]
    value = PyUnicode_DecodeUTF8(<char*>p, n, NULL)
    new_key = PyBytes_FromStringAndSize(p, n)
    Py_XDECREF(_cache_keys[h])
    Py_XDECREF(_cache_values[h])
    Py_INCREF(new_key)
    Py_INCREF(value)
    _cache_keys[h] = <PyObject*>new_key
    _cache_values[h] = <PyObject*>value
    return value


cdef inline str _decode(const char* p, Py_ssize_t n):
    return PyUnicode_DecodeUTF8(<char*>p, n, NULL)


cdef inline bint _same(const char* p, Py_ssize_t n, const char* word, Py_ssize_t m) noexcept nogil:
    return n == m and memcmp(p, word, m) == 0


cdef CommandKind _kind(const char* p, Py_ssize_t n) noexcept nogil:
    if n == 5:
        if memcmp(p, b"RDATA", 5) == 0:
            return CMD_RDATA
        if memcmp(p, b"ERROR", 5) == 0:
            return CMD_ERROR
    elif n == 8:
        if memcmp(p, b"POSITION", 8) == 0:
            return CMD_POSITION
    elif n == 4:
        if memcmp(p, b"PING", 4) == 0:
            return CMD_PING
        if memcmp(p, b"NAME", 4) == 0:
            return CMD_NAME
    elif n == 6:
        if memcmp(p, b"SERVER", 6) == 0:
            return CMD_SERVER
    elif n == 9:
        if memcmp(p, b"REPLICATE", 9) == 0:
            return CMD_REPLICATE
        if memcmp(p, b"USER_SYNC", 9) == 0:
            return CMD_USER_SYNC
    elif n == 7:
        if memcmp(p, b"USER_IP", 7) == 0:
            return CMD_USER_IP
        if memcmp(p, b"AUTH_OK", 7) == 0:
            return CMD_AUTH_OK
    elif n == 14:
        if memcmp(p, b"FEDERATION_ACK", 14) == 0:
            return CMD_FEDERATION_ACK
        if memcmp(p, b"AUTH_CHALLENGE", 14) == 0:
            return CMD_AUTH_CHALLENGE
    elif n == 15:
        if memcmp(p, b"CLEAR_USER_SYNC", 15) == 0:
            return CMD_CLEAR_USER_SYNC
        if memcmp(p, b"NEW_ACTIVE_TASK", 15) == 0:
            return CMD_NEW_ACTIVE_TASK
    elif n == 16:
        if memcmp(p, b"REMOTE_SERVER_UP", 16) == 0:
            return CMD_REMOTE_SERVER_UP
    elif n == 13:
        if memcmp(p, b"LOCK_RELEASED", 13) == 0:
            return CMD_LOCK_RELEASED
        if memcmp(p, b"AUTH_RESPONSE", 13) == 0:
            return CMD_AUTH_RESPONSE
    elif n == 11:
        if memcmp(p, b"CANCEL_TASK", 11) == 0:
            return CMD_CANCEL_TASK
    return CMD_UNKNOWN


cdef inline const char* _next_space(const char* p, const char* end) noexcept nogil:
    return <const char*>memchr(p, b' ', end - p)


# --- row JSON ---------------------------------------------------------------------


# Most rows are small arrays of ASCII strings, small ints, null and booleans.
# _fast_json decodes exactly that subset straight from the line's bytes; on
# anything else (floats, escapes, non-ASCII, whitespace, errors) it gives up
# and orjson decodes the row, so results never differ from orjson's.
cdef object _GIVE_UP = object()


cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    void _list_set_item "PyList_SET_ITEM"(object lst, Py_ssize_t i, PyObject* item)

# Short strings repeat across rows (event types, room and user IDs, cache
# names): reuse one str object per recent value instead of allocating each time.
cdef enum:
    _STR_CACHE_SIZE = 1024
    _STR_CACHE_MAX = 48
cdef PyObject* _str_cache[_STR_CACHE_SIZE]


cdef inline object _new_ascii(const char* p, Py_ssize_t n):
    cdef object text = PyUnicode_New(n, 127)
    memcpy(PyUnicode_DATA(text), p, n)
    return text


@cython.boundscheck(False)
@cython.wraparound(False)
cdef object _ascii(const char* p, Py_ssize_t n):
    """A str of ASCII bytes ``p[:n]``, shared with the last equal one when short."""
    cdef uint64_t h
    cdef PyObject* cached
    cdef object text
    if n > _STR_CACHE_MAX:
        return _new_ascii(p, n)
    h = _short_hash(p, n) & (_STR_CACHE_SIZE - 1)
    cached = _str_cache[h]
    if cached is not NULL and PyUnicode_GET_LENGTH(<object>cached) == n and \
            memcmp(PyUnicode_DATA(<object>cached), p, n) == 0:
        return <object>cached
    text = _new_ascii(p, n)
    Py_XDECREF(_str_cache[h])
    Py_INCREF(text)
    _str_cache[h] = <PyObject*>text
    return text


cdef list _list_from(PyObject** items, Py_ssize_t count):
    """A list that takes over the references in ``items[:count]``."""
    cdef list result = PyList_New(count)
    cdef Py_ssize_t i
    for i in range(count):
        _list_set_item(result, i, items[i])
    return result


cdef object _fast_array(const char** cursor, const char* end, int depth):
    # Items wait on the C stack so the list is allocated once at its final size.
    cdef const char* p = cursor[0] + 1
    cdef PyObject* stack[16]
    cdef Py_ssize_t count = 0
    cdef Py_ssize_t i
    cdef list items = None
    cdef object item
    if p < end and p[0] == c']':
        cursor[0] = p + 1
        return []
    try:
        while True:
            item = _fast_value(&p, end, depth + 1)
            if item is _GIVE_UP:
                return _GIVE_UP
            if items is not None:
                PyList_Append(items, item)
            elif count < 16:
                Py_INCREF(item)
                stack[count] = <PyObject*>item
                count += 1
            else:
                items = _list_from(stack, count)
                count = 0
                PyList_Append(items, item)
            if p >= end:
                return _GIVE_UP
            if p[0] == c',':
                p += 1
            elif p[0] == c']':
                if items is None:
                    items = _list_from(stack, count)
                    count = 0
                cursor[0] = p + 1
                return items
            else:
                return _GIVE_UP
    finally:
        for i in range(count):
            Py_XDECREF(stack[i])


@cython.boundscheck(False)
@cython.wraparound(False)
cdef object _fast_value(const char** cursor, const char* end, int depth):
    # Decodes exactly what compactjson.skip_value skips (validate_rows relies on it).
    cdef const char* p = cursor[0]
    cdef const char* start
    cdef unsigned char c
    cdef bint negative
    cdef long long number
    cdef int digits
    cdef list items
    cdef dict mapping
    cdef object item
    cdef object key
    if p >= end or depth > MAX_JSON_DEPTH:
        return _GIVE_UP
    c = <unsigned char>p[0]
    if c == c'"':
        p += 1
        start = p
        while p < end:
            c = <unsigned char>p[0]
            if c == c'"':
                break
            if c == c'\\' or c < 0x20 or c >= 0x80:
                return _GIVE_UP
            p += 1
        if p >= end:
            return _GIVE_UP
        cursor[0] = p + 1
        return _ascii(start, p - start)
    if c == c'[':
        return _fast_array(cursor, end, depth)
    if c == c'n':
        if end - p >= 4 and memcmp(p, b"null", 4) == 0:
            cursor[0] = p + 4
            return None
        return _GIVE_UP
    if c == c't':
        if end - p >= 4 and memcmp(p, b"true", 4) == 0:
            cursor[0] = p + 4
            return True
        return _GIVE_UP
    if c == c'f':
        if end - p >= 5 and memcmp(p, b"false", 5) == 0:
            cursor[0] = p + 5
            return False
        return _GIVE_UP
    if c == c'-' or (c'0' <= c <= c'9'):
        negative = c == c'-'
        if negative:
            p += 1
        start = p
        number = 0
        while p < end and c'0' <= p[0] <= c'9':
            number = number * 10 + (p[0] - c'0')
            p += 1
            if p - start > 18:
                return _GIVE_UP
        digits = p - start
        if digits == 0 or (digits > 1 and start[0] == c'0'):
            return _GIVE_UP
        if p < end and (p[0] == c'.' or p[0] == c'e' or p[0] == c'E'):
            return _GIVE_UP
        cursor[0] = p
        return -number if negative else number
    if c == c'{':
        p += 1
        mapping = {}
        if p < end and p[0] == c'}':
            cursor[0] = p + 1
            return mapping
        while True:
            if p >= end or p[0] != c'"':
                return _GIVE_UP
            key = _fast_value(&p, end, depth + 1)
            if key is _GIVE_UP or p >= end or p[0] != c':':
                return _GIVE_UP
            p += 1
            item = _fast_value(&p, end, depth + 1)
            if item is _GIVE_UP:
                return _GIVE_UP
            mapping[key] = item
            if p >= end:
                return _GIVE_UP
            if p[0] == c',':
                p += 1
            elif p[0] == c'}':
                cursor[0] = p + 1
                return mapping
            else:
                return _GIVE_UP
    return _GIVE_UP


cdef object _fast_json(const char* p, Py_ssize_t n):
    """The JSON value of ``p[:n]``, or _GIVE_UP when orjson must decide."""
    cdef const char* cursor = p
    cdef object value = _fast_value(&cursor, p + n, 0)
    if value is _GIVE_UP or cursor != p + n:
        return _GIVE_UP
    return value



cdef int _check_finite(object value, int depth) except -1:
    cdef object item
    if depth > 256:
        # orjson refuses such depth anyway; let it report the error.
        return 0
    if type(value) is float:
        if not isfinite(<double>value):
            raise ValueError("JSON cannot carry NaN or Infinity")
    elif type(value) is list or type(value) is tuple:
        for item in value:
            if type(item) is not str and type(item) is not int:
                _check_finite(item, depth + 1)
    elif type(value) is dict:
        for item in (<dict>value).values():
            if type(item) is not str and type(item) is not int:
                _check_finite(item, depth + 1)
    elif isinstance(value, (float, list, tuple, dict)):
        _ref._check_finite(value)
    return 0


# The other direction: rows built from ASCII strings without escapes, ints of
# 64 bits, None, booleans, lists, tuples and str-keyed dicts are written
# straight into a scratch buffer; anything else (floats, escapes, non-ASCII,
# subclasses) goes to orjson through encode_row, so the bytes are the same.
cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL

cdef char* _scratch = NULL
cdef Py_ssize_t _scratch_len = 0
cdef Py_ssize_t _scratch_cap = 0


cdef int _reserve_scratch(Py_ssize_t extra) except -1:
    global _scratch, _scratch_cap
    cdef Py_ssize_t need = _scratch_len + extra
    cdef Py_ssize_t cap
    cdef char* grown
    if need <= _scratch_cap:
        return 0
    cap = max(need, 2 * _scratch_cap, 1024)
    grown = <char*>PyMem_Realloc(_scratch, cap)
    if grown is NULL:
        raise MemoryError()
    _scratch = grown
    _scratch_cap = cap
    return 0


cdef inline void _release_scratch() noexcept:
    # Keep the buffer for the next line, unless one huge row made it large.
    global _scratch, _scratch_len, _scratch_cap
    _scratch_len = 0
    if _scratch_cap > (1 << 20):
        PyMem_Free(_scratch)
        _scratch = NULL
        _scratch_cap = 0


cdef inline int _put(const char* p, Py_ssize_t n) except -1:
    global _scratch_len
    _reserve_scratch(n)
    memcpy(_scratch + _scratch_len, p, n)
    _scratch_len += n
    return 0


cdef inline int _put_char(char c) except -1:
    global _scratch_len
    _reserve_scratch(1)
    _scratch[_scratch_len] = c
    _scratch_len += 1
    return 0


cdef int _put_int(long long value) except -1:
    cdef char digits[24]
    cdef int i = 24
    cdef unsigned long long magnitude = <unsigned long long>value
    if value < 0:
        magnitude = 0 - magnitude
    while True:
        i -= 1
        digits[i] = <char>(48 + magnitude % 10)
        magnitude //= 10
        if magnitude == 0:
            break
    if value < 0:
        i -= 1
        digits[i] = c'-'
    return _put(digits + i, 24 - i)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _put_str(object text) except -1:
    """Write a JSON string; 1 when the string needs escapes (give up)."""
    cdef const unsigned char* data
    cdef Py_ssize_t n, i
    cdef unsigned char c
    if not PyUnicode_IS_ASCII(text):
        return 1
    data = <const unsigned char*>PyUnicode_DATA(text)
    n = PyUnicode_GET_LENGTH(text)
    for i in range(n):
        c = data[i]
        if c < 0x20 or c == c'"' or c == c'\\':
            return 1
    _put_char(c'"')
    _put(<const char*>data, n)
    _put_char(c'"')
    return 0


cdef int _put_value(object value, int depth) except -1:
    """Write *value* as JSON; 1 when orjson must do it (give up)."""
    cdef object kind = type(value)
    cdef int overflow = 0
    cdef long long number
    cdef Py_ssize_t i, n
    cdef bint first
    if depth > 32:
        return 1
    if kind is str:
        return _put_str(value)
    if value is None:
        return _put(b"null", 4)
    if value is True:
        return _put(b"true", 4)
    if value is False:
        return _put(b"false", 5)
    if kind is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return 1
        return _put_int(number)
    if kind is list or kind is tuple:
        _put_char(c'[')
        n = len(value)
        for i in range(n):
            if i:
                _put_char(c',')
            if _put_value(value[i], depth + 1):
                return 1
        return _put_char(c']')
    if kind is dict:
        _put_char(c'{')
        first = True
        for key, item in (<dict>value).items():
            if type(key) is not str:
                return 1
            if not first:
                _put_char(c',')
            first = False
            if _put_str(key):
                return 1
            _put_char(c':')
            if _put_value(item, depth + 1):
                return 1
        return _put_char(c'}')
    return 1


cpdef bytes encode_row(object row):
    """Serialise *row* as the protocol's JSON: compact, ASCII-escaped, finite.

    Raises :class:`ValueError` for NaN or Infinity and :class:`TypeError` for
    values JSON cannot carry.
    """
    cdef bytes raw
    _check_finite(row, 0)
    raw = _dumps(row)
    if _is_ascii(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw)):
        return raw
    return raw.decode("utf-8").encode("ascii", "streamrep.json_ascii")


# --- commands ---------------------------------------------------------------------


cdef int64_t _checked_int64(object value, str field) except? -1:
    """A 64-bit int field; other values get the pure twin's error."""
    cdef int overflow = 0
    cdef long long number
    if type(value) is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow:
            return number
    return _int64(value, field)


cdef const char* _checked_word(object value, str field, Py_ssize_t* size) except NULL:
    """UTF-8 of a word (non-empty str without spaces or newlines); else the pure error."""
    cdef const char* utf8
    if not isinstance(value, str):
        _word(value, field)
        raise TypeError(f"{field} must be a str")
    utf8 = PyUnicode_AsUTF8AndSize(value, size)
    if size[0] == 0 or memchr(utf8, c' ', size[0]) is not NULL or memchr(utf8, c'\n', size[0]) is not NULL:
        _word(value, field)
        raise ValueError(f"invalid {field}")
    return utf8


@cython.freelist(1024)
cdef class Command:
    """A line of the replication protocol.

    Commands are immutable. ``to_bytes()`` is the line as sent or received (no
    newline); two commands are equal when their lines are.
    """

    cdef bytes _line

    NAME = ""
    FIELDS = ()

    def to_bytes(self):
        """The whole line as UTF-8 bytes, name included, without the newline."""
        return self._line

    def to_line(self):
        """The whole line as text, name included, without the newline."""
        return self._line.decode("utf-8")

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._line == (<Command>other)._line

    def __ne__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._line != (<Command>other)._line

    def __hash__(self):
        return hash(self._line)

    def __repr__(self):
        fields = ", ".join([f"{f}={getattr(self, f)!r}" for f in self.FIELDS])
        return f"{type(self).__name__}({fields})"


cdef bytes _join(bytes name, tuple args):
    if not args:
        return name
    return name + b" " + " ".join(args).encode("utf-8")


cdef class _TextCommand(Command):
    """A command whose arguments are the rest of the line, as one string."""

    cdef readonly str data

    FIELDS = ("data",)

    def __init__(self, str data):
        global _scratch_len
        cdef Py_ssize_t size
        cdef const char* utf8
        cdef bytes name = self.NAME.encode()
        if data is None:
            _text(data, "data")
        utf8 = PyUnicode_AsUTF8AndSize(data, &size)
        if memchr(utf8, c'\n', size) is not NULL:
            _text(data, "data")
        self.data = data
        if size == 0:
            self._line = name
            return
        _scratch_len = 0
        _put(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name))
        _put_char(c' ')
        _put(utf8, size)
        self._line = PyBytes_FromStringAndSize(_scratch, _scratch_len)
        _release_scratch()


cdef class ServerCommand(_TextCommand):
    """``SERVER <server_name>``: the server says who it is (server to client)."""

    NAME = "SERVER"


cdef class ErrorCommand(_TextCommand):
    """``ERROR <message>``: the sender hit an error and usually closes (both ways)."""

    NAME = "ERROR"


cdef class PingCommand(_TextCommand):
    """``PING <data>``: keep-alive, usually a timestamp in ms (both ways)."""

    NAME = "PING"


cdef class NameCommand(_TextCommand):
    """``NAME <name>``: the client's human-friendly name (client to server)."""

    NAME = "NAME"


cdef class RemoteServerUpCommand(_TextCommand):
    """``REMOTE_SERVER_UP <server_name>``: a remote server may be back online."""

    NAME = "REMOTE_SERVER_UP"


cdef class NewActiveTaskCommand(_TextCommand):
    """``NEW_ACTIVE_TASK <task_id>``: a scheduled task became active."""

    NAME = "NEW_ACTIVE_TASK"


cdef class CancelTaskCommand(_TextCommand):
    """``CANCEL_TASK <task_id>``: cancel a running scheduled task."""

    NAME = "CANCEL_TASK"


cdef class ClearUserSyncCommand(_TextCommand):
    """``CLEAR_USER_SYNC <instance_id>``: forget a worker's user syncs (it is stopping)."""

    NAME = "CLEAR_USER_SYNC"
    FIELDS = ("instance_id",)

    def __init__(self, str instance_id):
        _TextCommand.__init__(self, instance_id)

    @property
    def instance_id(self):
        """The worker whose syncs to clear (the whole argument string)."""
        return self.data


# Decoded rows are JSON values and cannot refer back to their command, so RDATA
# commands stay out of the cyclic GC: a chunk's hundreds of commands do not
# trigger collections on their own.
@cython.no_gc
cdef class RdataCommand(Command):
    """``RDATA <stream_name> <instance_name> <token|batch> <row_json>``: one stream row.

    ``token`` is None for ``batch`` (more rows with the same token follow). The
    row stays raw JSON (``row_json``) until ``row`` is first read, so routing
    by ``stream_name`` costs no JSON decoding.
    """

    cdef readonly str stream_name
    cdef readonly str instance_name
    cdef int64_t _token
    cdef bint _batch
    cdef Py_ssize_t _row_start
    cdef object _row

    NAME = "RDATA"
    FIELDS = ("stream_name", "instance_name", "token", "row")

    def __init__(self, str stream_name, str instance_name, object token,
                 object row=_MISSING, *, object row_json=None):
        global _scratch_len
        cdef const char* stream_utf8
        cdef const char* instance_utf8
        cdef Py_ssize_t stream_len, instance_len, head_len
        stream_utf8 = _checked_word(stream_name, "stream_name", &stream_len)
        instance_utf8 = _checked_word(instance_name, "instance_name", &instance_len)
        self.stream_name = stream_name
        self.instance_name = instance_name
        if token is None:
            self._batch = True
            self._token = 0
        else:
            self._batch = False
            self._token = _checked_int64(token, "token")
        # Head then row, assembled in the scratch buffer and copied out once.
        _scratch_len = 0
        _put(b"RDATA ", 6)
        _put(stream_utf8, stream_len)
        _put_char(c' ')
        _put(instance_utf8, instance_len)
        _put_char(c' ')
        if self._batch:
            _put(b"batch", 5)
        else:
            _put_int(self._token)
        _put_char(c' ')
        head_len = _scratch_len
        if row_json is None:
            if row is _MISSING:
                raise TypeError("RdataCommand needs row or row_json")
            if _put_value(row, 0):
                _scratch_len = head_len
                row_json = encode_row(row)
                _put(PyBytes_AS_STRING(row_json), PyBytes_GET_SIZE(row_json))
            self._row = row
        else:
            if row is not _MISSING:
                raise TypeError("RdataCommand takes row or row_json, not both")
            row_json = bytes(row_json)
            if not row_json or b"\n" in row_json:
                raise ValueError("row_json must be non-empty without newlines")
            row_json.decode("utf-8")
            _put(PyBytes_AS_STRING(row_json), PyBytes_GET_SIZE(row_json))
            self._row = _MISSING
        self._row_start = head_len
        self._line = PyBytes_FromStringAndSize(_scratch, _scratch_len)
        _release_scratch()

    @property
    def token(self):
        """The row's stream token, or None for ``batch``."""
        return None if self._batch else self._token

    @property
    def row_json(self):
        """The row's JSON exactly as on the wire."""
        return self._line[self._row_start:]

    @property
    def row(self):
        """The decoded row (decoded on first access; MalformedCommandError if invalid)."""
        if self._row is _MISSING:
            self._row = self._decode_row()
        return self._row

    cdef object _decode_row(self):
        cdef object value = _fast_json(
            PyBytes_AS_STRING(self._line) + self._row_start,
            PyBytes_GET_SIZE(self._line) - self._row_start,
        )
        if value is not _GIVE_UP:
            return value
        cdef object view = PyMemoryView_FromMemory(
            PyBytes_AS_STRING(self._line) + self._row_start,
            PyBytes_GET_SIZE(self._line) - self._row_start,
            PyBUF_READ,
        )
        try:
            return _loads(view)
        except _JSONDecodeError:
            return _decode_json(self.row_json, "RDATA row")

    def __repr__(self):
        return (
            f"RdataCommand(stream_name={self.stream_name!r}, "
            f"instance_name={self.instance_name!r}, token={self.token!r}, "
            f"row_json={self.row_json!r})"
        )


cdef class PositionCommand(Command):
    """``POSITION <stream_name> <instance_name> <prev_token> <new_token>`` (server to client).

    The writer's stream advanced from ``prev_token`` to ``new_token``; a client
    fetches out of band only if it is behind ``prev_token``.
    """

    cdef readonly str stream_name
    cdef readonly str instance_name
    cdef int64_t _prev_token
    cdef int64_t _new_token

    NAME = "POSITION"
    FIELDS = ("stream_name", "instance_name", "prev_token", "new_token")

    def __init__(self, str stream_name, str instance_name, object prev_token, object new_token):
        global _scratch_len
        cdef Py_ssize_t stream_len, instance_len
        cdef const char* stream_utf8 = _checked_word(stream_name, "stream_name", &stream_len)
        cdef const char* instance_utf8 = _checked_word(instance_name, "instance_name", &instance_len)
        self.stream_name = stream_name
        self.instance_name = instance_name
        self._prev_token = _checked_int64(prev_token, "prev_token")
        self._new_token = _checked_int64(new_token, "new_token")
        _scratch_len = 0
        _put(b"POSITION ", 9)
        _put(stream_utf8, stream_len)
        _put_char(c' ')
        _put(instance_utf8, instance_len)
        _put_char(c' ')
        _put_int(self._prev_token)
        _put_char(c' ')
        _put_int(self._new_token)
        self._line = PyBytes_FromStringAndSize(_scratch, _scratch_len)
        _release_scratch()

    @property
    def prev_token(self):
        """The position sent before this one."""
        return self._prev_token

    @property
    def new_token(self):
        """The writer's current position."""
        return self._new_token


cdef class ReplicateCommand(Command):
    """``REPLICATE`` asks for every stream's position (client to server).

    The legacy form ``REPLICATE <stream_name|ALL> <token|NOW>`` subscribes from a
    token: ``stream_name`` is the stream (or ``"ALL"``) and ``token`` is None for
    ``NOW``. In the current form both are None.
    """

    cdef readonly object stream_name
    cdef readonly object token

    NAME = "REPLICATE"
    FIELDS = ("stream_name", "token")

    def __init__(self, stream_name=None, token=None):
        if stream_name is None:
            if token is not None:
                raise ValueError("a REPLICATE token needs a stream_name")
            self._line = b"REPLICATE"
        else:
            _word(stream_name, "stream_name")
            if token is not None:
                _int64(token, "token")
            self._line = _join(b"REPLICATE", (stream_name, "NOW" if token is None else str(token)))
        self.stream_name = stream_name
        self.token = token

    @property
    def all_streams(self):
        """True when every stream is asked for (current form, or legacy ``ALL``)."""
        return self.stream_name is None or self.stream_name == "ALL"


cdef class UserSyncCommand(Command):
    """``USER_SYNC <instance_id> <user_id> <device_id|None> <start|end> <last_sync_ms>``.

    A user started or stopped syncing on a worker (client to server).
    """

    cdef readonly str instance_id
    cdef readonly str user_id
    cdef readonly object device_id
    cdef readonly bint is_syncing
    cdef readonly int64_t last_sync_ms

    NAME = "USER_SYNC"
    FIELDS = ("instance_id", "user_id", "device_id", "is_syncing", "last_sync_ms")

    def __init__(self, str instance_id, str user_id, device_id, is_syncing, last_sync_ms):
        self.instance_id = _word(instance_id, "instance_id")
        self.user_id = _word(user_id, "user_id")
        self.device_id = None if device_id is None else _word(device_id, "device_id")
        self.is_syncing = bool(is_syncing)
        self.last_sync_ms = _int64(last_sync_ms, "last_sync_ms")
        self._line = _join(b"USER_SYNC", (
            instance_id,
            user_id,
            "None" if device_id is None else device_id,
            "start" if is_syncing else "end",
            str(self.last_sync_ms),
        ))


cdef class FederationAckCommand(Command):
    """``FEDERATION_ACK <instance_name> <token>``: federation data received up to a token."""

    cdef readonly str instance_name
    cdef readonly int64_t token

    NAME = "FEDERATION_ACK"
    FIELDS = ("instance_name", "token")

    def __init__(self, str instance_name, token):
        self.instance_name = _word(instance_name, "instance_name")
        self.token = _int64(token, "token")
        self._line = _join(b"FEDERATION_ACK", (instance_name, str(self.token)))


cdef class UserIpCommand(Command):
    """``USER_IP <user_id> <[access_token, ip, user_agent, device_id, last_seen]>``.

    A worker saw a user's client (client to server).
    """

    cdef readonly str user_id
    cdef readonly str access_token
    cdef readonly str ip
    cdef readonly str user_agent
    cdef readonly object device_id
    cdef readonly int64_t last_seen

    NAME = "USER_IP"
    FIELDS = ("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen")

    def __init__(self, str user_id, access_token, ip, user_agent, device_id, last_seen):
        self.user_id = _word(user_id, "user_id")
        self.access_token = _str(access_token, "access_token")
        self.ip = _str(ip, "ip")
        self.user_agent = _str(user_agent, "user_agent")
        self.device_id = None if device_id is None else _str(device_id, "device_id")
        self.last_seen = _int64(last_seen, "last_seen")
        payload = encode_row([access_token, ip, user_agent, device_id, last_seen])
        self._line = b"USER_IP " + user_id.encode("utf-8") + b" " + payload


cdef class LockReleasedCommand(Command):
    """``LOCK_RELEASED <[instance_name, lock_name, lock_key]>``: a named lock was released."""

    cdef readonly str instance_name
    cdef readonly str lock_name
    cdef readonly str lock_key

    NAME = "LOCK_RELEASED"
    FIELDS = ("instance_name", "lock_name", "lock_key")

    def __init__(self, instance_name, lock_name, lock_key):
        self.instance_name = _str(instance_name, "instance_name")
        self.lock_name = _str(lock_name, "lock_name")
        self.lock_key = _str(lock_key, "lock_key")
        self._line = b"LOCK_RELEASED " + encode_row([instance_name, lock_name, lock_key])


cdef class AuthChallengeCommand(Command):
    """``AUTH_CHALLENGE <nonce>``: the hub asks for proof of the shared secret
    (server to client, before ``NAME``)."""

    cdef readonly str nonce

    NAME = "AUTH_CHALLENGE"
    FIELDS = ("nonce",)

    def __init__(self, str nonce):
        self.nonce = _word(nonce, "nonce")
        self._line = _join(b"AUTH_CHALLENGE", (nonce,))


cdef class AuthResponseCommand(Command):
    """``AUTH_RESPONSE <instance_name> <nonce> <proof>``: the instance a peer speaks
    for, its nonce and its proof of the shared secret (client to server)."""

    cdef readonly str instance_name
    cdef readonly str nonce
    cdef readonly str proof

    NAME = "AUTH_RESPONSE"
    FIELDS = ("instance_name", "nonce", "proof")

    def __init__(self, str instance_name, str nonce, str proof):
        self.instance_name = _word(instance_name, "instance_name")
        self.nonce = _word(nonce, "nonce")
        self.proof = _word(proof, "proof")
        self._line = _join(b"AUTH_RESPONSE", (instance_name, nonce, proof))


cdef class AuthOkCommand(Command):
    """``AUTH_OK <proof>``: the hub accepted the peer's proof and proves it holds the
    shared secret too (server to client)."""

    cdef readonly str proof

    NAME = "AUTH_OK"
    FIELDS = ("proof",)

    def __init__(self, str proof):
        self.proof = _word(proof, "proof")
        self._line = _join(b"AUTH_OK", (proof,))


#: Every command class by its wire name, in the declared order
#: (streamrep.wire_commands.COMMAND_SET; a class that drifts fails at import).
COMMANDS = command_table((
    ServerCommand,
    RdataCommand,
    PositionCommand,
    ErrorCommand,
    PingCommand,
    NameCommand,
    ReplicateCommand,
    UserSyncCommand,
    ClearUserSyncCommand,
    FederationAckCommand,
    UserIpCommand,
    RemoteServerUpCommand,
    LockReleasedCommand,
    NewActiveTaskCommand,
    CancelTaskCommand,
    AuthChallengeCommand,
    AuthResponseCommand,
    AuthOkCommand,
))


# --- parsing ----------------------------------------------------------------------


cdef inline bytes _line_bytes(object line_obj, const char* p, Py_ssize_t n):
    # Reuse the caller's bytes object when it is exactly the line.
    if line_obj is not None:
        return <bytes>line_obj
    return PyBytes_FromStringAndSize(p, n)


cdef object _text_command(CommandKind kind, bytes line, const char* a, const char* end):
    cdef _TextCommand cmd
    if kind == CMD_PING:
        cmd = PingCommand.__new__(PingCommand)
    elif kind == CMD_SERVER:
        cmd = ServerCommand.__new__(ServerCommand)
    elif kind == CMD_ERROR:
        cmd = ErrorCommand.__new__(ErrorCommand)
    elif kind == CMD_NAME:
        cmd = NameCommand.__new__(NameCommand)
    elif kind == CMD_REMOTE_SERVER_UP:
        cmd = RemoteServerUpCommand.__new__(RemoteServerUpCommand)
    elif kind == CMD_NEW_ACTIVE_TASK:
        cmd = NewActiveTaskCommand.__new__(NewActiveTaskCommand)
    elif kind == CMD_CANCEL_TASK:
        cmd = CancelTaskCommand.__new__(CancelTaskCommand)
    else:
        cmd = ClearUserSyncCommand.__new__(ClearUserSyncCommand)
    cmd._line = line
    cmd.data = _decode(a, end - a)
    return cmd


# Each command's line after its name (``a`` to ``end``) is parsed by one helper;
# a helper returns None when the line is rejected, and the pure twin explains why.


cdef inline object _parse_rdata(const char* p, Py_ssize_t n, object line_obj,
                                const char* a, const char* end):
    cdef const char* s1
    cdef const char* s2
    cdef const char* s3
    cdef int64_t token
    cdef RdataCommand rdata
    s1 = _next_space(a, end)
    if s1 is NULL or s1 == a:
        return None
    s2 = _next_space(s1 + 1, end)
    if s2 is NULL or s2 == s1 + 1:
        return None
    s3 = _next_space(s2 + 1, end)
    if s3 is NULL or s3 == s2 + 1 or s3 + 1 == end:
        return None
    rdata = RdataCommand.__new__(RdataCommand)
    if _same(s2 + 1, s3 - s2 - 1, b"batch", 5):
        rdata._batch = True
        rdata._token = 0
    elif _parse_int(s2 + 1, s3 - s2 - 1, &token):
        rdata._batch = False
        rdata._token = token
    else:
        return None
    rdata._line = _line_bytes(line_obj, p, n)
    rdata.stream_name = _name(a, s1 - a)
    rdata.instance_name = _name(s1 + 1, s2 - s1 - 1)
    rdata._row_start = s3 + 1 - p
    rdata._row = _MISSING
    return rdata


cdef inline object _parse_position(const char* p, Py_ssize_t n, object line_obj,
                                   const char* a, const char* end):
    cdef const char* s1
    cdef const char* s2
    cdef const char* s3
    cdef int64_t prev_token, new_token
    cdef PositionCommand position
    s1 = _next_space(a, end)
    if s1 is NULL or s1 == a:
        return None
    s2 = _next_space(s1 + 1, end)
    if s2 is NULL or s2 == s1 + 1:
        return None
    s3 = _next_space(s2 + 1, end)
    if s3 is NULL or s3 == s2 + 1:
        return None
    if not _parse_int(s2 + 1, s3 - s2 - 1, &prev_token) or \
            not _parse_int(s3 + 1, end - s3 - 1, &new_token):
        return None
    position = PositionCommand.__new__(PositionCommand)
    position._line = _line_bytes(line_obj, p, n)
    position.stream_name = _name(a, s1 - a)
    position.instance_name = _name(s1 + 1, s2 - s1 - 1)
    position._prev_token = prev_token
    position._new_token = new_token
    return position


cdef object _parse_replicate(const char* p, Py_ssize_t n, object line_obj,
                             const char* a, const char* end):
    cdef const char* s1
    cdef int64_t token
    cdef ReplicateCommand replicate = ReplicateCommand.__new__(ReplicateCommand)
    if a == end:
        replicate.stream_name = None
        replicate.token = None
    else:
        s1 = _next_space(a, end)
        if s1 is NULL or s1 == a or _next_space(s1 + 1, end) is not NULL:
            return None
        if _same(s1 + 1, end - s1 - 1, b"NOW", 3):
            replicate.token = None
        elif _parse_int(s1 + 1, end - s1 - 1, &token):
            replicate.token = token
        else:
            return None
        replicate.stream_name = _name(a, s1 - a)
    replicate._line = _line_bytes(line_obj, p, n)
    return replicate


cdef object _parse_user_sync(const char* p, Py_ssize_t n, object line_obj,
                             const char* a, const char* end):
    cdef const char* s1
    cdef const char* s2
    cdef const char* s3
    cdef const char* s4
    cdef int64_t last_sync_ms
    cdef bint syncing
    cdef UserSyncCommand user_sync
    s1 = _next_space(a, end)
    if s1 is NULL or s1 == a:
        return None
    s2 = _next_space(s1 + 1, end)
    if s2 is NULL or s2 == s1 + 1:
        return None
    s3 = _next_space(s2 + 1, end)
    if s3 is NULL or s3 == s2 + 1:
        return None
    s4 = _next_space(s3 + 1, end)
    if s4 is NULL or s4 == s3 + 1:
        return None
    if _same(s3 + 1, s4 - s3 - 1, b"start", 5):
        syncing = True
    elif _same(s3 + 1, s4 - s3 - 1, b"end", 3):
        syncing = False
    else:
        return None
    if not _parse_int(s4 + 1, end - s4 - 1, &last_sync_ms):
        return None
    user_sync = UserSyncCommand.__new__(UserSyncCommand)
    user_sync._line = _line_bytes(line_obj, p, n)
    user_sync.instance_id = _name(a, s1 - a)
    user_sync.user_id = _name(s1 + 1, s2 - s1 - 1)
    if _same(s2 + 1, s3 - s2 - 1, b"None", 4):
        user_sync.device_id = None
    else:
        user_sync.device_id = _decode(s2 + 1, s3 - s2 - 1)
    user_sync.is_syncing = syncing
    user_sync.last_sync_ms = last_sync_ms
    return user_sync


cdef object _parse_federation_ack(const char* p, Py_ssize_t n, object line_obj,
                                  const char* a, const char* end):
    cdef int64_t token
    cdef FederationAckCommand fed_ack
    cdef const char* s1 = _next_space(a, end)
    if s1 is NULL or s1 == a or not _parse_int(s1 + 1, end - s1 - 1, &token):
        return None
    fed_ack = FederationAckCommand.__new__(FederationAckCommand)
    fed_ack._line = _line_bytes(line_obj, p, n)
    fed_ack.instance_name = _name(a, s1 - a)
    fed_ack.token = token
    return fed_ack


cdef object _parse_user_ip(const char* p, Py_ssize_t n, object line_obj,
                           const char* a, const char* end):
    cdef object value
    cdef UserIpCommand user_ip
    cdef const char* s1 = _next_space(a, end)
    if s1 is NULL or s1 == a:
        return None
    try:
        value = _loads(PyBytes_FromStringAndSize(s1 + 1, end - s1 - 1))
    except _JSONDecodeError:
        return None
    if (type(value) is not list or len(value) != 5
            or type(value[0]) is not str or type(value[1]) is not str
            or type(value[2]) is not str
            or not (value[3] is None or type(value[3]) is str)
            or type(value[4]) is not int
            or not (-9223372036854775808 <= value[4] <= 9223372036854775807)):
        return None
    user_ip = UserIpCommand.__new__(UserIpCommand)
    user_ip._line = _line_bytes(line_obj, p, n)
    user_ip.user_id = _decode(a, s1 - a)
    user_ip.access_token = value[0]
    user_ip.ip = value[1]
    user_ip.user_agent = value[2]
    user_ip.device_id = value[3]
    user_ip.last_seen = value[4]
    return user_ip


cdef object _parse_lock_released(const char* p, Py_ssize_t n, object line_obj,
                                 const char* a, const char* end):
    cdef object value
    cdef LockReleasedCommand lock
    try:
        value = _loads(PyBytes_FromStringAndSize(a, end - a))
    except _JSONDecodeError:
        return None
    if (type(value) is not list or len(value) != 3 or type(value[0]) is not str
            or type(value[1]) is not str or type(value[2]) is not str):
        return None
    lock = LockReleasedCommand.__new__(LockReleasedCommand)
    lock._line = _line_bytes(line_obj, p, n)
    lock.instance_name = value[0]
    lock.lock_name = value[1]
    lock.lock_key = value[2]
    return lock


cdef inline bint _one_word(const char* a, const char* end) noexcept nogil:
    """Whether ``a`` to ``end`` is one word: non-empty and without a space."""
    return a != end and _next_space(a, end) is NULL


cdef object _parse_auth_challenge(const char* p, Py_ssize_t n, object line_obj,
                                  const char* a, const char* end):
    cdef AuthChallengeCommand challenge
    if not _one_word(a, end):
        return None
    challenge = AuthChallengeCommand.__new__(AuthChallengeCommand)
    challenge._line = _line_bytes(line_obj, p, n)
    challenge.nonce = _decode(a, end - a)
    return challenge


cdef object _parse_auth_ok(const char* p, Py_ssize_t n, object line_obj,
                           const char* a, const char* end):
    cdef AuthOkCommand auth_ok
    if not _one_word(a, end):
        return None
    auth_ok = AuthOkCommand.__new__(AuthOkCommand)
    auth_ok._line = _line_bytes(line_obj, p, n)
    auth_ok.proof = _decode(a, end - a)
    return auth_ok


cdef object _parse_auth_response(const char* p, Py_ssize_t n, object line_obj,
                                 const char* a, const char* end):
    cdef AuthResponseCommand response
    cdef const char* s2
    cdef const char* s1 = _next_space(a, end)
    if s1 is NULL or s1 == a:
        return None
    s2 = _next_space(s1 + 1, end)
    if s2 is NULL or s2 == s1 + 1 or s2 + 1 == end or _next_space(s2 + 1, end) is not NULL:
        return None
    response = AuthResponseCommand.__new__(AuthResponseCommand)
    response._line = _line_bytes(line_obj, p, n)
    response.instance_name = _decode(a, s1 - a)
    response.nonce = _decode(s1 + 1, s2 - s1 - 1)
    response.proof = _decode(s2 + 1, end - s2 - 1)
    return response


cdef object _parse(const char* p, Py_ssize_t n, object line_obj):
    """The command of line ``p[:n]``, or None when the line is rejected.

    ``line_obj`` is the line as a bytes object when the caller has one. The name
    picks the command's kind; the arguments must be UTF-8; then the kind's helper
    parses them.
    """
    cdef const char* end = p + n
    cdef const char* a
    cdef const char* name_end = <const char*>memchr(p, b' ', n)
    cdef CommandKind kind
    if name_end is NULL:
        name_end = end
        a = end
    else:
        a = name_end + 1
    kind = _kind(p, name_end - p)
    if kind == CMD_UNKNOWN:
        return None
    if not _valid_utf8(a, end - a):
        return None
    if kind == CMD_RDATA:
        return _parse_rdata(p, n, line_obj, a, end)
    if kind == CMD_POSITION:
        return _parse_position(p, n, line_obj, a, end)
    if kind == CMD_PING or kind == CMD_SERVER or kind == CMD_ERROR or kind == CMD_NAME \
            or kind == CMD_REMOTE_SERVER_UP or kind == CMD_NEW_ACTIVE_TASK \
            or kind == CMD_CANCEL_TASK or kind == CMD_CLEAR_USER_SYNC:
        return _text_command(kind, _line_bytes(line_obj, p, n), a, end)
    if kind == CMD_REPLICATE:
        return _parse_replicate(p, n, line_obj, a, end)
    if kind == CMD_USER_SYNC:
        return _parse_user_sync(p, n, line_obj, a, end)
    if kind == CMD_FEDERATION_ACK:
        return _parse_federation_ack(p, n, line_obj, a, end)
    if kind == CMD_USER_IP:
        return _parse_user_ip(p, n, line_obj, a, end)
    if kind == CMD_LOCK_RELEASED:
        return _parse_lock_released(p, n, line_obj, a, end)
    if kind == CMD_AUTH_CHALLENGE:
        return _parse_auth_challenge(p, n, line_obj, a, end)
    if kind == CMD_AUTH_OK:
        return _parse_auth_ok(p, n, line_obj, a, end)
    if kind == CMD_AUTH_RESPONSE:
        return _parse_auth_response(p, n, line_obj, a, end)
    return None


def parse_line(line):
    """Parse one line (without its newline) into a command.

    Raises :class:`UnknownCommandError` or :class:`MalformedCommandError`, whose
    messages are fit for an ``ERROR`` line.
    """
    cdef bytes raw
    cdef object command
    if isinstance(line, str):
        try:
            raw = (<str>line).encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedCommandError("line is not valid Unicode") from None
    elif type(line) is bytes:
        raw = <bytes>line
    else:
        raw = bytes(line)
    if memchr(PyBytes_AS_STRING(raw), b'\n', PyBytes_GET_SIZE(raw)) is not NULL:
        raise MalformedCommandError("a line cannot contain a newline")
    command = _parse(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), raw)
    if command is None:
        raise _explain(raw)
    return command


# --- grouping RDATA per fact -------------------------------------------------------


@cython.boundscheck(False)
@cython.wraparound(False)
def encode_rdata_rows(str stream_name, str instance_name, rows):
    """Encode rows ``(token, row_json)`` of one writer, in token order, as ``RDATA``
    lines: ``batch`` for every row but the last of each token.

    The row JSON is taken as it is (the writer's own encoding); it must be
    non-empty and without newlines (ValueError). Tokens are 64-bit ints.
    """
    global _scratch_len
    cdef Py_ssize_t stream_len, instance_len, i, n, size
    cdef const char* stream_utf8 = _checked_word(stream_name, "stream_name", &stream_len)
    cdef const char* instance_utf8 = _checked_word(instance_name, "instance_name", &instance_len)
    cdef int64_t token
    cdef object row, row_json, next_token
    cdef bytes data
    if type(rows) is not list and type(rows) is not tuple:
        rows = list(rows)
    n = len(rows)
    _scratch_len = 0
    try:
        for i in range(n):
            row = rows[i]
            token = _checked_int64(row[0], "token")
            row_json = row[1]
            if type(row_json) is not bytes:
                raise TypeError(f"row_json must be bytes, not {type(row_json).__name__}")
            size = PyBytes_GET_SIZE(row_json)
            if size == 0 or memchr(PyBytes_AS_STRING(row_json), b'\n', size) is not NULL:
                raise ValueError("row_json must be non-empty without newlines")
            _put(b"RDATA ", 6)
            _put(stream_utf8, stream_len)
            _put_char(c' ')
            _put(instance_utf8, instance_len)
            _put_char(c' ')
            if i + 1 < n:
                next_token = rows[i + 1][0]
            if i + 1 == n or next_token != row[0]:
                _put_int(token)
            else:
                _put(b"batch", 5)
            _put_char(c' ')
            _put(PyBytes_AS_STRING(row_json), size)
            _put_char(c'\n')
        data = PyBytes_FromStringAndSize(_scratch, _scratch_len)
    finally:
        _release_scratch()
    return data


@cython.boundscheck(False)
@cython.wraparound(False)
def group_rdata(list commands):
    """Group decoded *commands* for a reader that acts once per fact.

    Returns the commands in order, except that consecutive ``RDATA`` commands of
    one writer are replaced by a tuple ``(stream_name, instance_name, token,
    rdata_commands)``: every command of the run is ``batch`` but the last, whose
    token is *token*. A run that ends in ``batch`` (the fact goes on in a later
    chunk, or another writer's row or another command interrupts it) has the
    token None. Runs are never merged across facts, so each tuple with a token
    is one fact, or the end of one.
    """
    cdef list out = []
    cdef list run = None
    cdef str run_stream = None
    cdef str run_instance = None
    cdef RdataCommand rd
    cdef object command
    for command in commands:
        if type(command) is RdataCommand:
            rd = <RdataCommand>command
            if run is not None and (
                (rd.stream_name is not run_stream and rd.stream_name != run_stream)
                or (rd.instance_name is not run_instance and rd.instance_name != run_instance)
            ):
                PyList_Append(out, (run_stream, run_instance, None, run))
                run = None
            if run is None:
                run = []
                run_stream = rd.stream_name
                run_instance = rd.instance_name
            PyList_Append(run, rd)
            if not rd._batch:
                PyList_Append(out, (run_stream, run_instance, rd._token, run))
                run = None
        else:
            if run is not None:
                PyList_Append(out, (run_stream, run_instance, None, run))
                run = None
            PyList_Append(out, command)
    if run is not None:
        PyList_Append(out, (run_stream, run_instance, None, run))
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def rdata_rows(list commands):
    """The decoded ``row`` of each ``RDATA`` command, in order
    (MalformedCommandError on the first row that is not valid JSON)."""
    cdef list out = []
    cdef RdataCommand rd
    cdef object command
    for command in commands:
        if type(command) is not RdataCommand:
            raise TypeError("rdata_rows takes RDATA commands only")
        rd = <RdataCommand>command
        if rd._row is _MISSING:
            rd._row = rd._decode_row()
        PyList_Append(out, rd._row)
    return out


def validate_rows(list commands):
    """Check that the ``row`` of each ``RDATA`` command is valid JSON, without
    keeping what it decodes to (MalformedCommandError on the first that is not).

    For a relay that forwards the lines as they came: a row in the common compact
    form is checked in place, allocating nothing; any other goes to the decoder,
    which has the last word, so this accepts exactly what ``rdata_rows`` does."""
    cdef RdataCommand rd
    cdef object command
    cdef const char* row
    cdef const char* cursor
    cdef Py_ssize_t size
    for command in commands:
        if type(command) is not RdataCommand:
            raise TypeError("validate_rows takes RDATA commands only")
        rd = <RdataCommand>command
        if rd._row is not _MISSING:
            continue
        row = PyBytes_AS_STRING(rd._line) + rd._row_start
        size = PyBytes_GET_SIZE(rd._line) - rd._row_start
        cursor = row
        if skip_value(&cursor, row + size, 0) and cursor == row + size:
            continue
        rd._row = rd._decode_row()


# --- the incremental decoder ------------------------------------------------------


cdef class Decoder:
    """Turns a byte stream into commands, in chunks of any size.

    ``feed(data)`` returns the commands of every line completed by *data* and
    keeps the partial tail (never more than ``max_line_length`` bytes). Blank
    lines are skipped. A bad line is skipped too; the remaining lines of the
    call are still decoded, and then the first error is raised with every good
    command of the call in ``exc.commands`` and every error in ``exc.errors``.
    The decoder stays usable. An over-long line raises :class:`LineTooLongError`
    as soon as it passes the limit and is dropped up to its newline.
    """

    cdef char* _buf
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _max
    cdef bint _discarding

    def __cinit__(self):
        self._buf = NULL
        self._len = 0
        self._cap = 0
        self._discarding = False

    def __init__(self, max_line_length=DEFAULT_MAX_LINE_LENGTH):
        if not isinstance(max_line_length, int) or isinstance(max_line_length, bool) \
                or max_line_length < 1:
            raise ValueError("max_line_length must be a positive int")
        self._max = max_line_length

    def __dealloc__(self):
        PyMem_Free(self._buf)

    @property
    def max_line_length(self):
        """The longest line accepted, in bytes, without its newline."""
        return self._max

    @property
    def buffered(self):
        """How many bytes of an incomplete line are held."""
        return self._len

    cdef int _reserve(self, Py_ssize_t size) except -1:
        cdef char* grown
        cdef Py_ssize_t cap
        if size <= self._cap:
            return 0
        cap = max(size, 2 * self._cap, 256)
        grown = <char*>PyMem_Realloc(self._buf, cap)
        if grown is NULL:
            raise MemoryError()
        self._buf = grown
        self._cap = cap
        return 0

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int _line(self, const char* p, Py_ssize_t n, list commands, list errors) except -1:
        cdef object command
        if n == 0:
            return 0
        if n > self._max:
            errors.append(_too_long(PyBytes_FromStringAndSize(p, min(n, _PREFIX_LIMIT)), self._max))
            return 0
        command = _parse(p, n, None)
        if command is None:
            errors.append(_explain(PyBytes_FromStringAndSize(p, n)))
        else:
            PyList_Append(commands, command)
        return 0

    def feed(self, data):
        """Decode *data*; return the commands of the lines it completes."""
        cdef Py_buffer view
        cdef const char* p
        cdef const char* end
        cdef const char* newline
        cdef Py_ssize_t tail, head
        cdef list commands = []
        cdef list errors = []
        cdef bytes prefix
        if type(data) is not bytes and type(data) is not bytearray:
            data = bytes(data)  # e.g. a non-contiguous memoryview, as the twin accepts
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            p = <const char*>view.buf
            end = p + view.len
            if self._discarding:
                newline = <const char*>memchr(p, b'\n', end - p)
                if newline is NULL:
                    return commands
                p = newline + 1
                self._discarding = False
            if self._len > 0:
                # Complete the buffered partial line first.
                newline = <const char*>memchr(p, b'\n', end - p)
                head = (end - p) if newline is NULL else (newline - p)
                if self._len + head > self._max:
                    prefix = PyBytes_FromStringAndSize(self._buf, min(self._len, _PREFIX_LIMIT))
                    if PyBytes_GET_SIZE(prefix) < _PREFIX_LIMIT:
                        prefix += PyBytes_FromStringAndSize(
                            p, min(head, _PREFIX_LIMIT - PyBytes_GET_SIZE(prefix)))
                    errors.append(_too_long(prefix, self._max))
                    self._len = 0
                    if newline is NULL:
                        self._discarding = True
                        p = end
                    else:
                        p = newline + 1
                else:
                    self._reserve(self._len + head)
                    memcpy(self._buf + self._len, p, head)
                    self._len += head
                    if newline is NULL:
                        p = end
                    else:
                        p = newline + 1
                        head = self._len
                        self._len = 0
                        self._line(self._buf, head, commands, errors)
            while p < end:
                newline = <const char*>memchr(p, b'\n', end - p)
                if newline is NULL:
                    break
                self._line(p, newline - p, commands, errors)
                p = newline + 1
            tail = end - p
            if tail > self._max:
                errors.append(_too_long(PyBytes_FromStringAndSize(p, min(tail, _PREFIX_LIMIT)), self._max))
                self._discarding = True
            elif tail > 0:
                self._reserve(self._len + tail)
                memcpy(self._buf + self._len, p, tail)
                self._len += tail
        finally:
            PyBuffer_Release(&view)
        if errors:
            _raise_collected(errors, commands)
        return commands


# --- the encoder ------------------------------------------------------------------


cdef class Encoder:
    """Collects commands into one buffer, for one ``sendall`` per batch."""

    cdef char* _buf
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap

    def __cinit__(self):
        self._buf = NULL
        self._len = 0
        self._cap = 0

    def __dealloc__(self):
        PyMem_Free(self._buf)

    cdef int _append(self, Command command) except -1:
        cdef bytes line = command._line
        cdef Py_ssize_t n = PyBytes_GET_SIZE(line)
        cdef Py_ssize_t need = self._len + n + 1
        cdef char* grown
        cdef Py_ssize_t cap
        if need > self._cap:
            cap = max(need, 2 * self._cap, 4096)
            grown = <char*>PyMem_Realloc(self._buf, cap)
            if grown is NULL:
                raise MemoryError()
            self._buf = grown
            self._cap = cap
        memcpy(self._buf + self._len, PyBytes_AS_STRING(line), n)
        self._buf[self._len + n] = b'\n'
        self._len = need
        return 0

    def encode(self, command):
        """Append *command*'s line and its newline."""
        if not isinstance(command, Command):
            raise TypeError(f"cannot encode {type(command).__name__}: not a Command")
        self._append(<Command>command)

    def encode_many(self, commands):
        """Append every command of *commands*, in order."""
        cdef object command
        if type(commands) is list:
            for command in <list>commands:
                if not isinstance(command, Command):
                    raise TypeError(f"cannot encode {type(command).__name__}: not a Command")
                self._append(<Command>command)
        else:
            for command in commands:
                if not isinstance(command, Command):
                    raise TypeError(f"cannot encode {type(command).__name__}: not a Command")
                self._append(<Command>command)

    def __len__(self):
        """How many bytes are buffered."""
        return self._len

    def take(self):
        """Return the buffered bytes and empty the buffer."""
        cdef bytes data = PyBytes_FromStringAndSize(self._buf, self._len)
        self._len = 0
        if self._cap > (1 << 22):
            # Do not hold on to the memory of one exceptional batch.
            PyMem_Free(self._buf)
            self._buf = NULL
            self._cap = 0
        return data
