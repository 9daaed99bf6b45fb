# cython: language_level=3
"""Auth chains over a room's auth DAG with dense integer event IDs (compiled core).

Same API and results as :mod:`streamrep._pure.authchain`; see there for the
definitions. Edges live in one growing int32 buffer with a (start, count) pair per
event; walks use an epoch-stamped visit array and a counter array kept between calls,
so a query touches only the events it reaches and allocates one stack.
"""

from cpython.array cimport array, clone
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport Py_EQ, PyObject_RichCompareBool
from cpython.ref cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memset

cimport cython

__all__ = ["AuthGraph", "HeldBy"]

cdef array _Q_TEMPLATE = array("q")
cdef int64_t _MAX_NODE = 2**31 - 2


cdef int _cmp_int32(const void* a, const void* b) noexcept nogil:
    cdef int32_t x = (<const int32_t*>a)[0]
    cdef int32_t y = (<const int32_t*>b)[0]
    return (x > y) - (x < y)


cdef array _sorted_array(int32_t* buf, Py_ssize_t count):
    qsort(buf, count, sizeof(int32_t), _cmp_int32)
    cdef array out = clone(_Q_TEMPLATE, count, False)
    cdef Py_ssize_t k
    for k in range(count):
        out.data.as_longlongs[k] = buf[k]
    return out


cdef int32_t _node(object value) except -1:
    cdef int64_t node = value
    if node < 0 or node > _MAX_NODE:
        raise ValueError(f"event number {node} outside 0..{_MAX_NODE}")
    return <int32_t>node


cdef class HeldBy:
    """A test for :meth:`AuthGraph.in_chain_of` (see the pure twin), asked without a
    Python call: the key's hash is worked out once, for the state's lookup."""

    cdef list ids
    cdef list keys
    cdef dict state
    cdef object hidden
    cdef object otherwise

    def __init__(self, ids, keys, state, hidden, otherwise):
        self.ids = ids if type(ids) is list else list(ids)
        self.keys = keys if type(keys) is list else list(keys)
        self.state = state if type(state) is dict else dict(state)
        self.hidden = hidden
        self.otherwise = otherwise

    cdef int holds(self, Py_ssize_t node) except -1:
        cdef PyObject* found
        key = <object>PyList_GET_ITEM(self.keys, node) if node < len(self.keys) else None
        if key is None:
            return 1 if self.otherwise(self.ids[node]) else 0
        # The hidden keys first: a merge's own events are mostly under them, and
        # they are few (in the caches), the state many.
        if key in self.hidden:
            return 0
        found = PyDict_GetItem(self.state, key)
        if found == NULL:
            return 0
        return 1 if _same(<object>found, self.ids[node]) else 0

    def __call__(self, node):
        return self.holds(_node(node)) == 1


cdef inline bint _same(object a, object b) except -1:
    return a is b or PyObject_RichCompareBool(a, b, Py_EQ)


cdef inline int _ask(object accepts, int32_t node) except -1:
    if type(accepts) is HeldBy:
        return (<HeldBy>accepts).holds(node)
    return 1 if accepts(node) else 0


