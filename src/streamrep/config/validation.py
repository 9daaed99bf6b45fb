"""Validation of a parsed configuration file: one validator per section.

:func:`validate` takes the file's mapping (flags already applied) and the stream
definitions the deployment knows, and returns a :class:`Config`, or None after
reporting every problem to :class:`Problems`. Sections are checked in the file's
documented order, so the lines of one file always come out in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping
from urllib.parse import urlsplit

from streamrep.config.exposure import exposure_problem
from streamrep.config.fields import (
    address, database_url, flag, number, path, section, unknown_keys,
)
from streamrep.config.model import (
    DEFAULT_DATABASE, DEFAULT_INSTANCE, DEFAULT_LISTEN, Address, BackpressureConfig, Config,
    ConnectionsConfig, InstanceConfig, KeepaliveConfig, LoggingConfig, RedisConfig, TLSConfig,
    redis_url_for_display,
)
from streamrep.config.problems import Problems, suggest
from streamrep.config.synapse import SynapseConfig, load_synapse_config
from streamrep.errors import SynapseConfigError
from streamrep.shared_secret import SecretFileError, read_secret_file

if TYPE_CHECKING:
    from streamrep.streams.definition import StreamDefinition

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "StreamRules", "validate"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: ``verify_event_ids``: the modes of streamrep.events.verify.
VERIFY_MODES = ("strict", "warn", "off")
LOG_FORMATS = ("logfmt", "json")

_TOP_KEYS = (
    "tls", "shared_secret_file", "insecure",
    "server_name", "database", "listen", "instance_name", "instance_map", "stream_writers",
    "metrics_listen", "keepalive", "backpressure", "connections", "logging", "replication",
    "writer_lease_ttl", "verify_event_ids",
)
_REPLICATION_KEYS = ("redis", "synapse_config")
_REDIS_KEYS = ("url", "lines_per_message")
#: The most lines a Redis message may carry (a reader holds a whole message).
MAX_LINES_PER_MESSAGE = 1000
_REDIS_SCHEMES = ("redis", "rediss", "unix")
_INSTANCE_KEYS = ("host", "port", "metrics_listen", "tls_cert", "tls_key")
_TLS_KEYS = ("cert", "key", "ca", "require_client_cert", "server_hostname")
_KEEPALIVE_KEYS = ("ping_interval", "timeout")
_BACKPRESSURE_KEYS = ("max_queue", "max_line_length", "max_queue_bytes")
_CONNECTIONS_KEYS = ("max", "max_per_host", "max_pending", "max_pending_per_host",
                     "handshake_timeout", "idle_timeout")
_LOGGING_KEYS = ("level", "format")


@dataclass(frozen=True)
class StreamRules:
    """What ``stream_writers`` may say about the streams a deployment knows."""

    #: stream -> whether it may have several writers (its IDs come from a sequence)
    multi_writer: Mapping[str, bool]
    #: stream -> the stream whose writers it has when ``stream_writers`` names none
    writers_follow: Mapping[str, str]

    @classmethod
    def of(cls, definitions: Iterable["StreamDefinition"]) -> StreamRules:
        """The rules of these stream definitions."""
        defs = list(definitions)
        return cls({d.name: d.sequence_name is not None for d in defs},
                   {d.name: d.writers_follow for d in defs if d.writers_follow is not None})


@dataclass(frozen=True)
class _Identity:
    """The top-level keys: who the deployment is and where its hub listens."""

    server_name: object
    database: str
    listen: Address | None
    metrics_listen: Address | None
    instance_name: str


def _identity(data: Mapping[str, Any], problems: Problems) -> _Identity:
    server_name = data.get("server_name")
    if server_name is None:
        problems.add("server_name", "missing", "add `server_name: example.com` "
                     "(the name workers check on connect)" + problems.or_flag("server_name"))
    elif not isinstance(server_name, str) or not server_name.strip() or any(
            c.isspace() for c in server_name):
        problems.add("server_name", f"{server_name!r} is not a server name",
                     "use a name without spaces, such as example.com")
    database = database_url(data.get("database", DEFAULT_DATABASE), problems)
    listen = address(data.get("listen", DEFAULT_LISTEN), "listen", problems, DEFAULT_LISTEN)
    metrics_listen = None
    if data.get("metrics_listen") is not None:
        metrics_listen = address(data["metrics_listen"], "metrics_listen", problems,
                                 "127.0.0.1:9100")
    instance_name = data.get("instance_name", DEFAULT_INSTANCE)
    if not isinstance(instance_name, str) or not instance_name or any(
            c.isspace() for c in instance_name):
        problems.add("instance_name", f"{instance_name!r} is not an instance name",
                     "use a name without spaces, such as main")
        instance_name = DEFAULT_INSTANCE
    return _Identity(server_name, database, listen, metrics_listen, instance_name)


def _instance_entry(name: str, entry: dict[str, Any], problems: Problems) -> InstanceConfig:
    """One ``instance_map`` entry: ``{host, port, metrics_listen, tls_cert, tls_key}``."""
    prefix = f"instance_map.{name}"
    unknown_keys(entry, _INSTANCE_KEYS, f"{prefix}.", problems)
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
        inst_metrics = address(entry["metrics_listen"], f"{prefix}.metrics_listen",
                               problems, "127.0.0.1:9101")
    instance = InstanceConfig(
        name, host, port, inst_metrics,
        tls_cert=path(entry.get("tls_cert"), f"{prefix}.tls_cert", problems,
                      f"/etc/streamrep/{name}.crt"),
        tls_key=path(entry.get("tls_key"), f"{prefix}.tls_key", problems,
                     f"/etc/streamrep/{name}.key"))
    if (instance.tls_cert is None) != (instance.tls_key is None):
        problems.add(f"{prefix}.tls_key" if instance.tls_key is None
                     else f"{prefix}.tls_cert", "missing while the other is set",
                     "give tls_cert and tls_key together")
    return instance


def _instance_map(data: Mapping[str, Any], identity: _Identity,
                  problems: Problems) -> dict[str, InstanceConfig]:
    """``instance_map``: name -> entry; the hub's own instance is implied."""
    instances: dict[str, InstanceConfig] = {}
    for name, entry in section(data, "instance_map", problems).items():
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
        instances[name] = _instance_entry(name, entry, problems)
    own, listen = identity.instance_name, identity.listen
    if own not in instances:
        instances[own] = InstanceConfig(
            own, listen.host if listen else None, listen.port if listen else None,
            identity.metrics_listen)
    return instances


