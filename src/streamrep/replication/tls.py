"""TLS on the replication port: the contexts of both ends and certificate names.

The hub presents its certificate (``tls.cert`` and ``tls.key`` in the
configuration); peers check it against ``tls.ca`` (or the system's trusted
authorities) and the hub's host name. With ``tls.require_client_cert`` every
peer must present a certificate signed by ``tls.ca`` too (mutual TLS), and the
certificate names the instance the peer may speak for: its subject common name,
or one of its DNS subject alternative names (see :func:`certificate_names`).

The contexts are gevent's (:class:`gevent.ssl.SSLContext`), so wrapped sockets
cooperate with the hub's and clients' greenlets. TLS 1.2 is the oldest version
either end accepts.

Every loading problem raises :class:`TLSSetupError` with one line naming the
file, what is wrong and how to fix it.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any, Mapping

from gevent import ssl as gevent_ssl

from streamrep.errors import StreamrepError

__all__ = ["TLSSetupError", "hub_context", "peer_context", "certificate_names", "accept_tls",
           "connect_tls"]


class TLSSetupError(StreamrepError):
    """A certificate, key or CA file that cannot be used; the message is one line
    naming the configuration key, the file and a fix."""


def _readable(path: str, key: str) -> None:
    if not os.path.isfile(path):
        raise TLSSetupError(f"{key}: {path} does not exist; give the path of a PEM file")
    if not os.access(path, os.R_OK):
        raise TLSSetupError(f"{key}: {path} is not readable by this user; fix its permissions")


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, cert_key: str, key_key: str) -> None:
    _readable(cert, cert_key)
    _readable(key, key_key)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in str(exc) or reason == "KEY_VALUES_MISMATCH":
            raise TLSSetupError(f"{key_key}: {key} is not the private key of {cert}; "
                                "give the key the certificate was issued for") from None
        raise TLSSetupError(f"{cert_key}: cannot load {cert} with key {key} ({reason}); "
                            "give a PEM certificate chain and its unencrypted PEM key") from None


def _load_ca(ctx: ssl.SSLContext, ca: str, ca_key: str) -> None:
    _readable(ca, ca_key)
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise TLSSetupError(f"{ca_key}: cannot load {ca} ({exc.reason or exc}); "
                            "give a PEM file of CA certificates") from None


def hub_context(cert: str, key: str, ca: str | None = None,
                require_client_cert: bool = False) -> ssl.SSLContext:
    """The hub's server context: its certificate *cert* with *key*.

    With *ca*, peers that present a certificate have it checked against *ca*;
    with *require_client_cert* too, a peer without a valid one fails the TLS
    handshake (mutual TLS).
    """
    if require_client_cert and ca is None:
        raise TLSSetupError("tls.require_client_cert: needs tls.ca, the authority that signs "
                            "the peers' certificates; set tls.ca")
    ctx: ssl.SSLContext = gevent_ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key, "tls.cert", "tls.key")
    if ca is not None:
        _load_ca(ctx, ca, "tls.ca")
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def peer_context(ca: str | None = None, cert: str | None = None, key: str | None = None,
                 *, cert_key: str = "tls cert", key_key: str = "tls key") -> ssl.SSLContext:
    """A worker's or writer's client context: the hub's certificate is checked
    against *ca* (default: the system's trusted authorities) and its host name.

    *cert* and *key* are this process's own certificate for mutual TLS;
    *cert_key*/*key_key* name where they came from in error messages.
    """
    if (cert is None) != (key is None):
        missing, given = (key_key, cert_key) if key is None else (cert_key, key_key)
        raise TLSSetupError(f"{missing}: missing while {given} is set; give both or neither")
    ctx: ssl.SSLContext = gevent_ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    if ca is not None:
        _load_ca(ctx, ca, "tls.ca")
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert is not None and key is not None:
        _load_chain(ctx, cert, key, cert_key, key_key)
    return ctx


def certificate_names(peercert: Mapping[str, Any] | None) -> frozenset[str]:
    """The instance names a verified peer certificate (``getpeercert()``) speaks for:
    its subject common names and DNS subject alternative names. Empty without one."""
    if not peercert:
        return frozenset()
    names: set[str] = set()
    for rdn in peercert.get("subject", ()):
        for attribute, value in rdn:
            if attribute == "commonName":
                names.add(str(value))
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "DNS":
            names.add(str(value))
    return frozenset(names)


def accept_tls(ctx: ssl.SSLContext, sock: socket.socket,
               timeout: float) -> tuple[socket.socket, frozenset[str] | None]:
    """The hub's TLS handshake on an accepted socket, within *timeout* seconds.

    Returns the wrapped socket and the names of the peer's verified certificate
    (None when it presented none). A failed or slow handshake raises
    :class:`OSError` (:class:`ssl.SSLError` or a timeout); the caller closes *sock*.
    """
    sock.settimeout(timeout)
    wrapped = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    _handshake(wrapped)
    cert = wrapped.getpeercert()
    return wrapped, (certificate_names(cert) if cert else None)


def connect_tls(ctx: ssl.SSLContext, sock: socket.socket, server_hostname: str,
                timeout: float) -> socket.socket:
    """A peer's TLS handshake with the hub, checking its certificate for
    *server_hostname*, within *timeout* seconds; raises :class:`OSError` on failure."""
    sock.settimeout(timeout)
    wrapped = ctx.wrap_socket(sock, server_hostname=server_hostname, do_handshake_on_connect=False)
    _handshake(wrapped)
    return wrapped


def _handshake(wrapped: socket.socket) -> None:
    # The wrapped socket owns the descriptor now: close it on failure, or it leaks.
    try:
        wrapped.do_handshake()  # type: ignore[attr-defined]
    except BaseException:
        wrapped.close()
        raise
    wrapped.settimeout(None)
