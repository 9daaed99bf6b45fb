"""A reference homeserver's own configuration (``homeserver.yaml``), read for following it.

A deployment of the reference implementation (matrix-synapse) that replicates
through Redis describes everything a follower needs in the file its processes
share: the server's name (also the Redis channel), the ``redis`` section, where
each process's replication listener is (``instance_map``; the main process is
``main`` there and ``master`` on the wire), which process writes which stream
(``stream_writers``) and the secret their HTTP replication API asks for
(``worker_replication_secret`` or ``worker_replication_secret_path``)::

    server_name: example.com
    redis: {enabled: true, host: 127.0.0.1, port: 6379}
    instance_map:
      main: {host: 127.0.0.1, port: 9093}
      persister1: {host: 127.0.0.1, port: 9094}
    stream_writers: {events: [persister1]}
    worker_replication_secret_path: /etc/matrix/replication.secret

:func:`load_synapse_config` reads those keys (the others are the homeserver's
business and are left alone) into a :class:`SynapseConfig`, reading the files the
``*_path`` keys name, or raises :class:`~streamrep.errors.SynapseConfigError`
with one line per problem, naming the key and the fix. Pure parsing: nothing is
contacted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping
from urllib.parse import quote, urlencode

import yaml

from streamrep.errors import SynapseConfigError

__all__ = ["SynapseConfig", "SynapseInstance", "SynapseRedis", "load_synapse_config", "MAIN_KEY"]

#: The main process's key in ``instance_map`` (``master`` on the wire).
MAIN_KEY = "main"

#: What ``stream_writers`` may name (the reference's writer types).
_WRITER_TYPES = ("events", "typing", "to_device", "account_data", "receipts", "presence", "push_rules",
                 "device_lists", "thread_subscriptions", "quarantined_media_changes")


@dataclass(frozen=True)
class SynapseRedis:
    """The ``redis`` section: where the deployment's Redis is."""

    host: str = "localhost"
    port: int = 6379
    #: a Unix socket instead of host and port
    path: str | None = None
    dbid: int | None = None
    username: str | None = None
    password: str | None = None
    use_tls: bool = False
    certificate_file: str | None = None
    private_key_file: str | None = None
    ca_file: str | None = None
    ca_path: str | None = None

    def url(self) -> str:
        """The Redis URL of this section (``redis://``, ``rediss://`` or ``unix://``)."""
        query: dict[str, str] = {}
        if self.path is not None:
            if self.dbid is not None:
                query["db"] = str(self.dbid)
            if self.username is not None:
                query["username"] = self.username
            if self.password is not None:
                query["password"] = self.password
            return f"unix://{quote(self.path)}" + (f"?{urlencode(query)}" if query else "")
        credentials = ""
        if self.password is not None:
            credentials = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        for key, value in (("ssl_certfile", self.certificate_file), ("ssl_keyfile", self.private_key_file),
                           ("ssl_ca_certs", self.ca_file), ("ssl_ca_path", self.ca_path)):
            if self.use_tls and value is not None:
                query[key] = value
        scheme = "rediss" if self.use_tls else "redis"
        database = f"/{self.dbid}" if self.dbid is not None else ""
        return f"{scheme}://{credentials}{host}:{self.port}{database}" + (f"?{urlencode(query)}" if query else "")


@dataclass(frozen=True)
class SynapseInstance:
    """An ``instance_map`` entry: a process's replication listener, *host* and
    *port* (``https`` with *tls*) or a Unix socket *path*."""

    host: str | None = None
    port: int | None = None
    tls: bool = False
    path: str | None = None


@dataclass(frozen=True)
class SynapseConfig:
    """What a follower takes from a reference homeserver's configuration file."""

    server_name: str
    redis: SynapseRedis
    #: name (as in the file: ``main`` for the main process) -> its listener
    instance_map: Mapping[str, SynapseInstance] = field(default_factory=dict)
    #: writer type -> the instances writing it (``master`` when the file names none)
    stream_writers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the secret of the HTTP replication API (None: none is set)
    replication_secret: str | None = None
    #: the file it came from
    source: str = ""
    #: what works but deserves a word (writers with no instance_map entry, ...)
    notes: tuple[str, ...] = ()

    @property
    def redis_url(self) -> str:
        return self.redis.url()


