"""Finding (or starting) a PostgreSQL server for the tests.

``STREAMREP_TEST_DSN`` names the server (default: the local one on 127.0.0.1:5432,
database ``test``). If none answers and PostgreSQL's binaries are installed, a
throwaway server is started in a temporary directory. Otherwise the tests that need
it are skipped with the reason, unless ``STREAMREP_REQUIRE_POSTGRES=1``, which turns
a missing server into a failure (CI sets it).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Iterator
from urllib.parse import quote

import pytest

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

_server_dsn: str | None = None
_server_error: str | None = None


def _required() -> bool:
    return os.environ.get("STREAMREP_REQUIRE_POSTGRES", "") not in ("", "0")


def _answers(dsn: str) -> str | None:
    """None when *dsn* accepts a connection, else the reason it did not."""
    import psycopg2

    try:
        psycopg2.connect(dsn, connect_timeout=3).close()
    except psycopg2.OperationalError as exc:
        return str(exc).strip()
    return None


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_throwaway_server() -> str:
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError("no PostgreSQL server answers and initdb/pg_ctl are not installed")
    datadir = tempfile.mkdtemp(prefix="streamrep-pg-")
    user = "postgres"
    run_as: list[str] = []
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root; hand the directory to the postgres user.
        shutil.chown(datadir, user="postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run_as, initdb, "-D", datadir, "-U", user, "-A", "trust"],
                   check=True, capture_output=True)
    port = _free_port()
    subprocess.run(
        [*run_as, pg_ctl, "-D", datadir, "-w", "-l", os.path.join(datadir, "log"),
         "-o", f"-p {port} -k {datadir} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
        check=True, capture_output=True,
    )

    def stop() -> None:
        subprocess.run([*run_as, pg_ctl, "-D", datadir, "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(datadir, ignore_errors=True)

    atexit.register(stop)
    return f"postgresql://{user}@127.0.0.1:{port}/postgres"


def postgres_server_dsn() -> str:
    """The DSN of a server to test against, or skip/fail as described above."""
    global _server_dsn, _server_error
    if _server_dsn is None and _server_error is None:
        dsn = os.environ.get("STREAMREP_TEST_DSN", DEFAULT_DSN)
        reason = _answers(dsn)
        if reason is None:
            _server_dsn = dsn
        elif "STREAMREP_TEST_DSN" not in os.environ:
            try:
                _server_dsn = _start_throwaway_server()
            except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                _server_error = f"PostgreSQL at {dsn} does not answer ({reason}); {exc}"
        else:
            _server_error = f"PostgreSQL at {dsn} does not answer ({reason})"
    if _server_dsn is not None:
        return _server_dsn
    assert _server_error is not None
    if _required():
        pytest.fail(f"STREAMREP_REQUIRE_POSTGRES is set but {_server_error}", pytrace=False)
    pytest.skip(_server_error)


@contextlib.contextmanager
def fresh_schema_dsn(server_dsn: str) -> Iterator[str]:
    """A URL for *server_dsn* whose search_path is a new schema, dropped on exit."""
    import psycopg2

    schema = f"sr_{uuid.uuid4().hex[:12]}"
    conn = psycopg2.connect(server_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in server_dsn else "?"
        yield (f"{server_dsn}{sep}application_name={schema}"
               f"&options={quote(f'-csearch_path={schema}')}")
    finally:
        with conn.cursor() as cur:
            # Sessions left open by a failed test would block DROP SCHEMA.
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND application_name = %s", (schema,),
            )
            for _ in range(20):
                try:
                    cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                    break
                except psycopg2.OperationalError:  # pragma: no cover - rare
                    time.sleep(0.1)
        conn.close()
