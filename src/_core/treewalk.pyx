# cython: language_level=3
"""Walking state-group trees (compiled core).

Same API, results and error messages as ``streamrep._pure.treewalk`` (read its
docstring). Each tree is walked depth first holding one path's state: a C array
from dense key to event, an undo log of (key, previous event), the state's size
and its digest as a 256-bit sum. SHA-256 is computed here, per entry, without
the GIL.
"""

from cpython cimport array
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free, qsort
from libc.string cimport memcmp, memcpy, memset

import array as _pyarray

from streamrep._core.compress import level_radices
from streamrep._core.state cimport Int64s, raw_flags
from streamrep.errors import StateCorruptionError

__all__ = [
    "DIGEST_VERSION",
    "EMPTY_STATE_DIGEST",
    "digest_state",
    "digest_groups",
    "StateWalk",
    "plan_compression",
    "rows_hash",
    "group_rows_hashes",
    "StringInterner",
]

DIGEST_VERSION = 2
EMPTY_STATE_DIGEST = "0" * 64

cdef enum:
    ABSENT = -1

cdef array.array _INT64_TEMPLATE = _pyarray.array("q")


# --- SHA-256 -------------------------------------------------------------------------

cdef uint32_t _K[64]
_K[:] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]


cdef inline uint32_t _rotr(uint32_t x, int n) noexcept nogil:
    return (x >> n) | (x << (32 - n))


cdef void _sha_block(uint32_t* h, const unsigned char* block) noexcept nogil:
    cdef uint32_t w[64]
    cdef uint32_t a, b, c, d, e, f, g, hh, s0, s1, t1, t2
    cdef int i
    for i in range(16):
        w[i] = ((<uint32_t>block[4 * i] << 24) | (<uint32_t>block[4 * i + 1] << 16)
                | (<uint32_t>block[4 * i + 2] << 8) | <uint32_t>block[4 * i + 3])
    for i in range(16, 64):
        s0 = _rotr(w[i - 15], 7) ^ _rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
        s1 = _rotr(w[i - 2], 17) ^ _rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
        w[i] = w[i - 16] + s0 + w[i - 7] + s1
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; hh = h[7]
    for i in range(64):
        s1 = _rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)
        t1 = hh + s1 + ((e & f) ^ ((~e) & g)) + _K[i] + w[i]
        s0 = _rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22)
        t2 = s0 + ((a & b) ^ (a & c) ^ (b & c))
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh


cdef void _sha256(const unsigned char* data, Py_ssize_t length, uint32_t* h) noexcept nogil:
    """SHA-256 of *data* into the eight words *h*."""
    cdef unsigned char tail[128]
    cdef Py_ssize_t done = 0, rest, i, pad
    cdef uint64_t bits = (<uint64_t>length) * 8
    h[0] = 0x6a09e667; h[1] = 0xbb67ae85; h[2] = 0x3c6ef372; h[3] = 0xa54ff53a
    h[4] = 0x510e527f; h[5] = 0x9b05688c; h[6] = 0x1f83d9ab; h[7] = 0x5be0cd19
    while length - done >= 64:
        _sha_block(h, data + done)
        done += 64
    rest = length - done
    memset(tail, 0, 128)
    if rest:
        memcpy(tail, data + done, rest)
    tail[rest] = 0x80
    pad = 64 if rest < 56 else 128
    for i in range(8):
        tail[pad - 1 - i] = (bits >> (8 * i)) & 0xFF
    _sha_block(h, tail)
    if pad == 128:
        _sha_block(h, tail + 64)


# --- digests ---------------------------------------------------------------------------


cdef struct Digest:
    # A 256-bit unsigned sum, least significant limb first.
    uint64_t limb[4]


cdef inline void _add(Digest* d, const uint32_t* h) noexcept nogil:
    cdef uint64_t carry = 0, carry2, x, s, s2
    cdef int i
    for i in range(4):
        # Limb i holds hash words 7 - 2i (low) and 6 - 2i (high).
        x = ((<uint64_t>h[6 - 2 * i]) << 32) | h[7 - 2 * i]
        s = d.limb[i] + x
        carry2 = s < x
        s2 = s + carry
        carry = carry2 | (s2 < s)
        d.limb[i] = s2


cdef inline void _sub(Digest* d, const uint32_t* h) noexcept nogil:
    cdef uint64_t borrow = 0, b1, x, s, t
    cdef int i
    for i in range(4):
        x = ((<uint64_t>h[6 - 2 * i]) << 32) | h[7 - 2 * i]
        s = d.limb[i] - x
        b1 = d.limb[i] < x
        t = s - borrow
        borrow = b1 | (s < borrow)
        d.limb[i] = t


cdef bytes _hex(const Digest* d):
    cdef char out[64]
    cdef const char* digits = b"0123456789abcdef"
    cdef int i, j
    cdef uint64_t limb
    for i in range(4):
        limb = d.limb[3 - i]
        for j in range(16):
            out[16 * i + 15 - j] = digits[limb & 0xF]
            limb >>= 4
    return out[:64]


cdef class _Strings:
    """One ``(offsets, data)`` string table."""
    cdef Int64s offsets
    cdef const unsigned char[::1] data
    cdef const unsigned char* ptr
    cdef Py_ssize_t count
    cdef str name

    def __cinit__(self, object table, str name):
        try:
            offsets, data = table
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be an (offsets, data) pair")
        self.name = name
        self.offsets = Int64s(offsets, f"{name} offsets")
        self.data = memoryview(data if data is not None else b"").cast("B")
        self.ptr = &self.data[0] if self.data.shape[0] else NULL
        self.count = self.offsets.length - 1
        cdef Py_ssize_t i
        for i in range(self.count):
            if (self.offsets.ptr[i] < 0 or self.offsets.ptr[i + 1] < self.offsets.ptr[i]
                    or self.offsets.ptr[i + 1] > self.data.shape[0]):
                raise ValueError(f"{name} offsets at index {i} are outside the string data")


cdef class _Hasher:
    """Entry hashes from interned IDs and the batch's string tables."""
    cdef _Strings types
    cdef _Strings state_keys
    cdef _Strings events
    cdef int64_t stride
    cdef unsigned char* buf
    cdef Py_ssize_t cap

    def __dealloc__(self):
        free(self.buf)

    cdef int check(self, int64_t key, int64_t event) except -1:
        if key < 0:
            raise ValueError(f"key index {key} is negative")
        if key // self.stride >= self.types.count:
            raise ValueError(f"type index {key // self.stride} is outside its string table")
        if key % self.stride >= self.state_keys.count:
            raise ValueError(f"state_key index {key % self.stride} is outside its string table")
        if event >= self.events.count:
            raise ValueError(f"event_id index {event} is outside its string table")
        return 0

    cdef int reserve(self, Py_ssize_t size) except -1 nogil:
        cdef unsigned char* grown
        if size <= self.cap:
            return 0
        grown = <unsigned char*>realloc(self.buf, size * 2)
        if grown == NULL:
            with gil:
                raise MemoryError()
        self.buf = grown
        self.cap = size * 2
        return 0

    cdef int entry(self, int64_t key, int64_t event, uint32_t* h) except -1 nogil:
        cdef int64_t t = key // self.stride, s = key % self.stride
        cdef int64_t t0 = self.types.offsets.ptr[t], t1 = self.types.offsets.ptr[t + 1]
        cdef int64_t s0 = self.state_keys.offsets.ptr[s], s1 = self.state_keys.offsets.ptr[s + 1]
        cdef int64_t e0 = self.events.offsets.ptr[event], e1 = self.events.offsets.ptr[event + 1]
        cdef Py_ssize_t n = 0
        self.reserve(12 + (t1 - t0) + (s1 - s0) + (e1 - e0))
        n = _put(self.buf, n, self.types.ptr, t0, t1)
        n = _put(self.buf, n, self.state_keys.ptr, s0, s1)
        n = _put(self.buf, n, self.events.ptr, e0, e1)
        _sha256(self.buf, n, h)
        return 0


