"""A reference homeserver's ``homeserver.yaml``, read for following it
(``streamrep.config.synapse``), and ``tail --synapse-config`` refusing what it
cannot follow: one line naming the key and the fix, status 18 (4 for a file that
is not there)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml
from redis.connection import parse_url

from streamrep.catalogue import known_streams
from streamrep.cli.exits import ExitCode
from streamrep.config import load_config, load_synapse_config
from streamrep.errors import ConfigError, SynapseConfigError
from streamrep.replication import HttpSource, LinkSettings
from streamrep.replication.sources.http import WriterAddress


def _write(tmp_path: pathlib.Path, doc: Any, name: str = "homeserver.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return str(path)


MULTI_WRITER = {
    "server_name": "example.com",
    "pid_file": "/data/homeserver.pid",
    "listeners": [{"port": 8008, "type": "http", "resources": [{"names": ["client"]}]}],
    "redis": {"enabled": True, "host": "redis.internal", "port": 6380, "dbid": 2},
    "instance_map": {
        "main": {"host": "10.0.0.1", "port": 9093},
        "persister1": {"host": "10.0.0.2", "port": 9094, "tls": True},
        "persister2": {"path": "/run/synapse/persister2.sock"},
    },
    "stream_writers": {"events": ["persister1", "persister2"], "typing": "main"},
    "worker_replication_secret": "s3cret",
}


def test_a_multi_writer_deployment_is_read_whole(tmp_path: pathlib.Path) -> None:
    synapse = load_synapse_config(_write(tmp_path, MULTI_WRITER))
    assert synapse.server_name == "example.com"
    assert synapse.redis_url == "redis://redis.internal:6380/2"
    assert dict(synapse.stream_writers) == {"events": ("persister1", "persister2"), "typing": ("main",)}
    assert synapse.replication_secret == "s3cret" and synapse.notes == ()
    settings = LinkSettings.from_synapse(synapse, "indexer")
    assert (settings.redis_url, settings.server_name, settings.transport) == (
        "redis://redis.internal:6380/2", "example.com", "redis")
    source = HttpSource.from_synapse(synapse)
    assert source.writers == {"master": WriterAddress("10.0.0.1", 9093),
                              "persister1": WriterAddress("10.0.0.2", 9094, tls=True),
                              "persister2": WriterAddress(path="/run/synapse/persister2.sock")}
    assert source.secret == "s3cret"
    assert source.where("persister1") == "https://10.0.0.2:9094"


def test_redis_in_each_of_its_forms(tmp_path: pathlib.Path) -> None:
    (tmp_path / "redis.password").write_text("p@ss:w/rd\n")
    tls = load_synapse_config(_write(tmp_path, {
        "server_name": "example.com",
        "redis": {"enabled": True, "host": "redis.internal", "use_tls": True, "username": "synapse",
                  "password_path": str(tmp_path / "redis.password"), "ca_file": "/etc/ca.pem",
                  "certificate_file": "/etc/client.pem", "private_key_file": "/etc/client.key"}}))
    options = parse_url(tls.redis_url)
    assert tls.redis_url.startswith("rediss://")
    assert (options["host"], options["port"], options["username"], options["password"]) == (
        "redis.internal", 6379, "synapse", "p@ss:w/rd")
    assert (options["ssl_ca_certs"], options["ssl_certfile"], options["ssl_keyfile"]) == (
        "/etc/ca.pem", "/etc/client.pem", "/etc/client.key")
    unix = load_synapse_config(_write(tmp_path, {
        "server_name": "example.com",
        "redis": {"enabled": True, "path": "/run/redis/redis.sock", "dbid": 1, "password": "secret"}}))
    options = parse_url(unix.redis_url)
    assert (options["path"], options["db"], options["password"]) == ("/run/redis/redis.sock", 1, "secret")
    plain = load_synapse_config(_write(tmp_path, {"server_name": "example.com", "redis": {"enabled": True}}))
    assert plain.redis_url == "redis://localhost:6379"


def test_the_secret_from_its_file_and_writers_without_an_address(tmp_path: pathlib.Path) -> None:
    (tmp_path / "replication.secret").write_text("from-a-file")
    synapse = load_synapse_config(_write(tmp_path, {
        "server_name": "example.com", "redis": {"enabled": True},
        "instance_map": {"main": {"host": "127.0.0.1", "port": 9093}},
        "stream_writers": {"events": ["persister1"]},
        "worker_replication_secret_path": str(tmp_path / "replication.secret")}))
    assert synapse.replication_secret == "from-a-file"
    assert len(synapse.notes) == 1 and "instance_map has no entry for persister1" in synapse.notes[0]
    monolith = load_synapse_config(_write(tmp_path, {"server_name": "example.com", "redis": {"enabled": True}}))
    assert "instance_map has no entry for main" in monolith.notes[0]


@pytest.mark.parametrize("change, key, fix", [
    ({"redis": None}, "redis.enabled", "enable redis in homeserver.yaml"),
    ({"redis": {"enabled": False}}, "redis.enabled", "enable redis"),
    ({"server_name": None}, "server_name", "set it to the homeserver's server name"),
    ({"redis": {"enabled": True, "port": "six"}}, "redis.port", "write it like 6379"),
    ({"redis": {"enabled": True, "password": "a", "password_path": "/x"}}, "redis.password_path",
     "keep one of the two"),
    ({"redis": {"enabled": True, "username": "u"}}, "redis.username", "set redis.password"),
    ({"instance_map": {"main": {"host": "127.0.0.1"}}}, "instance_map.main", "write {host: HOST, port: PORT}"),
    ({"instance_map": {"main": {"host": "127.0.0.1", "port": 0}}}, "instance_map.main.port", "write it like"),
    ({"stream_writers": {"evnts": ["p1"]}}, "stream_writers.evnts", "fix the name"),
    ({"worker_replication_secret": None, "worker_replication_secret_path": "/no/such/secret"},
     "worker_replication_secret_path",
     "give a readable file"),
    ({"worker_replication_secret": 42}, "worker_replication_secret", "quote it"),
])
def test_each_problem_names_its_key_and_the_fix(tmp_path: pathlib.Path, change: dict[str, Any], key: str,
                                                fix: str) -> None:
    doc = {**MULTI_WRITER, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    path = _write(tmp_path, doc)
    with pytest.raises(SynapseConfigError) as refused:
        load_synapse_config(path)
    assert len(refused.value.problems) == 1, refused.value.problems
    line = refused.value.problems[0]
    assert line.startswith(f"{path}: {key}: ") and fix in line.partition("; ")[2], line


def test_a_secret_file_with_a_line_break_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "secret").write_text("s3cret\n")
    path = _write(tmp_path, {"server_name": "example.com", "redis": {"enabled": True},
                             "worker_replication_secret_path": str(tmp_path / "secret")})
    with pytest.raises(SynapseConfigError, match="holds a line break.*printf %s SECRET"):
        load_synapse_config(path)


def test_the_configuration_file_names_the_homeservers_file(tmp_path: pathlib.Path) -> None:
    homeserver = _write(tmp_path, MULTI_WRITER)
    config = load_config(_write(tmp_path, {"server_name": "example.com",
                                           "replication": {"synapse_config": homeserver}}, "streamrep.yaml"),
                         streams=known_streams())
    assert config.synapse is not None and config.synapse.redis_url == "redis://redis.internal:6380/2"
    settings = LinkSettings.from_config(config, "indexer")
    assert (settings.redis_url, settings.server_name) == ("redis://redis.internal:6380/2", "example.com")
    with pytest.raises(ConfigError) as refused:
        load_config(_write(tmp_path, {"server_name": "other.example",
                                      "replication": {"synapse_config": homeserver,
                                                      "redis": {"url": "redis://127.0.0.1:6379"}}},
                           "streamrep.yaml"), streams=known_streams())
    assert any("replication.synapse_config: given with replication.redis" in line
               for line in refused.value.problems)
    assert any(line.startswith("config error: server_name: 'other.example' is not the homeserver's")
               for line in refused.value.problems)


def _tail(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamrep", "tail", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, env=dict(os.environ))


def test_tail_refuses_a_homeserver_file_it_cannot_follow(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, {"server_name": "example.com", "redis": {"enabled": False}})
    done = _tail("--synapse-config", path, cwd=tmp_path)
    assert done.returncode == ExitCode.SYNAPSE_CONFIG, done.stderr
    assert done.stderr.count("\n") == 1 and "redis.enabled" in done.stderr and "enable redis" in done.stderr
    missing = _tail("--synapse-config", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert missing.returncode == ExitCode.BAD_PATH and "does not exist" in missing.stderr
    both = _tail("--synapse-config", _write(tmp_path, MULTI_WRITER), "--redis", "redis://127.0.0.1:1",
                 cwd=tmp_path)
    assert both.returncode == ExitCode.USAGE and "drop --redis" in both.stderr
