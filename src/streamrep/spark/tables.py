"""The state tables, in the reference system's names, and reading them with pyarrow.

An input directory holds one entry per table, named after it: ``state_groups.csv``
(PostgreSQL ``COPY ... WITH CSV HEADER`` form: an empty unquoted field is NULL,
``""`` is the empty string), ``state_groups.parquet``, or a folder
``state_groups/`` of Parquet (or CSV) files. ``event_to_state_groups`` is
optional. The Spark job reads the same layout with Spark's readers.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from streamrep.db.url import POSTGRES, parse_database_url
from streamrep.errors import ConfigError

__all__ = [
    "TABLES",
    "REQUIRED_TABLES",
    "SCHEMAS",
    "TableFile",
    "locate_table",
    "read_table",
    "iter_db_table",
    "iter_db_query",
    "read_db_table",
    "DELTA_ROW_COUNTS_SQL",
    "DELTA_ROW_COUNTS_SCHEMA",
]

#: Table name -> Arrow schema, in the reference system's names and columns.
SCHEMAS: dict[str, pa.Schema] = {
    "state_groups": pa.schema(
        [("id", pa.int64()), ("room_id", pa.string()), ("event_id", pa.string())]
    ),
    "state_group_edges": pa.schema(
        [("state_group", pa.int64()), ("prev_state_group", pa.int64())]
    ),
    "state_groups_state": pa.schema(
        [
            ("state_group", pa.int64()),
            ("room_id", pa.string()),
            ("type", pa.string()),
            ("state_key", pa.string()),
            ("event_id", pa.string()),
        ]
    ),
    "event_to_state_groups": pa.schema(
        [("event_id", pa.string()), ("state_group", pa.int64())]
    ),
}

TABLES = tuple(SCHEMAS)
REQUIRED_TABLES = ("state_groups", "state_group_edges", "state_groups_state")


@dataclass(frozen=True)
class TableFile:
    """Where one table lives in an input directory and in which format."""

    table: str
    path: str
    format: str  # "csv" or "parquet"


def _folder_format(path: str) -> str:
    names = [n for n in os.listdir(path) if not n.startswith((".", "_"))]
    if any(n.endswith((".csv", ".csv.gz")) for n in names):
        return "csv"
    return "parquet"


def locate_table(input_dir: str, table: str) -> TableFile | None:
    """The file or folder of *table* in *input_dir*, or None if there is none."""
    base = os.path.join(input_dir, table)
    for suffix, fmt in ((".csv", "csv"), (".csv.gz", "csv"), (".parquet", "parquet")):
        if os.path.isfile(base + suffix):
            return TableFile(table, base + suffix, fmt)
    for suffix in ("", ".csv", ".parquet"):
        if os.path.isdir(base + suffix):
            fmt = "csv" if suffix == ".csv" else "parquet" if suffix else _folder_format(base)
            return TableFile(table, base + suffix, fmt)
    return None


def require_table(input_dir: str, table: str) -> TableFile:
    found = locate_table(input_dir, table)
    if found is None:
        raise ConfigError(
            f"{input_dir} has no {table}: expected {table}.csv, {table}.parquet or a "
            f"{table}/ folder of Parquet files"
        )
    return found


def _csv_format(table: str) -> ds.CsvFileFormat:
    schema = SCHEMAS[table]
    return ds.CsvFileFormat(
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=schema,
            strings_can_be_null=True,  # an empty unquoted field is NULL ...
            quoted_strings_can_be_null=False,  # ... and "" the empty string
            null_values=[""],
        ),
    )


def table_dataset(found: TableFile) -> ds.Dataset:
    """A pyarrow dataset over *found* with the table's schema."""
    schema = SCHEMAS[found.table]
    if found.format == "csv":
        return ds.dataset(found.path, format=_csv_format(found.table), schema=schema)
    return ds.dataset(found.path, format="parquet")


