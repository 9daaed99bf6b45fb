"""The sans-IO replication protocol: commands and times in, actions out. No sockets."""

from __future__ import annotations

from typing import Any

from streamrep.replication import commands as C
from streamrep.replication.protocol import (
    BusSession,
    CatchUp,
    ClientSession,
    Close,
    ConnectionSettings,
    Fact,
    FillGap,
    FollowerState,
    GapUnfilled,
    HubState,
    Publish,
    Received,
    Relay,
    Send,
)

SETTINGS = ConnectionSettings(ping_interval=1.0, ping_timeout=3.0, max_queued_commands=100)


def lines(text: str) -> list[Any]:
    return C.new_decoder(100_000).feed(text.encode())


def sent(actions: list[Any]) -> bytes:
    return b"".join(a.data for a in actions if type(a) in (Send, Publish, Relay))


def test_client_greeting_and_facts_once_in_order() -> None:
    follower = FollowerState(can_fill=True)
    session = ClientSession(SETTINGS, client_name="w1", server_name="hs", follower=follower, now=0.0)
    greeting = session.greeting([("caches", "w1", 4)])
    assert sent(greeting) == b"NAME w1\nPING 0\nPOSITION caches w1 4 4\nREPLICATE\n".replace(
        b"PING 0", sent(greeting).split(b"\n")[1])
    out = session.receive(lines(
        "SERVER hs\nPOSITION events m 5 5\n"
        'RDATA events m batch ["a"]\nRDATA events m 6 ["b"]\nRDATA events m 6 ["b"]\n'
        "POSITION events m 9 10\nRDATA events m 11 [\"c\"]\n"), now=1.0)
    assert out == [
        Fact("events", "m", 6, [["a"], ["b"]], 5),
        FillGap("events", "m", 6, 10),
        Fact("events", "m", 11, [["c"]], 10),
    ]
    assert follower.positions[("events", "m")] == 11
    # A handler that failed on the first two: rewinding puts the position back.
    follower.rewind_unfinished(out)
    assert follower.positions[("events", "m")] == 5


def test_client_refuses_a_wrong_server_and_server_only_commands_from_it() -> None:
    session = ClientSession(SETTINGS, client_name="w1", server_name="hs", now=0.0)
    assert session.receive(lines("SERVER other\n"), now=0.0) == [
        Close("wrong_server", "expected server hs, found other")]
    session = ClientSession(SETTINGS, client_name="w1", now=0.0)
    [close] = session.receive(lines("NAME x\n"), now=0.0)
    assert close == Close("protocol_error", "NAME is not accepted from a server")


def test_gap_without_database_is_reported_not_skipped() -> None:
    follower = FollowerState()
    out: list[Any] = []
    follower.position("events", "m", 2, 2, out)
    follower.position("events", "m", 4, 4, out)
    assert out == [GapUnfilled("events", "m", 2, 4)]
    assert follower.positions[("events", "m")] == 2
    follower.skip_gap(out[0])
    assert follower.positions[("events", "m")] == 4


def test_a_reader_without_database_takes_nothing_after_a_gap_in_the_same_read() -> None:
    """A fact of the writer after the gap would move its position past the
    missing facts, and resuming through the hub from there would never bring
    them: the session closes at the gap and its position stays before it."""
    follower = FollowerState(start_from={"to_device": 0, "caches": 0})
    session = ClientSession(SETTINGS, client_name="w3", follower=follower, resume_through_hub=True,
                            now=0.0)
    out = session.receive(lines(
        'SERVER hs\nRDATA caches w1 7 ["a"]\nRDATA to_device w2 1 ["x"]\n'
        "POSITION to_device w2 5 5\n"
        'RDATA to_device w2 batch ["y"]\nRDATA to_device w2 6 ["z"]\nRDATA caches w1 8 ["b"]\n'), now=1.0)
    assert out == [Fact("caches", "w1", 7, [["a"]], 0), Fact("to_device", "w2", 1, [["x"]], 0),
                   GapUnfilled("to_device", "w2", 1, 5), Close("gap_unfilled", None)]
    assert session.closed
    assert follower.positions == {("caches", "w1"): 7, ("to_device", "w2"): 1}
    # The next connection resumes each stream from where its facts stopped.
    assert [(c.stream_name, c.token) for c in session.replicate_commands()] == [
        ("caches", 7), ("to_device", 1)]