def _writer_list(stream: str, names: object, instances: Mapping[str, InstanceConfig],
                 rules: StreamRules, identity: _Identity, problems: Problems) -> tuple[str, ...]:
    """The instances one ``stream_writers`` entry names (each known, each once)."""
    key = f"stream_writers.{stream}"
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names:
        problems.add(key, f"expected a list of instance names, got {names!r}",
                     f"write {stream}: [{identity.instance_name}]")
        return ()
    good: list[str] = []
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in instances:
            problems.add(f"{key}[{i}]", f'unknown instance "{name}" (known: '
                         f'{", ".join(sorted(instances))})',
                         f"add it to instance_map or {suggest(str(name), instances)}")
        elif name in good:
            problems.add(f"{key}[{i}]", f'"{name}" is listed twice', "list it once")
        else:
            good.append(name)
    if len(names) > 1 and not rules.multi_writer[stream]:
        problems.add(key, f"{len(names)} writers, but {stream} has exactly one writer",
                     "list one instance")
    elif len(names) > 1 and identity.database.lower().startswith("sqlite:"):
        problems.add(key, f"{len(names)} writers ({', '.join(map(str, names))}) on SQLite, "
                     "which supports one writer per stream",
                     "use a postgresql:// database or list one writer")
    return tuple(good)


