"""TLS, mutual TLS and the shared secret between a real hub and real clients on
127.0.0.1: peers with the right credentials replicate, every other is refused."""

from __future__ import annotations

from typing import Any, Iterator

import gevent
import orjson
import pytest

pytest.importorskip("cryptography")

from streamrep.demo.certificates import DeploymentCertificates, make_deployment_certificates  # noqa: E402
from streamrep.replication import ConnectionSettings, MemorySource, ReplicationHub  # noqa: E402
from streamrep.replication.transport.tcp_client import TcpLink  # noqa: E402
from streamrep.replication.handshake import proof  # noqa: E402
from streamrep.replication.security import HubSecurity, PeerSecurity  # noqa: E402
from streamrep.replication.tls import hub_context, peer_context  # noqa: E402
from support.replication import LineClient, tcp_link, wait_until  # noqa: E402

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER = b"fedcba9876543210fedcba9876543210"
FAST = ConnectionSettings(ping_interval=0.2, ping_timeout=1.0, handshake_timeout=2.0)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DeploymentCertificates:
    return make_deployment_certificates(str(tmp_path_factory.mktemp("pki")),
                                        ["writer1", "worker1", "intruder"])


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> DeploymentCertificates:
    return make_deployment_certificates(str(tmp_path_factory.mktemp("other")), ["writer1"],
                                        ca_name="someone else's CA")


def _source() -> MemorySource:
    src = MemorySource(["caches"])
    src.append("caches", "main", 1, [["get_user_by_id", ["@a:x"], 1]])
    return src


_hubs: list[ReplicationHub] = []
_clients: list[TcpLink] = []


