"""A demo worker process: follows every stream, keeps caches, answers sync queries.

Run by ``streamrep demo`` as ``python -m streamrep.demo.worker --config FILE --name
NAME --out FILE``. It connects to the hub named in the configuration, follows every
stream from the beginning, and for each fact:

* records ``[stream, instance, token, receipt_time]`` (written to ``--out`` at the
  end, for the exactly-once check and the lag figures);
* applies ``events`` and ``backfill`` rows to its event store's change caches and
  caches (:class:`~streamrep.events.streams.EventsStreamFollower`), and ``caches``
  rows to its named caches (:class:`~streamrep.caches.CacheRegistry`).

Every so often it answers a sync query for a random user from its change caches
("which of this user's rooms changed since my token of a moment ago?") and checks the
answer against the database, bounded to the position it has received, so the check
is exact: a room the change cache wrongly reports unchanged is a *sync mismatch*.
When told to stop (a line on stdin, or SIGTERM) it checks that every entry of its
``room_members`` cache equals the database, then prints a ``done`` status line.
"""

from __future__ import annotations

if __name__ == "__main__":
    # Patch before anything imports socket or threading. Imported as a library (by
    # tests), the module leaves the process as it is.
    from gevent import monkey

    monkey.patch_all()

import argparse
import functools
import os
import random
import signal
import sys
import time
from collections import Counter
from typing import Any

import gevent
import gevent.event
import orjson

from streamrep.caches import CacheRegistry, LruCache
from streamrep.catalogue import known_streams
from streamrep.config import Config, load_config
from streamrep.db import deployment
from streamrep.demo.processes import emit
from streamrep.demo.streams import demo_source, stream_names
from streamrep.events import EventStore
from streamrep.events.streams import BACKFILL_STREAM, EVENTS_STREAM, EventsStreamFollower
from streamrep.logsetup import get_logger, setup_logging
from streamrep.replication import LinkSettings, open_link
from streamrep.streams.builtin import CACHES

log = get_logger("streamrep.demo.worker")

#: seconds between sync queries
SYNC_INTERVAL = 0.05
#: seconds between status lines
STATUS_INTERVAL = 0.25