def _stream_writers(data: Mapping[str, Any], instances: Mapping[str, InstanceConfig],
                    rules: StreamRules, identity: _Identity,
                    problems: Problems) -> dict[str, tuple[str, ...]]:
    """``stream_writers``: stream -> [instance, ...], for every known stream."""
    streams = tuple(sorted(rules.multi_writer))
    writers: dict[str, tuple[str, ...]] = {}
    raw_writers = section(data, "stream_writers", problems)
    for stream, names in raw_writers.items():
        if stream not in streams:
            problems.add(f"stream_writers.{stream}",
                         f'unknown stream "{stream}" (known: {", ".join(streams)})',
                         suggest(str(stream), streams))
            continue
        writers[stream] = _writer_list(stream, names, instances, rules, identity, problems)
    for stream in streams:
        writers.setdefault(stream, (identity.instance_name,))
    # A stream written in another's transactions has that stream's single writer.
    for stream, followed in rules.writers_follow.items():
        if stream not in raw_writers and len(writers.get(followed, ())) == 1:
            writers[stream] = writers[followed]
    return writers


def _keepalive(data: Mapping[str, Any], problems: Problems) -> KeepaliveConfig:
    raw = section(data, "keepalive", problems)
    unknown_keys(raw, _KEEPALIVE_KEYS, "keepalive.", problems)
    keepalive = KeepaliveConfig(
        ping_interval=number(raw.get("ping_interval", 5.0), "keepalive.ping_interval",
                             problems, float, 0, 5.0),
        timeout=number(raw.get("timeout", 15.0), "keepalive.timeout",
                       problems, float, 0, 15.0),
    )
    if keepalive.timeout <= keepalive.ping_interval:
        problems.add("keepalive.timeout",
                     f"{keepalive.timeout:g}s is not longer than ping_interval "
                     f"({keepalive.ping_interval:g}s), so healthy peers would time out",
                     "make timeout about three times ping_interval")
    return keepalive


def _backpressure(data: Mapping[str, Any], writers: Mapping[str, tuple[str, ...]],
                  problems: Problems) -> BackpressureConfig:
    raw = section(data, "backpressure", problems)
    unknown_keys(raw, _BACKPRESSURE_KEYS, "backpressure.", problems)
    backpressure = BackpressureConfig(
        max_queue=number(raw.get("max_queue", 1_000_000), "backpressure.max_queue",
                         problems, int, 0, 1_000_000),
        max_line_length=number(raw.get("max_line_length", 1_048_576),
                               "backpressure.max_line_length", problems, int, 255, 1_048_576),
        max_queue_bytes=number(raw.get("max_queue_bytes", 16 * 1024 * 1024),
                               "backpressure.max_queue_bytes", problems, int, 0, 16 * 1024 * 1024),
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
                     f"set it to at least {needed_queue} (default 1000000)")
    return backpressure


def _connections(data: Mapping[str, Any], problems: Problems) -> ConnectionsConfig:
    raw = section(data, "connections", problems)
    unknown_keys(raw, _CONNECTIONS_KEYS, "connections.", problems)
    defaults = ConnectionsConfig()
    total = number(raw.get("max", defaults.max), "connections.max", problems, int, 0, defaults.max)
    per_host = number(raw.get("max_per_host", defaults.max_per_host), "connections.max_per_host",
                      problems, int, 0, defaults.max_per_host)
    pending: dict[str, int | None] = {}
    # Pending peers are a share of every peer: a pending limit above the limit on
    # all peers would never close the oldest pending peer before refusing a writer.
    for key, default, ceiling, over in (("max_pending", 200, total, "max"),
                                        ("max_pending_per_host", 50, per_host, "max_per_host")):
        value = raw.get(key)
        if value is None:
            pending[key] = None
            continue
        pending[key] = number(value, f"connections.{key}", problems, int, 0, default)
        if pending[key] is not None and pending[key] > ceiling:  # type: ignore[operator]
            problems.add(f"connections.{key}", f"{pending[key]} is more than connections.{over} ({ceiling})",
                         f"set it to at most {ceiling}")
    return ConnectionsConfig(
        max=total,
        max_per_host=per_host,
        max_pending=pending["max_pending"],
        max_pending_per_host=pending["max_pending_per_host"],
        handshake_timeout=number(raw.get("handshake_timeout", defaults.handshake_timeout),
                                 "connections.handshake_timeout", problems, float, 0, defaults.handshake_timeout),
        idle_timeout=number(raw.get("idle_timeout", defaults.idle_timeout),
                            "connections.idle_timeout", problems, float, 0, defaults.idle_timeout),
    )


