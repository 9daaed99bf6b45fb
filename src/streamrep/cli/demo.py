"""``streamrep demo``: run a hub, writers and workers and check exactly-once delivery."""

from __future__ import annotations

import sys

import click


@click.command("demo")
@click.option("--duration", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
              help="Seconds the writers run.")
@click.option("--rate", type=click.FloatRange(min=1), default=200.0, show_default=True,
              help="Workload operations per second, over all writers.")
@click.option("--rooms", type=click.IntRange(min=1), default=20, show_default=True,
              help="Rooms in the workload.")
@click.option("--workers", type=click.IntRange(min=1, max=32), default=3, show_default=True,
              help="Worker processes following the streams.")
@click.option("--db", default=None, metavar="URL",
              help="Database URL (default: a new SQLite file in the work directory). "
                   "With postgresql://... two writer instances share the multi-writer streams.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the workload's random generator.")
@click.option("--room-version", type=click.Choice([str(n) for n in range(3, 12)]),
              default="10", show_default=True,
              help="Matrix room version of the workload's rooms.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where the configuration, logs and received facts go (default: a new "
                   "temporary directory).")
@click.option("--catch-up-timeout", type=click.FloatRange(min=1), default=30.0,
              show_default=True, help="Seconds workers may take to catch up at the end.")
@click.option("--restart-hub-after", type=click.FloatRange(min=0.1), default=None,
              metavar="SECONDS",
              help="Kill the hub with SIGKILL this many seconds into the run and start it "
                   "again: the check must still pass.")
@click.option("--redis", "redis_url", default=None, metavar="URL",
              help="Replicate through this Redis server (pub/sub) instead of a hub.")
@click.option("--tls", is_flag=True,
              help="TLS on the hub's port, with a throwaway CA and certificates in the work "
                   "directory; every process checks the hub's certificate.")
@click.option("--mutual-tls", is_flag=True,
              help="--tls, and every process presents a client certificate naming its instance.")
@click.option("--shared-secret", is_flag=True,
              help="Every process proves a new shared secret (in the work directory) to the hub.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                               case_sensitive=False),
              default="INFO", show_default=True, help="Log level of the child processes.")
def demo(duration: float, rate: float, rooms: int, workers: int, db: str | None, seed: int,
         room_version: str, workdir: str | None, catch_up_timeout: float, restart_hub_after: float | None,
         redis_url: str | None, tls: bool, mutual_tls: bool, shared_secret: bool,
         log_level: str) -> None:
    """Run a hub, a writer persisting a room workload and WORKERS worker processes.

    Shows progress while it runs, then a summary: facts written per stream, facts
    received per worker, lag percentiles and the exactly-once check. Exits 1 if any
    worker lost or duplicated a fact, or any process failed.
    """
    from streamrep.demo.runner import DemoOptions, run_demo
    from streamrep.errors import ConfigError

    if redis_url is not None and restart_hub_after is not None:
        raise click.UsageError("--restart-hub-after restarts the hub; with --redis there is none")
    if redis_url is not None and (tls or mutual_tls or shared_secret):
        raise click.UsageError("--tls, --mutual-tls and --shared-secret protect the hub's port; "
                               "with --redis there is none (use a rediss:// URL for TLS)")

    options = DemoOptions(duration=duration, rate=rate, rooms=rooms, workers=workers, db=db,
                          seed=seed, room_version=room_version, workdir=workdir, catch_up_timeout=catch_up_timeout,
                          log_level=log_level.upper(), restart_hub_after=restart_hub_after,
                          redis=redis_url, tls=tls, mutual_tls=mutual_tls,
                          shared_secret=shared_secret)
    try:
        summary = run_demo(options)
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(line, err=True)
        sys.exit(2)
    sys.exit(0 if summary.ok else 1)
