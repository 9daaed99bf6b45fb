"""PostgreSQL statements with their parameters written in as literals.

psycopg2 sends a statement's parameters inside its text, quoting each string
with libpq's general escaping routine. The event store's statements carry their
rows and ``IN`` lists as JSON texts of tens of kilobytes, and that routine costs
more than the rest of sending them: about 1.5 µs of CPU an event persisted.

With ``standard_conforming_strings`` on (the server's default since PostgreSQL
9.1; libpq tracks the value the server reports), the quote is the only special
character of a ``'...'`` literal, and doubling it is all the quoting a string
needs: the literal :func:`inline` writes for a string is the one psycopg2
writes, which ``tests/test_pgliteral.py`` checks. It writes strings, integers
and NULL; for any other parameter, a string holding NUL (which would end the
statement's text early) or a connection where the setting is off it returns
None, and the statement goes through psycopg2's own adaptation.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["inline", "literals_allowed"]


def literals_allowed(connection: Any) -> bool:
    """Whether :func:`inline`'s string literals mean what they say on *connection*
    (a psycopg2 connection): ``standard_conforming_strings`` is on."""
    return bool(connection.get_parameter_status("standard_conforming_strings") == "on")


def inline(pyformat_sql: str, params: Sequence[Any]) -> str | None:
    """*pyformat_sql* (``%s`` placeholders, literal ``%`` doubled) with *params*
    written in as literals, or None when a parameter is not one :func:`inline`
    writes (see the module docstring)."""
    literals: list[str] = []
    add = literals.append
    for value in params:
        kind = type(value)
        if kind is str:
            if "\x00" in value:
                return None
            add("'" + value.replace("'", "''") + "'" if "'" in value else "'" + value + "'")
        elif kind is int:
            # A space before a negative number, as psycopg2 writes it: "x -%s" with -1
            # must not become the comment "x --1".
            add(str(value) if value >= 0 else f" {value}")
        elif value is None:
            add("NULL")
        else:
            return None
    return pyformat_sql % tuple(literals)