def test_keepalive_is_data() -> None:
    session = ClientSession(SETTINGS, client_name="w1", now=0.0)
    assert session.tick(0.5, idle=True) == []
    [ping] = session.tick(1.0, idle=True)
    assert type(ping) is Send and ping.name == "PING"
    assert session.tick(1.5, idle=True) == []
    session.receive(lines("PING 1\n"), now=2.0)
    assert session.tick(5.5, idle=False) == [Close("timeout", "no command received for 3 seconds")]


def test_a_peer_that_takes_nothing_of_what_waits_is_cut_off_as_too_slow() -> None:
    """Pinging or not, a peer whose socket takes nothing for ping_timeout seconds
    while lines wait for it is closed: a stalled reader under its queue's bounds
    holds nothing for longer than that."""
    session = ClientSession(SETTINGS, client_name="w1", now=0.0)
    session.data_sent(1.0)  # part of a burst went out, the rest waits
    assert session.tick(3.9, idle=False) == []
    session.data_sent(3.9)  # the peer read a little: progress
    assert session.tick(6.5, idle=False) == []
    assert session.tick(7.0, idle=False) == [
        Close("slow_consumer", "too far behind: nothing could be written for 3 seconds")]
    assert session.closed and session.tick(9.0, idle=True) == []


def _hub(**kwargs: Any) -> HubState:
    return HubState("hs", SETTINGS, readable=["caches"], **kwargs)


def test_hub_relays_a_writers_fact_once_and_answers_replicate() -> None:
    hub = _hub(stream_writers={"caches": ["w1"]}, stored_token=lambda s, i: 10)
    hub.load_positions([("caches", "w1", 3)])
    worker = hub.new_peer("worker", now=0.0)
    writer = hub.new_peer("writer", now=0.0)
    assert sent(worker.receive(lines("NAME worker\nREPLICATE\n"), now=0.0)) == b"POSITION caches w1 3 3\n"
    out = writer.receive(lines('NAME w1\nRDATA caches w1 batch ["a"]\nRDATA caches w1 4 ["b"]\n'
                               'RDATA caches w1 4 ["b"]\n'), now=0.0)
    # Relayed once; the writer hears the position the hub took (its confirmation).
    assert out == [Publish("caches", b'RDATA caches w1 batch ["a"]\nRDATA caches w1 4 ["b"]\n', 2, "RDATA"),
                   Send(b"POSITION caches w1 4 4\n", 1, "POSITION")]
    assert worker.wants("caches") and hub.positions[("caches", "w1")] == 4


def test_hub_refuses_who_may_not_say_what() -> None:
    hub = _hub(stream_writers={"caches": ["w1"]}, stored_token=lambda s, i: 10)
    cases = {
        'RDATA caches w1 1 ["x"]\n': "send NAME before writing caches",
        'NAME evil\nRDATA caches w1 101 ["x"]\n': "evil cannot write as w1",
        'NAME main\n': "NAME main is this hub's own instance",
        'NAME evil\nPOSITION caches evil 0 1\n': "evil is not a configured writer of caches",
        'NAME w1\nRDATA caches w1 11 ["x"]\n': "caches/w1 token 11 is past what the database holds (10)",
    }
    for text, why in cases.items():
        peer = hub.new_peer("p", now=0.0)
        assert peer.receive(lines(text), now=0.0)[-1] == Close("refused", why), text
        hub.peer_lost(peer)
    # A position past what the database holds is refused; the hub does not move.
    poisoner = hub.new_peer("p", now=0.0)
    assert poisoner.receive(lines("NAME w1\nPOSITION caches w1 105 9000000000000000000\n"), now=0.0) == [
        Close("refused", "caches/w1 position 9000000000000000000 is past what the database holds (10)")]
    hub.peer_lost(poisoner)
    assert ("caches", "w1") not in hub.positions
    first = hub.new_peer("a", now=0.0)
    assert sent(first.receive(lines("NAME w1\nPOSITION caches w1 0 0\n"), now=0.0)) == b"POSITION caches w1 0 0\n"
    second = hub.new_peer("b", now=0.0)
    assert second.receive(lines("NAME w1\nPOSITION caches w1 0 0\n"), now=0.0) == [
        Close("refused", "writer w1 is already connected (a)")]
    first.closing("timeout")
    hub.peer_lost(first)
    third = hub.new_peer("c", now=0.0)
    assert third.receive(lines("NAME w1\nPOSITION caches w1 0 0\n"), now=0.0) == [
        Send(b"POSITION caches w1 0 0\n", 1, "POSITION")]


