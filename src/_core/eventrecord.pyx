# cython: language_level=3
"""Checked event records from ``persist_events`` items, compiled (twin of
``streamrep._pure.eventrecord``, whose ``parse_event`` defines what is valid).

The usual item, a dict of the event's fields with ``event_id``, no flags, one
prev event, no redaction and string or absent relation, is checked here with C type
tests; every other item (flags, bytes, several prev events, a version 12 create
event, anything malformed) goes to the pure ``parse_event``, so an error reads the
same whichever implementation runs.
"""

from cpython.dict cimport PyDict_Copy, PyDict_DelItem, PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_CheckExact, PyUnicode_GET_LENGTH

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object text)
    object PyType_GenericAlloc(PyTypeObject* cls, Py_ssize_t nitems)
    Py_ssize_t PyUnicode_FindChar(object text, Py_UCS4 ch, Py_ssize_t start, Py_ssize_t end,
                                  int direction) except -2

from collections.abc import Mapping

import orjson

from streamrep._pure import eventrecord as _ref
from streamrep.errors import InvalidEventError
from streamrep._pure.eventrecord import EventRecord, FLAG_KEYS

__all__ = list(_ref.__all__)

cdef object _dumps = orjson.dumps
cdef object _explain = _ref.parse_event
cdef object _Record = EventRecord
cdef dict _EMPTY = _ref._EMPTY
cdef tuple _FLAGS = tuple(FLAG_KEYS)
cdef long long _MAX_DEPTH = 1LL << 62
cdef Py_ssize_t _MAX_IDENTIFIER = _ref.MAX_IDENTIFIER_BYTES
# EventRecord's slot offsets (RecordSlots and its helpers: eventrecord.pxd).
cdef RecordSlots _slots = learn_record_slots()
# A record's slots may be filled in place when making one does nothing else: no
# __new__ or __post_init__ of its own (the dataclass's __init__ only sets them).
cdef bint _fill_slots = (_slots.slotted and EventRecord.__new__ is object.__new__
                         and not hasattr(EventRecord, "__post_init__"))


cdef inline bint _plain_identifier(object text):
    """An ASCII str of at most the allowed bytes, without NUL (else the pure twin
    checks it, and names what is wrong)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text)
    return (n <= _MAX_IDENTIFIER and PyUnicode_IS_ASCII(text)
            and PyUnicode_FindChar(text, 0, 0, n, 1) == -1)


cdef bint _plain_auth_events(dict body):
    """Whether the body's ``auth_events`` is absent or a list of plain identifiers."""
    cdef PyObject* found = PyDict_GetItem(body, "auth_events")
    cdef Py_ssize_t i
    cdef object item
    if found is NULL:
        return True
    if type(<object>found) is not list:
        return True  # not the store's to judge: the room rules reject it
    for i in range(PyList_GET_SIZE(<object>found)):
        item = <object>PyList_GET_ITEM(<object>found, i)
        if not PyUnicode_CheckExact(item) or not _plain_identifier(item):
            return False
    return True


cdef inline object _text(dict body, str name):
    """``body[name]`` when it is a non-empty str, else NULL-like None."""
    cdef PyObject* value = PyDict_GetItem(body, name)
    if value is NULL or not PyUnicode_CheckExact(<object>value) or (
            PyUnicode_GET_LENGTH(<object>value) == 0):
        return None
    return <object>value


def parse_event(item):
    return _parse(item)


def parse_batch(items):
    cdef dict records = {}
    cdef PyObject* found
    cdef object item, record, seen, event_id
    if isinstance(items, (Mapping, bytes, str)):
        raise InvalidEventError("persist_events takes a list of events")
    for item in items:
        record = _parse(item)
        event_id = record_field(&_slots, record, R_EVENT_ID)
        found = PyDict_GetItem(records, event_id)
        if found is NULL:
            records[event_id] = record
            continue
        seen = <object>found
        if record_field(&_slots, seen, R_JSON) != record_field(&_slots, record, R_JSON):
            raise InvalidEventError(
                f"event {event_id} appears twice in the batch with different JSON")
        if (record_field(&_slots, seen, R_OUTLIER)
                and not record_field(&_slots, record, R_OUTLIER)):
            records[event_id] = record
    return list(records.values())


