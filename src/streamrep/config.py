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

Using it from a command::

    from streamrep.config import load_config
    config = load_config("streamrep.yaml", {"listen": "127.0.0.1:9093"})

``load_config`` raises :class:`streamrep.errors.ConfigError`, whose ``problems``
attribute has every line. Click commands get the ``--config`` option and the
"flags override the file" rule from :func:`config_option` and
:func:`config_from_click`, which print the lines and exit with status 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import click
import yaml

from streamrep.errors import ConfigError

__all__ = [
    "Address",
    "BackpressureConfig",
    "Config",
    "DEFAULT_DATABASE",
    "DEFAULT_INSTANCE",
    "DEFAULT_LISTEN",
    "FLAG_KEYS",
    "InstanceConfig",
    "KeepaliveConfig",
    "LoggingConfig",
    "RedisConfig",
    "TLSConfig",
    "check_ports",
    "config_from_click",
    "config_option",
    "exposure_problem",
    "is_loopback",
    "known_streams",
    "multi_writer_streams",
    "redis_url_for_display",
    "report_and_exit",
    "stream_catalogue",
    "load_config",
    "parse_address",
]

#: The hub's default listen address: loopback only, never all interfaces by default.
DEFAULT_LISTEN = "127.0.0.1:9092"
#: The embedded SQLite database in the working directory.
DEFAULT_DATABASE = "sqlite:///streamrep.db"
#: The hub's own instance name when none is configured.
DEFAULT_INSTANCE = "main"

#: Configuration keys that command-line flags set, by the flag's name.
FLAG_KEYS: Mapping[str, str] = MappingProxyType({
    "--server-name": "server_name",
    "--db": "database",
    "--listen": "listen",
    "--instance-name": "instance_name",
    "--metrics-listen": "metrics_listen",
    "--log-level": "logging.level",
    "--log-format": "logging.format",
    "--tls-cert": "tls.cert",
    "--tls-key": "tls.key",
    "--tls-ca": "tls.ca",
    "--require-client-cert": "tls.require_client_cert",
    "--shared-secret-file": "shared_secret_file",
    "--insecure": "insecure",
    "--redis": "replication.redis.url",
})
_FLAG_OF_KEY = {key: flag for flag, key in FLAG_KEYS.items()}

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LOG_FORMATS = ("logfmt", "json")


def stream_catalogue() -> dict[str, bool]:
    """Every stream ``stream_writers`` may name -> whether it may have several writers.

    The package's stream definitions (:mod:`streamrep.catalogue`) are the source: a
    stream whose IDs come from a PostgreSQL sequence may have several writers; the
    others have one.
    """
    from streamrep.catalogue import known_streams as stream_definitions

    return {d.name: d.sequence_name is not None for d in stream_definitions()}


def _writers_followed() -> dict[str, str]:
    """Stream -> the stream whose writers it has when ``stream_writers`` names none."""
    from streamrep.catalogue import known_streams as stream_definitions

    return {d.name: d.writers_follow for d in stream_definitions()
            if d.writers_follow is not None}


def known_streams() -> tuple[str, ...]:
    """Every stream name ``stream_writers`` may mention, sorted."""
    return tuple(sorted(stream_catalogue()))


def multi_writer_streams() -> tuple[str, ...]:
    """The streams that may have several writers (on PostgreSQL), sorted."""
    return tuple(sorted(name for name, multi in stream_catalogue().items() if multi))


# --- the typed configuration ---------------------------------------------------


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

    #: Commands queued for one connection before it is disconnected with ``ERROR``.
    max_queue: int = 10_000
    #: Longest accepted inbound line, in bytes.
    max_line_length: int = 1_048_576


@dataclass(frozen=True)
class RedisConfig:
    """Replication through Redis pub/sub instead of the hub (``replication.redis``)."""

    #: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` (TLS) or
    #: ``unix:///path/to/redis.sock``
    url: str


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
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: TLS on the replication port (off unless ``tls.cert`` is set).
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: The file holding the shared secret peers prove they know, if any.
    shared_secret_file: str | None = None
    #: Allow a non-loopback ``listen`` without TLS or a shared secret.
    insecure: bool = False
    #: Replication through Redis (``replication.redis``), None: through the hub.
    redis: RedisConfig | None = None
    #: Seconds a writer's lease lives without renewal (see streamrep.idgen.lease).
    writer_lease_ttl: float = 30.0
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


