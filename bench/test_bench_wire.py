"""Wire format throughput: bytes in, commands out, and back, on a realistic mix.

The mix is what a worker receives from a busy main process: ``events`` rows
``["ev",[event_id, room_id, type, state_key, redacts, relates_to, membership,
rejected, outlier]]``, ``caches`` invalidations, ``POSITION`` and ``PING``. The
decoder is fed 64 KiB chunks. Each benchmark stores its rate in
``extra_info["lines_per_s"]`` (shown with ``--benchmark-columns`` or in the JSON
report) and prints it with ``-s``.

Run: ``python -m pytest bench/test_bench_wire.py --benchmark-only -s``; on a busy
shared machine add ``--benchmark-timer=time.process_time`` to count CPU time only.
"""

from __future__ import annotations

import gc
import random
from types import ModuleType
from typing import Any, Callable

import pytest

from support.impls import core_module

CHUNK = 64 * 1024
LINES = 40_000

EVENT_TYPES = ["m.room.message", "m.room.member", "m.reaction", "m.room.encrypted", "m.room.name"]
CACHES = ["get_user_by_id", "get_rooms_for_user", "_get_joined_users_from_context", "cs_cache_fake"]


def _mix(seed: int = 1163, lines: int = LINES) -> list[bytes]:
    rng = random.Random(seed)
    rooms = [f"!{rng.getrandbits(64):x}:example.org" for _ in range(50)]
    users = [f"@user{n}:example.org" for n in range(200)]
    token = 1_000_000
    out: list[bytes] = []
    while len(out) < lines:
        pick = rng.random()
        if pick < 0.60:
            token += 1
            etype = rng.choice(EVENT_TYPES)
            state_key = rng.choice(users) if etype == "m.room.member" else None
            membership = rng.choice(["join", "leave", "invite"]) if state_key else None
            relates = f"$rel{rng.getrandbits(40):x}" if etype == "m.reaction" else None
            row = (
                f'["ev",["${rng.getrandbits(128):x}","{rng.choice(rooms)}","{etype}",'
                + ("null" if state_key is None else f'"{state_key}"')
                + ",null,"
                + ("null" if relates is None else f'"{relates}"')
                + ","
                + ("null" if membership is None else f'"{membership}"')
                + ",false,false]]"
            )
            out.append(f"RDATA events master {token} {row}".encode())
        elif pick < 0.85:
            token += 1
            cache = rng.choice(CACHES)
            key = f'["{rng.choice(users)}"]' if rng.random() < 0.9 else "null"
            batch = "batch" if rng.random() < 0.3 else str(token)
            out.append(
                f'RDATA caches master {batch} ["{cache}",{key},{1700000000000 + token}]'.encode()
            )
        elif pick < 0.97:
            stream = rng.choice(["events", "caches", "typing", "receipts", "presence"])
            out.append(f"POSITION {stream} master {token - 1} {token}".encode())
        else:
            out.append(f"PING {1700000000000 + token}".encode())
    return out


MIX = _mix()
STREAM = b"".join(line + b"\n" for line in MIX)
CHUNKS = [STREAM[i : i + CHUNK] for i in range(0, len(STREAM), CHUNK)]


def _report(benchmark: Any, label: str, lines: int) -> None:
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    rate = lines / benchmark.stats.stats.mean
    best = lines / benchmark.stats.stats.min
    benchmark.extra_info["lines_per_s"] = round(rate)
    benchmark.extra_info["lines_per_s_best"] = round(best)
    print(f"\n{label}: {rate / 1e6:.2f} M lines/s (mean), {best / 1e6:.2f} M lines/s (best round)")


@pytest.fixture
def wire(impl_kind: str) -> ModuleType:
    return core_module("wire", impl_kind)


def _decode(wire: ModuleType) -> Callable[[], int]:
    def run() -> int:
        decoder = wire.Decoder()
        count = 0
        for chunk in CHUNKS:
            count += len(decoder.feed(chunk))
        return count

    return run


def test_decode_rows_undecoded(benchmark: Any, wire: ModuleType, impl_kind: str) -> None:
    benchmark.group = "wire decode (rows left raw)"
    count = benchmark(_decode(wire))
    assert count == len(MIX)
    _report(benchmark, f"decode, rows raw [{impl_kind}]", count)


