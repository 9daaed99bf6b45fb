"""The resource counters behind the suite's leak check (``STREAMREP_DEBUG_RESOURCES``)."""

from __future__ import annotations

import time
from typing import Any

import gevent
import pytest

from streamrep import resources
from streamrep.db import Database
from streamrep.replication.outbound import OutboundQueue
from streamrep.wire import parse_line


def _held(base: dict[str, int], kind: str) -> int:
    return resources.live().get(kind, 0) - base.get(kind, 0)


def test_resources_are_counted_and_given_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setattr(resources, "ENABLED", True)
    base = resources.live()

    db = Database.open(f"sqlite:///{tmp_path}/r.db")
    assert _held(base, "database handle") == 1
    assert _held(base, "WAL checkpoint thread") == 1
    with db.transaction("t"):
        assert _held(base, "database transaction") == 1
    assert _held(base, "database transaction") == 0

    queue = OutboundQueue(10)
    queue.put(b"PING 1\nPING 2\n", 2)
    queue.put(b"PING 3\n", 1)
    assert _held(base, "queued command") == 3
    assert queue.take(0) == ([b"PING 1\nPING 2\n", b"PING 3\n"], 3)
    queue.put(b"PING 4\n", 1)
    queue.clear()
    assert _held(base, "queued command") == 0

    from streamrep.streams import Streams

    streams = Streams(db, "main", {"caches": ["main"]})
    generator = streams.generator("caches")
    with generator.get_next_mult(3):
        assert _held(base, "stream ID in flight") == 3
    assert _held(base, "stream ID in flight") == 0
    streams.close()

    db.close()
    deadline = time.monotonic() + 5
    while resources.live() != base and time.monotonic() < deadline:
        gevent.sleep(0.02)
    assert resources.live() == base


def test_replication_connection_is_counted_until_its_socket_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    import gevent.socket

    from streamrep.replication import ConnectionSettings
    from streamrep.replication.protocol import DisconnectReason
    from streamrep.replication.transport.tcp_connection import TcpConnection as ReplicationConnection

    monkeypatch.setattr(resources, "ENABLED", True)
    base = resources.live()
    listener = gevent.socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    ours = gevent.socket.create_connection(listener.getsockname())
    theirs, _ = listener.accept()
    listener.close()
    conn = ReplicationConnection(ours, "peer", ConnectionSettings())
    reader = gevent.spawn(conn.run)
    assert _held(base, "replication connection") == 1
    conn.send(parse_line("PING 1"))
    conn.close(DisconnectReason.LOCAL_CLOSE)
    assert theirs.recv(100) == b"PING 1\n"
    theirs.close()
    reader.join(5)
    assert _held(base, "replication connection") == 0
    assert _held(base, "queued command") == 0