cdef inline Py_ssize_t _put(unsigned char* out, Py_ssize_t n, const unsigned char* data,
                            int64_t lo, int64_t hi) noexcept nogil:
    cdef uint32_t length = <uint32_t>(hi - lo)
    out[n] = (length >> 24) & 0xFF
    out[n + 1] = (length >> 16) & 0xFF
    out[n + 2] = (length >> 8) & 0xFF
    out[n + 3] = length & 0xFF
    if hi > lo:
        memcpy(out + n + 4, data + lo, hi - lo)
    return n + 4 + (hi - lo)


def digest_state(state):
    """The digest of one full state given as ``{(type, state_key): event_id}``.

    Agrees with :func:`digest_groups` for the same state; an empty state gives
    :data:`EMPTY_STATE_DIGEST`.
    """
    from collections.abc import Mapping

    items = state.items() if isinstance(state, Mapping) else state
    cdef Digest total
    cdef uint32_t h[8]
    cdef bytearray blob
    memset(&total, 0, sizeof(Digest))
    for (t, s), e in items:
        blob = bytearray()
        for part in (t.encode("utf-8"), s.encode("utf-8"), e.encode("utf-8")):
            blob += len(part).to_bytes(4, "big")
            blob += part
        _sha256(<const unsigned char*><char*>blob, len(blob), h)
        _add(&total, h)
    return _hex(&total).decode("ascii")


cdef inline uint64_t _top64(const uint32_t* h) noexcept nogil:
    return ((<uint64_t>h[0]) << 32) | h[1]


def rows_hash(rows):
    """The hash of a multiset of delta rows ``(type, state_key, event_id)``: the
    sum, as a signed 64-bit integer with wraparound, of the first 8 bytes
    (big-endian) of each row's entry hash. :func:`group_rows_hashes` computes it
    per group of a batch; the database computes it with SQL."""
    cdef uint64_t total = 0
    cdef uint32_t h[8]
    cdef bytearray blob
    for t, s, e in rows:
        blob = bytearray()
        for part in (t.encode("utf-8"), s.encode("utf-8"), e.encode("utf-8")):
            blob += len(part).to_bytes(4, "big")
            blob += part
        _sha256(<const unsigned char*><char*>blob, len(blob), h)
        total += _top64(h)
    return <int64_t>total


def group_rows_hashes(delta_offsets, delta_keys, delta_events, int64_t key_stride, types,
                      state_keys, event_ids):
    """:func:`rows_hash` of each group's delta rows (CSR, interned as for
    :func:`digest_groups`)."""
    if key_stride <= 0:
        raise ValueError("key_stride must be positive")
    cdef Int64s offsets = Int64s(delta_offsets, "delta_offsets")
    cdef Int64s keys = Int64s(delta_keys, "delta_keys")
    cdef Int64s events = Int64s(delta_events, "delta_events")
    if keys.length != events.length or not offsets.length or offsets.ptr[offsets.length - 1] != keys.length:
        raise ValueError("delta_offsets must end at len(delta_keys) == len(delta_events)")
    cdef _Hasher hasher = _Hasher()
    hasher.types = _Strings(types, "type")
    hasher.state_keys = _Strings(state_keys, "state_key")
    hasher.events = _Strings(event_ids, "event_id")
    hasher.stride = key_stride
    cdef Py_ssize_t i, x, n = offsets.length - 1
    for x in range(keys.length):
        hasher.check(keys.ptr[x], events.ptr[x])
    cdef array.array out = array.clone(_INT64_TEMPLATE, n, zero=False)
    cdef int64_t* o = <int64_t*>out.data.as_voidptr
    cdef uint64_t total
    cdef uint32_t h[8]
    with nogil:
        for i in range(n):
            total = 0
            for x in range(offsets.ptr[i], offsets.ptr[i + 1]):
                hasher.entry(keys.ptr[x], events.ptr[x], h)
                total += _top64(h)
            o[i] = <int64_t>total
    return out


# --- a checked batch -----------------------------------------------------------------


cdef struct KeyRow:
    int64_t key
    int64_t row


cdef int _cmp_key_row(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const KeyRow*>a).key
    cdef int64_t y = (<const KeyRow*>b).key
    return (x > y) - (x < y)


cdef void* _alloc(Py_ssize_t count, size_t size) except NULL:
    cdef void* p = malloc((count if count > 0 else 1) * size)
    if p == NULL:
        raise MemoryError()
    return p


cdef inline uint64_t _mix64(uint64_t x) noexcept nogil:
    x ^= x >> 33
    x *= <uint64_t>0xff51afd7ed558ccd
    x ^= x >> 33
    x *= <uint64_t>0xc4ceb9fe1a85ec53
    x ^= x >> 33
    return x


cdef Py_ssize_t _dense_keys(const int64_t* keys, Py_ssize_t rows, int64_t* dense,
                            int64_t* key_values) except -1:
    """Number each distinct key of *keys* by its rank (into *dense*, per row)
    and list them in order (into *key_values*); returns how many there are."""
    cdef Py_ssize_t cap = 1024, count = 0, x, r
    cdef uint64_t mask, h
    cdef int64_t k
    cdef int64_t* slot = <int64_t*>_alloc(cap, sizeof(int64_t))
    cdef int64_t* grown
    cdef KeyRow* ranked = NULL
    cdef int64_t* rank = NULL
    try:
        with nogil:
            for x in range(cap):
                slot[x] = -1
            mask = cap - 1
            for x in range(rows):
                k = keys[x]
                h = _mix64(<uint64_t>k) & mask
                while slot[h] != -1 and key_values[slot[h]] != k:
                    h = (h + 1) & mask
                if slot[h] == -1:
                    slot[h] = count
                    key_values[count] = k
                    count += 1
                    if 2 * count > cap:
                        # Grow the table and put the distinct keys back.
                        free(slot)
                        slot = NULL
                        cap *= 2
                        slot = <int64_t*>malloc(cap * sizeof(int64_t))
                        if slot == NULL:
                            with gil:
                                raise MemoryError()
                        mask = cap - 1
                        for r in range(cap):
                            slot[r] = -1
                        for r in range(count):
                            h = _mix64(<uint64_t>key_values[r]) & mask
                            while slot[h] != -1:
                                h = (h + 1) & mask
                            slot[h] = r
                        h = _mix64(<uint64_t>k) & mask
                        while key_values[slot[h]] != k:
                            h = (h + 1) & mask
                dense[x] = slot[h]
        free(slot)
        slot = NULL
        ranked = <KeyRow*>_alloc(count, sizeof(KeyRow))
        rank = <int64_t*>_alloc(count, sizeof(int64_t))
        with nogil:
            for r in range(count):
                ranked[r].key = key_values[r]
                ranked[r].row = r
            qsort(ranked, count, sizeof(KeyRow), _cmp_key_row)
            for r in range(count):
                key_values[r] = ranked[r].key
                rank[ranked[r].row] = r
            for x in range(rows):
                dense[x] = rank[dense[x]]
    finally:
        free(slot); free(ranked); free(rank)
    return count


