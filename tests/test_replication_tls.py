"""TLS contexts and handshakes over real loopback sockets, with certificates made here."""

from __future__ import annotations

import pathlib
import shutil
from typing import Iterator

import gevent
import pytest
from gevent import socket as gsocket

pytest.importorskip("cryptography")

from streamrep.demo.certificates import DeploymentCertificates, make_deployment_certificates  # noqa: E402
from streamrep.replication.tls import (  # noqa: E402
    TLSSetupError,
    accept_tls,
    certificate_names,
    connect_tls,
    hub_context,
    peer_context,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DeploymentCertificates:
    return make_deployment_certificates(str(tmp_path_factory.mktemp("pki")), ["writer1", "worker1"])


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> DeploymentCertificates:
    """Another authority's certificates, with the same names."""
    return make_deployment_certificates(str(tmp_path_factory.mktemp("other-pki")), ["writer1"],
                                        ca_name="someone else's CA")


@pytest.fixture
def listener() -> Iterator[gsocket.socket]:
    sock = gsocket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()


def handshake(listener: gsocket.socket, hub_ctx: object, peer_ctx: object,
              server_hostname: str = "127.0.0.1") -> tuple[object, object]:
    """(hub result or exception, peer result or exception) of one handshake."""
    results: dict[str, object] = {}

    def hub_side() -> None:
        sock, _ = listener.accept()
        try:
            wrapped, names = accept_tls(hub_ctx, sock, 5.0)  # type: ignore[arg-type]
            results["hub"] = names
            wrapped.sendall(b"SERVER hub.example\n")
            wrapped.close()
        except OSError as exc:
            results["hub"] = exc
            sock.close()

    hub = gevent.spawn(hub_side)
    raw = gsocket.create_connection(listener.getsockname()[:2])
    try:
        wrapped = connect_tls(peer_ctx, raw, server_hostname, 5.0)  # type: ignore[arg-type]
    except OSError as exc:
        results["peer"] = exc
        raw.close()
    else:
        try:
            results["peer"] = wrapped.recv(100)
        except OSError as exc:
            results["peer"] = exc
        finally:
            wrapped.close()
    hub.join(5)
    return results.get("hub"), results.get("peer")


def test_server_tls_with_a_trusted_ca(certs: DeploymentCertificates, listener: gsocket.socket) -> None:
    hub_names, got = handshake(listener, hub_context(certs.hub.cert, certs.hub.key),
                               peer_context(certs.ca))
    assert got == b"SERVER hub.example\n"
    assert hub_names is None  # no client certificate asked for


def test_mutual_tls_names_the_instance(certs: DeploymentCertificates, listener: gsocket.socket) -> None:
    writer = certs.clients["writer1"]
    hub_names, got = handshake(
        listener, hub_context(certs.hub.cert, certs.hub.key, certs.ca, require_client_cert=True),
        peer_context(certs.ca, writer.cert, writer.key))
    assert got == b"SERVER hub.example\n"
    assert hub_names == frozenset({"writer1"})


def test_mutual_tls_refuses_a_peer_without_a_certificate(
        certs: DeploymentCertificates, listener: gsocket.socket) -> None:
    hub_result, peer_result = handshake(
        listener, hub_context(certs.hub.cert, certs.hub.key, certs.ca, require_client_cert=True),
        peer_context(certs.ca))
    assert isinstance(hub_result, OSError)
    # TLS 1.3: the peer learns of the refusal on its first read.
    assert isinstance(peer_result, OSError) or peer_result == b""


def test_mutual_tls_refuses_a_certificate_of_another_authority(
        certs: DeploymentCertificates, stranger: DeploymentCertificates,
        listener: gsocket.socket) -> None:
    forged = stranger.clients["writer1"]  # the right name, the wrong signer
    hub_result, peer_result = handshake(
        listener, hub_context(certs.hub.cert, certs.hub.key, certs.ca, require_client_cert=True),
        peer_context(certs.ca, forged.cert, forged.key))
    assert isinstance(hub_result, OSError)
    assert isinstance(peer_result, OSError) or peer_result == b""


def test_a_peer_refuses_a_hub_its_ca_did_not_sign(
        certs: DeploymentCertificates, stranger: DeploymentCertificates,
        listener: gsocket.socket) -> None:
    hub_result, peer_result = handshake(listener, hub_context(stranger.hub.cert, stranger.hub.key),
                                        peer_context(certs.ca))
    assert isinstance(peer_result, OSError)
    assert "certificate verify failed" in str(peer_result)
    assert isinstance(hub_result, OSError)


def test_a_peer_checks_the_hubs_name(certs: DeploymentCertificates, listener: gsocket.socket) -> None:
    _, peer_result = handshake(listener, hub_context(certs.hub.cert, certs.hub.key),
                               peer_context(certs.ca), server_hostname="hub.elsewhere")
    assert isinstance(peer_result, OSError)
    assert "not valid for 'hub.elsewhere'" in str(peer_result)


def test_a_plain_peer_cannot_talk_to_a_tls_hub(certs: DeploymentCertificates,
                                               listener: gsocket.socket) -> None:
    results: dict[str, object] = {}

    def hub_side() -> None:
        sock, _ = listener.accept()
        try:
            accept_tls(hub_context(certs.hub.cert, certs.hub.key), sock, 5.0)
            results["hub"] = "accepted"
        except OSError as exc:
            results["hub"] = exc
        finally:
            sock.close()

    hub = gevent.spawn(hub_side)
    with gsocket.create_connection(listener.getsockname()[:2]) as raw:
        raw.sendall(b"NAME writer1\nREPLICATE\n")
        hub.join(5)
    assert isinstance(results["hub"], OSError)


def test_a_silent_peer_does_not_hold_the_tls_handshake(certs: DeploymentCertificates,
                                                       listener: gsocket.socket) -> None:
    results: dict[str, object] = {}

    def hub_side() -> None:
        sock, _ = listener.accept()
        try:
            accept_tls(hub_context(certs.hub.cert, certs.hub.key), sock, 0.3)
        except OSError as exc:
            results["hub"] = exc
        finally:
            sock.close()

    hub = gevent.spawn(hub_side)
    with gsocket.create_connection(listener.getsockname()[:2]):
        hub.join(3)
    assert hub.dead and isinstance(results["hub"], OSError)


def test_setup_problems_are_one_line_naming_the_key(certs: DeploymentCertificates,
                                                    tmp_path: pathlib.Path) -> None:
    with pytest.raises(TLSSetupError, match=r"^tls.cert: /nowhere.crt does not exist; give the path"):
        hub_context("/nowhere.crt", certs.hub.key)
    with pytest.raises(TLSSetupError, match=r"^tls.key: .* is not the private key of "):
        hub_context(certs.hub.cert, certs.clients["writer1"].key)
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(TLSSetupError, match=r"^tls.ca: cannot load .*not.pem"):
        peer_context(str(not_pem))
    with pytest.raises(TLSSetupError, match="needs tls.ca"):
        hub_context(certs.hub.cert, certs.hub.key, require_client_cert=True)
    with pytest.raises(TLSSetupError, match=r"^tls key: missing while tls cert is set"):
        peer_context(certs.ca, certs.clients["writer1"].cert, None)
    copy = tmp_path / "unreadable.key"
    shutil.copy(certs.hub.key, copy)
    copy.chmod(0)
    import os

    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(TLSSetupError, match="not readable"):
            hub_context(certs.hub.cert, str(copy))


def test_certificate_names() -> None:
    assert certificate_names(None) == frozenset()
    assert certificate_names({
        "subject": ((("countryName", "XX"),), (("commonName", "writer1"),)),
        "subjectAltName": (("DNS", "writer1.internal"), ("IP Address", "10.0.0.1")),
    }) == frozenset({"writer1", "writer1.internal"})
