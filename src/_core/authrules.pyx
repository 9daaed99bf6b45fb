# cython: language_level=3
"""The Matrix authorization rules against a state (compiled core).

Same API and results as ``streamrep._pure.authrules``, whose docstrings say what
each rule answers. A :class:`Rules` reads its room version's switches once into C
flags; states that are dicts are read with the dict's C API, and the iterative auth
checks of state resolution build and check each event's state without leaving C
between events.
"""

from collections.abc import Mapping
from heapq import heapify, heappop, heappush

from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetItem, PyDict_Copy
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t
from libc.limits cimport LLONG_MIN as PY_LLONG_MIN
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.stdlib cimport calloc, free, malloc
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object text)
    int PyUnicode_Compare(object left, object right) except? -1

from streamrep._pure import authrules as _ref
from streamrep._core.slots cimport learn_slots, slot_field

__all__ = list(_ref.__all__)

CREATOR_POWER_LEVEL = _ref.CREATOR_POWER_LEVEL

cdef str _CREATE = "m.room.create"
cdef str _MEMBER = "m.room.member"
cdef str _POWER_LEVELS = "m.room.power_levels"
cdef str _THIRD_PARTY_INVITE = "m.room.third_party_invite"
cdef str _ALIASES = "m.room.aliases"
cdef str _JOIN_RULES = "m.room.join_rules"
cdef str _REDACTION = "m.room.redaction"
cdef tuple _CREATE_KEY = (_CREATE, "")
cdef tuple _POWER_LEVELS_KEY = (_POWER_LEVELS, "")
cdef tuple _JOIN_RULES_KEY = (_JOIN_RULES, "")
cdef tuple _LEVEL_KEYS = _ref._LEVEL_KEYS
cdef object _ABSENT = _ref._ABSENT
cdef object _INT_STRING_MATCH = _ref._INT_STRING.match
cdef Py_ssize_t _MAX_DIGITS = _ref._MAX_DIGITS
cdef dict _NO_LEVELS = {}
cdef object _CREATOR_LEVEL = _ref.CREATOR_POWER_LEVEL
cdef Py_ssize_t _MAX_ID_LENGTH = _ref._MAX_ID_LENGTH


# --- reading an event's fields ------------------------------------------------------
#
# Events are read by attribute. For a class whose fields are all slots (a slotted
# dataclass such as ``MatrixEvent``) the slot offsets are learnt once and read
# directly; any other class, or an unset slot, is read with ``getattr``.

cdef enum:
    F_EVENT_ID
    F_TYPE
    F_SENDER
    F_STATE_KEY
    F_CONTENT
    F_PREV_EVENTS
    F_AUTH_IDS
    F_REDACTS
    F_KEY
    F_MEMBERSHIP
    F_ORIGIN_SERVER_TS
    F_ROOM_ID
    N_FIELDS

cdef tuple _FIELD_NAMES = ('event_id', 'type', 'sender', 'state_key', 'content', 'prev_events', 'auth_ids', 'redacts', 'key', 'membership', 'origin_server_ts', 'room_id')
cdef object _slotted = None
cdef Py_ssize_t _offsets[N_FIELDS]
cdef set _not_slotted = set()


cdef bint _learn(object cls) except -1:
    """Learn *cls*'s slot offsets, when every field is an object slot."""
    global _slotted
    if learn_slots(cls, _FIELD_NAMES, _offsets):
        _slotted = cls
        return True
    _not_slotted.add(cls)
    return False


cdef inline object _field(object event, int f):
    """``getattr(event, _FIELD_NAMES[f])``."""
    cls = type(event)
    if cls is not _slotted and cls not in _not_slotted:
        _learn(cls)
    return slot_field(event, _slotted, True, _offsets, _FIELD_NAMES, f)


cdef inline object _get(object state, object key):
    """``state.get(key)``: the dict's C API for a dict."""
    cdef PyObject* found
    if type(state) is dict:
        found = PyDict_GetItemWithError(<dict>state, key)
        return <object>found if found != NULL else None
    return state.get(key)


cdef inline object _get_or(object content, object key, object default):
    """``content.get(key, default)``: the dict's C API for a dict."""
    cdef PyObject* found
    if type(content) is dict:
        found = PyDict_GetItemWithError(<dict>content, key)
        return <object>found if found != NULL else default
    return content.get(key, default)


cdef inline object _item(object events, object key):
    """``events[key]``: the dict's C API for a dict."""
    cdef PyObject* found
    if type(events) is dict:
        found = PyDict_GetItemWithError(<dict>events, key)
        if found == NULL:
            raise KeyError(key)
        return <object>found
    return events[key]


cdef inline bint _is_mapping(object value) except -1:
    return type(value) is dict or isinstance(value, Mapping)


cdef extern from *:
    """
    #define SR_PREFETCH(p) __builtin_prefetch((const void*)(p), 0, 3)
    """
    void SR_PREFETCH(const void* p) nogil


