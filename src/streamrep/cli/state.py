"""``streamrep state ...``: tools for the state group tables."""

from __future__ import annotations

import click

from streamrep.errors import StreamrepError


@click.group("state")
def state() -> None:
    """Tools for the state group tables."""


@state.command("export")
@click.option("--db", "db_url", required=True, metavar="URL",
              help="Database URL (postgresql://... or sqlite:///path).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory to write one Parquet folder per table into.")
@click.option("--overwrite", is_flag=True, help="Replace files already in the directory.")
def export(db_url: str, out_dir: str, overwrite: bool) -> None:
    """Export state_groups, state_group_edges, state_groups_state and
    event_to_state_groups to Parquet, streaming with COPY on PostgreSQL.

    The directory can then be given to ``streamrep spark reconstruct --input``.
    """
    from streamrep.spark.export import export_tables

    import sqlite3

    import psycopg2

    try:
        report = export_tables(db_url, out_dir, overwrite=overwrite)
    except (StreamrepError, OSError, sqlite3.Error, psycopg2.Error) as exc:
        raise click.ClickException(str(exc).strip()) from None
    for table, (rows, seconds) in report.items():
        click.echo(f"{table}: {rows} rows in {seconds:.2f}s")
