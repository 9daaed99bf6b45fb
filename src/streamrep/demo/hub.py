"""The demo's hub process: a :class:`~streamrep.replication.ReplicationHub` over the
demo's streams.

Run by ``streamrep demo`` as ``python -m streamrep.demo.hub --config FILE``. It
reads the same configuration file as every other process, serves replication on
``listen`` and fills gaps from the database through
:class:`~streamrep.demo.streams.DemoSource`, which also knows the event store's
``events`` and ``backfill`` streams. It stops with ``ERROR server stopping`` to every
peer on SIGTERM or SIGINT.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402

from streamrep.config import load_config  # noqa: E402
from streamrep.db import Database  # noqa: E402
from streamrep.demo.streams import demo_source  # noqa: E402
from streamrep.logsetup import get_logger, setup_logging  # noqa: E402
from streamrep.replication import ConnectionSettings, ReplicationHub  # noqa: E402

log = get_logger("streamrep.demo.hub")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamrep.demo.hub")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    config = load_config(args.config, check_ports_of=None)
    setup_logging(config.logging.level, config.logging.format)
    db = Database.open(config.database)
    source = demo_source(db, config.stream_writers, config.instance_name)
    metrics = config.metrics_listen
    hub = ReplicationHub(
        config.server_name, source, host=config.listen.host, port=config.listen.port,
        instance_name=config.instance_name,
        settings=ConnectionSettings(
            ping_interval=config.keepalive.ping_interval,
            ping_timeout=config.keepalive.timeout,
            max_queued_commands=config.backpressure.max_queue,
            max_line_length=config.backpressure.max_line_length),
        metrics_listen=(metrics.host, metrics.port) if metrics is not None else None)
    hub.start()
    log.info("hub_started", listen=str(config.listen), server_name=config.server_name)
    gevent.signal_handler(signal.SIGTERM, lambda: gevent.spawn(hub.stop))
    gevent.signal_handler(signal.SIGINT, lambda: gevent.spawn(hub.stop))
    hub.serve_forever()
    source.close()
    db.close()
    log.info("hub_stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
