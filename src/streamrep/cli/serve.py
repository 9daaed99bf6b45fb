"""``streamrep serve``: the replication hub and this instance's stream writers."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import click

from streamrep.cli._allocator import ALLOCATORS, describe, use_allocator
from streamrep.cli._common import freeze_startup_heap, use_cooperative_sockets
from streamrep.cli._security import SERVE_FLAGS, hub_security, serve_security_options
from streamrep.cli.options import config_from_click, config_option
from streamrep.config import DEFAULT_INSTANCE, DEFAULT_LISTEN
from streamrep.db import deployment

logger = logging.getLogger(__name__)


def working_directory_database() -> str:
    """The default database: ``streamrep.db`` in the working directory, as an
    absolute URL (``sqlite:////path/to/cwd/streamrep.db``)."""
    return "sqlite:///" + os.path.join(os.path.abspath(os.getcwd()), "streamrep.db")


@click.command()
@config_option
@click.option("--db", "db", default=working_directory_database,
              show_default="streamrep.db in the working directory",
              help="Database URL (sqlite:///path or postgresql://...).")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True,
              help="HOST:PORT to accept replication connections on (loopback unless told otherwise).")
@click.option("--server-name", default="localhost", show_default=True,
              help="The name sent in SERVER; clients check it.")
@click.option("--instance-name", default=DEFAULT_INSTANCE, show_default=True,
              help="This process's name as a stream writer.")
@click.option("--metrics-listen", default=None, help="HOST:PORT to serve Prometheus /metrics on.")
@click.option("--redis", "redis_url", default=None, metavar="URL",
              help="Publish this instance's writers through Redis pub/sub instead of running the hub.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--allocator", type=click.Choice(ALLOCATORS), default="auto", show_default=True,
              envvar="STREAMREP_ALLOCATOR",
              help="Memory allocator: jemalloc gives the memory of departed peers back to the "
                   "system; auto uses it where installed (libjemalloc2).")
@serve_security_options
@click.pass_context
def serve(ctx: click.Context, /, config_path: str | None, db: str, listen: str, server_name: str,
          instance_name: str, metrics_listen: str | None, redis_url: str | None, log_level: str,
          allocator: str, **security_flags: Any) -> None:
    """Run the replication hub until SIGTERM or SIGINT.

    Workers connect to it and follow every stream; writer processes announce to it.
    On SIGTERM/SIGINT every peer gets ``ERROR server stopping`` before the hub exits.

    With ``--redis`` (or ``replication.redis`` in the file) there is no hub: this
    instance publishes its own writers' facts through Redis and answers every
    ``REPLICATE`` with their positions, until SIGTERM or SIGINT.

    The replication port speaks TLS with ``--tls-cert``/``--tls-key`` (the file's
    ``tls`` section), asks peers for client certificates naming their instance with
    ``--require-client-cert`` and for the shared secret with
    ``--shared-secret-file``. A --listen address other machines can reach needs one
    of them, or ``--insecure``.
    """
    if sys.argv[1:2] == ["serve"]:  # this process is the command (not a test calling it)
        use_allocator(allocator, sys.argv)
    import gevent

    from streamrep.catalogue import served_streams
    from streamrep.db import open_database
    from streamrep.logsetup import setup_logging
    from streamrep.replication import ConnectionSettings, ReplicationHub
    from streamrep.replication.sources.database import DatabaseSource
    from streamrep.streams import Streams

    config = config_from_click(ctx, config_path, {
        "db": "database", "listen": "listen", "server_name": "server_name",
        "instance_name": "instance_name", "metrics_listen": "metrics_listen",
        "log_level": "logging.level", "redis_url": "replication.redis.url",
        **SERVE_FLAGS,
    }, check_own_ports=redis_url is None)
    if config.redis is not None:
        use_cooperative_sockets()
        _serve_redis(config)
        return
    security = hub_security(config)
    setup_logging(config.logging.level, config.logging.format)
    logger.info("memory allocator: %s", describe())
    database = open_database(config.database)
    try:
        deployment.claim(database, config.server_name)
    except BaseException:
        database.close()
        raise
    streams = Streams(database, config.instance_name,
                      {name: list(ws) for name, ws in config.stream_writers.items()},
                      definitions=served_streams(config))
    source = DatabaseSource(streams)
    settings = ConnectionSettings.from_config(config)
    metrics_address = config.metrics_listen
    hub = ReplicationHub(
        config.server_name, source,
        host=config.listen.host, port=config.listen.port,
        instance_name=config.instance_name, settings=settings,
        metrics_listen=(metrics_address.host, metrics_address.port) if metrics_address else None,
        # With a deployment file, peers may write only the streams it gives them.
        stream_writers=config.stream_writers if config_path else None,
        # Relayed rows must fit their stream's row format, checked in place.
        row_check=streams.definitions.check_rows,
        security=security,
    )
    streams.add_listener(hub.on_advance)
    hub.start()
    freeze_startup_heap()
    host, port = hub.address
    click.echo(f"streamrep hub {config.server_name} listening on {host}:{port}", err=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, hub.stop)
    try:
        hub.serve_forever()
    finally:
        streams.close()
        database.close()
    click.echo("streamrep hub stopped", err=True)
    sys.exit(0)


def _serve_redis(config: Any) -> None:
    """This instance's writers, published through Redis, until SIGTERM or SIGINT."""
    from streamrep.catalogue import served_streams
    from streamrep.db import open_database
    from streamrep.logsetup import setup_logging
    from streamrep.replication import Announcer, LinkSettings, open_link
    from streamrep.streams import Streams

    setup_logging(config.logging.level, config.logging.format)
    logger.info("memory allocator: %s", describe())
    database = open_database(config.database)
    try:
        deployment.claim(database, config.server_name)
    except BaseException:
        database.close()
        raise
    instance = config.instance_name
    streams = Streams(database, instance, {name: list(ws) for name, ws in config.stream_writers.items()},
                      definitions=served_streams(config))
    settings = LinkSettings.from_config(config, instance)
    link = open_link(settings)
    announcer = Announcer(link, streams)
    click.echo(f"streamrep {instance} of {config.server_name} publishing through {settings.where()}", err=True)
    try:
        # Blocks until SIGTERM or SIGINT.
        link.run()
    finally:
        announcer.stop()
        streams.close()
        database.close()
    click.echo(f"streamrep {instance} stopped", err=True)
    sys.exit(0)
