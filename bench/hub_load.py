"""Load generators against a hub (run by test_bench_hub_load.py).

``python bench/hub_load.py connects HOST:PORT SECONDS CONCURRENCY PROCESSES OUT``:
PROCESSES processes (each from its own loopback addresses, 40 connections per
address) keep CONCURRENCY connections each going: connect, read the hub's first line (``SERVER ...``), close,
over and over for SECONDS; writes ``{"connects", "failures", "seconds",
"connect_ms": [p50, p99, max], "generator_cpu_seconds"}``.

``python bench/hub_load.py stalled HOST:PORT COUNT``: COUNT readers that send
``NAME`` and ``REPLICATE`` and then never read, spread over the addresses 127.0.0.2,
127.0.0.3, ... (99 each, under the hub's limit per address); prints ``ready`` once
all are connected, then waits for a line on stdin, after which it reads every
socket to its end and prints ``{"closed", "errors": {line: count}}``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import gevent
import orjson
from gevent import socket


#: Connections kept open at once from one source address: under the hub's limit
#: on pending peers per address (50), so none is closed to make room.
PER_SOURCE = 40


def _connect_loop(address: tuple[str, int], seconds: float, concurrency: int, network: int) -> dict[str, Any]:
    """One process's share of ``connects``: *concurrency* non-blocking sockets from the
    addresses 127.<network>.0.1, .2, ... (:data:`PER_SOURCE` each), driven by one
    epoll loop (no greenlets: a connect costs the generator a few syscalls, so it can
    offer the hub more than one Python process could with gevent). A connect counts
    when the hub's first line is ``SERVER``."""
    import errno
    import select
    import socket as stdsocket

    poller = select.epoll()
    open_sockets: dict[int, list[Any]] = {}  # fd -> [socket, started, received]
    done = failures = 0
    samples: list[float] = []
    no_port = getattr(stdsocket, "IP_BIND_ADDRESS_NO_PORT", 24)

    def open_one(source: str) -> None:
        nonlocal failures
        sock = stdsocket.socket(stdsocket.AF_INET, stdsocket.SOCK_STREAM)
        sock.setblocking(False)
        # The port is chosen at connect, per destination, so TIME_WAIT ports of
        # earlier connects are reused on loopback instead of running out.
        sock.setsockopt(stdsocket.IPPROTO_IP, no_port, 1)
        sock.bind((source, 0))
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS):
            failures += 1
            sock.close()
            return
        poller.register(sock.fileno(), select.EPOLLIN)
        open_sockets[sock.fileno()] = [sock, time.perf_counter(), b"", source]

    def finish(fd: int, ok: bool) -> None:
        nonlocal done, failures
        sock, started, _, _ = open_sockets.pop(fd)
        poller.unregister(fd)
        sock.close()
        if ok:
            done += 1
            if done % 16 == 0:
                samples.append((time.perf_counter() - started) * 1000)
        else:
            failures += 1

    stop_at = time.monotonic() + seconds
    for n in range(concurrency):
        open_one(f"127.{network}.0.{1 + n // PER_SOURCE}")
    started_at = time.monotonic()
    while time.monotonic() < stop_at:
        for fd, _events in poller.poll(0.1):
            entry = open_sockets[fd]
            try:
                chunk = entry[0].recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                entry[2] += chunk
                if b"\n" not in entry[2]:
                    continue
            finish(fd, entry[2].startswith(b"SERVER "))
            open_one(entry[3])
    elapsed = time.monotonic() - started_at
    for fd in list(open_sockets):
        open_sockets.pop(fd)[0].close()
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"connects": done, "failures": failures, "seconds": elapsed, "samples": samples,
            "cpu_seconds": usage.ru_utime + usage.ru_stime}


def connects(address: tuple[str, int], seconds: float, concurrency: int, processes: int) -> dict[str, Any]:
    """*processes* generator processes of *concurrency* connections each, process *n*
    from the addresses 127.<20 + n>.0.x (see :func:`_connect_loop`)."""
    import subprocess

    children = [subprocess.Popen([sys.executable, __file__, "connect-loop", f"{address[0]}:{address[1]}",
                                  str(seconds), str(concurrency), str(20 + n)], stdout=subprocess.PIPE)
                for n in range(processes)]
    results = []
    for child in children:
        out, _ = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"a connect generator exited with status {child.returncode}")
        results.append(orjson.loads(out))
    samples = sorted(s for r in results for s in r["samples"])
    quantiles = [samples[len(samples) // 2], samples[int(len(samples) * 0.99)], samples[-1]] if samples else []
    return {"connects": sum(r["connects"] for r in results), "failures": sum(r["failures"] for r in results),
            "seconds": max(r["seconds"] for r in results), "connect_ms": quantiles,
            "generator_cpu_seconds": sum(r["cpu_seconds"] for r in results)}


def stalled(address: tuple[str, int], count: int) -> None:
    import socket as stdsocket

    sockets = []
    for n in range(count):
        sock = socket.socket(stdsocket.AF_INET, stdsocket.SOCK_STREAM)
        sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 4096)
        sock.bind((f"127.0.0.{2 + n // 99}", 0))
        sock.connect(address)
        sock.sendall(b"NAME stalled%d\nREPLICATE\n" % n)
        sockets.append(sock)
    print("ready", flush=True)
    sys.stdin.readline()
    errors: dict[str, int] = {}
    closed = 0
    for sock in sockets:
        sock.settimeout(0.05)
        tail = b""
        try:
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    closed += 1
                    break
                tail = (tail + chunk)[-4096:]
        except OSError:
            pass
        last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1].decode(errors="replace")
        if last.startswith("ERROR"):
            errors[last] = errors.get(last, 0) + 1
        sock.close()
    print(orjson.dumps({"closed": closed, "errors": errors}).decode(), flush=True)


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "connects":
        figures = connects(_address(args[0]), float(args[1]), int(args[2]), int(args[3]))
        with open(args[4], "wb") as fh:
            fh.write(orjson.dumps(figures))
    elif role == "connect-loop":
        print(orjson.dumps(_connect_loop(_address(args[0]), float(args[1]), int(args[2]), int(args[3]))).decode())
    elif role == "stalled":
        stalled(_address(args[0]), int(args[1]))
    else:
        raise SystemExit(f"unknown role {role}")
