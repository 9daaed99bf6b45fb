"""Closing a connection never destroys lines in flight (real sockets on 127.0.0.1)."""

from __future__ import annotations

import socket

import gevent
import gevent.socket

from streamrep.replication import ConnectionSettings
from streamrep.replication import commands as C
from streamrep.replication.protocol import DisconnectReason
from streamrep.replication.transport.tcp_connection import TcpConnection as ReplicationConnection

LINES = 2_000


def _connected_pair() -> tuple[socket.socket, socket.socket]:
    """Our end, with room to queue everything we send, and the peer's, with a small
    receive window: what we send stays in our socket until the peer reads."""
    listener = gevent.socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    ours = gevent.socket.socket()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    ours.connect(listener.getsockname())
    theirs, _ = listener.accept()
    listener.close()
    return ours, theirs


def _read_to_eof(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        data = sock.recv(65536)  # ConnectionResetError here is the bug this guards
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def test_last_lines_survive_a_close_while_the_peer_keeps_sending() -> None:
    """A writer announces its last facts and closes while the hub, busy, has not
    read them yet and is still sending to it. Closing a socket with unread input
    makes the kernel reset the connection and drop what it has not transmitted:
    the writer's last lines would never reach the hub."""
    ours, theirs = _connected_pair()
    conn = ReplicationConnection(ours, "hub", ConnectionSettings())
    reader = gevent.spawn(conn.run)
    gevent.sleep(0.05)
    for n in range(LINES):
        assert conn.send(C.position("to_device", "writer", n, n + 1))
    conn.close(DisconnectReason.LOCAL_CLOSE)
    # The peer keeps talking (and reads nothing) while the close goes on.
    pings = b"".join(b"PING %d\n" % n for n in range(20_000))
    theirs.sendall(pings)
    gevent.sleep(0.3)
    received = _read_to_eof(theirs)
    theirs.close()
    reader.join(5)
    assert reader.dead
    lines = received.splitlines()
    assert len(lines) == LINES
    assert lines[-1] == b"POSITION to_device writer %d %d" % (LINES - 1, LINES)
    assert ours.fileno() == -1  # our end is closed, not leaked


def test_error_line_reaches_a_peer_that_is_still_sending() -> None:
    """A peer cut off with ERROR (say, for a bad line) while it keeps sending still
    gets to read the ERROR line."""
    ours, theirs = _connected_pair()
    conn = ReplicationConnection(ours, "worker", ConnectionSettings())
    reader = gevent.spawn(conn.run)
    theirs.sendall(b"NOT_A_COMMAND x\n")
    gevent.sleep(0.05)
    theirs.sendall(b"PING 1\n" * 20_000)
    gevent.sleep(0.3)
    received = _read_to_eof(theirs)
    theirs.close()
    reader.join(5)
    assert reader.dead
    assert conn.close_reason == DisconnectReason.PROTOCOL_ERROR
    assert received.startswith(b"ERROR ") and b"NOT_A_COMMAND" in received
