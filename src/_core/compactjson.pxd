# Skipping over compact JSON on its raw bytes, for the core modules that check
# rows in place (wire, rowcheck). Compact: no whitespace, ASCII strings without
# escapes, integers of at most 18 digits without fraction or exponent, nesting
# at most MAX_JSON_DEPTH deep. Each function moves ``cursor[0]`` past the value
# and returns True, or returns False (cursor unmoved) when the value is not in
# that form and a full decoder must decide.

from libc.string cimport memcmp

cdef enum:
    MAX_JSON_DEPTH = 32


cdef inline bint skip_string(const char** cursor, const char* end) noexcept nogil:
    """Past a compact string."""
    cdef const char* p = cursor[0]
    cdef unsigned char c
    if p >= end or p[0] != c'"':
        return False
    p += 1
    while p < end:
        c = <unsigned char>p[0]
        if c == c'"':
            cursor[0] = p + 1
            return True
        if c == c'\\' or c < 0x20 or c >= 0x80:
            return False
        p += 1
    return False


cdef inline bint skip_word(const char** cursor, const char* end, const char* word,
                           Py_ssize_t size) noexcept nogil:
    """Past *word* (``null``, ``true``, ``false``)."""
    if end - cursor[0] >= size and memcmp(cursor[0], word, size) == 0:
        cursor[0] += size
        return True
    return False


cdef inline bint skip_integer(const char** cursor, const char* end) noexcept nogil:
    """Past a compact integer."""
    cdef const char* p = cursor[0]
    cdef const char* start
    if p < end and p[0] == c'-':
        p += 1
    start = p
    while p < end and c'0' <= p[0] <= c'9':
        p += 1
        if p - start > 18:
            return False
    if p == start or (p - start > 1 and start[0] == c'0'):
        return False
    if p < end and (p[0] == c'.' or p[0] == c'e' or p[0] == c'E'):
        return False
    cursor[0] = p
    return True


cdef inline bint skip_value(const char** cursor, const char* end, int depth) noexcept nogil:
    """Past any compact JSON value at nesting *depth*."""
    cdef const char* p = cursor[0]
    cdef char c
    if p >= end or depth > MAX_JSON_DEPTH:
        return False
    c = p[0]
    if c == c'"':
        return skip_string(cursor, end)
    if c == c'n':
        return skip_word(cursor, end, b"null", 4)
    if c == c't':
        return skip_word(cursor, end, b"true", 4)
    if c == c'f':
        return skip_word(cursor, end, b"false", 5)
    if c == c'-' or (c'0' <= c <= c'9'):
        return skip_integer(cursor, end)
    if c == c'[':
        p += 1
        if p < end and p[0] == c']':
            cursor[0] = p + 1
            return True
        while True:
            if not skip_value(&p, end, depth + 1) or p >= end:
                return False
            if p[0] == c']':
                cursor[0] = p + 1
                return True
            if p[0] != c',':
                return False
            p += 1
    if c == c'{':
        p += 1
        if p < end and p[0] == c'}':
            cursor[0] = p + 1
            return True
        while True:
            if not skip_string(&p, end) or p >= end or p[0] != c':':
                return False
            p += 1
            if not skip_value(&p, end, depth + 1) or p >= end:
                return False
            if p[0] == c'}':
                cursor[0] = p + 1
                return True
            if p[0] != c',':
                return False
            p += 1
    return False
