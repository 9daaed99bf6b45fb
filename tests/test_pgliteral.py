"""PostgreSQL statements with their parameters written in as literals
(``streamrep.db.pgliteral``): the same text psycopg2 writes, and the same rows."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrep.db.pgliteral import inline, literals_allowed
from streamrep.db.sql import to_pyformat

#: Text with what a literal must survive: quotes, backslashes, percent signs,
#: JSON escapes, comment and placeholder look-alikes, non-ASCII.
_TRICKY = st.lists(st.sampled_from(
    list("a'\\\"%?-/*;$\n\t") + ["é", "\u2028", "😀", "''", "\\'", "--", "/*", "%s"]),
    max_size=20).map("".join)
_VALUES = st.one_of(_TRICKY, st.integers(min_value=-2**63, max_value=2**63 - 1), st.none())


@pytest.fixture(scope="module")
def pg_cursor(pg_server: str) -> Iterator[Any]:
    import psycopg2

    conn = psycopg2.connect(pg_server)
    conn.autocommit = True
    try:
        yield conn.cursor()
    finally:
        conn.close()


def test_values_it_does_not_write_are_left_to_psycopg2() -> None:
    sql = to_pyformat("SELECT ?")
    assert inline(sql, ["a\x00b"]) is None  # NUL would end the statement's text
    assert inline(sql, [True]) is None
    assert inline(sql, [b"bytes"]) is None
    assert inline(sql, [1.5]) is None
    assert inline(sql, [["a"]]) is None


def test_literals() -> None:
    sql = to_pyformat("SELECT ?, ?, ?, '100%', ?")
    assert inline(sql, ["it's", -1, None, "a\\b"]) == "SELECT 'it''s',  -1, NULL, '100%', 'a\\b'"


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_VALUES, min_size=1, max_size=6))
def test_the_text_is_what_psycopg2_writes(pg_cursor: Any, values: list[Any]) -> None:
    assert literals_allowed(pg_cursor.connection)
    sql = to_pyformat("SELECT " + ", ".join("?" for _ in values) + " -- '%' ?")
    assert inline(sql, values) == pg_cursor.mogrify(sql, values).decode()


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_TRICKY, min_size=1, max_size=4))
def test_the_server_reads_back_each_string(pg_cursor: Any, values: list[str]) -> None:
    text = inline(to_pyformat("SELECT " + ", ".join("?::text" for _ in values)), values)
    assert text is not None
    pg_cursor.execute(text)
    assert list(pg_cursor.fetchone()) == values


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_statements_through_a_transaction_keep_strings_exactly(pg_url: str,
                                                              conforming: str) -> None:
    """With ``standard_conforming_strings`` off the server reads backslashes in a
    literal as escapes, so the literals are left to psycopg2 (which writes ``E''``)."""
    from urllib.parse import quote

    from streamrep.db import Database

    url = pg_url.replace("options=", "options="
                         + quote(f"-cstandard_conforming_strings={conforming} "))
    db = Database(url)
    try:
        allowed = db.run(lambda txn: literals_allowed(txn.cursor.connection))
        assert allowed is (conforming == "on")
        tricky = ["it's", "a\\'b", "a\\nb", "100%s", "x\x01y", "é😀", "-- not a comment",
                  "'); DROP TABLE t; --"]
        db.run(lambda txn: txn.execute("CREATE TABLE t (k BIGINT, v TEXT)"))
        for k, v in enumerate(tricky):
            db.run(lambda txn, k=k, v=v: txn.execute("INSERT INTO t VALUES (?, ?)", (-k, v)))
        rows = db.run(lambda txn: txn.fetchall("SELECT k, v FROM t ORDER BY k DESC"))
        assert rows == [(-k, v) for k, v in enumerate(tricky)]
    finally:
        db.close()
