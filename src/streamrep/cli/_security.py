"""The security options of the replication commands, and building their settings.

``serve`` sets the hub's side (its certificate, whether peers need client
certificates, the shared secret, ``--insecure``) through the configuration keys
of :data:`SERVE_FLAGS`. ``tail`` and ``write`` take :func:`peer_security_options`:
TLS towards the hub, their own client certificate, the shared secret. Every
problem is one ``config error:`` line and exit status 2.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from streamrep.cli.options import report_and_exit
from streamrep.config import load_config
from streamrep.errors import ConfigError

if TYPE_CHECKING:
    from streamrep.config import Config
    from streamrep.replication.security import HubSecurity, PeerSecurity

__all__ = ["SERVE_FLAGS", "serve_security_options", "hub_security", "peer_security_options",
           "peer_security", "peer_security_from_context"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: serve's security flags -> the configuration keys they set.
SERVE_FLAGS = {
    "tls_cert": "tls.cert",
    "tls_key": "tls.key",
    "tls_ca": "tls.ca",
    "require_client_cert": "tls.require_client_cert",
    "shared_secret_file": "shared_secret_file",
    "insecure": "insecure",
}


def _fail(message: str) -> None:
    click.echo(f"config error: {message}", err=True)
    raise SystemExit(2)


def serve_security_options(func: _F) -> _F:
    """``serve``'s options: the hub's certificate, client certificates, the secret."""
    options = [
        click.option("--tls-cert", default=None, metavar="PEM",
                     help="The hub's certificate chain: TLS on the replication port (tls.cert)."),
        click.option("--tls-key", default=None, metavar="PEM", help="Its private key (tls.key)."),
        click.option("--tls-ca", default=None, metavar="PEM",
                     help="CA certificates that sign the peers' client certificates (tls.ca)."),
        click.option("--require-client-cert", is_flag=True, default=None,
                     help="Mutual TLS: every peer presents a certificate signed by --tls-ca "
                          "naming its instance (tls.require_client_cert)."),
        click.option("--shared-secret-file", default=None, metavar="FILE",
                     help="Peers must prove they hold the secret in FILE (shared_secret_file)."),
        click.option("--insecure", is_flag=True, default=None,
                     help="Allow a non-loopback --listen without TLS or a secret (insecure)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def hub_security(config: Config) -> HubSecurity:
    """The hub's security from the configuration; exit 2 with one line on a problem."""
    from streamrep.replication.security import HubSecurity, SecuritySetupError

    try:
        security = HubSecurity.from_config(config)
        security.check_listen(config.listen)
    except SecuritySetupError as exc:
        _fail(str(exc))
        raise  # unreachable
    return security


_PEER_PARAMS = ("tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "shared_secret_file")
_META_KEY = "streamrep.peer_security_flags"


def peer_security_options(func: _F) -> _F:
    """``tail``'s and ``write``'s options for reaching a protected hub.

    The command's function does not receive them: :func:`peer_security_from_context`
    reads them, so adding the options leaves its signature alone.
    """
    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        flags = {name: kwargs.pop(name, None) for name in _PEER_PARAMS}
        click.get_current_context().meta[_META_KEY] = flags
        return func(*args, **kwargs)

    options = [
        click.option("--tls", "tls", is_flag=True, default=None,
                     help="Connect with TLS (implied by --tls-ca, --tls-cert and by a "
                          "configuration with a tls section)."),
        click.option("--tls-ca", default=None, metavar="PEM",
                     help="CA certificates to check the hub's certificate against "
                          "(default: tls.ca, else the system's)."),
        click.option("--tls-cert", default=None, metavar="PEM",
                     help="This process's client certificate, for mutual TLS (default: its "
                          "instance_map entry's tls_cert)."),
        click.option("--tls-key", default=None, metavar="PEM", help="Its private key."),
        click.option("--tls-server-name", default=None, metavar="NAME",
                     help="The name the hub's certificate must carry (default: "
                          "tls.server_hostname, else the host connected to)."),
        click.option("--shared-secret-file", default=None, metavar="FILE",
                     help="The shared secret the hub asks for (default: shared_secret_file)."),
    ]
    wrapped: Any = command
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped  # type: ignore[no-any-return]


def peer_security_from_context(config_path: str | None, instance: str) -> PeerSecurity:
    """:func:`peer_security` with the flags of the running command."""
    flags = click.get_current_context().meta.get(_META_KEY, {})
    return peer_security(config_path, instance, **flags)


def peer_security(config_path: str | None, instance: str, *, tls: bool | None,
                  tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
                  tls_server_name: str | None, shared_secret_file: str | None) -> PeerSecurity:
    """How a ``tail`` or ``write`` process named *instance* connects: the file's
    settings (when given) overridden by the flags; exit 2 with one line on a problem."""
    from streamrep.replication.security import PeerSecurity, SecuritySetupError

    try:
        if config_path is None:
            return PeerSecurity.from_options(
                tls=bool(tls), ca=tls_ca, cert=tls_cert, key=tls_key,
                server_hostname=tls_server_name, secret_file=shared_secret_file,
                cert_key="--tls-cert", key_key="--tls-key")
        try:
            from streamrep.catalogue import known_streams

            config = load_config(config_path, streams=known_streams())
        except ConfigError as exc:
            report_and_exit(exc)
            raise  # unreachable
        security = PeerSecurity.from_config(
            config, instance, cert=tls_cert, key=tls_key, ca=tls_ca,
            server_hostname=tls_server_name, secret_file=shared_secret_file)
        if tls and security.ssl_context is None:
            security = PeerSecurity.from_options(
                tls=True, ca=tls_ca or config.tls.ca, cert=tls_cert, key=tls_key,
                server_hostname=tls_server_name, secret_file=shared_secret_file
                or config.shared_secret_file)
        return security
    except SecuritySetupError as exc:
        _fail(str(exc))
        raise  # unreachable
