"""``streamrep spark reconstruct`` and ``compress``: the state tables, in bulk.

Runs the Spark job (``local[*]`` on 127.0.0.1 unless ``--master`` says
otherwise) or, with ``--single-process``, the same pipeline without Spark.
"""

from __future__ import annotations

from typing import Any, Callable

import click

from streamrep.cli.exits import CommandFailed, ExitCode


@click.group("spark")
def spark() -> None:
    """Bulk jobs on Spark."""


def _parse_groups(values: tuple[str, ...], groups_file: str | None) -> tuple[int, ...]:
    texts: list[str] = []
    for value in values:
        texts.extend(value.split(","))
    if groups_file:
        with open(groups_file) as f:
            texts.extend(f.read().split())
    try:
        return tuple(sorted({int(t) for t in texts if t.strip()}))
    except ValueError as exc:
        raise click.BadParameter(f"state group IDs must be integers ({exc})") from None


def _apply(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """One decorator applying *options* so that ``--help`` lists them in order."""

    def decorate(command: Any) -> Any:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _source_options(input_help: str, output_help: str) -> Callable[[Any], Any]:
    """Where a job reads its tables, where it writes, and the Spark master."""
    return _apply([
        click.option("--input", "input_dir", type=click.Path(file_okay=False, exists=True),
                     help=input_help),
        click.option("--jdbc-url", metavar="URL",
                     help="Read the tables from PostgreSQL instead (postgresql:// or jdbc:postgresql://)."),
        click.option("--db", "db_url", metavar="URL",
                     help="With --single-process: read from this database (postgresql:// or sqlite:///)."),
        click.option("--output", required=True, type=click.Path(file_okay=False), help=output_help),
        click.option("--master", default=None,
                     help="Spark master URL (default local[*], bound to 127.0.0.1)."),
    ])


#: How a job runs: Spark settings, the single-process mode, the output folder's fate.
_run_options = _apply([
    click.option("--shuffle-partitions", default=None, type=click.IntRange(min=1),
                 help="spark.sql.shuffle.partitions (default twice the local cores, at least 4)."),
    click.option("--jdbc-partitions", default=None, type=click.IntRange(min=1),
                 help="Range partitions per table for JDBC reads (default from the row count)."),
    click.option("--executor-memory", default=None, metavar="SIZE",
                 help="Most memory each Spark executor process may hold (in local mode the JVM "
                      "and each Python worker): sets the JVM heap and its off-heap caps, and for "
                      "compress splits rooms into shares a Python worker holds "
                      "(default 2g; under spark-submit, spark-submit's settings)."),
    click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Extra Spark settings."),
    click.option("--single-process", is_flag=True, help="Run without Spark, in this process."),
    click.option("--overwrite", is_flag=True, help="Replace a non-empty output directory."),
    click.option("--json", "as_json", is_flag=True,
                 help="Print the summary as one JSON object (counts, timings) instead of a line."),
])


def _source_and_conf(input_dir: str | None, jdbc_url: str | None, db_url: str | None,
                     single_process: bool, confs: tuple[str, ...],
                     missing: str) -> tuple[str | None, dict[str, str]]:
    """The database URL (or None for --input) and the --conf settings, checked;
    *missing* is the usage error for neither or both of the inputs."""
    if db_url and not single_process:
        raise click.UsageError("--db is for --single-process; the Spark job takes --jdbc-url")
    database = jdbc_url or db_url
    if (input_dir is None) == (database is None):
        raise click.UsageError(missing)
    conf: dict[str, str] = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"--conf expects KEY=VALUE, not {item!r}")
        conf[key] = value
    return database, conf


@spark.command("reconstruct")
@_source_options(
    input_help="Directory with state_groups, state_group_edges and state_groups_state "
               "(and optionally event_to_state_groups) as CSV or Parquet.",
    output_help="Directory for the Parquet output.",
)
@click.option("--digest", is_flag=True,
              help="One row per group with a SHA-256 digest of its full state, not the state.")
@click.option("--group", "group_values", multiple=True, metavar="ID[,ID...]",
              help="Only these state groups (repeatable).")
