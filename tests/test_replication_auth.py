"""The authentication gates, sans-IO: the hub's and a peer's, driven by hand."""

from __future__ import annotations

from typing import Any

import pytest

from streamrep.replication import commands as C
from streamrep.replication.auth import AUTH_FAILED, HubGate, PeerGate
from streamrep.replication.protocol import Close, Send
from streamrep.wire import parse_line

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER = b"fedcba9876543210fedcba9876543210"
GREETING = [Send(C.encode_one(C.server("hub.example")), 1, "SERVER"),
            Send(C.encode_one(C.ping()), 1, "PING")]


def lines(actions: list[Any]) -> list[Any]:
    """The commands in Send actions, parsed back as a peer would read them."""
    out = []
    for action in actions:
        assert isinstance(action, Send), action
        out += [parse_line(line) for line in action.data.splitlines()]
    return out


def names(commands: list[Any]) -> list[str]:
    return [c.NAME for c in commands]


def test_hub_and_peer_with_the_secret_get_through() -> None:
    hub = HubGate("hub.example", SECRET)
    peer = PeerGate("writer1", SECRET, "hub.example",
                    greeting=lambda: [Send(C.encode_one(C.name("writer1")), 1, "NAME")])
    greeting = lines(hub.greeting(GREETING))
    assert names(greeting) == ["SERVER", "AUTH_CHALLENGE", "PING"]
    actions, passed = peer.receive(greeting)
    assert names(passed) == ["SERVER", "PING"] and not peer.ready
    response = lines(actions)
    assert names(response) == ["AUTH_RESPONSE"] and response[0].instance_name == "writer1"

    hub_actions, hub_passed = hub.receive([parse_line("PING 1"), *response])
    assert names(hub_passed) == ["PING"]
    ok = lines(hub_actions)
    assert names(ok) == ["AUTH_OK"]

    actions, passed = peer.receive(ok + [parse_line("PING 2")])
    # The hub proved the secret: the greeting goes out now, and nothing is gated any more.
    assert names(lines(actions)) == ["NAME"] and peer.ready and peer.passthrough
    assert names(passed) == ["PING"]

    # Now the peer's greeting: NAME goes through, and everything after it.
    rest = [parse_line("NAME writer1"), parse_line("PING 3"), parse_line("REPLICATE")]
    actions, passed = hub.receive(rest)
    assert actions == [] and passed == rest
    assert hub.passthrough and hub.instance == "writer1"


def test_a_peer_with_the_wrong_secret_is_refused() -> None:
    hub = HubGate("hub.example", SECRET)
    peer = PeerGate("writer1", OTHER, "hub.example")
    actions, _ = peer.receive(lines(hub.greeting(GREETING)))
    refused, passed = hub.receive(lines(actions))
    assert passed == []
    assert refused == [Close(AUTH_FAILED,
                             "authentication failed: wrong shared secret (or another server name)")]


def test_a_hub_without_our_secret_learns_nothing_more() -> None:
    impostor = HubGate("hub.example", OTHER)
    peer = PeerGate("writer1", SECRET, "hub.example")
    actions, _ = peer.receive(lines(impostor.greeting(GREETING)))
    # The impostor cannot verify the response; even if it answered AUTH_OK with a
    # proof of its own secret, the peer refuses before sending NAME.
    from streamrep.replication.handshake import proof

    response = lines(actions)[0]
    forged = C.auth_ok(proof(OTHER, b"hub", "hub.example", "writer1",
                             impostor.handshake.challenge, response.nonce))  # type: ignore[union-attr]
    closed, passed = peer.receive([forged])
    assert not peer.ready and passed == []
    assert len(closed) == 1 and isinstance(closed[0], Close) and closed[0].reason == AUTH_FAILED
    assert "does not hold our shared secret" in str(closed[0].error)


def test_nothing_but_ping_before_authentication() -> None:
    for line in ["NAME writer1", "REPLICATE", "POSITION caches writer1 1 2",
                 'RDATA caches writer1 5 ["x",["@a:b"],1]', "USER_SYNC w @u:x None start 1"]:
        hub = HubGate("hub.example", SECRET)
        actions, passed = hub.receive([parse_line("PING 1"), parse_line(line)])
        assert passed == []
        assert len(actions) == 1 and isinstance(actions[0], Close)
        assert actions[0].reason == AUTH_FAILED
        assert "before authentication" in str(actions[0].error)
        assert "set shared_secret_file" in str(actions[0].error)


