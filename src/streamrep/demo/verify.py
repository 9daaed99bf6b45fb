"""What the database holds: the truth the demo checks the workers against."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from streamrep.config import Config
from streamrep.db import Database
from streamrep.demo.streams import demo_source, stream_names
from streamrep.replication.sources import pages

__all__ = ["FactKey", "WorkerCheck", "check_worker", "read_facts"]

#: ``(stream, writer instance, token)``
FactKey = tuple[str, str, int]

#: rows read per round trip
_PAGE = 5000
#: above any token the demo can reach
_END = 2**62


def read_facts(config: Config) -> dict[tuple[str, str], list[int]]:
    """Every fact in the database: ``(stream, writer) -> sorted distinct tokens``.

    A fact is a stream ID that has rows: one rolled back left none, and one whose row
    was replaced (account data and receipts keep the latest row per key) is no longer
    there; neither is expected anywhere.
    """
    db = Database.open(config.database)
    source = demo_source(db, config.stream_writers, "demo-check")
    try:
        facts: dict[tuple[str, str], list[int]] = {}
        for stream in stream_names():
            for instance in config.writers_of(stream):
                tokens: list[int] = []
                for rows in pages(source, stream, instance, 0, _END, _PAGE):
                    for token, _row in rows:
                        if not tokens or tokens[-1] != token:
                            tokens.append(token)
                facts[(stream, instance)] = tokens
        return facts
    finally:
        source.streams.close()
        db.close()


@dataclass
class WorkerCheck:
    """The exactly-once check of one worker."""

    lost: set[FactKey] = field(default_factory=set)
    #: fact -> times received, for facts received more than once
    duplicated: dict[FactKey, int] = field(default_factory=dict)
    unexpected: set[FactKey] = field(default_factory=set)
    received: Counter[str] = field(default_factory=Counter)
    lag_ms: list[float] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        """Deliveries beyond the first, over all facts."""
        return sum(n - 1 for n in self.duplicated.values())


def check_worker(in_database: set[FactKey], committed_at: Mapping[FactKey, float],
                 received: Iterable[tuple[str, str, int, float]],
                 there_before: Iterable[FactKey] = ()) -> WorkerCheck:
    """Compare what a worker *received* (``(stream, instance, token, time)`` in order of
    arrival) with the facts *in_database* and the facts writers committed
    (*committed_at*: fact -> the time it became visible).

    * lost: in the database, never received;
    * duplicated: received more than once;
    * unexpected: received, but neither in the database now, nor committed by a
      writer, nor in the database when the run started (*there_before*). A fact whose
      row a later fact replaced (account data and receipts keep the latest row per
      key) existed: receiving it once is right.
    """
    result = WorkerCheck()
    counts: Counter[FactKey] = Counter()
    for stream, instance, token, when in received:
        key = (stream, instance, token)
        counts[key] += 1
        result.received[stream] += 1
        visible = committed_at.get(key)
        if visible is not None:
            result.lag_ms.append(max(0.0, (when - visible) * 1000.0))
    result.lost = in_database - counts.keys()
    result.duplicated = {k: n for k, n in counts.items() if n > 1}
    result.unexpected = (set(counts.keys()) - in_database - committed_at.keys()
                         - set(there_before))
    return result
