"""``streamrep write``: a writer process persisting synthetic facts and announcing them."""

from __future__ import annotations

import signal
import time
from typing import Any, Callable

import click

from streamrep.cli._common import freeze_startup_heap, peer_settings, use_cooperative_sockets
from streamrep.cli._linkwatch import LinkWatch
from streamrep.cli._security import peer_security_from_context, peer_security_options
from streamrep.cli.exits import CommandFailed, ExitCode
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
@click.option("--server-name", default=None, help="The deployment's name (the hub's SERVER; the Redis channel).")
@click.option("--announce-timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait, once everything is persisted, until the hub (or Redis) "
                   "accepted every fact.")
def write(config_path: str | None, connect: str | None, redis_url: str | None, db: str | None,
          instance_name: str, stream: str, count: int, rate: float, rows_per_fact: int,
          server_name: str | None, announce_timeout: float) -> None:
    """Persist COUNT synthetic facts on STREAM as INSTANCE-NAME and announce them.

    Facts keep being persisted while the hub is unreachable; once connected the
    writer announces everything committed since the hub's last confirmation. Exits 0
    once every fact is persisted and the hub (or Redis) accepted its announcement;
    a refusal is one line with its own status.

    With ``--redis`` there is no hub: the writer publishes its facts itself.
    """
    settings = peer_settings(config_path, connect, db, server_name, redis_url)
    if settings.redis_url is not None:
        if settings.server_name is None:
            raise click.UsageError("--redis needs --server-name NAME (the deployment's Redis channel)")
        use_cooperative_sockets()
    if settings.database is None:
        raise click.UsageError("give --db URL (or --config FILE)")
    writers = settings.stream_writers.get(stream)
    if writers is not None and instance_name not in writers:
        raise click.UsageError(f"{instance_name} does not write {stream} in {config_path} "
                               f"(its writers: {', '.join(writers)})")
    if stream not in WRITABLE_STREAMS:
        raise click.BadParameter(f"{stream} (writable: {', '.join(WRITABLE_STREAMS)})", param_hint="--stream")
    security = None if settings.redis_url is not None else peer_security_from_context(config_path, instance_name)
    watch = LinkWatch("write", settings.where,
                      "start the hub (streamrep serve) or fix --connect" if settings.redis_url is None
                      else "start the Redis server or fix --redis (replication.redis.url)")
    _Writer(settings, instance_name, stream, writers, watch, security).run(
        count, rate, rows_per_fact, announce_timeout)


class _Writer:
    """One run of ``write``: the lease, the streams, the link and its announcer."""

    def __init__(self, settings: Any, instance: str, stream: str, writers: list[str] | None,
                 watch: LinkWatch, security: Any) -> None:
        from streamrep.db import deployment, open_database
        from streamrep.idgen import WriterLease
        from streamrep.replication import Announcer, open_link
        from streamrep.streams import Streams

        self.instance, self.stream, self.watch = instance, stream, watch
        assert settings.database is not None
        self.database = open_database(settings.database)
        if settings.server_name is not None:
            try:
                deployment.claim(self.database, settings.server_name)
            except BaseException:
                self.database.close()
                raise
        # One process per writer instance: a second one is refused, naming the first.
        # Once lost, the lease refuses the next stream ID (WriterLeaseLostError).
        self.lease = WriterLease(self.database, instance, [stream], ttl=settings.writer_lease_ttl)
        try:
            self.lease.acquire()
        except BaseException:
            self.database.close()
            raise
        self.streams = Streams(self.database, instance, {stream: writers or [instance]})
        self.lease.guard([self.streams.generator(stream)])
        self.link = open_link(settings.link(instance, security), on_retry=watch.retrying)
        self.announcer = Announcer(self.link, self.streams, [stream])

    def run(self, count: int, rate: float, rows_per_fact: int, announce_timeout: float) -> None:
        import gevent
        import gevent.event

        persist = _fact_writer(self.streams, self.stream, self.instance, rows_per_fact)
        self.link.start()
        freeze_startup_heap()
        # SIGTERM or SIGINT: stop after the current fact, announce, give the lease back
        # (so a restarted writer starts at once) and exit.
        stopping = gevent.event.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            gevent.signal_handler(signum, stopping.set)
        started = last_report = time.monotonic()
        try:
            for i in range(count):
                if stopping.is_set():
                    click.echo(f"write: stopped by a signal after {i} of {count} facts", err=True)
                    count = i
                    break
                self.announcer.check()
                persist(i)
                if rate > 0:
                    stopping.wait(max(started + (i + 1) / rate - time.monotonic(), 0))
                else:
                    gevent.sleep(0)
                if time.monotonic() - last_report >= 2:
                    last_report = time.monotonic()
                    state = "connected" if self.link.connected else "not connected"
                    click.echo(f"write: {i + 1}/{count} persisted, {state} to {self.watch.where}", err=True)
            persisted_at = time.monotonic()
        except BaseException as exc:
            self._announce_committed(exc)
            self._close()
            raise
        self._finish(count, persisted_at - started, announce_timeout)

    def _announce_committed(self, exc: BaseException) -> None:
        """Persisting failed (a full disk, a lost lease): announce what was committed
        before, briefly, so readers get it now rather than at the next start."""
        if isinstance(exc, Exception):
            try:
                self.announcer.flush(5.0)
            except Exception:
                pass

    def _finish(self, count: int, seconds: float, announce_timeout: float) -> None:
        token = self.streams.current_token(self.stream, self.instance)
        try:
            ok = self.announcer.flush(announce_timeout)
        finally:
            refusal, credentials = self.link.refusal, self.link.refused_credentials
            self._close()
        if not ok:
            raise self.watch.failure(f"{count} facts persisted up to token {token} but not announced (not "
                                     f"accepted within --announce-timeout {announce_timeout:g}s)",
                                     refusal, credentials)
        click.echo(f"write: {count} facts persisted in {seconds:.2f}s up to token {token}; "
                   f"announced, and accepted by {self.watch.where}", err=True)

    def _close(self) -> None:
        self.announcer.stop()
        self.link.stop()
        self.streams.close()
        self.lease.release()
        self.database.close()


__all__ = ["write", "WRITABLE_STREAMS", "CommandFailed", "ExitCode"]