class _Problems:
    """One line per problem: ``<file>: <key>: <what>; <fix>``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []

    def add(self, key: str, what: str, fix: str) -> None:
        self.lines.append(f"{self.source}: {key}: {what}; {fix}")


def load_synapse_config(path: str) -> SynapseConfig:
    """Read the keys of a reference ``homeserver.yaml`` a follower needs (see the
    module docstring); :class:`SynapseConfigError` lists every problem."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise SynapseConfigError(f"{path} does not exist; give the homeserver's configuration file "
                                 "(the one its processes are started with, -c)", file_problem=True) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SynapseConfigError(f"cannot read {path} ({exc}); check the path and its permissions",
                                 file_problem=True) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else "?"
        raise SynapseConfigError(f"{path}: not valid YAML at {where}: "
                                 f"{' '.join(str(getattr(exc, 'problem', None) or exc).split())}; "
                                 "fix the YAML syntax there") from None
    problems = _Problems(path)
    if not isinstance(data, dict):
        problems.add("(file)", "not a mapping of keys", "give the homeserver's homeserver.yaml")
        raise SynapseConfigError("\n".join(problems.lines), tuple(problems.lines))
    config = _read(data, path, problems)
    if problems.lines or config is None:
        raise SynapseConfigError("\n".join(problems.lines), tuple(problems.lines))
    return config


def _read(data: Mapping[str, Any], source: str, problems: _Problems) -> SynapseConfig | None:
    server_name = data.get("server_name")
    if not isinstance(server_name, str) or not server_name:
        problems.add("server_name", f"missing or not a name ({server_name!r})",
                     "set it to the homeserver's server name, as its processes have it")
    redis = _redis(data.get("redis"), problems)
    instances = _instance_map(data.get("instance_map"), problems)
    writers = _stream_writers(data.get("stream_writers"), problems)
    secret = _secret(data, problems)
    if problems.lines or redis is None or not isinstance(server_name, str):
        return None
    return SynapseConfig(server_name, redis, MappingProxyType(instances), MappingProxyType(writers), secret,
                         source, _notes(instances, writers))


