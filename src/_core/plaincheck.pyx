# cython: language_level=3
"""The plain events of a batch under the Matrix room rules, compiled (twin of
``streamrep._pure.plaincheck``, whose docstrings say what each function answers).

The type checks run as C tests on each item of the lists, and a record's verdicts
are looked up without leaving C between records.
"""

cimport cython
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_CheckExact
from cpython.object cimport PyObject
from cpython.set cimport PySet_Add, PySet_Contains
from cpython.unicode cimport PyUnicode_CheckExact, PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR

from streamrep._core.eventrecord cimport *
from streamrep._pure import plaincheck as _ref

__all__ = list(_ref.__all__)

cdef RecordSlots _slots = learn_record_slots()


cdef inline object _field(object record, int f):
    """A field of *record* (an ``EventRecord``, or any object with its fields)."""
    return record_field(&_slots, record, f)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bint _strings(object value, bint allow_empty):
    """Whether *value* is a list of strings (none empty unless *allow_empty*)."""
    cdef Py_ssize_t i
    cdef PyObject* item
    if type(value) is not list:
        return False
    for i in range(PyList_GET_SIZE(value)):
        item = PyList_GET_ITEM(value, i)
        if not PyUnicode_CheckExact(<object>item):
            return False
        if not allow_empty and PyUnicode_GET_LENGTH(<object>item) == 0:
            return False
    return True


cdef inline bint _starts_with(object text, Py_UCS4 first):
    return (PyUnicode_CheckExact(text) and PyUnicode_GET_LENGTH(text) > 0
            and PyUnicode_READ_CHAR(text, 0) == first)


cdef class BatchScan:
    """What one pass over a batch's records found (see ``scan_batch``)."""

    cdef readonly dict plain
    cdef readonly list others
    cdef readonly set senders
    cdef readonly set member_targets
    cdef readonly bint has_outlier

    def __cinit__(self):
        self.plain = {}
        self.others = []
        self.senders = set()
        self.member_targets = set()


def scan_batch(list records, str room_id, object create_id, object not_plain,
               str member_type):
    cdef BatchScan scan = BatchScan()
    cdef dict plain = scan.plain
    cdef list others = scan.others
    cdef set senders = scan.senders
    cdef set user_ids = set()
    cdef dict body
    cdef object r, listed, prevs, ts, sender, state_key, event_id
    cdef object last_listed = None, last_ids = ()
    cdef bint find_plain = not_plain is not None and _starts_with(room_id, u"!")
    if not_plain is not None and type(not_plain) is not frozenset:
        raise TypeError("not_plain must be a frozenset or None")
    for r in records:
        if _field(r, R_OUTLIER):
            scan.has_outlier = True
        sender = _field(r, R_SENDER)
        PySet_Add(senders, sender)
        state_key = _field(r, R_STATE_KEY)
        if state_key is not None:
            if _field(r, R_TYPE) == member_type:
                PySet_Add(scan.member_targets, state_key)
            others.append(r)
            continue
        if not find_plain or PySet_Contains(not_plain, _field(r, R_TYPE)):
            others.append(r)
            continue
        body = _field(r, R_BODY)
        listed = body.get("auth_events")
        prevs = body.get("prev_events")
        ts = body.get("origin_server_ts")
        event_id = _field(r, R_EVENT_ID)
        if not (_strings(listed, False) and _strings(prevs, True)
                and (ts is None or PyLong_CheckExact(ts)) and _starts_with(event_id, u"$")):
            others.append(r)
            continue
        if not PySet_Contains(user_ids, sender):
            if not _starts_with(sender, u"@") or u":" not in sender:
                others.append(r)
                continue
            PySet_Add(user_ids, sender)
        if create_id is not None and create_id in listed:
            others.append(r)  # listing it is forbidden: the full check says why
            continue
        # Consecutive records mostly list the same auth events: one tuple for them.
        if last_listed is None or listed != last_listed:
            last_listed = listed
            last_ids = tuple(listed)
            if create_id is not None:
                last_ids = (create_id,) + last_ids
        plain[event_id] = last_ids
    return scan


@cython.boundscheck(False)
@cython.wraparound(False)
def settled_until(list records, Py_ssize_t start, dict plain, dict passed, dict verdicts):
    cdef Py_ssize_t i, n = len(records)
    cdef PyObject* found
    cdef object r, sender, etype, ids
    # The last record found settled: the next one with the same auth events, sender
    # and type is settled too (the memos do not change during the call).
    cdef object last_ids = None, last_sender = None, last_type = None
    cdef bint last_outlier = False
    if start < 0:
        raise ValueError(f"start must not be negative, not {start}")
    for i in range(start, n):
        r = records[i]
        found = PyDict_GetItem(plain, _field(r, R_EVENT_ID))
        if found is NULL or _field(r, R_REJECTED):
            return i
        ids = <object>found
        sender = _field(r, R_SENDER)
        etype = _field(r, R_TYPE)
        # Compared, not hashed: the strings of each record are new objects, and a
        # tuple's hash is computed anew each time.
        if (last_ids is not None and etype == last_type and sender == last_sender
                and ids == last_ids and (not last_outlier or _field(r, R_OUTLIER))):
            continue  # an outlier needs only what a non-outlier needs, and less
        if PyDict_GetItem(passed, (ids, sender, etype)) is NULL:
            return i
        last_outlier = bool(_field(r, R_OUTLIER))
        if verdicts is not None and not last_outlier:
            found = PyDict_GetItem(verdicts, (sender, etype))
            if found is NULL or <object>found is not False:
                return i
        last_ids, last_sender, last_type = ids, sender, etype
    return n
