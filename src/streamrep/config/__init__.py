"""The deployment's configuration file: one YAML file every process reads.

A file names the server, the database, the hub's listen address, the instances and
the streams each writes (``stream_writers``, as the reference system does), the
metrics addresses, the keepalive and backpressure limits and the log level::

    server_name: example.com
    database: postgresql://streamrep@db.internal/streamrep
    listen: 127.0.0.1:9092
    instance_map:
      main: {}
      writer1: {metrics_listen: 127.0.0.1:9101}
      writer2: {metrics_listen: 127.0.0.1:9102}
    stream_writers:
      to_device: [writer1, writer2]
      events: [writer1]

Every problem in a file is found before anything starts, and each is reported as
one line naming its key path and a fix::

    config error: stream_writers.evnets: unknown stream "evnets" (known: ...); did you mean "events"?

Using it from a program, which hands in the streams it knows::

    from streamrep.catalogue import known_streams
    from streamrep.config import load_config
    config = load_config("streamrep.yaml", {"listen": "127.0.0.1:9093"},
                         streams=known_streams())

``load_config`` raises :class:`streamrep.errors.ConfigError`, whose ``problems``
attribute has every line. The package's modules: :mod:`~streamrep.config.model`
(the dataclasses), :mod:`~streamrep.config.loading` (reading the file and the
flags' overrides), :mod:`~streamrep.config.validation` (one validator per
section), :mod:`~streamrep.config.fields` (single values),
:mod:`~streamrep.config.problems` (the lines), :mod:`~streamrep.config.ports` and
:mod:`~streamrep.config.exposure`; :mod:`~streamrep.config.synapse` reads a
reference homeserver's own ``homeserver.yaml`` for following it. The ``--config`` option of the commands and the
"flags override the file" rule are in :mod:`streamrep.cli.options`.
"""

from __future__ import annotations

from streamrep.config.exposure import exposure_problem, is_loopback
from streamrep.config.loading import load_config
from streamrep.config.model import (
    DEFAULT_DATABASE,
    DEFAULT_INSTANCE,
    DEFAULT_LISTEN,
    Address,
    BackpressureConfig,
    ConnectionsConfig,
    Config,
    InstanceConfig,
    KeepaliveConfig,
    LoggingConfig,
    RedisConfig,
    TLSConfig,
    parse_address,
    redis_url_for_display,
)
from streamrep.config.ports import check_ports
from streamrep.config.problems import FLAG_KEYS
from streamrep.config.synapse import SynapseConfig, load_synapse_config

__all__ = [
    "Address",
    "BackpressureConfig",
    "ConnectionsConfig",
    "Config",
    "DEFAULT_DATABASE",
    "DEFAULT_INSTANCE",
    "DEFAULT_LISTEN",
    "FLAG_KEYS",
    "InstanceConfig",
    "KeepaliveConfig",
    "LoggingConfig",
    "RedisConfig",
    "SynapseConfig",
    "TLSConfig",
    "check_ports",
    "exposure_problem",
    "is_loopback",
    "load_config",
    "load_synapse_config",
    "parse_address",
    "redis_url_for_display",
]