def held_events(events, event_ids, room_id):
    """``(held, power, foreign)`` of *event_ids* over *events* (see the pure twin).

    Before reading them, one pass asks the processor for every held event, the
    objects its fields point at and its auth events' IDs: a resolution's events are
    usually out of the caches (other work ran since the last one), and the steps
    after this one read them one at a time, waiting on each miss in turn; here the
    misses of all of them overlap. Of events whose class has no slots, only the
    events are asked for."""
    cdef list found_ids = [], found_events = []
    cdef set held = set()
    cdef list power = []
    cdef PyObject* found
    cdef Py_ssize_t i
    if type(events) is dict:
        for eid in event_ids:
            found = PyDict_GetItemWithError(<dict>events, eid)
            if found != NULL:
                SR_PREFETCH(found)
                SR_PREFETCH(<char*>found + 64)
                found_ids.append(eid)
                found_events.append(<object>found)
        _prefetch_fields(found_events)
    else:
        for eid in event_ids:
            event = events.get(eid)
            if event is not None:
                found_ids.append(eid)
                found_events.append(event)
    for i in range(PyList_GET_SIZE(found_events)):
        event = <object>PyList_GET_ITEM(found_events, i)
        eid = <object>PyList_GET_ITEM(found_ids, i)
        if _field(event, F_ROOM_ID) != room_id:
            return held, power, eid
        held.add(eid)
        if _is_power_event(event):
            power.append(eid)
    return held, power, None


# --- orderings over C arrays -------------------------------------------------------------
#
# Both orderings sort events by (an int, origin_server_ts, event ID): the power ordering
# pops the ready event first by -sender level, the mainline ordering sorts by mainline
# position. When every int and timestamp fits in 64 bits and every ID is a str (always,
# for events that parsed), the events are a heap of numbers over C arrays of those keys,
# and their IDs are compared only on a tie; else Python's heap or sort orders tuples.

cdef struct _Keys:
    int64_t* first
    int64_t* ts
    PyObject** ids


cdef inline bint _sorts_before(_Keys* keys, int32_t a, int32_t b) except -1:
    if keys.first[a] != keys.first[b]:
        return keys.first[a] < keys.first[b]
    if keys.ts[a] != keys.ts[b]:
        return keys.ts[a] < keys.ts[b]
    return PyUnicode_Compare(<object>keys.ids[a], <object>keys.ids[b]) < 0


cdef int _heap_push(int32_t* heap, Py_ssize_t* size, int32_t node, _Keys* keys) except -1:
    cdef Py_ssize_t at = size[0], parent
    size[0] += 1
    while at > 0:
        parent = (at - 1) >> 1
        if not _sorts_before(keys, node, heap[parent]):
            break
        heap[at] = heap[parent]
        at = parent
    heap[at] = node
    return 0


cdef int32_t _heap_pop(int32_t* heap, Py_ssize_t* size, _Keys* keys) except -1:
    cdef int32_t first = heap[0], last
    cdef Py_ssize_t at = 0, child, n
    size[0] -= 1
    n = size[0]
    if n == 0:
        return first
    last = heap[n]
    while True:
        child = 2 * at + 1
        if child >= n:
            break
        if child + 1 < n and _sorts_before(keys, heap[child + 1], heap[child]):
            child += 1
        if not _sorts_before(keys, heap[child], last):
            break
        heap[at] = heap[child]
        at = child
    heap[at] = last
    return first


cdef int32_t* _new_keys(_Keys* keys, Py_ssize_t n) except NULL:
    """Allocate *keys*' arrays for *n* events and return a heap for their numbers; the
    caller frees both with :func:`_free_keys`. On a failed allocation this frees what
    it got and raises MemoryError."""
    keys.first = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    keys.ts = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    keys.ids = <PyObject**>malloc((n + 1) * sizeof(PyObject*))
    cdef int32_t* heap = <int32_t*>malloc((n + 1) * sizeof(int32_t))
    if keys.first == NULL or keys.ts == NULL or keys.ids == NULL or heap == NULL:
        _free_keys(keys, heap)
        raise MemoryError()
    return heap


cdef void _free_keys(_Keys* keys, int32_t* heap) noexcept:
    free(keys.first)
    free(keys.ts)
    free(keys.ids)
    free(heap)
    keys.first = keys.ts = NULL
    keys.ids = NULL


cdef bint _int64(object value, int64_t* into) except -1:
    """Store *value* in *into* when it is an int that fits (and may be negated)."""
    cdef int overflow = 0
    cdef long long got
    if type(value) is not int:
        return False
    got = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow != 0 or got == PY_LLONG_MIN:
        return False
    into[0] = got
    return True


