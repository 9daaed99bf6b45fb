"""``streamrep state ...``: tools for the state group tables."""

from __future__ import annotations

from typing import Any

import click

from streamrep.cli.exits import ExitCode


@click.group("state")
def state() -> None:
    """Tools for the state group tables."""


@state.command("export")
@click.option("--db", "db_url", required=True, metavar="URL",
              help="Database URL (postgresql://... or sqlite:///path).")
@click.option("--output", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Directory to write one Parquet folder per table into.")
@click.option("--out", "out_alias", default=None, type=click.Path(file_okay=False), hidden=True)
@click.option("--overwrite", is_flag=True, help="Replace files already in the directory.")
def export(db_url: str, out_dir: str | None, out_alias: str | None, overwrite: bool) -> None:
    """Export state_groups, state_group_edges, state_groups_state and
    event_to_state_groups to Parquet, streaming with COPY on PostgreSQL.

    The directory can then be given to ``streamrep spark reconstruct --input``.
    """
    from streamrep.cli.spark import job_failure
    from streamrep.spark.export import export_tables

    target = out_dir or out_alias
    if target is None:
        raise click.UsageError("give --output DIRECTORY")
    # Unreachable databases, bad paths and a missing pyarrow are reported by
    # streamrep.cli.exits.
    try:
        report = export_tables(db_url, target, overwrite=overwrite)
    except Exception as exc:
        raise job_failure(exc, db_url) from exc
    for table, (rows, seconds) in report.items():
        click.echo(f"{table}: {rows} rows in {seconds:.2f}s")


@state.command("apply-compression")
@click.option("--db", "db_url", required=True, metavar="URL",
              help="Database URL (postgresql://... or sqlite:///path).")
@click.option("--changes", "changes_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Output directory of `streamrep spark compress`.")
@click.option("--batch-groups", default=1000, type=click.IntRange(min=1), show_default=True,
              help="Groups per transaction: small rooms share one, a larger room gets several.")
@click.option("--no-verify", is_flag=True,
              help="Do not walk each rewritten group's chain before committing.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object (counts, skips by reason) instead of a line.")
@click.option("--undo", is_flag=True,
              help="Apply the change set backwards: old prev groups and rows back, deleted groups "
                   "restored.")
def apply_compression(db_url: str, changes_dir: str, batch_groups: int, no_verify: bool,
                      as_json: bool, undo: bool) -> None:
    """Write a compression change set to the database in short transactions
    of about --batch-groups groups; groups changed since the compress run are
    skipped, each on its own.

    Safe to stop at any point and run again."""
    import sqlite3
    import sys

    import psycopg2

    from streamrep.errors import ConfigError, StateVerificationError
    from streamrep.spark.manifest import check_manifest

    # Every file is checked before the first write: a damaged change set is
    # refused whole (exit 13), never applied in part.
    check_manifest(changes_dir)
    try:
        report = _apply_retrying(db_url, changes_dir, batch_groups=batch_groups,
                                 verify=not no_verify, undo=undo)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except StateVerificationError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(ExitCode.STATE_MISMATCH)
    except (psycopg2.Error, sqlite3.Error) as exc:
        click.echo(f"error: the database refused the change set ({str(exc).strip().splitlines()[0]}); "
                   "check the URL and that the state tables exist, then run again", err=True)
        sys.exit(ExitCode.DATABASE_STATE)
    from streamrep.cli.spark import echo_summary

    echo_summary(report, as_json, "apply-compression")


def _apply_retrying(db_url: str, changes_dir: str, **options: Any) -> Any:
    """Apply the change set, starting again on a new connection when the
    connection drops, for up to the URL's ``reconnect_timeout`` seconds.

    Each transaction commits whole or not at all and a rerun finds the
    committed groups already rewritten, so starting again loses and repeats
    nothing; the last attempt's report counts them as already rewritten.
    """
    import logging
    import time

    from streamrep.db.retry import Backoff, first_line, is_connection_loss
    from streamrep.db.url import parse_database_url
    from streamrep.errors import DatabaseUnavailableError
    from streamrep.spark.compress_apply import apply_compression as apply

    from streamrep.cli._progress import GroupProgress

    target = parse_database_url(db_url)
    backoff: Backoff | None = None
    progress = GroupProgress("apply-compression")
    total = _changed_groups(changes_dir)

    def report_progress(report: Any) -> None:
        done = (report.rewritten + report.already_rewritten + report.deleted
                + report.already_deleted + report.restored + report.already_restored
                + sum(report.skipped.values()))
        progress(done, total)

    while True:
        try:
            try:
                return apply(db_url, changes_dir, after_transaction=None,
                             progress=report_progress, **options)
            finally:
                progress.close()
        except Exception as exc:
            if not is_connection_loss(exc):
                raise
            backoff = backoff or Backoff(target.reconnect_timeout)
            delay = backoff.next_delay()
            if delay is None:
                raise DatabaseUnavailableError(
                    f"database {target.redacted()} unavailable for {backoff.elapsed:.0f}s during "
                    f"apply-compression ({first_line(exc)}); the transactions committed so far "
                    "stay, and a rerun carries on (reconnect_timeout in the URL sets how long "
                    "to retry)") from exc
            logging.getLogger("streamrep.state").warning(
                "apply-compression: database connection lost (%s); starting again on a new "
                "connection (committed transactions are kept)", first_line(exc))
            time.sleep(delay)


def _changed_groups(changes_dir: str) -> int:
    """How many groups the change set lists (from the Parquet footers)."""
    import os

    import pyarrow.dataset as ds

    folder = os.path.join(changes_dir, "changes")
    return int(ds.dataset(folder, format="parquet").count_rows()) if os.path.isdir(folder) else 0