def _logging(data: Mapping[str, Any], problems: Problems) -> LoggingConfig:
    raw = section(data, "logging", problems)
    unknown_keys(raw, _LOGGING_KEYS, "logging.", problems)
    level = raw.get("level", "INFO")
    if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
        problems.add("logging.level", f"{level!r} is not a log level",
                     f"use one of {', '.join(LOG_LEVELS)}")
        level = "INFO"
    fmt = raw.get("format", "logfmt")
    if fmt not in LOG_FORMATS:
        problems.add("logging.format", f"{fmt!r} is not a log format",
                     f"use one of {', '.join(LOG_FORMATS)}")
        fmt = "logfmt"
    return LoggingConfig(level=level.upper(), format=fmt)


def _listener_clashes(identity: _Identity, instances: Mapping[str, InstanceConfig],
                      problems: Problems) -> None:
    """Two processes cannot listen on one port."""
    bound: dict[Address, str] = {}
    for key, addr in [("listen", identity.listen), ("metrics_listen", identity.metrics_listen)] + [
            (f"instance_map.{n}.metrics_listen", i.metrics_listen)
            for n, i in instances.items() if n != identity.instance_name]:
        if addr is None:
            continue
        if addr in bound:
            problems.add(key, f"{addr} is also {bound[addr]}", "give each listener its own port")
        else:
            bound[addr] = key


def _redis(data: Mapping[str, Any], problems: Problems) -> RedisConfig | None:
    """``replication.redis``: replicate through Redis pub/sub instead of the hub."""
    replication = section(data, "replication", problems)
    unknown_keys(replication, _REPLICATION_KEYS, "replication.", problems)
    raw = replication.get("redis") or {}
    if not isinstance(raw, dict):
        problems.add("replication.redis", f"expected a mapping, got {type(raw).__name__}",
                     "write `url: redis://HOST:PORT` indented under it")
        return None
    unknown_keys(raw, _REDIS_KEYS, "replication.redis.", problems)
    if not raw:
        return None
    url = raw.get("url")
    shown = redis_url_for_display(url) if isinstance(url, str) else url
    fix = "write redis://[:PASSWORD@]HOST:PORT, rediss://... for TLS or unix:///PATH/redis.sock"
    if not isinstance(url, str) or not url:
        problems.add("replication.redis.url", f"expected a Redis URL, got {url!r}", fix)
        return None
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
    lines = number(raw.get("lines_per_message", 1), "replication.redis.lines_per_message", problems, int, 0, 1)
    if lines > MAX_LINES_PER_MESSAGE:
        problems.add("replication.redis.lines_per_message", f"{lines} is more than {MAX_LINES_PER_MESSAGE}",
                     f"set it to at most {MAX_LINES_PER_MESSAGE} (100 passes a batch at nearly full speed)")
        lines = 1
    return RedisConfig(url=url, lines_per_message=lines)


def _synapse(data: Mapping[str, Any], redis: RedisConfig | None, problems: Problems) -> SynapseConfig | None:
    """``replication.synapse_config``: follow a reference deployment through its own
    ``homeserver.yaml`` (its Redis, its writers' HTTP API); read and checked now."""
    replication = data.get("replication")
    raw = replication.get("synapse_config") if isinstance(replication, dict) else None
    key = "replication.synapse_config"
    source = path(raw, key, problems, "/etc/matrix-synapse/homeserver.yaml")
    if source is None:
        return None
    if redis is not None:
        problems.add(key, "given with replication.redis (the homeserver's file names its Redis)",
                     "keep one of the two")
    try:
        synapse = load_synapse_config(source)
    except SynapseConfigError as exc:
        for line in exc.problems:
            what, _, fix = line.partition("; ")
            problems.add(key, what, fix or "fix the homeserver's file")
        return None
    if data.get("server_name") != synapse.server_name:
        problems.add("server_name", f"{data.get('server_name')!r} is not the homeserver's server name "
                     f"{synapse.server_name!r} ({source})", f"set it to {synapse.server_name}")
    return synapse


