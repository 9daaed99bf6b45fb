"""State core micro-benchmarks: expand_groups, and the tree walker's digests and
states, compiled vs pure.

    python -m pytest bench/test_bench_state.py --benchmark-only

Each figure has a ``compiled`` and a ``pure`` row; their ratio is the speed-up
of the compiled core on the same input in the same run.
"""

from __future__ import annotations

import random
from array import array
from types import ModuleType

import pytest

from support.impls import core_module

Batch = tuple[array, array, array, array, array]  # of int64


def forest_batch(n: int, seed: int = 1, state_size: int = 60, hops: int = 20) -> Batch:
    """Trees of ``hops`` groups: a snapshot of ``state_size`` keys, then 1-3 key deltas."""
    rng = random.Random(seed)
    groups, prevs, offsets, keys, events = (array("q") for _ in range(5))
    offsets.append(0)
    key_space = state_size * 4
    for i in range(n):
        gid = i + 1
        groups.append(gid)
        if i % hops == 0:
            prevs.append(-1)
            rows = rng.sample(range(key_space), state_size)
        else:
            prevs.append(gid - 1 if rng.random() < 0.9 else gid - 1 - (i % hops > 1))
            rows = rng.sample(range(key_space), rng.randint(1, 3))
        keys.extend(sorted(rows))
        events.extend(rng.randrange(1 << 40) for _ in rows)
        offsets.append(len(keys))
    return groups, prevs, offsets, keys, events


@pytest.fixture(scope="module")
def batch() -> Batch:
    return forest_batch(20_000)


def test_expand_groups(benchmark: object, impl_kind: str, batch: Batch) -> None:
    state: ModuleType = core_module("state", impl_kind)
    out = benchmark.pedantic(  # type: ignore[attr-defined]
        state.expand_groups, args=(*batch, None), rounds=3, iterations=1, warmup_rounds=1
    )
    assert len(out[0]) > len(batch[0]) * 60


def test_expand_groups_wanted_tenth(benchmark: object, impl_kind: str, batch: Batch) -> None:
    state: ModuleType = core_module("state", impl_kind)
    wanted = bytes(1 if i % 10 == 0 else 0 for i in range(len(batch[0])))
    out = benchmark.pedantic(  # type: ignore[attr-defined]
        state.expand_groups, args=(*batch, wanted), rounds=3, iterations=1, warmup_rounds=1
    )
    assert len(set(out[0])) == len(batch[0]) // 10


def test_digest_groups(benchmark: object, impl_kind: str, batch: Batch) -> None:
    import pyarrow as pa

    walk: ModuleType = core_module("treewalk", impl_kind)
    groups, prevs, offsets, keys, events = batch
    n = len(groups) // 10
    parents = array("q", [-1 if p < 1 else p - 1 for p in prevs[:n]])
    offsets = offsets[: n + 1]
    keys, events = keys[: offsets[-1]], array("q", range(offsets[-1]))
    stride = 1000
    types = pa.array([f"m.type.{i}" for i in range(max(keys) // stride + 1)], pa.large_string())
    state_keys = pa.array([f"@user{i}:example.org" for i in range(stride)], pa.large_string())
    event_ids = pa.array([f"$event{i}" for i in range(len(events))], pa.large_string())

    def table(arr: pa.Array) -> tuple[object, object]:
        return arr.buffers()[1], arr.buffers()[2]

    entries, hexes = benchmark.pedantic(  # type: ignore[attr-defined]
        walk.digest_groups,
        args=(parents, offsets, keys, events, None, stride, table(types), table(state_keys),
              table(event_ids)),
        rounds=3, iterations=1, warmup_rounds=1,
    )
    assert len(hexes) == 64 * n and min(entries) > 0


def test_state_walk(benchmark: object, impl_kind: str, batch: Batch) -> None:
    walk: ModuleType = core_module("treewalk", impl_kind)
    groups, prevs, offsets, keys, events = batch
    n = len(groups) // 10
    parents = array("q", [-1 if p < 1 else p - 1 for p in prevs[:n]])
    offsets = offsets[: n + 1]

    def all_states() -> int:
        walker = walk.StateWalk(parents, offsets, keys[: offsets[-1]], events[: offsets[-1]])
        rows = 0
        while True:
            out = walker.next_states(262_144)
            if not len(out[0]):
                return rows
            rows += len(out[0])

    rows = benchmark.pedantic(all_states, rounds=3, iterations=1, warmup_rounds=1)  # type: ignore[attr-defined]
    assert rows > n * 60
