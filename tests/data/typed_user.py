"""A worker and a writer as a user writes them, type-checked by tests/test_typing.py
under ``mypy --strict`` against the installed package's public API."""

from __future__ import annotations

from typing import Any

from streamrep.db import open_database
from streamrep.replication import (
    Announcer, DatabaseSource, LinkSettings, Positions, StartFrom, StreamHandlers, WriterKey, open_link,
)
from streamrep.streams import Streams
from streamrep.streams import rows


def writer(port: int) -> bool:
    streams = Streams(open_database("sqlite:w.db"), "writer1", {"caches": ["writer1"]})
    link = open_link(LinkSettings("writer1", "example.com", hub=("127.0.0.1", port)))
    announcer = Announcer(link, streams, ["caches"])
    link.start()
    token: int = streams.add_cache_invalidation("get_user_by_id", ["@u:example.com"])
    accepted: bool = announcer.flush(timeout=5.0) and link.confirmed("caches", "writer1") == token
    link.stop()
    return accepted


def worker(port: int, resume: dict[WriterKey, int]) -> Positions:
    handlers = StreamHandlers()
    seen: list[str] = []

    @handlers.on(rows.CACHES)
    def invalidate(instance: str, token: int, facts: list[rows.CachesRow]) -> None:
        for fact in facts:
            if fact.keys is not None:
                seen.append(f"{fact.cache_func}:{fact.keys[0]} from {instance} at {token}")

    @handlers.on(rows.RECEIPTS)
    def receipt(instance: str, token: int, facts: list[rows.ReceiptsRow]) -> None:
        seen.extend(f"{fact.user_id} read {fact.event_id}" for fact in facts)

    start: StartFrom = resume or {"caches": 0}
    source = DatabaseSource(Streams(open_database("sqlite:w.db"), "worker1"))
    link = open_link(LinkSettings("worker1", "example.com", hub=("127.0.0.1", port)),
                     handler=handlers, source=source, streams=handlers.streams, start_from=start)
    link.run()
    follower = link.follower
    assert follower is not None
    return follower.positions


def plain_handler(stream: str, instance: str, token: int, facts: list[Any]) -> None:
    print(stream, instance, token, len(facts))