def _decode_rows(wire: ModuleType) -> Callable[[], int]:
    rdata = wire.RdataCommand

    def run() -> int:
        decoder = wire.Decoder()
        count = 0
        for chunk in CHUNKS:
            for command in decoder.feed(chunk):
                if type(command) is rdata:
                    command.row
                count += 1
        return count

    return run


def test_decode_rows_decoded(benchmark: Any, wire: ModuleType, impl_kind: str) -> None:
    benchmark.group = "wire decode (rows decoded)"
    count = benchmark(_decode_rows(wire))
    assert count == len(MIX)
    _report(benchmark, f"decode, rows decoded [{impl_kind}]", count)


def test_decode_rows_decoded_frozen_heap(benchmark: Any, wire: ModuleType, impl_kind: str) -> None:
    """Rows decoded, in a process that froze its startup heap (``gc.freeze()``).

    Decoded rows are lists, which the cyclic GC tracks; in a process with a large
    heap (pytest's) the full collections they trigger cost as much as decoding.
    Long-running servers freeze their startup heap for that reason, as Synapse does.
    """
    benchmark.group = "wire decode (rows decoded, frozen heap)"
    run = _decode_rows(wire)
    gc.collect()
    gc.freeze()
    try:
        count = benchmark(run)
    finally:
        gc.unfreeze()
    assert count == len(MIX)
    _report(benchmark, f"decode, rows decoded, frozen heap [{impl_kind}]", count)


def test_route_by_stream(benchmark: Any, wire: ModuleType, impl_kind: str) -> None:
    """What a router pays: decode and look at ``stream_name`` only."""
    benchmark.group = "wire route by stream"
    rdata = wire.RdataCommand

    def run() -> int:
        decoder = wire.Decoder()
        per_stream: dict[str, int] = {}
        count = 0
        for chunk in CHUNKS:
            for command in decoder.feed(chunk):
                if type(command) is rdata:
                    name = command.stream_name
                    per_stream[name] = per_stream.get(name, 0) + 1
                count += 1
        return count

    count = benchmark(run)
    assert count == len(MIX)
    _report(benchmark, f"route by stream [{impl_kind}]", count)


def test_encode(benchmark: Any, wire: ModuleType, impl_kind: str) -> None:
    """Batch already-built commands into one buffer (a relay, or a retry)."""
    benchmark.group = "wire encode (built commands)"
    commands = [wire.parse_line(line) for line in MIX]

    def run() -> int:
        encoder = wire.Encoder()
        encoder.encode_many(commands)
        return len(encoder.take())

    size = benchmark(run)
    assert size == len(STREAM)
    _report(benchmark, f"encode [{impl_kind}]", len(commands))


def test_build_and_encode(benchmark: Any, wire: ModuleType, impl_kind: str) -> None:
    """The server's path: commands built from fields (rows serialised), then batched."""
    benchmark.group = "wire build + encode (from fields)"
    decoded = [wire.parse_line(line) for line in MIX]
    fields = [
        (type(c), tuple(getattr(c, f) for f in c.FIELDS)) for c in decoded
    ]

    def run() -> int:
        encoder = wire.Encoder()
        for cls, args in fields:
            encoder.encode(cls(*args))
        return len(encoder.take())

    size = benchmark(run)
    assert size == len(STREAM)
    _report(benchmark, f"build + encode [{impl_kind}]", len(fields))


def _redis_chunks(channel: bytes = b"example.com") -> list[bytes]:
    """The mix as a Redis subscriber receives it: one ``message`` reply per line,
    in 64 KiB reads."""
    stream = b"".join(b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(channel), channel, len(line), line) for line in MIX)
    return [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]


REDIS_CHUNKS = _redis_chunks()


def test_split_redis_messages(benchmark: Any, impl_kind: str) -> None:
    """What a Redis subscriber does before decoding: the read's ``message``
    replies split into one buffer of lines (``pubsub.MessageSplitter``)."""
    benchmark.group = "redis messages split into lines"
    pubsub = core_module("pubsub", impl_kind)

    def run() -> int:
        splitter = pubsub.MessageSplitter()
        count = 0
        for chunk in REDIS_CHUNKS:
            lines, replies = splitter.feed(chunk)
            count += replies
        return count

    count = benchmark(run)
    assert count == len(MIX)
    _report(benchmark, f"split Redis messages [{impl_kind}]", count)
