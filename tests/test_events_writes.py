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
