# cython: language_level=3
"""The per-event passes of persisting a batch, compiled (twin of
``streamrep._pure.batchrows``, whose docstrings say what each function answers).

Each pass reads a record's attributes once and builds its rows and dict entries
with C calls, without the interpreter's work between one record and the next.
"""

cimport cython
from cpython.array cimport array, clone
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.list cimport PyList_Append, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.set cimport PySet_Contains
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

from streamrep._core.eventrecord cimport *
from streamrep._pure import batchrows as _ref
from streamrep._pure.extremities import (BATCH_COUNTED, BATCH_NON_OUTLIER, ID_FORWARD,
                                         ID_STORED_NON_OUTLIER)

__all__ = list(_ref.__all__)

cdef array _Q_TEMPLATE = array("q")
cdef unsigned char _NON_OUTLIER = BATCH_NON_OUTLIER
cdef unsigned char _COUNTED = BATCH_NON_OUTLIER | BATCH_COUNTED
cdef unsigned char _FORWARD = ID_FORWARD
cdef unsigned char _STORED = ID_STORED_NON_OUTLIER

cdef RecordSlots _slots = learn_record_slots()


cdef inline object _field(object record, int f):
    """A field of *record* (an ``EventRecord``, or any object with its fields)."""
    return record_field(&_slots, record, f)


cdef inline object _flag(object value):
    """``int(value)``, without a call for the usual bool."""
    if value is True:
        return 1
    if value is False:
        return 0
    return int(value)


cdef inline object _one_prev(object prev_events):
    """The only item of *prev_events* when it is a list or tuple of one, else None
    (the caller then takes the general path)."""
    if type(prev_events) is list:
        if len(<list>prev_events) == 1:
            return (<list>prev_events)[0]
        return None
    if type(prev_events) is tuple and PyTuple_GET_SIZE(prev_events) == 1:
        return <object>PyTuple_GET_ITEM(prev_events, 0)
    return None


def by_room(list records):
    cdef Py_ssize_t i, n = len(records)
    cdef object first, room_id
    cdef dict rooms
    cdef PyObject* found
    if n == 0:
        return {}
    first = _field(<object>records[0], R_ROOM_ID)
    for i in range(1, n):
        room_id = _field(<object>records[i], R_ROOM_ID)
        if room_id is not first and room_id != first:
            break
    else:
        return {first: records}
    rooms = {}
    for record in records:
        room_id = _field(record, R_ROOM_ID)
        found = PyDict_GetItem(rooms, room_id)
        if found is NULL:
            rooms[room_id] = [record]
        else:
            PyList_Append(<object>found, record)
    return rooms


def orderings_of(records, streams, dict orderings):
    cdef Py_ssize_t i, n = len(records)
    cdef dict event_orderings = {}
    cdef object record, stream, event_id
    cdef list records_list = records if type(records) is list else list(records)
    cdef list streams_list = streams if type(streams) is list else list(streams)
    if len(streams_list) != n:
        raise ValueError(f"{len(streams_list)} stream orderings for {n} records")
    for i in range(n):
        record = records_list[i]
        stream = streams_list[i]
        event_id = _field(record, R_EVENT_ID)
        PyDict_SetItem(event_orderings, event_id, stream)
        PyDict_SetItem(orderings, event_id, (_field(record, R_DEPTH), stream))
    return event_orderings


cdef inline object _lookup(object mapping, bint is_dict, object key):
    """``mapping.get(key)``, through the C API when *mapping* is a dict."""
    cdef PyObject* found
    if is_dict:
        found = PyDict_GetItem(<dict>mapping, key)
        return None if found is NULL else <object>found
    return mapping.get(key)


def in_prev_order(records):
    cdef dict position = {}
    cdef Py_ssize_t i, n
    cdef PyObject* found
    cdef object r, prev
    cdef list ordered = list(records)
    n = len(ordered)
    for i in range(n):
        PyDict_SetItem(position, _field(<object>ordered[i], R_EVENT_ID), i)
    for i in range(n):
        r = ordered[i]
        for prev in _field(r, R_PREV_EVENTS):
            found = PyDict_GetItem(position, prev)
            if found is not NULL and <Py_ssize_t><object>found >= i:
                return False
    return True


