"""Accepting connections: the listen backlog follows the kernel's ceiling, so a
burst of connections waits in the kernel until the hub gets to it."""

from __future__ import annotations

import _socket
import time

from streamrep.replication import ConnectionSettings, MemorySource, ReplicationHub
from streamrep.replication.transport.tcp_hub import listen_backlog
from support.replication import wait_until


def test_the_backlog_is_the_kernels_ceiling() -> None:
    with open("/proc/sys/net/core/somaxconn") as fh:
        assert listen_backlog() == int(fh.read())


def test_a_burst_of_connections_waits_in_the_backlog() -> None:
    hub = ReplicationHub("hub.example", MemorySource(["caches"]), port=0, settings=ConnectionSettings(
        max_connections=2000, max_connections_per_host=2000, max_pending_connections=2000,
        max_pending_per_host=2000))
    hub.start()
    burst = min(1000, listen_backlog())
    sockets: list[_socket.socket] = []
    try:
        # Blocking connects from the kernel's own sockets, without yielding: the
        # hub accepts nothing meanwhile, so every one of them must fit the backlog
        # (a connection beyond it is dropped and retried a second later).
        started = time.monotonic()
        for _ in range(burst):
            sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            sockets.append(sock)
            sock.settimeout(0.5)
            sock.connect(hub.address)
        assert time.monotonic() - started < 5.0
        assert len(hub.connections) == 0
        wait_until(lambda: len(hub.connections) == burst, timeout=30)
        wait_until(lambda: all(conn.idle() for conn in hub.connections), timeout=30)
        for sock in sockets:
            sock.settimeout(5.0)
            assert sock.recv(64).startswith(b"SERVER hub.example\n")
    finally:
        for sock in sockets:
            sock.close()
        hub.stop()
