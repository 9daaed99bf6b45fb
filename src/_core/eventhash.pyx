# cython: language_level=3
"""Redaction, canonical JSON and the hashes of Matrix events, compiled (twin of
``streamrep._pure.eventhash``, whose docstrings define each function).

The usual value (dicts with string keys, lists, strings, integers in range, booleans
and null) is written here, in C, into one buffer that SHA-256 (``sha256.h``) then
hashes; a hash never builds the pruned event or the canonical bytes as Python
objects. Which members of a dict are written, in what order and under what key
JSON is worked out once per shape (the same keys in the same order) and kept in a
small table. Any other value (floats, integers past 64 bits, subclasses, tuples) and
anything refused go to the pure twin, the one definition of what is canonical and
of each error.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Copy, PyDict_GetItem, PyDict_Keys, PyDict_Next
from cpython.dict cimport PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF, Py_XINCREF
from cpython.set cimport PySet_Contains
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.string cimport memcmp, memcpy

from streamrep._pure import eventhash as _ref
from streamrep._pure.eventhash import RedactionRules

__all__ = list(_ref.__all__)

cdef extern from "sha256.h":
    int streamrep_sha256_accelerated()
    void streamrep_sha256_force_portable(int portable)
    void streamrep_sha256(const unsigned char* data, size_t n, unsigned char* out)
    void streamrep_sha256_pair(const unsigned char* a, size_t len_a, unsigned char* out_a,
                               const unsigned char* b, size_t len_b, unsigned char* out_b)

cdef extern from "Python.h":
    ctypedef Py_ssize_t Py_hash_t
    ctypedef struct PyASCIIObject:
        Py_hash_t hash
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL
    bint PyUnicode_IS_COMPACT_ASCII(object text)
    void* PyUnicode_DATA(object text)
    Py_ssize_t PyUnicode_GET_LENGTH(object text)

cdef long long _MAX_SAFE = _ref.MAX_SAFE_INTEGER
cdef frozenset _CONTENT_EXCLUDED = frozenset(_ref.CONTENT_HASH_EXCLUDED)
cdef frozenset _REFERENCE_EXCLUDED = frozenset(_ref.REFERENCE_HASH_EXCLUDED)
# Deeper values go to the pure twin.
cdef int _MAX_DEPTH = 200
# What _write returns when the pure twin must write the value.
cdef int _PURE = 1

cdef const char* _STANDARD = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef const char* _URLSAFE = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
cdef const char* _HEX = b"0123456789abcdef"


cdef struct Buffer:
    char* data
    Py_ssize_t length
    Py_ssize_t capacity


# One buffer for the module, grown as needed: every call runs under the GIL and
# none runs Python code while writing (exact types only), so calls never overlap.
cdef Buffer _buffer = Buffer(NULL, 0, 0)
# The second stream of _both_digests (the reference hash's).
cdef Buffer _buffer2 = Buffer(NULL, 0, 0)


cdef inline int _reserve(Buffer* out, Py_ssize_t more) except -1:
    if out.length + more <= out.capacity:
        return 0
    return _grow(out, more)


cdef int _grow(Buffer* out, Py_ssize_t more) except -1:
    cdef Py_ssize_t wanted = out.length + more
    cdef Py_ssize_t capacity
    cdef char* grown
    capacity = out.capacity * 2 if out.capacity else 4096
    while capacity < wanted:
        capacity *= 2
    grown = <char*>PyMem_Realloc(out.data, capacity)
    if grown is NULL:
        raise MemoryError()
    out.data = grown
    out.capacity = capacity
    return 0


cdef inline int _put(Buffer* out, const char* text, Py_ssize_t n) except -1:
    _reserve(out, n)
    memcpy(out.data + out.length, text, n)
    out.length += n
    return 0


cdef inline int _byte(Buffer* out, char c) except -1:
    if out.length == out.capacity:
        _reserve(out, 1)
    out.data[out.length] = c
    out.length += 1
    return 0


cdef inline bint _plain_word(unsigned long long word):
    """Whether none of the 8 bytes of *word* needs an escape (a control character,
    ``"`` or ``\\``): the usual SWAR tests for a byte below 0x20 and for a zero byte
    after XOR with each of the two."""
    cdef unsigned long long ones = 0x0101010101010101ULL
    cdef unsigned long long highs = 0x8080808080808080ULL
    cdef unsigned long long quote = word ^ (0x22 * ones)
    cdef unsigned long long backslash = word ^ (0x5C * ones)
    cdef unsigned long long found = ((word - 0x20 * ones) | (quote - ones) | (backslash - ones)) \
        & ~(word & highs) & highs
    # A byte at or above 0x80 (UTF-8) never needs an escape; its high bit is masked.
    return found == 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef int _utf8_string(Buffer* out, const unsigned char* p, Py_ssize_t n) except -1:
    """The JSON string of the UTF-8 *p[0:n]*, with the shortest escapes."""
    cdef Py_ssize_t i = 0, start = 0
    cdef unsigned char c
    cdef unsigned long long word
    _reserve(out, n + 2)
    out.data[out.length] = b'"'
    out.length += 1
    while i < n:
        if i + 8 <= n:
            memcpy(&word, p + i, 8)
            if _plain_word(word):
                i += 8
                continue
        c = p[i]
        if c >= 0x20 and c != 0x22 and c != 0x5C:
            i += 1
            continue
        _put(out, <const char*>p + start, i - start)
        i += 1
        start = i
        if c == 0x22:
            _put(out, b'\\"', 2)
        elif c == 0x5C:
            _put(out, b"\\\\", 2)
        elif c == 0x08:
            _put(out, b"\\b", 2)
        elif c == 0x09:
            _put(out, b"\\t", 2)
        elif c == 0x0A:
            _put(out, b"\\n", 2)
        elif c == 0x0C:
            _put(out, b"\\f", 2)
        elif c == 0x0D:
            _put(out, b"\\r", 2)
        else:
            _put(out, b"\\u00", 4)
            _byte(out, _HEX[c >> 4])
            _byte(out, _HEX[c & 15])
    _put(out, <const char*>p + start, n - start)
    _byte(out, b'"')
    return 0


cdef inline const char* _utf8(object text, Py_ssize_t* n) except NULL:
    """The UTF-8 of the str *text* (raises UnicodeEncodeError for a lone surrogate):
    an ASCII string's own characters, read in place."""
    if PyUnicode_IS_COMPACT_ASCII(text):
        n[0] = PyUnicode_GET_LENGTH(text)
        return <const char*>PyUnicode_DATA(text)
    return PyUnicode_AsUTF8AndSize(text, n)


cdef inline int _string(Buffer* out, object text) except -1:
    """A JSON string (raises UnicodeEncodeError for a lone surrogate)."""
    cdef Py_ssize_t n
    cdef const char* p = _utf8(text, &n)
    return _utf8_string(out, <const unsigned char*>p, n)


cdef int _integer(Buffer* out, long long number) except -1:
    cdef char digits[24]
    cdef int i = 24
    cdef unsigned long long rest = <unsigned long long>(-number) if number < 0 else number
    while True:
        i -= 1
        digits[i] = <char>(48 + rest % 10)
        rest //= 10
        if rest == 0:
            break
    if number < 0:
        i -= 1
        digits[i] = b"-"
    return _put(out, digits + i, 24 - i)


# Objects with more members than this sort through a Python list.
DEF _SMALL = 32
# Slots of the table of shapes (a power of two).
DEF _SLOTS = 64

# What a shape's members are chosen for (what its flags mean).
cdef enum:
    _FOR_OBJECT = 1   # _object: by its leave_out and keep sets
    _FOR_DIGESTS = 2  # _both_digests: flags are the hashes a member is in
    _IS_CONTENT = 4   # a flag: the member's key is "content"


cdef struct Shape:
    # The members written of a dict whose keys are these keys (these objects, or
    # str of the same text) in this order, chosen for *purpose* by *chooser_a* and
    # *chooser_b*: their positions in the dict, in key order, each with its flags
    # and its key's JSON.
    int purpose
    int busy                    # being written from: a nested dict may not take it
    size_t seen                 # the fingerprint of the last shape that missed here
    bint held                   # a slot of the table (its references are held)
    PyObject* chooser_a         # leave_out, or the rules' top-level keys
    PyObject* chooser_b         # keep
    Py_ssize_t count
    PyObject* keys[_SMALL]
    Py_ssize_t written
    Py_ssize_t index[_SMALL]
    int flags[_SMALL]
    Py_ssize_t key_end[_SMALL]  # where each written member's '"key":' ends in key_json
    char* key_json              # NULL in a shape on the stack (its keys are written anew)


# Dicts of one shape (the same keys in the same order, as events made by one
# program have) are written alike: which members, in what order, with what keys is
# worked out once and kept here. Keys are the same when they are the same object
# (dict literals, orjson, which reuses its key strings) or ASCII str of the same
# text (json.loads makes them anew). A slot holds references to its keys and
# choosers, so an address never names another object while it is in the table.
cdef Shape _shapes[_SLOTS]


cdef struct Keyed:
    Py_ssize_t index
    int flags
    const char* utf8
    Py_ssize_t length


cdef inline bint _before(Keyed* a, Keyed* b):
    """Whether *a*'s key sorts before *b*'s: UTF-8 byte order is code point order."""
    cdef Py_ssize_t n = a.length if a.length < b.length else b.length
    cdef int order
    if n and a.utf8[0] != b.utf8[0]:
        return <unsigned char>a.utf8[0] < <unsigned char>b.utf8[0]
    order = memcmp(a.utf8, b.utf8, n)
    return order < 0 or (order == 0 and a.length < b.length)


cdef inline size_t _fingerprint(PyObject** keys, Py_ssize_t count, PyObject* a, PyObject* b,
                                int purpose):
    """A hash of a shape's identity (its low bits choose its slot): of its keys' text
    (the hashes a dict's keys keep), so keys made anew find the shape too."""
    cdef size_t mixed = <size_t>(count * 31 + purpose) ^ <size_t>a ^ (<size_t>b << 7)
    cdef Py_ssize_t i
    for i in range(count):
        mixed = (mixed ^ <size_t>_key_hash(keys[i])) * <size_t>0x100000001B3ULL
    return mixed ^ (mixed >> 29)


cdef inline Py_hash_t _key_hash(PyObject* key):
    """The hash a str key keeps (a dict's keys have one); 0 for anything else."""
    if type(<object>key) is not str:
        return 0
    return (<PyASCIIObject*>key).hash


cdef inline bint _same_keys(PyObject** mine, PyObject** theirs, Py_ssize_t count):
    """Whether the str keys *mine* are *theirs*, or the same text."""
    cdef Py_ssize_t i, n, m
    cdef const char* a
    cdef const char* b
    for i in range(count):
        if mine[i] == theirs[i]:
            continue
        if type(<object>mine[i]) is not str or (
                _key_hash(mine[i]) != _key_hash(theirs[i])):
            return False
        if not (PyUnicode_IS_COMPACT_ASCII(<object>mine[i])
                and PyUnicode_IS_COMPACT_ASCII(<object>theirs[i])):
            return False
        n = PyUnicode_GET_LENGTH(<object>mine[i])
        m = PyUnicode_GET_LENGTH(<object>theirs[i])
        a = <const char*>PyUnicode_DATA(<object>mine[i])
        b = <const char*>PyUnicode_DATA(<object>theirs[i])
        if n != m or memcmp(a, b, n) != 0:
            return False
    return True


cdef void _forget(Shape* shape):
    """Empty a slot of the table."""
    cdef Py_ssize_t i
    if shape.held:
        for i in range(shape.count):
            Py_XDECREF(shape.keys[i])
        Py_XDECREF(shape.chooser_a)
        Py_XDECREF(shape.chooser_b)
        PyMem_Free(shape.key_json)
    shape.held = False
    shape.purpose = 0
    shape.count = 0
    shape.key_json = NULL


cdef inline Py_ssize_t _members_of(dict value, PyObject** keys, PyObject** values):
    """Put *value*'s keys and values (at most ``_SMALL``) in *keys* and *values*, in
    its order; return how many."""
    cdef Py_ssize_t pos = 0, count = 0
    while PyDict_Next(value, &pos, &keys[count], &values[count]):
        count += 1
    return count


cdef int _take_shape(PyObject** keys, Py_ssize_t count, int purpose, frozenset a,
                     frozenset b, Shape* scratch, Shape** found) except -1:
    """Set *found* to the shape of a dict of *keys* (in its order) for *purpose*, taken
    (busy) until :func:`_release`: from the table, else worked out into it, or into
    *scratch* (see :func:`_find_shape`); :data:`_PURE` when a key is not a str."""
    found[0] = _find_shape(keys, count, purpose, a, b, scratch)
    if found[0] is NULL:
        return _PURE
    found[0].busy += 1
    return 0


cdef inline void _release(Shape* shape):
    shape.busy -= 1


cdef Shape* _find_shape(PyObject** keys, Py_ssize_t count, int purpose, frozenset a,
                        frozenset b, Shape* scratch) except? NULL:
    """:func:`_take_shape`'s shape, not yet taken; NULL when a key is not a str."""
    cdef PyObject* pa = NULL if a is None else <PyObject*>a
    cdef PyObject* pb = NULL if b is None else <PyObject*>b
    cdef size_t fingerprint = _fingerprint(keys, count, pa, pb, purpose)
    cdef Shape* shape = &_shapes[fingerprint & (_SLOTS - 1)]
    cdef Py_ssize_t i
    if (shape.purpose == purpose and shape.count == count and shape.chooser_a == pa
            and shape.chooser_b == pb
            and _same_keys(keys, shape.keys, count)):
        return shape
    if shape.busy or shape.seen != fingerprint:
        # A shape goes into the table when the last shape to miss at its slot was
        # itself, so shapes met once (a dict of keys of its own) do not take a
        # slot at every call.
        if not shape.busy:
            shape.seen = fingerprint
        shape = scratch
        shape.held = False
        shape.busy = 0
        shape.key_json = NULL
    else:
        _forget(shape)
    if _work_out(shape, keys, count, purpose, a, b, shape is not scratch) == _PURE:
        return NULL
    shape.count = count
    memcpy(shape.keys, keys, count * sizeof(PyObject*))
    shape.chooser_a = pa
    shape.chooser_b = pb
    if shape is not scratch:
        for i in range(count):
            Py_INCREF(<object>keys[i])
        Py_XINCREF(pa)
        Py_XINCREF(pb)
        shape.held = True
    shape.purpose = purpose
    return shape


cdef int _work_out(Shape* shape, PyObject** keys, Py_ssize_t count, int purpose, frozenset a,
                   frozenset b, bint with_json) except -1:
    """Choose and order the members of *shape*, and write their keys' JSON when
    *with_json* (its identity is set by the caller); :data:`_PURE` when a key is not
    a str."""
    cdef Keyed members[_SMALL]
    cdef Keyed member
    cdef Py_ssize_t i, j, written = 0
    cdef dict places = _key_places(a) if purpose == _FOR_DIGESTS else None
    cdef PyObject* place
    cdef Buffer json = Buffer(NULL, 0, 0)
    for i in range(count):
        if type(<object>keys[i]) is not str:
            return _PURE
        member.flags = 0
        if purpose == _FOR_DIGESTS:
            place = PyDict_GetItem(places, <object>keys[i])
            member.flags = _IN_CONTENT_HASH if place is NULL else <int><object>place
            if member.flags == 0:
                continue
        elif (a is not None and PySet_Contains(a, <object>keys[i])) or (
                b is not None and not PySet_Contains(b, <object>keys[i])):
            continue
        member.index = i
        member.utf8 = _utf8(<object>keys[i], &member.length)
        if member.length == 7 and memcmp(member.utf8, b"content", 7) == 0:
            member.flags |= _IS_CONTENT
        # Insertion sort: objects are small.
        j = written
        while j > 0 and _before(&member, &members[j - 1]):
            members[j] = members[j - 1]
            j -= 1
        members[j] = member
        written += 1
    for i in range(written):
        shape.index[i] = members[i].index
        shape.flags[i] = members[i].flags
    shape.written = written
    if not with_json:
        return 0
    try:
        for i in range(written):
            _utf8_string(&json, <const unsigned char*>members[i].utf8, members[i].length)
            _byte(&json, b":")
            shape.key_end[i] = json.length
    except BaseException:
        PyMem_Free(json.data)
        raise
    shape.key_json = json.data
    return 0


cdef inline int _key(Buffer* out, Shape* shape, Py_ssize_t i) except -1:
    """Write the written member *i*'s ``"key":``."""
    cdef Py_ssize_t start
    if shape.key_json is NULL:
        _string(out, <object>shape.keys[shape.index[i]])
        return _byte(out, b":")
    start = shape.key_end[i - 1] if i else 0
    return _put(out, shape.key_json + start, shape.key_end[i] - start)


cdef int _object(Buffer* out, dict value, bint strict, int depth, frozenset leave_out,
                 frozenset keep, dict content) except -1:
    """A JSON object of *value*'s keys, less *leave_out*, only *keep* (when not None),
    with *content* (when not None) for the value of ``content``."""
    cdef PyObject* keys[_SMALL]
    cdef PyObject* values[_SMALL]
    cdef Shape scratch
    cdef Shape* shape
    cdef Py_ssize_t count
    if len(value) > _SMALL:
        return _large_object(out, value, strict, depth, leave_out, keep, content)
    count = _members_of(value, keys, values)
    if _take_shape(keys, count, _FOR_OBJECT, leave_out, keep, &scratch, &shape) == _PURE:
        return _PURE
    try:
        return _members(out, shape, values, strict, depth, content)
    finally:
        _release(shape)


cdef int _members(Buffer* out, Shape* shape, PyObject** values, bint strict, int depth,
                  dict content) except -1:
    """The object of :func:`_object`, its members chosen and ordered by *shape*."""
    cdef Py_ssize_t i
    cdef object item
    _byte(out, b"{")
    for i in range(shape.written):
        if i:
            _byte(out, b",")
        _key(out, shape, i)
        if content is not None and shape.flags[i] & _IS_CONTENT:
            item = content
        else:
            item = <object>values[shape.index[i]]
        if _write(out, item, strict, depth + 1) == _PURE:
            return _PURE
    _byte(out, b"}")
    return 0


cdef int _large_object(Buffer* out, dict value, bint strict, int depth, frozenset leave_out,
                       frozenset keep, dict content) except -1:
    """:func:`_object` for objects of many members."""
    cdef list keys = PyDict_Keys(value)
    cdef bint first = True
    cdef object item
    for key in keys:
        if type(key) is not str:
            return _PURE
    keys.sort()
    _byte(out, b"{")
    for key in keys:
        if (leave_out is not None and PySet_Contains(leave_out, key)) or (
                keep is not None and not PySet_Contains(keep, key)):
            continue
        if not first:
            _byte(out, b",")
        first = False
        _string(out, key)
        _byte(out, b":")
        item = content if content is not None and key == "content" else (
            <object>PyDict_GetItem(value, key))
        if _write(out, item, strict, depth + 1) == _PURE:
            return _PURE
    _byte(out, b"}")
    return 0


cdef int _write(Buffer* out, object value, bint strict, int depth) except -1:
    """Write *value*'s canonical JSON; :data:`_PURE` when the pure twin must."""
    cdef object kind = type(value)
    cdef Py_ssize_t i, n
    cdef long long number
    cdef int overflow = 0
    if kind is str:
        return _string(out, value)
    if value is None:
        return _put(out, b"null", 4)
    if value is True:
        return _put(out, b"true", 4)
    if value is False:
        return _put(out, b"false", 5)
    if depth > _MAX_DEPTH:
        return _PURE
    if kind is dict:
        return _object(out, <dict>value, strict, depth, None, None, None)
    if kind is list:
        _byte(out, b"[")
        n = PyList_GET_SIZE(value)
        for i in range(n):
            if i:
                _byte(out, b",")
            if _write(out, <object>PyList_GET_ITEM(value, i), strict, depth + 1) == _PURE:
                return _PURE
        return _byte(out, b"]")
    if kind is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow or (strict and not -_MAX_SAFE <= number <= _MAX_SAFE):
            return _PURE
        return _integer(out, number)
    return _PURE


cdef bint _start(Buffer* out) except -1:
    out.length = 0
    return True


def canonical_json(value, bint strict=True):
    cdef Buffer* out = &_buffer
    _start(out)
    try:
        if _write(out, value, strict, 0) == _PURE:
            return _ref.canonical_json(value, strict)
    except UnicodeEncodeError:
        return _ref.canonical_json(value, strict)  # names the bad string
    return PyBytes_FromStringAndSize(out.data, out.length)


cdef dict _pruned_content(dict event, object rules):
    """The content redaction leaves (see ``_ref.prune``)."""
    cdef PyObject* found
    cdef object content, etype, kept, value
    cdef dict pruned
    cdef Py_ssize_t pos = 0
    cdef PyObject* key
    cdef PyObject* item
    found = PyDict_GetItem(event, "content")
    content = None if found is NULL else <object>found
    found = PyDict_GetItem(event, "type")
    etype = None if found is NULL else <object>found
    if type(content) is not dict or type(etype) is not str:
        return {}
    found = PyDict_GetItem(rules.content, etype)
    if found is NULL:
        return {}
    kept = <object>found
    if kept is None:
        return PyDict_Copy(content)
    pruned = {}
    while PyDict_Next(content, &pos, &key, &item):
        if PySet_Contains(kept, <object>key):
            PyDict_SetItem(pruned, <object>key, <object>item)
    found = PyDict_GetItem(rules.nested, etype)
    if found is not NULL:
        for name, sub in (<dict>found).items():
            value = content.get(name)
            if isinstance(value, dict):
                pruned[name] = {k: v for k, v in value.items() if k in sub}
    return pruned


cdef dict _prune(dict event, object rules):
    cdef frozenset top = rules.top_level
    cdef dict out = {}
    cdef Py_ssize_t pos = 0
    cdef PyObject* key
    cdef PyObject* item
    while PyDict_Next(event, &pos, &key, &item):
        if PySet_Contains(top, <object>key):
            PyDict_SetItem(out, <object>key, <object>item)
    out["content"] = _pruned_content(event, rules)
    return out


def prune(event, rules):
    if type(event) is not dict or type(rules) is not RedactionRules:
        return _ref.prune(event, rules)
    return _prune(<dict>event, rules)


cdef int _content_digest(dict event, bint strict, unsigned char* digest) except -1:
    """SHA-256 of the content hash's canonical JSON; :data:`_PURE` when the pure
    twin must write it."""
    cdef Buffer* out = &_buffer
    _start(out)
    if _object(out, event, strict, 0, _CONTENT_EXCLUDED, None, None) == _PURE:
        return _PURE
    streamrep_sha256(<const unsigned char*>out.data, out.length, digest)
    return 0


cdef int _reference_digest(dict event, object rules, bint strict,
                           unsigned char* digest) except -1:
    cdef Buffer* out = &_buffer
    cdef frozenset top = rules.top_level
    _start(out)
    if _object(out, event, strict, 0, _REFERENCE_EXCLUDED, top,
               _pruned_content(event, rules)) == _PURE:
        return _PURE
    if PyDict_GetItem(event, "content") is NULL and PySet_Contains(top, "content"):
        return _PURE  # no content to replace: the pruned event gets {}
    streamrep_sha256(<const unsigned char*>out.data, out.length, digest)
    return 0


# What a top-level key is to an event's two hashes (bits; a key not in the
# table of _key_places is in the content hash only).
cdef enum:
    _IN_CONTENT_HASH = 1
    _IN_REFERENCE_HASH = 2

# The table of the top-level keys of the last redaction rules asked about (by
# their frozenset of top-level keys, which cannot change).
cdef frozenset _places_top = None
cdef dict _places = None


cdef dict _key_places(frozenset top):
    """Each key the content hash leaves out or the pruned event keeps, with the
    hashes it is in."""
    global _places_top, _places
    cdef dict places
    if top is _places_top:
        return _places
    places = {}
    for key in _CONTENT_EXCLUDED | top | _REFERENCE_EXCLUDED:
        places[key] = (0 if key in _CONTENT_EXCLUDED else _IN_CONTENT_HASH) | (
            _IN_REFERENCE_HASH if key in top and key not in _REFERENCE_EXCLUDED else 0)
    _places_top = top
    _places = places
    return places


cdef int _pruned_content_json(Buffer* out, dict event, object rules, bint strict,
                              const char* written, Py_ssize_t written_length) except -1:
    """Write the content redaction leaves (``_pruned_content``) without making it:
    *written* is the content's own JSON when it is already written (else NULL);
    :data:`_PURE` when the pure twin must write it."""
    cdef PyObject* found
    cdef object content, etype, kept
    found = PyDict_GetItem(event, "content")
    content = None if found is NULL else <object>found
    found = PyDict_GetItem(event, "type")
    etype = None if found is NULL else <object>found
    if type(content) is not dict or type(etype) is not str:
        return _put(out, b"{}", 2)
    found = PyDict_GetItem(rules.content, etype)
    if found is NULL:
        return _put(out, b"{}", 2)
    kept = <object>found
    if kept is None:
        if written is NULL:
            return _write(out, content, strict, 1)
        return _put(out, written, written_length)
    if type(kept) is not frozenset or PyDict_GetItem(rules.nested, etype) is not NULL:
        return _write(out, _pruned_content(event, rules), strict, 1)
    return _object(out, <dict>content, strict, 1, None, <frozenset>kept, None)


cdef int _both_digests(dict event, object rules, bint strict, unsigned char* content_digest,
                       unsigned char* reference_digest) except -1:
    """The content hash's and the reference hash's SHA-256 in one pass over the
    event's members: a member both cover is written once and copied, and the two
    are hashed together; :data:`_PURE` when the pure twin must write them."""
    cdef PyObject* keys[_SMALL]
    cdef PyObject* values[_SMALL]
    cdef Shape scratch
    cdef Shape* shape
    cdef Py_ssize_t count
    if len(event) > _SMALL:
        return _PURE
    count = _members_of(event, keys, values)
    if _take_shape(keys, count, _FOR_DIGESTS, rules.top_level, None, &scratch,
                   &shape) == _PURE:
        return _PURE
    try:
        if _both_streams(shape, values, event, rules, strict) == _PURE:
            return _PURE
    finally:
        _release(shape)
    streamrep_sha256_pair(<const unsigned char*>_buffer.data, _buffer.length, content_digest,
                          <const unsigned char*>_buffer2.data, _buffer2.length,
                          reference_digest)
    return 0


cdef int _both_streams(Shape* shape, PyObject** values, dict event, object rules,
                       bint strict) except -1:
    """Write the content hash's canonical JSON into ``_buffer`` and the reference
    hash's into ``_buffer2``, members chosen and ordered by *shape*."""
    cdef Buffer* full = &_buffer
    cdef Buffer* pruned = &_buffer2
    cdef Py_ssize_t i, key_start = 0, start = 0
    cdef int place
    cdef object value
    cdef bint first_full = True, first_pruned = True, has_content = False
    full.length = 0
    pruned.length = 0
    _byte(full, b"{")
    _byte(pruned, b"{")
    for i in range(shape.written):
        place = shape.flags[i]
        value = <object>values[shape.index[i]]
        if place & _IN_CONTENT_HASH:
            if not first_full:
                _byte(full, b",")
            first_full = False
            key_start = full.length
            _key(full, shape, i)
            start = full.length
            if _write(full, value, strict, 1) == _PURE:
                return _PURE
        if not place & _IN_REFERENCE_HASH:
            continue
        if not first_pruned:
            _byte(pruned, b",")
        first_pruned = False
        if place & _IS_CONTENT:
            has_content = True
            _key(pruned, shape, i)
            if _pruned_content_json(
                    pruned, event, rules, strict,
                    full.data + start if place & _IN_CONTENT_HASH else NULL,
                    full.length - start) == _PURE:
                return _PURE
        elif place & _IN_CONTENT_HASH:
            _put(pruned, full.data + key_start, full.length - key_start)
        else:
            _key(pruned, shape, i)
            if _write(pruned, value, strict, 1) == _PURE:
                return _PURE
    if not has_content and PySet_Contains(rules.top_level, "content"):
        return _PURE  # the pruned event gets {} for a content it lacks
    _byte(full, b"}")
    _byte(pruned, b"}")
    return 0


def content_hash(event, bint strict=True):
    cdef unsigned char digest[32]
    if type(event) is dict:
        try:
            if _content_digest(<dict>event, strict, digest) == 0:
                return PyBytes_FromStringAndSize(<char*>digest, 32)
        except UnicodeEncodeError:
            pass
    return _ref.content_hash(event, strict)


def reference_hash(event, rules, bint strict=True):
    cdef unsigned char digest[32]
    if type(event) is dict and type(rules) is RedactionRules:
        try:
            if _reference_digest(<dict>event, rules, strict, digest) == 0:
                return PyBytes_FromStringAndSize(<char*>digest, 32)
        except UnicodeEncodeError:
            pass
    return _ref.reference_hash(event, rules, strict)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Py_ssize_t _base64_into(const unsigned char* src, Py_ssize_t n, bint urlsafe,
                             char* dst):
    """Write *src* in unpadded Base64 to *dst*; return the characters written."""
    cdef const char* alphabet = _URLSAFE if urlsafe else _STANDARD
    cdef Py_ssize_t i = 0, j = 0
    cdef unsigned int triple
    while i + 3 <= n:
        triple = (src[i] << 16) | (src[i + 1] << 8) | src[i + 2]
        dst[j] = alphabet[(triple >> 18) & 63]
        dst[j + 1] = alphabet[(triple >> 12) & 63]
        dst[j + 2] = alphabet[(triple >> 6) & 63]
        dst[j + 3] = alphabet[triple & 63]
        i += 3
        j += 4
    if n - i == 1:
        triple = src[i] << 16
        dst[j] = alphabet[(triple >> 18) & 63]
        dst[j + 1] = alphabet[(triple >> 12) & 63]
        j += 2
    elif n - i == 2:
        triple = (src[i] << 16) | (src[i + 1] << 8)
        dst[j] = alphabet[(triple >> 18) & 63]
        dst[j + 1] = alphabet[(triple >> 12) & 63]
        dst[j + 2] = alphabet[(triple >> 6) & 63]
        j += 3
    return j


cdef str _base64(bytes data, bint urlsafe, bint with_dollar):
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, (n * 4 + 2) // 3 + with_dollar)
    cdef char* dst = PyBytes_AS_STRING(out)
    if with_dollar:
        dst[0] = b"$"
    _base64_into(<const unsigned char*>PyBytes_AS_STRING(data), n, urlsafe, dst + with_dollar)
    return PyUnicode_DecodeASCII(dst, PyBytes_GET_SIZE(out), NULL)


def unpadded_base64(data, bint urlsafe=False):
    return _base64(bytes(data), urlsafe, False)


def event_id_from_hash(digest, bint urlsafe):
    return _base64(bytes(digest), urlsafe, True)


cdef bint _same_base64(object given, const unsigned char* digest, bint urlsafe,
                       const char* prefix, Py_ssize_t prefix_length) except -1:
    """Whether *given* (a str) is *prefix* and *digest* in unpadded Base64 (trailing
    ``=`` padding allowed when there is no prefix)."""
    cdef char expected[48]
    cdef Py_ssize_t n, length = prefix_length
    cdef const char* text
    if type(given) is not str:
        return False
    memcpy(expected, prefix, prefix_length)
    length += _base64_into(digest, 32, urlsafe, expected + prefix_length)
    text = _utf8(given, &n)
    if prefix_length == 0:
        while n > length and text[n - 1] == b"=":
            n -= 1
    return n == length and memcmp(text, expected, length) == 0


def check_hashes(event_id, event, rules, bint strict, bint urlsafe):
    return _check(event_id, event, rules, strict, urlsafe)


cdef object _check(object event_id, object event, object rules, bint strict, bint urlsafe):
    cdef unsigned char content_digest[32]
    cdef unsigned char reference_digest[32]
    cdef PyObject* found
    cdef object claimed = None
    if type(event) is not dict or type(rules) is not RedactionRules:
        return _ref.check_hashes(event_id, event, rules, strict, urlsafe)
    try:
        if _both_digests(<dict>event, rules, strict, content_digest,
                         reference_digest) == _PURE:
            return _ref.check_hashes(event_id, event, rules, strict, urlsafe)
    except UnicodeEncodeError:
        return _ref.check_hashes(event_id, event, rules, strict, urlsafe)
    if not _same_base64(event_id, reference_digest, urlsafe, b"$", 1):
        return _ref.BAD_EVENT_ID
    found = PyDict_GetItem(<dict>event, "hashes")
    if found is not NULL and type(<object>found) is dict:
        found = PyDict_GetItem(<dict><object>found, "sha256")
        claimed = None if found is NULL else <object>found
    elif found is not NULL and isinstance(<object>found, dict):
        return _ref.check_hashes(event_id, event, rules, strict, urlsafe)
    if type(claimed) is not str:
        return _ref.NO_CONTENT_HASH
    if not _same_base64(claimed, content_digest, False, b"", 0):
        return _ref.BAD_CONTENT_HASH
    return _ref.HASHES_MATCH


def check_records(records, rules, bint strict, bint urlsafe):
    cdef dict failed = {}
    cdef object code
    if type(rules) is not RedactionRules:
        return _ref.check_records(records, rules, strict, urlsafe)
    for record in records:
        if record.rejected:
            continue
        code = _check(record.event_id, record.body, rules, strict, urlsafe)
        if code != 0:
            failed[record.event_id] = code
    return failed


def sha256(data):
    cdef bytes raw = bytes(data)
    cdef unsigned char digest[32]
    streamrep_sha256(<const unsigned char*>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw),
                     digest)
    return PyBytes_FromStringAndSize(<char*>digest, 32)


def sha256_pair(a, b):
    cdef bytes first = bytes(a), second = bytes(b)
    cdef unsigned char digests[64]
    streamrep_sha256_pair(<const unsigned char*>PyBytes_AS_STRING(first),
                          PyBytes_GET_SIZE(first), digests,
                          <const unsigned char*>PyBytes_AS_STRING(second),
                          PyBytes_GET_SIZE(second), digests + 32)
    return PyBytes_FromStringAndSize(<char*>digests, 32), PyBytes_FromStringAndSize(
        <char*>digests + 32, 32)


def sha256_blocks(str mode="auto"):
    """Choose SHA-256's block function: ``"portable"`` (C), or ``"auto"`` (the SHA
    extensions where the processor has them); return the one in use
    (``"sha-extensions"`` or ``"portable"``). For tests of both."""
    if mode not in ("auto", "portable"):
        raise ValueError(f"mode must be 'auto' or 'portable', not {mode!r}")
    streamrep_sha256_force_portable(mode == "portable")
    return "sha-extensions" if streamrep_sha256_accelerated() else "portable"
