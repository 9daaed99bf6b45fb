"""The hub over real sockets on 127.0.0.1: greeting, REPLICATE, publishing,
relaying, keepalive, bad input and shutdown."""

from __future__ import annotations

import pathlib
import time
from typing import Iterator

import pytest

from streamrep.replication import ConnectionSettings, MemorySource, ReplicationHub
from support.replication import LineClient, wait_until

FAST = ConnectionSettings(ping_interval=0.1, ping_timeout=0.5)


@pytest.fixture
def source() -> MemorySource:
    src = MemorySource(["caches", "events"])
    src.append("caches", "main", 1, [["get_user_by_id", ["@a:x"], 1]])
    src.append("events", "main", 3, [["$e3", "!r", "m.room.message", None, None]])
    return src


@pytest.fixture
def hub(source: MemorySource) -> Iterator[ReplicationHub]:
    h = ReplicationHub("hub.example", source, port=0, settings=FAST)
    h.start()
    yield h
    h.stop()
    # Every connection is accounted for once the hub has stopped.
    assert h.connections == []


_open: list[LineClient] = []


@pytest.fixture(autouse=True)
def _close_peers() -> Iterator[None]:
    yield
    while _open:
        _open.pop().close()


def _connect(hub: ReplicationHub) -> LineClient:
    peer = LineClient(hub.address, timeout=5.0)
    _open.append(peer)
    return peer


def test_seed_transcript(hub: ReplicationHub, source: MemorySource) -> None:
    c = _connect(hub)
    assert c.line() == "SERVER hub.example"
    assert c.line().startswith("PING ")
    c.send("NAME synapse.app.appservice\nPING 1490197665618\nREPLICATE\n")
    positions = sorted(c.skip_pings() for _ in range(2))
    assert positions == ["POSITION caches main 1 1", "POSITION events main 3 3"]
    source.append("caches", "main", 2, [["get_user_by_id", ["@b:x"], 5]])
    hub.writer_advanced("caches", "main", 2)
    assert c.skip_pings() == 'RDATA caches main 2 ["get_user_by_id",["@b:x"],5]'
    c.close()


def test_rows_sharing_an_id_are_batched(hub: ReplicationHub, source: MemorySource) -> None:
    c = _connect(hub)
    c.send("REPLICATE\n")
    c.lines_until(lambda line: line.startswith("POSITION events"))
    rows = [["get_user_by_id", [f"@test{i}:x"], 7] for i in range(1, 5)]
    source.append("caches", "main", 54, rows)
    hub.writer_advanced("caches", "main", 54)
    got = [c.skip_pings() for _ in range(4)]
    assert got == [
        'RDATA caches main batch ["get_user_by_id",["@test1:x"],7]',
        'RDATA caches main batch ["get_user_by_id",["@test2:x"],7]',
        'RDATA caches main batch ["get_user_by_id",["@test3:x"],7]',
        'RDATA caches main 54 ["get_user_by_id",["@test4:x"],7]',
    ]


def test_position_without_rows(hub: ReplicationHub, source: MemorySource) -> None:
    c = _connect(hub)
    c.send("REPLICATE\n")
    c.lines_until(lambda line: line.startswith("POSITION events"))
    source.advance("events", "main", 9)  # e.g. rolled-back facts
    hub.writer_advanced("events", "main", 9)
    assert c.skip_pings() == "POSITION events main 3 9"


def test_legacy_replicate_streams_history_then_live(hub: ReplicationHub, source: MemorySource) -> None:
    for token in range(2, 8):
        source.append("caches", "main", token, [["c", [str(token)], token]])
    hub.writer_advanced("caches", "main", 7)
    c = _connect(hub)
    c.send("REPLICATE caches 4\n")
    lines = c.lines_until(lambda line: line.startswith("POSITION"))
    lines = [line for line in lines if not line.startswith(("PING", "SERVER"))]
    assert lines == [
        'RDATA caches main 5 ["c",["5"],5]',
        'RDATA caches main 6 ["c",["6"],6]',
        'RDATA caches main 7 ["c",["7"],7]',
        "POSITION caches main 7 7",
    ]
    source.append("caches", "main", 8, [["c", ["8"], 8]])
    hub.writer_advanced("caches", "main", 8)
    assert c.skip_pings() == 'RDATA caches main 8 ["c",["8"],8]'
    # Not subscribed to events.
    source.append("events", "main", 9, [["$e9", "!r", "m", None, None]])
    hub.writer_advanced("events", "main", 9)
    source.append("caches", "main", 10, [["c", ["10"], 10]])
    hub.writer_advanced("caches", "main", 10)
    assert c.skip_pings() == 'RDATA caches main 10 ["c",["10"],10]'


