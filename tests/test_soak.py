"""A soak of a few minutes: the whole deployment under load, faults and attacks.

``streamrep serve`` (the shared secret on), two ``streamrep write`` processes on
SQLite, three workers in this process (two filling gaps from the database, one
resuming through the hub) whose connections are cut at random, and a hostile
peer that holds the secret cycling through the attacks the hub must survive:
forged rows, the hub impersonated, a poisoned position, 12,000 fake writers, a
trickling peer, a huge partial line, a batch flood, a wrong proof. The hub is
killed with SIGKILL twice and started again. At the end every fact in the
database reached every worker exactly once, and the last hub's resident memory
is within 10% of what it was once warmed up.

Marked ``slow``; it takes about two minutes, at most three
(``STREAMREP_SOAK_SECONDS`` sets the writing time, default 75).
"""

from __future__ import annotations

import os
import pathlib
import random
import secrets
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any, Callable, Iterator

import gevent
import gevent.event
import pytest
from gevent import socket as gsocket

from streamrep.catalogue import known_streams
from streamrep.db import open_database
from streamrep.demo.processes import free_port
from streamrep.replication import ConnectionSettings
from streamrep.replication.handshake import proof
from streamrep.replication.sources.database import DatabaseSource
from streamrep.replication.security import PeerSecurity
from streamrep.shared_secret import read_secret_file
from streamrep.streams import Streams
from support.replication import tcp_link, wait_until

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("STREAMREP_SOAK_SECONDS", "75"))
SERVER = "soak.example"
#: (instance, stream, facts per second, rows per fact)
WRITERS = [("writer1", "caches", 120, 1), ("writer2", "to_device", 60, 3)]
FOLLOWED = [stream for _, stream, _, _ in WRITERS]
SETTINGS = ConnectionSettings(ping_interval=1.0, ping_timeout=4.0)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("STREAMREP_CONFIG", None)
    return env


