"""Giving back the memory that many departed peers held.

CPython takes small objects from 1 MiB arenas and returns an arena to the system
only once nothing in it lives. A thousand stalled readers fill a few megabytes of
arenas; when they are cut off, their objects are freed, but a handful of objects
that outlive them, made while they filled those arenas, keep each arena (and so
its megabyte) alive. What does that here, and what the hub does about it:

* CPython's attribute lookup cache keeps a reference to the name of each lookup
  (4,096 slots, 3.11). gevent stops each one-shot watcher that fired (every
  ``sleep``, every timeout) by looking ``stop`` up with a string made anew each
  time: emptying the cache frees them (it refills in microseconds).
* CPython keeps freed tuples, lists, dicts and floats on free lists for reuse, up to
  2,000 tuples of each length; freed during the stall, they sit in its arenas
  until a full collection empties those lists.
* The C allocator keeps pages it has for itself until asked to return them
  (glibc's ``malloc_trim``).
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from typing import Callable

logger = logging.getLogger(__name__)


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class MemoryReturn:
    """The steps that hand freed memory back, in the order that lets each free
    the most: the attribute cache, the free lists, then the C allocator."""

    def __init__(self) -> None:
        self.clear_type_cache: Callable[[], None] | None = getattr(sys, "_clear_type_cache", None)
        self.collect: Callable[[], int] = gc.collect
        self.trim = malloc_trim()

    def give_back(self) -> None:
        started = time.perf_counter()
        if self.clear_type_cache is not None:
            self.clear_type_cache()
        self.collect()  # a full collection also empties CPython's free lists
        if self.trim is not None:
            self.trim(0)
        logger.debug("gave freed memory back in %.1f ms", (time.perf_counter() - started) * 1000)

