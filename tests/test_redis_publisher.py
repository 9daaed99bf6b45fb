"""The publishing connection to Redis, against a server of the test's own."""

from __future__ import annotations

import time

import gevent
import gevent.server
import gevent.socket
import pytest

from streamrep.replication.transport import redis_connection
from streamrep.replication.transport.redis_connection import Publisher, encode_publish


class _SlowRedis:
    """Answers the publisher's PING, then takes what it is sent slowly (64 KiB
    every 10 ms, about 6 MB/s) and answers nothing else."""

    def __init__(self) -> None:
        self.received = 0
        self.server = gevent.server.StreamServer(("127.0.0.1", 0), self._serve)
        self.server.start()

    def _serve(self, sock: gevent.socket.socket, _address: object) -> None:
        sock.setsockopt(gevent.socket.SOL_SOCKET, gevent.socket.SO_RCVBUF, 64 * 1024)
        assert sock.recv(64).startswith(b"*1\r\n$4\r\nPING")
        sock.sendall(b"+PONG\r\n")
        while True:
            data = sock.recv(64 * 1024)
            if not data:
                return
            self.received += len(data)
            gevent.sleep(0.01)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def cooperative_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher on gevent's sockets, as every process replicating through
    Redis runs it (the command-line tools patch the standard library)."""
    monkeypatch.setattr(redis_connection, "socket", gevent.socket)


def test_a_batch_redis_takes_slowly_is_not_cut_by_the_answer_loops_timeout(
        cooperative_sockets: None) -> None:
    slow = _SlowRedis()
    publisher = Publisher(slow.url, connect_timeout=1.5)
    publisher.open()
    # What the link does: one greenlet waits for answers with a short timeout
    # while another sends a batch that takes Redis several seconds to read.
    polling = gevent.spawn(lambda: [publisher.take_answers(0.05) for _ in range(10_000)])
    # Far more than the kernel's buffers on both sides hold (a few MiB): about
    # four seconds of the server's pace.
    batch = encode_publish("bench.example", [b"RDATA to_device w 1 " + b"x" * 200] * 120_000)
    assert len(batch) > 24 * 1024 * 1024
    started = time.monotonic()
    try:
        publisher.send(batch, 120_000)
        taken = time.monotonic() - started
    finally:
        polling.kill()
        publisher.close()
        slow.server.stop()
    assert taken > 1.5  # longer than the socket's timeout, yet no part stalled that long
    assert publisher.sent == 120_000


def test_a_redis_that_takes_nothing_fails_the_send(cooperative_sockets: None) -> None:
    accepted: list[gevent.socket.socket] = []

    def stuck(sock: gevent.socket.socket, _address: object) -> None:
        accepted.append(sock)
        sock.recv(64)
        sock.sendall(b"+PONG\r\n")
        gevent.sleep(10)  # reads nothing more

    server = gevent.server.StreamServer(("127.0.0.1", 0), stuck)
    server.start()
    publisher = Publisher(f"redis://127.0.0.1:{server.server_port}", connect_timeout=0.5)
    publisher.open()
    try:
        with pytest.raises(TimeoutError):
            publisher.send(b"x" * (64 * 1024 * 1024), 1)
    finally:
        publisher.close()
        server.stop()


def test_messages_in_the_same_read_as_the_confirmation_are_handed_on(
        cooperative_sockets: None) -> None:
    from streamrep.replication.transport.redis_connection import Subscription

    def confirm_then_publish(sock: gevent.socket.socket, _address: object) -> None:
        sock.recv(1024)  # SUBSCRIBE example.com
        # Redis may pass messages on right behind its confirmation, in one write.
        sock.sendall(b"*3\r\n$9\r\nsubscribe\r\n$11\r\nexample.com\r\n:1\r\n"
                     b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$11\r\nPOSITION a1\r\n"
                     b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$8\r\nRDATA b2\r\n")
        gevent.sleep(5)

    server = gevent.server.StreamServer(("127.0.0.1", 0), confirm_then_publish)
    server.start()
    subscription = Subscription(f"redis://127.0.0.1:{server.server_port}", ["example.com"], 2.0)
    try:
        subscription.open()
        assert subscription.read_messages(0.5) == (b"POSITION a1\nRDATA b2\n", 0)
    finally:
        subscription.close()
        server.stop()