cdef class AuthGraph:
    """The auth edges of one room's events."""

    cdef int32_t* _start
    cdef int32_t* _count
    cdef uint32_t* _stamp
    cdef uint32_t* _mark
    cdef int32_t* _tally
    cdef int32_t* _edges
    # The state events citing each event, as linked lists: the first link of
    # each node, then each link's event and the next link (-1 ends a list).
    cdef int32_t* _first_link
    cdef int32_t* _link_node
    cdef int32_t* _link_next
    cdef Py_ssize_t _n_links
    cdef Py_ssize_t _link_cap
    cdef Py_ssize_t _nodes
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _n_edges
    cdef Py_ssize_t _edge_cap
    cdef uint32_t _epoch

    def __cinit__(self):
        self._start = NULL
        self._count = NULL
        self._stamp = NULL
        self._mark = NULL
        self._tally = NULL
        self._edges = NULL
        self._first_link = NULL
        self._link_node = NULL
        self._link_next = NULL
        self._n_links = 0
        self._link_cap = 0
        self._nodes = 0
        self._cap = 0
        self._n_edges = 0
        self._edge_cap = 0
        self._epoch = 0

    def __dealloc__(self):
        free(self._start)
        free(self._count)
        free(self._stamp)
        free(self._mark)
        free(self._tally)
        free(self._edges)
        free(self._first_link)
        free(self._link_node)
        free(self._link_next)

    @property
    def node_count(self):
        """One more than the highest event number mentioned so far."""
        return self._nodes

    cdef int _grow(self, Py_ssize_t node) except -1:
        cdef Py_ssize_t cap, old
        if node < self._nodes:
            return 0
        if node >= self._cap:
            cap = max(64, self._cap * 2, node + 1)
            self._start = <int32_t*>_realloc(self._start, cap * sizeof(int32_t))
            self._count = <int32_t*>_realloc(self._count, cap * sizeof(int32_t))
            self._stamp = <uint32_t*>_realloc(self._stamp, cap * sizeof(uint32_t))
            self._mark = <uint32_t*>_realloc(self._mark, cap * sizeof(uint32_t))
            self._tally = <int32_t*>_realloc(self._tally, cap * sizeof(int32_t))
            self._first_link = <int32_t*>_realloc(self._first_link, cap * sizeof(int32_t))
            old = self._cap
            memset(self._stamp + old, 0, (cap - old) * sizeof(uint32_t))
            memset(self._mark + old, 0, (cap - old) * sizeof(uint32_t))
            memset(self._tally + old, 0, (cap - old) * sizeof(int32_t))
            self._cap = cap
        memset(self._start + self._nodes, 0, (node + 1 - self._nodes) * sizeof(int32_t))
        memset(self._count + self._nodes, 0, (node + 1 - self._nodes) * sizeof(int32_t))
        memset(self._first_link + self._nodes, 0xFF, (node + 1 - self._nodes) * sizeof(int32_t))
        self._nodes = node + 1
        return 0

    cdef uint32_t _next_epoch(self):
        self._epoch += 1
        if self._epoch == 0:
            memset(self._stamp, 0, self._cap * sizeof(uint32_t))
            memset(self._mark, 0, self._cap * sizeof(uint32_t))
            self._epoch = 1
        return self._epoch

    def set_auth_events(self, node, auth, bint state=True):
        """Record event *node*'s auth events (replacing any recorded before); *state*:
        whether it is a state event (one other events may cite), which
        :meth:`in_chain_of` walks to from its auth events."""
        cdef int32_t n = _node(node)
        cdef list parents = [_node(p) for p in auth]
        cdef Py_ssize_t k = len(parents), i, highest = n
        for i in range(k):
            if <int32_t>parents[i] > highest:
                highest = <int32_t>parents[i]
        self._grow(highest)
        if self._n_edges + k > self._edge_cap:
            cap = max(256, self._edge_cap * 2, self._n_edges + k)
            self._edges = <int32_t*>_realloc(self._edges, cap * sizeof(int32_t))
            self._edge_cap = cap
        for i in range(k):
            self._edges[self._n_edges + i] = <int32_t>parents[i]
        self._start[n] = <int32_t>self._n_edges
        self._count[n] = <int32_t>k
        self._n_edges += k
        if state:
            for i in range(k):
                self._link(<int32_t>parents[i], n)

    cdef int _link(self, int32_t parent, int32_t child) except -1:
        """Put *child* first among the events citing *parent*."""
        cdef Py_ssize_t cap
        if self._n_links == self._link_cap:
            cap = max(256, self._link_cap * 2)
            self._link_node = <int32_t*>_realloc(self._link_node, cap * sizeof(int32_t))
            self._link_next = <int32_t*>_realloc(self._link_next, cap * sizeof(int32_t))
            self._link_cap = cap
        self._link_node[self._n_links] = child
        self._link_next[self._n_links] = self._first_link[parent]
        self._first_link[parent] = <int32_t>self._n_links
        self._n_links += 1
        return 0

    cdef bint _cites(self, int32_t child, int32_t parent) noexcept:
        """Whether *child*'s auth events (as now recorded) include *parent*."""
        cdef int32_t j
        for j in range(self._start[child], self._start[child] + self._count[child]):
            if self._edges[j] == parent:
                return True
        return False

    def in_chain_of(self, nodes, accepts, limit):
        """Those of *nodes* in the full auth chain of an event *accepts* takes (see the
        pure twin), in ascending order; None past *limit* events asked about."""
        cdef list starts = sorted({_node(value) for value in nodes})
        cdef Py_ssize_t asked = 0, budget = limit
        cdef int32_t x
        cdef int found_here
        cdef uint32_t marks[3]
        cdef int32_t* stack = self._stack()
        cdef int32_t* visited = self._stack()
        cdef list found = []
        try:
            marks[0] = self._next_epoch()  # accepted, or reaches one
            marks[1] = self._next_epoch()  # asked about and not accepted
            marks[2] = self._next_epoch()  # reaches none
            for x in starts:
                if x >= self._nodes:
                    found_here = _ask(accepts, x)
                else:
                    found_here = self._reaches(x, accepts, marks, stack, visited, &asked,
                                               budget)
                if found_here < 0:
                    return None
                if found_here:
                    found.append(x)
            return array("q", found)
        finally:
            free(stack)
            free(visited)

    cdef int _reaches(self, int32_t x, object accepts, uint32_t* marks, int32_t* stack,
                      int32_t* visited, Py_ssize_t* asked, Py_ssize_t limit) except -2:
        """Walk from *x* to the state events citing it, and on, until one *accepts*
        takes (1) or none is left (0, and every event walked is marked as reaching
        none); -1 when *asked* would pass *limit*."""
        cdef uint32_t* mark = self._mark
        cdef uint32_t* stamp = self._stamp
        cdef uint32_t epoch = self._next_epoch()
        cdef Py_ssize_t depth = 1, n_visited = 0, i
        cdef int32_t node, c, link
        stamp[x] = epoch
        stack[0] = x
        while depth > 0:
            depth -= 1
            node = stack[depth]
            if mark[node] == marks[0]:
                mark[x] = marks[0]
                return 1
            if mark[node] == marks[2]:
                continue
            visited[n_visited] = node
            n_visited += 1
            if mark[node] != marks[1]:
                asked[0] += 1
                if asked[0] > limit:
                    return -1
                if _ask(accepts, node):
                    mark[node] = marks[0]
                    mark[x] = marks[0]
                    return 1
                mark[node] = marks[1]
            link = self._first_link[node]
            while link != -1:
                c = self._link_node[link]
                if stamp[c] != epoch and self._cites(c, node):
                    stamp[c] = epoch
                    stack[depth] = c
                    depth += 1
                link = self._link_next[link]
        for i in range(n_visited):
            mark[visited[i]] = marks[2]
        return 0

    def auth_events(self, node):
        """The auth events recorded for *node*."""
        cdef int32_t n = _node(node)
        cdef array out
        cdef int32_t i
        if n >= self._nodes:
            return clone(_Q_TEMPLATE, 0, False)
        out = clone(_Q_TEMPLATE, self._count[n], False)
        for i in range(self._count[n]):
            out.data.as_longlongs[i] = self._edges[self._start[n] + i]
        return out

    cdef int32_t* _stack(self, Py_ssize_t extra=0) except NULL:
        cdef int32_t* stack = <int32_t*>malloc((self._nodes + extra + 1) * sizeof(int32_t))
        if stack == NULL:
            raise MemoryError()
        return stack

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef Py_ssize_t _walk(self, int32_t* stack, Py_ssize_t depth, uint32_t epoch,
                          int32_t* out, Py_ssize_t n_out, bint tally,
                          uint32_t stop=0) noexcept:
        """Walk up from the stacked nodes, stamping with *epoch*; newly stamped nodes
        are appended to *out* (when tallying: only on their first tally)."""
        cdef int32_t node, p
        cdef int32_t j, end
        cdef int32_t* edges = self._edges
        cdef uint32_t* stamp = self._stamp
        while depth > 0:
            depth -= 1
            node = stack[depth]
            end = self._start[node] + self._count[node]
            for j in range(self._start[node], end):
                p = edges[j]
                if stamp[p] != epoch and (stop == 0 or self._mark[p] != stop):
                    stamp[p] = epoch
                    stack[depth] = p
                    depth += 1
                    if tally:
                        self._tally[p] += 1
                        if self._tally[p] == 1:
                            out[n_out] = p
                            n_out += 1
                    else:
                        out[n_out] = p
                        n_out += 1
        return n_out

    def auth_chain(self, roots):
        """Every event reachable from *roots* along auth edges."""
        cdef list nodes = sorted({_node(value) for value in roots})
        cdef Py_ssize_t depth = 0, n_out = 0
        cdef uint32_t epoch
        cdef int32_t r
        cdef int32_t* stack = self._stack(len(nodes))
        cdef int32_t* out = self._stack()
        try:
            epoch = self._next_epoch()
            for r in nodes:
                if r < self._nodes:
                    # A root is pushed here and maybe once more when another reaches it.
                    stack[depth] = r
                    depth += 1
            n_out = self._walk(stack, depth, epoch, out, 0, False)
            return _sorted_array(out, n_out)
        finally:
            free(stack)
            free(out)

    def auth_chain_difference(self, sets, common=()):
        """Events in the full auth chain of some but not all of *sets*; *common*
        names events in every set, walked once (see the pure twin)."""
        cdef list groups = [[_node(value) for value in roots] for roots in sets]
        cdef array shared = _node_array(common)
        cdef long long* shared_p = shared.data.as_longlongs
        cdef Py_ssize_t n_shared = len(shared)
        cdef Py_ssize_t k = len(groups), depth, n_touched = 0, n_out = 0, i
        cdef uint32_t epoch, stop = 0
        cdef int32_t r
        cdef bint unknown = False
        cdef int32_t* stack
        cdef int32_t* touched
        cdef int32_t* tally = self._tally
        cdef uint32_t* stamp = self._stamp
        cdef uint32_t* mark = self._mark
        if k < 2:
            return clone(_Q_TEMPLATE, 0, False)
        stack = self._stack(n_shared)
        touched = self._stack(n_shared)
        try:
            stop = self._next_epoch()
            depth = 0
            for i in range(n_shared):
                r = <int32_t>shared_p[i]
                if r >= self._nodes:
                    unknown = True
                elif stamp[r] != stop:
                    stamp[r] = stop
                    stack[depth] = r
                    depth += 1
                    touched[n_touched] = r
                    n_touched += 1
            n_touched = self._walk(stack, depth, stop, touched, n_touched, False)
            for i in range(n_touched):
                mark[touched[i]] = stop
            n_touched = 0
            for group in groups:
                epoch = self._next_epoch()
                depth = 0
                for r in group:
                    if r >= self._nodes:
                        unknown = True
                    elif stamp[r] != epoch and mark[r] != stop:
                        stamp[r] = epoch
                        stack[depth] = r
                        depth += 1
                        tally[r] += 1
                        if tally[r] == 1:
                            touched[n_touched] = r
                            n_touched += 1
                n_touched = self._walk(stack, depth, epoch, touched, n_touched, True, stop)
            for i in range(n_touched):
                r = touched[i]
                if tally[r] < k:
                    touched[n_out] = r
                    n_out += 1
                tally[r] = 0
            found = _sorted_array(touched, n_out)
            if unknown:
                # Roots never described count as reached only by the sets naming them.
                return _merge_unknown(found, groups, self._nodes, k, shared.tolist())
            return found
        finally:
            free(stack)
            free(touched)

    def conflicted_subgraph(self, conflicted):
        """Events on some auth path between two of *conflicted* (those included)."""
        cdef list targets = [_node(value) for value in conflicted]
        cdef Py_ssize_t depth = 0, n_anc = 0, i, total, n_found = 0
        cdef uint32_t up, down
        cdef int32_t r, node, p, j, pos
        cdef int32_t* stack = self._stack()
        cdef int32_t* anc = self._stack()
        cdef int32_t* found = self._stack()
        cdef int32_t* offsets = NULL
        cdef int32_t* children = NULL
        cdef int32_t* fill = NULL
        cdef int32_t* tally = self._tally
        cdef uint32_t* stamp = self._stamp
        extra = sorted({t for t in targets if t >= self._nodes})
        try:
            up = self._next_epoch()
            for r in targets:
                if r < self._nodes and stamp[r] != up:
                    stamp[r] = up
                    stack[depth] = r
                    depth += 1
                    anc[n_anc] = r
                    n_anc += 1
            n_anc = self._walk(stack, depth, up, anc, n_anc, False)
            # Position of each ancestor (+1) in tally, then children lists in CSR form.
            for i in range(n_anc):
                tally[anc[i]] = <int32_t>(i + 1)
            offsets = <int32_t*>_calloc32(n_anc + 1)
            total = 0
            for i in range(n_anc):
                node = anc[i]
                for j in range(self._start[node], self._start[node] + self._count[node]):
                    p = self._edges[j]
                    if stamp[p] == up:
                        offsets[tally[p]] += 1
                        total += 1
            for i in range(n_anc):
                offsets[i + 1] += offsets[i]
            children = <int32_t*>_calloc32(total + 1)
            fill = <int32_t*>_calloc32(n_anc + 1)
            for i in range(n_anc):
                node = anc[i]
                for j in range(self._start[node], self._start[node] + self._count[node]):
                    p = self._edges[j]
                    if stamp[p] == up:
                        pos = tally[p] - 1
                        children[offsets[pos] + fill[pos]] = node
                        fill[pos] += 1
            down = self._next_epoch()
            depth = 0
            for r in targets:
                if r < self._nodes and stamp[r] != down:
                    stamp[r] = down
                    stack[depth] = r
                    depth += 1
            n_found = 0
            while depth > 0:
                depth -= 1
                node = stack[depth]
                found[n_found] = node
                n_found += 1
                pos = tally[node] - 1
                for j in range(offsets[pos], offsets[pos + 1]):
                    p = children[j]
                    if stamp[p] != down:
                        stamp[p] = down
                        stack[depth] = p
                        depth += 1
            for i in range(n_anc):
                tally[anc[i]] = 0
            result = _sorted_array(found, n_found)
            if extra:
                merged = sorted(set(result.tolist()) | set(extra))
                return array("q", merged)
            return result
        finally:
            free(stack)
            free(anc)
            free(found)
            free(offsets)
            free(children)
            free(fill)