def _tls(data: Mapping[str, Any], problems: Problems) -> TLSConfig:
    raw = section(data, "tls", problems)
    unknown_keys(raw, _TLS_KEYS, "tls.", problems)
    if not raw:
        return TLSConfig()
    cert = path(raw.get("cert"), "tls.cert", problems, "/etc/streamrep/hub.crt")
    key = path(raw.get("key"), "tls.key", problems, "/etc/streamrep/hub.key")
    ca = path(raw.get("ca"), "tls.ca", problems, "/etc/streamrep/ca.crt")
    require = flag(raw.get("require_client_cert", False), "tls.require_client_cert", problems)
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


def _security(data: Mapping[str, Any], listen: Address | None,
              problems: Problems) -> tuple[TLSConfig, str | None, bool]:
    """The ``tls`` section, ``shared_secret_file`` and ``insecure``; refuses a hub
    reachable from other machines with no protection."""
    tls = _tls(data, problems)
    secret_file = path(data.get("shared_secret_file"), "shared_secret_file", problems,
                       "/etc/streamrep/replication.secret")
    if secret_file is not None:
        try:
            read_secret_file(secret_file)
        except SecretFileError as exc:
            what, _, fix = str(exc).partition(": ")[2].partition("; ")
            problems.add("shared_secret_file", what, fix)
    insecure = flag(data.get("insecure", False), "insecure", problems)
    if listen is not None:
        why = exposure_problem(listen, tls.enabled, secret_file is not None, insecure)
        if why is not None:
            problems.add("listen", *why.split("; ", 1))
    return tls, secret_file, insecure


def validate(data: Mapping[str, Any], rules: StreamRules, problems: Problems,
             source: str | None) -> Config | None:
    """The :class:`Config` of *data*, or None when a problem was reported."""
    unknown_keys(data, _TOP_KEYS, "", problems)
    identity = _identity(data, problems)
    instances = _instance_map(data, identity, problems)
    writers = _stream_writers(data, instances, rules, identity, problems)
    keepalive = _keepalive(data, problems)
    backpressure = _backpressure(data, writers, problems)
    connections = _connections(data, problems)
    logging = _logging(data, problems)
    _listener_clashes(identity, instances, problems)
    redis = _redis(data, problems)
    synapse = _synapse(data, redis, problems)
    lease_ttl = number(data.get("writer_lease_ttl", 30.0), "writer_lease_ttl", problems,
                       float, 1, 30.0)
    tls, shared_secret_file, insecure = _security(data, identity.listen, problems)
    verify = data.get("verify_event_ids", "warn")
    if verify not in VERIFY_MODES:
        problems.add("verify_event_ids", f"{verify!r} is not a verification mode",
                     f"use one of {', '.join(VERIFY_MODES)}")
    server_name = identity.server_name
    if problems.lines or identity.listen is None or not isinstance(server_name, str):
        return None
    return Config(
        server_name=server_name,
        database=identity.database,
        listen=identity.listen,
        instance_name=identity.instance_name,
        instance_map=MappingProxyType(instances),
        stream_writers=MappingProxyType(writers),
        metrics_listen=identity.metrics_listen,
        keepalive=keepalive,
        backpressure=backpressure,
        connections=connections,
        logging=logging,
        tls=tls,
        shared_secret_file=shared_secret_file,
        insecure=insecure,
        redis=redis,
        synapse=synapse,
        writer_lease_ttl=lease_ttl,
        verify_event_ids="strict" if verify == "strict" else "off" if verify == "off" else "warn",
        source=source,
    )