def test_legacy_replicate_all_now(hub: ReplicationHub, source: MemorySource) -> None:
    c = _connect(hub)
    c.send("REPLICATE ALL NOW\n")
    assert sorted(c.skip_pings() for _ in range(2)) == [
        "POSITION caches main 1 1", "POSITION events main 3 3"]
    source.append("events", "main", 4, [["$e4", "!r", "m", None, None]])
    hub.writer_advanced("events", "main", 4)
    assert c.skip_pings().startswith("RDATA events main 4 ")


def test_catch_up_has_no_gap_or_duplicate_while_writes_continue(hub: ReplicationHub, source: MemorySource) -> None:
    import gevent

    def write(start: int, end: int) -> None:
        for token in range(start, end):
            source.append("caches", "main", token, [["c", [str(token)], 0]])
            hub.writer_advanced("caches", "main", token)
            if token % 50 == 0:
                gevent.sleep(0)

    write(2, 3000)
    writer = gevent.spawn(write, 3000, 6000)
    c = _connect(hub)
    c.send("REPLICATE caches 1\n")
    writer.join(10)
    tokens = []
    while not tokens or tokens[-1] < 5999:
        line = c.skip_pings()
        if line.startswith("RDATA"):
            tokens.append(int(line.split()[3]))
    assert tokens == list(range(2, 6000))


def test_unknown_stream_and_server_from_client_are_refused(hub: ReplicationHub) -> None:
    c = _connect(hub)
    c.send("REPLICATE nosuchstream NOW\n")
    assert c.lines_until(lambda line: line.startswith("ERROR"))[-1] == "ERROR unknown stream nosuchstream"
    assert c.closed_by_peer()
    c2 = _connect(hub)
    c2.send("SERVER impostor\n")
    assert c2.lines_until(lambda line: line.startswith("ERROR"))[-1] == "ERROR SERVER is not accepted from a client"
    assert c2.closed_by_peer()


@pytest.mark.parametrize(
    "bad, expect",
    [
        (b"FROBNICATE now\n", "unknown command"),
        (b"POSITION caches main x 3\n", "POSITION"),
        (b"RDATA caches main 3\n", "RDATA"),
        (b"NAME w\nRDATA caches w 3 [1, oops]\n", "not valid JSON"),
        (b"\x00\xff\xfe garbage \x81\n", "ERROR "),
        (b"RDATA caches main 3 [" + b"1," * 20000 + b"1]\n", "too long"),
    ],
    ids=["unknown", "malformed-position", "malformed-rdata", "bad-row-json", "binary", "over-long"],
)
def test_bad_input_gets_error_and_close_others_unaffected(
    hub: ReplicationHub, source: MemorySource, bad: bytes, expect: str
) -> None:
    bystander = _connect(hub)
    bystander.send("REPLICATE\n")
    bystander.lines_until(lambda line: line.startswith("POSITION events"))
    c = _connect(hub)
    c.send(bad)
    error = c.lines_until(lambda line: line.startswith("ERROR"))[-1]
    assert expect in error
    assert c.closed_by_peer()
    source.append("caches", "main", 2, [["still", None, 1]])
    hub.writer_advanced("caches", "main", 2)
    assert bystander.skip_pings() == 'RDATA caches main 2 ["still",null,1]'
    assert hub.metrics.disconnects["protocol_error"] == 1


def test_hub_pings_and_times_out_silent_pinger(hub: ReplicationHub) -> None:
    c = _connect(hub)
    c.line(), c.line()  # SERVER, PING
    # The hub keeps talking to a quiet peer.
    assert c.line().startswith("PING ")
    c.send("PING 1\n")
    start = time.monotonic()
    lines = c.lines_until(lambda line: line.startswith("ERROR"))
    assert lines[-1] == "ERROR no command received for 0.5 seconds"
    assert 0.4 < time.monotonic() - start < 3.0
    assert c.closed_by_peer()
    assert hub.metrics.disconnects["timeout"] == 1


