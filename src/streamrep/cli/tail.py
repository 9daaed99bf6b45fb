"""``streamrep tail``: a worker printing every fact it receives as JSON lines."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from streamrep.cli._common import catch_up_over_http, freeze_startup_heap, peer_settings, use_cooperative_sockets
from streamrep.cli._durable import close_keeper, keeper_failed, open_keeper
from streamrep.cli._following import StallReport, describe_writers, serve_link_metrics
from streamrep.cli.exits import CommandFailed, ExitCode
from streamrep.cli._linkwatch import LinkWatch
from streamrep.cli._printing import ROW_STYLES, TailPrinter
from streamrep.cli._security import peer_security_from_context, peer_security_options
from streamrep.cli.options import config_option

if TYPE_CHECKING:
    from streamrep.cli._common import PeerSettings


def parse_from(value: str | None) -> dict[Any, int]:
    """``--from``: a token for every writer (``5``) or per writer (``w1=5,w2=9``)."""
    if value is None:
        return {}
    value = value.strip()
    out: dict[Any, int] = {}
    try:
        if "=" not in value:
            out[None] = int(value)
            return out
        for part in value.split(","):
            instance, _, token = part.partition("=")
            out[instance.strip()] = int(token)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected TOKEN or INSTANCE=TOKEN,...", param_hint="--from") from None
    return out


@click.command()
@config_option
@peer_security_options
@click.option("--connect", default=None, help="HOST:PORT of the hub (default: the configuration's listen).")
@click.option("--redis", "redis_url", default=None, metavar="URL",
              help="Follow through Redis pub/sub instead of the hub (redis://, rediss:// or "
                   "unix://; needs --server-name, the deployment's channel).")
@click.option("--stream", "stream_names", multiple=True, help="Stream to follow (repeatable; default all).")
@click.option("--from", "from_token", default=None,
              help="Start after this token (or INSTANCE=TOKEN,...); default: from now on.")
@click.option("--name", default="tail", show_default=True, help="Name sent to the hub.")
@click.option("--db", "db", default=None,
              help="Database URL, to catch up from the database directly (with --config: its database).")
@click.option("--server-name", default=None, help="Expected SERVER name of the hub.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Exit after this many facts.")
@click.option("--give-up-after", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Exit (status 5, or 6 for a wrong server name) once the hub has been "
                   "unreachable this long; default: keep retrying.")
@click.option("--cursor", "cursor_path", default=None, metavar="FILE",
              help="Record where it is in FILE after the facts it prints, and resume from there "
                   "(--from applies only while FILE does not exist yet).")
@click.option("--sink", "sink_url", default=None, metavar="DATABASE_URL",
              help="Write each fact's rows into streamrep_follow_rows of this SQLite or PostgreSQL "
                   "database instead of printing them, with the cursor in the same transaction.")
@click.option("--format", "row_style", type=click.Choice(ROW_STYLES), default="raw", show_default=True,
              help="raw: each row as the JSON array its stream carries; named: as an object keyed by "
                   "the reference's field names (docs/streams.md lists them).")
@click.option("--commands", "print_commands", is_flag=True,
              help="Also print the commands that carry no fact as they pass (POSITION, LOCK_RELEASED, "
                   "NEW_ACTIVE_TASK, USER_SYNC, ..., and commands this version does not know).")
@click.option("--synapse-config", "synapse_config", default=None, metavar="PATH",
              help="Follow the Matrix deployment this homeserver.yaml describes: its Redis and server "
                   "name, and each gap fetched from its writer's HTTP replication API (instance_map, "
                   "worker_replication_secret).")
@click.option("--metrics-listen", default=None, metavar="HOST:PORT",
              help="Serve the follower's Prometheus /metrics there.")
def tail(config_path: str | None, connect: str | None, redis_url: str | None, stream_names: tuple[str, ...],
         from_token: str | None, name: str, db: str | None, server_name: str | None, limit: int | None,
         give_up_after: float | None, cursor_path: str | None, sink_url: str | None, row_style: str,
         print_commands: bool, synapse_config: str | None, metrics_listen: str | None) -> None:
    """Follow streams and print each fact as one JSON object per line.

    Keys: ``stream``, ``instance``, ``token``, ``row`` (one line per row; rows of one
    fact share the token). Status goes to stderr. Every fact is printed exactly once
    and in order per writer, across reconnections.

    ``--format named`` prints ``row`` as an object keyed by field name (``events``
    rows: ``{"type": ..., "data": {...}}``). A row of a stream without a known
    format, or of another shape, is printed as it came, with ``unnamed`` saying why.
    ``--commands`` also prints ``{"command": NAME, <its fields>}`` for each command
    that carries no fact (``"unknown": true`` and ``line`` for one this version
    does not know).

    With ``--redis`` it follows a deployment that replicates through Redis (streamrep's
    or the reference implementation's) read-only. Without ``--db`` it cannot fetch
    facts it missed while Redis was unreachable; it says so once on stderr.

    ``--cursor FILE`` resumes where the last run stopped (exactly once across
    SIGTERM and SIGINT; after a SIGKILL the facts printed since the last save come
    again). ``--sink URL`` writes the rows and the cursor in one transaction:
    exactly once across any stop.

    ``--synapse-config homeserver.yaml`` follows a Matrix deployment with nothing else
    given: its Redis, and every gap fetched from the writer that has it over the
    reference's HTTP replication API. A writer that cannot be reached is held back
    alone, said once on stderr, and resumes when it answers.
    """
    settings = peer_settings(config_path, connect, db, server_name, redis_url, synapse_config)
    if settings.redis_url is not None:
        if settings.server_name is None:
            raise click.UsageError("--redis needs --server-name NAME (the deployment's Redis channel)")
        use_cooperative_sockets()
    run = _TailRun(settings, name, stream_names, limit)
    try:
        run.open_sources()
        start_from = run.starts(parse_from(from_token))
        run.open_link(config_path, start_from, cursor_path, sink_url, give_up_after,
                      row_style == "named", print_commands, metrics_listen)
        run.follow()
    finally:
        run.close()
    run.outcome()


class _TailRun:
    """One run of ``tail``, phase by phase: its catch-up sources, where it starts,
    its link, following until told to stop, closing, and how it ended."""

    def __init__(self, settings: PeerSettings, name: str, stream_names: tuple[str, ...], limit: int | None) -> None:
        import gevent.event

        self.settings = settings
        self.name = name
        self.stream_names = stream_names
        self.limit = limit
        self.done = gevent.event.Event()
        self.printed = 0
        self.database: Any = None
        self.streams_handle: Any = None
        self.source: Any = None
        self.http_source: Any = None
        self.keeper: Any = None
        self.client: Any = None
        self.metrics_server: Any = None
        self.watch: LinkWatch | None = None
        self._gap_told = False

    def open_sources(self) -> None:
        """The database to catch up from (``--db``), and the writers' HTTP replication
        API (``--synapse-config``)."""
        from streamrep.catalogue import known_streams

        settings = self.settings
        if settings.database is not None:
            from streamrep.db.deployment import open_existing
            from streamrep.replication.sources.database import DatabaseSource
            from streamrep.streams import Streams

            # A reader never creates a database, and refuses another deployment's.
            self.database = open_existing(settings.database, settings.server_name)
            # A reader: the writers come from the configuration (or are this process's
            # own name when there is none, which only matters for writing).
            self.streams_handle = Streams(self.database, self.name, settings.stream_writers,
                                          default_writer=settings.default_writer,
                                          definitions=known_streams())
            self.source = DatabaseSource(self.streams_handle, list(self.stream_names) or None)
        if settings.synapse is not None:
            self.http_source = catch_up_over_http(settings.synapse)
            describe_writers("tail", settings, self.http_source)

    @property
    def filler(self) -> Any:
        return self.source if self.source is not None else self.http_source

    def starts(self, starts: dict[Any, int]) -> dict[Any, int]:
        """``--from`` as a start per stream or per ``(stream, instance)``."""
        from streamrep.catalogue import known_streams

        filler = self.filler
        names = list(self.stream_names) or (list(filler.stream_names()) if filler is not None else None)
        if starts and names is None:
            names = list(known_streams().names())
        start_from: dict[Any, int] = {}
        for key, token in starts.items():
            for stream in names or ():
                start_from[stream if key is None else (stream, key)] = token
        return start_from

    def open_link(self, config_path: str | None, start_from: dict[Any, int], cursor_path: str | None,
                  sink_url: str | None, give_up_after: float | None, named: bool, print_commands: bool,
                  metrics_listen: str | None) -> None:
        """The link, its handler (printing, or the cursor's keeper around it) and metrics."""
        from streamrep.catalogue import row_formats
        from streamrep.replication import open_link

        settings = self.settings
        printer = TailPrinter(sys.stdout.buffer, row_formats() if named else None)

        def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
            printer.fact(stream, instance, token, rows)
            self.counted()

        self.watch = LinkWatch("tail", settings.where, "start the hub (streamrep serve) or fix --connect"
                               if settings.redis_url is None
                               else "start the Redis server or fix --redis (replication.redis.url)", give_up_after)
        security = None if settings.redis_url is not None else peer_security_from_context(config_path, self.name)
        self.keeper = open_keeper(cursor_path, sink_url, self.name, handler, start_from, self.counted)
        stalls = StallReport("tail")
        roles: dict[str, Any] = dict(source=self.filler, streams=self.stream_names or None,
                                     on_retry=self.watch.retrying, on_gap=self.unfilled_gap,
                                     on_command=printer.command if print_commands else None,
                                     hand_on_positions=print_commands, on_stall=stalls.stalled,
                                     on_resume=stalls.resumed)
        if self.keeper is not None:
            self.client = self.keeper.open_link(settings.link(self.name, security), **roles)
        else:
            self.client = open_link(settings.link(self.name, security), handler=handler, start_from=start_from,
                                    **roles)
        assert self.client.follower is not None
        self.metrics_server = serve_link_metrics(self.client, metrics_listen)

    def counted(self) -> None:
        self.printed += 1
        if self.limit is not None and self.printed >= self.limit:
            self.client.follower.hold()  # not one fact more, so a cursor records only what was taken
            self.done.set()

    def unfilled_gap(self, stream: str, instance: str, from_token: int, to_token: int) -> None:
        if not self._gap_told:
            self._gap_told = True
            why = ("without --db or --synapse-config" if self.filler is None
                   else "from that writer (the log line above says why)")
            click.echo(f"tail: missed facts of {stream}/{instance} after token {from_token} "
                       f"(it is at {to_token}) and cannot fetch them {why}; going on "
                       "from there (counted in streamrep_replication_client_gaps_unfilled)", err=True)

    def follow(self) -> None:
        """Start the link and follow until a signal, ``--limit``, a refusal or giving up."""
        import gevent

        client, watch, follower, done = self.client, self.watch, self.client.follower, self.done
        assert watch is not None

        def watch_link() -> None:
            while not done.is_set():
                if client.connected:
                    watch.connected()
                elif watch.given_up() or client.refused_credentials:
                    done.set()
                if (self.keeper is not None and self.keeper.failure is not None) or follower.refusal is not None:
                    done.set()
                gevent.sleep(0.1)

        gevent.spawn(watch_link)
        for signum in (signal.SIGTERM, signal.SIGINT):
            gevent.signal_handler(signum, done.set)
        click.echo(f"tail: following {', '.join(self.stream_names) or 'every stream'} on {self.settings.where}",
                   err=True)
        client.start()
        freeze_startup_heap()
        done.wait()

    def close(self) -> None:
        """Stop the link first (nothing more is handed on), then what it used."""
        if self.client is not None:
            self.client.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.http_source is not None:
            self.http_source.close()
        close_keeper(self.keeper)
        if self.streams_handle is not None:
            self.streams_handle.close()
        if self.database is not None:
            self.database.close()

    def outcome(self) -> None:
        """How the run ended: one line and a status for a failure, else the count."""
        client, keeper, watch = self.client, self.keeper, self.watch
        assert watch is not None
        if keeper is not None and keeper.failure is not None:
            raise keeper_failed(keeper)
        if client.refused_credentials:
            raise watch.failure("cannot follow", client.refusal, credentials=True)
        if client.follower.refusal is not None:
            raise CommandFailed(ExitCode.AUTHENTICATION, f"cannot fetch what it missed: {client.follower.refusal}")
        if watch.given_up():
            raise watch.failure(refusal=client.refusal)
        click.echo(f"tail: {self.printed} facts", err=True)
