"""A demo writer process: persists the room workload and announces every fact.

Run by ``streamrep demo`` as ``python -m streamrep.demo.writer --config FILE
--instance-name NAME ...``. It plays :class:`~streamrep.demo.workload.Workload` at
``--rate`` operations per second for ``--duration`` seconds:

* events (and backfilled history) through the :class:`~streamrep.EventStore`, whose
  stream orderings come from the registry's ``events`` and ``backfill`` generators;
  the store appends its cache invalidations (``cs_cache_fake`` for current-state
  changes, ``get_event`` for redactions) to the ``caches`` stream;
* account data, receipts, to-device messages and explicit cache invalidations
  through the stream registry's writers, from several greenlets so that stream IDs
  complete out of order.

Facts are announced to the hub only after they committed, in token order: ``RDATA``
per row read back from the database, or ``POSITION`` when the position moved without
rows. ``[stream, instance, token, time]`` of every fact made visible is written to
``--out`` at the end (the demo's lag figures start there).
"""

from __future__ import annotations

if __name__ == "__main__":
    # Patch before anything imports socket or threading. Imported as a library (by
    # tests), the module leaves the process as it is.
    from gevent import monkey

    monkey.patch_all()

import argparse
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event
import gevent.queue
import orjson

from streamrep.catalogue import known_streams
from streamrep.config import Config, load_config
from streamrep.db import Database, deployment
from streamrep.demo.processes import emit
from streamrep.demo.streams import EVENT_STREAMS, demo_streams, stream_names
from streamrep.demo.workload import DEFAULT_ROOM_VERSION, Op, Workload
from streamrep.errors import DatabaseUnavailableError, WriterLeaseHeldError
from streamrep.events import EventStore
from streamrep.events.streams import EVENTS_STREAM
from streamrep.idgen import WriterLease
from streamrep.logsetup import get_logger, setup_logging
from streamrep.replication import Announcer, LinkSettings, open_link

log = get_logger("streamrep.demo.writer")

#: greenlets writing the registry streams concurrently
CONCURRENCY = 4


