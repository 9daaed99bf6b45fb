"""The event store's write statements, queued per batch, in each engine's form.

:func:`writes_for` gives the form of the transaction's engine: on PostgreSQL every
queued statement goes to the server in one text, with the transaction's next
statement or its ``COMMIT``, each insert's rows as one JSON parameter; on SQLite,
where a statement costs no round trip, they run one by one at :meth:`Writes.flush`,
each insert's rows 64, 8 or 1 to a multi-row ``VALUES`` statement.
"""

from __future__ import annotations

import abc
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import orjson

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list

__all__ = ["Writes", "PostgresWrites", "SqliteWrites", "writes_for"]

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
else:
    _batchrows = _impl.load("batchrows")

Rows = Sequence[Sequence[Any]]


class Writes(abc.ABC):
    """Write statements queued for one round trip (see the module docstring)."""

    def __init__(self, txn: Transaction) -> None:
        self.txn = txn

    @abc.abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Queue one statement."""

    @abc.abstractmethod
    def insert(self, table: str, columns: str, rows: Rows, suffix: str = "") -> None:
        """Queue the insertion of *rows* (tuples in the order of *columns*, a
        comma-separated list); *suffix* follows the values (``ON CONFLICT ...``)."""

    def insert_flat(self, table: str, columns: str, values: list[Any], suffix: str = "") -> None:
        """:meth:`insert` with the rows' values in one flat list, row after row (for
        callers that make many short rows: no tuple a row)."""
        width = _row_width(table, columns, values)
        self.insert(table, columns, list(zip(*[iter(values)] * width)), suffix)

    @abc.abstractmethod
    def delete_rows(self, table: str, columns: str, keys: Rows) -> None:
        """Queue the deletion of the rows of *table* whose *columns* (comma-separated)
        equal one of *keys*."""

    def delete_in(self, table: str, column: str, values: Sequence[Any],
                  room_id: str | None = None) -> None:
        """Queue ``DELETE FROM table WHERE [room_id = ? AND] column IN values``."""
        where = "" if room_id is None else "room_id = ? AND "
        for chunk in chunks(values):
            params: list[Any] = [] if room_id is None else [room_id]
            self.execute(f"DELETE FROM {table} WHERE {where}"
                         + in_list(self.txn, column, chunk, params), params)

    @abc.abstractmethod
    def flush(self) -> None:
        """Run everything queued."""


#: Values bound by one SQLite statement: 999 is the least any SQLite build allows.
_SQLITE_MAX_VALUES = 999
#: Rows of one multi-row SQLite INSERT, largest first: a few fixed sizes, so that
#: each statement is compiled once and then found in the connection's statement
#: cache (a statement for every row count would be compiled again and again).
_SQLITE_ROWS_PER_INSERT = (64, 8, 1)


def _statement_spans(count: int, width: int) -> Iterator[tuple[int, int, int]]:
    """``(rows per statement, first row, end row)`` of the statements that insert
    *count* rows of *width* values: as many of the largest size as fit, then smaller."""
    start = 0
    for size in _SQLITE_ROWS_PER_INSERT:
        if size > 1 and size * width > _SQLITE_MAX_VALUES:
            continue
        end = start + (count - start) // size * size
        if end > start:
            yield size, start, end
            start = end


class SqliteWrites(Writes):
    """Statements run one by one at :meth:`flush`; an insert's rows go 64, then 8,
    then 1 to a multi-row ``VALUES`` statement (SQLite spends less on one statement
    of many rows than on the same statement run once a row). A failed statement
    leaves its earlier rows in the transaction: roll it back (see
    ``_multi_row_insert``)."""

    def __init__(self, txn: Transaction) -> None:
        super().__init__(txn)
        self._queued: list[tuple[str, Rows]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._queued.append((sql, [params]))

    def insert(self, table: str, columns: str, rows: Rows, suffix: str = "") -> None:
        if not rows:
            return
        width = len(rows[0])
        for size, start, end in _statement_spans(len(rows), width):
            sql = _multi_row_insert(table, columns, suffix, width, size)
            self._queued.append((sql, rows[start:end] if size == 1
                                 else _batchrows.flat_chunks(rows, start, end, size)))

    def insert_flat(self, table: str, columns: str, values: list[Any], suffix: str = "") -> None:
        width = _row_width(table, columns, values)
        for size, start, end in _statement_spans(len(values) // width, width):
            sql = _multi_row_insert(table, columns, suffix, width, size)
            step = size * width
            self._queued.append((sql, [values[i:i + step]
                                       for i in range(start * width, end * width, step)]))

    def delete_rows(self, table: str, columns: str, keys: Rows) -> None:
        if keys:
            where = " AND ".join(f"{c.strip()} = ?" for c in columns.split(","))
            self._queued.append((f"DELETE FROM {table} WHERE {where}", keys))

    def flush(self) -> None:
        txn = self.txn
        for sql, rows in self._queued:
            if len(rows) == 1:
                txn.execute(sql, rows[0])
            else:
                txn.executemany(sql, rows)
        self._queued = []


# Columns of the tables written here whose PostgreSQL type is not TEXT.
_PG_COLUMN_TYPES = {
    "stream_ordering": "bigint", "topological_ordering": "bigint", "received_ts": "bigint",
    "stream_id": "bigint", "id": "bigint", "state_group": "bigint",
    "prev_state_group": "bigint", "outlier": "boolean", "rejected": "boolean",
    "soft_failed": "boolean", "redacted": "boolean", "json": "bytea", "last_check": "bigint",
}


class PostgresWrites(Writes):
    """Statements sent as one text at :meth:`flush`, which goes out with the
    transaction's next statement or its ``COMMIT`` (``Transaction.defer``); each
    insert's or delete's rows travel as one JSON parameter, since adapting thousands
    of parameters one by one costs psycopg2 more than the server spends on them."""

    def __init__(self, txn: Transaction, utf8_bytea: bool = False) -> None:
        """*utf8_bytea*: every BYTEA value inserted is UTF-8 (event JSON, validated),
        so on a UTF-8 database it travels as text, a third shorter than hex."""
        super().__init__(txn)
        self._utf8_bytea = utf8_bytea and txn.database.text_is_utf8
        self._sql: list[str] = []
        self._params: list[Any] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._sql.append(sql)
        self._params.extend(params)

    def insert(self, table: str, columns: str, rows: Rows, suffix: str = "") -> None:
        if rows:
            utf8 = self._utf8_bytea
            self.execute(_json_insert(table, columns, suffix, utf8),
                         [orjson.dumps(rows, default=_utf8_text if utf8 else _hex).decode()])

    def delete_rows(self, table: str, columns: str, keys: Rows) -> None:
        if keys:
            names = [c.strip() for c in columns.split(",")]
            self.execute(
                f"DELETE FROM {table} WHERE ({', '.join(names)}) IN (SELECT "
                + ", ".join(_json_column(c, i, False) for i, c in enumerate(names))
                + " FROM jsonb_array_elements(?::jsonb) AS r)", [orjson.dumps(keys).decode()])

    def flush(self) -> None:
        if self._sql:
            # With the next statement, or with the COMMIT: a round trip fewer a batch.
            self.txn.defer(";\n".join(self._sql), self._params)
            self._sql, self._params = [], []


def writes_for(txn: Transaction, utf8_bytea: bool = False) -> Writes:
    """Queued writes in the form of *txn*'s engine (*utf8_bytea*: see
    :class:`PostgresWrites`)."""
    if txn.is_postgres:
        return PostgresWrites(txn, utf8_bytea)
    return SqliteWrites(txn)


def _row_width(table: str, columns: str, values: Sequence[Any]) -> int:
    """The values a row of *columns* takes; *values* must fill whole rows."""
    width = columns.count(",") + 1
    if len(values) % width:
        raise ValueError(f"{len(values)} values do not make rows of {width} for {table}")
    return width


@lru_cache(maxsize=128)
def _multi_row_insert(table: str, columns: str, suffix: str, width: int, count: int) -> str:
    """An INSERT of *count* rows of *width* values each.

    ``OR FAIL``: a statement of several rows that may abort on a constraint has
    SQLite journal every page it changes so it can undo its own rows, and past
    64 KiB that journal goes to a temporary file (a 64-row ``events`` insert
    passes it: some 90 writes a batch). Failing instead keeps the rows before the
    one at fault, which is harmless here: an error fails the whole transaction,
    and the store rolls it back."""
    row = "(" + ",".join("?" * width) + ")"
    return f"INSERT OR FAIL INTO {table} ({columns}) VALUES {','.join([row] * count)}{suffix}"


@lru_cache(maxsize=64)
def _json_insert(table: str, columns: str, suffix: str, utf8_bytea: bool) -> str:
    """An INSERT taking its rows as one JSON array of arrays.

    ``jsonb``, not ``json``: the text is parsed once, where ``->>`` on ``json``
    would parse each row again for every column it extracts."""
    exprs = [_json_column(column.strip(), i, utf8_bytea)
             for i, column in enumerate(columns.split(","))]
    return (f"INSERT INTO {table} ({columns}) SELECT {', '.join(exprs)}"
            f" FROM jsonb_array_elements(?::jsonb) AS r{suffix}")


def _json_column(column: str, index: int, utf8_bytea: bool) -> str:
    """The value of *column* from element *index* of the JSON row ``r``: BYTEA as
    UTF-8 text when *utf8_bytea*, else as hex."""
    pg_type = _PG_COLUMN_TYPES.get(column)
    if pg_type is None:
        return f"r->>{index}"
    if pg_type == "bytea":
        return (f"convert_to(r->>{index}, 'UTF8')" if utf8_bytea
                else f"decode(r->>{index}, 'hex')")
    return f"(r->>{index})::{pg_type}"


def _hex(value: Any) -> str:
    if type(value) is bytes:  # the usual value: an event's JSON, once a row
        return value.hex()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    raise TypeError(f"cannot store {type(value).__name__} in a JSON row")


def _utf8_text(value: Any) -> str:
    # Strict decoding: anything but UTF-8 is a bug, not data to mangle.
    if type(value) is bytes:  # the usual value: an event's JSON, once a row
        return value.decode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    raise TypeError(f"cannot store {type(value).__name__} in a JSON row")