cdef Py_ssize_t _twice_in_delta(const int64_t* offsets, Py_ssize_t n, const int64_t* dense,
                                Py_ssize_t key_count) except -2:
    """The first group index whose delta has a key twice, or -1."""
    cdef int64_t* seen = <int64_t*>_alloc(key_count, sizeof(int64_t))
    cdef Py_ssize_t i, x, bad = -1
    with nogil:
        for x in range(key_count):
            seen[x] = -1
        for i in range(n):
            for x in range(offsets[i], offsets[i + 1]):
                if seen[dense[x]] == i:
                    bad = i
                    break
                seen[dense[x]] = i
            if bad != -1:
                break
    free(seen)
    return bad



# --- interning strings -------------------------------------------------------------


cdef class StringInterner:
    """Strings to dense IDs (0, 1, ...) in the order they first arrive.

    Holds each distinct string once (its bytes, an offset and a hash) and an
    open-addressing table of their IDs, so interning a column costs one hash
    and probe per row and memory grows with the distinct strings only.
    """
    cdef unsigned char* data
    cdef Py_ssize_t data_len
    cdef Py_ssize_t data_cap
    cdef int64_t* starts        # count + 1 offsets into data
    cdef uint64_t* hashes       # per ID
    cdef Py_ssize_t count
    cdef Py_ssize_t id_cap
    cdef int64_t* slot
    cdef Py_ssize_t slot_cap

    def __cinit__(self):
        cdef Py_ssize_t x
        self.data_cap = 4096
        self.data = <unsigned char*>_alloc(self.data_cap, 1)
        self.id_cap = 1024
        self.starts = <int64_t*>_alloc(self.id_cap + 1, sizeof(int64_t))
        self.hashes = <uint64_t*>_alloc(self.id_cap, sizeof(uint64_t))
        self.starts[0] = 0
        self.slot_cap = 2048
        self.slot = <int64_t*>_alloc(self.slot_cap, sizeof(int64_t))
        for x in range(self.slot_cap):
            self.slot[x] = -1

    def __dealloc__(self):
        free(self.data); free(self.starts); free(self.hashes); free(self.slot)

    def __len__(self):
        return self.count

    cdef int grow(self, Py_ssize_t length) except -1 nogil:
        """Room for one more string of *length* bytes (and its ID)."""
        cdef void* p
        cdef Py_ssize_t cap, x, r
        cdef uint64_t mask, h
        if self.data_len + length > self.data_cap:
            cap = self.data_cap
            while self.data_len + length > cap:
                cap *= 2
            p = realloc(self.data, cap)
            if p == NULL:
                with gil:
                    raise MemoryError()
            self.data = <unsigned char*>p
            self.data_cap = cap
        if self.count + 1 > self.id_cap:
            cap = self.id_cap * 2
            p = realloc(self.starts, (cap + 1) * sizeof(int64_t))
            if p == NULL:
                with gil:
                    raise MemoryError()
            self.starts = <int64_t*>p
            p = realloc(self.hashes, cap * sizeof(uint64_t))
            if p == NULL:
                with gil:
                    raise MemoryError()
            self.hashes = <uint64_t*>p
            self.id_cap = cap
        if 2 * (self.count + 1) > self.slot_cap:
            cap = self.slot_cap * 2
            p = malloc(cap * sizeof(int64_t))
            if p == NULL:
                with gil:
                    raise MemoryError()
            free(self.slot)
            self.slot = <int64_t*>p
            self.slot_cap = cap
            mask = cap - 1
            for x in range(cap):
                self.slot[x] = -1
            for r in range(self.count):
                h = self.hashes[r] & mask
                while self.slot[h] != -1:
                    h = (h + 1) & mask
                self.slot[h] = r
        return 0

    cdef int64_t one(self, const unsigned char* text, Py_ssize_t length) except -1 nogil:
        cdef uint64_t h = 14695981039346656037ULL, mask
        cdef Py_ssize_t x
        cdef int64_t found
        for x in range(length):
            h = (h ^ text[x]) * 1099511628211ULL
        h = _mix64(h)
        mask = self.slot_cap - 1
        x = h & mask
        while True:
            found = self.slot[x]
            if found == -1:
                break
            if (self.hashes[found] == h and self.starts[found + 1] - self.starts[found] == length
                    and (length == 0 or memcmp(self.data + self.starts[found], text, length) == 0)):
                return found
            x = (x + 1) & mask
        self.grow(length)
        found = self.count
        if length:
            memcpy(self.data + self.data_len, text, length)
        self.data_len += length
        self.starts[found + 1] = self.data_len
        self.hashes[found] = h
        self.count += 1
        mask = self.slot_cap - 1
        x = h & mask
        while self.slot[x] != -1:
            x = (x + 1) & mask
        self.slot[x] = found
        return found

    def intern(self, offsets, data):
        """The ID of each string of an ``(offsets, data)`` pair (int64 offsets
        of m+1 entries into UTF-8 *data*, as an Arrow large_string holds
        them), as an ``array('q')``; new strings get the next IDs."""
        cdef _Strings table = _Strings((offsets, data), "strings")
        cdef Py_ssize_t i, m = table.count
        cdef array.array out = array.clone(_INT64_TEMPLATE, m, zero=False)
        cdef int64_t* o = <int64_t*>out.data.as_voidptr
        cdef const unsigned char* base = table.ptr
        cdef const int64_t* at = table.offsets.ptr
        with nogil:
            for i in range(m):
                o[i] = self.one(base + at[i] if base != NULL else base, at[i + 1] - at[i])
        return out

    def table(self):
        """``(offsets, data)`` of the interned strings in ID order: int64
        offsets of len(self)+1 entries and the UTF-8 bytes."""
        return (bytes((<char*>self.starts)[:(self.count + 1) * sizeof(int64_t)]),
                bytes((<char*>self.data)[:self.data_len]))



