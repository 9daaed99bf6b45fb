"""A multi-process reference deployment (matrix-synapse, its own venv, never imported)
on PostgreSQL, for the interop tests that follow more than one writer.

:func:`running_deployment` makes a fresh PostgreSQL database (C collation, as the
reference requires), starts a Redis of the test's own and then the processes, each
with the reference's interpreter:

* ``main`` (``synapse.app.homeserver``): the client API and a ``replication`` listener;
* ``p1`` and ``p2`` (``synapse.app.generic_worker``): the two event persisters
  (``stream_writers: {events: [p1, p2]}``), each with a ``replication`` listener.

They share one ``homeserver.yaml`` (``instance_map`` with all three,
``worker_replication_secret`` set, Redis); each worker has a file of its own on top.
A process is ready when its listeners answer and it has sent ``REPLICATE`` on Redis.
The :class:`Deployment` drives the client API through main (as
:class:`support.reference_homeserver.ClientApi`), stops and restarts main alone or
every process, and fetches what a writer serves over its HTTP replication API.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit

import pytest

from support.redis_server import RedisServer, free_port, own_redis_server, unique_server_name
from support.reference_homeserver import (REPLICATION_SECRET, ClientApi, base_config, generate_keys,
                                          http_listener, log_config, start_process, stop_process, tail_of,
                                          wait_answers, write_yaml)
from support.replication_truth import served_rows

#: The event persisters, in the order ``stream_writers`` names them.
PERSISTERS = ("p1", "p2")
#: Every process; ``main`` is the name ``instance_map`` knows the main process by.
PROCESSES = ("main", *PERSISTERS)
#: What the main process calls itself in replication commands (``instance_map`` says ``main``).
MAIN_INSTANCE = "master"
#: What a reference process logs once it has asked for everyone's positions on Redis.
_REPLICATE_SENT = "REPLICATE successfully sent"


@dataclass
class Deployment(ClientApi):
    """A running multi-process reference deployment."""

    server_name: str
    #: main's client API
    port: int
    directory: str
    redis: RedisServer
    #: a DSN of the reference's own database, to read what it persisted
    database_dsn: str
    python: str
    #: the HTTP replication port of each process, by its ``instance_map`` name
    replication_ports: dict[str, int]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def config_path(self) -> str:
        """The ``homeserver.yaml`` every process reads (main reads nothing else)."""
        return os.path.join(self.directory, "homeserver.yaml")

    def log(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.log")

    def _stdout(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.stdout.log")

    def writer_url(self, instance: str) -> str:
        """The HTTP replication base URL of the process whose replication instance name
        is *instance* (``master`` is main)."""
        name = "main" if instance == MAIN_INSTANCE else instance
        return f"http://127.0.0.1:{self.replication_ports[name]}"

    def served_rows(self, stream: str, instance: str, after: int, upto: int) -> list[tuple[int, bytes]]:
        """Every row of *stream* that writer *instance* serves over HTTP after token
        *after* up to *upto*, each as (token, canonical JSON)."""
        return served_rows(self.writer_url(instance), stream, after, upto, REPLICATION_SECRET)

    def events(self) -> list[tuple[int, str]]:
        """(stream ordering, writer) of every event the deployment persisted, in order."""
        import psycopg2

        with contextlib.closing(psycopg2.connect(self.database_dsn)) as conn, conn.cursor() as cur:
            cur.execute("SELECT stream_ordering, instance_name FROM events WHERE stream_ordering > 0 "
                        "ORDER BY stream_ordering")
            return [(int(so), str(name)) for so, name in cur.fetchall()]

    def writer_of_room(self, room_id: str) -> str:
        """The event persister that writes *room_id*'s events."""
        import psycopg2

        with contextlib.closing(psycopg2.connect(self.database_dsn)) as conn, conn.cursor() as cur:
            cur.execute("SELECT instance_name FROM events WHERE room_id = %s AND stream_ordering > 0 LIMIT 1",
                        (room_id,))
            found = cur.fetchone()
        assert found is not None, f"no event of {room_id} persisted"
        return str(found[0])

    def rooms_on_every_writer(self, token: str, per_writer: int = 1, limit: int = 40) -> dict[str, list[str]]:
        """Rooms created by the user of *token* until each persister writes at least
        *per_writer* of them (a room's writer follows from its ID): writer -> rooms."""
        rooms: dict[str, list[str]] = {name: [] for name in PERSISTERS}
        for _ in range(limit):
            if min(len(found) for found in rooms.values()) >= per_writer:
                return rooms
            room_id = self.create_room(token)
            rooms.setdefault(self.writer_of_room(room_id), []).append(room_id)
        raise AssertionError(f"{limit} rooms did not land on every writer: {rooms}")

    def replicates_sent(self, name: str) -> int:
        """How often process *name* has subscribed to Redis and sent ``REPLICATE`` so far."""
        try:
            with open(self.log(name), encoding="utf-8", errors="replace") as fh:
                return fh.read().count(_REPLICATE_SENT)
        except FileNotFoundError:
            return 0

    def wait_replicating(self, names: tuple[str, ...], before: dict[str, int], timeout: float = 120.0) -> None:
        """Until each process in *names* sent ``REPLICATE`` more often than *before* says."""
        deadline = time.monotonic() + timeout
        for name in names:
            while self.replicates_sent(name) <= before.get(name, 0):
                process = self.processes.get(name)
                if process is not None and process.poll() is not None:
                    raise AssertionError(f"{name} exited with status {process.returncode}: "
                                         + tail_of(self.log(name)))
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name} did not subscribe to Redis in {timeout:g}s: "
                                         + tail_of(self.log(name)))
                time.sleep(0.1)

    def _probe(self, name: str) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.replication_ports[name]}/health", timeout=5):
            pass
        if name == "main":
            self.request("GET", "/_matrix/client/versions")

    def start(self, names: tuple[str, ...] = PROCESSES, timeout: float = 180.0) -> None:
        """Start the processes in *names* (main first: it prepares the database) and
        wait until each answers on its listeners and has sent ``REPLICATE``."""
        before = {name: self.replicates_sent(name) for name in names}
        for name in sorted(names, key=PROCESSES.index):
            if name == "main":
                process = start_process(self.python, "synapse.app.homeserver", [self.config_path],
                                        self._stdout(name))
            else:
                process = start_process(self.python, "synapse.app.generic_worker",
                                        [self.config_path, os.path.join(self.directory, f"{name}.yaml")],
                                        self._stdout(name))
            self.processes[name] = process
            wait_answers(process, lambda: self._probe(name), f"reference process {name}",
                         (self._stdout(name), self.log(name)), timeout)
        self.wait_replicating(names, before, timeout)

    def stop(self, names: tuple[str, ...] = PROCESSES) -> None:
        """SIGTERM the processes in *names* (workers first) and wait for them."""
        for name in sorted(names, key=PROCESSES.index, reverse=True):
            process = self.processes.pop(name, None)
            if process is not None:
                stop_process(process)

    def restart(self, names: tuple[str, ...] = PROCESSES) -> None:
        """Stop and start again main alone (``("main",)``) or every process."""
        self.stop(names)
        self.start(names)