def _text(raw: Mapping[str, Any], key: str, prefix: str, problems: _Problems, example: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.add(f"{prefix}{key}", f"expected text, got {value!r}", f"write it like {example}")
        return None
    return value


def _integer(raw: Mapping[str, Any], key: str, prefix: str, problems: _Problems, example: int,
             low: int = 0, high: int = 65535) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        problems.add(f"{prefix}{key}", f"expected a whole number from {low} to {high}, got {value!r}",
                     f"write it like {example}")
        return None
    return value


def _boolean(raw: Mapping[str, Any], key: str, prefix: str, problems: _Problems) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        problems.add(f"{prefix}{key}", f"expected true or false, got {value!r}", "write true or false")
        return False
    return value


def _read_file(path: str, key: str, problems: _Problems) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        problems.add(key, f"cannot read {path} ({getattr(exc, 'strerror', None) or exc})",
                     "give a readable file, or the value itself in the key without _path")
        return None


def _redis(raw: object, problems: _Problems) -> SynapseRedis | None:
    """The ``redis`` section; following needs ``enabled: true``."""
    if not isinstance(raw, dict) or raw.get("enabled") is not True:
        problems.add("redis.enabled", "the homeserver does not replicate through Redis (redis.enabled is not "
                     "true), and streamrep follows a Matrix deployment through its Redis",
                     "enable redis in homeserver.yaml (the deployment's workers need it too)")
        return None
    host = _text(raw, "host", "redis.", problems, "127.0.0.1") or "localhost"
    port = _integer(raw, "port", "redis.", problems, 6379, 1)
    path = _text(raw, "path", "redis.", problems, "/run/redis/redis.sock")
    dbid = _integer(raw, "dbid", "redis.", problems, 0, 0, 1 << 30)
    username = _text(raw, "username", "redis.", problems, "synapse")
    password = raw.get("password")
    if password is not None and not isinstance(password, str):
        problems.add("redis.password", f"expected text, got {type(password).__name__}", "quote the password")
        password = None
    password_path = _text(raw, "password_path", "redis.", problems, "/etc/matrix/redis.password")
    if password_path is not None:
        if password:
            problems.add("redis.password_path", "given with redis.password", "keep one of the two")
        else:
            read = _read_file(password_path, "redis.password_path", problems)
            password = read.strip() if read is not None else None
    if username is not None and password is None:
        problems.add("redis.username", "given without a password", "set redis.password or redis.password_path")
    files = {key: _text(raw, key, "redis.", problems, f"/etc/matrix/{key}.pem")
             for key in ("certificate_file", "private_key_file", "ca_file", "ca_path")}
    return SynapseRedis(host, port if port is not None else 6379, path, dbid, username, password,
                        _boolean(raw, "use_tls", "redis.", problems), files["certificate_file"],
                        files["private_key_file"], files["ca_file"], files["ca_path"])


def _section(raw: object, key: str, problems: _Problems, example: str) -> dict[Any, Any]:
    """The mapping under *key* (empty when absent or not a mapping)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add(key, f"expected a mapping, got {type(raw).__name__}", f"write `{example}` indented under it")
        return {}
    return raw


def _instance_map(raw: object, problems: _Problems) -> dict[str, SynapseInstance]:
    """``instance_map``: each process's replication listener."""
    instances: dict[str, SynapseInstance] = {}
    for name, entry in _section(raw, "instance_map", problems, "main: {host: ..., port: ...}").items():
        key = f"instance_map.{name}"
        if not isinstance(entry, dict):
            problems.add(key, f"expected a mapping, got {entry!r}", "write {host: HOST, port: PORT} or {path: SOCKET}")
            continue
        if "path" in entry:
            path = _text(entry, "path", f"{key}.", problems, "/run/synapse/main.sock")
            if path is not None:
                instances[str(name)] = SynapseInstance(path=path)
            continue
        host = _text(entry, "host", f"{key}.", problems, "127.0.0.1")
        port = _integer(entry, "port", f"{key}.", problems, 9093, 1)
        if host is None or port is None:
            if "host" not in entry or "port" not in entry:
                problems.add(key, "needs host and port (or path)", "write {host: HOST, port: PORT} of its "
                             "replication listener")
            continue
        instances[str(name)] = SynapseInstance(host, port, _boolean(entry, "tls", f"{key}.", problems))
    return instances


def _stream_writers(raw: object, problems: _Problems) -> dict[str, tuple[str, ...]]:
    """``stream_writers``: writer type -> instances (one name or a list)."""
    writers: dict[str, tuple[str, ...]] = {}
    for kind, names in _section(raw, "stream_writers", problems, "events: [persister1, persister2]").items():
        key = f"stream_writers.{kind}"
        if kind not in _WRITER_TYPES:
            problems.add(key, f"not a writer type of the reference (known: {', '.join(_WRITER_TYPES)})",
                         "fix the name")
            continue
        listed = [names] if isinstance(names, str) else names
        if not isinstance(listed, list) or not listed or not all(isinstance(n, str) and n for n in listed):
            problems.add(key, f"expected an instance name or a list of them, got {names!r}",
                         "write [persister1, persister2]")
            continue
        writers[str(kind)] = tuple(listed)
    return writers


def _secret(data: Mapping[str, Any], problems: _Problems) -> str | None:
    """``worker_replication_secret`` or the file ``worker_replication_secret_path`` names."""
    secret = data.get("worker_replication_secret")
    path = data.get("worker_replication_secret_path")
    if secret is not None and not isinstance(secret, str):
        problems.add("worker_replication_secret", f"expected text, got {type(secret).__name__}", "quote it")
        return None
    if path is None:
        return secret or None
    if secret:
        problems.add("worker_replication_secret_path", "given with worker_replication_secret",
                     "keep one of the two")
        return None
    if not isinstance(path, str) or not path:
        problems.add("worker_replication_secret_path", f"expected a file path, got {path!r}",
                     "write it like /etc/matrix/replication.secret")
        return None
    read = _read_file(path, "worker_replication_secret_path", problems)
    if read is not None and any(c in read for c in "\r\n"):
        # The writers take the file as it is, line end included, and an HTTP header
        # cannot carry one: no request could ever match.
        problems.add("worker_replication_secret_path", f"{path} holds a line break (the writers compare the "
                     "whole file)", f"write the secret without one, e.g. printf %s SECRET > {path}")
        return None
    return read or None


def _notes(instances: Mapping[str, SynapseInstance], writers: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Writers whose gaps cannot be fetched: no ``instance_map`` entry."""
    notes = []
    named = {MAIN_KEY if name in ("master", MAIN_KEY) else name
             for names in writers.values() for name in names}
    named.add(MAIN_KEY)
    missing = sorted(name for name in named if name not in instances)
    if missing:
        notes.append(f"instance_map has no entry for {', '.join(missing)}: the facts such a writer "
                     "published while the follower was away cannot be fetched (each gap is said and counted); "
                     "add its replication listener to instance_map")
    return tuple(notes)
