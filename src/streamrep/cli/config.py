"""``streamrep check-config FILE``: validate a configuration before deploying it."""

from __future__ import annotations

import click

from streamrep.catalogue import known_streams
from streamrep.cli.options import report_and_exit
from streamrep.config import Config, check_ports, is_loopback, load_config
from streamrep.errors import ConfigError


def _protection(config: Config) -> str:
    """What a peer must prove to the hub, in words ("" when nothing)."""
    parts = []
    if config.tls.enabled:
        parts.append("TLS with client certificates naming each instance"
                     if config.tls.require_client_cert else "TLS")
    if config.shared_secret_file is not None:
        parts.append("the shared secret")
    return "peers must pass " + " and ".join(parts) if parts else ""


def _check_security_files(config: Config, instance: str | None) -> None:
    """Load the certificates, keys and secret the instance will use (the hub's by
    default), so a wrong path or a key that does not match is one line now."""
    if not (config.tls.enabled or config.shared_secret_file is not None):
        return
    from streamrep.replication.security import HubSecurity, PeerSecurity, SecuritySetupError

    try:
        if instance is None or instance == config.instance_name:
            HubSecurity.from_config(config)
        else:
            PeerSecurity.from_config(config, instance)
    except SecuritySetupError as exc:
        click.echo(f"config error: {exc}", err=True)
        raise SystemExit(2) from None


@click.command("check-config")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--instance", default=None, metavar="NAME",
              help="Also check that the ports this instance listens on are free and "
                   "that its certificate, key and secret load (default: the hub's instance).")
@click.option("--no-port-check", is_flag=True,
              help="Skip the port check (e.g. while the deployment is running).")
def check_config(path: str, instance: str | None, no_port_check: bool) -> None:
    """Validate the configuration file PATH.

    Prints one line per problem, each naming its key and a fix, and exits with
    status 2; on success prints a short summary and exits 0.
    """
    try:
        config = load_config(path, streams=known_streams())
        if not no_port_check:
            check_ports(config, instance)
    except ConfigError as exc:
        report_and_exit(exc)
        return
    _check_security_files(config, instance)
    click.echo(f"{path}: ok (server {config.server_name}, hub {config.instance_name} "
               f"listening on {config.listen}, database {config.database.partition(':')[0]})")
    protection = _protection(config)
    if not is_loopback(config.listen):
        click.echo(f"  note: {config.listen} accepts replication connections from other "
                   f"machines; {protection or 'nothing authenticates them (insecure: true), so firewall it'}")
    elif protection:
        click.echo(f"  {protection}")
    if config.redis is not None:
        from streamrep.config import redis_url_for_display

        click.echo(f"  replication through Redis at {redis_url_for_display(config.redis.url)}, "
                   f"channel {config.server_name}")
        if config.redis.lines_per_message > 1:
            click.echo(f"  note: up to {config.redis.lines_per_message} RDATA lines per Redis message, "
                       f"which reference processes cannot read: keep them off channel {config.server_name}")
    for stream in sorted(config.stream_writers):
        click.echo(f"  {stream}: written by {', '.join(config.stream_writers[stream])}")