def _shared_config(server_name: str, directory: str, redis_url: str, database: dict[str, object],
                   client_port: int, ports: dict[str, int]) -> dict[str, object]:
    config = base_config(server_name, directory, redis_url,
                         [http_listener(client_port, "client"), http_listener(ports["main"], "replication")])
    config.update({
        "database": database,
        "instance_map": {name: {"host": "127.0.0.1", "port": port} for name, port in ports.items()},
        "stream_writers": {"events": list(PERSISTERS)},
        "worker_replication_secret": REPLICATION_SECRET,
    })
    return config


def _worker_config(name: str, directory: str, port: int) -> dict[str, object]:
    return {
        "worker_app": "synapse.app.generic_worker",
        "worker_name": name,
        "worker_listeners": [http_listener(port, "replication")],
        "worker_log_config": os.path.join(directory, f"{name}.log.yaml"),
    }


def _reference_postgres_driver(python: str) -> None:
    """Fail (under STREAMREP_REQUIRE_REFERENCE) or skip when the reference's venv
    lacks the PostgreSQL driver."""
    done = subprocess.run([python, "-c", "import psycopg2"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        why = (f"{python} cannot import psycopg2: install matrix-synapse[postgres] into the "
               "reference's venv (scripts/test does)")
        if os.environ.get("STREAMREP_REQUIRE_REFERENCE", "") not in ("", "0"):
            pytest.fail(f"STREAMREP_REQUIRE_REFERENCE is set but {why}", pytrace=False)
        pytest.skip(why)


@contextlib.contextmanager
def _fresh_database(server_dsn: str) -> Iterator[tuple[dict[str, object], str]]:
    """A new database of C collation on the server of *server_dsn*, dropped on exit:
    (the reference's ``database`` section, a DSN to read it)."""
    import psycopg2

    name = f"synapse_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(server_dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name} TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C' ENCODING 'UTF8'")
        url = urlsplit(server_dsn)
        args: dict[str, object] = {"user": url.username or "postgres", "host": url.hostname or "127.0.0.1",
                                   "port": url.port or 5432, "dbname": name, "cp_min": 1, "cp_max": 5}
        if url.password:
            args["password"] = url.password
        yield {"name": "psycopg2", "args": args}, url._replace(path=f"/{name}", query="").geturl()
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@contextlib.contextmanager
def running_deployment(directory: str | None = None, server_name: str | None = None,
                       timeout: float = 180.0) -> Iterator[Deployment]:
    """A started :class:`Deployment` with its own Redis and database, all stopped and
    removed on exit."""
    from support.postgres import postgres_server_dsn
    from support.reference import reference_python

    python = reference_python()
    _reference_postgres_driver(python)
    server_dsn = postgres_server_dsn()
    directory = directory or tempfile.mkdtemp(prefix="streamrep-deployment-")
    os.makedirs(directory, exist_ok=True)
    server_name = server_name or unique_server_name("deploy")
    redis = own_redis_server()
    try:
        with _fresh_database(server_dsn) as (database, database_dsn):
            ports = {name: free_port() for name in PROCESSES}
            deployment = Deployment(server_name, free_port(), directory, redis, database_dsn, python, ports)
            write_yaml(deployment.config_path, _shared_config(server_name, directory, redis.url, database,
                                                              deployment.port, ports))
            write_yaml(os.path.join(directory, "log.yaml"), log_config(deployment.log("main")))
            for name in PERSISTERS:
                write_yaml(os.path.join(directory, f"{name}.yaml"),
                           _worker_config(name, directory, ports[name]))
                write_yaml(os.path.join(directory, f"{name}.log.yaml"), log_config(deployment.log(name)))
            generate_keys(python, deployment.config_path, timeout)
            try:
                deployment.start(timeout=timeout)
                yield deployment
            finally:
                deployment.stop()
    finally:
        redis.stop()
