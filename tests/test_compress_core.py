"""The compression planner of the core, over both implementations.

Every plan is checked the slow way: each group's full state rebuilt from the
new prev pointers and deltas equals the one it had, every chain is within the
bound, and the rows do not grow.
"""

from __future__ import annotations

import random
from array import array
from types import ModuleType

import pytest

from support.impls import core_module

State = dict[int, int]


def make_rooms(seed: int, rooms: int, groups: int, max_hops: int, fork: float = 0.05,
               snapshot: float = 0.01) -> tuple[list[int], list[int], list[State], list[int]]:
    """Parents (batch index), rooms, full states and original delta sizes of a
    forest whose groups are ordered by room, then by creation."""
    rng = random.Random(seed)
    per_room: list[list[tuple[int, State, int, int]]] = [[] for _ in range(rooms)]
    state: list[State] = [{} for _ in range(rooms)]
    recent: list[list[tuple[int, int]]] = [[] for _ in range(rooms)]
    event = 0
    for _ in range(groups):
        r = rng.randrange(rooms)
        pos = len(per_room[r])
        if not recent[r] or recent[r][-1][1] >= max_hops or rng.random() < snapshot:
            if not state[r]:
                state[r] = {0: 1, 1: 2}
            per_room[r].append((-1, dict(state[r]), len(state[r]), 0))
            recent[r] = [(pos, 0)]
            continue
        if rng.random() < fork and len(recent[r]) > 2:
            parent, hops = recent[r][-rng.randint(2, min(5, len(recent[r])))]
        else:
            parent, hops = recent[r][-1]
        full = dict(per_room[r][parent][1])
        delta = {}
        for _ in range(rng.choice((1, 1, 2, 3, 6))):
            key = rng.randrange(2, 2 + len(full) + 2)
            event += 1
            delta[key] = 1000 + event
        full.update(delta)
        state[r] = full
        per_room[r].append((parent, full, len(delta), hops + 1))
        recent[r].append((pos, hops + 1))
        del recent[r][:-8]
    parents: list[int] = []
    room_ids: list[int] = []
    fulls: list[State] = []
    sizes: list[int] = []
    for r, members in enumerate(per_room):
        base = len(parents)
        for parent, full, size, _ in members:
            parents.append(-1 if parent == -1 else base + parent)
            room_ids.append(r)
            fulls.append(full)
            sizes.append(size)
    return parents, room_ids, fulls, sizes


def csr(fulls: list[State]) -> tuple[array[int], array[int], array[int]]:
    offsets, keys, events = array("q", [0]), array("q"), array("q")
    for full in fulls:
        for k in sorted(full):
            keys.append(k)
            events.append(full[k])
        offsets.append(len(keys))
    return offsets, keys, events


def rebuild(parents: array[int], offsets: array[int], keys: array[int], events: array[int]) -> list[State]:
    out: list[State] = []
    for i in range(len(parents)):
        chain = [i]
        while parents[chain[-1]] != -1:
            chain.append(parents[chain[-1]])
            assert len(chain) <= len(parents), "the plan has a cycle"
        full: State = {}
        for g in reversed(chain):
            for x in range(offsets[g], offsets[g + 1]):
                full[keys[x]] = events[x]
        out.append(full)
    return out


def chain_lengths(parents: array[int]) -> list[int]:
    lengths = []
    for i in range(len(parents)):
        hops, v = 0, i
        while parents[v] != -1:
            v = parents[v]
            hops += 1
        lengths.append(hops)
    return lengths


def plan(core: ModuleType, parents: list[int], rooms: list[int], fulls: list[State],
         **kwargs: object) -> tuple[array[int], ...]:
    offsets, keys, events = csr(fulls)
    return core.plan_compression(  # type: ignore[no-any-return]
        array("q", parents), array("q", rooms), offsets, keys, events, **kwargs
    )


@pytest.mark.parametrize("seed, max_depth", [(1, 100), (2, 10), (3, 3), (4, 1)])
def test_plan_keeps_every_state_and_bounds_chains(impl_kind: str, seed: int, max_depth: int) -> None:
    core = core_module("compress", impl_kind)
    parents, rooms, fulls, sizes = make_rooms(seed, rooms=4, groups=1500, max_hops=40)
    new_parents, depths, offsets, keys, events = plan(core, parents, rooms, fulls, max_depth=max_depth)
    assert rebuild(new_parents, offsets, keys, events) == fulls
    lengths = chain_lengths(new_parents)
    assert list(depths) == lengths
    assert max(lengths) <= max_depth
    if max_depth >= 40:
        # The snapshots are linked to the group before them: far fewer rows.
        assert len(keys) < 0.8 * sum(sizes)


