"""What a stream is: its name, backing tables, writers and row format.

A :class:`StreamDefinition` is static (a process serves a
:class:`~streamrep.streams.StreamSet` of them, built at start-up); a :class:`Stream`
binds one to a database, an instance and an ID generator, and answers
:meth:`Stream.get_updates_since`.

Tokens always increase, also for streams whose stored IDs decrease (backfill): the
definition translates in :meth:`StreamDefinition.fetch_rows`.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from streamrep import _impl
from streamrep.errors import StreamIdError
from streamrep.idgen import BackingTable, IdGenerator, ranges

if TYPE_CHECKING:
    from streamrep._pure import rowcheck as _rowcheck
    from streamrep.db import Database, Transaction
else:
    _rowcheck = _impl.load("rowcheck")

#: One stream row: ``(token, row)`` where ``row`` is the JSON-able list sent in RDATA.
StreamRow = tuple[int, list[Any]]

#: One field of a row: its name and JSON kind (see :class:`RowFormat`).
RowField = tuple[str, str]


@dataclass(frozen=True)
class RowFormat:
    """The fields of a stream's rows, each with its JSON kind.

    Rows are a flat JSON array of ``fields``, or, with ``variants``, ``[kind, data]``
    where the ``kind`` string selects the fields of the array ``data``. Kinds:
    ``string``, ``string|null``, ``integer``, ``boolean``, ``flag`` (a boolean or the
    integer 0 or 1: a boolean the reference reads from SQLite arrives as an integer),
    ``object``, ``array``, ``array|null``, ``string[]`` and ``any``.
    """

    fields: tuple[RowField, ...] = ()
    variants: tuple[tuple[str, tuple[RowField, ...]], ...] = ()

    @classmethod
    def flat(cls, *fields: RowField) -> "RowFormat":
        """Rows that are the JSON array of *fields*."""
        return cls(fields=tuple(fields))

    @classmethod
    def tagged(cls, variants: Mapping[str, Sequence[RowField]]) -> "RowFormat":
        """Rows ``[kind, data]``; *variants* maps each kind to the fields of ``data``."""
        return cls(variants=tuple((kind, tuple(fields)) for kind, fields in variants.items()))

    @property
    def names(self) -> tuple[str, ...]:
        """The names of a row's top-level fields (a tagged row's: ``type`` and ``data``,
        as the reference names them)."""
        return ("type", "data") if self.variants else tuple(name for name, _ in self.fields)

    def misfit(self, row: Any) -> str | None:
        """None when the decoded *row* has this format's shape, else why not. The
        shape is the number of fields (and a tagged row's kind); JSON kinds are the
        row check's business (:meth:`StreamDefinition.check_row`)."""
        if not isinstance(row, list):
            return f"a row is a JSON array, not {type(row).__name__}"
        fields = self.fields
        if self.variants:
            if len(row) != 2 or not isinstance(row[1], list):
                return "a row is [type, [fields]]"
            found = dict(self.variants).get(row[0]) if isinstance(row[0], str) else None
            if found is None:
                return f"unknown row type {row[0]!r}"
            fields, row = found, row[1]
        if len(row) != len(fields):
            return f"{len(row)} fields, not the {len(fields)} of the format"
        return None

    def named(self, row: Any) -> dict[str, Any] | None:
        """The decoded *row* as an object keyed by field name; a tagged row as
        ``{"type": kind, "data": {...}}``. None when it does not fit (see
        :meth:`misfit`)."""
        if not isinstance(row, list):
            return None
        if self.variants:
            if len(row) != 2 or not isinstance(row[1], list) or not isinstance(row[0], str):
                return None
            names = self._names_by_kind.get(row[0])
            if names is None or len(names) != len(row[1]):
                return None
            return {"type": row[0], "data": dict(zip(names, row[1]))}
        names = self._field_names
        return dict(zip(names, row)) if len(row) == len(names) else None

    @functools.cached_property
    def _field_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fields)

    @functools.cached_property
    def _names_by_kind(self) -> dict[str, tuple[str, ...]]:
        return {kind: tuple(name for name, _ in fields) for kind, fields in self.variants}

    def shape(self, stream: str) -> "_rowcheck.RowShape":
        """The compiled check of rows of *stream* in this format."""
        if self.variants:
            return _rowcheck.RowShape(stream, variants=dict(self.variants))
        return _rowcheck.RowShape(stream, self.fields)