def test_netcat_peer_that_never_pings_is_not_timed_out(hub: ReplicationHub) -> None:
    c = _connect(hub)
    time.sleep(1.5)  # three timeouts' worth of silence
    lines = []
    c.sock.settimeout(0.5)
    while len(lines) < 5:
        lines.append(c.line())
    assert all(line.startswith(("SERVER", "PING")) for line in lines)
    c.send("REPLICATE\n")
    assert c.skip_pings().startswith("POSITION")


def test_presence_and_other_commands_are_relayed(hub: ReplicationHub) -> None:
    a, b = _connect(hub), _connect(hub)
    for peer in (a, b):
        peer.line(), peer.line()
    wait_until(lambda: len(hub.connections) == 2)
    a.send("USER_SYNC worker1 @alice:x DEV1 start 1000\nUSER_SYNC worker1 @bob:x None start 1001\n")
    a.send("REMOTE_SERVER_UP other.example\nFEDERATION_ACK worker1 7\n")
    got = [b.skip_pings() for _ in range(4)]
    assert got == [
        "USER_SYNC worker1 @alice:x DEV1 start 1000",
        "USER_SYNC worker1 @bob:x None start 1001",
        "REMOTE_SERVER_UP other.example",
        "FEDERATION_ACK worker1 7",
    ]
    assert hub.syncing_users == {"worker1": {"@alice:x", "@bob:x"}}
    a.send("USER_SYNC worker1 @bob:x None end 1002\n")
    assert b.skip_pings() == "USER_SYNC worker1 @bob:x None end 1002"
    assert hub.syncing_users == {"worker1": {"@alice:x"}}
    a.close()
    # The instance's syncing users go with its connection, and others hear of it.
    assert b.skip_pings() == "CLEAR_USER_SYNC worker1"
    assert hub.syncing_users == {}


def test_clear_user_sync(hub: ReplicationHub) -> None:
    a = _connect(hub)
    a.send("USER_SYNC w2 @carol:x None start 5\n")
    wait_until(lambda: hub.syncing_users == {"w2": {"@carol:x"}})
    a.send("CLEAR_USER_SYNC w2\n")
    wait_until(lambda: hub.syncing_users == {})


def test_stop_sends_error_to_every_peer(source: MemorySource) -> None:
    h = ReplicationHub("hub.example", source, port=0, settings=FAST)
    h.start()
    peers = [_connect(h) for _ in range(3)]
    wait_until(lambda: len(h.connections) == 3)
    h.stop()
    for peer in peers:
        assert peer.lines_until(lambda line: line.startswith("ERROR"))[-1] == "ERROR server stopping"
        assert peer.closed_by_peer()


def test_metrics_are_exposed(hub: ReplicationHub, source: MemorySource) -> None:
    from prometheus_client import generate_latest

    c = _connect(hub)
    c.send("NAME w\nREPLICATE\n")
    c.lines_until(lambda line: line.startswith("POSITION events"))
    text = generate_latest(hub.metrics.registry).decode()
    assert 'streamrep_replication_stream_position{instance="main",stream="events"} 3.0' in text
    assert 'streamrep_replication_commands_received_total{command="REPLICATE"} 1.0' in text
    assert 'streamrep_replication_commands_sent_total{command="POSITION"} 2.0' in text
    assert "streamrep_replication_queued_commands{connection=" in text


