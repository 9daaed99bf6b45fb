"""Versioned schema migrations that any module can register.

A *component* (``"streams"``, ``"events"``...) owns an ordered list of
:class:`Migration` steps numbered 1, 2, 3... Each step carries SQL for both engines
(``sql``) and/or per engine (``sqlite``, ``postgres``), or a Python callable for
changes SQL alone cannot make. The ``schema_versions`` table records, per
component, the last step applied; each step runs in its own transaction together
with that record, so a crash leaves the schema at a step boundary.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from streamrep.errors import DatabaseConfigError

if TYPE_CHECKING:
    from streamrep.db.database import Transaction


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
    run: Callable[["Transaction"], None] | None = None
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