cdef class _Forest:
    """Parents, children (CSR), CSR deltas with dense key IDs."""
    cdef Py_ssize_t n
    cdef Py_ssize_t rows
    cdef Py_ssize_t key_count
    cdef Int64s parent_buf
    cdef const int64_t* parent
    cdef Int64s offset_buf
    cdef const int64_t* offsets
    cdef Int64s event_buf
    cdef const int64_t* events
    cdef int64_t* dense          # row -> dense key
    cdef int64_t* key_values     # dense key -> key
    cdef int64_t* child_start
    cdef int64_t* child_list
    cdef int64_t* roots
    cdef Py_ssize_t root_count

    def __dealloc__(self):
        free(self.dense); free(self.key_values); free(self.child_start); free(self.child_list)
        free(self.roots)

    cdef int load(self, parents, delta_offsets, delta_keys, delta_events) except -1:
        cdef Int64s keys = Int64s(delta_keys, "delta_keys")
        cdef Py_ssize_t i, x, n
        cdef int64_t p, last
        cdef Py_ssize_t bad
        cdef int64_t k
        self.parent_buf = Int64s(parents, "parents")
        self.offset_buf = Int64s(delta_offsets, "delta_offsets")
        self.event_buf = Int64s(delta_events, "delta_events")
        n = self.n = self.parent_buf.length
        self.parent = self.parent_buf.ptr
        self.offsets = self.offset_buf.ptr
        self.events = self.event_buf.ptr
        self.rows = keys.length
        if self.offset_buf.length != n + 1:
            raise ValueError(f"delta_offsets has {self.offset_buf.length} entries, expected {n + 1}")
        if keys.length != self.event_buf.length:
            raise ValueError(f"delta_keys has {keys.length} entries but delta_events "
                             f"{self.event_buf.length}")
        if self.offsets[0] != 0 or self.offsets[n] != keys.length:
            raise ValueError("delta_offsets must start at 0 and end at len(delta_keys)")
        for i in range(n):
            if self.offsets[i] > self.offsets[i + 1]:
                raise ValueError(f"delta_offsets decreases at group index {i}")
            p = self.parent[i]
            if p < -1 or p >= n:
                raise ValueError(f"parents[{i}] = {p} is not a batch index")
        for x in range(self.rows):
            if self.events[x] < 0:
                raise ValueError(f"delta_events[{x}] = {self.events[x]} is negative")

        # Dense key IDs in key order: keys are hashed to IDs in arrival order
        # (a table of the distinct keys, not of the rows), then only the
        # distinct keys are sorted and the rows renumbered.
        self.dense = <int64_t*>_alloc(self.rows, sizeof(int64_t))
        self.key_values = <int64_t*>_alloc(self.rows, sizeof(int64_t))
        self.key_count = _dense_keys(keys.ptr, self.rows, self.dense, self.key_values)
        bad = _twice_in_delta(self.offsets, n, self.dense, self.key_count)
        if bad != -1:
            k = -1
            for x in range(self.offsets[bad], self.offsets[bad + 1]):
                for i in range(self.offsets[bad], x):
                    if self.dense[i] == self.dense[x]:
                        k = self.key_values[self.dense[x]]
            exc = StateCorruptionError(f"group index {bad} has key {k} twice in its delta")
            exc.groups = (bad,)
            exc.key = k
            raise exc
        self.child_start = <int64_t*>_alloc(n + 1, sizeof(int64_t))
        self.child_list = <int64_t*>_alloc(n, sizeof(int64_t))
        self.roots = <int64_t*>_alloc(n, sizeof(int64_t))
        self.relink(self.parent)
        return 0

    cdef int relink(self, const int64_t* parent) except -1:
        """Children and roots for *parent* (which must outlive this forest's use)."""
        cdef Py_ssize_t i, head, tail, reached
        cdef int64_t p
        cdef int64_t* fill = <int64_t*>_alloc(self.n + 1, sizeof(int64_t))
        self.parent = parent
        with nogil:
            for i in range(self.n + 1):
                self.child_start[i] = 0
            self.root_count = 0
            for i in range(self.n):
                if parent[i] == -1:
                    self.roots[self.root_count] = i
                    self.root_count += 1
                else:
                    self.child_start[parent[i] + 1] += 1
            for i in range(self.n):
                self.child_start[i + 1] += self.child_start[i]
            for i in range(self.n):
                fill[i] = self.child_start[i]
            for i in range(self.n):
                p = parent[i]
                if p != -1:
                    self.child_list[fill[p]] = i
                    fill[p] += 1
            # Breadth-first from the roots: nodes it misses sit on or below a cycle.
            tail = self.root_count
            for i in range(tail):
                fill[i] = self.roots[i]
            head = 0
            while head < tail:
                p = fill[head]
                head += 1
                for i in range(self.child_start[p], self.child_start[p + 1]):
                    fill[tail] = self.child_list[i]
                    tail += 1
            reached = tail
        free(fill)
        if reached != self.n:
            raise ValueError("parents form a cycle")
        return 0


cdef class _Path:
    """The state of the current path: map, undo log, size and digest."""
    cdef int64_t* value
    cdef int64_t* log_key
    cdef int64_t* log_old
    cdef Py_ssize_t log_len
    cdef Py_ssize_t log_cap
    cdef Py_ssize_t size
    cdef Digest digest
    cdef _Hasher hasher

    def __dealloc__(self):
        free(self.value); free(self.log_key); free(self.log_old)

    cdef int setup(self, Py_ssize_t keys, _Hasher hasher) except -1:
        cdef Py_ssize_t k
        self.value = <int64_t*>_alloc(keys, sizeof(int64_t))
        for k in range(keys):
            self.value[k] = ABSENT
        self.log_cap = 1024
        self.log_key = <int64_t*>_alloc(self.log_cap, sizeof(int64_t))
        self.log_old = <int64_t*>_alloc(self.log_cap, sizeof(int64_t))
        self.hasher = hasher
        memset(&self.digest, 0, sizeof(Digest))
        return 0

    cdef int grow(self, Py_ssize_t extra) except -1 nogil:
        cdef Py_ssize_t cap = self.log_cap
        cdef int64_t* k
        cdef int64_t* o
        if self.log_len + extra <= cap:
            return 0
        while cap < self.log_len + extra:
            cap *= 2
        k = <int64_t*>realloc(self.log_key, cap * sizeof(int64_t))
        if k != NULL:
            self.log_key = k
        o = <int64_t*>realloc(self.log_old, cap * sizeof(int64_t))
        if o != NULL:
            self.log_old = o
        if k == NULL or o == NULL:
            with gil:
                raise MemoryError()
        self.log_cap = cap
        return 0

    cdef int apply(self, _Forest f, Py_ssize_t v) except -1 nogil:
        cdef int64_t x, k, e, old
        cdef uint32_t h[8]
        cdef bint hashing = self.hasher is not None
        self.grow(f.offsets[v + 1] - f.offsets[v])
        for x in range(f.offsets[v], f.offsets[v + 1]):
            k = f.dense[x]
            e = f.events[x]
            old = self.value[k]
            if old == e:
                continue
            self.log_key[self.log_len] = k
            self.log_old[self.log_len] = old
            self.log_len += 1
            self.value[k] = e
            if old == ABSENT:
                self.size += 1
            if hashing:
                if old != ABSENT:
                    self.hasher.entry(f.key_values[k], old, h)
                    _sub(&self.digest, h)
                self.hasher.entry(f.key_values[k], e, h)
                _add(&self.digest, h)
        return 0

    cdef void undo(self, Py_ssize_t mark) noexcept nogil:
        cdef int64_t old
        while self.log_len > mark:
            self.log_len -= 1
            old = self.log_old[self.log_len]
            self.value[self.log_key[self.log_len]] = old
            if old == ABSENT:
                self.size -= 1


