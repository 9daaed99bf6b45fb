"""Helpers shared by the replication subcommands."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import click

from streamrep.cli.options import report_and_exit
from streamrep.config import load_config, parse_address
from streamrep.errors import ConfigError
from streamrep.replication.link import LinkSettings
from streamrep.replication.protocol import ConnectionSettings

if TYPE_CHECKING:
    from streamrep.config import SynapseConfig
    from streamrep.replication.security import PeerSecurity
    from streamrep.replication.sources.http import HttpSource


def freeze_startup_heap() -> None:
    """Move everything allocated so far (modules, configuration, connections) out of
    the cyclic collector's reach, once start-up is over.

    A replication process then allocates short-lived lists per decoded row; every
    full collection they trigger would otherwise walk the whole start-up heap
    again, which costs as much as the decoding itself.
    """
    gc.collect()
    gc.freeze()


def use_cooperative_sockets() -> None:
    """Make the sockets of blocking libraries (redis-py's) cooperative under gevent.

    Called by a command as soon as it knows it replicates through Redis, before any
    Redis connection exists.
    """
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()


def parse_connect(value: str) -> tuple[str, int]:
    """``HOST:PORT`` to a tuple, or a click usage error naming the flag."""
    try:
        address = parse_address(value)
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--connect") from None
    return address.host, address.port


@dataclass(frozen=True)
class PeerSettings:
    """Where a worker or writer process connects, and what it knows of the deployment."""

    host: str
    port: int
    database: str | None
    server_name: str | None
    #: stream -> writer instances (empty without a configuration file)
    stream_writers: dict[str, list[str]] = field(default_factory=dict)
    #: the instance writing every stream not named in ``stream_writers``
    default_writer: str | None = None
    #: keepalive and backpressure (the configuration's, or the defaults)
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    #: replicate through this Redis server instead of the hub
    redis_url: str | None = None
    #: a writer's RDATA lines per Redis message (``replication.redis.lines_per_message``)
    redis_lines_per_message: int = 1
    #: seconds a writer's lease lives without renewal
    writer_lease_ttl: float = 30.0
    #: a reference deployment followed through its homeserver.yaml (--synapse-config)
    synapse: SynapseConfig | None = None

    def link(self, name: str, security: PeerSecurity | None = None) -> LinkSettings:
        """The link of a process named *name*: to the hub, or through Redis (a
        reference deployment's, from its homeserver.yaml)."""
        if self.synapse is not None:
            return LinkSettings.from_synapse(self.synapse, name, self.connection)
        if self.redis_url is not None:
            return LinkSettings(name, self.server_name, redis_url=self.redis_url, connection=self.connection,
                                redis_lines_per_message=self.redis_lines_per_message)
        return LinkSettings(name, self.server_name, hub=(self.host, self.port), connection=self.connection,
                            security=security)

    @property
    def where(self) -> str:
        """The far end, for messages."""
        return LinkSettings("-", self.server_name or "-", hub=None if self.redis_url else (self.host, self.port),
                            redis_url=self.redis_url).where()


def catch_up_over_http(synapse: SynapseConfig) -> HttpSource:
    """The catch-up source of a follower of a reference deployment: every writer of its
    ``instance_map``, over their HTTP replication API."""
    from streamrep.replication.sources.http import HttpSource

    return HttpSource.from_synapse(synapse)


def _synapse_settings(path: str, connect: str | None, db: str | None, server_name: str | None,
                      redis: str | None) -> PeerSettings:
    """``--synapse-config PATH``: everything comes from the homeserver's own file."""
    given = [flag for flag, value in (("--connect", connect), ("--redis", redis), ("--db", db),
                                      ("--server-name", server_name)) if value is not None]
    if given:
        raise click.UsageError(f"--synapse-config takes the deployment's Redis and server name from "
                               f"homeserver.yaml: drop {', '.join(given)}")
    from streamrep.config import load_synapse_config

    synapse = load_synapse_config(path)
    return PeerSettings("", 0, None, synapse.server_name, redis_url=synapse.redis_url, synapse=synapse)


def peer_settings(config_path: str | None, connect: str | None, db: str | None,
                  server_name: str | None, redis: str | None = None,
                  synapse_config: str | None = None) -> PeerSettings:
    """Settings of a process that connects to the hub: flags, else the configuration file.

    With ``--config`` the hub's address, the database, the server name and the stream
    writers come from the same file ``streamrep serve`` reads; flags override them.
    A configuration problem prints one line per problem and exits with status 2.
    With *synapse_config* (``--synapse-config``) the link goes to the Redis of the
    reference deployment that file describes, and nothing else may be given.
    """
    if synapse_config is not None:
        if config_path is not None:
            raise click.UsageError("give --synapse-config or --config, not both (a configuration file "
                                   "names the homeserver's file as replication.synapse_config)")
        return _synapse_settings(synapse_config, connect, db, server_name, redis)
    if config_path is None:
        if redis is not None:
            _check_redis_url(redis)
            host, port = parse_connect(connect) if connect is not None else ("", 0)
            return PeerSettings(host, port, db, server_name, redis_url=redis)
        if connect is None:
            raise click.UsageError("give --connect HOST:PORT, --redis URL or --config FILE")
        host, port = parse_connect(connect)
        return PeerSettings(host, port, db, server_name)
    from streamrep.catalogue import known_streams

    try:
        config = load_config(config_path, {"replication.redis.url": redis},
                             streams=known_streams())
    except ConfigError as exc:
        report_and_exit(exc)
        raise  # unreachable: report_and_exit exits
    if connect is not None:
        host, port = parse_connect(connect)
    else:
        host, port = config.listen.host, config.listen.port
    if config.synapse is not None:
        # The deployment is the reference's: its database is not streamrep's to read.
        if db is not None or server_name is not None or connect is not None:
            raise click.UsageError("the configuration follows a homeserver (replication.synapse_config): "
                                   "drop --db, --server-name and --connect")
        return PeerSettings(host, port, None, config.synapse.server_name, redis_url=config.synapse.redis_url,
                            connection=ConnectionSettings.from_config(config), synapse=config.synapse)
    return PeerSettings(
        host, port,
        database=db if db is not None else config.database,
        server_name=server_name if server_name is not None else config.server_name,
        stream_writers={name: list(ws) for name, ws in config.stream_writers.items()},
        default_writer=config.instance_name,
        connection=ConnectionSettings.from_config(config),
        redis_url=config.redis.url if config.redis is not None else None,
        redis_lines_per_message=config.redis.lines_per_message if config.redis is not None else 1,
        writer_lease_ttl=config.writer_lease_ttl,
    )


def _check_redis_url(url: str) -> None:
    """A ``--redis`` URL given without a configuration file, checked as the file's."""
    from streamrep.catalogue import known_streams

    try:
        load_config(None, {"server_name": "check.invalid", "replication.redis.url": url},
                    streams=known_streams())
    except ConfigError as exc:
        report_and_exit(exc)
