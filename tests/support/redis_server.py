"""Finding (or starting) a Redis server for the tests.

``STREAMREP_TEST_REDIS`` names the server (default ``redis://127.0.0.1:6379``). If
nothing answers there and the ``redis-server`` binary is installed, a throwaway
server is started on a free port. Otherwise the tests that need Redis are skipped
with the reason, unless ``STREAMREP_REQUIRE_REDIS=1`` (CI sets it), which turns a
missing server into a failure.

Tests that kill or reconfigure Redis always get a server of their own
(:class:`RedisServer`), never the shared one. Tests sharing a server keep apart by
using a server name (the Redis channel) of their own.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence

import pytest

DEFAULT_URL = "redis://127.0.0.1:6379"


def _required() -> bool:
    return os.environ.get("STREAMREP_REQUIRE_REDIS", "") not in ("", "0")


def _unavailable(why: str) -> None:
    if _required():
        pytest.fail(f"STREAMREP_REQUIRE_REDIS is set but {why}", pytrace=False)
    pytest.skip(why)


def answers(url: str, timeout: float = 2.0) -> str | None:
    """None when the Redis server at *url* answers PING, else why not."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError) as exc:
        return f"no Redis at {url}: {exc}"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unique_server_name(prefix: str = "test") -> str:
    """A server name (so a Redis channel) no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}.example"


class RedisServer:
    """A ``redis-server`` of the test's own on 127.0.0.1, killable and restartable on
    the same port. Nothing is persisted: a restart starts empty, like a crash."""

    def __init__(self, binary: str, port: int | None = None, *extra: str,
                 password: str | None = None, tls: tuple[str, str, str] | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.extra = list(extra)
        self.password = password
        #: (CA certificate, server certificate, server key): TLS only, on ``port``
        self.tls = tls
        self.dir = tempfile.mkdtemp(prefix="streamrep-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password is not None else ""
        if self.tls is not None:
            return f"rediss://{auth}127.0.0.1:{self.port}?ssl_ca_certs={self.tls[0]}"
        return f"redis://{auth}127.0.0.1:{self.port}"

    @property
    def unix_socket(self) -> str:
        return os.path.join(self.dir, "redis.sock")

    def start(self, timeout: float = 10.0) -> None:
        log = open(os.path.join(self.dir, "redis.log"), "ab")
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            ca, cert, key = self.tls
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert,
                     "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
        if self.password is not None:
            ports += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            [self.binary, *ports, "--bind", "127.0.0.1", "--save", "", "--unixsocket", self.unix_socket,
             "--appendonly", "no", "--dir", self.dir, *self.extra],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with status {self.process.returncode}; "
                                   f"see {self.dir}/redis.log")
            if answers(self.url, 0.5) is None:
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout:g}s")

    def log(self) -> str:
        """What the server logged so far."""
        with open(os.path.join(self.dir, "redis.log"), encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def kill(self) -> None:
        """SIGKILL: no goodbye to any client."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_binary() -> str:
    """The ``redis-server`` binary; skips (or fails) the test when there is none."""
    found = shutil.which("redis-server")
    if found is None:
        _unavailable("the redis-server binary is not installed")
    assert found is not None
    return found


def own_redis_server(*extra: str, password: str | None = None,
                     tls: tuple[str, str, str] | None = None) -> RedisServer:
    """A started :class:`RedisServer` with *extra* ``redis-server`` arguments."""
    server = RedisServer(redis_binary(), None, *extra, password=password, tls=tls)
    server.start()
    return server


_shared: RedisServer | None = None


def shared_redis_url() -> str:
    """``STREAMREP_TEST_REDIS`` when it answers, else a throwaway server kept for
    the session; skips (or fails) when neither is possible."""
    global _shared
    url = os.environ.get("STREAMREP_TEST_REDIS") or DEFAULT_URL
    why = answers(url)
    if why is None:
        return url
    if _shared is None:
        if shutil.which("redis-server") is None:
            _unavailable(f"{why}, and the redis-server binary is not installed")
        _shared = own_redis_server()
        import atexit

        atexit.register(_shared.stop)
    return _shared.url


def wait_subscribed(url: str, channel: str, subscribers: int, timeout: float = 60.0,
                    logs: Sequence[pathlib.Path] = ()) -> None:
    """Wait until *channel* has at least *subscribers* subscribers; on failure, say
    how many there were and what the subscribing processes logged (*logs*)."""
    import redis

    client = redis.Redis.from_url(url)
    seen = 0
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = dict(client.pubsub_numsub(channel)).get(channel.encode(), 0)
            if seen >= subscribers:
                return
            time.sleep(0.05)
    finally:
        client.close()
    said = "".join(f"\n--- {path.name}:\n{path.read_text(errors='replace') if path.exists() else '(none)'}"
                   for path in logs)
    raise AssertionError(f"{subscribers} subscribers did not appear on {channel} in {timeout:g}s "
                         f"({seen} did){said}")


def deployment_database(url: str, server_name: str) -> str:
    """Make sure the deployment's database exists and belongs to *server_name*, as its
    hub or first writer leaves it: readers are given an existing database."""
    from streamrep.db import deployment, open_database

    db = open_database(url)
    try:
        deployment.claim(db, server_name)
    finally:
        db.close()
    return url
