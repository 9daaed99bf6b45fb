"""Versioned schema migrations that any module can register.

A *component* (``"streams"``, ``"events"``...) owns an ordered list of
:class:`Migration` steps numbered 1, 2, 3... Each step carries SQL for both engines
(``sql``) and/or per engine (``sqlite``, ``postgres``), or a Python callable for
changes SQL alone cannot make. The ``schema_versions`` table records, per
component, the last step applied; each step runs in its own transaction together
with that record, so a crash leaves the schema at a step boundary.
:class:`Migrator` applies them to one database.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Sequence

import gevent.lock

from streamrep.db.transaction import Transaction
from streamrep.db.url import POSTGRES
from streamrep.errors import DatabaseConfigError, SchemaVersionError

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class Migration:
    """One step of a component's schema.

    ``sql`` runs on both engines, then ``sqlite`` or ``postgres`` on that engine,
    then ``run(txn)`` if given. Statements are single SQL statements (no trailing
    ``;`` needed).
    """

    version: int
    sql: Sequence[str] = ()
    sqlite: Sequence[str] = ()
    postgres: Sequence[str] = ()
    run: Callable[[Transaction], None] | None = None
    description: str = ""

    def statements(self, engine: str) -> list[str]:
        """The SQL statements of this step on *engine*, in order."""
        extra = self.sqlite if engine == "sqlite" else self.postgres
        return [*self.sql, *extra]


@dataclass
class SchemaComponent:
    """A named, ordered list of migrations."""

    name: str
    migrations: list[Migration] = field(default_factory=list)

    @property
    def latest_version(self) -> int:
        return self.migrations[-1].version if self.migrations else 0


_registry: dict[str, SchemaComponent] = {}
_registry_lock = threading.Lock()


def register_schema(component: str, migrations: Sequence[Migration]) -> None:
    """Register (or extend) *component*'s migrations.

    Versions must continue 1, 2, 3... without gaps. Registering the same steps again
    (a module imported twice) is harmless; registering a different step under an
    existing version is a :class:`DatabaseConfigError`.
    """
    if not component or not component.replace("_", "").replace(".", "").isalnum():
        raise DatabaseConfigError(f"schema component name {component!r} is not a plain name")
    with _registry_lock:
        entry = _registry.setdefault(component, SchemaComponent(component))
        for step in migrations:
            if step.version <= entry.latest_version:
                existing = entry.migrations[step.version - 1]
                if existing != step:
                    raise DatabaseConfigError(
                        f"schema component {component!r} already has a different "
                        f"migration {step.version}"
                    )
                continue
            if step.version != entry.latest_version + 1:
                raise DatabaseConfigError(
                    f"schema component {component!r}: migration {step.version} follows "
                    f"{entry.latest_version}; versions must be consecutive from 1"
                )
            entry.migrations.append(step)


def registered_components() -> list[SchemaComponent]:
    """Every registered component, in registration order."""
    with _registry_lock:
        return list(_registry.values())


def get_component(name: str) -> SchemaComponent:
    """The registered component *name*, or :class:`DatabaseConfigError`."""
    with _registry_lock:
        try:
            return _registry[name]
        except KeyError:
            raise DatabaseConfigError(f"no schema component {name!r} is registered") from None


def unregister_schema(component: str) -> None:
    """Forget *component*'s migrations (for tests and plugins being unloaded)."""
    with _registry_lock:
        _registry.pop(component, None)


#: Opens a transaction named by its argument (:meth:`Database.transaction`).
TransactionOpener = Callable[[str], ContextManager[Transaction]]
#: Calls a function again after a lost connection (:meth:`Database.retry`).
Retrier = Callable[..., Any]


class Migrator:
    """Applies registered migrations to one database, and remembers what it applied.

    *transaction* opens a transaction by name and *retry* reruns a function after a
    lost connection, both the database handle's; *engine* picks each step's SQL.
    """

    def __init__(self, engine: str, transaction: TransactionOpener, retry: Retrier) -> None:
        self._engine = engine
        self._transaction = transaction
        self._retry = retry
        self._applied: dict[str, int] = {}
        self._lock = gevent.lock.RLock()

    def schema_version(self, component: str) -> int:
        """The last migration of *component* applied to this database (0: none);
        read again after a lost connection, as every other read is."""
        return int(self._retry(self._read_version, component, name="schema_version"))

    def _read_version(self, component: str) -> int:
        with self._transaction("schema_version") as txn:
            _ensure_versions_table(txn)
            return int(txn.fetchval(
                "SELECT version FROM schema_versions WHERE component = ?", (component,), 0
            ))

    def apply(self, components: Iterable[str] | None = None) -> dict[str, int]:
        """Bring the named components (default: every registered one) up to date."""
        chosen = (registered_components() if components is None
                  else [get_component(name) for name in components])
        with self._lock:
            return {c.name: self._migrate_component(c) for c in chosen}

    def ensure(self, component: str) -> None:
        """Apply *component*'s migrations unless this database already has them (cheap)."""
        entry = get_component(component)
        if self._applied.get(component) == entry.latest_version:
            return
        with self._lock:
            self._migrate_component(entry)

    def _migrate_component(self, component: SchemaComponent) -> int:
        # Each step reads the recorded version first, so after a lost connection the
        # whole walk simply starts again (a step whose COMMIT went through is skipped).
        return int(self._retry(self._migrate_steps, component,
                               name=f"migrate:{component.name}"))

    def _migrate_steps(self, component: SchemaComponent) -> int:
        latest = component.latest_version
        while True:
            with self._transaction(f"migrate:{component.name}") as txn:
                if self._engine == POSTGRES:
                    # Serialize concurrent migrators (per database, brief).
                    txn.execute("SELECT pg_advisory_xact_lock(?)", (0x5752_4D47,))
                _ensure_versions_table(txn)
                current = int(txn.fetchval(
                    "SELECT version FROM schema_versions WHERE component = ?",
                    (component.name,), 0,
                ))
                if current > latest:
                    raise SchemaVersionError(
                        f"database schema component {component.name!r} is at version "
                        f"{current}, newer than this streamrep knows ({latest}); upgrade "
                        "streamrep before using this database"
                    )
                if current == latest:
                    self._applied[component.name] = latest
                    return latest
                step = component.migrations[current]
                statements = step.statements(self._engine)
                for statement in statements:
                    txn.execute(statement)
                if step.run is not None:
                    step.run(txn)
                _record_version(txn, component.name, current, step.version)
                if statements or step.run is not None:
                    logger.info("schema %s: applied migration %d %s", component.name,
                                step.version, step.description)
                else:
                    # A step for the other engine only: its description is not this one's.
                    logger.debug("schema %s: migration %d has nothing to do on %s",
                                 component.name, step.version, self._engine)


def _ensure_versions_table(txn: Transaction) -> None:
    txn.execute(
        "CREATE TABLE IF NOT EXISTS schema_versions ("
        " component TEXT NOT NULL PRIMARY KEY,"
        " version INTEGER NOT NULL)"
    )


def _record_version(txn: Transaction, component: str, current: int, version: int) -> None:
    if current == 0:
        txn.execute(
            "INSERT INTO schema_versions (component, version) VALUES (?, ?)",
            (component, version),
        )
    else:
        txn.execute(
            "UPDATE schema_versions SET version = ? WHERE component = ?",
            (version, component),
        )