def share_groups(records, Py_ssize_t start, dict event_groups, outside_groups,
                 visibility_at_group, dict visibility, list group_rows):
    cdef Py_ssize_t i, n = len(records)
    cdef object record, prev_events, prev, group, known, event_id, state_key
    cdef bint dict_outside = type(outside_groups) is dict
    cdef bint dict_visibility = type(visibility_at_group) is dict
    if start < 0:
        raise ValueError(f"start must not be negative, not {start}")
    for i in range(start, n):
        record = records[i]
        prev_events = _field(record, R_PREV_EVENTS)
        prev = _one_prev(prev_events)
        if prev is None:
            if len(prev_events) != 1:
                return i
            prev = prev_events[0]
        state_key = _field(record, R_STATE_KEY)
        if state_key is not None and not _field(record, R_REJECTED):
            return i
        group = _lookup(event_groups, True, prev)
        if group is None:
            group = _lookup(outside_groups, dict_outside, prev)
            if group is None:
                return i
        known = _lookup(visibility_at_group, dict_visibility, group)
        if known is None:
            return i
        event_id = _field(record, R_EVENT_ID)
        PyDict_SetItem(visibility, event_id, known)
        PyDict_SetItem(event_groups, event_id, group)
        PyList_Append(group_rows, (event_id, group))
    return n


@cython.boundscheck(False)
@cython.wraparound(False)
def intern_batch(non_outliers, forward, stored):
    cdef list records = non_outliers if type(non_outliers) is list else list(non_outliers)
    cdef Py_ssize_t n = len(records), k, number, n_batch, n_known
    cdef dict ids = {}
    cdef list names = []
    cdef list prev_list = []
    cdef object record, event_id, prev, value
    cdef PyObject* found
    cdef array batch_ids = clone(_Q_TEMPLATE, n, False)
    cdef array offsets = clone(_Q_TEMPLATE, n + 1, False)
    cdef bytearray batch_flags = bytearray(n)
    cdef unsigned char* flags = batch_flags
    cdef bytearray id_flags
    cdef unsigned char* id_bits
    cdef bint stored_is_dict = type(stored) is dict
    for k in range(n):
        event_id = _field(<object>records[k], R_EVENT_ID)
        if PyDict_GetItem(ids, event_id) is NULL:  # the same event twice: the first number
            PyDict_SetItem(ids, event_id, len(names))
            names.append(event_id)
    n_batch = len(names)
    offsets.data.as_longlongs[0] = 0
    for k in range(n):
        record = records[k]
        batch_ids.data.as_longlongs[k] = <object>PyDict_GetItem(ids, _field(record, R_EVENT_ID))
        flags[k] = _NON_OUTLIER if (
            _field(record, R_REJECTED) or _field(record, R_SOFT_FAILED)) else _COUNTED
        for prev in _field(record, R_PREV_EVENTS):
            found = PyDict_GetItem(ids, prev)
            if found is NULL:
                number = len(names)
                PyDict_SetItem(ids, prev, number)
                names.append(prev)
                prev_list.append(number)
            else:
                prev_list.append(<object>found)
        offsets.data.as_longlongs[k + 1] = len(prev_list)
    n_known = len(names)
    for event_id in forward:
        if PyDict_GetItem(ids, event_id) is NULL:
            PyDict_SetItem(ids, event_id, len(names))
            names.append(event_id)
    id_flags = bytearray(len(names))
    id_bits = id_flags
    for event_id in forward:
        id_bits[<Py_ssize_t><object>PyDict_GetItem(ids, event_id)] |= _FORWARD
    for number in range(n_batch, n_known):
        if stored_is_dict:
            found = PyDict_GetItem(<dict>stored, names[number])
            if found is NULL:
                continue
            value = <object>found
        else:
            value = stored.get(names[number])
        if value is False:
            id_bits[number] |= _STORED
    return (names, ids, batch_ids, bytes(batch_flags), offsets, array("q", prev_list),
            id_flags)


