"""A connection's outbound queue: bounded in commands and bytes, written with one
scatter-gather call over the chunks as queued, so a burst that many readers share is
held once, however many of them stop reading."""

from __future__ import annotations

import gc
import tracemalloc
import socket as stdsocket
from typing import Any

import gevent
from gevent import socket

from streamrep.replication import ConnectionSettings, MemorySource, ReplicationHub
from streamrep.replication.outbound import OutboundQueue
from streamrep.replication.transport.tcp_connection import _send_coalesced, _send_scattered
from support.replication import LineClient, wait_until


def test_the_queue_is_bounded_in_bytes_and_hands_out_the_chunks_it_was_given() -> None:
    queue = OutboundQueue(max_commands=100, max_bytes=10)
    first, second = b"PING 1\n", b"PING 22\n"
    assert queue.put(first) and queue.queued_bytes == 7
    assert not queue.put(second)  # 15 bytes > 10
    assert queue.fits(1, 3) and not queue.fits(1, 4)
    chunks, count = queue.take(0)
    assert count == 1 and chunks[0] is first  # no copy
    assert queue.queued_bytes == 0
    big = b"X" * 50 + b"\n"
    assert queue.put(big)  # alone in an empty queue, a larger chunk still goes
    assert not queue.put(first)
    assert queue.put_last(b"ERROR bye\n") and len(queue) == 2
    queue.clear()


class _TrickleSocket:
    """A non-blocking socket's sendmsg: takes *step* bytes, then is full
    (BlockingIOError) until drained."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.out = bytearray()
        self.calls = 0
        self.full = False

    def sendmsg(self, buffers: list[Any]) -> int:
        assert len(buffers) <= 1024
        self.calls += 1
        if self.full:
            raise BlockingIOError
        budget = self.step
        for buf in buffers:
            take = bytes(buf[:budget])
            self.out += take
            budget -= len(take)
            if not budget:
                self.full = True
                break
        return self.step - budget


def test_scattered_writes_resume_exactly_after_partial_writes() -> None:
    chunks = [b"RDATA caches w %d [\"x\"]\n" % n for n in range(3000)] + [b"", b"tail\n"]
    for step in (1, 7, 4096, 10**9):
        sock = _TrickleSocket(step)
        rest: list[Any] = chunks
        written = 0
        while rest:
            rest, wrote = _send_scattered(sock.sendmsg, rest)
            assert wrote == len(sock.out) - written and (wrote == step or not rest)
            written = len(sock.out)
            assert not rest or sock.full and _send_scattered(sock.sendmsg, rest) == (rest, 0)
            sock.full = False  # the peer read: writable again
        assert bytes(sock.out) == b"".join(chunks)
    assert sock.calls == 3  # 3,002 buffers in calls of at most 1,024


def test_coalesced_writes_keep_the_order() -> None:
    out: list[bytes] = []
    chunks = [b"a" * 40_000, b"b" * 40_000, b"c" * 100_000, b"d" * 10]
    _send_coalesced(out.append, chunks)
    assert b"".join(out) == b"".join(chunks)
    assert max(len(piece) for piece in out) == 100_000 and len(out) == 4


def _reader_that_never_reads(address: tuple[str, int], name: str) -> socket.socket:
    sock = socket.socket(stdsocket.AF_INET, stdsocket.SOCK_STREAM)
    sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 4096)
    sock.connect(address)
    sock.sendall(f"NAME {name}\nREPLICATE\n".encode())
    return sock


def test_a_burst_to_many_stalled_readers_is_held_once() -> None:
    source = MemorySource(["caches"])
    hub = ReplicationHub("hub.example", source, port=0, settings=ConnectionSettings(
        ping_interval=5, ping_timeout=15, max_queued_commands=100_000, max_queued_bytes=64 * 1024 * 1024))
    hub.start()
    stalled = [_reader_that_never_reads(hub.address, f"stalled{n}") for n in range(40)]
    fast = LineClient(hub.address)
    try:
        fast.send("NAME fast\nREPLICATE\n")
        wait_until(lambda: len(hub.connections) == 41 and all(c.live_all for c in hub.connections))
        received = []

        def read_fast() -> None:
            while True:
                line = fast.line()
                if line.startswith("RDATA"):
                    received.append(line)

        reader = gevent.spawn(read_fast)
        padding = "x" * 200
        rows = 20_000  # about 5 MB, published in one advance
        for token in range(1, rows + 1):
            source.append("caches", "main", token, [["get_user_by_id", [f"@u{token}:{padding}"], token]])
        tracemalloc.start()
        try:
            hub.writer_advanced("caches", "main", rows)
            wait_until(lambda: len(received) == rows, timeout=30)
            gevent.sleep(0.2)  # every stalled writer greenlet took its queue and waits in its write
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        reader.kill()
        # The burst is held once (about 5 MB) whatever the number of stalled
        # readers; a copy per reader would be 40 times that.
        assert 4 * 1024 * 1024 < sum(len(line) for line in received) < held < 20 * 1024 * 1024
    finally:
        for sock in stalled:
            sock.close()
        fast.close()
        hub.stop()


def test_a_reader_past_the_byte_bound_is_cut_off_with_the_reason() -> None:
    source = MemorySource(["caches"])
    hub = ReplicationHub("hub.example", source, port=0, settings=ConnectionSettings(
        ping_interval=5, ping_timeout=15, max_queued_commands=1_000_000, max_queued_bytes=256 * 1024))
    hub.start()
    slow = _reader_that_never_reads(hub.address, "slow")
    try:
        wait_until(lambda: len(hub.connections) == 1 and hub.connections[0].live_all)
        padding = "x" * 2000
        for token in range(1, 10_001):  # 20 MB: more than the socket buffers hold
            source.append("caches", "main", token, [["get_user_by_id", [f"@u{token}:{padding}"], token]])
            if token % 100 == 0:
                hub.writer_advanced("caches", "main", token)
                gevent.sleep(0.001)
            if hub.metrics.disconnects["slow_consumer"]:
                break
        wait_until(lambda: hub.metrics.disconnects["slow_consumer"] == 1, timeout=10)
        peer = LineClient.__new__(LineClient)
        peer.sock, peer._buf = slow, b""
        slow.settimeout(5.0)
        last = peer.lines_until(lambda line: line.startswith("ERROR"))[-1]
        assert last == f"ERROR too far behind: more than {256 * 1024} bytes queued"
    finally:
        slow.close()
        hub.stop()
