"""The worker side: position bookkeeping (sans-IO), and the client against a real
hub over loopback, across reconnects and hub restarts."""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest

from streamrep.replication import (
    Backoff,
    ConnectionSettings,
    DisconnectReason,
    MemorySource,
    ReplicationHub,
    StreamFollower,
)
from streamrep.replication.transport.tcp_client import TcpLink
from streamrep.replication import follower as follower_module
from support.replication import tcp_link, wait_until

FAST = ConnectionSettings(ping_interval=0.1, ping_timeout=0.5)
Fact = tuple[str, str, int, list[Any]]


# --- StreamFollower -----------------------------------------------------------------------


def _follower(**kwargs: Any) -> tuple[StreamFollower, list[Fact]]:
    got: list[Fact] = []
    return StreamFollower(lambda *fact: got.append(fact), **kwargs), got


def test_batch_rows_make_one_fact_and_advance_on_the_last() -> None:
    f, got = _follower()
    f.on_position("caches", "main", 53, 53)
    f.on_rdata("caches", "main", None, ["a"])
    f.on_rdata("caches", "main", None, ["b"])
    assert got == [] and f.positions[("caches", "main")] == 53
    f.on_rdata("caches", "main", 54, ["c"])
    assert got == [("caches", "main", 54, [["a"], ["b"], ["c"]])]
    assert f.positions[("caches", "main")] == 54


def test_replayed_facts_are_dropped() -> None:
    f, got = _follower()
    f.on_position("events", "w1", 5, 5)
    for token in (6, 7, 6, 7, 8):
        f.on_rdata("events", "w1", token, [token])
    assert [fact[2] for fact in got] == [6, 7, 8]


def test_a_fact_whose_handler_raises_is_not_counted_as_seen() -> None:
    got: list[Fact] = []
    fail = {7}

    def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
        if token in fail:
            fail.discard(token)
            raise RuntimeError("handler failed")
        got.append((stream, instance, token, rows))

    f = StreamFollower(handler)
    f.on_position("events", "w1", 5, 5)
    f.on_rdata("events", "w1", 6, [6])
    with pytest.raises(RuntimeError):
        f.on_rdata("events", "w1", 7, [7])
    assert f.positions[("events", "w1")] == 6
    f.connection_lost()
    for token in (7, 8):  # replayed after the reconnect
        f.on_rdata("events", "w1", token, [token])
    assert [fact[2] for fact in got] == [6, 7, 8]


def test_half_batch_is_forgotten_on_reconnect() -> None:
    f, got = _follower()
    f.on_position("caches", "main", 1, 1)
    f.on_rdata("caches", "main", None, ["lost"])
    f.connection_lost()
    f.on_rdata("caches", "main", None, ["a"])
    f.on_rdata("caches", "main", 2, ["b"])
    assert got == [("caches", "main", 2, [["a"], ["b"]])]


def test_gap_is_filled_from_the_source_before_advancing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follower_module, "FETCH_LIMIT", 2)
    src = MemorySource()
    src.append("events", "w1", 3, [["e3"]])
    src.append("events", "w1", 5, [["e5a"], ["e5b"], ["e5c"]])
    src.append("events", "w1", 6, [["e6"]])
    f, got = _follower(source=src)
    f.on_position("events", "w1", 2, 2)
    assert f.on_position("events", "w1", 6, 7)
    assert got == [
        ("events", "w1", 3, [["e3"]]),
        ("events", "w1", 5, [["e5a"], ["e5b"], ["e5c"]]),
        ("events", "w1", 6, [["e6"]]),
    ]
    assert f.positions[("events", "w1")] == 7
    # A position with nothing missed just advances.
    assert f.on_position("events", "w1", 7, 9) and len(got) == 3
    assert f.positions[("events", "w1")] == 9


def test_gap_without_source_is_reported() -> None:
    f, got = _follower()
    f.on_position("events", "w1", 2, 2)
    assert not f.on_position("events", "w1", 4, 4)
    assert f.positions[("events", "w1")] == 2 and got == []


def test_client_acts_on_what_precedes_an_unfillable_gap_then_reconnects() -> None:
    """Without a database a gap closes the connection (the hub resends from the
    last tokens); what came before it in the read is still carried out."""
    from streamrep.replication import commands as C
    from streamrep.replication.protocol import GapUnfilled, Received, Send
    from streamrep.replication.transport.tcp_connection import TcpConnection

    relayed: list[Any] = []

    class Conn:
        name = "hub"
        session = None
        perform_basic = TcpConnection.perform_basic
        log_peer_error = TcpConnection.log_peer_error

        def __init__(self) -> None:
            self.sent: list[bytes] = []
            self.closed_with: list[str] = []

        def send_lines(self, data: bytes, count: int, name: str) -> bool:
            self.sent.append(data)
            return True

        def close(self, reason: str, error: str | None = None) -> None:
            self.closed_with.append(reason)

    client = tcp_link(1, "w", on_command=relayed.append)
    conn = Conn()
    server_up = C.new_decoder(1000).feed(b"REMOTE_SERVER_UP other.example\n")[0]
    client.perform(conn, [Send(b"PING 1\n", 1, "PING"), Received(server_up),  # type: ignore[arg-type]
                          GapUnfilled("events", "w1", 2, 4), Send(b"PING 2\n", 1, "PING")])
    assert conn.sent == [b"PING 1\n"] and relayed == [server_up]
    assert conn.closed_with == [DisconnectReason.GAP_UNFILLED]