# --- parsing helpers -----------------------------------------------------------


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


class _Problems:
    """Collects one line per problem: ``config error: <key>: <what>; <fix>``."""

    def __init__(self, flag_keys: Mapping[str, str]) -> None:
        self.lines: list[str] = []
        self._flag_keys = flag_keys

    def add(self, key: str, what: str, fix: str) -> None:
        flag = self._flag_keys.get(key)
        where = f"{key} (from {flag})" if flag else key
        self.lines.append(f"config error: {where}: {what}; {fix}")


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f'did you mean "{close[0]}"?' if close else "fix the name"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (PyYAML keeps the
    last silently, which hides typos in long files)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode,
                              deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"key {key!r} appears twice (first on line {seen[key] + 1}); keep one",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _read_file(path: str, problems: _Problems) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError:
        problems.add("(file)", f"{path} does not exist", "give the path of an existing file")
        return None
    except (OSError, UnicodeDecodeError) as exc:
        problems.add("(file)", f"cannot read {path} ({exc})", "check the path and its permissions")
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else "?"
        what = " ".join(str(getattr(exc, "problem", None) or exc).split())
        problems.add("(file)", f"{path} is not valid YAML at {where}: {what}",
                     "fix the YAML syntax there")
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.add("(file)", f"{path} holds a {type(data).__name__}, not a mapping of keys",
                     "write it as `key: value` lines (see docs/examples/streamrep.yaml)")
        return None
    return data