cdef object _kahn_in_c(Py_ssize_t n, int32_t* waiting, int32_t* start, int32_t* children,
                       list ids, list nodes, dict levels):
    """The power ordering of the graph over C arrays, or None when a key does not fit
    them (then the caller orders with Python's heap)."""
    cdef _Keys keys
    cdef int32_t* heap = NULL
    cdef Py_ssize_t i, k, size = 0
    cdef int32_t node, child
    cdef int64_t level
    cdef list out = []
    heap = _new_keys(&keys, n)
    try:
        for i in range(n):
            eid = <object>PyList_GET_ITEM(ids, i)
            if type(eid) is not str or not _int64(levels[eid], &level) or not _int64(
                    _field(<object>PyList_GET_ITEM(nodes, i), F_ORIGIN_SERVER_TS), &keys.ts[i]):
                return None
            keys.first[i] = -level
            keys.ids[i] = PyList_GET_ITEM(ids, i)
        for i in range(n):
            if waiting[i] == 0:
                _heap_push(heap, &size, <int32_t>i, &keys)
        while size > 0:
            node = _heap_pop(heap, &size, &keys)
            out.append(<object>keys.ids[node])
            for k in range(start[node], start[node + 1]):
                child = children[k]
                waiting[child] -= 1
                if waiting[child] == 0:
                    _heap_push(heap, &size, child, &keys)
        return out
    finally:
        _free_keys(&keys, heap)


cdef object _sorted_in_c(list keyed):
    """The IDs of *keyed* (``(int, origin_server_ts, event ID)`` tuples) in the tuples'
    order, or None when a key does not fit the C arrays."""
    cdef Py_ssize_t n = PyList_GET_SIZE(keyed), i, size = 0
    cdef _Keys keys
    cdef int32_t* heap = NULL
    cdef list out = []
    heap = _new_keys(&keys, n)
    try:
        for i in range(n):
            entry = <tuple>PyList_GET_ITEM(keyed, i)
            if (type(entry[2]) is not str or not _int64(entry[0], &keys.first[i])
                    or not _int64(entry[1], &keys.ts[i])):
                return None
            keys.ids[i] = PyTuple_GET_ITEM(entry, 2)
            _heap_push(heap, &size, <int32_t>i, &keys)
        while size > 0:
            out.append(<object>keys.ids[_heap_pop(heap, &size, &keys)])
        return out
    finally:
        _free_keys(&keys, heap)


cdef bint _is_power_event(object event) except -1:
    etype = _field(event, F_TYPE)
    state_key = _field(event, F_STATE_KEY)
    if state_key == "" and (etype == _POWER_LEVELS or etype == _JOIN_RULES or etype == _CREATE):
        return True
    if etype == _MEMBER:
        membership = _field(event, F_MEMBERSHIP)
        return (membership == "leave" or membership == "ban") and _field(event, F_SENDER) != state_key
    return False


cdef int _prefetch_fields(list held) except -1:
    """Prefetch the objects the slots of each of *held* point at, then its auth
    events' IDs."""
    cdef PyObject* value
    cdef Py_ssize_t i, f, k
    if not held:
        return 0
    cls = type(held[0])
    if not (cls is _slotted or (cls not in _not_slotted and _learn(cls))):
        return 0
    for i in range(PyList_GET_SIZE(held)):
        event = <object>PyList_GET_ITEM(held, i)
        if type(event) is not _slotted:
            continue
        for f in range(N_FIELDS):
            value = (<PyObject**>((<char*><PyObject*>event) + _offsets[f]))[0]
            if value != NULL:
                SR_PREFETCH(value)
    for i in range(PyList_GET_SIZE(held)):
        event = <object>PyList_GET_ITEM(held, i)
        if type(event) is not _slotted:
            continue
        value = (<PyObject**>((<char*><PyObject*>event) + _offsets[F_AUTH_IDS]))[0]
        if value != NULL and PyTuple_CheckExact(<object>value):
            for k in range(PyTuple_GET_SIZE(<object>value)):
                SR_PREFETCH(PyTuple_GET_ITEM(<object>value, k))
    return 0