class DemoWorker:
    """The worker's state; see the module docstring."""

    def __init__(self, config: Config, name: str, seed: int) -> None:
        self.config = config
        self.name = name
        self.rng = random.Random(seed)
        self.store = EventStore(config.database,
                                verify_event_ids=config.verify_event_ids)
        deployment.check(self.store.db, config.server_name)
        self.events_follower = EventsStreamFollower(self.store)
        self.caches = CacheRegistry()
        self.room_members: LruCache[frozenset[str]] = LruCache("room_members", 10_000)
        self.caches.register("room_members", self.room_members, depends_on_current_state=True)
        self._member_keys: set[tuple[str]] = set()
        self.users: LruCache[dict[str, Any]] = LruCache("get_user_by_id", 10_000)
        self.caches.register("get_user_by_id", self.users)
        self.facts: list[tuple[str, str, int, float]] = []
        self.received: Counter[str] = Counter()
        self.cache_invalidations = 0
        self.sync_queries = 0
        self.sync_mismatches = 0
        self.mismatch_examples: list[str] = []
        #: (time, events position) snapshots to pick "since" tokens from
        self._history: list[tuple[float, int]] = []
        self.source = demo_source(self.store.db, config.stream_writers, name)
        self.client = open_link(LinkSettings.from_config(config, name), handler=self.handle,
                                source=self.source, start_from={stream: 0 for stream in stream_names()})

    # --- facts ---------------------------------------------------------------------

    def handle(self, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        """One fact, exactly once, in order per writer."""
        self.facts.append((stream, instance, token, time.time()))
        self.received[stream] += 1
        if stream == EVENTS_STREAM:
            for row in rows:
                self.events_follower.on_events_row(token, row)
        elif stream == BACKFILL_STREAM:
            for row in rows:
                self.events_follower.on_backfill_row(token, row)
        elif stream == CACHES.name:
            for row in rows:
                self.cache_invalidations += self.caches.handle_row(row)
                self.events_follower.on_caches_row(row[0], row[1])

    def events_position(self) -> int:
        follower = self.client.follower
        assert follower is not None
        return min((t for (s, _i), t in follower.positions.items() if s == EVENTS_STREAM),
                   default=0)

    def positions(self) -> list[list[Any]]:
        follower = self.client.follower
        assert follower is not None
        return [[s, i, t] for (s, i), t in sorted(follower.positions.items())]

    # --- sync queries ----------------------------------------------------------------

    def sync_once(self, user: str | None = None, since: int | None = None) -> bool:
        """Answer one sync query from the change caches and check it.

        Two checks, both bounded by the position this worker has applied: the change
        caches must flag every room and user that changed (a room reported unchanged
        that has new events is a mismatch), and the event store's sync answer must
        hold only events of the user's rooms within the range. *user* and *since*
        default to a random member and a position this worker had up to two seconds
        ago. Returns whether the answer was right (True when there was nothing to ask).
        """
        upto = min(self.events_position(), self.store.current_token().stream)
        now = time.monotonic()
        self._history.append((now, upto))
        self._history = [(t, p) for t, p in self._history if now - t < 2.0]
        if since is None:
            since = self.rng.choice(self._history)[1]
        if upto <= since:
            return True
        db = self.store.db
        if user is None:
            user = self.rng.choice([r[0] for r in db.fetchall(
                "SELECT DISTINCT state_key FROM current_state_events WHERE type = ?"
                " LIMIT 200", ("m.room.member",))] or ["@nobody:demo.example"])
        rooms = sorted({r[0] for r in db.fetchall(
            "SELECT room_id FROM room_memberships WHERE user_id = ?", (user,))})
        # The answer a worker gives: only rooms its change cache says changed.
        changed = [r for r in rooms if self.store.room_changes.has_entity_changed(r, since)]
        answer = self._events_in(changed, since, upto)
        truth = self._events_in(rooms, since, upto)
        membership_truth = bool(db.fetchval(
            "SELECT COUNT(*) FROM events WHERE type = ? AND state_key = ?"
            " AND stream_ordering > ? AND stream_ordering <= ?",
            ("m.room.member", user, since, upto), 0))
        membership_cached = self.store.membership_changes.has_entity_changed(user, since)
        # The event store's own sync answer, from the same change caches.
        synced = self.store.get_new_events_for_user(user, f"s{since}", limit=10_000)
        # Rooms read again after the answer: the worker may have applied a join or an
        # invite that the first read (taken before) did not see yet. Membership rows
        # are never removed, so this set holds every room of the answer's range.
        in_rooms = {r[0] for r in db.fetchall(
            "SELECT room_id FROM room_memberships WHERE user_id = ?", (user,))}
        strays = [e.event_id for e in synced.events
                  if e.room_id not in in_rooms or not since < e.stream_ordering
                  <= synced.next_token.stream]
        self.sync_queries += 1
        right = answer == truth and (membership_cached or not membership_truth) and not strays
        if not right:
            self.sync_mismatches += 1
            if len(self.mismatch_examples) < 3:
                self.mismatch_examples.append(
                    f"sync for {user} in ({since}, {upto}]: change cache gave "
                    f"{len(answer)} events, database {len(truth)}; membership changed: "
                    f"{membership_truth}, cache says {membership_cached}; events outside "
                    f"the user's rooms or the range: {strays[:3]}")
        for room in changed[:3]:
            self.room_members.get_or_compute((room,), functools.partial(self._members, room))
            self._member_keys.add((room,))
        return right

    def _events_in(self, rooms: list[str], since: int, upto: int) -> list[str]:
        if not rooms:
            return []
        marks = ",".join("?" * len(rooms))
        return [r[0] for r in self.store.db.fetchall(
            f"SELECT event_id FROM events WHERE room_id IN ({marks}) AND stream_ordering > ?"
            " AND stream_ordering <= ? ORDER BY stream_ordering", (*rooms, since, upto))]

    def _members(self, room: str) -> frozenset[str]:
        return frozenset(r[0] for r in self.store.db.fetchall(
            "SELECT state_key FROM current_state_events WHERE room_id = ? AND type = ?"
            " AND membership = ?", (room, "m.room.member", "join")))

    def check_caches(self) -> int:
        """Entries of ``room_members`` that disagree with the database (at the end,
        when everything has been received, there must be none)."""
        stale = 0
        for key in sorted(self._member_keys):
            if key not in self.room_members:
                continue  # invalidated (or evicted) since: nothing cached to be wrong
            cached = self.room_members.get(key)
            fresh = self._members(key[0])
            if cached != fresh:
                stale += 1
                if len(self.mismatch_examples) < 3:
                    self.mismatch_examples.append(
                        f"room_members{key} cached {len(cached or ())} members, database "
                        f"{len(fresh)}")
        return stale

    # --- running ---------------------------------------------------------------------

    def status(self, kind: str = "status", **extra: Any) -> None:
        emit(kind, name=self.name, received=dict(self.received), positions=self.positions(),
             connected=self.client.connected, sync_queries=self.sync_queries,
             sync_mismatches=self.sync_mismatches,
             cache_invalidations=self.cache_invalidations,
             mismatch_examples=self.mismatch_examples, **extra)

    def run(self, out_path: str, stop: gevent.event.Event) -> None:
        self.client.start()
        last_status = 0.0
        while not stop.is_set():
            if self.client.connected:
                try:
                    self.sync_once()
                except Exception as exc:  # a query failing is worth a line, not a crash
                    log.warning("sync_query_failed", error=f"{type(exc).__name__}: {exc}")
            now = time.monotonic()
            if now - last_status >= STATUS_INTERVAL:
                self.status()
                last_status = now
            stop.wait(SYNC_INTERVAL)
        stale = self.check_caches()
        self.sync_mismatches += stale
        self.client.stop()
        self.source.streams.close()
        with open(out_path, "wb") as fh:
            for fact in self.facts:
                fh.write(orjson.dumps(fact) + b"\n")
        self.status("done", stale_cache_entries=stale)
        log.info("worker_finished", facts=len(self.facts), sync_queries=self.sync_queries,
                 sync_mismatches=self.sync_mismatches, stale_cache_entries=stale,
                 cache_invalidations=self.cache_invalidations)


def _watch_stdin(stop: gevent.event.Event) -> None:
    # Any line, or end of file, on stdin means "stop". A cooperative file object, so
    # waiting for it does not block the greenlets.
    from gevent.fileobject import FileObject

    try:
        FileObject(os.dup(sys.stdin.fileno()), "rb").readline()
    finally:
        stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamrep.demo.worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    config = load_config(args.config, streams=known_streams())
    setup_logging(config.logging.level, config.logging.format)
    worker = DemoWorker(config, args.name, args.seed if args.seed is not None else os.getpid())
    stop = gevent.event.Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    gevent.spawn(_watch_stdin, stop)
    log.info("worker_started", name=args.name, hub=str(config.listen))
    worker.run(args.out, stop)
    worker.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
