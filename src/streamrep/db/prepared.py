"""Server-side prepared statements on PostgreSQL connections.

A statement that runs on every batch (the event store's inserts, say) is parsed,
analysed and planned by the server each time it arrives as text. Prepared once per
connection, later runs send only ``EXECUTE name(params)``. psycopg2 has no
protocol-level prepare, so this is done in SQL: the first run of a statement on a
connection carries its ``PREPARE`` in the same multi-statement query.

Prepared statements belong to the session and survive a rollback, while the query
that prepared them may have failed half way; so after a failed transaction the
connection's statements are dropped (``DEALLOCATE ALL``) and prepared afresh.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from streamrep.db.sql import to_numbered

__all__ = ["PreparedStatements", "MAX_STATEMENTS"]

#: Distinct statements given names per database handle; beyond this they run as text.
MAX_STATEMENTS = 256


class PreparedStatements:
    """Which statements each connection of one database handle has prepared."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._by_connection: weakref.WeakKeyDictionary[Any, set[str]] = \
            weakref.WeakKeyDictionary()

    def script(self, connection: Any, statements: Sequence[tuple[str, Sequence[Any], bool]]
               ) -> tuple[str, list[Any], list[str]]:
        """One query text (``?`` placeholders) running *statements*, ``(sql,
        params, prepared)`` triples, in order, those marked as prepared statements
        of *connection*; its parameters; and the names it prepares: pass those to
        :meth:`prepared` once the query has succeeded."""
        have = self._by_connection.get(connection, set())
        parts: list[str] = []
        params: list[Any] = []
        new: list[str] = []
        for sql, args, prepare in statements:
            name = self._names.get(sql) if prepare else None
            if prepare and name is None and len(self._names) < MAX_STATEMENTS:
                name = self._names[sql] = f"streamrep_{len(self._names) + 1}"
            if name is None:
                parts.append(sql)
            else:
                if name not in have and name not in new:
                    parts.append(f"PREPARE {name} AS {to_numbered(sql)}")
                    new.append(name)
                parts.append(f"EXECUTE {name}({','.join('?' * len(args))})" if args
                             else f"EXECUTE {name}")
            params.extend(args)
        return ";\n".join(parts), params, new

    def prepared(self, connection: Any, names: Sequence[str]) -> None:
        """Record that *names* now exist on *connection*."""
        if names:
            self._by_connection.setdefault(connection, set()).update(names)

    def forget(self, connection: Any) -> bool:
        """Drop what is known of *connection*; True when it may hold statements."""
        return self._by_connection.pop(connection, None) is not None