def test_sent_metrics_count_each_connection_a_broadcast_or_relay_reaches(
        hub: ReplicationHub, source: MemorySource) -> None:
    """A burst is queued once to every reader following its stream and counted once
    for all of them: as many commands as lines times readers, none for the peer
    that does not follow, and a relayed command counts once per other peer."""
    readers = [_connect(hub) for _ in range(3)]
    idle = _connect(hub)
    for n, peer in enumerate(readers):
        peer.send(f"NAME r{n}\nREPLICATE\n")
        peer.lines_until(lambda line: line.startswith("POSITION events"))
    idle.send("NAME idle\n")
    wait_until(lambda: len(hub.connections) == 4 and sum(c.live_all for c in hub.connections) == 3)
    before = dict(hub.metrics.commands_out)
    for token in (2, 3, 4):
        source.append("caches", "main", token, [["get_user_by_id", [f"@u{token}:x"], token]])
    hub.writer_advanced("caches", "main", 4)
    for peer in readers:
        assert [peer.skip_pings() for _ in range(3)] == [
            f'RDATA caches main {t} ["get_user_by_id",["@u{t}:x"],{t}]' for t in (2, 3, 4)]
    assert hub.metrics.commands_out["RDATA"] - before.get("RDATA", 0) == 3 * 3
    readers[0].send("REMOTE_SERVER_UP other.example\n")
    for peer in (*readers[1:], idle):
        assert peer.skip_pings() == "REMOTE_SERVER_UP other.example"
    assert hub.metrics.commands_out["REMOTE_SERVER_UP"] - before.get("REMOTE_SERVER_UP", 0) == 3


def test_metrics_served_over_http(source: MemorySource) -> None:
    h = ReplicationHub("hub.example", source, port=0, settings=FAST, metrics_listen=("127.0.0.1", 0))
    h.start()
    try:
        host, port = h._metrics_server.address[:2]
        peer = LineClient((host, port))
        peer.send(f"GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n")
        assert peer.closed_by_peer()
        body = peer._buf.decode()
        peer.close()
        assert body.startswith("HTTP/1.1 200") or body.startswith("HTTP/1.0 200")
        assert 'streamrep_replication_stream_position{instance="main",stream="caches"} 1.0' in body
    finally:
        h.stop()
    assert h.connections == []


def test_writer_rows_are_relayed_once_with_their_batches(hub: ReplicationHub, source: MemorySource) -> None:
    worker = _connect(hub)
    worker.send("NAME worker\nREPLICATE\n")
    worker.lines_until(lambda line: line.startswith("POSITION events"))
    writer = _connect(hub)
    writer.send("NAME w1\nPOSITION to_device w1 0 0\n")
    lines = [
        'RDATA to_device w1 batch ["@a:x","D1"]',
        'RDATA to_device w1 batch ["@b:x","D1"]',
        'RDATA to_device w1 4 ["@c:x","D1"]',
    ]
    writer.send("\n".join(lines) + "\n")
    assert [worker.skip_pings() for _ in range(3)] == lines
    # A replay of what was already published is not passed on.
    writer.send("\n".join(lines) + '\nRDATA to_device w1 5 ["@d:x","D2"]\n')
    assert worker.skip_pings() == 'RDATA to_device w1 5 ["@d:x","D2"]'
    assert hub.positions[("to_device", "w1")] == 5
    # The writer does not get its own rows back: only the greeting, pings, and the
    # positions the hub took for it, the last one at 5.
    heard = []
    deadline = time.monotonic() + 0.4
    while time.monotonic() < deadline:
        line = writer.line()
        assert line.startswith(("SERVER", "PING", "POSITION to_device w1 ")), line
        heard.append(line)
    assert [line for line in heard if line.startswith("POSITION")][-1] == "POSITION to_device w1 5 5"


def test_legacy_replicate_all_from_a_token(hub: ReplicationHub, source: MemorySource) -> None:
    source.append("caches", "main", 5, [["c", None, 5]])
    source.append("events", "main", 6, [["$e6", "!r", "m", None, None]])
    for stream, token in (("caches", 5), ("events", 6)):
        hub.writer_advanced(stream, "main", token)
    c = _connect(hub)
    c.send("REPLICATE ALL 2\n")
    assert [c.skip_pings() for _ in range(5)] == [
        'RDATA caches main 5 ["c",null,5]',
        "POSITION caches main 5 5",
        'RDATA events main 3 ["$e3","!r","m.room.message",null,null]',
        'RDATA events main 6 ["$e6","!r","m",null,null]',
        "POSITION events main 6 6",
    ]


