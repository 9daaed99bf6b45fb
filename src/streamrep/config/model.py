"""The configuration's model: frozen dataclasses, one per section of the file.

Nothing here reads a file or checks a value against the deployment: that is
:mod:`streamrep.config.loading` and :mod:`streamrep.config.validation`. A
:class:`Config` is what every process is given once loading succeeded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Mapping
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from streamrep.config.synapse import SynapseConfig

__all__ = [
    "Address",
    "BackpressureConfig",
    "Config",
    "DEFAULT_DATABASE",
    "DEFAULT_INSTANCE",
    "DEFAULT_LISTEN",
    "InstanceConfig",
    "KeepaliveConfig",
    "LoggingConfig",
    "RedisConfig",
    "TLSConfig",
    "parse_address",
    "redis_url_for_display",
]

#: The hub's default listen address: loopback only, never all interfaces by default.
DEFAULT_LISTEN = "127.0.0.1:9092"
#: The embedded SQLite database in the working directory.
DEFAULT_DATABASE = "sqlite:///streamrep.db"
#: The hub's own instance name when none is configured.
DEFAULT_INSTANCE = "main"


@dataclass(frozen=True)
class Address:
    """A TCP address to listen on or connect to."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class InstanceConfig:
    """One named process of the deployment (the hub, a writer or a worker)."""

    name: str
    #: Where the instance can be reached, when something needs to reach it.
    host: str | None = None
    port: int | None = None
    #: Where the instance serves Prometheus metrics, if it does.
    metrics_listen: Address | None = None
    #: The instance's client certificate and key for mutual TLS (PEM files).
    tls_cert: str | None = None
    tls_key: str | None = None


@dataclass(frozen=True)
class KeepaliveConfig:
    """Replication keepalive: send something every ``ping_interval`` seconds; once a
    peer has pinged, close it after ``timeout`` seconds of silence."""

    ping_interval: float = 5.0
    timeout: float = 15.0


@dataclass(frozen=True)
class BackpressureConfig:
    """Per-connection limits on the hub."""

    #: Commands queued for one connection before it is disconnected with ``ERROR``
    #: (by default far more than ``max_queue_bytes`` holds: bytes are the bound).
    max_queue: int = 1_000_000
    #: Longest accepted inbound line, in bytes.
    max_line_length: int = 1_048_576
    #: Bytes queued for one connection before it is disconnected with ``ERROR``.
    max_queue_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class ConnectionsConfig:
    """The hub's limits on peers (the ``connections`` section).

    A peer is *pending* until it has sent ``NAME`` and then ``REPLICATE``, ``RDATA``,
    ``POSITION`` or another command the hub acts on. Pending peers count against
    ``max_pending`` and ``max_pending_per_host`` (None: 200 and 50, at most ``max``
    and ``max_per_host``); a new connection beyond them closes the oldest pending
    peer. Every peer counts against ``max`` and ``max_per_host``, refused beyond.
    """

    max: int = 1000
    max_per_host: int = 200
    max_pending: int | None = None
    max_pending_per_host: int | None = None
    #: Seconds a peer has to send ``NAME``.
    handshake_timeout: float = 10.0
    #: Seconds a peer has to become active (see above).
    idle_timeout: float = 30.0


@dataclass(frozen=True)
class RedisConfig:
    """Replication through Redis pub/sub instead of the hub (``replication.redis``)."""

    #: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS) or
    #: ``unix:///path/to/redis.sock``
    url: str
    #: Up to this many of a writer's ``RDATA`` lines in one Redis message. 1 is the
    #: format every reference process reads; more is read only by streamrep, so it
    #: is for channels no reference process is on (see docs/replication.md).
    lines_per_message: int = 1


@dataclass(frozen=True)
class TLSConfig:
    """TLS on the replication port (the ``tls`` section).

    The hub presents ``cert`` (with ``key``); every peer checks it against ``ca``
    (default: the system's authorities) and ``server_hostname`` (default: the host
    it connects to). With ``require_client_cert`` peers must present a
    certificate signed by ``ca`` that names their instance (mutual TLS).
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    require_client_cert: bool = False
    server_hostname: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether the hub speaks TLS (so every peer must too)."""
        return self.cert is not None


