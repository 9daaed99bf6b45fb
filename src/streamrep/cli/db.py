"""``streamrep db``: database maintenance commands."""

from __future__ import annotations

import click



@click.group("db")
def db() -> None:
    """Database maintenance."""


@db.command("repair-sequences")
@click.option("--db", "db_url", required=True, envvar="STREAMREP_DATABASE",
              help="Database URL (postgresql://...); also $STREAMREP_DATABASE.")
@click.option("--dry-run", is_flag=True, help="Report what would change; change nothing.")
def repair_sequences_command(db_url: str, dry_run: bool) -> None:
    """Move each multi-writer stream's sequence past every stream ID already used.

    Needed when a writer refuses to start with a sequence mismatch (after a database
    failover or a restore). Sequences already ahead are left alone.
    """
    from streamrep.db import Database
    from streamrep.idgen import repair_sequences
    from streamrep.catalogue import known_streams

    # A database that cannot be opened is reported by streamrep.cli.exits.
    database = Database.open(db_url, migrate=False)
    try:
        if not database.is_postgres:
            click.echo("SQLite streams have a single writer and no sequences: nothing to repair.")
            return
        known = [(d.name, d.sequence_name, d.tables, d.negative)
                 for d in known_streams() if d.sequence_name is not None]
        results = repair_sequences(database, dry_run=dry_run, known=known)
    finally:
        database.close()
    if not results:
        click.echo("No multi-writer stream sequences are recorded in this database.")
        return
    verb = "would move" if dry_run else "moved"
    for result in results:
        if result.repaired:
            click.echo(f"{result.stream_name}: sequence {result.sequence_name} {verb} "
                       f"from {result.before} to {result.after}")
        else:
            click.echo(f"{result.stream_name}: sequence {result.sequence_name} is fine "
                       f"(at {result.before})")
