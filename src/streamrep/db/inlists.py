"""``IN`` lists for both engines, and the chunks long lists are queried in.

A query that tests a column against a list of values takes the list in chunks of
:data:`CHUNK_SIZE` (SQLite bounds the number of parameters of a statement) and
writes the test with :func:`in_list`:

>>> for chunk in chunks(event_ids):
...     params = []
...     rows = txn.fetchall("SELECT ... WHERE " + in_list(txn, "event_id", chunk, params),
...                         params)
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, Iterator, Protocol, Sequence, TypeVar

import orjson

__all__ = ["CHUNK_SIZE", "SQLITE_JSON", "chunks", "in_list", "placeholders", "json_values"]

#: Values per query: far below SQLite's parameter limit, large enough that a
#: batch's lookups are one or two statements.
CHUNK_SIZE = 500

T = TypeVar("T")


class _Dialect(Protocol):
    @property
    def is_postgres(self) -> bool: ...


def _sqlite_has_json() -> bool:
    try:
        with contextlib.closing(sqlite3.connect(":memory:")) as conn:
            return conn.execute("SELECT value FROM json_each('[1]')").fetchall() == [(1,)]
    except sqlite3.Error:
        return False


#: The SQLite library has ``json_each`` (built in from 3.38, an option before): a
#: list of values then travels as one JSON parameter, and a query joins it. Looking
#: a hundred keys up by ``JOIN json_each(?)`` costs SQLite about half what
#: ``IN (?, ?, ...)`` does, which binds each value and builds a temporary index of
#: them before the first lookup.
SQLITE_JSON = _sqlite_has_json()


def json_values(values: Sequence[Any]) -> str:
    """*values* as the JSON array ``json_each(?)`` (SQLite) or
    ``json_array_elements_text(?::json)`` (PostgreSQL) takes."""
    return orjson.dumps(list(values)).decode()


def chunks(items: Sequence[T], size: int = CHUNK_SIZE) -> Iterator[Sequence[T]]:
    """*items* in consecutive slices of at most *size*."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def placeholders(n: int) -> str:
    """*n* ``?`` placeholders for an ``IN (...)`` list; ``NULL`` (matching nothing)
    for none."""
    return ",".join("?" * n) if n else "NULL"


def in_list(conn: _Dialect, column: str, values: Sequence[Any], params: list[Any],
            cast: str = "") -> str:
    """SQL that tests *column* against *values*, whose parameters go on *params*.

    *conn* is the transaction or database the SQL runs on. On PostgreSQL the values
    travel as one JSON array: psycopg2 quotes one string instead of adapting each
    value, and the server plans one parameter however many values there are (a long
    ``IN`` list costs it more to plan than to run). *cast* (e.g. ``"bigint"``)
    converts the array's text elements there for a column that is not text.
    """
    if conn.is_postgres:
        params.append(json_values(values))
        element = f"::{cast}" if cast else ""
        return (f"{column} = ANY(ARRAY(SELECT json_array_elements_text(?::json)"
                f"{element}))")
    params.extend(values)
    return f"{column} IN ({placeholders(len(values))})"