@dataclass(frozen=True)
class LoggingConfig:
    """Log level and line format (``logfmt`` or ``json``; one line per event)."""

    level: str = "INFO"
    format: str = "logfmt"


@dataclass(frozen=True)
class Config:
    """A validated deployment configuration.

    ``stream_writers`` maps every known stream to its writer instances (streams the
    file does not mention are written by the hub's instance, ``instance_name``).
    """

    server_name: str
    database: str = DEFAULT_DATABASE
    listen: Address = field(default_factory=lambda: parse_address(DEFAULT_LISTEN))
    instance_name: str = DEFAULT_INSTANCE
    instance_map: Mapping[str, InstanceConfig] = field(default_factory=dict)
    stream_writers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    metrics_listen: Address | None = None
    keepalive: KeepaliveConfig = field(default_factory=KeepaliveConfig)
    backpressure: BackpressureConfig = field(default_factory=BackpressureConfig)
    connections: ConnectionsConfig = field(default_factory=ConnectionsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: TLS on the replication port (off unless ``tls.cert`` is set).
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: The file holding the shared secret peers prove they know, if any.
    shared_secret_file: str | None = None
    #: Allow a non-loopback ``listen`` without TLS or a shared secret.
    insecure: bool = False
    #: Replication through Redis (``replication.redis``), None: through the hub.
    redis: RedisConfig | None = None
    #: A reference deployment followed through its own ``homeserver.yaml``
    #: (``replication.synapse_config``): its Redis, and its writers' HTTP API.
    synapse: SynapseConfig | None = None
    #: Seconds a writer's lease lives without renewal (see streamrep.idgen.lease).
    writer_lease_ttl: float = 30.0
    #: The event stores' check of event IDs and content hashes: strict, warn or off.
    verify_event_ids: Literal["strict", "warn", "off"] = "warn"
    #: The file it came from, if any.
    source: str | None = None

    @property
    def is_sqlite(self) -> bool:
        """True when the database is the embedded SQLite one."""
        return self.database.startswith("sqlite:")

    def writers_of(self, stream: str) -> tuple[str, ...]:
        """The instances that write *stream*."""
        return self.stream_writers.get(stream, (self.instance_name,))

    def streams_written_by(self, instance: str) -> tuple[str, ...]:
        """The streams *instance* writes, sorted."""
        return tuple(sorted(s for s, ws in self.stream_writers.items() if instance in ws))

    def metrics_address_of(self, instance: str) -> Address | None:
        """Where *instance* serves metrics (the hub: ``metrics_listen``)."""
        if instance == self.instance_name and self.metrics_listen is not None:
            return self.metrics_listen
        entry = self.instance_map.get(instance)
        return entry.metrics_listen if entry is not None else None

    def replace(self, **changes: Any) -> Config:
        """A copy with *changes* applied (no validation: prefer :func:`load_config`)."""
        return dataclasses.replace(self, **changes)


def parse_address(text: str) -> Address:
    """Parse ``HOST:PORT`` (``[v6addr]:PORT`` for IPv6); raise ValueError if it is not one."""
    if not isinstance(text, str) or not text:
        raise ValueError("expected HOST:PORT")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError("expected [IPV6]:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError("expected HOST:PORT")
        if ":" in host:
            raise ValueError("write IPv6 addresses as [ADDR]:PORT")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
    return Address(host, int(port_text))


def redis_url_for_display(url: str) -> str:
    """*url* with its password (if any) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    masked = url
    if password is not None:
        host = parts.netloc.rpartition("@")[2]
        masked = urlunsplit((parts.scheme, f"{parts.username or ''}:***@{host}", parts.path,
                             parts.query, parts.fragment))
    if "password=" in parts.query:
        masked = masked.split("?", 1)[0] + "?***"
    return masked
