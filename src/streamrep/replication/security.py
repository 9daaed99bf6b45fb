"""Who may connect to the hub, and how the connection is protected.

A deployment protects its replication port with TLS (``tls`` in the
configuration: the hub's certificate, optionally client certificates naming each
peer's instance), with the shared-secret handshake of
:mod:`streamrep.replication.handshake` (``shared_secret_file``), or both. A hub
reachable from other machines with neither is refused unless the configuration
says ``insecure: true`` (:func:`streamrep.config.exposure_problem`).

:class:`HubSecurity` and :class:`PeerSecurity` carry what the hub and a
connecting process need at run time (SSL contexts, the secret); build them from
the configuration with their ``from_config`` constructors, which raise
:class:`SecuritySetupError` with one line naming the key, what is wrong and the
fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamrep.config import exposure_problem
from streamrep.errors import StreamrepError
from streamrep.shared_secret import SecretFileError, read_secret_file

if TYPE_CHECKING:
    import ssl

    from streamrep.config import Address, Config

# .tls (and with it ssl) is imported only where a context is built.

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "HubSecurity",
    "PeerSecurity",
    "SecuritySetupError",
]

#: Seconds a peer has to finish the TLS handshake and the shared-secret handshake.
HANDSHAKE_TIMEOUT = 10.0


class SecuritySetupError(StreamrepError):
    """A security setting that cannot be used: one line naming the key and a fix."""


@dataclass(frozen=True)
class HubSecurity:
    """What the hub requires of every connection.

    * *ssl_context*: TLS on the port (None: plain TCP);
    * *require_client_cert*: mutual TLS, ``NAME`` must be a name of the peer's
      certificate (the context then demands one);
    * *secret*: the shared secret; peers must pass the handshake before ``NAME``;
    * *insecure*: a non-loopback address without either is allowed;
    * *handshake_timeout*: seconds a peer has for the TLS handshake and, after it,
      for the shared-secret handshake.
    """

    ssl_context: ssl.SSLContext | None = None
    require_client_cert: bool = False
    secret: bytes | None = field(default=None, repr=False)
    insecure: bool = False
    handshake_timeout: float = HANDSHAKE_TIMEOUT

    @property
    def protected(self) -> bool:
        """Whether peers must prove something (a certificate or the secret)."""
        return self.ssl_context is not None or self.secret is not None

    @classmethod
    def from_config(cls, config: Config) -> HubSecurity:
        """The hub's security from the configuration (its ``tls`` section,
        ``shared_secret_file`` and ``insecure``)."""
        from streamrep.replication.tls import TLSSetupError, hub_context

        tls = config.tls
        context = None
        try:
            if tls.cert is not None and tls.key is not None:
                context = hub_context(tls.cert, tls.key, tls.ca, tls.require_client_cert)
        except TLSSetupError as exc:
            raise SecuritySetupError(str(exc)) from None
        secret = _secret(config.shared_secret_file, "shared_secret_file")
        return cls(ssl_context=context, require_client_cert=tls.require_client_cert,
                   secret=secret, insecure=config.insecure)

    def check_listen(self, listen: Address) -> None:
        """Raise :class:`SecuritySetupError` if listening on *listen* is refused."""
        why = exposure_problem(listen, self.ssl_context is not None, self.secret is not None,
                               self.insecure)
        if why is not None:
            raise SecuritySetupError(f"listen: {why}")


@dataclass(frozen=True)
class PeerSecurity:
    """How a worker or writer connects to the hub.

    * *ssl_context*: TLS (None: plain TCP), checking the hub's certificate and,
      for mutual TLS, presenting this process's own;
    * *server_hostname*: the name checked on the hub's certificate (None: the
      host connected to);
    * *secret*: the shared secret, for the handshake the hub asks for.
    """

    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    secret: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: Config, instance: str, *, cert: str | None = None,
                    key: str | None = None, ca: str | None = None,
                    server_hostname: str | None = None,
                    secret_file: str | None = None) -> PeerSecurity:
        """How *instance* connects to the hub the configuration describes.

        TLS is on when the hub's ``tls`` section is; the instance's own certificate
        comes from *cert*/*key* (flags) or its ``instance_map`` entry's
        ``tls_cert``/``tls_key``. The other arguments override the file.
        """
        tls = config.tls
        secret_file = secret_file if secret_file is not None else config.shared_secret_file
        return cls.from_options(
            tls=tls.enabled,
            ca=ca if ca is not None else tls.ca,
            cert=cert if cert is not None else _instance_attr(config, instance, "tls_cert"),
            key=key if key is not None else _instance_attr(config, instance, "tls_key"),
            server_hostname=server_hostname if server_hostname is not None else tls.server_hostname,
            secret_file=secret_file,
            cert_key=f"instance_map.{instance}.tls_cert" if cert is None else "--tls-cert",
            key_key=f"instance_map.{instance}.tls_key" if key is None else "--tls-key",
        )

    @classmethod
    def from_options(cls, *, tls: bool, ca: str | None = None, cert: str | None = None,
                     key: str | None = None, server_hostname: str | None = None,
                     secret_file: str | None = None, cert_key: str = "--tls-cert",
                     key_key: str = "--tls-key") -> PeerSecurity:
        """From command-line options: *tls* (implied by *ca* or *cert*), the CA
        checking the hub, this process's certificate and key, the secret's file."""
        from streamrep.replication.tls import TLSSetupError, peer_context

        context = None
        if tls or ca is not None or cert is not None:
            try:
                context = peer_context(ca, cert, key, cert_key=cert_key, key_key=key_key)
            except TLSSetupError as exc:
                raise SecuritySetupError(str(exc)) from None
        secret = _secret(secret_file, "shared_secret_file")
        return cls(ssl_context=context, server_hostname=server_hostname, secret=secret)


def _secret(path: str | None, key: str) -> bytes | None:
    if path is None:
        return None
    try:
        return read_secret_file(path, key)
    except SecretFileError as exc:
        raise SecuritySetupError(str(exc)) from None


def _instance_attr(config: Config, instance: str, name: str) -> str | None:
    entry = config.instance_map.get(instance)
    value = getattr(entry, name, None) if entry is not None else None
    return value if isinstance(value, str) else None
