"""``streamrep state export``: the state tables out of a database into Parquet.

PostgreSQL tables stream out with ``COPY ... TO STDOUT WITH CSV HEADER`` through
pyarrow's CSV reader into a Parquet writer, so memory stays bounded by one
block; SQLite uses plain selects in chunks. The output directory is laid out
the way ``streamrep spark reconstruct --input`` reads it: one folder per table.
"""

from __future__ import annotations

import os
import time

import pyarrow.parquet as pq

from streamrep.errors import ConfigError
from streamrep.spark.tables import SCHEMAS, TABLES, iter_db_table

__all__ = ["export_tables"]


def export_tables(db_url: str, out_dir: str, tables: tuple[str, ...] = TABLES,
                  overwrite: bool = False) -> dict[str, tuple[int, float]]:
    """Write *tables* of the database at *db_url* under *out_dir*.

    Returns ``{table: (rows, seconds)}``. Each table becomes
    ``out_dir/<table>/part-00000.parquet``.
    """
    unknown = [t for t in tables if t not in SCHEMAS]
    if unknown:
        raise ConfigError(f"unknown state tables: {', '.join(unknown)}")
    report: dict[str, tuple[int, float]] = {}
    for table in tables:
        folder = os.path.join(out_dir, table)
        path = os.path.join(folder, "part-00000.parquet")
        if os.path.exists(path) and not overwrite:
            raise ConfigError(f"{path} exists (use --overwrite)")
        os.makedirs(folder, exist_ok=True)
        clock = time.perf_counter()
        rows = 0
        partial = path + ".partial"
        with pq.ParquetWriter(partial, SCHEMAS[table], compression="zstd") as writer:
            for batch in iter_db_table(db_url, table):
                writer.write_batch(batch)
                rows += batch.num_rows
        os.replace(partial, path)
        report[table] = (rows, time.perf_counter() - clock)
    return report