cdef uint8_t* _needed(_Forest f, const uint8_t* want) except NULL:
    """1 for each group that is wanted or has a wanted descendant (malloc'd)."""
    cdef uint8_t* need = <uint8_t*>_alloc(f.n, sizeof(uint8_t))
    cdef int64_t* order = <int64_t*>_alloc(f.n, sizeof(int64_t))
    cdef Py_ssize_t i, j, head = 0, tail = f.root_count
    cdef int64_t v
    with nogil:
        for i in range(f.root_count):
            order[i] = f.roots[i]
        while head < tail:
            v = order[head]
            head += 1
            for j in range(f.child_start[v], f.child_start[v + 1]):
                order[tail] = f.child_list[j]
                tail += 1
        for i in range(tail - 1, -1, -1):
            v = order[i]
            need[v] = want[v] != 0
            if not need[v]:
                for j in range(f.child_start[v], f.child_start[v + 1]):
                    if need[f.child_list[j]]:
                        need[v] = 1
                        break
    free(order)
    return need


cdef class _Flags:
    cdef const unsigned char[::1] view
    cdef bytes owned
    cdef const uint8_t* ptr

    def __cinit__(self, object obj, Py_ssize_t n, str name, bint default):
        if obj is None:
            self.owned = (b"\x01" if default else b"\x00") * (n if n else 1)
            self.ptr = <const uint8_t*><const char*>self.owned
            return
        self.view = raw_flags(obj, name)
        if self.view.shape[0] != n:
            raise ValueError(f"{name} has {self.view.shape[0]} entries for {n} groups")
        self.owned = b"\x00"
        self.ptr = &self.view[0] if n else <const uint8_t*><const char*>self.owned


cdef class _Walk:
    """A resumable depth-first walk over the needed groups of a forest.

    ``step()`` enters the next group (applying its delta) and returns it, or
    -1 at the end; exits (undoing deltas, restoring the digest) happen on the
    way. ``depth_*`` give the current path by depth.
    """
    cdef _Forest f
    cdef _Path path
    cdef const uint8_t* need
    cdef int64_t* stack
    cdef Py_ssize_t top
    cdef int64_t* mark
    cdef Digest* saved
    cdef int64_t* depth_start   # log position where the group at each depth began
    cdef int64_t* depth_node
    cdef Py_ssize_t depth

    def __dealloc__(self):
        free(self.stack); free(self.mark); free(self.saved); free(self.depth_start)
        free(self.depth_node)

    cdef int setup(self, _Forest f, _Path path, const uint8_t* need) except -1:
        cdef Py_ssize_t i
        self.f = f
        self.path = path
        self.need = need
        self.stack = <int64_t*>_alloc(2 * f.n, sizeof(int64_t))
        self.mark = <int64_t*>_alloc(f.n, sizeof(int64_t))
        self.saved = <Digest*>_alloc(f.n, sizeof(Digest))
        self.depth_start = <int64_t*>_alloc(f.n + 1, sizeof(int64_t))
        self.depth_node = <int64_t*>_alloc(f.n + 1, sizeof(int64_t))
        self.top = 0
        self.depth = 0
        for i in range(f.root_count - 1, -1, -1):
            if need == NULL or need[f.roots[i]]:
                self.stack[self.top] = f.roots[i]
                self.top += 1
        return 0

    cdef int64_t step(self) except -2 nogil:
        cdef int64_t v, c
        cdef Py_ssize_t j
        while self.top > 0:
            self.top -= 1
            v = self.stack[self.top]
            if v < 0:
                v = -v - 1
                self.path.undo(self.mark[v])
                self.path.digest = self.saved[v]
                self.depth -= 1
                continue
            self.mark[v] = self.path.log_len
            self.saved[v] = self.path.digest
            self.depth_start[self.depth] = self.path.log_len
            self.depth_node[self.depth] = v
            self.depth += 1
            self.path.apply(self.f, v)
            self.stack[self.top] = -v - 1
            self.top += 1
            for j in range(self.f.child_start[v + 1] - 1, self.f.child_start[v] - 1, -1):
                c = self.f.child_list[j]
                if self.need == NULL or self.need[c]:
                    self.stack[self.top] = c
                    self.top += 1
            return v
        return -1


def digest_groups(parents, delta_offsets, delta_keys, delta_events, wanted, int64_t key_stride,
                  types, state_keys, event_ids):
    """Entries and digest of the full state of each wanted group (``wanted``
    uint8 or None for every group), in batch order.

    Key ID ``k`` stands for ``(types[k // key_stride], state_keys[k %
    key_stride])`` and event ID ``e`` for ``event_ids[e]``; each string table
    is an ``(offsets, data)`` pair (int64 offsets of m+1 entries into UTF-8
    ``data``, as an Arrow large_string array holds them).

    Returns ``(entries, hex_digests)``: an ``array('q')`` of entry counts and
    the 64-character lowercase hex digests, concatenated.
    """
    if key_stride <= 0:
        raise ValueError("key_stride must be positive")
    cdef _Forest f = _Forest()
    f.load(parents, delta_offsets, delta_keys, delta_events)
    cdef _Flags want = _Flags(wanted, f.n, "wanted", True)
    cdef _Hasher hasher = _Hasher()
    hasher.types = _Strings(types, "type")
    hasher.state_keys = _Strings(state_keys, "state_key")
    hasher.events = _Strings(event_ids, "event_id")
    hasher.stride = key_stride
    cdef Py_ssize_t x, i, count = 0
    for x in range(f.rows):
        hasher.check(f.key_values[f.dense[x]], f.events[x])
    cdef _Path path = _Path()
    path.setup(f.key_count, hasher)
    cdef uint8_t* need = _needed(f, want.ptr)
    cdef _Walk walk = _Walk()
    cdef int64_t v
    cdef int64_t* sizes = <int64_t*>_alloc(f.n, sizeof(int64_t))
    cdef Digest* found = <Digest*>_alloc(f.n, sizeof(Digest))
    try:
        walk.setup(f, path, need)
        with nogil:
            while True:
                v = walk.step()
                if v == -1:
                    break
                if want.ptr[v]:
                    sizes[v] = path.size
                    found[v] = path.digest
        for i in range(f.n):
            if want.ptr[i]:
                count += 1
        entries = array.clone(_INT64_TEMPLATE, count, zero=False)
        hexes = bytearray(64 * count)
        count = 0
        for i in range(f.n):
            if want.ptr[i]:
                (<int64_t*>(<array.array>entries).data.as_voidptr)[count] = sizes[i]
                hexes[64 * count:64 * count + 64] = _hex(&found[i])
                count += 1
    finally:
        free(need); free(sizes); free(found)
    return entries, bytes(hexes)


cdef int _cmp_int64(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const int64_t*>a)[0]
    cdef int64_t y = (<const int64_t*>b)[0]
    return (x > y) - (x < y)


