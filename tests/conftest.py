"""Shared fixtures: both core implementations, databases, and resource checks."""

from __future__ import annotations

import os
import time
from typing import Iterator

import pytest

from streamrep import _impl
from support.impls import IMPLEMENTATIONS
from support.postgres import fresh_schema_dsn, postgres_server_dsn


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With STREAMREP_NO_EXTENSIONS=1 the run is about the twins: tests comparing the
    compiled core with its twin belong to the other run, so they are deselected."""
    if not _impl.NO_EXTENSIONS:
        return
    kept = [item for item in items if item.get_closest_marker("compiled_vs_pure") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


@pytest.fixture(params=IMPLEMENTATIONS, scope="session")
def impl_kind(request: pytest.FixtureRequest) -> str:
    """Parametrizes a test over the compiled core and its pure twin."""
    return str(request.param)


@pytest.fixture(scope="session")
def pg_server() -> str:
    """DSN of a PostgreSQL server for the session (see tests/support/postgres.py)."""
    return postgres_server_dsn()


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A ``postgresql://`` URL whose search_path is a fresh schema, dropped afterwards."""
    with fresh_schema_dsn(pg_server) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    """A ``sqlite:///`` URL of a new database file."""
    return f"sqlite:///{os.fspath(tmp_path)}/streamrep.db"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    """Runs a test once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{os.fspath(tmp_path)}/streamrep.db"
    else:
        server = request.getfixturevalue("pg_server")
        with fresh_schema_dsn(server) as url:
            yield url


@pytest.fixture(autouse=True)
def _no_leaked_resources() -> Iterator[None]:
    """With STREAMREP_DEBUG_RESOURCES=1 (as ./scripts/test runs), fail the test after
    which a database handle, transaction, replication connection, queued command,
    in-flight stream ID or checkpoint thread is still held. Closing finishes in
    background greenlets and threads, so give it a few seconds first."""
    from streamrep import resources

    if not resources.ENABLED:
        yield
        return
    before = resources.live()
    yield
    import gevent

    deadline = time.monotonic() + 5
    while resources.live() != before and time.monotonic() < deadline:
        gevent.sleep(0.02)
    leaked = {kind: n - before.get(kind, 0) for kind, n in resources.live().items()
              if n != before.get(kind, 0)}
    assert not leaked, f"resources still held after the test: {leaked}"
