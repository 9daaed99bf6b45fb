"""Which deployment a database belongs to.

A database holds one deployment's streams. The first process that writes to it (the
hub, a writer) records the deployment's server name and a new deployment ID in the
one-row ``deployment`` table; every later process that names its server checks it
(:func:`claim` for those that may create it, :func:`check` for readers), so a reader
pointed at another deployment's database, or a typo that would have created an
empty one, stops with one line instead of filling gaps with someone else's rows.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

from streamrep.db.database import Database, open_database
from streamrep.db.migrations import Migration, register_schema
from streamrep.db.url import SQLITE, parse_database_url
from streamrep.errors import DatabaseMissingError, DeploymentMismatchError

__all__ = ["COMPONENT", "Deployment", "claim", "check", "open_existing", "recorded"]

COMPONENT = "deployment"

register_schema(COMPONENT, [
    Migration(
        1,
        sql=[
            "CREATE TABLE IF NOT EXISTS deployment ("
            " one INTEGER PRIMARY KEY CHECK (one = 1),"
            " server_name TEXT NOT NULL,"
            " deployment_id TEXT NOT NULL,"
            " created_at DOUBLE PRECISION NOT NULL)",
        ],
        description="deployment: the server name and ID this database belongs to",
    ),
])


@dataclass(frozen=True)
class Deployment:
    """The deployment a database belongs to."""

    server_name: str
    deployment_id: str


def _read(db: Database) -> Deployment | None:
    row = db.fetchone("SELECT server_name, deployment_id FROM deployment WHERE one = 1")
    return Deployment(str(row[0]), str(row[1])) if row is not None else None


def _mismatch(db: Database, found: Deployment, server_name: str) -> DeploymentMismatchError:
    return DeploymentMismatchError(
        f"the database {db.config.redacted()} belongs to the deployment {found.server_name!r} "
        f"(ID {found.deployment_id}), not {server_name!r}; give this process that deployment's "
        f"database, or its server name")


def claim(db: Database, server_name: str) -> Deployment:
    """The deployment of *db*, recorded as *server_name*'s if nothing is recorded yet;
    :class:`DeploymentMismatchError` if it belongs to another server name."""
    db.ensure_schema(COMPONENT)
    found = _read(db)
    if found is None:
        with db.transaction("deployment_claim") as txn:
            txn.execute("INSERT INTO deployment (one, server_name, deployment_id, created_at)"
                        " VALUES (1, ?, ?, ?) ON CONFLICT (one) DO NOTHING",
                        (server_name, uuid.uuid4().hex, time.time()))
        found = _read(db)
        assert found is not None
    if found.server_name != server_name:
        raise _mismatch(db, found, server_name)
    return found


def check(db: Database, server_name: str) -> Deployment | None:
    """For a reader: :class:`DeploymentMismatchError` if *db* belongs to another server
    name; the deployment, or None if nothing is recorded (a database no hub or writer
    of this version has opened yet)."""
    db.ensure_schema(COMPONENT)
    found = _read(db)
    if found is not None and found.server_name != server_name:
        raise _mismatch(db, found, server_name)
    return found


def open_existing(url: str, server_name: str | None) -> Database:
    """Open a reader's database: it must exist (a SQLite file is never created here),
    and belong to *server_name* when one is given (:func:`check`)."""
    config = parse_database_url(url)
    if config.engine == SQLITE and config.target != ":memory:" and not os.path.exists(config.target):
        raise DatabaseMissingError(
            f"no database at {config.target}: a reader never creates one; give --db the database "
            "the hub and the writers use")
    db = open_database(url)
    if server_name is not None:
        try:
            check(db, server_name)
        except BaseException:
            db.close()
            raise
    return db


def recorded(url: str) -> Deployment | None:
    """The deployment recorded in the database at *url*, without creating anything
    (None: no such database, or nothing recorded yet)."""
    config = parse_database_url(url)
    if config.engine == SQLITE and (config.target == ":memory:" or not os.path.exists(config.target)):
        return None
    db = open_database(url, migrate=False)
    try:
        if db.schema_version(COMPONENT) < 1:
            return None
        return _read(db)
    finally:
        db.close()
