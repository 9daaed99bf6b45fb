"""Checking and repairing the sequences behind multi-writer streams.

After a database failover or a restore, a sequence can fall behind the IDs already
stored; its next value would then reuse a stream ID. :func:`check_sequence` refuses
to start in that state and :func:`repair_sequences` moves each sequence past every
used ID (``streamrep db repair-sequences``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from streamrep.db import Database, Transaction
from streamrep.errors import SequenceMismatchError
from streamrep.idgen.base import BackingTable


def sequence_last_value(txn: Transaction, sequence_name: str) -> int:
    """The last value *sequence_name* handed out (one less than its next value)."""
    row = txn.fetchone(f"SELECT last_value, is_called FROM {sequence_name}")
    assert row is not None
    last_value, is_called = row
    return int(last_value) if is_called else int(last_value) - 1


def _stored_maxima(txn: Transaction, tables: Sequence[BackingTable],
                   negative: bool) -> dict[str, int]:
    found: dict[str, int] = {}
    for table in tables:
        func = "MIN" if negative else "MAX"
        value = txn.fetchval(f"SELECT {func}({table.id_column}) FROM {table.table}")
        if value is not None:
            found[f"{table.table}.{table.id_column}"] = -int(value) if negative else int(value)
    return found


def check_sequence(txn: Transaction, stream_name: str, sequence_name: str,
                   tables: Sequence[BackingTable], negative: bool,
                   persisted: Mapping[str, int]) -> None:
    """Raise :class:`SequenceMismatchError` if *sequence_name* is behind any persisted
    position or stored row of *stream_name*."""
    # Read what is stored before the sequence: writers may be running, and an ID
    # committed before the maxima are read was drawn from the sequence before it is
    # read here, so a sequence read afterwards is never behind a healthy table.
    stored = _stored_maxima(txn, tables, negative)
    current = sequence_last_value(txn, sequence_name)
    behind: list[str] = []
    for where, value in sorted(stored.items()):
        if value > current:
            behind.append(f"{where} holds {'-' if negative else ''}{value}")
    for instance, position in sorted(persisted.items()):
        if position > current:
            behind.append(f"stream_positions has {position} for {instance!r}")
    if behind:
        raise SequenceMismatchError(
            f"stream {stream_name!r}: sequence {sequence_name!r} is at {current}, behind "
            f"IDs already used ({'; '.join(behind)}). Its next values would reuse stream "
            "IDs (this follows a failover or a restore). Run "
            "`streamrep db repair-sequences --db URL` to move it past them."
        )


@dataclass(frozen=True)
class SequenceRepair:
    """What :func:`repair_sequences` found (and did) for one stream."""

    stream_name: str
    sequence_name: str
    before: int
    after: int

    @property
    def repaired(self) -> bool:
        return self.after != self.before


def repair_sequences(
    db: Database, *, dry_run: bool = False,
    known: Iterable[tuple[str, str, Sequence[BackingTable], bool]] = (),
) -> list[SequenceRepair]:
    """Move stream sequences past the IDs and positions in the database.

    Streams are those whose multi-writer generator has started on this database
    (``stream_sequences``), plus *known* ``(stream, sequence, tables, negative)``
    entries (e.g. the registered stream definitions) whose sequence exists.
    Sequences already ahead are left alone.
    """
    results: list[SequenceRepair] = []
    with db.transaction("repair_sequences") as txn:
        streams: dict[str, tuple[str, list[BackingTable], bool]] = {}
        for stream_name, sequence_name, tables, negative in known:
            if txn.fetchval("SELECT to_regclass(?) IS NOT NULL", (sequence_name,)) is True:
                streams[stream_name] = (sequence_name, list(tables), negative)
        if txn.fetchval("SELECT to_regclass('stream_sequences') IS NOT NULL") is True:
            for stream_name, sequence_name, tables_json, negative in txn.fetchall(
                "SELECT stream_name, sequence_name, tables_json, negative FROM stream_sequences"
            ):
                tables = [BackingTable(t, c, i) for t, c, i in json.loads(tables_json)]
                streams[str(stream_name)] = (str(sequence_name), tables, bool(negative))
        has_positions = txn.fetchval(
            "SELECT to_regclass('stream_positions') IS NOT NULL") is True
        for stream_name in sorted(streams):
            sequence_name, tables, negative = streams[stream_name]
            current = sequence_last_value(txn, sequence_name)
            needed = max([current, *_stored_maxima(txn, tables, negative).values()])
            if has_positions:
                top = txn.fetchval(
                    "SELECT MAX(stream_id) FROM stream_positions WHERE stream_name = ?",
                    (stream_name,),
                )
                if top is not None:
                    needed = max(needed, int(top))
            if needed > current and not dry_run:
                txn.fetchval("SELECT setval(?, ?, true)", (sequence_name, needed))
            results.append(SequenceRepair(stream_name, sequence_name, current, needed))
    return results
