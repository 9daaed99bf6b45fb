"""Who wrote which tokens of a stream whose rows do not name their writer.

The rows of a single-writer stream such as ``events`` carry no writer column: only
one instance writes it at a time, but which one can change (``writer1`` today,
``writer2`` after a redeployment). So that a reader, a hub or a catch-up never labels
rows with an instance that did not write them, each writing instance records, once
per process before its first ID, the token after which the stream's rows are its
own: ``stream_writer_ranges (stream_name, from_token, instance_name)``. Tokens
``from_token < t <= next from_token`` belong to that instance. A stream with no
range recorded (a database that predates this table) has its configured writer.
"""

from __future__ import annotations

from typing import Sequence

from streamrep.db import Database, Transaction
from streamrep.idgen.base import BackingTable

__all__ = ["needs_ranges", "claim", "claim_in", "read", "owned", "writers", "last_token_of"]

#: ``(from_token, instance)`` in ``from_token`` order.
Ranges = list[tuple[int, str]]


def needs_ranges(tables: Sequence[BackingTable]) -> bool:
    """Whether rows of a stream in *tables* leave their writer unnamed."""
    return any(not table.instance_column for table in tables)


def read(db: Database | Transaction, stream: str) -> Ranges:
    """The ranges recorded for *stream* (empty: none)."""
    return [(int(token), str(instance)) for token, instance in db.fetchall(
        "SELECT from_token, instance_name FROM stream_writer_ranges WHERE stream_name = ?"
        " ORDER BY from_token", (stream,))]


def claim_in(txn: Transaction, stream: str, instance: str, position: int) -> None:
    """In *txn*: record that *instance* writes *stream*'s tokens after *position*,
    unless it already holds the last range."""
    ranges = read(txn, stream)
    if ranges and ranges[-1][1] == instance:
        return
    txn.execute("DELETE FROM stream_writer_ranges WHERE stream_name = ? AND from_token >= ?",
                (stream, position))
    txn.execute("INSERT INTO stream_writer_ranges (stream_name, from_token, instance_name)"
                " VALUES (?, ?, ?)", (stream, position, instance))


def claim(db: Database, stream: str, instance: str, position: int) -> None:
    """:func:`claim_in`, in a transaction of its own."""
    db.run(claim_in, stream, instance, position, name=f"{stream}:claim_writer_range")


def owned(ranges: Ranges, instance: str, from_token: int, upto_token: int) -> list[tuple[int, int]]:
    """The parts ``(lo, hi]`` of ``(from_token, upto_token]`` that *instance* wrote."""
    out = []
    for index, (start, who) in enumerate(ranges):
        end = ranges[index + 1][0] if index + 1 < len(ranges) else upto_token
        lo, hi = max(start, from_token), min(end, upto_token)
        if who == instance and lo < hi:
            out.append((lo, hi))
    return out


def writers(ranges: Ranges) -> list[str]:
    """Every instance that wrote the stream, in order of their first range."""
    return list(dict.fromkeys(instance for _token, instance in ranges))


def last_token_of(ranges: Ranges, instance: str, stored: int) -> int:
    """The largest token *instance* can have written, the stream's rows reaching
    *stored*: the end of its last range (0 if it has none)."""
    last = 0
    for index, (start, who) in enumerate(ranges):
        if who == instance:
            end = ranges[index + 1][0] if index + 1 < len(ranges) else stored
            last = max(last, min(end, stored))
    return last