def test_hub_checks_a_writers_facts_of_one_read_together_and_keeps_the_good_ones() -> None:
    """Facts of one writer in one read cost one read of the stored token; when one
    of them is bad, those before it still go out and the peer is refused at it."""
    reads: list[int] = []

    def stored(stream: str, instance: str) -> int:
        reads.append(1)
        return 10

    def read(text: str) -> tuple[HubState, list[Any]]:
        hub = _hub(stream_writers={"caches": ["w1"]}, stored_token=stored,
                   row_check=lambda stream, cmds: next(
                       (f"bad row {c.row_json!r}" for c in cmds if c.row_json == b'["bad"]'), None))
        return hub, hub.new_peer("w", now=0.0).receive(lines("NAME w1\n" + text), now=0.0)

    facts = "".join(f'RDATA caches w1 batch ["a{t}"]\nRDATA caches w1 {t} ["b{t}"]\n' for t in (4, 5, 6))
    hub, out = read(facts)
    assert sent(out) == facts.encode() + b"POSITION caches w1 6 6\n" and len(reads) == 1
    assert hub.positions[("caches", "w1")] == 6
    hub, out = read('RDATA caches w1 4 ["a"]\nRDATA caches w1 5 ["bad"]\nRDATA caches w1 6 ["c"]\n')
    assert sent(out) == b'RDATA caches w1 4 ["a"]\n'
    assert Close("protocol_error", "RDATA caches w1: bad row b'[\"bad\"]'") in out
    assert hub.positions[("caches", "w1")] == 4
    hub, out = read('RDATA caches w1 9 ["a"]\nRDATA caches w1 10 ["b"]\nRDATA caches w1 11 ["c"]\n')
    assert sent(out) == b'RDATA caches w1 9 ["a"]\nRDATA caches w1 10 ["b"]\n'
    assert Close("refused", "caches/w1 token 11 is past what the database holds (10)") in out
    assert hub.positions[("caches", "w1")] == 10


def test_hub_bounds_batches_and_the_handshake() -> None:
    hub = _hub()
    peer = hub.new_peer("p", now=0.0)
    flood = "NAME w1\n" + 'RDATA caches w1 batch ["x"]\n' * 101
    assert peer.receive(lines(flood), now=0.0)[-1] == Close(
        "refused", "more than 100 batch rows without a token")
    silent = hub.new_peer("q", now=0.0)
    assert [type(action) for action in silent.tick(9.0, idle=True)] == [Send]  # a PING, no close
    assert silent.tick(10.5, idle=True) == [
        Close("handshake_timeout", "no NAME received within 10 seconds")]


def test_hub_catch_up_and_gap_fill_are_actions() -> None:
    hub = _hub()
    hub.load_positions([("caches", "w1", 3)])
    peer = hub.new_peer("p", now=0.0)
    out = peer.receive(lines("NAME p\nREPLICATE caches 1\n"), now=0.0)
    assert out == [CatchUp("caches", 1)] and not peer.wants("caches")
    peer.catch_up_done("caches")
    assert peer.wants("caches")
    writer = hub.new_peer("w", now=0.0)
    assert writer.receive(lines("NAME w1\nPOSITION caches w1 7 8\n"), now=0.0) == [
        FillGap("caches", "w1", 3, 7, then_token=8), Send(b"POSITION caches w1 8 8\n", 1, "POSITION")]


def test_bus_answers_replicate_ignores_echoes_and_follows_others() -> None:
    follower = FollowerState(can_fill=True)
    bus = BusSession(SETTINGS, instances=["w1"], follower=follower, now=0.0)
    assert sent(bus.announce([("caches", "w1", 5)])) == b"REPLICATE\nPOSITION caches w1 5 5\n"
    assert sent(bus.rows("caches", "w1", [(6, b'["a"]')])) == b'RDATA caches w1 6 ["a"]\n'
    out = bus.receive(lines('REPLICATE\nRDATA caches w1 6 ["a"]\nPOSITION caches w2 0 0\n'
                            'RDATA caches w2 1 ["b"]\nUSER_IP @u:x ["t","ip","ua",null,1]\n'), now=0.0)
    assert out[0] == Send(b"POSITION caches w1 6 6\n", 1, "POSITION")
    assert out[1] == Fact("caches", "w2", 1, [["b"]], 0)
    assert type(out[2]) is Received and out[2].command.NAME == "USER_IP"
    assert len(out) == 3


