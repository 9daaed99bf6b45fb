"""The shared-secret handshake: both ends prove they hold the deployment's secret.

For deployments without certificates, the hub and every peer share one secret
(``shared_secret_file`` in the configuration). It never crosses the wire: each
side proves knowledge of it with an HMAC-SHA256 over both sides' fresh nonces,
the hub's server name and the instance the peer claims to be, so a proof can be
neither replayed on another connection nor reflected back as the other side's::

    hub  -> peer   AUTH_CHALLENGE <hub_nonce>
    peer -> hub    AUTH_RESPONSE <instance> <peer_nonce> <peer_proof>
    hub  -> peer   AUTH_OK <hub_proof>

The hub accepts ``NAME`` only after a valid response, and only the instance the
response named. The peer checks the hub's proof before it sends anything else,
so a hub that does not hold the secret learns nothing but the peer's name.

This module is sans-IO: :class:`HubHandshake` and :class:`PeerHandshake` take
and return the commands' arguments as strings; the connection code sends and
receives them. Nonces come from :mod:`secrets`, proofs are compared in constant
time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from streamrep.errors import ProtocolError
from streamrep.shared_secret import MIN_SECRET_BYTES

__all__ = [
    "AuthenticationError",
    "HubHandshake",
    "PeerHandshake",
    "MIN_SECRET_BYTES",
    "NONCE_BYTES",
    "proof",
]

#: Bytes of randomness in each nonce (sent as twice as many hex digits).
NONCE_BYTES = 32

# Domain separation: a proof made for one role or protocol version is never valid
# for another, so a hub's proof cannot be reflected as a peer's.
_LABEL = b"streamrep replication auth v1"
_HUB_ROLE = b"hub"
_PEER_ROLE = b"peer"
_PROOF_HEX_DIGITS = hashlib.sha256().digest_size * 2


class AuthenticationError(ProtocolError):
    """A handshake failed: a wrong proof, a malformed argument or a step out of order.

    The message is safe to send to the peer in ``ERROR``: it names what failed,
    never the secret or the expected proof.
    """


def proof(secret: bytes, role: bytes, server_name: str, instance: str,
          hub_nonce: str, peer_nonce: str) -> str:
    """The hex HMAC-SHA256 of one side's proof (*role* ``b"hub"`` or ``b"peer"``)."""
    message = b"\n".join((
        _LABEL, role, server_name.encode("utf-8"), instance.encode("utf-8"),
        hub_nonce.encode("ascii"), peer_nonce.encode("ascii"),
    ))
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def _check_hex(value: str, digits: int, what: str) -> None:
    if len(value) != digits or not all(c in "0123456789abcdef" for c in value):
        raise AuthenticationError(f"{what} must be {digits} lowercase hex digits")


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the shared secret must be at least {MIN_SECRET_BYTES} bytes")


class HubHandshake:
    """The hub's side of one connection's handshake.

    Send ``AUTH_CHALLENGE`` with :attr:`challenge`; hand the fields of the peer's
    ``AUTH_RESPONSE`` to :meth:`verify`, which returns the proof to send
    in ``AUTH_OK`` or raises :class:`AuthenticationError`. After that,
    :attr:`instance` is the authenticated instance name.
    """

    __slots__ = ("_secret", "server_name", "challenge", "instance", "_done")

    def __init__(self, secret: bytes, server_name: str) -> None:
        _check_secret(secret)
        self._secret = secret
        self.server_name = server_name
        #: The nonce to send in ``AUTH_CHALLENGE``.
        self.challenge = _new_nonce()
        #: The instance the peer proved it may speak for (None until verified).
        self.instance: str | None = None
        self._done = False

    @property
    def authenticated(self) -> bool:
        return self.instance is not None

    def verify(self, instance: str, peer_nonce: str, peer_proof: str) -> str:
        """Check the peer's ``AUTH_RESPONSE <instance> <nonce> <proof>``; return the
        hub's proof for ``AUTH_OK``."""
        if self._done:
            raise AuthenticationError("AUTH_RESPONSE sent twice")
        self._done = True  # one attempt per connection: no guessing in a loop
        if not instance or " " in instance:
            raise AuthenticationError("AUTH_RESPONSE expects <instance> <nonce> <proof>")
        _check_hex(peer_nonce, NONCE_BYTES * 2, "the AUTH_RESPONSE nonce")
        _check_hex(peer_proof, _PROOF_HEX_DIGITS, "the AUTH_RESPONSE proof")
        expected = proof(self._secret, _PEER_ROLE, self.server_name, instance,
                         self.challenge, peer_nonce)
        if not hmac.compare_digest(expected, peer_proof):
            raise AuthenticationError(
                "authentication failed: wrong shared secret (or another server name)")
        self.instance = instance
        return proof(self._secret, _HUB_ROLE, self.server_name, instance,
                     self.challenge, peer_nonce)


class PeerHandshake:
    """A worker's or writer's side of the handshake.

    Answer ``AUTH_CHALLENGE <nonce>`` with :meth:`respond` (the arguments of
    ``AUTH_RESPONSE``); check ``AUTH_OK <proof>`` with :meth:`verify_hub`, which
    raises :class:`AuthenticationError` unless the hub holds the secret too.
    *server_name* is the name the peer expects in ``SERVER``.
    """

    __slots__ = ("_secret", "server_name", "instance", "_hub_nonce", "_peer_nonce", "verified")

    def __init__(self, secret: bytes, server_name: str, instance: str) -> None:
        _check_secret(secret)
        if not instance or " " in instance:
            raise ValueError(f"{instance!r} is not an instance name")
        self._secret = secret
        self.server_name = server_name
        self.instance = instance
        self._hub_nonce: str | None = None
        self._peer_nonce = _new_nonce()
        #: True once the hub proved it holds the secret.
        self.verified = False

    def respond(self, challenge: str) -> tuple[str, str, str]:
        """The ``AUTH_RESPONSE`` arguments (instance, nonce, proof) for the hub's
        ``AUTH_CHALLENGE``."""
        if self._hub_nonce is not None:
            raise AuthenticationError("AUTH_CHALLENGE sent twice")
        _check_hex(challenge, NONCE_BYTES * 2, "the AUTH_CHALLENGE nonce")
        self._hub_nonce = challenge
        mine = proof(self._secret, _PEER_ROLE, self.server_name, self.instance,
                     challenge, self._peer_nonce)
        return self.instance, self._peer_nonce, mine

    def verify_hub(self, hub_proof: str) -> None:
        """Check the hub's ``AUTH_OK`` proof; raise unless it holds the secret."""
        if self._hub_nonce is None:
            raise AuthenticationError("AUTH_OK before AUTH_CHALLENGE")
        if self.verified:
            raise AuthenticationError("AUTH_OK sent twice")
        _check_hex(hub_proof, _PROOF_HEX_DIGITS, "the AUTH_OK proof")
        expected = proof(self._secret, _HUB_ROLE, self.server_name, self.instance,
                         self._hub_nonce, self._peer_nonce)
        if not hmac.compare_digest(expected, hub_proof):
            raise AuthenticationError(
                "the hub's proof is wrong: it does not hold our shared secret")
        self.verified = True