@dataclass(frozen=True)
class StreamDefinition(abc.ABC):
    """A stream's static description; subclass it and implement :meth:`fetch_rows`.

    * ``name``: the stream name on the wire.
    * ``tables``: backing tables (their ID column, and the writer column if any).
    * ``sequence_name``: the PostgreSQL sequence for several writers (None: the
      stream always has a single writer).
    * ``negative``: stored IDs decrease (backfill); tokens are their negations.
    * ``schema_component``: the migration component that creates the tables.
    * ``row``: the :class:`RowFormat` of its rows; a relay refuses rows that do not
      fit it (None: every row is refused).
    * ``writers_follow``: another stream whose writers this one has when the
      configuration names none for it (a stream written in the other's transactions).
    """

    name: str
    tables: tuple[BackingTable, ...] = ()
    sequence_name: str | None = None
    negative: bool = False
    schema_component: str | None = None
    row: RowFormat | None = None
    writers_follow: str | None = None
    _shape: Any = field(init=False, repr=False, compare=False, hash=False, default=None)

    def __post_init__(self) -> None:
        if self.row is not None:
            object.__setattr__(self, "_shape", self.row.shape(self.name))

    @property
    def row_fields(self) -> tuple[str, ...]:
        """The names of a row's top-level fields."""
        return () if self.row is None else self.row.names

    def check_row(self, row_json: bytes) -> str | None:
        """None when the raw JSON *row_json* fits this stream's row format, else one
        sentence naming what is wrong. Checked in place, without decoding, for rows
        in the common compact form."""
        if self._shape is None:
            return f"stream {self.name!r} declares no row format"
        return _rowcheck.check_row(self._shape, row_json)

    def check_rows(self, commands: Sequence[Any]) -> str | None:
        """The first error of :meth:`check_row` over the ``row_json`` of each RDATA
        command in *commands*, or None."""
        if self._shape is None:
            return f"stream {self.name!r} declares no row format" if commands else None
        return _rowcheck.check_rows(self._shape, commands)

    @property
    def in_memory(self) -> bool:
        """True for streams that live in one process's memory (no tables)."""
        return not self.tables

    @abc.abstractmethod
    def fetch_rows(self, txn: "Transaction", instance: str, from_token: int,
                   upto_token: int, limit: int | None) -> list[StreamRow]:
        """Rows written by *instance* with ``from_token < token <= upto_token``,
        ascending by token, at most *limit* rows (None: all)."""


class Stream:
    """A stream definition bound to a database, this instance and an ID generator."""

    def __init__(self, definition: StreamDefinition, db: "Database | None",
                 id_gen: IdGenerator, writers: Sequence[str]) -> None:
        self.definition = definition
        self.name = definition.name
        self.db = db
        self.id_gen = id_gen
        self.writers: tuple[str, ...] = tuple(writers)
        #: rows that do not name their writer: who wrote which tokens is recorded apart
        self._ranged = not definition.in_memory and ranges.needs_ranges(definition.tables)

    def current_token(self, instance: str | None = None) -> int:
        """Writer *instance*'s position, or the linear position with no instance."""
        if instance is None:
            return self.id_gen.get_current_token()
        return self.id_gen.get_current_token_for_writer(instance)

    def get_updates_since(self, instance: str, from_token: int, upto_token: int,
                          limit: int) -> tuple[list[StreamRow], bool]:
        """Rows of writer *instance* with ``from_token < token <= upto_token``.

        Ordered by token. At most about *limit* rows: when there are more, the flag
        is True and the rows end at a whole token (rows sharing a token are never
        split, so the answer may exceed *limit* by the rest of the last token's rows);
        continue from the last row's token.
        """
        if limit < 1:
            raise StreamIdError(f"limit must be at least 1, not {limit}")
        if upto_token <= from_token:
            return [], False
        assert self.db is not None

        def fetch(txn: "Transaction") -> tuple[list[StreamRow], bool]:
            if self._ranged:
                recorded = ranges.read(txn, self.name)
                if recorded:
                    # Only the tokens this instance wrote: rows never carry another's name.
                    return self._fetch_owned(txn, ranges.owned(recorded, instance, from_token, upto_token),
                                             instance, limit)
            return self._fetch(txn, instance, from_token, upto_token, limit)

        # Through Database.run: a dropped connection is retried, so a writer's
        # announcement or a catch-up does not fail on it.
        return self.db.run(fetch, name=f"{self.name}:get_updates_since", read_only=True)

    def _fetch_owned(self, txn: "Transaction", parts: list[tuple[int, int]], instance: str,
                     limit: int) -> tuple[list[StreamRow], bool]:
        rows: list[StreamRow] = []
        for lo, hi in parts:
            got, limited = self._fetch(txn, instance, lo, hi, max(limit - len(rows), 1))
            rows.extend(got)
            if limited:
                return rows, True
        return rows, False

    def _fetch(self, txn: "Transaction", instance: str, from_token: int, upto_token: int,
               limit: int) -> tuple[list[StreamRow], bool]:
        rows = self.definition.fetch_rows(txn, instance, from_token, upto_token, limit + 1)
        if len(rows) <= limit:
            return rows, False
        # Cut after the last whole token within the limit, then complete it.
        last_token = rows[limit - 1][0]
        kept = [row for row in rows if row[0] < last_token]
        kept.extend(self.definition.fetch_rows(txn, instance, last_token - 1, last_token, None))
        return kept, True

    def __repr__(self) -> str:
        return f"<Stream {self.name} writers={list(self.writers)}>"
