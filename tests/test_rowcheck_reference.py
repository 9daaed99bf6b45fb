"""Rows exactly as a real reference homeserver (matrix-synapse on SQLite, run from its
own venv, never imported) publishes them through a Redis of the test's own, while a
workload writes ten of its streams: the booleans it reads from database columns
arrive as ``0`` and ``1``, and strings of nullable columns as null.

Every row passes the row check a streamrep hub runs on a writer's ``RDATA`` (for the
streams the hub serves) and the row format of its stream on both core
implementations; every field of kind ``flag`` came as 0 or 1 at least once and every
``boolean`` field only as a boolean, so the formats are no looser than the rows.
"""

from __future__ import annotations

import pathlib
import time
from collections import defaultdict
from types import ModuleType
from typing import Any

import orjson
import pytest

from streamrep.catalogue import known_streams, row_formats
from streamrep.replication import commands as C
from streamrep.replication.protocol import Close, ConnectionSettings, HubState, Publish
from streamrep.wire import parse_line
from support.impls import core_module
from support.redis_capture import RawSubscriber
from support.redis_server import own_redis_server, unique_server_name, wait_subscribed
from support.reference_homeserver import running_homeserver
from support.reference_workload import STREAMS, MediaQuarantine, NineStreams

pytestmark = pytest.mark.slow

STEPS = 3


def _rdata(messages: list[bytes]) -> list[bytes]:
    return [m for m in messages if m.startswith(b"RDATA ")]


def _commands(data: bytes) -> list[Any]:
    return list(C.new_decoder(1_000_000).feed(data))


def _count(lines: list[bytes], stream: str) -> int:
    return sum(1 for line in lines if line.split(b" ", 2)[1] == stream.encode())


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Every ``RDATA`` line the reference published while the workload ran."""
    redis_server = own_redis_server()
    try:
        server = unique_server_name("flags-ref")
        directory = pathlib.Path(tmp_path_factory.mktemp("reference")) / "hs"
        with running_homeserver(str(directory), redis_server.url, server) as hs:
            subscriber = RawSubscriber(redis_server.url, server)
            try:
                wait_subscribed(redis_server.url, server, 2)
                workload, media = NineStreams(hs), MediaQuarantine(hs)
                for n in range(STEPS):
                    workload.step(n)
                    media.step(n)
                deadline = time.monotonic() + 60
                while _count(_rdata(subscriber.messages), "quarantined_media") < 2 * STEPS:
                    assert time.monotonic() < deadline, "the last quarantined_media rows were not published"
                    time.sleep(0.1)
                time.sleep(1.0)  # the rows of the last step's other streams are in by then
            finally:
                subscriber.close()
    finally:
        redis_server.stop()
    return _rdata(subscriber.messages)


def _fields(stream: str, row: Any) -> list[tuple[str, str, Any]]:
    """``(field, kind, value)`` of a decoded *row* of *stream*, by its format."""
    row_format = row_formats()[stream]
    fields = row_format.fields
    if row_format.variants:
        fields, row = dict(row_format.variants)[row[0]], row[1]
    return [(name, kind, value) for (name, kind), value in zip(fields, row)]


def test_the_reference_sends_flags_as_0_or_1_and_booleans_as_booleans(published: list[bytes]) -> None:
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for line in published:
        command = parse_line(line)
        for field, kind, value in _fields(command.stream_name, command.row):
            if kind == "flag":
                assert value in (0, 1) and type(value) in (int, bool), line
            if kind in ("flag", "boolean"):
                seen[(command.stream_name, field)].add(f"{kind} as {type(value).__name__}")
    assert seen == {
        ("events", "rejected"): {"flag as int"}, ("events", "outlier"): {"flag as int"},
        ("presence", "currently_active"): {"flag as int"},
        ("device_lists", "is_signature"): {"boolean as bool"},
        ("device_lists", "hosts_calculated"): {"flag as int"},
        ("pushers", "deleted"): {"boolean as bool"},
        ("quarantined_media", "quarantined"): {"flag as int"},
    }
    streams = {parse_line(line).stream_name for line in published}
    assert streams >= {*STREAMS, "quarantined_media"}, sorted({*STREAMS, "quarantined_media"} - streams)


def test_a_hub_relays_every_row_of_a_reference_writer(published: list[bytes]) -> None:
    served = known_streams()
    lines = [line for line in published if parse_line(line).stream_name in served]
    assert {parse_line(line).stream_name for line in lines} >= {"events", "receipts", "typing"}
    hub = HubState("hs", ConnectionSettings(), row_check=served.check_rows)
    worker, writer = hub.new_peer("worker", now=0.0), hub.new_peer("writer", now=0.0)
    worker.receive(_commands(b"NAME worker\nREPLICATE\n"), now=0.0)
    out = writer.receive(_commands(b"NAME master\n" + b"".join(line + b"\n" for line in lines)), now=0.0)
    assert [action for action in out if type(action) is Close] == []
    relayed = b"".join(action.data for action in out if type(action) is Publish)
    assert sorted(relayed.splitlines()) == sorted(lines)


def _shape(rowcheck: ModuleType, stream: str) -> Any:
    row_format = row_formats()[stream]
    if row_format.variants:
        return rowcheck.RowShape(stream, variants=dict(row_format.variants))
    return rowcheck.RowShape(stream, row_format.fields)


def test_every_row_fits_its_streams_format(published: list[bytes], impl_kind: str) -> None:
    rowcheck, wire = core_module("rowcheck", impl_kind), core_module("wire", impl_kind)
    by_stream: dict[str, list[bytes]] = defaultdict(list)
    for line in published:
        by_stream[line.split(b" ", 2)[1].decode()].append(line)
    for stream, lines in by_stream.items():
        shape = _shape(rowcheck, stream)
        for line in lines:
            assert rowcheck.check_row(shape, line.split(b" ", 4)[4]) is None, line
        # As decoded commands too, checked inside their lines on the compiled core.
        assert rowcheck.check_rows(shape, wire.Decoder().feed(b"".join(l + b"\n" for l in lines))) is None
    # A flag takes 0 and 1, and nothing else the reference could not have sent.
    ev = orjson.loads(next(l for l in by_stream["events"] if b'["ev",' in l).split(b" ", 4)[4])
    for wrong, named in ((2, "2"), (-1, "-1"), ("0", "a string"), (None, "null")):
        ev[1][7] = wrong
        assert rowcheck.check_row(_shape(rowcheck, "events"), orjson.dumps(ev)) == (
            "events ev row field 7 (rejected) must be a boolean or the integer 0 or 1, not " + named)
