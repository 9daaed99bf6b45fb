"""Roles of test_bench_redis_ceiling.py: Redis pub/sub with clients that cost
(almost) nothing, to measure what Redis itself can deliver.

``python bench/redis_ceiling.py subscriber PORT CHANNEL BYTES OUT``: subscribes to
CHANNEL, prints ``ready``, then reads (and drops) until BYTES bytes of messages have
arrived; writes ``{"first_ns", "last_ns"}`` (``time.monotonic_ns``, the first and
the last read) to OUT.

``python bench/redis_ceiling.py publisher PORT CHANNEL LINES``: publishes LINES
lines shaped like the fan-out benchmark's (``RDATA to_device`` rows of 1,000 users
per fact), one ``PUBLISH`` a line as a streamrep writer sends them, pipelined
from buffers encoded before the clock starts, and reads Redis's answers.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

import orjson

#: Rows per fact, as in the fan-out benchmark.
ROWS_PER_FACT = 1000


def lines(count: int) -> list[bytes]:
    """*count* RDATA lines of to-device facts (one stream ID per fact)."""
    out = []
    for n in range(count):
        stream_id, user = divmod(n, ROWS_PER_FACT)
        row = orjson.dumps([f"@u{user}:bench", f"D{stream_id}"])
        out.append(b"RDATA to_device writer %d %s" % (stream_id + 1, row))
    return out


def publish_command(channel: bytes, line: bytes) -> bytes:
    return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(channel), channel, len(line), line)


def message_bytes(channel: bytes, line: bytes) -> int:
    """What one published *line* takes on a subscriber's connection."""
    return len(b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(channel), channel, len(line), line))


def subscriber(port: int, channel: bytes, expected: int, out: str) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(channel), channel))
    confirm = b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(channel), channel)
    got = b""
    while len(got) < len(confirm):
        got += sock.recv(len(confirm) - len(got))
    print("ready", flush=True)
    buffer = bytearray(1 << 20)
    received = 0
    first = 0
    while received < expected:
        n = sock.recv_into(buffer)
        if not n:
            raise SystemExit(f"Redis closed the subscription after {received} of {expected} bytes")
        if not first:
            first = time.monotonic_ns()
        received += n
    last = time.monotonic_ns()
    with open(out, "wb") as fh:
        fh.write(orjson.dumps({"first_ns": first, "last_ns": last}))


def publisher(port: int, channel: bytes, count: int) -> None:
    encoded = [publish_command(channel, line) for line in lines(count)]
    chunks = [b"".join(encoded[i:i + 5000]) for i in range(0, count, 5000)]
    sock = socket.create_connection(("127.0.0.1", port))
    answers = threading.Thread(target=_read_answers, args=(sock, count))
    answers.start()
    for chunk in chunks:
        sock.sendall(chunk)
    answers.join()


def _read_answers(sock: socket.socket, count: int) -> None:
    """Read Redis's ``:N`` answer to each PUBLISH (so its output never backs up)."""
    buffer = bytearray(1 << 20)
    seen = 0
    while seen < count:
        n = sock.recv_into(buffer)
        if not n:
            raise SystemExit("Redis closed the publisher's connection")
        seen += buffer.count(b"\n", 0, n)


if __name__ == "__main__":
    role, port_text, channel_text = sys.argv[1:4]
    if role == "subscriber":
        subscriber(int(port_text), channel_text.encode(), int(sys.argv[4]), sys.argv[5])
    else:
        publisher(int(port_text), channel_text.encode(), int(sys.argv[4]))