cdef class StateWalk:
    """The full state of each wanted group of a batch, a bounded chunk at a time.

    Groups come in depth-first order, each state sorted by key. Memory holds
    the current path's state and one chunk, whatever the size of the batch.
    """
    cdef _Forest f
    cdef _Path path
    cdef _Walk walk
    cdef _Flags want
    cdef uint8_t* need
    cdef int64_t* scratch
    cdef Py_ssize_t scratch_cap

    def __dealloc__(self):
        free(self.need); free(self.scratch)

    def __init__(self, parents, delta_offsets, delta_keys, delta_events, wanted=None):
        self.f = _Forest()
        self.f.load(parents, delta_offsets, delta_keys, delta_events)
        self.want = _Flags(wanted, self.f.n, "wanted", True)
        self.path = _Path()
        self.path.setup(self.f.key_count, None)
        self.need = _needed(self.f, self.want.ptr)
        self.walk = _Walk()
        self.walk.setup(self.f, self.path, self.need)

    def next_states(self, Py_ssize_t max_rows):
        """``(groups, keys, events)`` of the next wanted groups (batch indices),
        at least one group and about *max_rows* rows; empty arrays at the end."""
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        cdef array.array groups = array.clone(_INT64_TEMPLATE, 0, zero=False)
        cdef array.array keys = array.clone(_INT64_TEMPLATE, 0, zero=False)
        cdef array.array events = array.clone(_INT64_TEMPLATE, 0, zero=False)
        cdef Py_ssize_t used = 0, x, m, start
        cdef int64_t v, k
        cdef _Path path = self.path
        while used < max_rows:
            with nogil:
                v = self.walk.step()
                while v != -1 and not self.want.ptr[v]:
                    v = self.walk.step()
            if v == -1:
                break
            if path.size > self.scratch_cap:
                free(self.scratch)
                self.scratch = NULL
                self.scratch = <int64_t*>_alloc(path.size, sizeof(int64_t))
                self.scratch_cap = path.size
            m = 0
            with nogil:
                for x in range(path.log_len):
                    if path.log_old[x] == ABSENT:
                        self.scratch[m] = path.log_key[x]
                        m += 1
                qsort(self.scratch, m, sizeof(int64_t), _cmp_int64)
            start = used
            array.resize_smart(groups, used + m)
            array.resize_smart(keys, used + m)
            array.resize_smart(events, used + m)
            with nogil:
                for x in range(m):
                    k = self.scratch[x]
                    (<int64_t*>groups.data.as_voidptr)[start + x] = v
                    (<int64_t*>keys.data.as_voidptr)[start + x] = self.f.key_values[k]
                    (<int64_t*>events.data.as_voidptr)[start + x] = path.value[k]
            used += m
        return groups, keys, events


# --- the compression plan, priced along the trees -------------------------------------


cdef int64_t _step(int64_t depth, const int64_t* radices, Py_ssize_t m) noexcept nogil:
    cdef int64_t place = 1
    cdef Py_ssize_t k
    for k in range(m):
        if depth % radices[k]:
            return place
        depth //= radices[k]
        place *= radices[k]
    return 0


cdef int64_t _digit_sum(int64_t depth, const int64_t* radices, Py_ssize_t m) noexcept nogil:
    cdef int64_t total = 0
    cdef Py_ssize_t k
    for k in range(m):
        total += depth % radices[k]
        depth //= radices[k]
    return total


cdef class _Plan:
    """The scratch arrays of one plan_compression call; freed however it ends."""
    cdef int64_t* tree_root
    cdef int64_t* link
    cdef int64_t* depth
    cdef int64_t* top
    cdef int64_t* height
    cdef int64_t* pair_start      # per root: its candidates in pair_j/pair_rows
    cdef int64_t* pair_j
    cdef int64_t* pair_rows
    cdef int64_t* by_j_start      # per candidate: the pairs it prices
    cdef int64_t* by_j
    cdef int64_t* stamp
    cdef int64_t* radix_start     # per deep top: its radix vectors (flattened)
    cdef int64_t* radix_data
    cdef int64_t* radix_at
    cdef int64_t* radix_cost
    cdef int64_t* chosen          # per deep top: index of its chosen vector, else -1
    cdef int64_t* new_parent
    cdef int64_t* new_depth
    cdef int64_t* emit_start
    cdef int64_t* emit_len
    cdef int64_t* emit_key
    cdef int64_t* emit_event
    cdef Py_ssize_t emit_used
    cdef Py_ssize_t emit_cap
    cdef int64_t mark

    def __dealloc__(self):
        free(self.tree_root); free(self.link); free(self.depth); free(self.top); free(self.height)
        free(self.pair_start); free(self.pair_j); free(self.pair_rows); free(self.by_j_start)
        free(self.by_j); free(self.stamp); free(self.radix_start); free(self.radix_data)
        free(self.radix_at); free(self.radix_cost); free(self.chosen); free(self.new_parent)
        free(self.new_depth); free(self.emit_start); free(self.emit_len); free(self.emit_key)
        free(self.emit_event)

    cdef int reserve(self, Py_ssize_t extra) except -1 nogil:
        cdef Py_ssize_t cap = self.emit_cap if self.emit_cap else 1024
        cdef int64_t* k
        cdef int64_t* e
        if self.emit_used + extra <= self.emit_cap:
            return 0
        while cap < self.emit_used + extra:
            cap *= 2
        k = <int64_t*>realloc(self.emit_key, cap * sizeof(int64_t))
        if k != NULL:
            self.emit_key = k
        e = <int64_t*>realloc(self.emit_event, cap * sizeof(int64_t))
        if e != NULL:
            self.emit_event = e
        if k == NULL or e == NULL:
            with gil:
                raise MemoryError()
        self.emit_cap = cap
        return 0

    cdef int64_t segment(self, _Path path, Py_ssize_t start, bint emit) except -1 nogil:
        """Keys changed in ``log[start:]`` whose value now differs from their
        value before ``start``; counted, and emitted when *emit*."""
        cdef Py_ssize_t x
        cdef int64_t k, rows = 0
        self.mark += 1
        if emit:
            self.reserve(path.log_len - start)
        for x in range(start, path.log_len):
            k = path.log_key[x]
            if self.stamp[k] == self.mark:
                continue
            self.stamp[k] = self.mark
            if path.value[k] != path.log_old[x]:
                if emit:
                    self.emit_key[self.emit_used] = k
                    self.emit_used += 1
                rows += 1
        return rows


