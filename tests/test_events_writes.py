"""The event store's queued writes (``streamrep.events.writes``) on SQLite and
PostgreSQL: every row of an insert arrives, however many statements carry them."""

from __future__ import annotations

import pytest

from streamrep.db import Database, Transaction
from streamrep.events.writes import writes_for


@pytest.mark.parametrize("count", [1, 7, 8, 9, 63, 64, 65, 73, 1000])
def test_an_insert_stores_every_row_and_its_suffix_applies_to_each(db_url: str,
                                                                   count: int) -> None:
    """On SQLite the rows go 64, then 8, then 1 to a statement: counts around those
    splits, and ``ON CONFLICT`` skips the duplicates of every statement."""
    db = Database.open(db_url)
    try:
        db.run(lambda txn: txn.execute(
            "CREATE TABLE pairs (a TEXT NOT NULL PRIMARY KEY, b TEXT NOT NULL, c TEXT)"))
        rows = [(f"a{i:04}", f"b{i}", f"c{i}") for i in range(count)]

        def write(txn: Transaction) -> None:
            writes = writes_for(txn)
            writes.insert("pairs", "a, b, c", rows)
            writes.insert("pairs", "a, b, c", rows[::2], " ON CONFLICT (a) DO NOTHING")
            writes.flush()

        db.run(write)
        assert db.fetchall("SELECT a, b, c FROM pairs ORDER BY a") == rows
    finally:
        db.close()


@pytest.mark.parametrize("count", [1, 9, 65, 1000])
def test_an_insert_of_flat_values_stores_the_same_rows(db_url: str, count: int) -> None:
    db = Database.open(db_url)
    try:
        db.run(lambda txn: txn.execute(
            "CREATE TABLE pairs (a TEXT NOT NULL PRIMARY KEY, b TEXT NOT NULL, c TEXT)"))
        rows = [(f"a{i:04}", f"b{i}", f"c{i}") for i in range(count)]
        flat = [value for row in rows for value in row]

        def write(txn: Transaction) -> None:
            writes = writes_for(txn)
            writes.insert_flat("pairs", "a, b, c", flat)
            writes.flush()

        db.run(write)
        assert db.fetchall("SELECT a, b, c FROM pairs ORDER BY a") == rows
    finally:
        db.close()


def test_flat_values_that_do_not_fill_whole_rows_are_refused(db_url: str) -> None:
    db = Database.open(db_url)
    try:
        def write(txn: Transaction) -> None:
            writes_for(txn).insert_flat("pairs", "a, b, c", ["a", "b", "c", "d"])

        with pytest.raises(ValueError, match="4 values do not make rows of 3"):
            db.run(write)
    finally:
        db.close()


def test_a_failed_insert_leaves_nothing_once_its_transaction_rolls_back(db_url: str) -> None:
    """A row at fault deep in a 64-row statement: the error reaches the caller, and
    the rollback takes every row of the transaction with it."""
    db = Database.open(db_url)
    try:
        db.run(lambda txn: txn.execute(
            "CREATE TABLE pairs (a TEXT NOT NULL PRIMARY KEY, b TEXT NOT NULL, c TEXT)"))
        db.run(lambda txn: txn.execute("INSERT INTO pairs VALUES ('a0040', 'kept', NULL)"))
        rows = [(f"a{i:04}", f"b{i}", None) for i in range(100)]

        def write(txn: Transaction) -> None:
            writes = writes_for(txn)
            writes.insert("pairs", "a, b, c", [("first", "x", None)])
            writes.insert("pairs", "a, b, c", rows)
            writes.flush()

        with pytest.raises(Exception, match="(?i)unique|duplicate"):
            db.run(write)
        assert db.fetchall("SELECT a, b FROM pairs") == [("a0040", "kept")]
    finally:
        db.close()