def test_start_from_and_stream_filter() -> None:
    src = MemorySource()
    src.append("caches", "main", 2, [["c2"]])
    src.append("caches", "main", 4, [["c4"]])
    f, got = _follower(source=src, streams=["caches"], start_from={"caches": 2})
    f.on_position("events", "main", 10, 10)
    f.on_position("caches", "main", 4, 4)
    assert got == [("caches", "main", 4, [["c4"]])]
    assert ("events", "main") not in f.positions
    assert f.resume_tokens() == {"caches": 4}


def test_backoff_grows_with_jitter_and_resets() -> None:
    b = Backoff(base=0.1, maximum=2.0, rng=random.Random(7))
    delays = [b.next_delay() for _ in range(8)]
    for attempt, delay in enumerate(delays):
        ceiling = min(2.0, 0.1 * 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == len(delays)
    b.reset()
    assert b.next_delay() <= 0.1


# --- the client against a hub --------------------------------------------------------------


@pytest.fixture
def source() -> MemorySource:
    src = MemorySource(["caches", "events"])
    src.append("caches", "main", 1, [["c", None, 1]])
    return src


@pytest.fixture
def hubs(source: MemorySource) -> Iterator[list[ReplicationHub]]:
    started: list[ReplicationHub] = []
    yield started
    for hub in started:
        hub.stop()


def _hub(hubs: list[ReplicationHub], source: MemorySource, port: int = 0) -> ReplicationHub:
    hub = ReplicationHub("hub.example", source, port=port, settings=FAST)
    hub.start()
    hubs.append(hub)
    return hub


def _client(port: int, got: list[Fact], **kwargs: Any) -> TcpLink:
    kwargs.setdefault("backoff", (0.02, 0.2))
    return tcp_link(port, "worker", server_name="hub.example",
        handler=lambda *fact: got.append(fact), settings=FAST, **kwargs,
    )


def _write(hub: ReplicationHub | None, source: MemorySource, stream: str, tokens: range) -> None:
    for token in tokens:
        source.append(stream, "main", token, [[stream, str(token), token]])
        if hub is not None:
            hub.writer_advanced(stream, "main", token)


@pytest.mark.parametrize("with_database", [True, False], ids=["database", "through-hub"])
def test_every_fact_once_in_order_across_hub_restarts(
    hubs: list[ReplicationHub], source: MemorySource, with_database: bool
) -> None:
    hub = _hub(hubs, source)
    port = hub.address[1]
    got: list[Fact] = []
    client = _client(port, got, source=source if with_database else None, start_from={"caches": 0, "events": 0})
    client.start()
    try:
        assert client.wait_connected(5)
        _write(hub, source, "events", range(1, 50))
        wait_until(lambda: len(got) >= 50)
        hub.stop()
        # Writes continue while the hub is down; then it comes back.
        _write(None, source, "events", range(50, 120))
        _write(None, source, "caches", range(2, 10))
        hub = _hub(hubs, source, port)
        wait_until(lambda: client.connections_made >= 2)
        _write(hub, source, "events", range(120, 150))
        wait_until(lambda: len(got) == 1 + 149 + 8)
        events = [fact[2] for fact in got if fact[0] == "events"]
        caches = [fact[2] for fact in got if fact[0] == "caches"]
        assert events == list(range(1, 150))
        assert caches == list(range(1, 10))
    finally:
        client.stop()


def test_wrong_server_name_is_refused(hubs: list[ReplicationHub], source: MemorySource) -> None:
    hub = _hub(hubs, source)
    got: list[Fact] = []
    client = tcp_link(hub.address[1], "w", server_name="other.example",
        handler=lambda *fact: got.append(fact), settings=FAST, backoff=(0.05, 0.1),
    )
    client.start()
    try:
        wait_until(lambda: hub.metrics.disconnects["peer_error"] >= 1 or
                   client.metrics.disconnects[DisconnectReason.WRONG_SERVER] >= 1)
        assert client.metrics.disconnects[DisconnectReason.WRONG_SERVER] >= 1
    finally:
        client.stop()


def test_writer_process_announces_and_hub_fills_what_it_missed(
    hubs: list[ReplicationHub], source: MemorySource
) -> None:
    hub = _hub(hubs, source)
    port = hub.address[1]
    got: list[Fact] = []
    worker = _client(port, got, source=source, streams=["events"], start_from={"events": 0})

    def persist(tokens: range) -> None:
        for token in tokens:
            source.append("events", "w1", token, [["e", token]])
            writer.announce("events", "w1", [(token, b'["e",%d]' % token)])

    writer = tcp_link(port, "w1", server_name="hub.example", settings=FAST,
        writer_positions=lambda: [("events", "w1", source.current_token("events", "w1"))],
        backoff=(0.02, 0.2),
    )
    worker.start()
    writer.start()
    try:
        assert worker.wait_connected(5) and writer.wait_connected(5)
        persist(range(1, 40))
        wait_until(lambda: len(got) == 39)
        hub.stop()
        persist(range(40, 60))  # announced nowhere: the hub is down
        hub = _hub(hubs, source, port)
        wait_until(lambda: writer.connections_made >= 2 and worker.connections_made >= 2)
        persist(range(60, 70))
        assert writer.flush(5)
        wait_until(lambda: len(got) == 69)
        assert [fact[2] for fact in got] == list(range(1, 70))
        assert got[0] == ("events", "w1", 1, [["e", 1]])
        assert hub.positions[("events", "w1")] == 69
    finally:
        writer.stop()
        worker.stop()


def test_relayed_commands_reach_the_application(hubs: list[ReplicationHub], source: MemorySource) -> None:
    from streamrep.replication import commands as C

    hub = _hub(hubs, source)
    seen: list[Any] = []
    a = tcp_link(hub.address[1], "a", settings=FAST)
    b = tcp_link(hub.address[1], "b", settings=FAST, on_command=seen.append)
    a.start(), b.start()
    try:
        assert a.wait_connected(5) and b.wait_connected(5)
        wait_until(lambda: len(hub.connections) == 2)
        assert a.send(C.wire.RemoteServerUpCommand("other.example"))
        wait_until(lambda: len(seen) == 1)
        assert seen[0].to_bytes() == b"REMOTE_SERVER_UP other.example"
    finally:
        a.stop(), b.stop()


def test_following_everything_from_now_resumes_each_stream_from_its_own_token(
    hubs: list[ReplicationHub], source: MemorySource
) -> None:
    hub = _hub(hubs, source)
    port = hub.address[1]
    got: list[Fact] = []
    client = _client(port, got)
    client.start()
    try:
        assert client.replicate_commands()[0].to_bytes() == b"REPLICATE ALL NOW"
        wait_until(lambda: len(hub.connections) == 1 and hub.connections[0].live_all)
        _write(hub, source, "events", range(1, 400))
        wait_until(lambda: len(got) == 399)
        hub.stop()
        _write(None, source, "events", range(400, 420))
        # Each stream resumes from its own position, not the lowest of all.
        assert sorted(c.to_bytes() for c in client.replicate_commands()) == [
            b"REPLICATE caches 1", b"REPLICATE events 399"]
        hub = _hub(hubs, source, port)
        wait_until(lambda: len(got) == 419)
        assert [fact[2] for fact in got] == list(range(1, 420))
        assert hub.metrics.commands_out["RDATA"] == 20
    finally:
        client.stop()


def test_a_writers_first_announcement_may_fill_its_whole_queue() -> None:
    """Connected means the greeting is on its way: an announcement of as many
    rows as the queue holds, made at once, does not cut the writer off."""
    import orjson

    settings = ConnectionSettings(ping_interval=0.5, ping_timeout=2.0, max_queued_commands=100)
    source = MemorySource(["to_device"])
    hub = ReplicationHub("hub.example", source, port=0, settings=settings)
    hub.start()
    got: list[int] = []
    worker = tcp_link(hub.address[1], "worker", settings=settings,
                               handler=lambda s, i, t, rows: got.append(len(rows)),
                               start_from={"to_device": 0})
    writer = tcp_link(hub.address[1], "w1", settings=settings,
        writer_positions=lambda: [("to_device", "w1", source.current_token("to_device", "w1"))])
    worker.start()
    try:
        assert worker.wait_connected(5)
        rows = [[f"@u{j}:x"] for j in range(100)]
        source.append("to_device", "w1", 1, rows)
        writer.start()
        assert writer.wait_connected(5)
        assert writer.announce("to_device", "w1", [(1, orjson.dumps(row)) for row in rows])
        wait_until(lambda: got == [100])
        assert writer.connections_made == 1 and writer.connected
        assert hub.metrics.disconnects["peer_error"] == 0
    finally:
        writer.stop()
        worker.stop()
        hub.stop()
