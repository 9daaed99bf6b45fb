"""Throwaway certificates for the demo and the tests: a CA, the hub's, each instance's.

``streamrep demo --tls`` (and the TLS tests) need a whole small public-key
infrastructure on one machine. :func:`make_deployment_certificates` writes one
into a directory: a self-signed CA, a hub certificate valid for ``localhost``,
``127.0.0.1`` and ``::1``, and one client certificate per instance whose common
name is the instance name (what the hub checks ``NAME`` against under mutual
TLS). Keys are written readable by their owner only.

It needs the ``cryptography`` package (``pip install 'streamrep[tls]'``); real
deployments bring certificates from their own authority.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["CertificateFiles", "DeploymentCertificates", "make_deployment_certificates"]


@dataclass(frozen=True)
class CertificateFiles:
    """A PEM certificate and its PEM private key."""

    cert: str
    key: str


@dataclass(frozen=True)
class DeploymentCertificates:
    """The files :func:`make_deployment_certificates` wrote."""

    ca: str
    hub: CertificateFiles
    #: instance name -> its client certificate
    clients: dict[str, CertificateFiles] = field(default_factory=dict)
    #: the CA's own certificate and key (to issue more, e.g. from another CA in tests)
    ca_files: CertificateFiles | None = None


def _crypto() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise RuntimeError("generating certificates needs the cryptography package: "
                           "pip install 'streamrep[tls]'") from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _write(path: str, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _issue(directory: str, stem: str, common_name: str, *, issuer: Any = None,
           issuer_key: Any = None, is_ca: bool = False, dns: Iterable[str] = (),
           ips: Iterable[str] = (), server: bool = False, client: bool = False,
           days: int = 30) -> tuple[CertificateFiles, Any, Any]:
    x509, hashes, serialization, ec, eku, NameOID = _crypto()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          key_cert_sign=True, crl_sign=True, encipher_only=False,
                          decipher_only=False), critical=True)
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        alt: list[Any] = [x509.DNSName(name) for name in dns]
        alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        usages = ([eku.SERVER_AUTH] if server else []) + ([eku.CLIENT_AUTH] if client else [])
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False)
    cert = builder.sign(issuer_key if issuer_key is not None else key, hashes.SHA256())
    files = CertificateFiles(os.path.join(directory, f"{stem}.crt"),
                             os.path.join(directory, f"{stem}.key"))
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.key, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()), private=True)
    return files, cert, key


def make_deployment_certificates(directory: str, instances: Iterable[str],
                                 *, ca_name: str = "streamrep test CA",
                                 hub_names: Iterable[str] = ("localhost",),
                                 hub_ips: Iterable[str] = ("127.0.0.1", "::1"),
                                 ) -> DeploymentCertificates:
    """Write a CA (``ca.crt``), the hub's certificate (``hub.crt``/``hub.key``) and
    one client certificate per instance (``<instance>.crt``/``.key``) into
    *directory*, which is created if needed."""
    os.makedirs(directory, exist_ok=True)
    ca_files, ca_cert, ca_key = _issue(directory, "ca", ca_name, is_ca=True, days=60)
    hub, _, _ = _issue(directory, "hub", next(iter(hub_names), "localhost"), issuer=ca_cert,
                       issuer_key=ca_key, dns=hub_names, ips=hub_ips, server=True)
    clients = {}
    for instance in instances:
        clients[instance], _, _ = _issue(directory, f"client-{instance}", instance,
                                         issuer=ca_cert, issuer_key=ca_key, dns=(instance,),
                                         client=True)
    return DeploymentCertificates(ca=ca_files.cert, hub=hub, clients=clients, ca_files=ca_files)
