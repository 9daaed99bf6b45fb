"""``streamrep write``: a writer process persisting synthetic facts and announcing them."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any, Callable

import click

from streamrep.cli._common import freeze_startup_heap, peer_settings, use_cooperative_sockets
from streamrep.cli._hubwatch import HubWatch
from streamrep.cli.exits import ExitCode
from streamrep.cli._security import peer_security_from_context, peer_security_options
from streamrep.cli.options import config_option
from streamrep.streams.builtin import ACCOUNT_DATA, CACHES, RECEIPTS, TO_DEVICE

#: Streams ``write`` can fill with synthetic facts.
WRITABLE_STREAMS = (CACHES.name, ACCOUNT_DATA.name, TO_DEVICE.name, RECEIPTS.name)


def _fact_writer(streams: Any, stream: str, instance: str, rows_per_fact: int) -> Callable[[int], int]:
    """A function persisting synthetic fact number *i* on *stream*; returns its token."""
    if stream == CACHES.name:
        return lambda i: int(streams.add_cache_invalidation("synthetic_cache", [f"{instance}:{i}"]))
    if stream == ACCOUNT_DATA.name:
        return lambda i: int(streams.add_account_data(f"@{instance}-{i}:synthetic", "m.synthetic", {"n": i}))
    if stream == TO_DEVICE.name:
        return lambda i: int(streams.send_to_device(
            [(f"@u{j}:synthetic", f"{instance}D{i}", {"n": i}) for j in range(rows_per_fact)]))
    if stream == RECEIPTS.name:
        return lambda i: int(streams.add_receipt(f"!r{i}:synthetic", "m.read", f"@{instance}:synthetic", f"$e{i}"))
    raise click.BadParameter(f"{stream} (writable: {', '.join(WRITABLE_STREAMS)})", param_hint="--stream")


@click.command()
@config_option
@peer_security_options
@click.option("--connect", default=None, help="HOST:PORT of the hub (default: the configuration's listen).")
@click.option("--redis", "redis_url", default=None, metavar="URL",
              help="Publish through Redis pub/sub instead of the hub (needs --server-name).")
@click.option("--db", "db", default=None, help="Database URL shared with the hub (default: the configuration's).")
@click.option("--instance-name", required=True, help="This writer's instance name.")
@click.option("--stream", required=True, help=f"Stream to write ({', '.join(WRITABLE_STREAMS)}).")
@click.option("--count", type=click.IntRange(min=0), required=True, help="Facts to persist.")
@click.option("--rate", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Facts per second (0: as fast as possible).")
@click.option("--rows-per-fact", type=click.IntRange(min=1), default=1, show_default=True,
              help="Rows per fact (to_device only: one per recipient).")
@click.option("--server-name", default=None, help="Expected SERVER name of the hub.")
@click.option("--announce-timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the hub once everything is persisted.")
def write(config_path: str | None, connect: str | None, redis_url: str | None, db: str | None, instance_name: str, stream: str, count: int, rate: float,
          rows_per_fact: int, server_name: str | None, announce_timeout: float) -> None:
    """Persist COUNT synthetic facts on STREAM as INSTANCE-NAME and announce them.

    Facts keep being persisted while the hub is unreachable; on reconnection the
    writer announces its position and the hub fills in what it missed from the
    database. Exits 0 once every fact is persisted and announced.

    With ``--redis`` there is no hub: the writer publishes its facts itself and
    readers fill what they missed from the database.
    """
    settings = peer_settings(config_path, connect, db, server_name, redis_url)
    if settings.redis_url is not None:
        if settings.server_name is None:
            raise click.UsageError("--redis needs --server-name NAME (the deployment's Redis channel)")
        use_cooperative_sockets()
    import gevent
    import gevent.event

    from streamrep.db import open_database
    from streamrep.errors import (DatabaseUnavailableError, WriterLeaseHeldError,
                                  WriterLeaseLostError)
    from streamrep.idgen import WriterLease
    from streamrep.replication import ReplicationClient
    from streamrep.replication.registry_source import RegistrySource
    from streamrep.streams import Streams

    host, port, server_name = settings.host, settings.port, settings.server_name
    if settings.database is None:
        raise click.UsageError("give --db URL (or --config FILE)")
    writers = settings.stream_writers.get(stream)
    if writers is not None and instance_name not in writers:
        raise click.UsageError(f"{instance_name} does not write {stream} in {config_path} "
                               f"(its writers: {', '.join(writers)})")
    if stream not in WRITABLE_STREAMS:
        raise click.BadParameter(f"{stream} (writable: {', '.join(WRITABLE_STREAMS)})", param_hint="--stream")
    database = open_database(settings.database)
    # One process per writer instance: a second one is refused here, naming the first.
    # Once lost, the lease refuses the next stream ID (WriterLeaseLostError below).
    lease = WriterLease(database, instance_name, [stream], ttl=settings.writer_lease_ttl)
    try:
        lease.acquire()
    except (WriterLeaseHeldError, DatabaseUnavailableError) as exc:
        database.close()
        click.echo(f"error: {exc}", err=True)
        sys.exit(ExitCode.LEASE_HELD if isinstance(exc, WriterLeaseHeldError)
                 else ExitCode.DATABASE_UNAVAILABLE)
    streams = Streams(database, instance_name, {stream: writers or [instance_name]})
    lease.guard([streams.generator(stream)])
    source = RegistrySource(streams, [stream])
    persist = _fact_writer(streams, stream, instance_name, rows_per_fact)
    announced = {"upto": source.current_token(stream, instance_name)}

    positions = lambda: [(stream, instance_name, streams.current_token(stream, instance_name))]  # noqa: E731
    client: Any
    watch = HubWatch("write")
    if settings.redis_url is not None:
        from streamrep.replication.transport.redis import RedisReplication

        assert server_name is not None
        client = RedisReplication(
            settings.redis_url, server_name=server_name, instance_name=instance_name,
            writer_positions=positions, ping_interval=settings.connection.ping_interval,
            ping_timeout=settings.connection.ping_timeout)
    else:
        client = ReplicationClient(
            host, port, client_name=instance_name, server_name=server_name,
            security=peer_security_from_context(config_path, instance_name),
            settings=settings.connection, writer_positions=positions, on_retry=watch.retrying,
        )

    def announce_upto(position: int) -> None:
        start = announced["upto"]
        if not client.connected:
            # The next connection announces the position instead.
            announced["upto"] = max(start, position)
            return
        while start < position:
            rows, limited = source.updates(stream, instance_name, start, position, 5000)
            if not rows:
                break
            client.announce(stream, instance_name, rows)
            # Moved only past what was sent: a read that fails leaves the rest to
            # the next advance (or the final one below), so no fact stays behind.
            start = announced["upto"] = rows[-1][0]
            if not limited:
                break
        announced["upto"] = max(announced["upto"], position)

    def on_advance(stream_name: str, instance: str, visible: list[int], position: int) -> None:
        if stream_name != stream or instance != instance_name:
            return
        try:
            announce_upto(position)
        except Exception as exc:
            click.echo(f"write: announcing up to token {position} failed ({exc}); "
                       "retrying with the next fact", err=True)

    streams.add_listener(on_advance)
    client.start()
    freeze_startup_heap()
    started = time.monotonic()
    last_report = started
    code = 0
    # SIGTERM or SIGINT: stop after the current fact, announce, give the lease back
    # (so a restarted writer starts at once) and exit.
    stopping = gevent.event.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stopping.set)
    try:
        for i in range(count):
            if stopping.is_set():
                click.echo(f"write: stopped by a signal after {i} of {count} facts", err=True)
                count = i
                break
            persist(i)
            if rate > 0:
                delay = started + (i + 1) / rate - time.monotonic()
                stopping.wait(max(delay, 0))
            else:
                gevent.sleep(0)
            now = time.monotonic()
            if now - last_report >= 2:
                last_report = now
                click.echo(f"write: {i + 1}/{count} persisted, hub {'up' if client.connected else 'down'}", err=True)
        persisted_at = time.monotonic()
        announce_upto(streams.current_token(stream, instance_name))
        ok = client.flush(announce_timeout)
        click.echo(
            f"write: {count} facts persisted in {persisted_at - started:.2f}s"
            f" up to token {streams.current_token(stream, instance_name)};"
            f" {'announced' if ok else 'NOT announced (hub unreachable)'}",
            err=True,
        )
        if not ok and settings.redis_url is None:
            raise watch.failure(f"{count} facts persisted but not announced within "
                                f"--announce-timeout {announce_timeout:g}s")
        code = ExitCode.OK if ok else ExitCode.FAILED
    except (WriterLeaseLostError, DatabaseUnavailableError) as exc:
        click.echo(f"error: {exc}", err=True)
        code = (ExitCode.LEASE_LOST if isinstance(exc, WriterLeaseLostError)
                else ExitCode.DATABASE_UNAVAILABLE)
    finally:
        client.stop()
        streams.close()
        lease.release()
        database.close()
    sys.exit(code)
