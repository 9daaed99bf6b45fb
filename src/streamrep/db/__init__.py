"""The database layer: one API over SQLite (embedded default) and PostgreSQL.

>>> db = Database.open("sqlite:////var/lib/streamrep/streamrep.db")
>>> with db.transaction() as txn:
...     txn.execute("INSERT INTO t (a) VALUES (?)", (1,))

See docs/database.md.
"""

from streamrep.db.database import Database, Row, Transaction, open_database
from streamrep.db.migrations import (
    Migration,
    register_schema,
    registered_components,
    unregister_schema,
)
from streamrep.db.url import POSTGRES, SQLITE, DatabaseURL, parse_database_url

__all__ = [
    "Database",
    "DatabaseURL",
    "Migration",
    "POSTGRES",
    "Row",
    "SQLITE",
    "Transaction",
    "open_database",
    "parse_database_url",
    "register_schema",
    "registered_components",
    "unregister_schema",
]
