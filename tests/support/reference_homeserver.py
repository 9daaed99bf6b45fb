"""A real reference homeserver (matrix-synapse) for interop tests, in its own venv.

:func:`running_homeserver` generates a configuration (SQLite, HTTP bound to
127.0.0.1 on a free port, a second listener with the ``replication`` resource named
in ``instance_map`` as ``main``, a ``worker_replication_secret``, ``redis: enabled:
true`` pointing at the given Redis, registration through a shared secret, no
federation traffic, rate limits out of the way), starts the homeserver with the
reference's interpreter (:func:`support.reference.reference_python`) and stops it
afterwards. The :class:`Homeserver` it yields registers users and drives the client
API with the standard library's HTTP client (:class:`ClientApi`), and reads what the
server persisted from its database. The configuration, key generation and process
handling are shared with the multi-process deployment
(``support/reference_deployment.py``).
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
from typing import Any, Callable, Iterator
from urllib.parse import quote, urlsplit

import yaml

from support.redis_server import free_port

SHARED_SECRET = "streamrep-interop-secret"
#: The deployment's worker_replication_secret (its HTTP replication API asks for it).
REPLICATION_SECRET = "streamrep-replication-secret"


def _python() -> str:
    """The reference's interpreter (skips or fails the test when there is none)."""
    from support.reference import reference_python

    return reference_python()


class ClientApi:
    """The client API of a reference homeserver on 127.0.0.1:``port``, through the
    standard library's HTTP client."""

    server_name: str
    port: int

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
        digest = hmac.new(SHARED_SECRET.encode(), b"\x00".join(
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


@dataclass
class Homeserver(ClientApi):
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

    def stream_orderings(self) -> list[int]:
        """The ``events`` stream positions of every event the server persisted."""
        with contextlib.closing(sqlite3.connect(self.database, timeout=30)) as db:
            return [int(row[0]) for row in db.execute(
                "SELECT stream_ordering FROM events WHERE stream_ordering > 0 ORDER BY stream_ordering")]


def base_config(server_name: str, directory: str, redis_url: str,
                listeners: list[dict[str, Any]]) -> dict[str, Any]:
    """What every reference process of these tests is configured with, less its
    database and replication settings: keys in *directory*, Redis at *redis_url*,
    registration through :data:`SHARED_SECRET`, no federation traffic, rate limits
    out of the way."""
    redis = urlsplit(redis_url)
    return {
        "server_name": server_name,
        "pid_file": os.path.join(directory, "homeserver.pid"),
        "listeners": listeners,
        "log_config": os.path.join(directory, "log.yaml"),
        "media_store_path": os.path.join(directory, "media"),
        "signing_key_path": os.path.join(directory, "signing.key"),
        "registration_shared_secret": SHARED_SECRET,
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "redis": {"enabled": True, "host": redis.hostname or "127.0.0.1", "port": redis.port or 6379},
        "rc_message": {"per_second": 10000, "burst_count": 10000},
        "rc_presence": {"per_user": {"per_second": 10000, "burst_count": 10000}},
        "rc_registration": {"per_second": 10000, "burst_count": 10000},
        "rc_room_creation": {"per_second": 10000, "burst_count": 10000},
        "rc_login": {"address": {"per_second": 10000, "burst_count": 10000},
                     "account": {"per_second": 10000, "burst_count": 10000}},
    }


def http_listener(port: int, *resources: str) -> dict[str, Any]:
    """An HTTP listener on 127.0.0.1:*port* serving *resources* (``client``, ``replication``)."""
    return {"port": port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
            "x_forwarded": False, "resources": [{"names": list(resources), "compress": False}]}


def log_config(log_path: str) -> dict[str, Any]:
    """A logging configuration writing INFO and above to *log_path*."""
    return {
        "version": 1,
        "formatters": {"precise": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "formatter": "precise",
                              "filename": log_path}},
        "root": {"level": "INFO", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }


def write_yaml(path: str, content: dict[str, Any]) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(content, fh)
    return path


def generate_keys(python: str, config_path: str, timeout: float = 120.0) -> None:
    """The signing key the configuration at *config_path* names."""
    keys = subprocess.run([python, "-m", "synapse.app.homeserver", "-c", config_path, "--generate-keys"],
                          capture_output=True, text=True, timeout=timeout)
    assert keys.returncode == 0, keys.stderr[-2000:]


def start_process(python: str, app: str, configs: list[str], stdout_path: str) -> subprocess.Popen[bytes]:
    """``python -m APP -c CONFIG...`` with its output into *stdout_path*."""
    args = [python, "-m", app]
    for path in configs:
        args += ["-c", path]
    with open(stdout_path, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=os.path.dirname(stdout_path))


def wait_answers(process: subprocess.Popen[bytes], probe: Callable[[], Any], what: str,
                 logs: tuple[str, str], timeout: float = 120.0) -> None:
    """Until *probe* returns without an error; fails naming *what* with the end of
    *logs* (its output, its log) when *process* exits first or *timeout* passes."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with status {process.returncode}: " + tail_of(logs[0])
                                 + " | " + tail_of(logs[1]))
        try:
            probe()
            return
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not answer in {timeout:g}s: " + tail_of(logs[1])) from None
            time.sleep(0.2)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within *timeout* seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextlib.contextmanager
def running_homeserver(directory: str, redis_url: str, server_name: str,
                       timeout: float = 120.0) -> Iterator[Homeserver]:
    """A reference homeserver on SQLite replicating through the Redis at *redis_url*,
    its HTTP replication API on a listener of its own (``instance_map``'s ``main``)."""
    python = _python()
    os.makedirs(directory, exist_ok=True)
    port = free_port()
    replication_port = free_port()
    config = base_config(server_name, directory, redis_url,
                         [http_listener(port, "client", "media"), http_listener(replication_port, "replication")])
    config.update({
        "database": {"name": "sqlite3", "args": {"database": os.path.join(directory, "homeserver.db")}},
        "instance_map": {"main": {"host": "127.0.0.1", "port": replication_port}},
        "worker_replication_secret": REPLICATION_SECRET,
    })
    config_path = write_yaml(os.path.join(directory, "homeserver.yaml"), config)
    write_yaml(os.path.join(directory, "log.yaml"), log_config(os.path.join(directory, "homeserver.log")))
    generate_keys(python, config_path, timeout)
    stdout = os.path.join(directory, "stdout.log")
    process = start_process(python, "synapse.app.homeserver", [config_path], stdout)
    server = Homeserver(server_name, port, directory, process, replication_port)
    try:
        wait_answers(process, lambda: server.request("GET", "/_matrix/client/versions"),
                     "the reference homeserver", (stdout, server.log), timeout)
        yield server
    finally:
        stop_process(process)


def tail_of(path: str, lines: int = 15) -> str:
    """The last *lines* lines of the file at *path*, on one line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return " | ".join(fh.read().splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no {path})"
