# Reading an instance's fields at their slot offsets, for the core modules that
# read many records or events of one slotted class (a dataclass with slots=True).
# Each such field is an object pointer at a fixed offset in every instance, which
# its class's member descriptor gives: read there, a field costs a load instead
# of an attribute lookup. Any other class, a field that is not an object slot, or
# a slot left unset is read with getattr, so errors read as Python's.

from cpython.object cimport PyObject

cdef extern from "structmember.h":  # PyMemberDef is complete there on every Python
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

cdef enum:
    # Py_T_OBJECT_EX: an object slot that raises AttributeError while unset.
    SLOT_T_OBJECT_EX = 16


cdef inline object _member(object cls, str name):
    """The class attribute *name* of *cls* as its MRO finds it, or None."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


cdef inline bint learn_slots(object cls, tuple names, Py_ssize_t* offsets) except -1:
    """Store the offset of each of *names* in instances of *cls* in *offsets*, and
    return True, when every one is an object slot; else store nothing and return
    False (the caller then reads with getattr)."""
    cdef Py_ssize_t i, n = len(names)
    cdef PyMemberDef* member
    for i in range(n):
        descriptor = _member(cls, names[i])
        if type(descriptor).__name__ != "member_descriptor":
            return False
        member = (<PyMemberDescrObject*>descriptor).d_member
        if member.type != SLOT_T_OBJECT_EX:
            return False
    for i in range(n):
        descriptor = _member(cls, names[i])
        offsets[i] = (<PyMemberDescrObject*>descriptor).d_member.offset
    return True


cdef inline PyObject* read_slot(object obj, Py_ssize_t offset) noexcept:
    """The object in *obj*'s slot at *offset* (borrowed), NULL while unset."""
    return (<PyObject**>((<char*><PyObject*>obj) + offset))[0]


cdef inline object slot_field(object obj, object cls, bint slotted,
                              const Py_ssize_t* offsets, tuple names, int f):
    """``getattr(obj, names[f])``, read at ``offsets[f]`` when *obj* is exactly a
    *cls* whose slots :func:`learn_slots` learnt (*slotted*)."""
    cdef PyObject* value
    if slotted and type(obj) is cls:
        value = read_slot(obj, offsets[f])
        if value != NULL:
            return <object>value
    return getattr(obj, <str>names[f])