def test_deep_chain_of_snapshot_linked_trees_gets_levels(impl_kind: str) -> None:
    core = core_module("compress", impl_kind)
    # One room, chains of 100 hops then a snapshot: linking makes one tree of
    # depth ~3000, which the levels bring back within 100.
    parents, rooms, fulls, sizes = make_rooms(5, rooms=1, groups=3000, max_hops=100, snapshot=0.0)
    new_parents, depths, offsets, keys, events = plan(core, parents, rooms, fulls)
    assert rebuild(new_parents, offsets, keys, events) == fulls
    assert max(depths) <= 100
    assert max(chain_lengths(array("q", parents))) == 100
    assert len(keys) < sum(sizes)


def test_wide_fan_out_keeps_its_prev(impl_kind: str) -> None:
    core = core_module("compress", impl_kind)
    fulls: list[State] = [{1: 1, 2: 2}] + [{1: 1, 2: 2, 10 + i: i} for i in range(300)]
    parents = [-1] + [0] * 300
    new_parents, depths, offsets, keys, events = plan(core, parents, [0] * 301, fulls)
    assert list(new_parents) == parents
    assert len(keys) == 2 + 300


def test_redundant_rows_are_dropped(impl_kind: str) -> None:
    core = core_module("compress", impl_kind)
    # Group 1's stored delta repeats its prev's value for key 1: one row too many.
    fulls = [{1: 5, 2: 6}, {1: 5, 2: 7}]
    new_parents, _, offsets, keys, events = plan(core, [-1, 0], [0, 0], fulls)
    assert list(new_parents) == [-1, 0]
    assert list(keys[offsets[1]:offsets[2]]) == [2]


def test_snapshot_links_only_to_a_subset_state(impl_kind: str) -> None:
    core = core_module("compress", impl_kind)
    # Group 2 (a root) holds key 3 but not key 9 of group 1: it cannot take
    # group 1 as prev (deltas never remove keys), but group 0 works.
    fulls = [{1: 1, 2: 2}, {1: 1, 2: 2, 9: 9}, {1: 1, 2: 2, 3: 3}]
    new_parents, _, offsets, keys, _ = plan(core, [-1, 0, -1], [0, 0, 0], fulls)
    assert list(new_parents) == [-1, 0, 0]
    assert list(keys[offsets[2]:offsets[3]]) == [3]
    # Other rooms are never candidates.
    new_parents, _, _, _, _ = plan(core, [-1, 0, -1], [0, 0, 1], fulls)
    assert list(new_parents) == [-1, 0, -1]


def test_fixed_roots_stay(impl_kind: str) -> None:
    core = core_module("compress", impl_kind)
    fulls = [{1: 1}, {1: 1, 2: 2}]
    new_parents, _, _, keys, _ = plan(core, [-1, -1], [0, 0], fulls, fixed=bytes([0, 1]))
    assert list(new_parents) == [-1, -1]
    assert len(keys) == 3
    with pytest.raises(ValueError, match="fixed but not a root"):
        plan(core, [-1, 0], [0, 0], fulls, fixed=bytes([0, 1]))


def test_bad_buffers_are_refused(impl_kind: str) -> None:
    core = core_module("compress", impl_kind)
    with pytest.raises(ValueError, match="not a batch index"):
        plan(core, [5], [0], [{1: 1}])
    with pytest.raises(ValueError, match="rooms has"):
        core.plan_compression(array("q", [-1]), array("q"), array("q", [0, 0]), array("q"), array("q"))
    with pytest.raises(ValueError, match="max_depth"):
        plan(core, [-1], [0], [{1: 1}], max_depth=0)


@pytest.mark.compiled_vs_pure
@pytest.mark.parametrize("seed", [11, 12])
def test_compiled_and_pure_make_the_same_plan(seed: int) -> None:
    parents, rooms, fulls, _ = make_rooms(seed, rooms=3, groups=2500, max_hops=60, snapshot=0.02)
    for max_depth in (100, 7):
        pure = plan(core_module("compress", "pure"), parents, rooms, fulls, max_depth=max_depth)
        compiled = plan(core_module("compress", "compiled"), parents, rooms, fulls, max_depth=max_depth)
        assert [list(a) for a in compiled] == [list(a) for a in pure]


def test_level_radices_stay_within_the_bound(impl_kind: str) -> None:
    core = core_module("compress", impl_kind)
    assert core.level_radices(100, 100) == []
    for height in (101, 2000, 40_000, 10**6):
        found = core.level_radices(height, 100)
        assert [101] in found  # plain snapshots are always priced
        assert any(_reach(r) > height for r in found)
        assert all(sum(s - 1 for s in r) <= 100 for r in found)
    # A bound too small for any level scheme still has snapshots.
    assert core.level_radices(500, 2) == [[3], [2, 2]]


def _reach(radices: list[int]) -> int:
    reach = 1
    for s in radices:
        reach *= s
    return reach