def test_facts_nobody_announces_are_published_from_the_database(tmp_path: pathlib.Path) -> None:
    """A writer whose announcements never reach the hub (refused, crashed right after
    committing, or never connected at all) still has its committed facts published:
    the hub finds them in its database."""
    import orjson

    from streamrep.db import open_database
    from streamrep.replication import DatabaseSource
    from streamrep.streams import Streams

    url = f"sqlite:///{tmp_path}/deployment.db"
    hub_db, writer_db = open_database(url), open_database(url)
    hub_streams = Streams(hub_db, "main")
    writer = Streams(writer_db, "writer1", {"caches": ["writer1"]})
    writer.add_cache_invalidation("get_user_by_id", ["@early:x"])  # before the hub starts
    hub = ReplicationHub("hub.example", DatabaseSource(hub_streams), port=0,
                         settings=ConnectionSettings(database_poll_interval=0.1))
    hub.start()
    worker = _connect(hub)
    try:
        worker.send("NAME worker\nREPLICATE\n")
        assert "POSITION caches writer1 1 1" in worker.lines_until(lambda l: l == "POSITION caches writer1 1 1")
        tokens = [writer.add_cache_invalidation("get_user_by_id", [f"@u{n}:x"]) for n in range(3)]
        got = [worker.lines_until(lambda l: l.startswith("RDATA"))[-1] for _ in tokens]
        assert [line.split(" ", 4)[3] for line in got] == [str(t) for t in tokens]
        assert [orjson.loads(line.split(" ", 4)[4])[1] for line in got] == [[f"@u{n}:x"] for n in range(3)]
        # A writer the hub never heard of is found too.
        newcomer = Streams(writer_db, "writer2", {"account_data": ["writer2"]})
        token = newcomer.add_account_data("@a:x", "m.t", {"n": 1})
        line = worker.lines_until(lambda l: l.startswith("RDATA"))[-1]
        assert line.startswith(f"RDATA account_data writer2 {token} "), line
    finally:
        worker.close()
        hub.stop()
        hub_streams.close()
        writer.close()
        hub_db.close()
        writer_db.close()


def test_rows_from_the_database_keep_the_instance_that_wrote_them(tmp_path: pathlib.Path) -> None:
    """A hub that does not know who writes ``events`` (no deployment file, so it takes
    its own instance as every stream's writer) still names each row by the instance
    that wrote it: the event rows do not say, the writer recorded it. Nothing is
    relabelled as the hub's ``main``."""
    from streamrep.db import open_database
    from streamrep.demo.streams import demo_stream_set, demo_streams, stream_names
    from streamrep.events import EventStore
    from streamrep.matrix.room_builder import RoomBuilder
    from streamrep.replication import DatabaseSource
    from streamrep.streams import Streams

    url = f"sqlite:///{tmp_path}/deployment.db"
    writer_db, hub_db = open_database(url), open_database(url)
    writer = demo_streams(writer_db, "writer1", {s: ["writer1"] for s in stream_names()})
    store = EventStore(writer_db, streams=writer)
    room = RoomBuilder("!r:x.org", "@ann:x.org", "10", event_id=lambda n: f"$e{n}")
    events = [room.create, room.event("m.room.member", "@ann:x.org", {"membership": "join"},
                                      state_key="@ann:x.org")]
    assert store.persist_events(events).rejected == {}
    written = writer.current_token("events", "writer1")
    hub_streams = Streams(hub_db, "main", definitions=demo_stream_set())
    hub = ReplicationHub("hub.example", DatabaseSource(hub_streams), port=0)
    hub.start()
    worker = _connect(hub)
    try:
        assert ("events", "main") not in hub.positions
        assert hub.positions[("events", "writer1")] == written
        worker.send("NAME worker\nREPLICATE events 0\n")
        lines = worker.lines_until(lambda l: l.startswith("POSITION events"))
        rdata = [line for line in lines if line.startswith("RDATA")]
        assert rdata and all(line.split(" ")[2] == "writer1" for line in rdata), rdata
        assert {line.split(" ")[3] for line in rdata if line.split(" ")[3] != "batch"} == {
            str(t) for t in range(1, written + 1)}
    finally:
        worker.close()
        hub.stop()
        hub_streams.close()
        store.close()
        writer.close()
        hub_db.close()
        writer_db.close()
