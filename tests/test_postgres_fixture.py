"""The PostgreSQL fixture gives each test its own schema."""

from __future__ import annotations

import psycopg2
import pytest


@pytest.mark.postgres
def test_pg_url_isolates_a_schema(pg_url: str) -> None:
    conn = psycopg2.connect(pg_url)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE probe (x int)")
            cur.execute("SELECT current_schema()")
            (schema,) = cur.fetchone()
        assert schema.startswith("sr_")
    finally:
        conn.rollback()
        conn.close()
