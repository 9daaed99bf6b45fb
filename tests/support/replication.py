"""Helpers for the replication tests: a raw line client and bounded waits."""

from __future__ import annotations

import time
from typing import Any, Callable

import gevent
from gevent import socket


class LineClient:
    """A netcat-like peer: raw lines over a cooperative socket, bounded waits."""

    def __init__(self, address: tuple[str, int], timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.settimeout(timeout)
        self._buf = b""

    def send(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def line(self) -> str:
        """The next line (without newline); raises on timeout or EOF."""
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"connection closed; unterminated data {self._buf!r}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def lines_until(self, predicate: Callable[[str], bool], limit: int = 100_000) -> list[str]:
        """Lines up to and including the first matching *predicate*."""
        out = []
        for _ in range(limit):
            line = self.line()
            out.append(line)
            if predicate(line):
                return out
        raise AssertionError(f"no matching line in {limit} lines")

    def skip_pings(self) -> str:
        """The next line that is not a PING (or the SERVER greeting), within 5 s."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            line = self.line()
            if not line.startswith(("PING", "SERVER")):
                return line
        raise AssertionError("only PINGs for 5 seconds")

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True once the peer closes (draining whatever is left)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self._buf += chunk
        except (socket.timeout, TimeoutError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, step: float = 0.005) -> None:
    """Yield to other greenlets until *predicate* holds; AssertionError after *timeout*."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %.1fs" % timeout)
        gevent.sleep(step)


def tcp_link(port: int, name: str, *, server_name: str | None = None, settings: Any = None,
             backoff: tuple[float, float] = (0.1, 10.0), security: Any = None, **roles: Any) -> Any:
    """A TCP replication link to the hub on 127.0.0.1:*port*, as a process named *name*
    opens it (:func:`streamrep.replication.open_link`)."""
    from streamrep.replication import ConnectionSettings, LinkSettings, open_link

    link_settings = LinkSettings(name, server_name, hub=("127.0.0.1", port),
                                 connection=settings if settings is not None else ConnectionSettings(),
                                 security=security, backoff_base=backoff[0], backoff_max=backoff[1])
    return open_link(link_settings, **roles)