cdef object _level(object value, bint integers_only):
    """``parse_level`` (see the pure twin)."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if integers_only:
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return int(value)
    if isinstance(value, str) and len(<str>value) <= _MAX_DIGITS and _INT_STRING_MATCH(value):
        return int(value)
    return None


cdef object _domain(str identifier):
    cdef Py_ssize_t at = identifier.find(":")
    if at < 0:
        return ""
    return identifier[at + 1:]


cdef object _membership(object state, str user_id):
    member = _get(state, (_MEMBER, user_id))
    return _field(member, F_MEMBERSHIP) if member is not None else None


cdef bint _same_value(object a, object b) except -1:
    return a is b or (type(a) is type(b) and a == b)


cdef object _read(object content, object group, str name):
    where = _get_or(content, group, _NO_LEVELS) if group else content
    if not _is_mapping(where) or name not in where:
        return None
    return _level(where[name], False)


cdef list _changed_names(object old, object new, str group_name):
    old_values = old.get(group_name, _NO_LEVELS)
    new_values = new.get(group_name, _NO_LEVELS)
    cdef set names = set()
    if type(old_values) is dict and type(new_values) is dict:
        for n, v in (<dict>old_values).items():
            w = (<dict>new_values).get(n, _ABSENT)
            if not (v is w or (type(v) is type(w) and v == w)):
                names.add(n)
        for n in <dict>new_values:
            if n not in <dict>old_values:
                names.add(n)
    else:
        for values in (old_values, new_values):
            if isinstance(values, Mapping):
                names.update(values)
    return sorted(names)


def domain_of(identifier):
    """The server name of a user, room or event ID (see the pure twin)."""
    return _domain(identifier)


cdef bint _is_user_id(object value) except -1:
    if type(value) is not str and not isinstance(value, str):
        return False
    cdef str text = value
    if not text.startswith("@") or text.find(":", 2) < 0:
        return False
    if PyUnicode_IS_ASCII(text):
        return PyUnicode_GET_LENGTH(text) <= _MAX_ID_LENGTH
    return len(text.encode()) <= _MAX_ID_LENGTH


def is_user_id(value):
    """True for a string shaped as a user ID of at most 255 bytes."""
    return _is_user_id(value)


def parse_level(value, integers_only=False):
    """*value* as a power level, or None when it is not one."""
    return _level(value, integers_only)


cdef class Rules:
    """The authorization rules of one room version (see the pure twin)."""

    cdef object version
    cdef object third_party_ok
    cdef bint restricted, knock_restricted, knock, aliases, integers
    cdef bint implicit_creator, creator_power, notifications, redaction_domain

    def __init__(self, version, third_party_ok):
        self.version = version
        self.third_party_ok = third_party_ok
        self.restricted = bool(version.restricted_join_rule)
        self.knock_restricted = bool(version.knock_restricted_join_rule)
        self.knock = bool(version.knock)
        self.aliases = bool(version.special_case_aliases_auth)
        self.integers = bool(version.integer_power_levels)
        self.implicit_creator = bool(version.implicit_room_creator)
        self.creator_power = bool(version.creator_power)
        self.notifications = bool(version.limit_notifications_power_levels)
        self.redaction_domain = bool(version.redaction_needs_same_domain)

    # --- auth event selection ---------------------------------------------------

    cpdef set auth_types(self, event):
        return set(self._auth_keys(event))

    cdef list _auth_keys(self, event):
        """The keys of :meth:`auth_types` as a list (a key may come twice)."""
        cdef str etype = _field(event, F_TYPE)
        state_key = _field(event, F_STATE_KEY)
        if etype == _CREATE and state_key == "":
            return []
        sender = _field(event, F_SENDER)
        if etype != _MEMBER or state_key is None:
            return [_POWER_LEVELS_KEY, (_MEMBER, sender), _CREATE_KEY]
        # A membership event's own key is its target's: read, not built, and listed
        # once when the sender is the target.
        own = _field(event, F_KEY)
        cdef list keys = [_POWER_LEVELS_KEY, own if state_key == sender else (_MEMBER, sender),
                          _CREATE_KEY]
        membership = _field(event, F_MEMBERSHIP)
        if membership == "join" or membership == "invite" or membership == "knock":
            keys.append(_JOIN_RULES_KEY)
        if state_key != sender:
            keys.append(own)
        if membership == "invite":
            token = _ref._third_party_token(event)
            if token is not None:
                keys.append((_THIRD_PARTY_INVITE, token))
        if self.restricted and membership == "join":
            via = _get_or(_field(event, F_CONTENT), "join_authorised_via_users_server", None)
            if isinstance(via, str):
                keys.append((_MEMBER, via))
        return keys

    # --- power levels -------------------------------------------------------------

    def creators(self, create):
        cdef set found
        if self.implicit_creator:
            found = {_field(create, F_SENDER)}
        else:
            creator = _field(create, F_CONTENT).get("creator")
            found = {creator} if isinstance(creator, str) else set()
        if self.creator_power:
            extra = _field(create, F_CONTENT).get("additional_creators")
            if isinstance(extra, list):
                found.update(x for x in extra if isinstance(x, str))
        return frozenset(found)

    cdef list _creators_in(self, create, users):
        """The room's creators that *users* (a mapping) names, without building the
        set of :meth:`creators`."""
        cdef list named = []
        content = _field(create, F_CONTENT)
        first = _field(create, F_SENDER) if self.implicit_creator else _get_or(
            content, "creator", None)
        if isinstance(first, str) and first in users:
            named.append(first)
        extra = _get_or(content, "additional_creators", None)
        if isinstance(extra, list):
            for x in <list>extra:
                if isinstance(x, str) and x in users and x not in named:
                    named.append(x)
        return named

    cpdef bint is_creator(self, str user_id, create) except -1:
        if self.implicit_creator:
            if user_id == _field(create, F_SENDER):
                return True
        elif user_id == _field(create, F_CONTENT).get("creator"):
            return True
        if self.creator_power:
            extra = _field(create, F_CONTENT).get("additional_creators")
            return isinstance(extra, list) and user_id in <list>extra
        return False

    cpdef object user_level(self, str user_id, state):
        return self._user_level(user_id, _get(state, _CREATE_KEY),
                                _get(state, _POWER_LEVELS_KEY))

    cdef object _user_level(self, str user_id, create, levels):
        """:meth:`user_level` from the state's create and power levels events."""
        cdef PyObject* found
        if self.creator_power and create is not None and self.is_creator(user_id, create):
            return _CREATOR_LEVEL
        if levels is not None:
            content = _field(levels, F_CONTENT)
            users = _get_or(content, "users", None)
            if type(users) is dict:
                found = PyDict_GetItemWithError(<dict>users, user_id)
                if found != NULL:
                    level = _level(<object>found, False)
                    if level is not None:
                        return level
            elif isinstance(users, Mapping) and user_id in users:
                level = _level(users[user_id], False)
                if level is not None:
                    return level
            level = _level(_get_or(content, "users_default", None), False)
            return level if level is not None else 0
        if create is not None and _field(create, F_TYPE) == _CREATE and self.is_creator(user_id, create):
            return 100
        return 0

    cpdef object named_level(self, state, str name, object default):
        return self._named_level(_get(state, _POWER_LEVELS_KEY), name, default)

    cdef object _named_level(self, levels, str name, object default):
        if levels is None:
            return default
        level = _level(_get_or(_field(levels, F_CONTENT), name, None), False)
        return level if level is not None else default

    cpdef object send_level(self, str event_type, bint is_state, state):
        return self._send_level(event_type, is_state, _get(state, _POWER_LEVELS_KEY))

    cdef object _send_level(self, str event_type, bint is_state, levels):
        content = _field(levels, F_CONTENT) if levels is not None else _NO_LEVELS
        events = _get_or(content, "events", None)
        if _is_mapping(events) and event_type in events:
            level = _level(events[event_type], False)
            if level is not None:
                return level
        if is_state:
            level = _level(_get_or(content, "state_default", None), False)
            return level if level is not None else 50
        level = _level(_get_or(content, "events_default", None), False)
        return level if level is not None else 0

    # --- the rules against a state ----------------------------------------------

    cpdef object check(self, event, state):
        create = _get(state, _CREATE_KEY)
        if create is None:
            return ("no_create_event", "no create event in the room state")
        cdef str sender = _field(event, F_SENDER)
        if _get_or(_field(create, F_CONTENT), "m.federate", True) is not True and (
                _domain(sender) != _domain(_field(create, F_SENDER))):
            return ("not_federated", "the room does not federate")
        cdef str etype = _field(event, F_TYPE)
        state_key = _field(event, F_STATE_KEY)
        if etype == _ALIASES and self.aliases:
            if not state_key:
                return ("bad_aliases", "an aliases event needs a state_key")
            if state_key != _domain(sender):
                return ("bad_aliases", "aliases state_key is not the sender's server")
            return None
        if etype == _MEMBER:
            return self._check_membership(event, state, create)
        if _membership(state, sender) != "join":
            return ("not_in_room", f"{sender} is not joined to the room")
        levels = _get(state, _POWER_LEVELS_KEY)
        sender_level = self._user_level(sender, create, levels)
        if etype == _THIRD_PARTY_INVITE:
            if sender_level < self._named_level(levels, "invite", 0):
                return ("insufficient_power", "sender may not invite")
            return None
        needed = self._send_level(etype, state_key is not None, levels)
        if sender_level < needed:
            return ("insufficient_power",
                    f"sending {etype} needs level {needed}, sender has {sender_level}")
        if state_key is not None and (<str>state_key).startswith("@") and state_key != sender:
            return ("others_state", "state keyed by another user's ID")
        if etype == _POWER_LEVELS and state_key == "":
            return self._check_power_levels(event, levels, create, sender_level)
        if etype == _REDACTION and self.redaction_domain:
            if sender_level < self._named_level(levels, "redact", 50):
                target = _field(event, F_REDACTS)
                if target is not None and _domain(target) != _domain(_field(event, F_EVENT_ID)):
                    return ("insufficient_power", "sender may not redact that event")
        return None

    cdef object _check_join(self, event, state, create, sender_ms, join_rule):
        target = _field(event, F_STATE_KEY)
        prev = _field(event, F_PREV_EVENTS)
        if len(prev) == 1 and prev[0] == _field(create, F_EVENT_ID):
            first = _field(create, F_SENDER) if self.implicit_creator else _field(create, F_CONTENT).get("creator")
            if first == target:
                return None
        if _field(event, F_SENDER) != target:
            return ("membership_forbidden", "cannot join on behalf of another user")
        if sender_ms == "ban":
            return ("membership_forbidden", "sender is banned")
        if join_rule == "public":
            return None
        if ((self.restricted and join_rule == "restricted")
                or (self.knock_restricted and join_rule == "knock_restricted")):
            if sender_ms == "join" or sender_ms == "invite":
                return None
            via = _field(event, F_CONTENT).get("join_authorised_via_users_server")
            if not isinstance(via, str):
                return ("membership_forbidden",
                        "restricted join without join_authorised_via_users_server")
            if _membership(state, via) != "join":
                return ("membership_forbidden", f"authorising user {via} is not joined")
            if self.user_level(via, state) < self.named_level(state, "invite", 0):
                return ("membership_forbidden", f"authorising user {via} may not invite")
            return None
        if join_rule == "invite" or (self.knock and join_rule == "knock"):
            if sender_ms == "join" or sender_ms == "invite":
                return None
            return ("membership_forbidden", "the room is invite-only")
        return ("membership_forbidden", f"join rule {join_rule!r} forbids joining")

    cdef object _check_membership(self, event, state, create):
        target = _field(event, F_STATE_KEY)
        membership = _field(event, F_MEMBERSHIP)
        if target is None or membership is None:
            return ("malformed", "membership event without state_key or membership")
        if _get_or(_field(create, F_CONTENT), "m.federate", True) is not True and (
                _domain(target) != _domain(_field(create, F_SENDER))):
            return ("not_federated", "the room does not federate")
        cdef str sender = _field(event, F_SENDER)
        # The event's own key is the target's membership key.
        target_member = _get(state, _field(event, F_KEY))
        target_ms = _field(target_member, F_MEMBERSHIP) if target_member is not None else None
        sender_ms = target_ms if sender == target else _membership(state, sender)
        join_rules = _get(state, _JOIN_RULES_KEY)
        join_rule = _get_or(_field(join_rules, F_CONTENT), "join_rule", "invite") if join_rules else "invite"
        if membership == "join":
            return self._check_join(event, state, create, sender_ms, join_rule)
        if membership == "invite":
            if "third_party_invite" in _field(event, F_CONTENT):
                if target_ms == "ban":
                    return ("membership_forbidden", f"{target} is banned")
                if not self.third_party_ok(event, state):
                    return ("membership_forbidden", "third-party invite does not verify")
                return None
            if sender_ms != "join":
                return ("not_in_room", f"{sender} is not joined to the room")
            if target_ms == "join" or target_ms == "ban":
                return ("membership_forbidden", f"{target}'s membership is {target_ms}")
            levels = _get(state, _POWER_LEVELS_KEY)
            if self._user_level(sender, create, levels) < self._named_level(levels, "invite", 0):
                return ("insufficient_power", "sender may not invite")
            return None
        if membership == "leave" and sender == target:
            if sender_ms == "join" or sender_ms == "invite" or (
                    self.knock and sender_ms == "knock"):
                return None
            return ("membership_forbidden", f"{target} cannot leave from {sender_ms}")
        if membership == "leave" or membership == "ban":
            if sender_ms != "join":
                return ("not_in_room", f"{sender} is not joined to the room")
            levels = _get(state, _POWER_LEVELS_KEY)
            sender_level = self._user_level(sender, create, levels)
            ban_level = self._named_level(levels, "ban", 50)
            if membership == "ban":
                if sender_level >= ban_level and self._user_level(target, create, levels) < sender_level:
                    return None
                return ("insufficient_power", f"sender may not ban {target}")
            if target_ms == "ban" and sender_level < ban_level:
                return ("insufficient_power", "sender may not unban")
            if sender_level >= self._named_level(levels, "kick", 50) and (
                    self._user_level(target, create, levels) < sender_level):
                return None
            return ("insufficient_power", f"sender may not kick {target}")
        if membership == "knock" and self.knock:
            if join_rule != "knock" and not (self.knock_restricted
                                             and join_rule == "knock_restricted"):
                return ("membership_forbidden", f"join rule {join_rule!r} forbids knocking")
            if sender != target:
                return ("membership_forbidden", "cannot knock on behalf of another user")
            if sender_ms == "ban" or sender_ms == "invite" or sender_ms == "join":
                return ("membership_forbidden", f"cannot knock while {sender_ms}")
            return None
        return ("membership_forbidden", f"unknown membership {membership!r}")

    cdef object _new_levels_shape(self, new, create):
        cdef bint ints_only = self.integers
        for name in _LEVEL_KEYS:
            if name in new and _level(new[name], ints_only) is None:
                return ("bad_power_levels", f"{name} must be an integer")
        for group in ("events", "notifications", "users"):
            if group in new:
                values = new[group]
                if not _is_mapping(values):
                    return ("bad_power_levels", f"{group} must map to integer levels")
                for v in values.values():
                    if type(v) is not int and _level(v, ints_only) is None:
                        return ("bad_power_levels", f"{group} must map to integer levels")
        users = _get_or(new, "users", _NO_LEVELS)
        for user in users:
            if not _is_user_id(user):
                return ("bad_power_levels", f"{user!r} is not a user ID")
        if self.creator_power and users:
            named = self._creators_in(create, users)
            if named:
                return ("bad_power_levels",
                        f"creators may not be listed in users: {sorted(named)}")
        return None

    cdef object _check_power_levels(self, event, previous, create, sender_level):
        """The rules for a power levels event over the state's *previous* one."""
        new = _field(event, F_CONTENT)
        found = self._new_levels_shape(new, create)
        if found is not None:
            return found
        if previous is None:
            return None
        old = _field(previous, F_CONTENT)
        cdef list checks = [(None, name) for name in _LEVEL_KEYS]
        groups = ("users", "events", "notifications") if self.notifications else (
            "users", "events")
        for group_name in groups:
            checks.extend([(group_name, name) for name in _changed_names(old, new, group_name)])
        sender = _field(event, F_SENDER)
        for where, name in checks:
            if where is None and _same_value(old.get(name, _ABSENT), new.get(name, _ABSENT)):
                continue
            old_level = _read(old, where, name)
            new_level = _read(new, where, name)
            if old_level == new_level:
                continue
            if where == "users" and name != sender and old_level == sender_level:
                return ("insufficient_power",
                        f"sender may not change {name}'s level, equal to its own")
            if (old_level is not None and old_level > sender_level) or (
                    new_level is not None and new_level > sender_level):
                label = f"{where}.{name}" if where else name
                return ("insufficient_power",
                        f"sender may not change {label} beyond its own level")
        return None

    # --- state resolution -----------------------------------------------------------

    cdef object _auth_sender_level(self, event, events, fetch, bint* complete):
        create = levels = None
        complete[0] = True
        for aid in _field(event, F_AUTH_IDS):
            auth_event = _get(events, aid)
            if auth_event is None and fetch is not None:
                auth_event = fetch(aid)
            if auth_event is None:
                complete[0] = False
                continue
            if _field(auth_event, F_STATE_KEY) is None:
                continue
            key = _field(auth_event, F_KEY)
            if key == _CREATE_KEY:
                create = auth_event
            elif key == _POWER_LEVELS_KEY:
                levels = auth_event
        if create is None and _field(event, F_TYPE) != _CREATE:
            return 0
        return self._user_level(_field(event, F_SENDER), create, levels)

    def sender_levels(self, event_ids, events, dict memo, fetch=None):
        cdef dict out = {}
        cdef PyObject* found
        cdef bint complete
        for eid in event_ids:
            found = PyDict_GetItemWithError(memo, eid)
            if found != NULL:
                out[eid] = <object>found
                continue
            level = self._auth_sender_level(events[eid], events, fetch, &complete)
            if complete or fetch is not None:
                memo[eid] = level
            out[eid] = level
        return out

    cdef dict _auth_state(self, event, events, rejected, fetch):
        """The state the event's auth events not *rejected* define."""
        cdef dict state = {}
        for aid in _field(event, F_AUTH_IDS):
            auth_event = _get(events, aid)
            if auth_event is None and fetch is not None:
                auth_event = fetch(aid)
            if auth_event is not None and _field(auth_event, F_STATE_KEY) is not None and (
                    aid not in rejected):
                PyDict_SetItem(state, _field(auth_event, F_KEY), auth_event)
        return state

    def power_order(self, event_ids, full, events, dict memo, fetch=None):
        cdef dict index = {}
        cdef list nodes = [], ids = [], stack = list(event_ids), out = []
        cdef Py_ssize_t n, i, j, k, total = 0
        cdef int32_t* waiting = NULL
        cdef int32_t* start = NULL
        cdef int32_t* fill = NULL
        cdef int32_t* children = NULL
        cdef int32_t* seen = NULL
        cdef PyObject* found
        while stack:
            eid = stack.pop()
            if eid in index:
                continue
            event = events[eid]
            index[eid] = len(ids)
            ids.append(eid)
            nodes.append(event)
            for a in _field(event, F_AUTH_IDS):
                if a in full:
                    stack.append(a)
        n = len(ids)
        levels = self.sender_levels(ids, events, memo, fetch)
        try:
            waiting = <int32_t*>calloc(n + 1, sizeof(int32_t))
            start = <int32_t*>calloc(n + 2, sizeof(int32_t))
            fill = <int32_t*>calloc(n + 1, sizeof(int32_t))
            seen = <int32_t*>malloc((n + 1) * sizeof(int32_t))
            if waiting == NULL or start == NULL or fill == NULL or seen == NULL:
                raise MemoryError()
            for i in range(n):
                seen[i] = -1
            # Count each node's distinct parents (an event may list one twice), and
            # each parent's children.
            for i in range(n):
                for a in _field(<object>PyList_GET_ITEM(nodes, i), F_AUTH_IDS):
                    found = PyDict_GetItemWithError(index, a)
                    if found == NULL or a not in full:
                        continue
                    j = <object>found
                    if seen[j] != i:
                        seen[j] = <int32_t>i
                        waiting[i] += 1
                        start[j + 1] += 1
                        total += 1
            for i in range(n):
                start[i + 1] += start[i]
            children = <int32_t*>malloc((total + 1) * sizeof(int32_t))
            if children == NULL:
                raise MemoryError()
            for i in range(n):
                seen[i] = -1
            for i in range(n):
                for a in _field(<object>PyList_GET_ITEM(nodes, i), F_AUTH_IDS):
                    found = PyDict_GetItemWithError(index, a)
                    if found == NULL or a not in full:
                        continue
                    j = <object>found
                    if seen[j] != i:
                        seen[j] = <int32_t>i
                        children[start[j] + fill[j]] = <int32_t>i
                        fill[j] += 1
            out = _kahn_in_c(n, waiting, start, children, ids, nodes, levels)
            if out is not None:
                return out
            out = []
            ready = []
            for i in range(n):
                if waiting[i] == 0:
                    eid = <object>PyList_GET_ITEM(ids, i)
                    ready.append((-levels[eid],
                                  _field(<object>PyList_GET_ITEM(nodes, i), F_ORIGIN_SERVER_TS), eid, i))
            heapify(ready)
            while ready:
                entry = heappop(ready)
                out.append(entry[2])
                i = entry[3]
                for k in range(start[i], start[i + 1]):
                    j = children[k]
                    waiting[j] -= 1
                    if waiting[j] == 0:
                        eid = <object>PyList_GET_ITEM(ids, j)
                        heappush(ready, (-levels[eid],
                                         _field(<object>PyList_GET_ITEM(nodes, j), F_ORIGIN_SERVER_TS),
                                         eid, j))
            return out
        finally:
            free(waiting)
            free(start)
            free(fill)
            free(seen)
            free(children)

    cdef object _power_levels_parent(self, event_id, events, dict memo, fetch):
        cdef PyObject* kept = PyDict_GetItemWithError(memo, event_id)
        if kept != NULL:
            return <object>kept
        found = None
        cdef bint complete = True
        event = _get(events, event_id)
        if event is None and fetch is not None:
            event = fetch(event_id)
        if event is None:
            return None
        for aid in _field(event, F_AUTH_IDS):
            auth_event = _get(events, aid)
            if auth_event is None and fetch is not None:
                auth_event = fetch(aid)
            if auth_event is None:
                complete = False
            elif _field(auth_event, F_KEY) == _POWER_LEVELS_KEY:
                found = aid
                break
        if complete or fetch is not None:
            memo[event_id] = found
        return found

    def mainline_order(self, event_ids, power_levels_id, events, dict memo, fetch=None):
        cdef list mainline = [], keyed = [], walked
        cdef dict position = {}
        cdef Py_ssize_t i, n
        cdef PyObject* at
        current = power_levels_id
        while current is not None and (
                current in events or (fetch is not None and fetch(current) is not None)):
            mainline.append(current)
            current = self._power_levels_parent(current, events, memo, fetch)
        n = len(mainline)
        for i in range(n):
            position[mainline[n - 1 - i]] = i + 1
        for eid in event_ids:
            at = PyDict_GetItemWithError(position, eid)
            if at != NULL:
                found = <object>at
            else:
                walked = []
                found = 0
                current = eid
                while current is not None:
                    at = PyDict_GetItemWithError(position, current)
                    if at != NULL:
                        found = <object>at
                        break
                    walked.append(current)
                    current = self._power_levels_parent(current, events, memo, fetch)
                for w in walked:
                    position[w] = found
            keyed.append((found, _field(_item(events, eid), F_ORIGIN_SERVER_TS), eid))
        ordered = _sorted_in_c(keyed)
        if ordered is not None:
            return ordered
        keyed.sort()
        return [entry[2] for entry in keyed]

    def check_in_order(self, order, events, dict resolved, base, hidden, rejected,
                       check_create, fetch=None):
        cdef dict state
        cdef PyObject* found
        for eid in order:
            event = _item(events, eid)
            if _field(event, F_STATE_KEY) is None or eid in rejected:
                continue
            if _field(event, F_TYPE) == _CREATE and _field(event, F_STATE_KEY) == "":
                if check_create(event):
                    resolved[_field(event, F_KEY)] = eid
                continue
            state = self._auth_state(event, events, rejected, fetch)
            for key in self._auth_keys(event):
                found = PyDict_GetItemWithError(resolved, key)
                if found != NULL:
                    held = <object>found
                else:
                    if base is None or key in hidden:
                        continue
                    held = _get(base, key)
                    if held is None:
                        continue
                if held in rejected:
                    continue
                held_event = _get(events, held)
                if held_event is None:
                    held_event = fetch(held) if fetch is not None else None
                    if held_event is None:
                        continue
                PyDict_SetItem(state, key, held_event)
            if self.check(event, state) is None:
                resolved[_field(event, F_KEY)] = eid
