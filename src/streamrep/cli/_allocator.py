"""The memory allocator ``streamrep serve`` runs on.

CPython takes small objects from 1 MiB arenas and returns an arena only once
nothing in it lives, so after a thousand peers have come and gone a few objects
made meanwhile keep megabytes that the hub no longer uses. jemalloc returns memory
page by page: the hub, a long-running server whose peers come and go by the
thousand, runs on it where the machine has it (Debian's ``libjemalloc2``), with
CPython's small-object allocator off (``PYTHONMALLOC=malloc``) so that jemalloc
serves every object, and jemalloc's background thread returning pages freed and not
reused (``MALLOC_CONF=background_thread:true`` unless ``MALLOC_CONF`` is set). They
must be set before the interpreter starts, so the command starts itself again, in
the same process (``exec``), with them set.

``--allocator`` (or ``STREAMREP_ALLOCATOR``): ``auto`` (jemalloc where found, else
CPython's own), ``jemalloc`` (an error where not found) or ``system`` (CPython's
own, as started).
"""

from __future__ import annotations

import ctypes.util
import os
import sys

from streamrep.errors import ConfigError
from streamrep.replication.transport.hub_memory import running_on_jemalloc

__all__ = ["ALLOCATORS", "describe", "find_jemalloc", "use_allocator"]

ALLOCATORS = ("auto", "jemalloc", "system")

#: Set in the environment of the command started again, so that it never loops.
_STARTED_AGAIN = "STREAMREP_ALLOCATOR_STARTED"
#: Where jemalloc is looked for first (a path); then the linker's search, then
#: Debian's and Red Hat's places.
LIBRARY_VARIABLE = "STREAMREP_JEMALLOC_LIBRARY"
_KNOWN_PLACES = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
                 "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                 "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2")


def find_jemalloc() -> str | None:
    """The path of a loadable jemalloc, or None."""
    given = os.environ.get(LIBRARY_VARIABLE)
    if given:
        return given if os.path.exists(given) else None
    candidates = [ctypes.util.find_library("jemalloc"), *_KNOWN_PLACES]
    for candidate in candidates:
        if candidate and (os.path.isabs(candidate) and os.path.exists(candidate)):
            return candidate
    return None


def use_allocator(choice: str, argv: list[str]) -> None:
    """Make this ``serve`` process run on the allocator *choice* asks for: return
    when it does (or ``auto`` found no jemalloc), else start the command again as
    *argv* (``sys.argv``) with jemalloc set up; :class:`ConfigError` when
    ``jemalloc`` was asked for and cannot be had."""
    if choice not in ALLOCATORS:
        raise ConfigError(f"--allocator must be one of {', '.join(ALLOCATORS)}, not {choice!r}")
    if choice == "system" or running_on_jemalloc():
        return
    library = None if os.environ.get(_STARTED_AGAIN) else find_jemalloc()
    if library is None:
        if choice == "jemalloc":
            where = os.environ.get(LIBRARY_VARIABLE) or "the linker's path and " + ", ".join(_KNOWN_PLACES)
            reason = ("it did not load when started with it" if os.environ.get(_STARTED_AGAIN)
                      else f"it is not in {where}")
            raise ConfigError(f"--allocator jemalloc: {reason}; install it (Debian: apt-get install "
                              f"libjemalloc2), name it in {LIBRARY_VARIABLE}, or use --allocator system")
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [library, env.get("LD_PRELOAD")]))
    env["PYTHONMALLOC"] = "malloc"
    # Pages freed and not reused go back to the system within seconds even when
    # the hub is idle (jemalloc's own thread; otherwise only as it allocates).
    env.setdefault("MALLOC_CONF", "background_thread:true")
    env[_STARTED_AGAIN] = library
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "streamrep", *argv[1:]], env)


def describe() -> str:
    """The allocator this process runs on, for its start-up log line."""
    if running_on_jemalloc():
        return f"jemalloc ({os.environ.get(_STARTED_AGAIN) or 'preloaded'}), CPython's small-object " \
               f"allocator {'off' if os.environ.get('PYTHONMALLOC') == 'malloc' else 'on'}"
    return "CPython's own (pymalloc)"
