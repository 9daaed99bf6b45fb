"""Event IDs from reference hashes: the compiled core, its pure twin and the reference
implementation's own computation, side by side in one run.

100,000 computations of the reference hash and event ID of real-shaped events:
a pool of 2,000 distinct events (rooms of versions 4, 10, 11 and 12: messages of 3 to
8 KB with formatting and non-ASCII text, and the state events of each room), each
computed 50 times. streamrep computes ``eventformat.event_id_for`` (prune, canonical
JSON, SHA-256, URL-safe Base64); the reference, in its own interpreter
(``STREAMREP_REFERENCE_PYTHON``, as the interop tests use it), computes
``compute_event_reference_hash`` of events it built beforehand (untimed) and encodes
the ID, timed with ``time.process_time`` (``support/eventformat_oracle.py``, mode
``time``). Every ID is checked against the reference's before anything is timed.

Each rate goes to ``extra_info`` (with the ratio to the reference) and is printed
with ``-s``. Run: ``python -m pytest bench/test_bench_eventhash.py --benchmark-only -s``
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.impls import core_module
from support.real_events import room_events

ORACLE = Path(__file__).resolve().parent.parent / "tests" / "support" / "eventformat_oracle.py"
VERSIONS = ("4", "10", "11", "12")
POOL = 2_000
REPEAT = 50


def _pool() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    seed = 0
    while len(out) < POOL:
        for version_id in VERSIONS:
            for event in room_events(version_id, seed=seed, messages=20):
                fields = {k: v for k, v in event.items() if k != "event_id"}
                out.append((version_id, fields))
        seed += 1
    return out[:POOL]


@pytest.fixture(scope="module")
def pool() -> list[tuple[str, dict[str, Any]]]:
    return _pool()


@pytest.fixture(scope="module")
def reference_rate(pool: list[tuple[str, dict[str, Any]]]) -> float:
    """The reference's events/s over the pool (checking its IDs against ours first)."""
    from streamrep.matrix.eventformat import event_id_for
    from streamrep.matrix.room_versions import room_version
    from support.reference import reference_python

    python = reference_python()
    cases = [{"version": v, "event": e} for v, e in pool]
    answers = json.loads(subprocess.run(
        [python, str(ORACLE)], input=json.dumps(cases), capture_output=True, text=True,
        check=True, timeout=600, cwd="/").stdout)
    for (version_id, event), answer in zip(pool, answers):
        assert answer["event_id"] == event_id_for(event, room_version(version_id))
    timed = json.loads(subprocess.run(
        [python, str(ORACLE), "time", str(REPEAT)], input=json.dumps(cases),
        capture_output=True, text=True, check=True, timeout=600, cwd="/").stdout)
    rate: float = timed["events"] / timed["seconds"]
    print(f"\nreference: {rate:,.0f} reference hashes and event IDs per s (process time)")
    return rate


def test_reference_hash_and_event_id(benchmark: Any, impl_kind: str,
                                     pool: list[tuple[str, dict[str, Any]]],
                                     reference_rate: float,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import streamrep.matrix.eventformat as eventformat
    from streamrep.matrix.room_versions import room_version

    monkeypatch.setattr(eventformat, "_eventhash", core_module("eventhash", impl_kind))
    work = [(room_version(v), e) for v, e in pool]
    event_id_for = eventformat.event_id_for

    def run() -> None:
        for _ in range(REPEAT):
            for version, event in work:
                event_id_for(event, version)

    benchmark.pedantic(run, rounds=3 if impl_kind == "compiled" else 1, iterations=1)
    if benchmark.stats is None:
        return
    rate = len(work) * REPEAT / benchmark.stats.stats.min
    benchmark.extra_info["events_per_s"] = round(rate)
    benchmark.extra_info["times_the_reference"] = round(rate / reference_rate, 2)
    print(f"\n{benchmark.name}: {rate:,.0f} per s ({impl_kind}), "
          f"{rate / reference_rate:.1f}x the reference's {reference_rate:,.0f}")


def test_check_records_of_persisted_events(benchmark: Any, impl_kind: str) -> None:
    """The store's ID and content hash check alone (``check_records``, one call for the
    lot) over 20,000 events of the persist benchmarks (``test_bench_events``: room
    version 10, messages of about 500 bytes of JSON and some joins, IDs that are
    reference hashes): events/s of the minimum of 5 rounds."""
    import itertools

    from streamrep.events.validation import parse_batch
    from streamrep.matrix.eventformat import redaction_rules
    from streamrep.matrix.room_versions import room_version
    from support.message_history import message_history

    eventhash = core_module("eventhash", impl_kind)
    records = parse_batch(list(itertools.islice(message_history("!bench:x", hash_ids=True), 20_000)))
    rules = redaction_rules(room_version("10"))
    assert eventhash.check_records(records, rules, True, True) == {}
    benchmark.pedantic(eventhash.check_records, args=(records, rules, True, True),
                       rounds=5 if impl_kind == "compiled" else 1, iterations=1)
    if benchmark.stats is None:
        return
    rate = len(records) / benchmark.stats.stats.min
    benchmark.extra_info["events_per_s"] = round(rate)
    print(f"\n{benchmark.name}: {rate:,.0f} events/s, {1e6 / rate:.2f} µs an event "
          f"({impl_kind})")