cdef object _parse(object item):
    """:func:`parse_event` (called once per item by :func:`parse_batch` too)."""
    cdef dict body, content
    cdef PyObject* found
    cdef object event_id, room_id, etype, sender, depth, prevs, prev, state_key
    cdef object membership = None, relates_to = None, relation, raw
    cdef long long depth_value
    cdef int overflow = 0
    if type(item) is not dict:
        return _explain(item)
    found = PyDict_GetItem(item, "event_id")
    if found is NULL or not PyUnicode_CheckExact(<object>found) or (
            PyUnicode_GET_LENGTH(<object>found) == 0):
        return _explain(item)
    event_id = <object>found
    for flag in _FLAGS:
        if PyDict_GetItem(item, flag) is not NULL:
            return _explain(item)
    body = PyDict_Copy(item)
    PyDict_DelItem(body, "event_id")
    room_id = _text(body, "room_id")
    etype = _text(body, "type")
    sender = _text(body, "sender")
    if room_id is None or etype is None or sender is None or etype == "m.room.redaction":
        return _explain(item)
    found = PyDict_GetItem(body, "depth")
    if found is NULL or not PyLong_CheckExact(<object>found):
        return _explain(item)
    depth = <object>found
    depth_value = PyLong_AsLongLongAndOverflow(depth, &overflow)
    if overflow or depth_value < 0 or depth_value >= _MAX_DEPTH:
        return _explain(item)
    found = PyDict_GetItem(body, "prev_events")
    if found is NULL or type(<object>found) is not list or PyList_GET_SIZE(<object>found) != 1:
        return _explain(item)
    prev = <object>PyList_GET_ITEM(<object>found, 0)
    if not PyUnicode_CheckExact(prev) or PyUnicode_GET_LENGTH(prev) == 0 or prev == event_id:
        return _explain(item)
    found = PyDict_GetItem(body, "state_key")
    state_key = None if found is NULL else <object>found
    if state_key is not None and not PyUnicode_CheckExact(state_key):
        return _explain(item)
    found = PyDict_GetItem(body, "content")
    if found is NULL:
        content = _EMPTY
    elif type(<object>found) is dict:
        content = <dict>found
    else:
        return _explain(item)
    if etype == "m.room.member":
        found = PyDict_GetItem(content, "membership")
        if found is NULL or not PyUnicode_CheckExact(<object>found) or state_key is None:
            return _explain(item)
        membership = <object>found
    found = PyDict_GetItem(content, "m.relates_to")
    if found is not NULL:
        relation = <object>found
        if type(relation) is not dict:
            return _explain(item)
        found = PyDict_GetItem(relation, "event_id")
        if found is not NULL:
            if not PyUnicode_CheckExact(<object>found):
                return _explain(item)
            relates_to = <object>found
    if not (_plain_identifier(event_id) and _plain_identifier(room_id)
            and _plain_identifier(etype) and _plain_identifier(sender)
            and _plain_identifier(prev) and _plain_auth_events(body)
            and (state_key is None or _plain_identifier(state_key))
            and (membership is None or _plain_identifier(membership))
            and (relates_to is None or _plain_identifier(relates_to))):
        return _explain(item)
    try:
        raw = _dumps(body)
    except TypeError:
        return _explain(item)
    # In EventRecord's field order.
    return _new_record((event_id, room_id, etype, sender, depth, [prev], state_key, raw,
                        body, content, False, False, False, membership, None, relates_to))


cdef object _new_record(tuple values):
    """``EventRecord(*values)``, its slots filled in place when :data:`_fill_slots`."""
    cdef object record
    cdef PyObject** slot
    cdef int f
    if not _fill_slots:
        return _Record(*values)
    record = PyType_GenericAlloc(<PyTypeObject*>_Record, 0)
    for f in range(N_RECORD_FIELDS):
        value = values[f]
        Py_INCREF(value)
        slot = <PyObject**>((<char*><PyObject*>record) + _slots.offsets[f])
        slot[0] = <PyObject*>value
    return record
