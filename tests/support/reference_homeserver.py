"""A real reference homeserver (matrix-synapse) for interop tests, in its own venv.

:func:`running_homeserver` generates a configuration (SQLite, HTTP bound to
127.0.0.1 on a free port, a second listener with the ``replication`` resource named
in ``instance_map`` as ``main``, a ``worker_replication_secret``, ``redis: enabled:
true`` pointing at the given Redis, registration through a shared secret, no
federation traffic, rate limits out of the way), starts the homeserver with the reference's interpreter
(:func:`support.reference.reference_python`) and stops it afterwards. The
:class:`Homeserver` it yields registers users and drives the client API with the
standard library's HTTP client, and reads what the server persisted from its
database.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import quote, urlsplit

import yaml

from support.redis_server import free_port

_SECRET = "streamrep-interop-secret"
#: The deployment's worker_replication_secret (its HTTP replication API asks for it).
REPLICATION_SECRET = "streamrep-replication-secret"


def _python() -> str:
    """The reference's interpreter (skips or fails the test when there is none)."""
    from support.reference import reference_python

    return reference_python()


@dataclass
class Homeserver:
    """A running reference homeserver."""

    server_name: str
    port: int
    directory: str
    process: subprocess.Popen[bytes]
    #: the listener with the replication resource (instance_map's main)
    replication_port: int = 0

    @property
    def config_path(self) -> str:
        """The homeserver.yaml it runs with (what a follower reads)."""
        return os.path.join(self.directory, "homeserver.yaml")

    @property
    def database(self) -> str:
        return os.path.join(self.directory, "homeserver.db")

    @property
    def log(self) -> str:
        return os.path.join(self.directory, "homeserver.log")

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}") from None

    def register(self, localpart: str, admin: bool = False) -> str:
        """Register *localpart* (a server admin if *admin*) through the shared
        secret; return an access token."""
        nonce = self.request("GET", "/_synapse/admin/v1/register")["nonce"]
        password = uuid.uuid4().hex
        # The reference's shared-secret MAC: HMAC-SHA1 of the NUL-separated fields.
        digest = hmac.new(_SECRET.encode(), b"\x00".join(
            p.encode() for p in (nonce, localpart, password, "admin" if admin else "notadmin")),
            hashlib.sha1).hexdigest()
        answer = self.request("POST", "/_synapse/admin/v1/register", {
            "nonce": nonce, "username": localpart, "password": password, "admin": admin,
            "mac": digest})
        return str(answer["access_token"])

    def upload(self, token: str, data: bytes) -> str:
        """Upload *data* as a text file; return its media ID."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/_matrix/media/v3/upload?filename=f.txt",
                                     data=data, method="POST")
        req.add_header("Content-Type", "text/plain")
        req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return str(json.loads(resp.read())["content_uri"]).rsplit("/", 1)[1]

    def create_room(self, token: str) -> str:
        return str(self.request("POST", "/_matrix/client/v3/createRoom", {"preset": "private_chat"},
                                token)["room_id"])

    def send_message(self, token: str, room_id: str, text: str) -> str:
        txn = uuid.uuid4().hex
        path = f"/_matrix/client/v3/rooms/{quote(room_id)}/send/m.room.message/{txn}"
        return str(self.request("PUT", path, {"msgtype": "m.text", "body": text}, token)["event_id"])

    def stream_orderings(self) -> list[int]:
        """The ``events`` stream positions of every event the server persisted."""
        with contextlib.closing(sqlite3.connect(self.database, timeout=30)) as db:
            return [int(row[0]) for row in db.execute(
                "SELECT stream_ordering FROM events WHERE stream_ordering > 0 ORDER BY stream_ordering")]


def _config(server_name: str, directory: str, port: int, redis_url: str, replication_port: int) -> dict[str, Any]:
    redis = urlsplit(redis_url)
    return {
        "server_name": server_name,
        "pid_file": os.path.join(directory, "homeserver.pid"),
        "listeners": [{"port": port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                       "x_forwarded": False, "resources": [{"names": ["client", "media"], "compress": False}]},
                      {"port": replication_port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
                       "resources": [{"names": ["replication"], "compress": False}]}],
        "instance_map": {"main": {"host": "127.0.0.1", "port": replication_port}},
        "worker_replication_secret": REPLICATION_SECRET,
        "database": {"name": "sqlite3", "args": {"database": os.path.join(directory, "homeserver.db")}},
        "log_config": os.path.join(directory, "log.yaml"),
        "media_store_path": os.path.join(directory, "media"),
        "signing_key_path": os.path.join(directory, "signing.key"),
        "registration_shared_secret": _SECRET,
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "redis": {"enabled": True, "host": redis.hostname or "127.0.0.1", "port": redis.port or 6379},
        "rc_message": {"per_second": 10000, "burst_count": 10000},
        "rc_presence": {"per_user": {"per_second": 10000, "burst_count": 10000}},
        "rc_registration": {"per_second": 10000, "burst_count": 10000},
        "rc_login": {"address": {"per_second": 10000, "burst_count": 10000},
                     "account": {"per_second": 10000, "burst_count": 10000}},
    }


def _log_config(directory: str) -> dict[str, Any]:
    return {
        "version": 1,
        "formatters": {"precise": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "formatter": "precise",
                              "filename": os.path.join(directory, "homeserver.log")}},
        "root": {"level": "INFO", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }


@contextlib.contextmanager
def running_homeserver(directory: str, redis_url: str, server_name: str,
                       timeout: float = 120.0) -> Iterator[Homeserver]:
    """A reference homeserver replicating through the Redis at *redis_url*."""
    python = _python()
    os.makedirs(directory, exist_ok=True)
    port = free_port()
    replication_port = free_port()
    config_path = os.path.join(directory, "homeserver.yaml")
    with open(config_path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(_config(server_name, directory, port, redis_url, replication_port), fh)
    with open(os.path.join(directory, "log.yaml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(_log_config(directory), fh)
    keys = subprocess.run([python, "-m", "synapse.app.homeserver", "-c", config_path, "--generate-keys"],
                          capture_output=True, text=True, timeout=timeout)
    assert keys.returncode == 0, keys.stderr[-2000:]
    with open(os.path.join(directory, "stdout.log"), "wb") as out:
        process = subprocess.Popen([python, "-m", "synapse.app.homeserver", "-c", config_path],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=directory)
    server = Homeserver(server_name, port, directory, process, replication_port)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the reference homeserver exited with status {process.returncode}: "
                                     + _tail(os.path.join(directory, "stdout.log")))
            try:
                server.request("GET", "/_matrix/client/versions")
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise AssertionError("the reference homeserver did not answer in "
                                         f"{timeout:g}s: " + _tail(server.log)) from None
                time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return " | ".join(fh.read().splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no {path})"
