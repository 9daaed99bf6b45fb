# The fields of ``EventRecord`` read at C level, for the core modules that read
# many records (batchrows, plaincheck). Each such module learns the slot offsets
# once, at import (``cdef RecordSlots _slots = learn_record_slots()``), and reads a
# field with ``record_field(&_slots, record, R_EVENT_ID)``.

from cpython.object cimport PyObject

from streamrep._core.slots cimport learn_slots, slot_field

cdef enum:
    R_EVENT_ID
    R_ROOM_ID
    R_TYPE
    R_SENDER
    R_DEPTH
    R_PREV_EVENTS
    R_STATE_KEY
    R_JSON
    R_BODY
    R_CONTENT
    R_OUTLIER
    R_REJECTED
    R_SOFT_FAILED
    R_MEMBERSHIP
    R_REDACTS
    R_RELATES_TO
    N_RECORD_FIELDS


cdef struct RecordSlots:
    # EventRecord itself (a module-level class of the pure twin, which outlives
    # every reader), and whether its fields are all object slots at *offsets*.
    PyObject* cls
    bint slotted
    Py_ssize_t offsets[N_RECORD_FIELDS]


cdef inline tuple record_field_names():
    """The field names, in the enum's order."""
    return ("event_id", "room_id", "type", "sender", "depth", "prev_events", "state_key",
            "json", "body", "content", "outlier", "rejected", "soft_failed", "membership",
            "redacts", "relates_to")


cdef inline RecordSlots learn_record_slots() except *:
    """``EventRecord``'s slot offsets, or ``slotted`` false if it has none."""
    from streamrep._pure.eventrecord import EventRecord
    cdef RecordSlots slots
    slots.cls = <PyObject*>EventRecord
    slots.slotted = learn_slots(EventRecord, record_field_names(), slots.offsets)
    return slots


cdef inline object record_field(const RecordSlots* slots, object record, int f):
    """``getattr(record, record_field_names()[f])``, read at its slot for an
    ``EventRecord``."""
    return slot_field(record, <object>slots.cls, slots.slotted, slots.offsets,
                      record_field_names(), f)