cdef int _find_candidates(_Plan s, _Forest f, const int64_t* room, const uint8_t* keep,
                          int64_t look) except -1:
    """Each root's earlier groups of its room (nearest first) and, per
    candidate, the roots it is priced for."""
    cdef Py_ssize_t n = f.n, i, j, used = 0, looked
    s.pair_start = <int64_t*>_alloc(n + 1, sizeof(int64_t))
    s.pair_j = <int64_t*>_alloc(n * look if look else 1, sizeof(int64_t))
    s.pair_rows = <int64_t*>_alloc(n * look if look else 1, sizeof(int64_t))
    s.by_j_start = <int64_t*>_alloc(n + 1, sizeof(int64_t))
    with nogil:
        for i in range(n):
            s.pair_start[i] = used
            if f.parent_buf.ptr[i] != -1 or keep[i] or look == 0:
                continue
            j = i - 1
            looked = 0
            while j >= 0 and room[j] == room[i] and looked < look:
                if s.tree_root[j] < i:
                    s.pair_j[used] = j
                    used += 1
                    looked += 1
                j -= 1
        s.pair_start[n] = used
        for i in range(n + 1):
            s.by_j_start[i] = 0
        for i in range(used):
            s.by_j_start[s.pair_j[i] + 1] += 1
        for i in range(n):
            s.by_j_start[i + 1] += s.by_j_start[i]
    s.by_j = <int64_t*>_alloc(used, sizeof(int64_t))
    cdef int64_t* fill = <int64_t*>_alloc(n + 1, sizeof(int64_t))
    with nogil:
        for i in range(n):
            fill[i] = s.by_j_start[i]
        for i in range(n):
            for j in range(s.pair_start[i], s.pair_start[i + 1]):
                s.by_j[fill[s.pair_j[j]]] = j
                fill[s.pair_j[j]] += 1
    free(fill)
    return 0


cdef int _price_pairs(_Plan s, _Forest f) except -1:
    """Rows each root needs over each candidate (-1: the candidate has a key
    the root lacks), priced when the walk of the original trees is there."""
    cdef Py_ssize_t n = f.n, i, x, q, pair
    cdef int64_t j, rows, matched, held, root
    cdef uint8_t* want = <uint8_t*>_alloc(n, sizeof(uint8_t))
    cdef uint8_t* need = NULL
    cdef _Path path = _Path()
    cdef _Walk walk = _Walk()
    for i in range(n):
        want[i] = s.by_j_start[i + 1] > s.by_j_start[i]
    try:
        need = _needed(f, want)
        path.setup(f.key_count, None)
        walk.setup(f, path, need)
        with nogil:
            while True:
                j = walk.step()
                if j == -1:
                    break
                for q in range(s.by_j_start[j], s.by_j_start[j + 1]):
                    pair = s.by_j[q]
                    # The root whose candidate list holds this pair.
                    root = _owner(s, f.n, pair)
                    rows = 0
                    matched = 0
                    for x in range(f.offsets[root], f.offsets[root + 1]):
                        held = path.value[f.dense[x]]
                        if held == ABSENT:
                            rows += 1
                        else:
                            matched += 1
                            if held != f.events[x]:
                                rows += 1
                    s.pair_rows[pair] = rows if matched == path.size else -1
    finally:
        free(want); free(need)
    return 0


cdef inline int64_t _owner(_Plan s, Py_ssize_t n, int64_t pair) noexcept nogil:
    """The root whose candidates include *pair* (binary search on pair_start)."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if s.pair_start[mid] <= pair:
            lo = mid
        else:
            hi = mid
    return lo


cdef int _link_and_shape(_Plan s, _Forest f, int64_t bound) except -1:
    """Choose each root's link, then the depth, top and height in the linked forest."""
    cdef Py_ssize_t n = f.n, i, q, plen, k
    cdef int64_t best, best_rows, rows, v, d, t
    cdef int64_t* path = <int64_t*>_alloc(n + 1, sizeof(int64_t))
    s.link = <int64_t*>_alloc(n, sizeof(int64_t))
    s.depth = <int64_t*>_alloc(n, sizeof(int64_t))
    s.top = <int64_t*>_alloc(n, sizeof(int64_t))
    s.height = <int64_t*>_alloc(n, sizeof(int64_t))
    with nogil:
        for i in range(n):
            s.link[i] = f.parent_buf.ptr[i]
            if s.pair_start[i + 1] > s.pair_start[i]:
                best = -1
                best_rows = f.offsets[i + 1] - f.offsets[i]
                for q in range(s.pair_start[i], s.pair_start[i + 1]):
                    rows = s.pair_rows[q]
                    if 0 <= rows < best_rows:
                        best = s.pair_j[q]
                        best_rows = rows
                s.link[i] = best
            s.depth[i] = -1
            s.height[i] = -1
        for i in range(n):
            plen = 0
            v = i
            while s.depth[v] == -1 and s.link[v] != -1:
                path[plen] = v
                plen += 1
                v = s.link[v]
            if s.depth[v] == -1:
                s.depth[v] = 0
                s.top[v] = v
            d = s.depth[v]
            t = s.top[v]
            for k in range(plen - 1, -1, -1):
                d += 1
                s.depth[path[k]] = d
                s.top[path[k]] = t
        for i in range(n):
            if s.depth[i] > s.height[s.top[i]]:
                s.height[s.top[i]] = s.depth[i]
    free(path)
    return 0


cdef int _load_radices(_Plan s, Py_ssize_t n, int64_t bound) except -1:
    """The radix vectors of every deep linked tree, flattened."""
    cdef Py_ssize_t t, count = 0, used = 0, k
    vectors = {}
    for t in range(n):
        if s.top[t] == t and s.height[t] > bound:
            vectors[t] = level_radices(s.height[t], bound)
            count += len(vectors[t])
            used += sum(len(r) for r in vectors[t])
    s.radix_start = <int64_t*>_alloc(n + 1, sizeof(int64_t))
    s.radix_at = <int64_t*>_alloc(count + 1, sizeof(int64_t))
    s.radix_data = <int64_t*>_alloc(used + count + 1, sizeof(int64_t))
    s.radix_cost = <int64_t*>_alloc(count + 1, sizeof(int64_t))
    s.chosen = <int64_t*>_alloc(n, sizeof(int64_t))
    cdef Py_ssize_t vector = 0, pos = 0
    for t in range(n):
        s.radix_start[t] = vector
        s.chosen[t] = -1
        for radices in vectors.get(t, ()):
            s.radix_at[vector] = pos  # start of its digits in radix_data
            for k, r in enumerate(radices):
                s.radix_data[pos + k] = r
            pos += len(radices)
            s.radix_cost[vector] = 0
            vector += 1
    s.radix_start[n] = vector
    s.radix_at[vector] = pos
    return 0


cdef int _price_levels(_Plan s, _Forest linked) except -1:
    """Add up, per radix vector of each deep tree, the rows its re-hung groups
    need over their new prev less those over their link."""
    cdef Py_ssize_t n = linked.n, r, m
    cdef int64_t v, d, t, own, step, extra
    cdef uint8_t* want = <uint8_t*>_alloc(n, sizeof(uint8_t))
    cdef uint8_t* need = NULL
    cdef _Path path = _Path()
    cdef _Walk walk = _Walk()
    cdef const int64_t* radices
    for v in range(n):
        want[v] = s.radix_start[s.top[v] + 1] > s.radix_start[s.top[v]]
    try:
        need = _needed(linked, want)
        path.setup(linked.key_count, None)
        walk.setup(linked, path, need)
        with nogil:
            while True:
                v = walk.step()
                if v == -1:
                    break
                d = s.depth[v]
                if d == 0:
                    continue
                t = s.top[v]
                own = path.log_len - walk.depth_start[d]
                for r in range(s.radix_start[t], s.radix_start[t + 1]):
                    radices = s.radix_data + s.radix_at[r]
                    m = s.radix_at[r + 1] - s.radix_at[r]
                    step = _step(d, radices, m)
                    if step == 1:
                        continue
                    if step == 0:
                        extra = path.size
                    else:
                        extra = s.segment(path, walk.depth_start[d - step + 1], False)
                    s.radix_cost[r] += extra - own
        for t in range(n):
            for r in range(s.radix_start[t], s.radix_start[t + 1]):
                if s.chosen[t] == -1 or s.radix_cost[r] < s.radix_cost[s.chosen[t]]:
                    s.chosen[t] = r
    finally:
        free(want); free(need)
    return 0