def test_name_must_be_the_authenticated_instance() -> None:
    hub = HubGate("hub.example", SECRET)
    peer = PeerGate("writer1", SECRET, "hub.example")
    actions, _ = peer.receive(lines(hub.greeting(GREETING)))
    ok, _ = hub.receive(lines(actions))
    assert names(lines(ok)) == ["AUTH_OK"]
    refused, passed = hub.receive([parse_line("NAME writer2")])
    assert passed == [] and refused == [
        Close(AUTH_FAILED, "NAME writer2 differs from the instance authenticated (writer1)")]


def test_a_second_response_is_refused() -> None:
    hub = HubGate("hub.example", SECRET)
    peer = PeerGate("writer1", SECRET, "hub.example")
    actions, _ = peer.receive(lines(hub.greeting(GREETING)))
    response = lines(actions)
    hub.receive(response)
    refused, _ = hub.receive(response)
    assert refused == [Close(AUTH_FAILED, "AUTH_RESPONSE out of turn")]


def test_client_certificate_names_the_instance() -> None:
    hub = HubGate("hub.example", certificate_names={"writer1"})
    assert lines(hub.greeting(GREETING)) == lines(GREETING)  # no challenge without a secret
    refused, passed = hub.receive([parse_line("PING 1"), parse_line("NAME writer2")])
    assert passed == [] and refused == [
        Close(AUTH_FAILED, "NAME writer2 is not a name of the client certificate (writer1)")]
    hub = HubGate("hub.example", certificate_names={"writer1"})
    actions, passed = hub.receive([parse_line("PING 1"), parse_line("NAME writer1")])
    assert actions == [] and names(passed) == ["PING", "NAME"] and hub.passthrough


def test_certificate_and_secret_together() -> None:
    hub = HubGate("hub.example", SECRET, certificate_names={"writer1"})
    peer = PeerGate("writer2", SECRET, "hub.example")  # knows the secret, wrong certificate
    actions, _ = peer.receive(lines(hub.greeting(GREETING)))
    ok, _ = hub.receive(lines(actions))
    assert names(lines(ok)) == ["AUTH_OK"]
    refused, _ = hub.receive([parse_line("NAME writer2")])
    assert refused[0].error == "NAME writer2 is not a name of the client certificate (writer1)"  # type: ignore[union-attr]


def test_peer_without_a_secret_meets_a_hub_that_asks() -> None:
    hub = HubGate("hub.example", SECRET)
    peer = PeerGate("writer1")
    assert peer.ready
    actions, passed = peer.receive(lines(hub.greeting(GREETING)))
    assert names(passed) == ["SERVER"]
    assert actions == [Close(AUTH_FAILED, "the hub asks for the shared secret and this process "
                                          "has none; set shared_secret_file")]


def test_peer_with_a_secret_meets_a_hub_that_does_not_ask() -> None:
    peer = PeerGate("writer1", SECRET, "hub.example")
    actions, passed = peer.receive(lines(GREETING))
    assert not peer.ready and names(passed) == ["SERVER"]
    assert len(actions) == 1 and isinstance(actions[0], Close)
    assert "did not ask for the shared secret" in str(actions[0].error)


def test_peer_without_a_secret_and_a_hub_without_one_pass_straight_through() -> None:
    peer = PeerGate("worker1")
    rest = [parse_line("POSITION caches main 1 1")]
    actions, passed = peer.receive(lines(GREETING) + rest)
    assert actions == [] and names(passed) == ["SERVER", "PING", "POSITION"]
    assert peer.passthrough


def test_wrong_server_leaves_the_session_to_close() -> None:
    hub = HubGate("other.example", SECRET)
    peer = PeerGate("writer1", SECRET, "hub.example")
    greeting = [Send(C.encode_one(C.server("other.example")), 1, "SERVER"),
                Send(C.encode_one(C.ping()), 1, "PING")]
    actions, passed = peer.receive(lines(hub.greeting(greeting)))
    # No proof is sent to a server with another name; the session sees SERVER and closes.
    assert actions == [] and names(passed) == ["SERVER"] and not peer.ready


@pytest.mark.parametrize("line", ["AUTH_OK " + "0" * 64, "RDATA caches main 1 [1]"])
def test_peer_refuses_steps_out_of_order(line: str) -> None:
    peer = PeerGate("writer1", SECRET, "hub.example")
    actions, _ = peer.receive([parse_line("SERVER hub.example"), parse_line(line)])
    assert len(actions) == 1 and isinstance(actions[0], Close) and actions[0].reason == AUTH_FAILED