class DemoWriter:
    """The writer's state; see the module docstring."""

    def __init__(self, config: Config, instance: str, workload: Workload) -> None:
        self.config = config
        self.instance = instance
        self.workload = workload
        self.db = Database.open(config.database)
        deployment.claim(self.db, config.server_name)
        self.streams = demo_streams(self.db, instance, config.stream_writers)
        self.own = [s for s in stream_names() if instance in config.writers_of(s)]
        # One process per writer instance (WriterLeaseHeldError names the other one).
        self.lease = WriterLease(self.db, instance, self.own, ttl=config.writer_lease_ttl)
        self.lease.acquire()
        self.streams.open_all(stream_names())
        self.lease.guard([self.streams.generator(s) for s in self.own])
        self.streams.add_listener(self._advanced)
        self.store: EventStore | None = None
        if EVENTS_STREAM in self.own:
            # Orderings from the registry's generators (their listeners announce them);
            # the store appends its cache invalidations to the caches stream itself.
            self.store = EventStore(self.db, streams=self.streams,
                                    verify_event_ids=config.verify_event_ids)
        self.visible: list[tuple[str, str, int, float]] = []
        self.written: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.client = open_link(LinkSettings.from_config(config, instance))
        self.announcer = Announcer(self.client, self.streams, self.own)

    def _position(self, stream: str) -> int:
        return int(self.streams.current_token(stream, self.instance))

    def _advanced(self, stream: str, instance: str, tokens: list[int], position: int) -> None:
        # The generators call this after each commit (or rollback) that moved this
        # writer's position: when each fact became visible, for the lag figures.
        if instance == self.instance and stream in self.own:
            now = time.time()
            self.visible.extend((stream, instance, token, now) for token in tokens)
            self.written[stream] += len(tokens)

    # --- the workload ---------------------------------------------------------------

    def apply(self, op: Op) -> None:
        """Persist one workload operation."""
        self.ops[op.label] += 1
        args = op.args
        if op.kind in EVENT_STREAMS:
            assert self.store is not None
            result = self.store.persist_events(op.events, backfilled=op.kind == "backfill")
            if result.rejected:
                # The workload builds valid rooms: a rejection is a bug worth a line.
                log.warning("events_rejected", op=op.label, rejected=dict(result.rejected))
        elif op.kind == "account_data":
            self.streams.add_account_data(args["user_id"], args["type"], args["content"],
                                          args["room_id"])
        elif op.kind == "receipt":
            self.streams.add_receipt(args["room_id"], args["receipt_type"], args["user_id"],
                                     args["event_ids"][0], args["data"])
        elif op.kind == "to_device":
            self.streams.send_to_device([(args["user_id"], args["device_id"], {
                "type": args["message_type"], "sender": args["sender"],
                "content": args["content"]})])
        elif op.kind == "cache_invalidation":
            self.streams.add_cache_invalidation(args["cache_name"], args["keys"])
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")

    def status(self, kind: str = "status", **extra: Any) -> None:
        emit(kind, name=self.instance, written=dict(self.written), ops=dict(self.ops),
             positions=[[s, self.instance, self._position(s)] for s in sorted(self.own)],
             connected=self.client.connected, **extra)

    def run(self, rate: float, duration: float, stop: gevent.event.Event) -> None:
        self.client.start()
        self.client.wait_connected(10.0)
        # Events go through one greenlet (the event store writes batches in order);
        # the other streams through CONCURRENCY greenlets that complete out of order.
        events_queue: gevent.queue.Queue[Op | None] = gevent.queue.Queue()
        other_queue: gevent.queue.Queue[Op | None] = gevent.queue.Queue(maxsize=100)
        failures: list[BaseException] = []

        def consume(q: gevent.queue.Queue[Op | None]) -> None:
            while True:
                op = q.get()
                if op is None:
                    return
                try:
                    self.apply(op)
                except Exception as exc:
                    failures.append(exc)
                    log.exception("op_failed", op=op.label)
                    stop.set()
                    return

        consumers = [gevent.spawn(consume, events_queue)]
        consumers += [gevent.spawn(consume, other_queue) for _ in range(CONCURRENCY)]
        started = time.monotonic()
        next_at = started
        last_status = 0.0
        interval = 1.0 / rate
        while not stop.is_set() and time.monotonic() - started < duration:
            op = self.workload.next_op()
            (events_queue if op.kind in EVENT_STREAMS else other_queue).put(op)
            next_at += interval
            now = time.monotonic()
            if now - last_status >= 0.25:
                self.status()
                last_status = now
            delay = next_at - now
            if delay > 0:
                stop.wait(delay)
            elif events_queue.qsize() > 1000:
                gevent.sleep(0.01)  # the database is behind; let it catch up
        for q in [events_queue] + [other_queue] * CONCURRENCY:
            q.put(None)
        gevent.joinall(consumers)
        try:
            flushed = self.announcer.flush(10.0)
        finally:
            self.announcer.stop()
            self.streams.close()
            self.client.stop()
        if failures:
            raise failures[0]
        if not flushed:
            log.warning("announcements_not_accepted", refusal=self.client.refusal, problem=self.client.problem,
                        note="the hub fills them from the database on its next connection")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamrep.demo.writer")
    parser.add_argument("--config", required=True)
    parser.add_argument("--instance-name", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rooms", type=int, default=20)
    parser.add_argument("--events", choices=["yes", "no"], default="yes")
    parser.add_argument("--room-version", default=DEFAULT_ROOM_VERSION,
                        help="Matrix room version of the workload's rooms (3 to 11)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--id-prefix", default="",
                        help="prefix of room and event IDs (a new one per run, so runs "
                             "on one database do not collide)")
    args = parser.parse_args(argv)
    config = load_config(args.config, streams=known_streams())
    setup_logging(config.logging.level, config.logging.format)
    workload = Workload(args.seed, args.rooms, events=args.events == "yes",
                        prefix=args.id_prefix + ("" if args.events == "yes"
                                                 else f"{args.instance_name}-"),
                        room_version_id=args.room_version)
    try:
        writer = DemoWriter(config, args.instance_name, workload)
    except (WriterLeaseHeldError, DatabaseUnavailableError) as exc:
        emit("error", name=args.instance_name, message=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 3
    stop = gevent.event.Event()
    stop_handler: Callable[[], None] = stop.set
    gevent.signal_handler(signal.SIGTERM, stop_handler)
    gevent.signal_handler(signal.SIGINT, stop_handler)
    log.info("writer_started", instance=args.instance_name, rate=args.rate,
             streams=",".join(writer.own))
    code = 0
    try:
        writer.run(args.rate, args.duration, stop)
    except Exception as exc:
        emit("error", name=args.instance_name, message=f"{type(exc).__name__}: {exc}")
        code = 1
    with open(args.out, "wb") as fh:
        fh.writelines(orjson.dumps(fact) + b"\n" for fact in writer.visible)
    writer.status("done")
    log.info("writer_finished", instance=args.instance_name, facts=len(writer.visible),
             **{f"ops_{label}": n for label, n in sorted(writer.ops.items())})
    if writer.store is not None:
        writer.store.close()
    writer.lease.release()
    writer.db.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
