"""Peers that connect and never start replicating cannot hold the hub's slots.

The protocol's bookkeeping (pending peers, the idle deadline, closing the oldest
pending peer) is driven by hand; then the attack runs over real sockets against
``streamrep serve``: 199 connections from one address that send only ``NAME``, then
``streamrep write`` and ``streamrep tail``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

import orjson
import pytest

from streamrep.replication import commands as C
from streamrep.replication.protocol import Close, ConnectionSettings, DisconnectReason, HubState


def _hub(**settings: Any) -> HubState:
    return HubState("hub.example", ConnectionSettings(**settings), own_instances=("main",))


def _commands(text: str) -> list[Any]:
    return C.new_decoder(65536).feed(text.encode())


def test_a_peer_is_pending_until_it_names_itself_and_acts() -> None:
    hub = _hub()
    peer = hub.new_peer("10.0.0.1:1", "10.0.0.1", now=0.0)
    assert hub.pending_count() == 1 and not peer.active
    peer.receive(_commands("PING 1\nREPLICATE\n"), 0.1)  # acting without a name
    assert not peer.active and hub.pending_count("10.0.0.1") == 1
    peer.receive(_commands("NAME worker1\n"), 0.2)
    assert peer.active and hub.pending_count() == 0
    named = hub.new_peer("10.0.0.1:2", "10.0.0.1", now=0.0)
    named.receive(_commands("NAME worker2\nPING 1\n"), 0.1)  # a name and pings: still pending
    assert not named.active and hub.pending_count() == 1
    named.receive(_commands('USER_IP @u:x ["tok","1.2.3.4","agent","DEV",5]\n'), 0.2)
    assert named.active and hub.pending_count() == 0


def test_a_named_peer_that_never_acts_is_closed_at_the_idle_deadline() -> None:
    hub = _hub(handshake_timeout=1.0, idle_timeout=3.0, ping_interval=100, ping_timeout=300)
    idle = hub.new_peer("a:1", "a", now=0.0)
    idle.receive(_commands("NAME idle\n"), 0.1)
    busy = hub.new_peer("a:2", "a", now=0.0)
    busy.receive(_commands("NAME busy\nREPLICATE\n"), 0.1)
    assert idle.tick(2.9, True) == [] and busy.tick(2.9, True) == []
    assert idle.tick(3.1, True) == [Close(DisconnectReason.IDLE_TIMEOUT,
                                          "idle: no REPLICATE, RDATA, POSITION or other command after NAME "
                                          "within 3 seconds of connecting")]
    assert busy.tick(3.1, True) == []
    unnamed = hub.new_peer("a:3", "a", now=0.0)
    assert unnamed.tick(1.1, True)[0].reason == DisconnectReason.HANDSHAKE_TIMEOUT


def test_new_connections_close_the_oldest_pending_peer_of_their_address_then_of_all() -> None:
    hub = _hub(max_connections=10, max_connections_per_host=5, max_pending_connections=4, max_pending_per_host=2)
    a1, a2 = hub.new_peer("a:1", "a"), hub.new_peer("a:2", "a")
    evicted = hub.make_room("a")
    assert [peer for peer, _ in evicted] == [a1]
    assert evicted[0][1] == Close(
        DisconnectReason.PENDING_EVICTED,
        "closed for a new connection: more than 2 connections from a sent no REPLICATE, RDATA or POSITION "
        "after NAME; the oldest is closed")
    assert a1.closed and hub.admit("a") is None
    hub.peer_lost(a1)
    a3 = hub.new_peer("a:3", "a")
    b1, b2 = hub.new_peer("b:1", "b"), hub.new_peer("b:2", "b")
    assert hub.pending_count() == 4
    # A third address: no limit of its own reached, but the global one is.
    evicted = hub.make_room("c")
    assert [peer for peer, _ in evicted] == [a2] and "connections in all" in str(evicted[0][1].error)
    hub.peer_lost(a2)
    # Active peers are never closed to make room and keep the limits on every peer.
    for peer, name in ((a3, "w1"), (b1, "w2"), (b2, "w3")):
        peer.receive(_commands(f"NAME {name}\nREPLICATE\n"), 0.1)
    assert hub.pending_count() == 0
    for n in range(4):
        hub.new_peer(f"a:{10 + n}", "a").receive(_commands(f"NAME a{n}\nREPLICATE\n"), 0.1)
    assert hub.make_room("a") == []
    assert hub.admit("a") == "too many connections from a (limit 5)"


def test_pending_limits_must_fit_within_the_limits_on_every_peer() -> None:
    with pytest.raises(ValueError, match="max_pending_per_host"):
        ConnectionSettings(max_connections_per_host=10, max_pending_per_host=11)
    assert ConnectionSettings(max_connections=60, max_connections_per_host=20).max_pending_connections == 60
    assert ConnectionSettings(max_connections=60, max_connections_per_host=20).max_pending_per_host == 20


def test_the_configuration_file_sets_the_limits(tmp_path: Any) -> None:
    from streamrep.catalogue import known_streams
    from streamrep.config import load_config
    from streamrep.errors import ConfigError

    path = tmp_path / "streamrep.yaml"
    path.write_text("server_name: example.com\nbackpressure: {max_queue_bytes: 1048576}\n"
                    "connections: {max: 500, max_per_host: 100, max_pending: 40, max_pending_per_host: 10,\n"
                    "              handshake_timeout: 4, idle_timeout: 8}\n")
    settings = ConnectionSettings.from_config(load_config(str(path), {}, streams=known_streams()))
    assert (settings.max_connections, settings.max_connections_per_host, settings.max_pending_connections,
            settings.max_pending_per_host, settings.handshake_timeout, settings.idle_timeout,
            settings.max_queued_bytes) == (500, 100, 40, 10, 4.0, 8.0, 1048576)
    path.write_text("server_name: example.com\nconnections: {max_per_host: 10, max_pending_per_host: 20,"
                    " idle_timeout: 0}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(str(path), {}, streams=known_streams())
    assert list(raised.value.problems) == [
        "config error: connections.max_pending_per_host: 20 is more than connections.max_per_host (10); set it to at most 10",
        "config error: connections.idle_timeout: expected a number greater than 0, got 0; set it to a number such as 30.0",
    ]


# --- over real sockets ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _streamrep(*args: str, cwd: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "streamrep", *args], cwd=cwd, **kw)


def _everything_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except OSError:
        return data


def test_idle_named_peers_cannot_lock_a_writer_out(tmp_path: Any) -> None:
    cwd = str(tmp_path)
    port = _free_port()
    db = f"sqlite:///{cwd}/streamrep.db"
    (tmp_path / "streamrep.yaml").write_text("server_name: test.local\ninstance_map: {main: {}, writer1: {}}\n"
                                             "stream_writers: {caches: [writer1]}\n"
                                             "connections: {idle_timeout: 3}\n")
    log = open(tmp_path / "serve.log", "wb")
    hub = _streamrep("serve", "--config", "streamrep.yaml", "--db", db, "--listen", f"127.0.0.1:{port}",
                     cwd=cwd, stdout=subprocess.DEVNULL, stderr=log)
    idle: list[socket.socket] = []
    tail = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                break
            except OSError:
                assert hub.poll() is None and time.monotonic() < deadline, "the hub did not start"
                time.sleep(0.1)
        # 199 connections from one address (the limit per address is 200) that
        # name themselves and then say nothing more.
        idle.extend(socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(198))
        for n, sock in enumerate(idle):
            sock.sendall(b"NAME idle%d\n" % n)
        time.sleep(0.5)
        tail = _streamrep("tail", "--connect", f"127.0.0.1:{port}", "--server-name", "test.local",
                          "--stream", "caches", "--from", "0", "--limit", "100", cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        write = subprocess.run(
            [sys.executable, "-m", "streamrep", "write", "--connect", f"127.0.0.1:{port}", "--db", db,
             "--instance-name", "writer1", "--stream", "caches", "--count", "100",
             "--server-name", "test.local", "--announce-timeout", "20"],
            cwd=cwd, capture_output=True, timeout=120)
        assert write.returncode == 0, write.stderr.decode()
        assert b"accepted by the hub" in write.stderr
        out, _ = tail.communicate(timeout=60)
        assert tail.returncode == 0
        tokens = [orjson.loads(line)["token"] for line in out.splitlines()]
        assert tokens == list(range(1, 101))
        # Every idle connection was told why it was closed.
        reasons = []
        for sock in idle:
            lines = _everything_until_closed(sock, 10).decode().splitlines()
            assert lines and lines[-1].startswith("ERROR "), lines
            reasons.append(lines[-1])
        evicted = [r for r in reasons if r.startswith("ERROR closed for a new connection: more than 50 "
                                                      "connections from 127.0.0.1 sent no REPLICATE")]
        timed_out = [r for r in reasons if r == "ERROR idle: no REPLICATE, RDATA, POSITION or other command "
                                                "after NAME within 3 seconds of connecting"]
        assert len(evicted) + len(timed_out) == 199 and len(evicted) >= 149 and timed_out
    finally:
        for sock in idle:
            sock.close()
        if tail is not None and tail.poll() is None:
            tail.kill()
            tail.wait()
        hub.terminate()
        assert hub.wait(30) == 0
        log.close()
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
