"""``streamrep`` commands as real processes, for the tests that run them, and the
reaping that keeps a failed test from leaving them running into the next."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

_started: list[subprocess.Popen[bytes]] = []


def streamrep_process(log: pathlib.Path, *args: str, out: pathlib.Path | None = None) -> subprocess.Popen[bytes]:
    """``streamrep ARGS`` with stderr into *log* and stdout into *out* (None: a pipe).
    The resource counting of the test run stays in the test process."""
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMREP_CONFIG", "STREAMREP_DEBUG_RESOURCES")}
    with log.open("wb") as err, (out.open("wb") if out is not None else open(os.devnull, "wb")) as sink:
        proc = subprocess.Popen([sys.executable, "-m", "streamrep", *args],
                                stdout=sink if out is not None else subprocess.PIPE, stderr=err, env=env)
    _started.append(proc)
    return proc


def reap_processes() -> None:
    """Kill every process :func:`streamrep_process` started that still runs."""
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU the processes *pids* have used so far (0 for one gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total