@pytest.fixture(autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().stop()
    while _hubs:
        hub = _hubs.pop()
        hub.stop()
        assert hub.connections == []


def start_hub(security: HubSecurity, source: MemorySource | None = None) -> ReplicationHub:
    hub = ReplicationHub("hub.example", source or _source(), port=0, settings=FAST,
                         security=security)
    hub.start()
    _hubs.append(hub)
    return hub


def follow(hub: ReplicationHub, name: str, security: PeerSecurity) -> tuple[TcpLink, list[Any]]:
    seen: list[Any] = []
    client = tcp_link(hub.address[1], name, server_name="hub.example",
        handler=lambda s, i, t, rows: seen.append((s, i, t)), settings=FAST,
        start_from={"caches": 0}, security=security)
    client.start()
    _clients.append(client)
    return client, seen


def assert_replicates(hub: ReplicationHub, source: MemorySource, seen: list[Any]) -> None:
    wait_until(lambda: ("caches", "main", 1) in seen)
    source.append("caches", "main", 2, [["get_user_by_id", ["@b:x"], 2]])
    hub.writer_advanced("caches", "main", 2)
    wait_until(lambda: ("caches", "main", 2) in seen)


def assert_refused(client: TcpLink, seen: list[Any]) -> None:
    """The hub refuses *client* at every try: nothing reaches it and it does not stay
    connected. (A client refused after its greeting, as a mutual-TLS client with a
    name its certificate lacks is, counts as connected for the instant between the
    two, and it tries again and again.)"""
    gevent.sleep(0.8)
    wait_until(lambda: not client.connected)
    assert seen == []


def disconnects(hub: ReplicationHub, reason: str) -> float:
    value = hub.metrics.registry.get_sample_value(
        "streamrep_replication_disconnects_total", {"reason": reason})
    return value or 0.0


# --- the shared secret -------------------------------------------------------------------


def test_shared_secret_peers_replicate(certs: DeploymentCertificates) -> None:
    source = _source()
    hub = start_hub(HubSecurity(secret=SECRET), source)
    client, seen = follow(hub, "worker1", PeerSecurity(secret=SECRET))
    assert client.wait_connected(5)
    assert_replicates(hub, source, seen)


def test_a_peer_with_the_wrong_secret_is_refused() -> None:
    hub = start_hub(HubSecurity(secret=SECRET))
    client, seen = follow(hub, "worker1", PeerSecurity(secret=OTHER))
    wait_until(lambda: disconnects(hub, "auth_failed") >= 1)
    assert_refused(client, seen)


def test_a_peer_without_the_secret_is_refused() -> None:
    hub = start_hub(HubSecurity(secret=SECRET))
    client, seen = follow(hub, "worker1", PeerSecurity())
    assert_refused(client, seen)


def test_a_peer_with_a_secret_does_not_trust_a_hub_without_it() -> None:
    hub = start_hub(HubSecurity())
    client, seen = follow(hub, "worker1", PeerSecurity(secret=SECRET))
    assert_refused(client, seen)


def test_netcat_cannot_get_past_the_challenge() -> None:
    source = _source()
    hub = start_hub(HubSecurity(secret=SECRET), source)
    peer = LineClient(hub.address)
    try:
        assert peer.line() == "SERVER hub.example"
        challenge = peer.line()
        assert challenge.startswith("AUTH_CHALLENGE ") and len(challenge.split()[1]) == 64
        peer.send("NAME writer1\nREPLICATE\n")
        rest = peer.lines_until(lambda line: line.startswith("ERROR"))
        assert rest[-1] == ("ERROR NAME before authentication: this hub requires the shared "
                            "secret (AUTH_RESPONSE to its AUTH_CHALLENGE); set shared_secret_file")
        assert not any(line.startswith(("POSITION", "RDATA")) for line in rest)
        assert peer.closed_by_peer()
    finally:
        peer.close()


def test_a_guessed_proof_is_refused_and_a_right_one_accepted() -> None:
    source = _source()
    hub = start_hub(HubSecurity(secret=SECRET), source)
    peer = LineClient(hub.address)
    try:
        peer.line()
        nonce = peer.line().split()[1]
        peer.send(f"AUTH_RESPONSE writer1 {'ab' * 32} {'00' * 32}\n")
        assert peer.lines_until(lambda line: line.startswith("ERROR"))[-1] == (
            "ERROR authentication failed: wrong shared secret (or another server name)")
        assert peer.closed_by_peer()
    finally:
        peer.close()
    # What a real peer computes gets AUTH_OK with the hub's own proof, then NAME.
    peer = LineClient(hub.address)
    try:
        peer.line()
        nonce = peer.line().split()[1]
        mine = "cd" * 32
        peer.send(f"AUTH_RESPONSE worker9 {mine} "
                  f"{proof(SECRET, b'peer', 'hub.example', 'worker9', nonce, mine)}\n")
        ok = peer.lines_until(lambda line: line.startswith("AUTH_OK"))[-1]
        assert ok == "AUTH_OK " + proof(SECRET, b"hub", "hub.example", "worker9", nonce, mine)
        peer.send("NAME worker9\nREPLICATE\n")
        assert peer.skip_pings() == "POSITION caches main 1 1"
    finally:
        peer.close()


def test_the_authenticated_name_cannot_be_swapped() -> None:
    hub = start_hub(HubSecurity(secret=SECRET))
    peer = LineClient(hub.address)
    try:
        peer.line()
        nonce = peer.line().split()[1]
        mine = "ef" * 32
        peer.send(f"AUTH_RESPONSE worker9 {mine} "
                  f"{proof(SECRET, b'peer', 'hub.example', 'worker9', nonce, mine)}\n")
        peer.lines_until(lambda line: line.startswith("AUTH_OK"))
        peer.send("NAME writer1\n")
        assert peer.lines_until(lambda line: line.startswith("ERROR"))[-1] == (
            "ERROR NAME writer1 differs from the instance authenticated (worker9)")
    finally:
        peer.close()


def test_a_silent_peer_is_closed_at_the_handshake_deadline() -> None:
    hub = start_hub(HubSecurity(secret=SECRET))
    peer = LineClient(hub.address)
    try:
        assert peer.closed_by_peer(timeout=FAST.handshake_timeout + 3)
    finally:
        peer.close()


# --- TLS ----------------------------------------------------------------------------------


def test_tls_peers_replicate(certs: DeploymentCertificates) -> None:
    source = _source()
    hub = start_hub(HubSecurity(ssl_context=hub_context(certs.hub.cert, certs.hub.key)), source)
    client, seen = follow(hub, "worker1", PeerSecurity(ssl_context=peer_context(certs.ca)))
    assert client.wait_connected(5)
    assert_replicates(hub, source, seen)


def test_a_plain_peer_gets_nothing_from_a_tls_hub(certs: DeploymentCertificates) -> None:
    hub = start_hub(HubSecurity(ssl_context=hub_context(certs.hub.cert, certs.hub.key)))
    client, seen = follow(hub, "worker1", PeerSecurity())
    assert_refused(client, seen)
    assert hub.connections == []


def test_a_peer_refuses_a_hub_of_another_authority(certs: DeploymentCertificates,
                                                   stranger: DeploymentCertificates) -> None:
    hub = start_hub(HubSecurity(ssl_context=hub_context(stranger.hub.cert, stranger.hub.key)))
    client, seen = follow(hub, "worker1", PeerSecurity(ssl_context=peer_context(certs.ca)))
    assert_refused(client, seen)


def _mutual(certs: DeploymentCertificates, secret: bytes | None = None) -> HubSecurity:
    return HubSecurity(ssl_context=hub_context(certs.hub.cert, certs.hub.key, certs.ca, True),
                       require_client_cert=True, secret=secret)


def _client_tls(certs: DeploymentCertificates, name: str) -> PeerSecurity:
    files = certs.clients[name]
    return PeerSecurity(ssl_context=peer_context(certs.ca, files.cert, files.key))


def test_mutual_tls_peers_replicate(certs: DeploymentCertificates) -> None:
    source = _source()
    hub = start_hub(_mutual(certs), source)
    client, seen = follow(hub, "worker1", _client_tls(certs, "worker1"))
    assert client.wait_connected(5)
    assert_replicates(hub, source, seen)
    assert [c.name for c in hub.connections] == [f"worker1@{hub.connections[0].peer}"]


def test_mutual_tls_refuses_a_peer_without_a_certificate(certs: DeploymentCertificates) -> None:
    hub = start_hub(_mutual(certs))
    client, seen = follow(hub, "worker1", PeerSecurity(ssl_context=peer_context(certs.ca)))
    assert_refused(client, seen)


def test_mutual_tls_refuses_a_certificate_of_another_authority(
        certs: DeploymentCertificates, stranger: DeploymentCertificates) -> None:
    hub = start_hub(_mutual(certs))
    forged = stranger.clients["writer1"]
    client, seen = follow(hub, "writer1", PeerSecurity(
        ssl_context=peer_context(certs.ca, forged.cert, forged.key)))
    assert_refused(client, seen)


def test_mutual_tls_refuses_a_name_its_certificate_does_not_carry(
        certs: DeploymentCertificates) -> None:
    hub = start_hub(_mutual(certs))
    client, seen = follow(hub, "writer1", _client_tls(certs, "intruder"))
    wait_until(lambda: disconnects(hub, "auth_failed") >= 1)
    assert_refused(client, seen)


def test_mutual_tls_and_the_secret_together(certs: DeploymentCertificates) -> None:
    source = _source()
    hub = start_hub(_mutual(certs, SECRET), source)
    client, seen = follow(hub, "worker1", PeerSecurity(
        ssl_context=_client_tls(certs, "worker1").ssl_context, secret=SECRET))
    assert client.wait_connected(5)
    assert_replicates(hub, source, seen)
    wrong, wrong_seen = follow(hub, "worker1", PeerSecurity(
        ssl_context=_client_tls(certs, "worker1").ssl_context, secret=OTHER))
    assert_refused(wrong, wrong_seen)


def test_writer_over_tls_announces_to_readers(certs: DeploymentCertificates) -> None:
    """A writer and a reader, both with client certificates and the secret: the
    writer's facts reach the reader through the hub."""
    source = MemorySource(["caches"])
    hub = start_hub(_mutual(certs, SECRET), source)
    reader, seen = follow(hub, "worker1", PeerSecurity(
        ssl_context=_client_tls(certs, "worker1").ssl_context, secret=SECRET))
    writer = tcp_link(hub.address[1], "writer1", server_name="hub.example",
        settings=FAST, writer_positions=lambda: [("caches", "writer1", 0)],
        security=PeerSecurity(ssl_context=_client_tls(certs, "writer1").ssl_context,
                              secret=SECRET))
    writer.start()
    _clients.append(writer)
    assert writer.wait_connected(5) and reader.wait_connected(5)
    gevent.sleep(0.2)
    rows = [(t, b'["get_user_by_id",["@w%d:x"],%d]' % (t, t)) for t in range(1, 51)]
    for token, row in rows:  # committed before announced, as a writer does
        source.append("caches", "writer1", token, [orjson.loads(row)])
    assert writer.announce("caches", "writer1", rows)
    wait_until(lambda: len([s for s in seen if s[1] == "writer1"]) == 50)
    assert [t for _, i, t in seen if i == "writer1"] == list(range(1, 51))