@click.option("--groups-file", type=click.Path(dir_okay=False, exists=True),
              help="Only the state groups listed in this file (whitespace separated).")
@click.option("--room", "rooms", multiple=True, metavar="ROOM_ID",
              help="Only state groups of these rooms (repeatable).")
@click.option("--referenced-by-events", is_flag=True,
              help="Only state groups that event_to_state_groups references.")
@click.option("--verify", default=0, type=click.IntRange(min=0), metavar="N",
              help="Recompute N random groups by walking their chain and fail on any difference.")
@click.option("--seed", default=0, type=int, help="Seed for choosing the --verify groups.")
@click.option("--split-threshold", default=200_000, type=click.IntRange(min=1), show_default=True,
              help="Trees with more groups than this are split into pieces.")
@_run_options
def reconstruct(input_dir: str | None, jdbc_url: str | None, db_url: str | None, output: str,
                master: str | None, digest: bool, group_values: tuple[str, ...],
                groups_file: str | None, rooms: tuple[str, ...], referenced_by_events: bool,
                verify: int, seed: int, split_threshold: int, shuffle_partitions: int | None,
                jdbc_partitions: int | None, executor_memory: str | None, confs: tuple[str, ...],
                single_process: bool, overwrite: bool, as_json: bool) -> None:
    """Write the full state of every wanted state group as Parquet
    (``state_group, type, state_key, event_id``), or its digest."""
    from streamrep.spark.job import executor_memory_bound
    from streamrep.spark.options import ReconstructOptions, Source

    database, conf = _source_and_conf(input_dir, jdbc_url, db_url, single_process, confs,
                                      "give exactly one of --input and --jdbc-url")
    try:
        source = Source(input_dir=input_dir, db_url=database)
        options = ReconstructOptions(
            output=output, digest=digest, groups=_parse_groups(group_values, groups_file),
            rooms=tuple(rooms), referenced_by_events=referenced_by_events,
            split_threshold=split_threshold, verify=verify, seed=seed, overwrite=overwrite,
        )
        if single_process:
            from streamrep.cli._progress import GroupProgress
            from streamrep.spark.local import reconstruct_local

            progress = GroupProgress("reconstruct")
            try:
                result = reconstruct_local(source, options, progress=progress)
            finally:
                progress.close()
        else:
            from streamrep.spark.job import reconstruct_spark

            result = _run_spark(reconstruct_spark, source, options, master, shuffle_partitions,
                                jdbc_partitions, conf, executor_memory=executor_memory_bound(executor_memory))
    except Exception as exc:
        raise job_failure(exc, database) from exc
    echo_summary(result, as_json, "reconstruct")


def echo_summary(result: Any, as_json: bool, command: str) -> None:
    """Print a job's summary: one line, or with *as_json* one JSON object of its
    fields (dataclass fields, timings in seconds) and the command's name."""
    if not as_json:
        click.echo(result.summary())
        return
    import dataclasses
    import json

    fields = dataclasses.asdict(result)
    click.echo(json.dumps({"command": command, **fields}, sort_keys=True))


def _missing_state_tables(exc: BaseException) -> bool:
    """Whether *exc* is a database saying a table it was asked for does not exist."""
    import sqlite3

    if isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc):
        return True
    return getattr(exc, "pgcode", None) == "42P01" or "relation \"state_group" in str(exc)


def job_failure(exc: Exception, database: str | None) -> Exception:
    """The one-line failure (with its fix) a state job's error stands for, or
    *exc* itself for streamrep.cli.exits to report."""
    from streamrep.errors import StateCorruptionError, StateVerificationError

    if isinstance(exc, StateCorruptionError):
        return CommandFailed(ExitCode.STATE_CORRUPT, f"{exc}; repair or remove the named state "
                             "groups' rows in state_group_edges and state_groups_state, then run again")
    if isinstance(exc, StateVerificationError):
        return CommandFailed(ExitCode.STATE_MISMATCH, f"{exc}; nothing was written to the "
                             "database: report it with the named groups")
    if database is not None and _missing_state_tables(exc):
        from streamrep.db.url import redact_url

        first = str(exc).strip().splitlines()[0]
        return CommandFailed(ExitCode.DATABASE_STATE, f"{redact_url(database)} has no state tables "
                             f"({first}); give the database of a Synapse or streamrep deployment, "
                             "which holds state_groups, state_group_edges and state_groups_state")
    return exc


