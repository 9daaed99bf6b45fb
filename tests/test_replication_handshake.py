"""The shared-secret handshake, sans-IO: both sides prove the secret, nothing else passes."""

from __future__ import annotations

import pytest

from streamrep.replication.handshake import (
    AuthenticationError,
    HubHandshake,
    PeerHandshake,
    proof,
)

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER = b"fedcba9876543210fedcba9876543210"


def run(hub_secret: bytes, peer_secret: bytes, *, hub_name: str = "hub.example",
        peer_expects: str = "hub.example") -> tuple[HubHandshake, PeerHandshake]:
    hub = HubHandshake(hub_secret, hub_name)
    peer = PeerHandshake(peer_secret, peer_expects, "writer1")
    instance, nonce, peer_proof = peer.respond(hub.challenge)
    hub_proof = hub.verify(instance, nonce, peer_proof)
    peer.verify_hub(hub_proof)
    return hub, peer


def test_both_sides_holding_the_secret_authenticate_each_other() -> None:
    hub, peer = run(SECRET, SECRET)
    assert hub.authenticated and hub.instance == "writer1"
    assert peer.verified


def test_the_secret_never_appears_in_what_is_sent() -> None:
    hub = HubHandshake(SECRET, "hub.example")
    peer = PeerHandshake(SECRET, "hub.example", "writer1")
    sent = " ".join([hub.challenge, *peer.respond(hub.challenge)])
    assert SECRET.decode() not in sent and SECRET.hex() not in sent


def test_a_peer_with_the_wrong_secret_is_refused() -> None:
    with pytest.raises(AuthenticationError, match="wrong shared secret"):
        run(SECRET, OTHER)


def test_a_hub_with_the_wrong_secret_is_refused_by_the_peer() -> None:
    hub = HubHandshake(OTHER, "hub.example")
    peer = PeerHandshake(SECRET, "hub.example", "writer1")
    instance, nonce, peer_proof = peer.respond(hub.challenge)
    with pytest.raises(AuthenticationError):
        hub.verify(instance, nonce, peer_proof)
    # The best such a hub can answer is a proof made with its own secret.
    forged = proof(OTHER, b"hub", "hub.example", instance, hub.challenge, nonce)
    with pytest.raises(AuthenticationError, match="does not hold our shared secret"):
        peer.verify_hub(forged)
    assert not peer.verified


def test_the_proof_binds_the_server_name_and_the_instance() -> None:
    with pytest.raises(AuthenticationError):
        run(SECRET, SECRET, hub_name="hub.example", peer_expects="other.example")
    hub = HubHandshake(SECRET, "hub.example")
    peer = PeerHandshake(SECRET, "hub.example", "writer1")
    _, nonce, peer_proof = peer.respond(hub.challenge)
    with pytest.raises(AuthenticationError):
        hub.verify("writer2", nonce, peer_proof)  # another instance than the one proved


def test_a_response_cannot_be_replayed_on_another_connection() -> None:
    first = HubHandshake(SECRET, "hub.example")
    peer = PeerHandshake(SECRET, "hub.example", "writer1")
    recorded = peer.respond(first.challenge)
    first.verify(*recorded)
    second = HubHandshake(SECRET, "hub.example")
    assert second.challenge != first.challenge
    with pytest.raises(AuthenticationError):
        second.verify(*recorded)


def test_the_hubs_proof_cannot_be_reflected_as_a_peers() -> None:
    # A man in the middle opens a connection to the hub and replays, as the peer's
    # proof, what the hub proved on another connection: the roles differ.
    hub = HubHandshake(SECRET, "hub.example")
    peer = PeerHandshake(SECRET, "hub.example", "writer1")
    instance, nonce, peer_proof = peer.respond(hub.challenge)
    hub_proof = hub.verify(instance, nonce, peer_proof)
    assert hub_proof != peer_proof
    with pytest.raises(AuthenticationError):
        peer.verify_hub(peer_proof)


def test_one_attempt_per_connection() -> None:
    hub = HubHandshake(SECRET, "hub.example")
    with pytest.raises(AuthenticationError):
        hub.verify("writer1", "00" * 32, "00" * 32)
    peer = PeerHandshake(SECRET, "hub.example", "writer1")
    # Even the right answer is refused after a failed one: no guessing in a loop.
    with pytest.raises(AuthenticationError, match="twice"):
        hub.verify(*peer.respond(hub.challenge))
    assert not hub.authenticated


@pytest.mark.parametrize("nonce, proof_hex", [
    ("xyz", "00" * 32),
    ("00" * 31, "00" * 32),
    ("AB" * 32, "00" * 32),
    ("00" * 32, "00" * 31),
    ("00" * 32, "zz" * 32),
])
def test_malformed_responses_are_refused_before_any_hmac(nonce: str, proof_hex: str) -> None:
    hub = HubHandshake(SECRET, "hub.example")
    with pytest.raises(AuthenticationError, match="hex digits"):
        hub.verify("writer1", nonce, proof_hex)


def test_steps_out_of_order_and_bad_arguments() -> None:
    peer = PeerHandshake(SECRET, "hub.example", "writer1")
    with pytest.raises(AuthenticationError, match="before AUTH_CHALLENGE"):
        peer.verify_hub("00" * 32)
    with pytest.raises(AuthenticationError, match="hex digits"):
        peer.respond("not-hex")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        HubHandshake(b"short", "hub.example")
    with pytest.raises(ValueError, match="not an instance name"):
        PeerHandshake(SECRET, "hub.example", "two words")


def test_nonces_are_fresh() -> None:
    challenges = {HubHandshake(SECRET, "h").challenge for _ in range(50)}
    assert len(challenges) == 50
    assert all(len(c) == 64 for c in challenges)
