"""Making psycopg2 cooperative under gevent.

psycopg2 is a C extension that monkey-patching cannot reach; instead it calls a
*wait callback* whenever libpq would block. Ours waits on the socket through
gevent's hub, so one greenlet's query lets the others run.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg2
import psycopg2.extensions
from gevent.socket import wait_read, wait_write

_installed = False
_install_lock = threading.Lock()


def gevent_wait_callback(conn: Any, timeout: float | None = None) -> None:
    """Poll *conn* until libpq is done, yielding to other greenlets meanwhile."""
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        if state == psycopg2.extensions.POLL_READ:
            wait_read(conn.fileno(), timeout=timeout)
        elif state == psycopg2.extensions.POLL_WRITE:
            wait_write(conn.fileno(), timeout=timeout)
        else:
            raise psycopg2.OperationalError(f"unexpected result from connection poll(): {state!r}")


def make_psycopg_green() -> None:
    """Install :func:`gevent_wait_callback` for every psycopg2 connection (idempotent)."""
    global _installed
    with _install_lock:
        if not _installed:
            _installed = True
            if _suspended == 0:
                psycopg2.extensions.set_wait_callback(gevent_wait_callback)


_suspended = 0


class suspended_wait_callback:
    """Context manager running its block with psycopg2's blocking (non-green) calls.

    psycopg2 refuses ``COPY`` while a wait callback is installed. Inside this block
    the callback is removed, so ``copy_expert`` works, at the price of blocking the
    gevent hub for the duration: meant for bulk export and import jobs.
    """

    def __enter__(self) -> None:
        global _suspended
        with _install_lock:
            _suspended += 1
            if _installed:
                psycopg2.extensions.set_wait_callback(None)

    def __exit__(self, *exc_info: object) -> None:
        global _suspended
        with _install_lock:
            _suspended -= 1
            if _installed and _suspended == 0:
                psycopg2.extensions.set_wait_callback(gevent_wait_callback)