@cython.boundscheck(False)
@cython.wraparound(False)
def event_rows(records, room_id, orderings, redacted_now, visibility, received_ts,
               bint sqlite, list events, list plain_events, list edges):
    cdef list members = []
    cdef object record, event_id, stream, room_max = 0, state_key, json, membership
    cdef object prev_events, prev, seen, vis, redacts, relates_to, outlier
    cdef bint dict_orderings = type(orderings) is dict
    cdef bint dict_visibility = type(visibility) is dict
    cdef bint set_redacted = type(redacted_now) is set or type(redacted_now) is frozenset
    cdef PyObject* found
    for record in records:
        event_id = _field(record, R_EVENT_ID)
        if dict_orderings:
            found = PyDict_GetItem(<dict>orderings, event_id)
            if found is NULL:
                raise KeyError(event_id)
            stream = <object>found
        else:
            stream = orderings[event_id]
        if stream > room_max:
            room_max = stream
        if set_redacted:
            seen = 1 if PySet_Contains(redacted_now, event_id) else 0
        else:
            seen = 1 if event_id in redacted_now else 0
        vis = _lookup(visibility, dict_visibility, event_id)
        json = _field(record, R_JSON)
        json = bytearray(json) if sqlite else bytes(json)
        state_key = _field(record, R_STATE_KEY)
        membership = _field(record, R_MEMBERSHIP)
        redacts = _field(record, R_REDACTS)
        relates_to = _field(record, R_RELATES_TO)
        outlier = _field(record, R_OUTLIER)
        if sqlite and state_key is None and redacts is None and (
                relates_to is None and membership is None):
            PyList_Append(plain_events, (
                stream, _field(record, R_DEPTH), event_id, room_id, _field(record, R_TYPE),
                _field(record, R_SENDER), _flag(outlier), _flag(_field(record, R_REJECTED)),
                _flag(_field(record, R_SOFT_FAILED)), seen, vis, received_ts, json))
        else:
            PyList_Append(events, (
                stream, _field(record, R_DEPTH), event_id, room_id, _field(record, R_TYPE),
                state_key, _field(record, R_SENDER), _flag(outlier),
                _flag(_field(record, R_REJECTED)), _flag(_field(record, R_SOFT_FAILED)), seen,
                redacts, relates_to, membership, vis, received_ts, json))
        if not outlier:
            prev_events = _field(record, R_PREV_EVENTS)
            prev = _one_prev(prev_events)
            if prev is not None:
                PyList_Append(edges, (event_id, prev, room_id))
            else:
                for prev in prev_events:
                    PyList_Append(edges, (event_id, prev, room_id))
        if membership is not None and state_key is not None:
            members.append(record)
    return room_max, members


@cython.boundscheck(False)
@cython.wraparound(False)
def flat_chunks(rows, Py_ssize_t start, Py_ssize_t end, Py_ssize_t size):
    cdef list out = [], values
    cdef Py_ssize_t first, i, j, k, width
    cdef object row, value
    if size < 1 or (end - start) % size:
        raise ValueError(f"{end - start} rows do not make statements of {size}")
    if end <= start:
        return out
    width = len(rows[start])
    for first in range(start, end, size):
        values = PyList_New(size * width)
        k = 0
        for i in range(first, first + size):
            row = rows[i]
            if type(row) is not tuple:
                row = tuple(row)
            if PyTuple_GET_SIZE(row) != width:
                # Leave the list whole (no NULL items) before raising.
                for j in range(k, size * width):
                    Py_INCREF(None)
                    PyList_SET_ITEM(values, j, None)
                raise ValueError(f"row {i} has {PyTuple_GET_SIZE(row)} values, not {width}")
            for j in range(width):
                value = <object>PyTuple_GET_ITEM(row, j)
                Py_INCREF(value)
                PyList_SET_ITEM(values, k, value)
                k += 1
        PyList_Append(out, values)
    return out