class Child:
    """A streamrep subprocess (output to a log file), driven without blocking the loop."""

    def __init__(self, args: list[str], cwd: pathlib.Path, log: str, stdout: pathlib.Path | None = None) -> None:
        self.log_path = cwd / log
        self._log = open(self.log_path, "wb")
        self._out = open(stdout, "wb") if stdout is not None else None
        self.proc = subprocess.Popen([sys.executable, "-m", "streamrep", *args], cwd=cwd, env=_env(),
                                     stdout=self._out if self._out is not None else self._log, stderr=self._log)

    def wait(self, timeout: float) -> int | None:
        with gevent.Timeout(timeout, False):
            while self.proc.poll() is None:
                gevent.sleep(0.05)
        return self.proc.poll()

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        code = self.wait(timeout)
        if code is None:
            self.proc.kill()
            code = self.wait(5)
        self._log.close()
        if self._out is not None:
            self._out.close()
        return code

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Worker:
    """A replication client in this process counting every fact it is handed."""

    def __init__(self, name: str, port: int, secret: bytes, db_url: str | None,
                 writers: dict[str, list[str]]) -> None:
        self.name = name
        self.seen: Counter[tuple[str, str, int]] = Counter()
        self.database = self.streams = None
        source = None
        if db_url is not None:
            self.database = open_database(db_url)
            self.streams = Streams(self.database, name, writers, definitions=known_streams())
            source = DatabaseSource(self.streams, FOLLOWED)
        self.client = tcp_link(port, name, server_name=SERVER, handler=self.handle,
            source=source, streams=FOLLOWED, start_from={s: 0 for s in FOLLOWED},
            settings=SETTINGS, security=PeerSecurity(secret=secret))

    def handle(self, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        self.seen[(stream, instance, token)] += 1

    def close(self) -> None:
        self.client.stop()
        if self.streams is not None:
            self.streams.close()
        if self.database is not None:
            self.database.close()


# --- the hostile peer ------------------------------------------------------------------


class Hostile:
    """Connects to the hub, proves the secret (an insider), and misbehaves."""

    def __init__(self, port: int, secret: bytes) -> None:
        self.port = port
        self.secret = secret
        self.attacks = 0
        self._sockets: list[gsocket.socket] = []

    def _connect(self) -> gsocket.socket:
        # Every socket is closed after its attack, even one the hub's death cut short.
        sock = gsocket.create_connection(("127.0.0.1", self.port), timeout=5)
        self._sockets.append(sock)
        return sock

    def _open(self, name: str, prove: bool = True) -> gsocket.socket:
        sock = self._connect()
        buf = b""
        while buf.count(b"\n") < 2:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("hub closed during the greeting")
            buf += chunk
        nonce = buf.split(b"\n")[1].split(b" ")[1].decode()
        mine = secrets.token_hex(32)
        key = self.secret if prove else b"x" * 32
        answer = proof(key, b"peer", SERVER, name, nonce, mine)
        sock.sendall(f"AUTH_RESPONSE {name} {mine} {answer}\n".encode())
        return sock

    @staticmethod
    def _drain(sock: gsocket.socket, seconds: float) -> None:
        sock.settimeout(0.2)
        with gevent.Timeout(seconds, False):
            while True:
                try:
                    if not sock.recv(65536):
                        return
                except (TimeoutError, gsocket.timeout):
                    continue
                except OSError:
                    return

    def forged_rows(self) -> None:
        sock = self._open("evil")
        sock.sendall(b'NAME evil\nRDATA caches writer1 999999 ["get_user_by_id",["@x:y"],1]\n')
        self._drain(sock, 1)
        sock.close()

    def impersonate_hub(self) -> None:
        sock = self._open("main")
        sock.sendall(b"NAME main\nRDATA caches main 1 [\"f\",null,1]\n")
        self._drain(sock, 1)
        sock.close()

    def poisoned_position(self) -> None:
        sock = self._open("writer1")
        sock.sendall(b"NAME writer1\nPOSITION caches writer1 105 9000000000000000000\n")
        self._drain(sock, 1)
        sock.close()

    def fake_writers(self) -> None:
        sock = self._open("evil")
        sock.sendall(b"NAME evil\n" + b"".join(b"POSITION caches evil%d 0 1\n" % n
                                                for n in range(12_000)))
        self._drain(sock, 1)
        sock.close()

    def trickle(self) -> None:
        sock = self._connect()
        for byte in b"PING 1\n":
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            gevent.sleep(0.3)
        sock.close()

    def huge_partial_line(self) -> None:
        sock = self._open("evil")
        chunk = b"NAME evil\nRDATA caches evil 1 [" + b"1," * 100_000
        try:
            for _ in range(20):
                sock.sendall(chunk)
        except OSError:
            pass
        self._drain(sock, 0.5)
        sock.close()

    def batch_flood(self) -> None:
        sock = self._open("writer2")
        row = b'RDATA to_device writer2 batch ["@flood:x"]\n'
        try:
            sock.sendall(b"NAME writer2\n")
            for _ in range(200):
                sock.sendall(row * 1000)
        except OSError:
            pass
        self._drain(sock, 0.5)
        sock.close()

    def wrong_proof(self) -> None:
        sock = self._open("writer1", prove=False)
        sock.sendall(b"NAME writer1\n")
        self._drain(sock, 1)
        sock.close()

    def garbage(self) -> None:
        sock = self._connect()
        sock.sendall(b"\x00\xff not a command\r\nRDATA\n")
        self._drain(sock, 0.5)
        sock.close()

    def run(self, stop: gevent.event.Event) -> None:
        cycle: list[Callable[[], None]] = [
            self.forged_rows, self.impersonate_hub, self.poisoned_position, self.fake_writers,
            self.trickle, self.huge_partial_line, self.batch_flood, self.wrong_proof, self.garbage,
        ]
        while not stop.is_set():
            for attack in cycle:
                if stop.is_set():
                    return
                try:
                    attack()
                    self.attacks += 1
                except (OSError, ConnectionError):
                    gevent.sleep(0.2)  # the hub is down (killed): try the next one later
                finally:
                    for sock in self._sockets:
                        sock.close()
                    self._sockets.clear()


# --- the soak ----------------------------------------------------------------------------


@pytest.fixture
def deployment(tmp_path: pathlib.Path) -> Iterator[tuple[pathlib.Path, int, bytes]]:
    secret_path = tmp_path / "replication.secret"
    secret_path.write_text(secrets.token_hex(32) + "\n")
    secret_path.chmod(0o600)
    port = free_port()
    config = tmp_path / "streamrep.yaml"
    config.write_text(textwrap.dedent(f"""\
        server_name: {SERVER}
        database: sqlite:///{tmp_path}/soak.db
        listen: 127.0.0.1:{port}
        instance_map: {{main: {{}}, writer1: {{}}, writer2: {{}}}}
        stream_writers: {{caches: [writer1], to_device: [writer2]}}
        shared_secret_file: {secret_path}
        keepalive: {{ping_interval: 1, timeout: 4}}
        """))
    yield config, port, read_secret_file(str(secret_path))


def _start_hub(config: pathlib.Path, port: int, n: int) -> Child:
    hub = Child(["serve", "--config", str(config)], config.parent, f"hub-{n}.log")
    wait_until(lambda: _listening(port) or hub.proc.poll() is not None, timeout=60, step=0.1)
    assert hub.proc.poll() is None, hub.log_path.read_text()
    return hub


def _listening(port: int) -> bool:
    try:
        gsocket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_soak(deployment: tuple[pathlib.Path, int, bytes]) -> None:
    config, port, secret = deployment
    tmp = config.parent
    db_url = f"sqlite:///{tmp}/soak.db"
    stream_writers = {stream: [instance] for instance, stream, _, _ in WRITERS}
    hub = _start_hub(config, port, 1)
    workers = [Worker("soakworker1", port, secret, db_url, stream_writers),
               Worker("soakworker2", port, secret, db_url, stream_writers),
               Worker("soakworker3", port, secret, None, stream_writers)]
    stop = gevent.event.Event()
    hostile = Hostile(port, secret)
    greenlets: list[gevent.Greenlet] = []
    writers: list[Child] = []
    try:
        for worker in workers:
            worker.client.start()
        for worker in workers:
            assert worker.client.wait_connected(30), worker.name
        for instance, stream, rate, rows in WRITERS:
            writers.append(Child(
                ["write", "--config", str(config), "--instance-name", instance, "--stream", stream,
                 "--count", str(int(rate * SECONDS)), "--rate", str(rate),
                 "--rows-per-fact", str(rows), "--announce-timeout", "60"],
                tmp, f"{instance}.log"))
        rng = random.Random(17)

        def cut_connections() -> None:
            while not stop.is_set():
                gevent.sleep(rng.uniform(1.0, 4.0))
                conn = rng.choice(workers).client.connection
                if conn is not None and not conn.closed:
                    conn.close("local_close")

        greenlets = [gevent.spawn(cut_connections), gevent.spawn(hostile.run, stop)]
        # SIGKILL the hub twice while everything runs, and start it again.
        for n in (2, 3):
            gevent.sleep(SECONDS * 0.2)
            hub.stop(signal.SIGKILL)
            hub = _start_hub(config, port, n)
        gevent.sleep(15)  # warm up: reconnections, catch-ups, a cycle of attacks
        warm_rss = hub.rss()
        for child in writers:
            assert child.wait(SECONDS * 2 + 120) == 0, child.log_path.read_text()[-2000:]
        final_rss = hub.rss()
        stop.set()
        gevent.joinall(greenlets, timeout=10)

        truth = _facts_in_database(db_url, stream_writers)
        assert truth and sum(len(t) for t in truth.values()) >= 0.9 * SECONDS * sum(
            rate for _, _, rate, _ in WRITERS)
        expected = {(s, i, t) for (s, i), tokens in truth.items() for t in tokens}
        with gevent.Timeout(45, False):
            while not all(expected <= set(w.seen) for w in workers):
                gevent.sleep(0.1)
        gevent.sleep(1)  # anything late (and wrong) would arrive now
        problems = []
        for worker in workers:
            lost = expected - set(worker.seen)
            duplicated = {k: n for k, n in worker.seen.items() if n > 1}
            unexpected = set(worker.seen) - expected
            if lost or duplicated or unexpected:
                problems.append((worker.name, f"{len(lost)} lost {sorted(lost)[:5]}",
                                 f"{len(duplicated)} duplicated {sorted(duplicated.items())[:5]}",
                                 f"{len(unexpected)} unexpected {sorted(unexpected)[:5]}"))
        if hostile.attacks < 9:
            problems.append(("the hostile peer did not get through one cycle", hostile.attacks))
        # Memory: the last hub, from warmed up to the end, under the same attacks.
        if final_rss > warm_rss * 1.10:
            problems.append(("hub RSS grew more than 10%", warm_rss, final_rss))
        assert problems == [], (problems, {"warm_rss": warm_rss, "final_rss": final_rss,
                                           "attacks": hostile.attacks})
        assert hub.stop() == 0
    finally:
        stop.set()
        gevent.killall(greenlets, timeout=5)
        for worker in workers:
            worker.close()
        for child in writers:
            child.stop()
        hub.stop()


def _facts_in_database(db_url: str, stream_writers: dict[str, list[str]]) -> dict[tuple[str, str], list[int]]:
    database = open_database(db_url)
    streams = Streams(database, "soakcheck", stream_writers, definitions=known_streams())
    try:
        source = DatabaseSource(streams, FOLLOWED)
        out: dict[tuple[str, str], list[int]] = {}
        for instance, stream, _, _ in WRITERS:
            upto = source.current_token(stream, instance)
            rows, _ = source.updates(stream, instance, 0, upto, 10_000_000)
            out[(stream, instance)] = sorted({token for token, _ in rows})
        return out
    finally:
        streams.close()
        database.close()


# --- the same over Redis -------------------------------------------------------------------


def test_soak_over_redis(tmp_path: pathlib.Path) -> None:
    """Two ``streamrep write --redis`` processes and four ``streamrep tail --redis``
    readers on a Redis of the test's own, while a hostile client publishes forged
    rows, forged positions and garbage on the channel, one reader is stopped (SIGSTOP)
    until Redis cuts it off for falling behind, and Redis is SIGKILLed twice and
    started again empty. Every reader with the database prints every fact exactly once;
    the reader without it never prints one twice, and says so if it missed any."""
    import orjson
    import redis as redis_py

    from support.redis_server import deployment_database, own_redis_server, wait_subscribed

    seconds = SECONDS * 0.6
    redis_server = own_redis_server("--client-output-buffer-limit", "pubsub 512kb 256kb 5")
    db_url = deployment_database(f"sqlite:///{tmp_path}/soak.db", SERVER)
    url = redis_server.url
    readers: dict[str, Child] = {}
    writers: list[Child] = []
    stop = gevent.event.Event()
    forger: gevent.Greenlet | None = None
    try:
        for name, with_db in (("db1", True), ("db2", True), ("slow", True), ("nodb", False)):
            args = ["tail", "--redis", url, "--server-name", SERVER, "--name", name]
            readers[name] = Child(args + (["--db", db_url] if with_db else []), tmp_path, f"{name}.log",
                                  stdout=tmp_path / f"{name}.out")
        wait_subscribed(url, SERVER, len(readers), logs=[r.log_path for r in readers.values()])
        for instance, stream, rate, rows in WRITERS:
            writers.append(Child(
                ["write", "--redis", url, "--server-name", SERVER, "--db", db_url, "--instance-name", instance,
                 "--stream", stream, "--count", str(int(rate * seconds)), "--rate", str(rate),
                 "--rows-per-fact", str(rows), "--announce-timeout", "60"], tmp_path, f"{instance}.log"))

        def forge() -> None:
            rng = random.Random(5)
            while not stop.is_set():
                gevent.sleep(0.5)
                try:
                    client = redis_py.Redis.from_url(url, socket_timeout=1)
                    token = rng.randrange(10**6, 10**7)
                    client.publish(SERVER, f'RDATA caches writer1 {token} ["forged",["@evil:x"],1]')
                    client.publish(SERVER, f"POSITION to_device writer2 {token} {token + 5}")
                    client.publish(SERVER, "RDATA caches writer1 garbage")
                    client.close()
                except redis_py.RedisError:
                    pass  # Redis is being restarted

        forger = gevent.spawn(forge)
        for fraction in (0.3, 0.6):
            gevent.sleep(seconds * 0.3)
            if fraction == 0.3:
                readers["slow"].proc.send_signal(signal.SIGSTOP)
            redis_server.kill()
            gevent.sleep(2)
            redis_server.start()
            if fraction == 0.3:
                gevent.sleep(6)
                readers["slow"].proc.send_signal(signal.SIGCONT)
        for child in writers:
            assert child.wait(seconds * 2 + 120) == 0, child.log_path.read_text()[-2000:]
        stop.set()

        stream_writers = {stream: [instance] for instance, stream, _, _ in WRITERS}
        truth = _facts_in_database(db_url, stream_writers)
        expected = {(s, i, t) for (s, i), tokens in truth.items() for t in tokens}

        def printed(name: str) -> Counter[tuple[str, str, int]]:
            seen: list[tuple[str, str, int]] = []
            for line in (tmp_path / f"{name}.out").read_bytes().splitlines():
                item = orjson.loads(line)
                key = (item["stream"], item["instance"], item["token"])
                if not seen or seen[-1] != key:
                    seen.append(key)
            return Counter(seen)

        with gevent.Timeout(60, False):
            while not all(expected <= set(printed(n)) for n in ("db1", "db2", "slow")):
                gevent.sleep(0.2)
        gevent.sleep(1)
        problems = []
        for name in readers:
            seen = printed(name)
            duplicated = {k: n for k, n in seen.items() if n > 1}
            unexpected = set(seen) - expected
            lost = expected - set(seen)
            if name == "nodb":
                # Without a database a reader cannot tell a forged row from a real one
                # (what protects it is a Redis ACL, tested on its own): the forger's rows
                # are the only ones it may print that were never committed.
                unexpected = {key for key in unexpected if key[2] < 10**6}
            if duplicated or unexpected:
                problems.append((name, f"{len(duplicated)} duplicated", f"{len(unexpected)} unexpected"))
            if lost and (name != "nodb" or "missed facts" not in readers[name].log_path.read_text()):
                problems.append((name, f"{len(lost)} lost {sorted(lost)[:5]}"))
        assert problems == [], problems
        assert "Redis refused" not in "".join(r.log_path.read_text() for r in readers.values())
        refusals = readers["db1"].log_path.read_text()
        assert "token" in refusals and "is past what the database holds" in refusals, refusals[-2000:]
    finally:
        stop.set()
        if forger is not None:
            forger.kill()
        for child in list(readers.values()) + writers:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGCONT)
            child.stop()
        redis_server.stop()
