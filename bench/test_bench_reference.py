"""The extremity calculation side by side with the reference implementation's.

The reference system works out a room's new forward extremities in memory from
the batch's event objects (``_calculate_new_extremities`` of its event persistence
controller). Here the two database lookups it awaits are answered empty, as they
are when no stored event already lists the batch's events as prev_events; what is
timed is its in-memory part. streamrep's core does the same update on interned
integer buffers (``test_extremity_core`` in ``test_bench_events.py``). Both run
over the same 50 batches of 100 events (``support.forked_batches``), and each
batch's result is checked equal to the reference's before anything is timed.

The reference implementation is not a streamrep dependency: install it into the
benchmark's environment (``pip install matrix-synapse``) or this module is skipped.
Run: ``python -m pytest bench/test_bench_reference.py --benchmark-only -s``
"""

from __future__ import annotations

import types
from typing import Any, Callable, Coroutine

import pytest

from support.forked_batches import N_FORWARD, core_buffers, forked_batch
from support.impls import IMPLEMENTATIONS, core_module

persist_events = pytest.importorskip(
    "synapse.storage.controllers.persist_events",
    reason="the reference implementation is not installed (pip install matrix-synapse)")
synapse_events = pytest.importorskip("synapse.events")
room_versions = pytest.importorskip("synapse.api.room_versions")

BATCH = 100
SEEDS = range(50)


async def _nothing_stored(*_args: Any) -> set[str]:
    return set()


def _finish(coroutine: Coroutine[Any, Any, set[str]]) -> set[str]:
    """Run a coroutine that never suspends (its awaited lookups answer at once)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return set(done.value)
    coroutine.close()
    raise RuntimeError("the reference calculation suspended: it awaited real I/O")


def _reference_runner() -> Callable[[list[Any], set[str]], set[str]]:
    controller = persist_events.EventsPersistenceStorageController
    stores = types.SimpleNamespace(_get_events_which_are_prevs=_nothing_stored,
                                   _get_prevs_before_rejected=_nothing_stored)
    this = types.SimpleNamespace(persist_events_store=stores, server_name="bench.test")

    def run(pairs: list[Any], forward: set[str]) -> set[str]:
        return _finish(controller._calculate_new_extremities(this, "!bench:x", pairs, forward))

    return run


def _reference_batch(seed: int) -> tuple[list[Any], set[str]]:
    """``forked_batch(seed)`` as the reference's (event, context) pairs, room version 1
    (whose events carry their own IDs, so both sides name events alike)."""
    context = types.SimpleNamespace(rejected=False)
    pairs = []
    for own, prev_events in forked_batch(seed, BATCH):
        event = synapse_events.make_event_from_dict(
            {"event_id": f"$e{own}", "room_id": "!bench:x", "type": "m.room.message",
             "sender": "@a:x", "depth": own, "origin_server_ts": 0, "content": {},
             "prev_events": [[f"$e{p}", {"sha256": "x"}] for p in dict.fromkeys(prev_events)],
             "auth_events": [], "hashes": {"sha256": "x"}, "signatures": {}},
            room_versions.RoomVersions.V1)
        pairs.append((event, context))
    return pairs, {f"$e{f}" for f in range(N_FORWARD)}


def _core_forward(module: Any, inputs: tuple[Any, ...]) -> set[str]:
    added, removed, _, _ = module.update_extremities(*inputs)
    forward = (set(range(N_FORWARD)) | set(added)) - set(removed)
    return {f"$e{i}" for i in forward}


@pytest.mark.parametrize("kind", ["reference", *IMPLEMENTATIONS])
def test_extremity_calculation_side_by_side(benchmark: Any, kind: str) -> None:
    reference = _reference_runner()
    reference_batches = [_reference_batch(seed) for seed in SEEDS]
    expected = [reference(pairs, forward) for pairs, forward in reference_batches]

    if kind == "reference":
        def run() -> None:
            for pairs, forward in reference_batches:
                reference(pairs, forward)
    else:
        module = core_module("extremities", kind)
        core_batches = [core_buffers(seed, BATCH) for seed in SEEDS]
        assert [_core_forward(module, b) for b in core_batches] == expected

        def run() -> None:
            for b in core_batches:
                module.update_extremities(*b)

    benchmark(run)
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    rate = BATCH * len(SEEDS) / benchmark.stats.stats.median
    benchmark.extra_info["events_per_s"] = round(rate)
    print(f"\n{benchmark.name}: {rate:,.0f} events/s (median)")
