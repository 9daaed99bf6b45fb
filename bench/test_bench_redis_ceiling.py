"""What Redis alone delivers: the ceiling of the ``redis`` transport's fan-out.

A ``redis-server`` of the run's own (as ``test_bench_replication.py`` starts it),
four subscriber processes that only read and drop bytes, and one publisher that
sends 300,000 lines shaped like the fan-out benchmark's, one ``PUBLISH`` a line
(the format the reference's workers read), pipelined from buffers encoded before
the clock starts. No client parses anything, so the figure is what Redis's own
work per message allows on this machine: lines per second delivered to the four
subscribers in total, and Redis's CPU per delivered line. Compare it with
``test_bench_replication.py -k "compiled and plain and fanout"`` run beside it:
the ``redis`` transport's fan-out cannot pass this figure whatever its workers do.

Run: ``python -m pytest bench/test_bench_redis_ceiling.py --benchmark-only -s``
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import orjson
import pytest

from support.processes import cpu_seconds
from support.redis_server import own_redis_server

sys.path.insert(0, os.path.dirname(__file__))
from redis_ceiling import lines, message_bytes  # noqa: E402

ROLES = os.path.join(os.path.dirname(__file__), "redis_ceiling.py")
SUBSCRIBERS = 4
LINES = 300_000
CHANNEL = "bench.example"


def _round(tmp: str) -> dict[str, float]:
    redis = own_redis_server("--client-output-buffer-limit", "pubsub 0 0 0")
    assert redis.process is not None
    expected = sum(message_bytes(CHANNEL.encode(), line) for line in lines(LINES))
    outs = [os.path.join(tmp, f"s{i}.json") for i in range(SUBSCRIBERS)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs = [subprocess.Popen(
            [sys.executable, ROLES, "subscriber", str(redis.port), CHANNEL, str(expected), out],
            stdout=subprocess.PIPE) for out in outs]
        for sub in procs:
            assert sub.stdout is not None and sub.stdout.readline().strip() == b"ready"
        redis_before = cpu_seconds([redis.process.pid])
        procs.append(subprocess.Popen([sys.executable, ROLES, "publisher", str(redis.port),
                                       CHANNEL, str(LINES)]))
        for proc in reversed(procs):
            assert proc.wait(300) == 0, f"{proc.args} failed"
        redis_cpu = cpu_seconds([redis.process.pid]) - redis_before
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        redis.stop()
    spans = []
    for out in outs:
        with open(out, "rb") as fh:
            spans.append(orjson.loads(fh.read()))
    seconds = (max(s["last_ns"] for s in spans) - min(s["first_ns"] for s in spans)) / 1e9
    delivered = SUBSCRIBERS * LINES
    return {"lines_per_second": delivered / seconds,
            "redis_cpu_us_per_line": redis_cpu / delivered * 1e6}


@pytest.mark.benchmark(group="replication-redis-ceiling")
def test_bench_redis_ceiling(benchmark: Any, tmp_path: Any) -> None:
    rounds: list[dict[str, float]] = []
    benchmark.pedantic(lambda: rounds.append(_round(str(tmp_path))), rounds=3, iterations=1)
    ranked = sorted(rounds, key=lambda r: r["lines_per_second"])
    median = ranked[len(ranked) // 2]
    benchmark.extra_info.update(median)
    print(f"\nredis ceiling: {median['lines_per_second']:,.0f} lines/s delivered to "
          f"{SUBSCRIBERS} subscribers that parse nothing (rounds "
          + ", ".join(f"{r['lines_per_second']:,.0f}" for r in rounds)
          + f"), Redis CPU {median['redis_cpu_us_per_line']:.2f} µs a delivered line")