cdef array _node_array(object values):
    """*values* as an array of checked event numbers (an ``array('q')`` is not copied)."""
    cdef array out
    cdef Py_ssize_t i
    if type(values) is array and (<array>values).ob_descr.typecode == b"q":
        out = <array>values
        for i in range(len(out)):
            if out.data.as_longlongs[i] < 0 or out.data.as_longlongs[i] > _MAX_NODE:
                raise ValueError(
                    f"event number {out.data.as_longlongs[i]} outside 0..{_MAX_NODE}")
        return out
    return array("q", [_node(value) for value in values])


cdef void* _realloc(void* ptr, size_t size) except NULL:
    cdef void* out = realloc(ptr, size)
    if out == NULL:
        raise MemoryError()
    return out


cdef void* _calloc32(Py_ssize_t count) except NULL:
    cdef void* out = malloc(count * sizeof(int32_t) + 4)
    if out == NULL:
        raise MemoryError()
    memset(out, 0, count * sizeof(int32_t) + 4)
    return out


cdef object _merge_unknown(array found, list groups, Py_ssize_t nodes, Py_ssize_t k,
                          list shared):
    # Events beyond node_count have no auth events: a set reaches them only by
    # naming them, so they are in the difference unless every set names them.
    counts = {}
    common = set(shared)
    for group in groups:
        for r in set(group):
            if r >= nodes and r not in common:
                counts[r] = counts.get(r, 0) + 1
    extra = [r for r, c in counts.items() if c < k]
    if not extra:
        return found
    return array("q", sorted(set(found.tolist()) | set(extra)))
