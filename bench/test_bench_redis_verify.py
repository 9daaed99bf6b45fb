"""What a Redis reader pays to verify what it hears against its database.

A reader on a bus anyone may publish on (Redis) with a database checks every
``RDATA`` token against what the writer stored and delivers the stored rows
(``FollowerState(verify=...)``); one without a database takes the rows as heard.
Both runs feed the same messages, as a writer publishes them (20,000 one-row
``to_device`` facts in reads of 256 lines), through the same ``BusSession`` and
``StreamFollower``, so the difference is the verification: one database read per
writer per read of Redis messages, and the comparison of the rows heard with the
stored ones.

``python -m pytest bench/test_bench_redis_verify.py --benchmark-only -s``: compare
the ``rows_per_s`` of the two rows (``verifying`` / ``trusting``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from streamrep.db import open_database
from streamrep.replication import ConnectionSettings, DatabaseSource, StreamFollower
from streamrep.replication import commands as C
from streamrep.replication.protocol import BusSession
from streamrep.streams import Streams

FACTS = 20_000
READ_LINES = 256


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[bytes]]:
    """A database holding FACTS facts of writer1, and the reads that announced them."""
    url = f"sqlite:///{tmp_path_factory.mktemp('verify')}/deployment.db"
    db = open_database(url)
    streams = Streams(db, "writer1", {"to_device": ["writer1"]})
    for start in range(0, FACTS, 500):
        for n in range(start, start + 500):
            streams.send_to_device([(f"@u{n % 97}:x", f"D{n}", {"n": n})])
    rows, _ = DatabaseSource(streams, ["to_device"]).updates("to_device", "writer1", 0, FACTS, FACTS)
    streams.close()
    db.close()
    lines = C.rdata_line_list("to_device", "writer1", rows)
    reads = [b"".join(lines[i:i + READ_LINES]) for i in range(0, len(lines), READ_LINES)]
    return url, reads


def _follow(url: str | None, reads: list[bytes]) -> tuple[int, float]:
    """Rows delivered and seconds taken, for a reader with (*url*) or without a database."""
    delivered = [0]

    def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
        delivered[0] += len(rows)

    db = open_database(url) if url is not None else None
    source = DatabaseSource(Streams(db, "reader"), ["to_device"]) if db is not None else None
    follower = StreamFollower(handler, source, ["to_device"], {"to_device": 0}, verify=source is not None)
    session = BusSession(ConnectionSettings(), instances=["reader"], follower=follower.state)
    session.announce([])
    decoder = C.new_decoder(65536)
    # A POSITION heard first, as after a REPLICATE (the trusting reader needs one).
    follower.run(session.receive(decoder.feed(b"POSITION to_device writer1 0 0\n"), 0.0))
    start = time.perf_counter()
    for data in reads:
        follower.run(session.receive(decoder.feed(data), 0.0))
    seconds = time.perf_counter() - start
    if source is not None:
        source.streams.close()
    if db is not None:
        db.close()
    return delivered[0], seconds


@pytest.mark.parametrize("mode", ["trusting", "verifying"])
def test_bench_a_redis_readers_verification(benchmark: Any, published: tuple[str, list[bytes]],
                                            mode: str) -> None:
    url, reads = published
    results: list[tuple[int, float]] = []

    def run() -> None:
        results.append(_follow(url if mode == "verifying" else None, reads))

    benchmark.pedantic(run, rounds=3, iterations=1)
    rows, seconds = min(results, key=lambda r: r[1])
    assert rows == FACTS  # both deliver every fact once
    benchmark.extra_info["rows_per_s"] = round(rows / seconds)
    print(f"\n{mode}: {rows / seconds:,.0f} rows/s ({seconds * 1e6 / rows:.2f} µs a row)")
