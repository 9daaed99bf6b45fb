"""Child processes of the demo and the JSON status lines they print.

Each child (hub, writer, worker) runs with its stdout piped to the demo: one JSON
object per line (``{"type": "status", ...}``, ``{"type": "done", ...}``). Its
stderr (the structured log) goes to a file in the demo's work directory, so the
logs of a failed run can be read afterwards.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Sequence

import orjson

__all__ = ["Child", "StatusLine", "free_port", "wait_for_port", "emit"]


@dataclass
class StatusLine:
    """One JSON line a child printed, with the child's name."""

    child: str
    data: dict[str, Any]


def emit(kind: str, out: IO[bytes] | None = None, **fields: Any) -> None:
    """Print one status line (used by the children)."""
    stream = out if out is not None else sys.stdout.buffer
    stream.write(orjson.dumps({"type": kind, **fields}) + b"\n")
    stream.flush()


@dataclass
class Child:
    """A child process whose stdout lines arrive on a shared queue."""

    name: str
    role: str
    argv: Sequence[str]
    log_path: str
    lines: queue.Queue[StatusLine]
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    last: dict[str, Any] = field(default_factory=dict)
    done: dict[str, Any] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> None:
        """Start the process and a thread that forwards its stdout lines."""
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            list(self.argv), stdout=subprocess.PIPE, stderr=self._log,
            stdin=subprocess.PIPE, env=self.env, start_new_session=True)
        thread = threading.Thread(target=self._pump, name=f"pump-{self.name}", daemon=True)
        thread.start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = {"type": "output", "text": raw.decode(errors="replace").rstrip()}
            if isinstance(data, dict):
                self.lines.put(StatusLine(self.name, data))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.proc.poll() if self.proc is not None else None

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Send *signum* to this child (only this process, by its id)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> int | None:
        """Wait up to *timeout* seconds; the exit status or None."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def ask_to_stop(self) -> None:
        """Close the child's stdin: the demo's children take that as "finish up"."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            except OSError:
                pass

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after *timeout*; the exit status."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            self.signal(signal.SIGTERM)
            code = self.wait(timeout)
        if code is None:
            self.signal(signal.SIGKILL)
            code = self.wait(5.0)
        if self._log is not None:
            self._log.close()
        return code

    def log_tail(self, lines: int = 8) -> list[str]:
        """The last lines of the child's log."""
        try:
            with open(self.log_path, "rb") as fh:
                text = fh.read()[-20_000:].decode(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float, child: Child | None = None) -> bool:
    """Wait until *host*:*port* accepts connections (False on timeout or if *child*
    exited first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and child.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False