def test_a_gap_and_the_rows_after_it_in_one_read_are_published_in_order() -> None:
    """A reconnecting writer says where it is and goes on in the same read: the
    filled rows go out before its live ones, and none twice."""
    hub = _hub(stored_token=lambda s, i: 10)
    writer = hub.new_peer("w", now=0.0)
    out = writer.receive(lines('NAME w1\nPOSITION caches w1 3 3\nRDATA caches w1 3 ["c"]\n'
                               'RDATA caches w1 4 ["d"]\n'), now=0.0)
    gap = FillGap("caches", "w1", 0, 3, then_token=3)
    assert out == [gap, Publish("caches", b'RDATA caches w1 4 ["d"]\n', 1, "RDATA"),
                   Send(b"POSITION caches w1 4 4\n", 1, "POSITION")]
    # What the transport reads from the database for the gap is published as it is.
    stored = [(1, b'["a"]'), (2, b'["b"]'), (3, b'["c"]')]
    assert sent(hub.fill_rows(gap, 0, stored)) == (
        b'RDATA caches w1 1 ["a"]\nRDATA caches w1 2 ["b"]\nRDATA caches w1 3 ["c"]\n')
    assert hub.fill_done(gap, 3) == []
    assert hub.positions[("caches", "w1")] == 4


def _failed_read(session: Any, text: str) -> list[Any]:
    """What *session* makes of a read with lines the decoder refuses."""
    try:
        commands = C.new_decoder(100_000).feed(text.encode())
    except C.ProtocolError as exc:
        return list(session.receive_failed(exc, now=1.0))
    raise AssertionError(f"every line of {text!r} decoded: {commands}")


def test_a_reader_hands_on_commands_it_does_not_know_and_goes_on() -> None:
    """A newer writer's commands and streams reach the application as they came; only
    a line that is not a command at all closes a hub connection."""
    read = ('POSITION caches m 0 0\nRDATA new_stream m 1 ["x"]\nNEW_THING a b\n'
            'RDATA caches m 2 ["f",null,1]\n')
    for session in (ClientSession(SETTINGS, client_name="t", follower=FollowerState(), now=0.0),
                    BusSession(SETTINGS, follower=FollowerState(), now=0.0)):
        session.receive(lines("POSITION new_stream m 0 0\n"), now=0.0)
        out = _failed_read(session, read)
        assert out[:2] == [Fact("new_stream", "m", 1, [["x"]], 0), Fact("caches", "m", 2, [["f", None, 1]], 0)]
        [passed] = out[2:]
        assert type(passed) is Received and type(passed.command) is C.UnknownCommand
        assert (passed.command.NAME, passed.command.line) == ("NEW_THING", b"NEW_THING a b")
        assert not session.closed
    client = ClientSession(SETTINGS, client_name="t", follower=FollowerState(), now=0.0)
    out = _failed_read(client, 'NEW_THING a\nPOSITION caches m x y\n')
    assert type(out[0]) is Received and out[1] == Close("protocol_error", out[1].error) and client.closed
    bus = BusSession(SETTINGS, follower=FollowerState(), now=0.0)
    assert _failed_read(bus, "POSITION caches m x y\n") == [] and not bus.closed


def test_positions_are_handed_on_after_the_follower_took_them_when_asked() -> None:
    read = "POSITION caches m 0 3\nPOSITION events m 0 5\nPOSITION caches t 1 1\n"
    for hand_on in (False, True):
        client = ClientSession(SETTINGS, client_name="t", follower=FollowerState(streams=["caches"]),
                               hand_on_positions=hand_on, now=0.0)
        bus = BusSession(SETTINGS, instances=["t"], follower=FollowerState(streams=["caches"]),
                         hand_on_positions=hand_on, now=0.0)
        for session in (client, bus):
            out = session.receive(lines(read), now=0.0)
            passed = [a.command for a in out if type(a) is Received]
            # Only followed streams, and never this process's own writer.
            assert [(c.stream_name, c.instance_name, c.new_token) for c in passed] == (
                [("caches", "m", 3)] if hand_on else [])
            assert session.follower is not None and session.follower.positions[("caches", "m")] == 3