def _run_spark(job: Callable[..., Any], source: Any, options: Any, master: str | None,
               shuffle_partitions: int | None, jdbc_partitions: int | None,
               conf: dict[str, str], **session: Any) -> Any:
    """``job(spark, source, options, jdbc_partitions=...)`` on a session built
    for it (extra *session* arguments go to ``build_session``), stopped after."""
    from streamrep.spark.job import build_session

    click.echo(f"reading {source.describe()} with Spark ({master or 'local[*]'})", err=True)
    spark_session = build_session(master, shuffle_partitions=shuffle_partitions, conf=conf, **session)
    try:
        return job(spark_session, source, options, jdbc_partitions=jdbc_partitions)
    finally:
        spark_session.stop()


@spark.command("compress")
@_source_options(
    input_help="Directory with state_groups, state_group_edges and state_groups_state "
               "(and event_to_state_groups for --find-unreferenced) as CSV or Parquet.",
    output_help="Directory for the new tables and the change set (Parquet).",
)
@click.option("--max-depth", default=99, type=click.IntRange(min=1), show_default=True,
              help="Most prev hops from any group to its root after compression (99: chains "
                   "of at most 100 groups, counting the group, as the reference counts them).")
@click.option("--candidates", default=16, type=click.IntRange(min=0), show_default=True,
              help="Earlier groups of its room a snapshot considers as its new prev.")
@click.option("--find-unreferenced", is_flag=True,
              help="Also list groups no event references and no referenced group needs, "
                   "for deletion.")
@click.option("--split-threshold", default=200_000, type=click.IntRange(min=1), show_default=True,
              help="Rooms with more groups than this are split into shares of contiguous trees, "
                   "each linked to the previous one (a tree above it is cut by branch); on Spark, "
                   "so are rooms with more delta rows than --executor-memory lets a worker hold.")
@_run_options
def compress(input_dir: str | None, jdbc_url: str | None, db_url: str | None, output: str,
             master: str | None, max_depth: int, candidates: int, find_unreferenced: bool,
             split_threshold: int, shuffle_partitions: int | None, jdbc_partitions: int | None,
             executor_memory: str | None, confs: tuple[str, ...], single_process: bool, overwrite: bool,
             as_json: bool) -> None:
    """Choose shorter deltas for every state group, verify every changed group's
    full state, and write the new tables and the change set as Parquet.

    Nothing is written to the database: ``streamrep state apply-compression``
    does that from the change set."""
    from streamrep.spark.compress import CompressOptions
    from streamrep.spark.job import executor_memory_bound
    from streamrep.spark.options import Source

    database, conf = _source_and_conf(input_dir, jdbc_url, db_url, single_process, confs,
                                      "give exactly one of --input and --jdbc-url (or --db)")
    try:
        source = Source(input_dir=input_dir, db_url=database)
        memory = executor_memory_bound(executor_memory)
        options = CompressOptions(
            output=output, max_depth=max_depth, candidates=candidates,
            split_threshold=split_threshold, find_unreferenced=find_unreferenced,
            overwrite=overwrite,
            worker_memory=memory.total if memory is not None and not single_process else 0,
        )
        if single_process:
            from streamrep.cli._progress import GroupProgress
            from streamrep.spark.compress_local import compress_local

            progress = GroupProgress("compress")
            try:
                result = compress_local(source, options, progress=progress)
            finally:
                progress.close()
        else:
            from streamrep.spark.compress_job import compress_spark

            result = _run_spark(compress_spark, source, options, master, shuffle_partitions,
                                jdbc_partitions, conf, app_name="streamrep-compress-state",
                                executor_memory=memory)
        # Last: apply-compression checks every file against it before writing.
        from streamrep.spark.manifest import write_manifest

        write_manifest(output)
    except Exception as exc:
        raise job_failure(exc, database) from exc
    echo_summary(result, as_json, "compress")
