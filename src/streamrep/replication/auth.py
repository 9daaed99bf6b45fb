"""Authentication gates in front of the protocol sessions (sans-IO).

A transport feeds every decoded read through a gate before the session sees it,
until the gate says :attr:`passthrough`; from then on the gate costs nothing.

* :class:`HubGate`, the hub's side: with a shared secret it adds
  ``AUTH_CHALLENGE`` to the greeting (right after ``SERVER``), answers a valid
  ``AUTH_RESPONSE`` with ``AUTH_OK`` and refuses anything but ``PING`` and
  ``ERROR`` before it; then, and under mutual TLS, it lets ``NAME`` through only
  for the instance the peer proved (the one its ``AUTH_RESPONSE`` named, a name
  of its certificate). Once ``NAME`` is through, the session's own rules apply.
* :class:`PeerGate`, a worker's or writer's side: with a secret it answers the
  hub's ``AUTH_CHALLENGE``, checks the hub's proof in ``AUTH_OK`` and only then
  lets the transport send the session's greeting (``NAME``, positions,
  ``REPLICATE``), so a hub that does not hold the secret learns nothing else.
  Without a secret it recognises a hub that asks for one and says so.

The hub greets with ``SERVER``, ``AUTH_CHALLENGE`` (only with a secret), then
``PING``, in that order: a peer with a secret that sees the ``PING`` first
knows the hub will not ask, and closes rather than trust it.

Both return :class:`~streamrep.replication.protocol.Send` and
:class:`~streamrep.replication.protocol.Close` actions, carried out by the
transport before the session's own actions for the same read.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Collection, Sequence

from streamrep.replication import commands as C
from streamrep.replication.handshake import AuthenticationError, HubHandshake, PeerHandshake
from streamrep.replication.protocol import Action, Close, Send

__all__ = ["AUTH_FAILED", "HubGate", "PeerGate"]

logger = logging.getLogger(__name__)

#: The disconnect reason (metrics label) of a peer that failed authentication.
AUTH_FAILED = "auth_failed"

# What a peer may send before it has authenticated: keepalive and errors.
_BEFORE_AUTH = frozenset({"PING", "ERROR"})


class HubGate:
    """The hub's authentication of one connection.

    *secret*: the shared secret (None: no handshake). *certificate_names*: the
    names of the peer's verified TLS certificate (None: no certificate, nothing
    to match). With neither the hub needs no gate.
    """

    __slots__ = ("handshake", "certificate_names", "passthrough", "instance")

    def __init__(self, server_name: str, secret: bytes | None = None,
                 certificate_names: Collection[str] | None = None) -> None:
        self.handshake = HubHandshake(secret, server_name) if secret is not None else None
        self.certificate_names = frozenset(certificate_names) if certificate_names else None
        #: True once NAME went through: the transport stops calling :meth:`receive`.
        self.passthrough = False
        #: The instance the peer proved (secret) or may name (certificate), when known.
        self.instance: str | None = None

    def greeting(self, actions: Sequence[Action]) -> list[Action]:
        """The session's greeting with ``AUTH_CHALLENGE`` right after ``SERVER``."""
        out = list(actions)
        if self.handshake is None:
            return out
        challenge = Send(C.encode_one(C.auth_challenge(self.handshake.challenge)), 1, "AUTH_CHALLENGE")
        for i, action in enumerate(out):
            if isinstance(action, Send) and action.name == "SERVER":
                out.insert(i + 1, challenge)
                return out
        out.insert(0, challenge)
        return out

    def receive(self, commands: list[Any]) -> tuple[list[Action], list[Any]]:
        """Gate one read: the actions to carry out first, and the commands the
        session may see. After a :class:`Close` the session sees nothing."""
        actions: list[Action] = []
        passed: list[Any] = []
        handshake = self.handshake
        for i, command in enumerate(commands):
            name = command.NAME
            if handshake is not None and not handshake.authenticated:
                if name == "AUTH_RESPONSE":
                    try:
                        hub_proof = handshake.verify(command.instance_name, command.nonce,
                                                     command.proof)
                    except AuthenticationError as exc:
                        return [self._refuse(str(exc))], []
                    actions.append(Send(C.encode_one(C.auth_ok(hub_proof)), 1, "AUTH_OK"))
                    continue
                if name in _BEFORE_AUTH:
                    passed.append(command)
                    continue
                return [self._refuse(
                    f"{name} before authentication: this hub requires the shared secret "
                    "(AUTH_RESPONSE to its AUTH_CHALLENGE); set shared_secret_file")], []
            if name == "AUTH_RESPONSE":
                return [self._refuse("AUTH_RESPONSE out of turn")], []
            if name == "NAME":
                problem = self._name_problem(command.data)
                if problem is not None:
                    return [self._refuse(problem)], []
                self.instance = command.data
                self.passthrough = True
                passed.extend(commands[i:])
                return actions, passed
            passed.append(command)
        return actions, passed

    def _name_problem(self, name: str) -> str | None:
        proved = self.handshake.instance if self.handshake is not None else None
        if proved is not None and name != proved:
            return f"NAME {name} differs from the instance authenticated ({proved})"
        names = self.certificate_names
        if names is not None and name not in names:
            return (f"NAME {name} is not a name of the client certificate "
                    f"({', '.join(sorted(names))})")
        return None

    def _refuse(self, why: str) -> Close:
        return Close(AUTH_FAILED, why)


