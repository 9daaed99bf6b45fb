"""What following a live reference deployment costs: CPU per row of ``streamrep
tail --synapse-config`` while a reference homeserver (matrix-synapse, its own venv,
Redis of the run's own) persists messages as fast as its client API takes them.

Eight client threads send messages into four rooms; ``tail`` follows ``events``
and prints every row to a file. The run ends once ``tail`` has printed a row for
every event the homeserver persisted. It prints the rows, the events persisted per
second, and the CPU seconds of each process over the run (from ``/proc``): the
follower's per row, less what it costs idle (measured for 10 s before), and the homeserver's per event
persisted, side by side.

``python -m pytest bench/test_bench_follow_reference.py --benchmark-only -s``
(``STREAMREP_REFERENCE_PYTHON`` names the reference's interpreter; without it the
benchmark is skipped, and fails under ``STREAMREP_REQUIRE_REFERENCE=1``).
"""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time
from typing import Any, Iterator

import pytest

from support.processes import cpu_seconds, reap_processes, streamrep_process
from support.redis_server import RedisServer, own_redis_server, unique_server_name, wait_subscribed
from support.reference_homeserver import Homeserver, running_homeserver

MESSAGES = int(os.environ.get("STREAMREP_BENCH_MESSAGES", "1200"))
THREADS = 8
IDLE_SECONDS = 10.0
ROOMS = 4


def _lines(path: pathlib.Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for _ in fh)


@pytest.fixture
def deployment(tmp_path: pathlib.Path) -> Iterator[tuple[RedisServer, Homeserver]]:
    redis_server = own_redis_server()
    try:
        with running_homeserver(str(tmp_path / "hs"), redis_server.url, unique_server_name("bench-follow")) as hs:
            yield redis_server, hs
    finally:
        redis_server.stop()


def _send_all(hs: Homeserver, messages: int) -> None:
    token = hs.register(f"bench{time.monotonic_ns()}")
    rooms = [hs.create_room(token) for _ in range(ROOMS)]
    per_thread = messages // THREADS

    def send(n: int) -> None:
        for i in range(per_thread):
            hs.send_message(token, rooms[(n + i) % ROOMS], f"message {n}/{i}")

    threads = [threading.Thread(target=send, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.benchmark(group="follow-reference")
def test_follower_cpu_per_row(benchmark: Any, deployment: tuple[RedisServer, Homeserver],
                              tmp_path: pathlib.Path) -> None:
    redis_server, hs = deployment
    # Untimed (--benchmark-disable, as scripts/test runs every benchmark): a short run.
    messages, idle_seconds = (200, 2.0) if benchmark.disabled else (MESSAGES, IDLE_SECONDS)
    out, err = tmp_path / "tail.out", tmp_path / "tail.err"
    tail = streamrep_process(err, "tail", "--synapse-config", hs.config_path, "--stream", "events", out=out)
    try:
        wait_subscribed(redis_server.url, hs.server_name, 2, logs=[err])
        figures: dict[str, float] = {}
        # What following costs with nothing to follow (keepalives, the link's watch),
        # taken off the run's CPU so the figure is per row.
        idle_cpu, idle_start = cpu_seconds([tail.pid]), time.monotonic()
        time.sleep(idle_seconds)
        idle_rate = (cpu_seconds([tail.pid]) - idle_cpu) / (time.monotonic() - idle_start)

        def run() -> None:
            before = len(hs.stream_orderings())
            printed_before = _lines(out)
            tail_cpu, hs_cpu, start = cpu_seconds([tail.pid]), cpu_seconds([hs.process.pid]), time.monotonic()
            _send_all(hs, messages)
            persisted = len(hs.stream_orderings()) - before
            deadline = time.monotonic() + 120
            # Every event persisted is at least one events row (state events carry two).
            while _lines(out) - printed_before < persisted:
                assert time.monotonic() < deadline, f"tail printed {_lines(out) - printed_before} of " \
                                                    f"{persisted} rows: {err.read_text()[-2000:]}"
                time.sleep(0.05)
            wall = time.monotonic() - start
            rows = _lines(out) - printed_before
            figures.update(rows=rows, persisted=persisted, wall=wall,
                           tail_cpu=cpu_seconds([tail.pid]) - tail_cpu, hs_cpu=cpu_seconds([hs.process.pid]) - hs_cpu)

        benchmark.pedantic(run, rounds=1, iterations=1)
        assert tail.poll() is None, err.read_text()
        assert figures["rows"] >= figures["persisted"] > 0
        per_row = (figures["tail_cpu"] - idle_rate * figures["wall"]) / figures["rows"] * 1e6
        per_event = figures["hs_cpu"] / figures["persisted"] * 1e6
        benchmark.extra_info.update(rows=figures["rows"], us_cpu_per_row=round(per_row, 1),
                                    reference_us_cpu_per_event=round(per_event, 1))
        print(f"\nfollow-reference: {int(figures['rows'])} rows of {int(figures['persisted'])} events persisted "
              f"at {figures['persisted'] / figures['wall']:.0f} events/s; tail {per_row:.1f} µs CPU per row "
              f"(idle {idle_rate * 1e3:.1f} ms CPU/s taken off), "
              f"the reference {per_event:.0f} µs CPU per event persisted ({per_event / per_row:.0f}x)")
    finally:
        tail.send_signal(signal.SIGTERM)
        try:
            tail.wait(30)
        finally:
            reap_processes()
