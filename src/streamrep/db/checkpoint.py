"""Copying a SQLite database's write-ahead log back into the database file, off the
writer's path.

SQLite checkpoints the WAL from inside the commit that crosses its threshold: that
commit then copies every frame and syncs the database file while the writer (and,
under gevent, the whole process) waits. :class:`WalCheckpointer` runs passive
checkpoints from an operating-system thread of its own instead, with its own
connection; SQLite releases the GIL while it works, so the copy and the sync overlap
the writer's next transactions. The writer connection keeps SQLite's own
checkpoint as a safety net at a much larger size, so the log stays bounded even if
this thread falls behind (say, while a long read holds old frames).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from typing import Any

from gevent.monkey import get_original

from streamrep import resources

logger = logging.getLogger(__name__)

# Real threads and locks even when gevent has patched the threading module: a
# checkpoint must not run on (and block) the gevent hub.
_start_new_thread: Any = get_original("_thread", "start_new_thread")
_allocate_lock: Any = get_original("_thread", "allocate_lock")
_sleep: Any = get_original("time", "sleep")

#: How long the thread lets commits accumulate before a checkpoint, in seconds:
#: one database-file sync per interval at most, however often the writer commits.
DEFAULT_INTERVAL = 0.1


class WalCheckpointer:
    """A thread that runs ``PRAGMA wal_checkpoint(PASSIVE)`` after commits.

    Call :meth:`nudge` after each write commit (cheap, never blocks) and
    :meth:`close` before closing the writer connection.
    """

    def __init__(self, path: str, *, busy_timeout_ms: int, interval: float = DEFAULT_INTERVAL,
                 ) -> None:
        self.path = path
        self.interval = interval
        self.checkpoints = 0
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                     timeout=busy_timeout_ms / 1000.0)
        # Held while nothing is pending; nudge() releases it to wake the thread.
        self._pending = _allocate_lock()
        self._pending.acquire()
        self._state_lock = _allocate_lock()
        self._stopping = False
        self._stopped = _allocate_lock()
        self._stopped.acquire()
        self._pid = os.getpid()
        if resources.ENABLED:
            resources.acquired("WAL checkpoint thread")
        _start_new_thread(self._run, ())

    def nudge(self) -> None:
        """Note that a transaction committed frames to the log."""
        if os.getpid() != self._pid:
            return  # a forked child: the thread stayed with the parent
        with self._state_lock:
            if self._pending.locked():
                self._pending.release()

    def close(self) -> None:
        """Stop the thread after a last checkpoint, and close its connection."""
        if os.getpid() != self._pid:
            return  # a forked child has no thread to stop
        with self._state_lock:
            if self._stopping:
                return
            self._stopping = True
            if self._pending.locked():
                self._pending.release()
        self._stopped.acquire()

    def _run(self) -> None:
        try:
            while True:
                self._pending.acquire()
                with self._state_lock:
                    stopping = self._stopping
                if not stopping:
                    _sleep(self.interval)
                self._checkpoint()
                if stopping:
                    return
        finally:
            self._conn.close()
            if resources.ENABLED:
                resources.released("WAL checkpoint thread")
            self._stopped.release()

    def _checkpoint(self) -> None:
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
        except sqlite3.Error as exc:
            # The writer's own checkpoint still bounds the log; say why this one failed.
            logger.warning("background WAL checkpoint of %s failed: %s", self.path, exc)