cdef int _emit(_Plan s, _Forest linked) except -1:
    """The new prev, depth and delta of every group, in one walk of the linked forest."""
    cdef Py_ssize_t n = linked.n, x, m, start
    cdef int64_t v, d, t, r, step, k
    cdef _Path path = _Path()
    cdef _Walk walk = _Walk()
    cdef const int64_t* radices
    s.new_parent = <int64_t*>_alloc(n, sizeof(int64_t))
    s.new_depth = <int64_t*>_alloc(n, sizeof(int64_t))
    s.emit_start = <int64_t*>_alloc(n, sizeof(int64_t))
    s.emit_len = <int64_t*>_alloc(n, sizeof(int64_t))
    path.setup(linked.key_count, None)
    walk.setup(linked, path, NULL)
    with nogil:
        while True:
            v = walk.step()
            if v == -1:
                break
            d = s.depth[v]
            t = s.top[v]
            r = s.chosen[t]
            s.new_parent[v] = s.link[v]
            s.new_depth[v] = d
            step = 1
            if r != -1 and d:
                radices = s.radix_data + s.radix_at[r]
                m = s.radix_at[r + 1] - s.radix_at[r]
                step = _step(d, radices, m)
                s.new_parent[v] = walk.depth_node[d - step] if step else -1
                s.new_depth[v] = _digit_sum(d, radices, m)
            start = s.emit_used
            if step == 1:
                s.reserve(path.log_len - walk.depth_start[d])
                for x in range(walk.depth_start[d], path.log_len):
                    s.emit_key[s.emit_used] = path.log_key[x]
                    s.emit_used += 1
            elif step == 0:
                s.reserve(path.size)
                for x in range(path.log_len):
                    if path.log_old[x] == ABSENT:
                        s.emit_key[s.emit_used] = path.log_key[x]
                        s.emit_used += 1
            else:
                s.segment(path, walk.depth_start[d - step + 1], True)
            qsort(s.emit_key + start, s.emit_used - start, sizeof(int64_t), _cmp_int64)
            for x in range(start, s.emit_used):
                k = s.emit_key[x]
                s.emit_event[x] = path.value[k]
                s.emit_key[x] = linked.key_values[k]
            s.emit_start[v] = start
            s.emit_len[v] = s.emit_used - start
    return 0


cdef array.array _to_array(const int64_t* data, Py_ssize_t count):
    cdef array.array out = array.clone(_INT64_TEMPLATE, count, zero=False)
    if count:
        memcpy(out.data.as_voidptr, data, count * sizeof(int64_t))
    return out


def plan_compression(parents, rooms, delta_offsets, delta_keys, delta_events, fixed=None,
                     max_depth=100, candidates=16):
    """The plan of ``streamrep._pure.compress.plan_compression``, from the deltas.

    ``parents`` (n int64) is each group's prev as a batch index (-1: root);
    ``rooms`` (n int64) numbers the rooms, a room's groups contiguous; the
    deltas are CSR (``delta_offsets`` n+1) with no key twice in one delta;
    ``fixed`` (n uint8 or None) marks roots to leave as they are.

    Returns ``(new_parents, new_depths, delta_offsets, delta_keys,
    delta_events)``, the new deltas sorted by key.
    """
    if max_depth < 1:
        raise ValueError("max_depth must be at least 1")
    if candidates < 0:
        raise ValueError("candidates must not be negative")
    cdef _Forest f = _Forest()
    f.load(parents, delta_offsets, delta_keys, delta_events)
    cdef Py_ssize_t n = f.n, i, total
    cdef Int64s room_buf = Int64s(rooms, "rooms")
    if room_buf.length != n:
        raise ValueError(f"rooms has {room_buf.length} entries for {n} groups")
    cdef _Flags keep = _Flags(fixed, n, "fixed", False)
    for i in range(n):
        if keep.ptr[i] and f.parent_buf.ptr[i] != -1:
            raise ValueError(f"group index {i} is fixed but not a root")

    cdef _Plan s = _Plan()
    s.tree_root = <int64_t*>_alloc(n, sizeof(int64_t))
    _tree_roots(f.parent_buf.ptr, n, s.tree_root)
    _find_candidates(s, f, room_buf.ptr, keep.ptr, candidates)
    _price_pairs(s, f)
    _link_and_shape(s, f, max_depth)
    f.relink(s.link)
    s.stamp = <int64_t*>_alloc(f.key_count, sizeof(int64_t))
    for i in range(f.key_count):
        s.stamp[i] = 0
    s.mark = 0
    _load_radices(s, n, max_depth)
    _price_levels(s, f)
    _emit(s, f)

    cdef array.array out_offsets = array.clone(_INT64_TEMPLATE, n + 1, zero=False)
    cdef array.array out_keys = array.clone(_INT64_TEMPLATE, s.emit_used, zero=False)
    cdef array.array out_events = array.clone(_INT64_TEMPLATE, s.emit_used, zero=False)
    cdef int64_t* oo = <int64_t*>out_offsets.data.as_voidptr
    cdef int64_t* ok = <int64_t*>out_keys.data.as_voidptr
    cdef int64_t* oe = <int64_t*>out_events.data.as_voidptr
    total = 0
    with nogil:
        oo[0] = 0
        for i in range(n):
            if s.emit_len[i]:
                memcpy(ok + total, s.emit_key + s.emit_start[i], s.emit_len[i] * sizeof(int64_t))
                memcpy(oe + total, s.emit_event + s.emit_start[i], s.emit_len[i] * sizeof(int64_t))
            total += s.emit_len[i]
            oo[i + 1] = total
    return (_to_array(s.new_parent, n), _to_array(s.new_depth, n), out_offsets, out_keys,
            out_events)


cdef int _tree_roots(const int64_t* parent, Py_ssize_t n, int64_t* tree_root) except -1:
    cdef Py_ssize_t i, k, plen
    cdef int64_t v, r
    cdef int64_t* path = <int64_t*>_alloc(n + 1, sizeof(int64_t))
    for i in range(n):
        tree_root[i] = -1
    for i in range(n):
        plen = 0
        v = i
        while tree_root[v] == -1 and parent[v] != -1:
            path[plen] = v
            plen += 1
            v = parent[v]
        r = v if tree_root[v] == -1 else tree_root[v]
        tree_root[v] = r
        for k in range(plen):
            tree_root[path[k]] = r
    free(path)
    return 0
