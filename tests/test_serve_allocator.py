"""``streamrep serve`` runs on jemalloc where the machine has it (``--allocator``).

The hub gives the memory of a thousand departed peers back only on an allocator
that returns pages (docs/performance.md, the hub under load): these tests check
that the command really runs on the one it says, that the hub then purges
jemalloc's arenas, and that asking for jemalloc where there is none fails in one
line with its own status.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from streamrep.cli._allocator import find_jemalloc
from support.redis_server import free_port
from support.required import missing


def _jemalloc() -> str:
    found = find_jemalloc()
    if found is None:
        missing("STREAMREP_REQUIRE_JEMALLOC", "jemalloc is not installed (Debian: apt-get install libjemalloc2)")
    return found


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamrep", "serve", "--db", f"sqlite:///{tmp_path}/hub.db",
             "--listen", f"127.0.0.1:{port}", "--server-name", "hub.example", *args],
            stderr=sink, env={**os.environ, **(env or {})}, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, log
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the hub did not start: {log.read_text()}")
            time.sleep(0.05)


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # How it stops is another test's business (it may not have its handlers yet).
    proc.terminate()
    proc.wait(30)


def test_serve_runs_on_jemalloc_where_the_machine_has_it(tmp_path: Path) -> None:
    library = _jemalloc()
    proc, log = _serve(tmp_path, env={"STREAMREP_ALLOCATOR": "auto"})
    try:
        assert os.path.realpath(library) in _mapped(proc.pid)  # the same process, started again
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert b"PYTHONMALLOC=malloc" in environ
        assert b"MALLOC_CONF=background_thread:true" in environ
    finally:
        _stop(proc)
    assert "memory allocator: jemalloc" in log.read_text()


def test_allocator_system_keeps_cpythons_own(tmp_path: Path) -> None:
    _jemalloc()
    proc, log = _serve(tmp_path, "--allocator", "system")
    try:
        assert "jemalloc" not in _mapped(proc.pid)
    finally:
        _stop(proc)
    assert "memory allocator: CPython's own (pymalloc)" in log.read_text()


def test_the_hub_purges_jemallocs_arenas_when_it_runs_on_it(tmp_path: Path) -> None:
    library = _jemalloc()
    probe = ("from streamrep.replication.transport.hub_memory import MemoryReturn\n"
             "memory = MemoryReturn()\n"
             "print(memory.allocator, memory.release())\n")
    env = {**os.environ, "LD_PRELOAD": library, "PYTHONMALLOC": "malloc"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, check=True)
    assert out.stdout.split() == [b"jemalloc", b"0"]  # mallctl's purge of every arena succeeded
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True)
    assert out.stdout.split()[0] == b"glibc"


def test_asking_for_jemalloc_where_there_is_none_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streamrep", "serve", "--allocator", "jemalloc",
         "--db", f"sqlite:///{tmp_path}/hub.db", "--listen", f"127.0.0.1:{free_port()}"],
        env={**os.environ, "STREAMREP_JEMALLOC_LIBRARY": str(tmp_path / "missing.so")},
        capture_output=True, cwd=tmp_path, timeout=60)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2
    assert lines == [f"streamrep serve: error: --allocator jemalloc: it is not in {tmp_path}/missing.so; "
                     "install it (Debian: apt-get install libjemalloc2), name it in "
                     "STREAMREP_JEMALLOC_LIBRARY, or use --allocator system"]
    assert not (tmp_path / "hub.db").exists()  # refused before anything was opened
