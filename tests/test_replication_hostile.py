"""Hostile peers against a hub over real sockets on 127.0.0.1.

Each attack runs while a real writer announces facts and a real worker follows
them: the attacker is refused with ERROR and cut off, the hub answers a new
worker within a second throughout, every real fact reaches the worker exactly
once, and the hub's memory stays within a stated bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import gevent
import orjson
import pytest

from streamrep.replication import ConnectionSettings, MemorySource, ReplicationHub
from streamrep.wire import parse_line
from support.replication import LineClient, tcp_link, wait_until

SETTINGS = ConnectionSettings(ping_interval=0.2, ping_timeout=1.0, handshake_timeout=1.0,
                              max_queued_commands=500, max_connections=60, max_connections_per_host=60,
                              max_pending_per_host=60)
WRITERS = {"caches": ["writer1"], "events": ["writer1"]}
#: How much the hub process may grow while it is under attack.
MEMORY_BOUND = 64 * 1024 * 1024


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Deployment:
    """A hub with a real writer and a real worker; facts written on demand."""

    def __init__(self) -> None:
        self.source = MemorySource(["caches", "events"])
        self.hub = ReplicationHub("hub.example", self.source, port=0, settings=SETTINGS, stream_writers=WRITERS)
        self.hub.start()
        self.token = 0
        self.seen: list[tuple[str, str, int]] = []
        self.writer = tcp_link(self.hub.address[1], "writer1", settings=SETTINGS,
            writer_positions=lambda: [("caches", "writer1", self.source.current_token("caches", "writer1"))],
            backoff=(0.02, 0.1))
        self.worker = tcp_link(self.hub.address[1], "worker1", settings=SETTINGS,
            handler=lambda s, i, t, rows: self.seen.append((s, i, t)), source=self.source,
            start_from={"caches": 0}, backoff=(0.02, 0.1))
        self.writer.start()
        self.worker.start()
        assert self.writer.wait_connected(5) and self.worker.wait_connected(5)
        self.write(1)  # so the hub has a position to answer REPLICATE with
        self.peers: list[LineClient] = []
        self.rss_before = _rss()
        self.rss_peak = self.rss_before
        self._sampler = gevent.spawn(self._sample)

    def _sample(self) -> None:
        while True:
            self.rss_peak = max(self.rss_peak, _rss())
            gevent.sleep(0.02)

    def write(self, count: int = 1) -> None:
        """Commit *count* facts as writer1 and announce them."""
        for _ in range(count):
            self.token += 1
            row = ["get_user_by_id", [f"@u{self.token}:x"], self.token]
            self.source.append("caches", "writer1", self.token, [row])
            self.writer.announce("caches", "writer1", [(self.token, orjson.dumps(row))])

    def connect(self) -> LineClient:
        peer = LineClient(self.hub.address)
        self.peers.append(peer)
        return peer

    def answers_a_new_worker_within_a_second(self) -> None:
        start = time.monotonic()
        probe = LineClient(self.hub.address, timeout=1.0)
        try:
            probe.send("NAME probe\nREPLICATE\n")
            assert probe.skip_pings().startswith("POSITION ")
        finally:
            probe.close()
        assert time.monotonic() - start < 1.0

    def every_fact_once(self) -> None:
        expected = [("caches", "writer1", t) for t in range(1, self.token + 1)]
        wait_until(lambda: len(self.seen) >= self.token, timeout=10)
        gevent.sleep(0.1)
        assert self.seen == expected

    def close(self) -> None:
        self._sampler.kill()
        for peer in self.peers:
            peer.close()
        self.writer.stop()
        self.worker.stop()
        self.hub.stop()
        assert self.rss_peak - self.rss_before < MEMORY_BOUND


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    d = Deployment()
    yield d
    d.close()


def _refused(peer: LineClient, expect: str) -> None:
    error = peer.lines_until(lambda line: line.startswith("ERROR"))[-1]
    assert error == f"ERROR {expect}"
    assert peer.closed_by_peer()


def test_forged_rdata_is_refused_and_the_real_fact_still_arrives(deployment: Deployment) -> None:
    deployment.write(3)
    evil = deployment.connect()
    evil.send('NAME evil\nRDATA caches writer1 4 ["get_user_by_id",["@forged:x"],4]\n')
    _refused(evil, "evil cannot write as writer1")
    deployment.answers_a_new_worker_within_a_second()
    deployment.write(3)
    deployment.every_fact_once()
    assert deployment.hub.metrics.disconnects["refused"] == 1


def test_the_hub_cannot_be_impersonated(deployment: Deployment) -> None:
    deployment.write(2)
    as_rows = deployment.connect()
    as_rows.send('NAME evil\nRDATA events main 1 ["$e","!r","m",null,null]\n')
    _refused(as_rows, "main is this hub's own instance")
    as_name = deployment.connect()
    as_name.send("NAME main\n")
    _refused(as_name, "NAME main is this hub's own instance")
    second_writer = deployment.connect()
    second_writer.send("NAME writer1\nPOSITION caches writer1 0 0\n")
    _refused(second_writer, "writer writer1 is already connected (127.0.0.1:"
             f"{deployment.writer.connection.sock.getsockname()[1]})")  # type: ignore[union-attr]
    deployment.write(2)
    deployment.every_fact_once()


def test_a_poisoned_position_silences_nobody(deployment: Deployment) -> None:
    deployment.write(3)
    # Even writer1's own connection cannot move past what its stream table holds:
    # a position or a row beyond it is refused, and the hub's position stays.
    for poison in (_position(105, 9 * 10**18), parse_line(f'RDATA caches writer1 {9 * 10**18} ["x",null,1]')):
        refused = deployment.hub.metrics.disconnects["refused"]
        wait_until(lambda: deployment.writer.connected, timeout=5)
        assert deployment.writer.send(poison)
        wait_until(lambda: deployment.hub.metrics.disconnects["refused"] == refused + 1)
        assert deployment.hub.positions[("caches", "writer1")] <= deployment.token
        deployment.answers_a_new_worker_within_a_second()
        # The writer reconnects, announces its real position, and goes on.
        wait_until(lambda: deployment.writer.connected, timeout=5)
        deployment.write(2)
    deployment.every_fact_once()
    assert deployment.hub.positions[("caches", "writer1")] == deployment.token


def _position(prev: int, new: int) -> Any:
    from streamrep.replication import commands as C

    return C.position("caches", "writer1", prev, new)


def test_twelve_thousand_fake_writers_then_a_tail_without_database(deployment: Deployment) -> None:
    deployment.write(2)
    flood = deployment.connect()
    flood.send("NAME evil\n" + "".join(f"POSITION caches evil{n} 0 1\n" for n in range(12_000)))
    _refused(flood, "evil cannot write as evil0")
    # Every peer may try; none gets a fake writer in.
    floods = [deployment.connect() for _ in range(5)]
    for n, peer in enumerate(floods):
        peer.send(f"NAME evil{n}\n" + "".join(f"POSITION caches evil{n} 0 {t}\n" for t in range(1, 2_001)))
    for n, peer in enumerate(floods):
        _refused(peer, f"evil{n} is not a configured writer of caches")
    assert set(deployment.hub.writers("caches")) <= {"writer1", "main"}
    tail_seen: list[int] = []
    tail = tcp_link(deployment.hub.address[1], "tail", settings=SETTINGS,
                             handler=lambda s, i, t, rows: tail_seen.append(t), start_from={"caches": 0},
                             streams=["caches"], backoff=(0.02, 0.1))
    tail.start()
    try:
        deployment.answers_a_new_worker_within_a_second()
        deployment.write(3)
        wait_until(lambda: tail_seen == list(range(1, deployment.token + 1)), timeout=5)
    finally:
        tail.stop()
    deployment.every_fact_once()


def test_a_trickling_peer_is_closed_at_the_handshake_deadline(deployment: Deployment) -> None:
    trickler = deployment.connect()
    started = time.monotonic()
    for byte in b"PING 1\nNAM":
        trickler.send(bytes([byte]))
        deployment.answers_a_new_worker_within_a_second()
        gevent.sleep(0.05)
    _refused(trickler, "no NAME received within 1 seconds")
    assert time.monotonic() - started < 3.0
    assert deployment.hub.metrics.disconnects["handshake_timeout"] == 1
    deployment.write(2)
    deployment.every_fact_once()


def test_huge_partial_lines_are_cut_off(deployment: Deployment) -> None:
    peers = [deployment.connect() for _ in range(40)]
    chunk = b"RDATA caches writer1 1 [" + b"1," * 32_768
    for peer in peers:
        peer.send(chunk)
    deployment.answers_a_new_worker_within_a_second()
    for peer in peers:
        error = peer.lines_until(lambda line: line.startswith("ERROR"))[-1]
        assert error.startswith("ERROR line too long (over 16384 bytes)")
        assert peer.closed_by_peer()
    deployment.write(2)
    deployment.every_fact_once()


def test_a_batch_flood_is_cut_off(deployment: Deployment) -> None:
    deployment.write(1)
    deployment.writer.stop()
    wait_until(lambda: len(deployment.hub.connections) == 1)
    flood = deployment.connect()
    flood.send("NAME writer1\n")
    row = ' ["get_user_by_id",["@flood:x"],1]\n'
    try:
        for _ in range(100):
            flood.send(("RDATA caches writer1 batch" + row) * 1000)
    except OSError:
        pass  # cut off while still sending
    _refused(flood, f"more than {SETTINGS.max_pending_rows} batch rows without a token")
    deployment.answers_a_new_worker_within_a_second()
    deployment.writer.start()
    assert deployment.writer.wait_connected(5)
    deployment.write(2)
    deployment.every_fact_once()


def test_connection_limits_answer_with_error(deployment: Deployment) -> None:
    room = SETTINGS.max_connections - len(deployment.hub.connections)
    held = [deployment.connect() for _ in range(room)]
    wait_until(lambda: len(deployment.hub.connections) == SETTINGS.max_connections)
    extra = deployment.connect()
    assert extra.line() == f"ERROR too many connections (limit {SETTINGS.max_connections})"
    assert extra.closed_by_peer()
    for peer in held:
        peer.close()
    wait_until(lambda: len(deployment.hub.connections) == 2)
    deployment.answers_a_new_worker_within_a_second()


class FailingSource(MemorySource):
    def updates(self, stream: str, instance: str, from_token: int, upto_token: int,
                limit: int) -> tuple[list[tuple[int, bytes]], bool]:
        raise OSError("database connection lost")


def test_a_catch_up_that_fails_closes_that_peer_with_error() -> None:
    source = FailingSource(["caches"])
    source.append("caches", "main", 3, [["c"]])
    hub = ReplicationHub("hub.example", source, port=0, settings=SETTINGS)
    hub.start()
    try:
        peer = LineClient(hub.address)
        peer.send("NAME w\nREPLICATE caches 0\n")
        _refused(peer, "cannot replicate caches: database connection lost")
        peer.close()
        assert hub.metrics.disconnects["catch_up_failed"] == 1
        other = LineClient(hub.address)
        other.send("NAME w2\nREPLICATE\n")
        assert other.skip_pings() == "POSITION caches main 3 3"
        other.close()
    finally:
        hub.stop()


def test_a_writer_back_with_its_next_fact_in_the_same_read_reaches_every_reader_whole() -> None:
    """A writer reconnects (after a hub restart, say) and its position and next
    fact reach the hub in one read, as they do when the hub was busy: readers
    filling gaps from the database and readers resuming through the hub get the
    missed facts before the new one, each once."""
    source = MemorySource(["caches"])
    hub = ReplicationHub("hub.example", source, port=0, settings=SETTINGS, stream_writers=WRITERS)
    hub.start()
    seen: dict[str, list[int]] = {"filling": [], "resuming": []}
    workers = [
        tcp_link(hub.address[1], f"worker_{kind}", settings=SETTINGS,
                          handler=lambda s, i, t, rows, kind=kind: seen[kind].append(t),
                          source=source if kind == "filling" else None, start_from={"caches": 0},
                          backoff=(0.02, 0.1))
        for kind in seen]
    for worker in workers:
        worker.start()
    try:
        assert all(worker.wait_connected(5) for worker in workers)
        rows = {t: orjson.dumps(["get_user_by_id", [f"@u{t}:x"], t]).decode() for t in range(1, 5)}
        for t in range(1, 5):
            source.append("caches", "writer1", t, [orjson.loads(rows[t])])
        writer = LineClient(hub.address)
        writer.send(f"NAME writer1\nPOSITION caches writer1 3 3\nRDATA caches writer1 4 {rows[4]}\n")
        wait_until(lambda: all(len(tokens) >= 4 for tokens in seen.values()), timeout=5)
        gevent.sleep(0.1)
        assert seen == {"filling": [1, 2, 3, 4], "resuming": [1, 2, 3, 4]}
        writer.close()
    finally:
        for worker in workers:
            worker.stop()
        hub.stop()


class FlakySource(MemorySource):
    """A database whose reads fail while :attr:`down` is set."""

    down = False

    def updates(self, stream: str, instance: str, from_token: int, upto_token: int,
                limit: int) -> tuple[list[tuple[int, bytes]], bool]:
        if self.down:
            raise OSError("database connection lost")
        return super().updates(stream, instance, from_token, upto_token, limit)


def test_rows_past_a_gap_whose_fill_failed_wait_for_the_fill() -> None:
    """A writer reconnects and says where it is with its next fact in the same
    read; the hub cannot read the gap. Its live fact must not reach readers
    ahead of the facts before it, or they would never get those."""
    source = FlakySource(["caches"])
    hub = ReplicationHub("hub.example", source, port=0, settings=SETTINGS, stream_writers=WRITERS)
    hub.start()
    seen: list[int] = []
    worker = tcp_link(hub.address[1], "worker1", settings=SETTINGS,
                               handler=lambda s, i, t, rows: seen.append(t), source=source,
                               start_from={"caches": 0}, backoff=(0.02, 0.1))
    worker.start()
    try:
        assert worker.wait_connected(5)
        rows = {t: orjson.dumps(["get_user_by_id", [f"@u{t}:x"], t]).decode() for t in range(1, 6)}
        for t in range(1, 5):
            source.append("caches", "writer1", t, [orjson.loads(rows[t])])
        source.down = True
        writer = LineClient(hub.address)
        writer.send(f"NAME writer1\nPOSITION caches writer1 3 3\nRDATA caches writer1 4 {rows[4]}\n")
        _refused(writer, "cannot read caches from the database: database connection lost")
        writer.close()
        gevent.sleep(0.2)
        assert seen == []
        # The database is back and the writer announces again: everything, once, in order.
        source.down = False
        source.append("caches", "writer1", 5, [orjson.loads(rows[5])])
        writer = LineClient(hub.address)
        writer.send("NAME writer1\nPOSITION caches writer1 5 5\n")
        wait_until(lambda: len(seen) >= 5, timeout=5)
        gevent.sleep(0.1)
        assert seen == [1, 2, 3, 4, 5]
        writer.close()
    finally:
        worker.stop()
        hub.stop()


def test_a_catch_up_whose_positions_cannot_fit_the_queue_ends_with_error() -> None:
    source = MemorySource(["caches"])
    for n in range(6):
        source.append("caches", f"w{n}", 1, [["c"]])
    settings = ConnectionSettings(ping_interval=0.2, ping_timeout=1.0, max_queued_commands=4)
    hub = ReplicationHub("hub.example", source, port=0, settings=settings)
    hub.start()
    try:
        peer = LineClient(hub.address)
        peer.send("NAME w\nREPLICATE caches 1\n")
        _refused(peer, "catch-up of caches must queue 6 positions at once, more than the queue "
                       "bound (4); raise backpressure.max_queue")
        peer.close()
        started = time.monotonic()
        hub.stop()
        assert time.monotonic() - started < 3.0
    finally:
        hub.stop()


def test_check_config_refuses_a_queue_smaller_than_a_catch_up(tmp_path: Any) -> None:
    path = tmp_path / "deployment.yaml"
    path.write_text("server_name: example.com\nbackpressure: {max_queue: 2}\n")
    done = subprocess.run([sys.executable, "-m", "streamrep", "check-config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "backpressure.max_queue: 2 is smaller than one catch-up must queue at once" in done.stderr
    assert "Traceback" not in done.stderr


def test_sigterm_stops_a_hub_under_attack_within_seconds(tmp_path: Any) -> None:
    import signal
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    hub = subprocess.Popen(
        [sys.executable, "-m", "streamrep", "serve", "--listen", f"127.0.0.1:{port}",
         "--db", f"sqlite:///{tmp_path}/streamrep.db"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peers: list[LineClient] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                peers.append(LineClient(("127.0.0.1", port)))
                break
            except OSError:
                assert hub.poll() is None and time.monotonic() < deadline, "hub did not start"
                time.sleep(0.1)
        flood = peers[0]
        flood.send("NAME evil\n" + "".join(f"POSITION caches evil{n} 0 1\n" for n in range(12_000)))
        tail = LineClient(("127.0.0.1", port))
        peers.append(tail)
        tail.send("NAME tail\nREPLICATE ALL 0\n")
        trickler = LineClient(("127.0.0.1", port))
        peers.append(trickler)
        trickler.send("P")
        time.sleep(0.3)
        started = time.monotonic()
        hub.send_signal(signal.SIGTERM)
        assert hub.wait(timeout=10) == 0
        assert time.monotonic() - started < 5.0
        assert "Traceback" not in hub.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        for peer in peers:
            peer.close()
        if hub.poll() is None:
            hub.kill()
            hub.wait()
        hub.stderr.close()  # type: ignore[union-attr]


def test_a_relayed_row_must_fit_its_streams_row_format() -> None:
    from streamrep.streams import BUILTIN_STREAMS, StreamSet

    # A hub without a database: it relays, and checks what it relays.
    hub = ReplicationHub("hub.example", None, port=0, settings=SETTINGS,
                         row_check=StreamSet(BUILTIN_STREAMS).check_rows)
    hub.start()
    peers = [LineClient(hub.address) for _ in range(3)]
    worker, writer, other = peers
    try:
        worker.send("NAME worker\nREPLICATE\n")
        wait_until(lambda: any(c.live_all for c in hub.connections))
        writer.send('NAME w1\nRDATA to_device w1 1 ["@a:x"]\n')
        assert worker.skip_pings() == 'RDATA to_device w1 1 ["@a:x"]'
        writer.send('RDATA to_device w1 2 ["@a:x","D1"]\nRDATA to_device w1 3 ["@b:x"]\n')
        _refused(writer, "RDATA to_device w1: to_device row has 2 fields, expected 1 (entity)")
        other.send('NAME w2\nRDATA caches w2 1 ["get_user_by_id",["@a:x"],1]\nRDATA nosuch w2 1 [1]\n')
        _refused(other, "RDATA nosuch w2: unknown stream 'nosuch'")
        assert worker.skip_pings() == 'RDATA caches w2 1 ["get_user_by_id",["@a:x"],1]'
    finally:
        for peer in peers:
            peer.close()
        hub.stop()


def test_running_out_of_file_descriptors_prints_no_traceback(tmp_path: Any) -> None:
    import resource
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    hub = subprocess.Popen(
        [sys.executable, "-m", "streamrep", "serve", "--listen", f"127.0.0.1:{port}",
         "--db", f"sqlite:///{tmp_path}/streamrep.db"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=few_descriptors)
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert hub.poll() is None and time.monotonic() < deadline, "hub did not start"
                time.sleep(0.1)
        for _ in range(100):  # more than the hub has descriptors for
            held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        time.sleep(0.5)
        assert hub.poll() is None
        for sock in held:
            sock.close()
        held.clear()
        time.sleep(0.5)
        worker = LineClient(("127.0.0.1", port))
        try:
            worker.send("NAME worker\nREPLICATE\n")
            assert worker.line() == "SERVER localhost"
        finally:
            worker.close()
        hub.send_signal(__import__("signal").SIGTERM)
        assert hub.wait(timeout=10) == 0
        errors = hub.stderr.read().decode()  # type: ignore[union-attr]
        assert "Traceback" not in errors
        assert "cannot accept connections: Too many open files" in errors
    finally:
        for sock in held:
            sock.close()
        if hub.poll() is None:
            hub.kill()
            hub.wait()
        hub.stderr.close()  # type: ignore[union-attr]
