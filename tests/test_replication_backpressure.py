"""A consumer that stops reading is cut off; nobody else notices."""

from __future__ import annotations

import gc
import socket as stdsocket

import gevent
from gevent import socket

from streamrep.replication import ConnectionSettings, MemorySource, ReplicationHub
from streamrep.replication.transport.tcp_hub import HubConnection
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


def test_a_reader_that_keeps_up_is_never_cut_off_while_stalled_peers_are() -> None:
    """Thirty peers that never read and a reader that does; the writer's
    transactions are 25,000 rows, each queued at once (more than a bound counted
    in commands per transaction would hold). The reader gets every fact once, on
    one connection; the stalled peers are cut off once their sockets have taken
    nothing for ping_timeout, and their kernel send buffers never grew past the
    first one, while the reader's did."""
    from support.replication import tcp_link

    settings = ConnectionSettings(ping_interval=0.3, ping_timeout=1.0)
    source = MemorySource(["caches"])
    hub = ReplicationHub("hub.example", source, port=0, settings=settings)
    hub.start()
    stalled = [_slow_reader(hub.address) for _ in range(30)]
    got: list[int] = []
    reader = tcp_link(hub.address[1], "reader", settings=settings,
                      handler=lambda stream, instance, token, rows: got.append(token))
    reader.start()
    try:
        for n, peer in enumerate(stalled):
            peer.send(f"NAME stalled{n}\nREPLICATE\n")
        assert reader.wait_connected(10)
        wait_until(lambda: len(hub.connections) == 31 and all(c.live_all for c in hub.connections))
        first_buffer = hub.connections[0].sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_SNDBUF)
        padding = "x" * 100
        for transaction in range(2):
            for token in range(transaction * 25_000 + 1, (transaction + 1) * 25_000 + 1):
                source.append("caches", "main", token, [["get_user_by_id", [f"@u{token}:{padding}"], token]])
            hub.writer_advanced("caches", "main", (transaction + 1) * 25_000)
        wait_until(lambda: len(got) == 50_000, timeout=30)
        assert got == list(range(1, 50_001))
        [reading] = [c for c in hub.connections if c.session.name == "reader"]
        assert reading.sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_SNDBUF) > first_buffer
        assert all(c.sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_SNDBUF) == first_buffer
                   for c in hub.connections if c is not reading)
        wait_until(lambda: hub.metrics.disconnects["slow_consumer"] == 30, timeout=10)
        assert [c.session.name for c in hub.connections] == ["reader"]
        assert reader.metrics.connections_total == 1  # never cut off, never reconnected
    finally:
        reader.stop()
        for peer in stalled:
            peer.close()
        hub.stop()


def test_the_allocator_gives_memory_back_once_many_peers_have_gone() -> None:
    """After a hundred connections end, and none for a keepalive step, the hub empties
    CPython's attribute cache, then its free lists (a full collection), then asks the
    C allocator (glibc's malloc_trim, or jemalloc's purge) to return what they freed;
    not while connections keep ending, nor after a few."""
    hub = ReplicationHub("hub.example", MemorySource(["caches"]), port=0,
                         settings=ConnectionSettings(ping_interval=0.2, ping_timeout=0.6))
    memory = hub._memory
    assert memory.clear_type_cache is not None and memory.release is not None  # CPython, glibc
    trims: list[int] = []
    memory.release = lambda: trims.append(0)
    memory.clear_type_cache = lambda: trims.append(-1)
    memory.collect = lambda: trims.append(-2) or 0
    hub.start()
    try:
        step = 0.6 / 4
        for _ in range(3):
            socket.create_connection(hub.address).close()
        gevent.sleep(step * 3)
        assert trims == []
        peers = [socket.create_connection(hub.address) for _ in range(120)]
        for peer in peers:
            peer.close()
        wait_until(lambda: trims == [-1, -2, 0], timeout=10)
        gevent.sleep(step * 3)
        assert trims == [-1, -2, 0]
    finally:
        hub.stop()


def test_a_gone_connection_is_not_kept_by_the_keepalive_greenlet() -> None:
    """Once the last peer has gone, nothing in the hub keeps its connection (the
    keepalive greenlet that ticked it last included): its objects are freed."""
    hub = ReplicationHub("hub.example", MemorySource(["caches"]), port=0,
                         settings=ConnectionSettings(ping_interval=0.2, ping_timeout=0.6))
    hub.start()
    try:
        step = 0.6 / 4
        peer = LineClient(hub.address)
        peer.send("NAME gone\n")
        wait_until(lambda: len(hub.connections) == 1)
        gevent.sleep(step * 3)  # ticked a few times
        peer.close()
        wait_until(lambda: not hub.connections)
        gevent.sleep(step * 3)
        gc.collect()
        assert [o for o in gc.get_objects() if isinstance(o, HubConnection)] == []
    finally:
        hub.stop()
