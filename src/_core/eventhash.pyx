# cython: language_level=3
"""Redaction, canonical JSON and the hashes of Matrix events, compiled (twin of
``streamrep._pure.eventhash``, whose docstrings define each function).

The usual value (dicts with string keys, lists, strings, integers in range, booleans
and null) is checked here with C type tests and written by orjson with sorted
keys, which for such values writes exactly the canonical form; any other value
(floats, integers past 64 bits, subclasses, tuples) and anything orjson refuses go
to the pure twin, the one definition of what is canonical and of each error.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Copy, PyDict_DelItem, PyDict_GetItem, PyDict_Next
from cpython.dict cimport PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.set cimport PySet_Contains
from cpython.unicode cimport PyUnicode_DecodeASCII

import hashlib

import orjson

from streamrep._pure import eventhash as _ref
from streamrep._pure.eventhash import CanonicalJsonError, RedactionRules

__all__ = list(_ref.__all__)

cdef object _dumps = orjson.dumps
cdef object _sort_keys = orjson.OPT_SORT_KEYS
cdef object _encode_error = orjson.JSONEncodeError
cdef object _sha256 = hashlib.sha256
cdef object _pure_canonical = _ref.canonical_json
cdef long long _MAX_SAFE = _ref.MAX_SAFE_INTEGER
cdef tuple _CONTENT_EXCLUDED = tuple(_ref.CONTENT_HASH_EXCLUDED)
cdef tuple _REFERENCE_EXCLUDED = tuple(_ref.REFERENCE_HASH_EXCLUDED)
# Deeper values go to the pure twin (orjson refuses past 255 levels).
cdef int _MAX_DEPTH = 200

cdef const char* _STANDARD = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef const char* _URLSAFE = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


cdef bint _writable(object value, bint strict, int depth) except -1:
    """Whether orjson writes *value* as its canonical JSON (see the module docstring)."""
    cdef object kind = type(value)
    cdef Py_ssize_t pos = 0, i, n
    cdef PyObject* key
    cdef PyObject* item
    cdef long long number
    cdef int overflow = 0
    if kind is str or value is None or value is True or value is False:
        return True
    if depth > _MAX_DEPTH:
        return False
    if kind is dict:
        while PyDict_Next(value, &pos, &key, &item):
            if type(<object>key) is not str or not _writable(<object>item, strict, depth + 1):
                return False
        return True
    if kind is list:
        n = PyList_GET_SIZE(value)
        for i in range(n):
            if not _writable(<object>PyList_GET_ITEM(value, i), strict, depth + 1):
                return False
        return True
    if kind is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return False
        return not strict or -_MAX_SAFE <= number <= _MAX_SAFE
    return False


cdef bytes _canonical(object value, bint strict):
    if _writable(value, strict, 0):
        try:
            return _dumps(value, option=_sort_keys)
        except _encode_error:
            pass  # a lone surrogate, say: the pure twin names it
    return _pure_canonical(value, strict)


def canonical_json(value, bint strict=True):
    return _canonical(value, strict)


cdef dict _prune(dict event, object rules):
    cdef frozenset top = rules.top_level
    cdef dict content_rules = rules.content
    cdef dict out = {}, pruned
    cdef Py_ssize_t pos = 0
    cdef PyObject* key
    cdef PyObject* item
    cdef PyObject* found
    cdef object content, etype, kept, sub, value
    while PyDict_Next(event, &pos, &key, &item):
        if PySet_Contains(top, <object>key):
            PyDict_SetItem(out, <object>key, <object>item)
    found = PyDict_GetItem(event, "content")
    content = None if found is NULL else <object>found
    found = PyDict_GetItem(event, "type")
    etype = None if found is NULL else <object>found
    found = NULL
    if type(content) is dict and type(etype) is str:
        found = PyDict_GetItem(content_rules, etype)
    if found is NULL:
        out["content"] = {}
        return out
    kept = <object>found
    if kept is None:
        out["content"] = PyDict_Copy(content)
        return out
    pruned = {}
    pos = 0
    while PyDict_Next(content, &pos, &key, &item):
        if PySet_Contains(kept, <object>key):
            PyDict_SetItem(pruned, <object>key, <object>item)
    found = PyDict_GetItem(rules.nested, etype)
    if found is not NULL:
        for name, sub in (<dict>found).items():
            value = content.get(name)
            if type(value) is dict:
                pruned[name] = {k: v for k, v in (<dict>value).items() if k in sub}
            elif isinstance(value, dict):
                pruned[name] = {k: v for k, v in value.items() if k in sub}
    out["content"] = pruned
    return out


def prune(event, rules):
    if type(event) is not dict or type(rules) is not RedactionRules:
        return _ref.prune(event, rules)
    return _prune(<dict>event, rules)


def content_hash(event, bint strict=True):
    cdef dict hashed
    if type(event) is not dict:
        return _ref.content_hash(event, strict)
    hashed = PyDict_Copy(event)
    for key in _CONTENT_EXCLUDED:
        if PyDict_GetItem(hashed, key) is not NULL:
            PyDict_DelItem(hashed, key)
    return _sha256(_canonical(hashed, strict)).digest()


def reference_hash(event, rules, bint strict=True):
    cdef dict pruned
    if type(event) is not dict or type(rules) is not RedactionRules:
        return _ref.reference_hash(event, rules, strict)
    pruned = _prune(<dict>event, rules)
    for key in _REFERENCE_EXCLUDED:
        if PyDict_GetItem(pruned, key) is not NULL:
            PyDict_DelItem(pruned, key)
    return _sha256(_canonical(pruned, strict)).digest()


@cython.boundscheck(False)
@cython.wraparound(False)
cdef str _base64(bytes data, bint urlsafe, bint with_dollar):
    """*data* in unpadded Base64 (after a ``$`` when *with_dollar*)."""
    cdef const unsigned char* src = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), i = 0, j = 0
    cdef const char* alphabet = _URLSAFE if urlsafe else _STANDARD
    cdef unsigned int triple
    cdef bytes out = PyBytes_FromStringAndSize(NULL, (n * 4 + 2) // 3 + with_dollar)
    cdef char* dst = PyBytes_AS_STRING(out)
    if with_dollar:
        dst[0] = b"$"
        j = 1
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
    elif n - i == 2:
        triple = (src[i] << 16) | (src[i + 1] << 8)
        dst[j] = alphabet[(triple >> 18) & 63]
        dst[j + 1] = alphabet[(triple >> 12) & 63]
        dst[j + 2] = alphabet[(triple >> 6) & 63]
    return PyUnicode_DecodeASCII(PyBytes_AS_STRING(out), PyBytes_GET_SIZE(out), NULL)


def unpadded_base64(data, bint urlsafe=False):
    return _base64(bytes(data), urlsafe, False)


def event_id_from_hash(digest, bint urlsafe):
    return _base64(bytes(digest), urlsafe, True)