class PeerGate:
    """A worker's or writer's side of authentication on one connection.

    *secret*: the shared secret (None: the hub must not ask for one).
    *instance*: this process's instance name (its ``NAME``); *expected_server*:
    the ``SERVER`` name it insists on, if any. *greeting* returns the session's
    greeting actions; with a secret the gate adds them once the hub has proved
    it holds the secret (the transport sends them at once when :attr:`ready`).
    """

    __slots__ = ("_secret", "instance", "expected_server", "server_name", "handshake",
                 "passthrough", "ready", "greeting")

    def __init__(self, instance: str, secret: bytes | None = None,
                 expected_server: str | None = None,
                 greeting: Callable[[], list[Action]] | None = None) -> None:
        self._secret = secret
        self.greeting = greeting
        self.instance = instance
        self.expected_server = expected_server
        self.server_name: str | None = None
        self.handshake: PeerHandshake | None = None
        #: True once the gate has nothing left to check.
        self.passthrough = False
        #: Whether the session's greeting may go out (at once without a secret).
        self.ready = secret is None

    def receive(self, commands: list[Any]) -> tuple[list[Action], list[Any]]:
        """Gate one read: the actions to carry out first (the greeting among them
        once the hub has proved the secret), and the commands the session may see.
        After a :class:`Close` the session sees nothing more."""
        actions: list[Action] = []
        passed: list[Any] = []
        for i, command in enumerate(commands):
            name = command.NAME
            if name == "SERVER":
                self.server_name = command.data
                passed.append(command)
            elif name == "AUTH_CHALLENGE":
                if self._secret is None:
                    return [Close(AUTH_FAILED, "the hub asks for the shared secret and this "
                                  "process has none; set shared_secret_file")], passed
                if self.handshake is not None:
                    return [Close(AUTH_FAILED, "AUTH_CHALLENGE sent twice")], passed
                if self.expected_server is not None and self.server_name != self.expected_server:
                    return actions, passed  # the session closes: wrong server
                if self.server_name is None:
                    return [Close(AUTH_FAILED, "AUTH_CHALLENGE before SERVER")], passed
                self.handshake = PeerHandshake(self._secret, self.server_name, self.instance)
                try:
                    response = self.handshake.respond(command.nonce)
                except AuthenticationError as exc:
                    return [Close(AUTH_FAILED, str(exc))], passed
                actions.append(Send(C.encode_one(C.auth_response(*response)), 1, "AUTH_RESPONSE"))
            elif name == "AUTH_OK":
                if self.handshake is None:
                    return [Close(AUTH_FAILED, "AUTH_OK without a challenge")], passed
                try:
                    self.handshake.verify_hub(command.proof)
                except AuthenticationError as exc:
                    return [Close(AUTH_FAILED, str(exc))], passed
                self.ready = True
                if self.greeting is not None:
                    actions.extend(self.greeting())
            elif name == "PING" and not self.ready and self.handshake is None:
                return [Close(AUTH_FAILED, "the hub did not ask for the shared secret: it has "
                              "none configured, or it is not this deployment's hub; set the "
                              "same shared_secret_file on both")], passed
            elif name == "PING" and self._secret is None:
                # The hub greets with AUTH_CHALLENGE before its first PING, or not at
                # all: nothing more to watch for.
                self.passthrough = True
                passed.extend(commands[i:])
                return actions, passed
            elif not self.ready and name not in _BEFORE_AUTH:
                return [Close(AUTH_FAILED, f"{name} before AUTH_OK")], passed
            else:
                passed.append(command)
            if self.ready and self._secret is not None:
                self.passthrough = True
                passed.extend(commands[i + 1:])
                return actions, passed
        return actions, passed