def _set_dotted(data: dict[str, Any], key: str, value: object) -> None:
    parts = key.split(".")
    target = data
    for part in parts[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = {}
            target[part] = child
        target = child
    target[parts[-1]] = value


# --- validation ----------------------------------------------------------------

_TOP_KEYS = (
    "tls", "shared_secret_file", "insecure",
    "server_name", "database", "listen", "instance_name", "instance_map", "stream_writers",
    "metrics_listen", "keepalive", "backpressure", "logging", "replication",
    "writer_lease_ttl",
)
_REPLICATION_KEYS = ("redis",)
_REDIS_KEYS = ("url",)
_REDIS_SCHEMES = ("redis", "rediss", "unix")
_INSTANCE_KEYS = ("host", "port", "metrics_listen", "tls_cert", "tls_key")
_TLS_KEYS = ("cert", "key", "ca", "require_client_cert", "server_hostname")
_KEEPALIVE_KEYS = ("ping_interval", "timeout")
_BACKPRESSURE_KEYS = ("max_queue", "max_line_length")
_LOGGING_KEYS = ("level", "format")

_T = TypeVar("_T")


def _unknown_keys(section: Mapping[str, Any], allowed: Sequence[str], prefix: str,
                  problems: _Problems) -> None:
    for key in section:
        if key not in allowed:
            problems.add(f"{prefix}{key}", f"unknown key (known: {', '.join(allowed)})",
                         f"remove it or {_suggest(str(key), allowed)}")


def _section(data: Mapping[str, Any], key: str, problems: _Problems) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(key, f"expected a mapping, got {type(value).__name__}",
                     f"write {key}: followed by indented `name: value` lines")
        return {}
    return value


def _address(value: object, key: str, problems: _Problems, example: str) -> Address | None:
    if not isinstance(value, str):
        problems.add(key, f"expected HOST:PORT, got {value!r}", f"write it like {example}")
        return None
    try:
        return parse_address(value)
    except ValueError as exc:
        problems.add(key, f"{value!r} is not an address ({exc})", f"write it like {example}")
        return None


def _number(value: object, key: str, problems: _Problems, kind: type[_T], low: float,
            default: _T) -> _T:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and kind is int and not isinstance(value, int):
        ok = False
    if not ok or value <= low:  # type: ignore[operator]
        noun = "a whole number" if kind is int else "a number"
        problems.add(key, f"expected {noun} greater than {low:g}, got {value!r}",
                     f"set it to {noun} such as {default}")
        return default
    return kind(value)  # type: ignore[call-arg]


def _database(value: object, problems: _Problems) -> str:
    fix = "use sqlite:///PATH or postgresql://USER@HOST:PORT/DBNAME"
    if not isinstance(value, str) or not value:
        problems.add("database", f"expected a database URL, got {value!r}", fix)
        return DEFAULT_DATABASE
    scheme = value.partition(":")[0].lower()
    if scheme == "sqlite":
        if not value.startswith("sqlite:///") or len(value) <= len("sqlite:///"):
            problems.add("database", f"{value!r} has no file path",
                         "write sqlite:///relative/path.db or sqlite:////absolute/path.db")
    elif scheme in ("postgresql", "postgres"):
        if not value.startswith(f"{scheme}://"):
            problems.add("database", f"{value!r} is not a PostgreSQL URL", fix)
    else:
        problems.add("database", f"unsupported database scheme {scheme!r} in {value!r}", fix)
    return value


def redis_url_for_display(url: str) -> str:
    """*url* with its password (if any) replaced by ``***``."""
    from urllib.parse import urlsplit, urlunsplit

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


def _redis(data: Mapping[str, Any], problems: _Problems) -> RedisConfig | None:
    replication = _section(data, "replication", problems)
    _unknown_keys(replication, _REPLICATION_KEYS, "replication.", problems)
    raw = replication.get("redis") or {}
    if not isinstance(raw, dict):
        problems.add("replication.redis", f"expected a mapping, got {type(raw).__name__}",
                     "write `url: redis://HOST:PORT` indented under it")
        return None
    _unknown_keys(raw, _REDIS_KEYS, "replication.redis.", problems)
    if not raw:
        return None
    url = raw.get("url")
    shown = redis_url_for_display(url) if isinstance(url, str) else url
    fix = "write redis://[:PASSWORD@]HOST:PORT, rediss://... for TLS or unix:///PATH/redis.sock"
    if not isinstance(url, str) or not url:
        problems.add("replication.redis.url", f"expected a Redis URL, got {url!r}", fix)
        return None
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        problems.add("replication.redis.url", f"{shown!r} is not a Redis URL ({exc})", fix)
        return None
    if parts.scheme not in _REDIS_SCHEMES:
        problems.add("replication.redis.url", f"unsupported scheme {parts.scheme!r} in {shown!r}", fix)
    elif parts.scheme == "unix" and not parts.path:
        problems.add("replication.redis.url", f"{shown!r} names no socket path", fix)
    elif parts.scheme != "unix" and not parts.hostname:
        problems.add("replication.redis.url", f"{shown!r} names no host", fix)
    elif port == 0:
        problems.add("replication.redis.url", f"{shown!r} has port 0", fix)
    return RedisConfig(url=url)


def _path(value: object, key: str, problems: _Problems, example: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.add(key, f"expected a file path, got {value!r}", f"write it like {example}")
        return None
    return value


def _flag(value: object, key: str, problems: _Problems) -> bool:
    if not isinstance(value, bool):
        problems.add(key, f"expected true or false, got {value!r}", "write true or false")
        return False
    return value


def _tls(data: Mapping[str, Any], problems: _Problems) -> TLSConfig:
    raw = _section(data, "tls", problems)
    _unknown_keys(raw, _TLS_KEYS, "tls.", problems)
    if not raw:
        return TLSConfig()
    cert = _path(raw.get("cert"), "tls.cert", problems, "/etc/streamrep/hub.crt")
    key = _path(raw.get("key"), "tls.key", problems, "/etc/streamrep/hub.key")
    ca = _path(raw.get("ca"), "tls.ca", problems, "/etc/streamrep/ca.crt")
    require = _flag(raw.get("require_client_cert", False), "tls.require_client_cert", problems)
    hostname = raw.get("server_hostname")
    if hostname is not None and (not isinstance(hostname, str) or not hostname
                                 or any(c.isspace() for c in hostname)):
        problems.add("tls.server_hostname", f"{hostname!r} is not a host name",
                     "write the name the hub's certificate is issued for, such as hub.internal")
        hostname = None
    if cert is None or key is None:
        missing = [k for k, v in (("cert", cert), ("key", key)) if v is None]
        problems.add(f"tls.{missing[0]}", "missing, so the hub has no certificate to present",
                     "set tls.cert and tls.key to the hub's PEM certificate chain and key, "
                     "or remove the tls section")
    if require and ca is None:
        problems.add("tls.require_client_cert", "needs tls.ca, the authority that signs the "
                     "peers' certificates", "set tls.ca")
    return TLSConfig(cert, key, ca, require, hostname)


def exposure_problem(listen: Address, tls_enabled: bool, secret_configured: bool,
                     insecure: bool) -> str | None:
    """Why a hub listening on *listen* would be open to anyone, or None.

    A loopback address only accepts this machine's processes; any other needs TLS
    or the shared secret, unless *insecure* says a firewall already limits who can
    connect.
    """
    if is_loopback(listen) or tls_enabled or secret_configured or insecure:
        return None
    return (f"{listen} accepts connections from other machines, but neither tls nor "
            "shared_secret_file is set, so anyone who can reach it could read every stream "
            "and forge facts; set tls.cert and tls.key, or shared_secret_file, or "
            "`insecure: true` if a firewall already limits who can connect")


def _security(data: Mapping[str, Any], listen: Address | None,
              problems: _Problems) -> tuple[TLSConfig, str | None, bool]:
    """The ``tls`` section, ``shared_secret_file`` and ``insecure``; refuses a hub
    reachable from other machines with no protection."""
    from streamrep.shared_secret import SecretFileError, read_secret_file

    tls = _tls(data, problems)
    secret_file = _path(data.get("shared_secret_file"), "shared_secret_file", problems,
                        "/etc/streamrep/replication.secret")
    if secret_file is not None:
        try:
            read_secret_file(secret_file)
        except SecretFileError as exc:
            what, _, fix = str(exc).partition(": ")[2].partition("; ")
            problems.add("shared_secret_file", what, fix)
    insecure = _flag(data.get("insecure", False), "insecure", problems)
    if listen is not None:
        why = exposure_problem(listen, tls.enabled, secret_file is not None, insecure)
        if why is not None:
            problems.add("listen", *why.split("; ", 1))
    return tls, secret_file, insecure


def _validate(data: dict[str, Any], problems: _Problems, source: str | None) -> Config | None:
    _unknown_keys(data, _TOP_KEYS, "", problems)

    server_name = data.get("server_name")
    if server_name is None:
        problems.add("server_name", "missing", "add `server_name: example.com` "
                     "(the name workers check on connect) or pass --server-name")
    elif not isinstance(server_name, str) or not server_name.strip() or any(
            c.isspace() for c in server_name):
        problems.add("server_name", f"{server_name!r} is not a server name",
                     "use a name without spaces, such as example.com")

    database = _database(data.get("database", DEFAULT_DATABASE), problems)
    is_sqlite = database.lower().startswith("sqlite:")

    listen = _address(data.get("listen", DEFAULT_LISTEN), "listen", problems, DEFAULT_LISTEN)
    metrics_listen = None
    if data.get("metrics_listen") is not None:
        metrics_listen = _address(data["metrics_listen"], "metrics_listen", problems,
                                  "127.0.0.1:9100")

    instance_name = data.get("instance_name", DEFAULT_INSTANCE)
    if not isinstance(instance_name, str) or not instance_name or any(
            c.isspace() for c in instance_name):
        problems.add("instance_name", f"{instance_name!r} is not an instance name",
                     "use a name without spaces, such as main")
        instance_name = DEFAULT_INSTANCE

    # instance_map: name -> {host, port, metrics_listen}; the hub's instance is implied.
    instances: dict[str, InstanceConfig] = {}
    for name, entry in _section(data, "instance_map", problems).items():
        prefix = f"instance_map.{name}"
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            problems.add(prefix, f"{name!r} is not an instance name",
                         "use a name without spaces, such as writer1")
            continue
        if entry is None:
            entry = {}
        if not isinstance(entry, dict):
            problems.add(prefix, f"expected a mapping, got {entry!r}",
                         "write `{}` or host/port/metrics_listen keys under it")
            continue
        _unknown_keys(entry, _INSTANCE_KEYS, f"{prefix}.", problems)
        host = entry.get("host")
        if host is not None and (not isinstance(host, str) or not host):
            problems.add(f"{prefix}.host", f"{host!r} is not a host name",
                         "write a host name or IP address")
            host = None
        port = entry.get("port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 < port < 65536):
            problems.add(f"{prefix}.port", f"{port!r} is not a port",
                         "use a number from 1 to 65535")
            port = None
        inst_metrics = None
        if entry.get("metrics_listen") is not None:
            inst_metrics = _address(entry["metrics_listen"], f"{prefix}.metrics_listen",
                                    problems, "127.0.0.1:9101")
        instances[name] = InstanceConfig(
            name, host, port, inst_metrics,
            tls_cert=_path(entry.get("tls_cert"), f"{prefix}.tls_cert", problems,
                           f"/etc/streamrep/{name}.crt"),
            tls_key=_path(entry.get("tls_key"), f"{prefix}.tls_key", problems,
                          f"/etc/streamrep/{name}.key"))
        if (instances[name].tls_cert is None) != (instances[name].tls_key is None):
            problems.add(f"{prefix}.tls_key" if instances[name].tls_key is None
                         else f"{prefix}.tls_cert", "missing while the other is set",
                         "give tls_cert and tls_key together")
    if instance_name not in instances:
        instances[instance_name] = InstanceConfig(
            instance_name, listen.host if listen else None, listen.port if listen else None,
            metrics_listen)

    # stream_writers: stream -> [instance, ...]
    catalogue = stream_catalogue()
    streams = tuple(sorted(catalogue))
    writers: dict[str, tuple[str, ...]] = {}
    raw_writers = _section(data, "stream_writers", problems)
    for stream, names in raw_writers.items():
        key = f"stream_writers.{stream}"
        if stream not in streams:
            problems.add(key, f'unknown stream "{stream}" (known: {", ".join(streams)})',
                         _suggest(str(stream), streams))
            continue
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names:
            problems.add(key, f"expected a list of instance names, got {names!r}",
                         f"write {stream}: [{instance_name}]")
            continue
        good: list[str] = []
        for i, name in enumerate(names):
            if not isinstance(name, str) or name not in instances:
                problems.add(f"{key}[{i}]", f'unknown instance "{name}" (known: '
                             f'{", ".join(sorted(instances))})',
                             f"add it to instance_map or {_suggest(str(name), instances)}")
            elif name in good:
                problems.add(f"{key}[{i}]", f'"{name}" is listed twice', "list it once")
            else:
                good.append(name)
        if len(names) > 1 and not catalogue[stream]:
            problems.add(key, f"{len(names)} writers, but {stream} has exactly one writer",
                         "list one instance")
        elif len(names) > 1 and is_sqlite:
            problems.add(key, f"{len(names)} writers ({', '.join(map(str, names))}) on SQLite, "
                         "which supports one writer per stream",
                         "use a postgresql:// database or list one writer")
        writers[stream] = tuple(good)
    for stream in streams:
        writers.setdefault(stream, (instance_name,))
    # A stream written in another's transactions has that stream's single writer.
    for stream, followed in _writers_followed().items():
        if stream not in raw_writers and len(writers.get(followed, ())) == 1:
            writers[stream] = writers[followed]

    keepalive_raw = _section(data, "keepalive", problems)
    _unknown_keys(keepalive_raw, _KEEPALIVE_KEYS, "keepalive.", problems)
    keepalive = KeepaliveConfig(
        ping_interval=_number(keepalive_raw.get("ping_interval", 5.0), "keepalive.ping_interval",
                              problems, float, 0, 5.0),
        timeout=_number(keepalive_raw.get("timeout", 15.0), "keepalive.timeout",
                        problems, float, 0, 15.0),
    )
    if keepalive.timeout <= keepalive.ping_interval:
        problems.add("keepalive.timeout",
                     f"{keepalive.timeout:g}s is not longer than ping_interval "
                     f"({keepalive.ping_interval:g}s), so healthy peers would time out",
                     "make timeout about three times ping_interval")

    bp_raw = _section(data, "backpressure", problems)
    _unknown_keys(bp_raw, _BACKPRESSURE_KEYS, "backpressure.", problems)
    backpressure = BackpressureConfig(
        max_queue=_number(bp_raw.get("max_queue", 10_000), "backpressure.max_queue",
                          problems, int, 0, 10_000),
        max_line_length=_number(bp_raw.get("max_line_length", 1_048_576),
                                "backpressure.max_line_length", problems, int, 255, 1_048_576),
    )
    # A new connection's queue must hold the hub's answer to REPLICATE, which is
    # also how every catch-up ends: one POSITION per stream and writer, queued at
    # once after SERVER and PING. A smaller queue cuts every worker off at once.
    writer_pairs = sum(len(names) for names in writers.values())
    needed_queue = writer_pairs + 2
    if 0 < backpressure.max_queue < needed_queue:
        problems.add("backpressure.max_queue",
                     f"{backpressure.max_queue} is smaller than one catch-up must queue at once "
                     f"({needed_queue}: a POSITION for each of the {writer_pairs} stream writers, "
                     "SERVER and PING), so no worker could follow",
                     f"set it to at least {needed_queue} (default 10000)")

    log_raw = _section(data, "logging", problems)
    _unknown_keys(log_raw, _LOGGING_KEYS, "logging.", problems)
    level = log_raw.get("level", "INFO")
    if not isinstance(level, str) or level.upper() not in _LOG_LEVELS:
        problems.add("logging.level", f"{level!r} is not a log level",
                     f"use one of {', '.join(_LOG_LEVELS)}")
        level = "INFO"
    fmt = log_raw.get("format", "logfmt")
    if fmt not in _LOG_FORMATS:
        problems.add("logging.format", f"{fmt!r} is not a log format",
                     f"use one of {', '.join(_LOG_FORMATS)}")
        fmt = "logfmt"

    # Two processes cannot listen on one port.
    bound: dict[Address, str] = {}
    for key, addr in [("listen", listen), ("metrics_listen", metrics_listen)] + [
            (f"instance_map.{n}.metrics_listen", i.metrics_listen)
            for n, i in instances.items() if n != instance_name]:
        if addr is None:
            continue
        if addr in bound:
            problems.add(key, f"{addr} is also {bound[addr]}", "give each listener its own port")
        else:
            bound[addr] = key

    redis = _redis(data, problems)
    lease_ttl = _number(data.get("writer_lease_ttl", 30.0), "writer_lease_ttl", problems,
                        float, 1, 30.0)

    tls, shared_secret_file, insecure = _security(data, listen, problems)

    if problems.lines or listen is None or not isinstance(server_name, str):
        return None
    return Config(
        server_name=server_name,
        database=database,
        listen=listen,
        instance_name=instance_name,
        instance_map=MappingProxyType(instances),
        stream_writers=MappingProxyType(writers),
        metrics_listen=metrics_listen,
        keepalive=keepalive,
        backpressure=backpressure,
        logging=LoggingConfig(level=level.upper(), format=fmt),
        tls=tls,
        shared_secret_file=shared_secret_file,
        insecure=insecure,
        redis=redis,
        writer_lease_ttl=lease_ttl,
        source=source,
    )


# --- ports ---------------------------------------------------------------------


def _port_problem(addr: Address) -> str | None:
    """Why the hub could not listen on *addr*, or None if it could."""
    try:
        infos = socket.getaddrinfo(addr.host, addr.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"host {addr.host!r} does not resolve ({exc.strerror})"
    family, socktype, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        # The servers set SO_REUSEADDR too, so a port in TIME_WAIT is not "in use".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"{addr} is already in use by another process"
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"{addr.host} is not an address of this machine"
        if exc.errno == errno.EACCES:
            return f"no permission to listen on {addr}"
        return f"cannot listen on {addr} ({exc.strerror})"
    finally:
        sock.close()
    return None


def check_ports(config: Config, instance: str | None = None) -> None:
    """Raise :class:`ConfigError` if a port *instance* will listen on is taken.

    *instance* defaults to the hub's (its replication ``listen`` and ``metrics_listen``);
    another instance's are its ``instance_map`` ``metrics_listen``. Call it before
    starting anything, so a clash is one line rather than a traceback halfway up.
    """
    instance = instance or config.instance_name
    problems = _Problems({})
    checks: list[tuple[str, Address]] = []
    if instance == config.instance_name:
        checks.append(("listen", config.listen))
        if config.metrics_listen is not None:
            checks.append(("metrics_listen", config.metrics_listen))
    else:
        entry = config.instance_map.get(instance)
        if entry is not None and entry.metrics_listen is not None:
            checks.append((f"instance_map.{instance}.metrics_listen", entry.metrics_listen))
    for key, addr in checks:
        why = _port_problem(addr)
        if why is not None:
            flag = _FLAG_OF_KEY.get(key, "")
            fix = "stop the process using it or choose another port"
            problems.add(key, why, fix + (f" ({flag} HOST:PORT)" if flag else ""))
    if problems.lines:
        raise ConfigError("\n".join(problems.lines), tuple(problems.lines))


# --- the loader ----------------------------------------------------------------


def load_config(path: str | os.PathLike[str] | None,
                overrides: Mapping[str, object] | None = None,
                *, check_ports_of: str | None = None) -> Config:
    """Read, override and validate a configuration; raise ConfigError on any problem.

    *path* is a YAML file (None: defaults and *overrides* alone). *overrides* maps
    dotted keys (``"listen"``, ``"logging.level"``, see :data:`FLAG_KEYS`) to values
    from flags; ``None`` values are ignored, so optional flags can be passed as they
    are. With *check_ports_of*, the ports that instance will listen on are checked
    too (see :func:`check_ports`). Every problem is collected before raising.
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    problems = _Problems({k: _FLAG_OF_KEY.get(k, "") for k in overrides})
    source = os.fspath(path) if path is not None else None
    data: dict[str, Any] | None = {}
    if source is not None:
        data = _read_file(source, problems)
    config = None
    if data is not None:
        for key, value in overrides.items():
            _set_dotted(data, key, value)
        config = _validate(data, problems, source)
    if problems.lines or config is None:
        raise ConfigError("\n".join(problems.lines), tuple(problems.lines))
    if check_ports_of is not None:
        check_ports(config, check_ports_of)
    return config


# --- click helpers -------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def config_option(func: _F) -> _F:
    """Add ``--config FILE`` to a click command (the parameter is ``config_path``)."""
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), default=None,
        envvar="STREAMREP_CONFIG", show_envvar=True,
        help="YAML configuration file; flags given on the command line override it.",
    )(func)


def report_and_exit(exc: ConfigError) -> None:
    """Print every problem of *exc*, one line each, to stderr and exit with status 2."""
    for line in exc.problems:
        click.echo(line, err=True)
    sys.exit(2)


def config_from_click(ctx: click.Context, config_path: str | None,
                      flags: Mapping[str, str], *,
                      check_ports_of: str | None = None,
                      check_own_ports: bool = False) -> Config:
    """Build the Config for a click command: the file, overridden by flags.

    *flags* maps click parameter names to configuration keys, e.g.
    ``{"db": "database", "listen": "listen", "server_name": "server_name"}``. Without
    ``--config`` every flag value counts (its default included); with it, only flags
    actually given on the command line or in the environment override the file.
    On any problem it prints one line per problem and exits with status 2.
    *check_ports_of* names an instance whose listening ports must be free;
    *check_own_ports* checks those of the configuration's own ``instance_name``
    (what ``serve`` binds).
    """
    overrides: dict[str, object] = {}
    for param, key in flags.items():
        value = ctx.params.get(param)
        if config_path is not None:
            source = ctx.get_parameter_source(param)
            if source not in (click.core.ParameterSource.COMMANDLINE,
                              click.core.ParameterSource.ENVIRONMENT):
                continue
        overrides[key] = value
    try:
        config = load_config(config_path, overrides, check_ports_of=check_ports_of)
        if check_own_ports:
            check_ports(config, config.instance_name)
        return config
    except ConfigError as exc:
        report_and_exit(exc)
        raise  # unreachable: report_and_exit exits


def is_loopback(addr: Address) -> bool:
    """True when *addr* only accepts connections from this machine."""
    if addr.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.host).is_loopback
    except ValueError:
        return False
