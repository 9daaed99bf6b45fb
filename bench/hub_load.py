"""Load generators against a hub (run by test_bench_hub_load.py).

``python bench/hub_load.py connects HOST:PORT SECONDS CONCURRENCY OUT``: CONCURRENCY
greenlets connect, read the hub's first line (``SERVER ...``) and close, over and over
for SECONDS; writes ``{"connects", "failures", "seconds", "connect_ms": [p50, p99, max]}``.

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


def connects(address: tuple[str, int], seconds: float, concurrency: int) -> dict[str, Any]:
    done = 0
    failures = 0
    samples: list[float] = []
    stop_at = time.monotonic() + seconds

    def loop() -> None:
        nonlocal done, failures
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                sock = socket.create_connection(address, timeout=10)
                try:
                    data = b""
                    while b"\n" not in data:
                        chunk = sock.recv(4096)
                        if not chunk:
                            raise ConnectionError("closed before SERVER")
                        data += chunk
                finally:
                    sock.close()
            except OSError:
                failures += 1
                gevent.sleep(0.01)
                continue
            done += 1
            if done % 16 == 0:
                samples.append((time.perf_counter() - started) * 1000)

    started = time.monotonic()
    gevent.joinall([gevent.spawn(loop) for _ in range(concurrency)])
    elapsed = time.monotonic() - started
    samples.sort()
    quantiles = [samples[len(samples) // 2], samples[int(len(samples) * 0.99)], samples[-1]] if samples else []
    return {"connects": done, "failures": failures, "seconds": elapsed, "connect_ms": quantiles}


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
        figures = connects(_address(args[0]), float(args[1]), int(args[2]))
        with open(args[3], "wb") as fh:
            fh.write(orjson.dumps(figures))
    elif role == "stalled":
        stalled(_address(args[0]), int(args[1]))
    else:
        raise SystemExit(f"unknown role {role}")
