"""A consumer that stops reading is cut off; nobody else notices."""

from __future__ import annotations

import socket as stdsocket

import gevent
from gevent import socket

from streamrep.replication import ConnectionSettings, MemorySource, ReplicationHub
from support.replication import LineClient, wait_until


def _slow_reader(address: tuple[str, int]) -> LineClient:
    # A tiny receive window so the kernel cannot soak up the backlog for us.
    sock = socket.socket(stdsocket.AF_INET, stdsocket.SOCK_STREAM)
    sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 4096)
    sock.connect(address)
    peer = LineClient.__new__(LineClient)
    peer.sock = sock
    peer.sock.settimeout(5.0)
    peer._buf = b""
    return peer


def test_slow_consumer_is_disconnected_others_keep_up() -> None:
    max_queue = 2000
    source = MemorySource(["caches"])
    hub = ReplicationHub(
        "hub.example", source, port=0,
        settings=ConnectionSettings(ping_interval=5, ping_timeout=15, max_queued_commands=max_queue),
    )
    hub.start()
    slow = _slow_reader(hub.address)
    fast = LineClient(hub.address)
    try:
        slow.send("NAME slow\nREPLICATE\n")
        fast.send("NAME fast\nREPLICATE\n")
        wait_until(lambda: len(hub.connections) == 2 and all(c.live_all for c in hub.connections))
        received: list[int] = []

        def read_fast() -> None:
            while True:
                line = fast.line()
                if line.startswith("RDATA"):
                    received.append(int(line.split()[3]))

        reader = gevent.spawn(read_fast)

        def read_slow_once_cut_off() -> list[str]:
            # The cut-off peer gets a moment to drain its backlog and the ERROR.
            wait_until(lambda: hub.metrics.disconnects["slow_consumer"] == 1, timeout=30)
            return slow.lines_until(lambda line: line.startswith("ERROR"), limit=total)

        slow_reader = gevent.spawn(read_slow_once_cut_off)
        total, per_advance = 60_000, 200
        deepest = 0
        padding = "x" * 60
        for token in range(1, total + 1, per_advance):
            for t in range(token, token + per_advance):
                source.append("caches", "main", t, [["get_user_by_id", [f"@u{t}:{padding}"], t]])
            hub.writer_advanced("caches", "main", token + per_advance - 1)
            deepest = max([deepest] + [len(c.queue) for c in hub.connections])
            # A writer's facts reach the hub through its socket: the loop polls
            # between them (sleep(0) alone would run this loop again before any
            # reader could read).
            gevent.sleep(0.0005)
        wait_until(lambda: len(received) == total, timeout=30)
        reader.kill()
        assert received == list(range(1, total + 1))
        # The slow one was cut off with a reason; queues never exceeded the bound.
        assert hub.metrics.disconnects["slow_consumer"] == 1
        assert deepest <= max_queue
        tail = slow_reader.get(timeout=30)
        assert tail[-1] == f"ERROR too far behind: more than {max_queue} commands queued"
        assert slow.closed_by_peer()
        assert [c.name for c in hub.connections] == ["fast@" + c.peer for c in hub.connections]
    finally:
        slow.close()
        fast.close()
        hub.stop()


def test_catch_up_delivers_facts_larger_than_the_queue_bound() -> None:
    from support.replication import tcp_link

    source = MemorySource(["to_device"])
    for token in (1, 2, 3):
        source.append("to_device", "w1", token, [[f"@u{j}:x", f"D{token}"] for j in range(500)])
    hub = ReplicationHub(
        "hub.example", source, port=0,
        settings=ConnectionSettings(ping_interval=5, ping_timeout=15, max_queued_commands=100),
    )
    hub.start()
    got: list[tuple[int, int]] = []
    client = tcp_link(hub.address[1], "w", start_from={"to_device": 0},
        handler=lambda s, i, token, rows: got.append((token, len(rows))), backoff=(0.02, 0.1),
    )
    client.start()
    try:
        wait_until(lambda: len(got) == 3, timeout=20)
        assert got == [(1, 500), (2, 500), (3, 500)]
        assert hub.metrics.disconnects["slow_consumer"] == 0
    finally:
        client.stop()
        hub.stop()