def read_table(
    input_dir: str, table: str, columns: list[str] | None = None,
    filter: ds.Expression | None = None,
) -> pa.Table:
    """Read *table* (or only *columns* of it) from *input_dir* into memory."""
    found = require_table(input_dir, table)
    dataset = table_dataset(found)
    schema = SCHEMAS[table]
    wanted = columns or schema.names
    missing = [c for c in wanted if c not in dataset.schema.names]
    if missing:
        raise ConfigError(f"{found.path} lacks the columns {', '.join(missing)} of {table}")
    result = dataset.to_table(columns=wanted, filter=filter)
    return result.cast(pa.schema([schema.field(c) for c in wanted]))


# --- databases ------------------------------------------------------------------

_SELECTS = {
    table: f"SELECT {', '.join(schema.names)} FROM {table}" for table, schema in SCHEMAS.items()
}


#: Each group's count of delta rows, counted by the database: a row per group
#: crosses the connection instead of every delta row.
DELTA_ROW_COUNTS_SQL = ("SELECT state_group AS count_group, count(*) AS counted "
                        "FROM state_groups_state GROUP BY state_group")
DELTA_ROW_COUNTS_SCHEMA = pa.schema([("count_group", pa.int64()), ("counted", pa.int64())])


def iter_db_table(url: str, table: str, batch_rows: int = 250_000) -> Iterator[pa.RecordBatch]:
    """Stream *table* out of the database at *url* as record batches.

    PostgreSQL streams with ``COPY ... TO STDOUT WITH CSV HEADER`` through a pipe
    into pyarrow's CSV reader; SQLite uses plain selects in chunks.
    """
    return iter_db_query(url, _SELECTS[table], SCHEMAS[table], batch_rows)


def iter_db_query(url: str, query: str, schema: pa.Schema,
                  batch_rows: int = 250_000) -> Iterator[pa.RecordBatch]:
    """Stream the rows of *query* (a ``SELECT`` whose columns are *schema*'s) out
    of the database at *url*, as :func:`iter_db_table` streams a table."""
    parsed = parse_database_url(url)
    if parsed.engine == POSTGRES:
        yield from _iter_postgres(parsed.target, query, schema)
        return
    conn = sqlite3.connect(parsed.target)
    try:
        cur = conn.execute(query)
        while True:
            rows = cur.fetchmany(batch_rows)
            if not rows:
                break
            columns = list(zip(*rows))
            yield pa.RecordBatch.from_arrays(
                [pa.array(col, type=f.type) for col, f in zip(columns, schema)], schema=schema
            )
    finally:
        conn.close()


def _iter_postgres(dsn: str, query: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    import psycopg2

    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        from streamrep.db.green import suspended_wait_callback

        try:
            # psycopg2 refuses COPY while the process's gevent wait callback is set.
            with suspended_wait_callback():
                with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                    with os.fdopen(write_fd, "wb") as sink:
                        cur.copy_expert(f"COPY ({query}) TO STDOUT WITH CSV HEADER", sink)
                conn.close()
        except BaseException as exc:  # handed to the reading side
            failure.append(exc)
            try:
                os.close(write_fd)
            except OSError:
                pass

    producer = threading.Thread(target=produce, name="copy-out", daemon=True)
    producer.start()
    try:
        with os.fdopen(read_fd, "rb") as source:
            reader = pacsv.open_csv(
                source,
                read_options=pacsv.ReadOptions(block_size=8 << 20),
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(
                    column_types=schema,
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                    null_values=[""],
                ),
            )
            for batch in reader:
                yield batch.cast(schema) if batch.schema != schema else batch
    except (pa.ArrowInvalid, StopIteration):
        if not failure:
            raise
    finally:
        producer.join(timeout=60)
    if failure:
        raise failure[0]


def read_db_table(url: str, table: str) -> pa.Table:
    """All of *table* from the database at *url*, as one Arrow table."""
    batches = list(iter_db_table(url, table))
    return pa.Table.from_batches(batches, schema=SCHEMAS[table])


def write_parquet(batches: Iterator[pa.RecordBatch], path: str, schema: pa.Schema) -> int:
    """Write *batches* to one Parquet file; returns the number of rows."""
    rows = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows
