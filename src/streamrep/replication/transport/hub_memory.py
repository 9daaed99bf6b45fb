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
  (glibc's ``malloc_trim``; jemalloc's purge of every arena).

What stays after that is CPython's own: the arenas that a few objects outliving the
peers keep. ``streamrep serve`` therefore runs on jemalloc where the machine has it,
with CPython's small-object allocator off (``streamrep.cli._allocator``), and
then jemalloc's purge returns every page nothing lives in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
import time
from typing import Callable

logger = logging.getLogger(__name__)


#: jemalloc's name for every arena at once (``MALLCTL_ARENAS_ALL``).
_PURGE_ALL_ARENAS = b"arena.4096.purge"


def running_on_jemalloc() -> bool:
    """Whether this process's ``malloc`` is jemalloc's (it exports ``mallctl``)."""
    try:
        return hasattr(ctypes.CDLL(None), "mallctl")
    except OSError:
        return False


def release_to_system() -> tuple[str, Callable[[], object]] | None:
    """What asks the C allocator to return the pages it keeps, with its name:
    jemalloc's purge of every arena, glibc's ``malloc_trim``, or None where there
    is neither."""
    try:
        process = ctypes.CDLL(None)
        if hasattr(process, "mallctl"):
            mallctl = process.mallctl
            mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_size_t]
            mallctl.restype = ctypes.c_int
            return "jemalloc", lambda: mallctl(_PURGE_ALL_ARENAS, None, None, None, 0)
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return "glibc", lambda: trim(0)


class MemoryReturn:
    """The steps that hand freed memory back, in the order that lets each free
    the most: the attribute cache, the free lists, then the C allocator."""

    def __init__(self) -> None:
        self.clear_type_cache: Callable[[], None] | None = getattr(sys, "_clear_type_cache", None)
        self.collect: Callable[[], int] = gc.collect
        found = release_to_system()
        #: Which C allocator :attr:`release` asks ("jemalloc", "glibc"), or None.
        self.allocator = found[0] if found else None
        self.release: Callable[[], object] | None = found[1] if found else None

    def give_back(self) -> None:
        started = time.perf_counter()
        if self.clear_type_cache is not None:
            self.clear_type_cache()
        self.collect()  # a full collection also empties CPython's free lists
        if self.release is not None:
            self.release()
        logger.debug("gave freed memory back in %.1f ms", (time.perf_counter() - started) * 1000)

