"""StreamFollower fed whole runs of RDATA (as the client's read loop does) agrees
with the same rows fed one at a time. It uses the wire implementation the process
selected (the compiled core, or the twin with STREAMREP_NO_EXTENSIONS=1)."""

from __future__ import annotations

import random
from typing import Any

from streamrep.replication import StreamFollower
from streamrep.replication import commands as C

Fact = tuple[str, str, int, list[Any]]


def _lines(rng: random.Random) -> bytes:
    """Interleaved facts of two writers on two streams, some replayed."""
    out = []
    tokens = {("events", "w1"): 0, ("events", "w2"): 0, ("caches", "w1"): 0}
    for _ in range(60):
        stream, writer = rng.choice(sorted(tokens))
        token = tokens[(stream, writer)] + rng.randint(1, 3)
        if rng.random() < 0.2:
            token = max(1, tokens[(stream, writer)] - 1)  # a replay: dropped
        tokens[(stream, writer)] = max(token, tokens[(stream, writer)])
        rows = rng.randint(1, 4)
        for i in range(rows):
            mark = b"%d" % token if i == rows - 1 else b"batch"
            out.append(b'RDATA %s %s %s ["%s",%d]\n' % (stream.encode(), writer.encode(), mark,
                                                        writer.encode(), i))
    return b"".join(out)


def test_runs_deliver_what_single_rows_deliver() -> None:
    for seed in range(20):
        data = _lines(random.Random(seed))
        one: list[Fact] = []
        single = StreamFollower(lambda *fact: one.append(fact), streams=["events"],
                                start_from={"events": 0})
        for command in C.new_decoder(1000).feed(data):
            single.on_rdata(command.stream_name, command.instance_name, command.token, command.row)
        many: list[Fact] = []
        grouped = StreamFollower(lambda *fact: many.append(fact), streams=["events"],
                                 start_from={"events": 0})
        # Chunks that cut facts anywhere: their rows wait for the rest.
        decoder = C.new_decoder(1000)
        for start in range(0, len(data), 97):
            for item in C.group_rdata(decoder.feed(data[start:start + 97])):
                grouped.on_rdata_run(*item)
        assert many == one and many
        assert grouped.positions == single.positions
        assert grouped.delivered == single.delivered == len(one)


def test_a_dropped_fact_is_not_decoded() -> None:
    got: list[Fact] = []
    follower = StreamFollower(lambda *fact: got.append(fact), start_from={"events": 5})
    # Not valid JSON, but at or before the start position: dropped, never decoded.
    follower.on_rdata_run("events", "w1", 5, C.new_decoder(1000).feed(b"RDATA events w1 5 [oops\n"))
    follower.on_rdata_run("events", "w1", 6, C.new_decoder(1000).feed(b"RDATA events w1 6 [1]\n"))
    assert got == [("events", "w1", 6, [[1]])]
