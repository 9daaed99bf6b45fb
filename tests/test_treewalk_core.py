"""The tree walker core (digests, states a chunk at a time, the compression plan
from deltas), over both implementations, against brute force.

Forests come in the shapes the walkers must survive: deep chains, wide fan-out,
forks, snapshots, overwrites and leaves (a member's key set to a leave event).
Brute force expands every group's full state by walking its chain.
"""

from __future__ import annotations

import random
from array import array
from types import ModuleType

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.impls import IMPLEMENTATIONS, core_module

State = dict[int, int]


def make_forest(seed: int, groups: int, shape: str) -> tuple[list[int], list[int], list[State]]:
    """Parents (batch index), rooms and deltas of a generated forest.

    *shape*: ``chain`` (one deep chain, snapshots every 300), ``fan`` (wide
    fan-out under a few groups), ``mixed`` (rooms with forks, snapshots,
    overwrites and leaves).
    """
    rng = random.Random(seed)
    parents: list[int] = []
    rooms: list[int] = []
    deltas: list[State] = []
    full: list[State] = []
    event = [1000]

    def new_event() -> int:
        event[0] += 1
        return event[0]

    def add(parent: int, room: int, delta: State) -> None:
        base = dict(full[parent]) if parent != -1 else {}
        base.update(delta)
        parents.append(parent)
        rooms.append(room)
        deltas.append(delta)
        full.append(base)

    room_count = 1 if shape != "mixed" else 5
    per_room = groups // room_count
    for room in range(room_count):
        first = len(parents)
        add(-1, room, {0: new_event(), 1: new_event()})
        members = 2
        for n in range(1, per_room):
            last = len(parents) - 1
            if shape == "chain":
                if n % 300 == 0:
                    add(-1, room, dict(full[last]))
                    continue
                parent = last
            elif shape == "fan":
                parent = first + rng.randrange(min(3, last - first + 1))
            else:
                if rng.random() < 0.03:
                    add(-1, room, dict(full[last]))
                    continue
                parent = last if rng.random() > 0.1 else rng.randrange(first, last + 1)
            delta: State = {}
            for _ in range(rng.choice((1, 1, 2, 3, 6))):
                if rng.random() < 0.5 and members > 2:
                    # An overwrite, or a leave: an existing member's key gets a new event.
                    key = rng.randrange(2, members)
                else:
                    key = members
                    members += 1
                delta[key] = new_event()
            if rng.random() < 0.1 and full[parent]:
                # A row equal to the prev's value (redundant).
                key = rng.choice(list(full[parent]))
                delta[key] = full[parent][key]
            add(parent, room, delta)
    return parents, rooms, deltas


def expanded(parents: list[int], deltas: list[State]) -> list[State]:
    out: list[State] = []
    for i in range(len(parents)):
        chain = [i]
        while parents[chain[-1]] != -1:
            chain.append(parents[chain[-1]])
        state: State = {}
        for g in reversed(chain):
            state.update(deltas[g])
        out.append(state)
    return out


def csr(states: list[State]) -> tuple[array[int], array[int], array[int]]:
    offsets, keys, events = array("q", [0]), array("q"), array("q")
    for state in states:
        for k in sorted(state):
            keys.append(k)
            events.append(state[k])
        offsets.append(len(keys))
    return offsets, keys, events


def string_tables(keys: int, events: int, stride: int) -> tuple[object, object, object]:
    def table(values: list[str]) -> tuple[object, object]:
        arr = pa.array(values, pa.large_string())
        return arr.buffers()[1], arr.buffers()[2]

    types = table([f"m.type.{t}" for t in range(keys // stride + 1)])
    state_keys = table([f"@u{s}:example.org" if s else "" for s in range(stride)])
    event_ids = table([f"$e{e}" for e in range(events)])
    return types, state_keys, event_ids


def text_state(state: State, stride: int) -> dict[tuple[str, str], str]:
    return {(f"m.type.{k // stride}", f"@u{k % stride}:example.org" if k % stride else ""): f"$e{e}"
            for k, e in state.items()}


SHAPES = [("chain", 900), ("fan", 400), ("mixed", 1200)]


@pytest.mark.parametrize("shape, groups", SHAPES)
def test_digests_match_the_digest_of_each_expanded_state(impl_kind: str, shape: str, groups: int) -> None:
    walk = core_module("treewalk", impl_kind)
    parents, _, deltas = make_forest(7, groups, shape)
    truth = expanded(parents, deltas)
    stride = 1000
    offsets, keys, events = csr(deltas)
    tables = string_tables(max(keys) + 1, max(events) + 1, stride)
    wanted = bytes(1 if i % 3 else 0 for i in range(len(parents)))
    entries, hexes = walk.digest_groups(array("q", parents), offsets, keys, events, wanted, stride,
                                        *tables)
    chosen = [i for i in range(len(parents)) if wanted[i]]
    assert list(entries) == [len(truth[i]) for i in chosen]
    got = [hexes[64 * n:64 * n + 64].decode() for n in range(len(chosen))]
    assert got == [walk.digest_state(text_state(truth[i], stride)) for i in chosen]


def test_the_digest_does_not_depend_on_order_and_changes_with_any_entry(impl_kind: str) -> None:
    walk = core_module("treewalk", impl_kind)
    state = {("m.room.member", f"@u{i}:x"): f"$e{i}" for i in range(50)}
    reordered = dict(reversed(list(state.items())))
    assert walk.digest_state(state) == walk.digest_state(reordered)
    assert walk.digest_state({}) == walk.EMPTY_STATE_DIGEST == "0" * 64
    changed = dict(state)
    changed[("m.room.member", "@u3:x")] = "$other"
    assert walk.digest_state(changed) != walk.digest_state(state)
    fewer = dict(state)
    del fewer[("m.room.member", "@u3:x")]
    assert walk.digest_state(fewer) != walk.digest_state(state)
    # Field boundaries are part of the entry: ("ab", "c") is not ("a", "bc").
    assert walk.digest_state({("ab", "c"): "$e"}) != walk.digest_state({("a", "bc"): "$e"})


@pytest.mark.parametrize("shape, groups", SHAPES)
def test_state_walk_gives_every_wanted_state_in_chunks(impl_kind: str, shape: str, groups: int) -> None:
    walk = core_module("treewalk", impl_kind)
    parents, _, deltas = make_forest(3, groups, shape)
    truth = expanded(parents, deltas)
    offsets, keys, events = csr(deltas)
    wanted = bytes(1 if i % 4 != 1 else 0 for i in range(len(parents)))
    walker = walk.StateWalk(array("q", parents), offsets, keys, events, wanted)
    got: dict[int, list[tuple[int, int]]] = {}
    chunks = 0
    chunk_rows = sum(len(truth[i]) for i in range(len(parents)) if wanted[i]) // 6
    while True:
        g, k, e = walker.next_states(chunk_rows)
        if not len(g):
            break
        chunks += 1
        assert len(g) < chunk_rows + max(len(s) for s in truth)
        for group, key, ev in zip(g, k, e):
            got.setdefault(group, []).append((key, ev))
    assert chunks >= 6
    expected = {i: sorted(truth[i].items()) for i in range(len(parents)) if wanted[i] and truth[i]}
    assert got == expected


@pytest.mark.parametrize("shape, groups", SHAPES + [("mixed", 3000)])
@pytest.mark.parametrize("max_depth", [100, 7, 1])
def test_plan_from_deltas_equals_the_plan_from_expanded_states(
        impl_kind: str, shape: str, groups: int, max_depth: int) -> None:
    walk = core_module("treewalk", impl_kind)
    planner = core_module("compress", impl_kind)
    if impl_kind == "pure" and groups > 1500:
        pytest.skip("the pure twin plans the smaller forests")
    parents, rooms, deltas = make_forest(11, groups, shape)
    truth = expanded(parents, deltas)
    fixed = bytes(1 if parents[i] == -1 and i % 7 == 3 else 0 for i in range(len(parents)))
    by_states = planner.plan_compression(array("q", parents), array("q", rooms), *csr(truth), fixed,
                                         max_depth=max_depth)
    by_deltas = walk.plan_compression(array("q", parents), array("q", rooms), *csr(deltas), fixed,
                                      max_depth=max_depth)
    assert [list(a) for a in by_deltas] == [list(a) for a in by_states]
    new_parents, depths, offsets, keys, events = by_deltas
    new_deltas = [dict(zip(keys[offsets[i]:offsets[i + 1]], events[offsets[i]:offsets[i + 1]]))
                  for i in range(len(parents))]
    assert expanded(list(new_parents), new_deltas) == truth
    assert max(depths) <= max_depth


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["chain", "fan", "mixed"]), st.integers(1, 12))
def test_compiled_and_pure_agree(seed: int, shape: str, max_depth: int) -> None:
    if len(IMPLEMENTATIONS) < 2:
        pytest.skip("only the pure twin is loaded")
    compiled, pure = core_module("treewalk", "compiled"), core_module("treewalk", "pure")
    parents, rooms, deltas = make_forest(seed, 150, shape)
    args = (array("q", parents), array("q", rooms), *csr(deltas))
    assert [list(a) for a in compiled.plan_compression(*args, max_depth=max_depth)] == \
        [list(a) for a in pure.plan_compression(*args, max_depth=max_depth)]
    offsets, keys, events = csr(deltas)
    tables = string_tables(max(keys) + 1, max(events) + 1, 1000)
    assert compiled.digest_groups(args[0], offsets, keys, events, None, 1000, *tables) == \
        pure.digest_groups(args[0], offsets, keys, events, None, 1000, *tables)


def test_bad_input_is_refused_the_same_way(impl_kind: str) -> None:
    walk: ModuleType = core_module("treewalk", impl_kind)
    offsets, keys, events = array("q", [0, 1, 2]), array("q", [1, 2]), array("q", [5, 6])
    with pytest.raises(ValueError, match="parents form a cycle"):
        walk.StateWalk(array("q", [1, 0]), offsets, keys, events)
    with pytest.raises(ValueError, match="is not a batch index"):
        walk.StateWalk(array("q", [-1, 7]), offsets, keys, events)
    with pytest.raises(ValueError, match="delta_offsets has 2 entries, expected 3"):
        walk.StateWalk(array("q", [-1, 0]), array("q", [0, 2]), keys, events)
    with pytest.raises(ValueError, match="is fixed but not a root"):
        walk.plan_compression(array("q", [-1, 0]), array("q", [0, 0]), offsets, keys, events,
                              b"\x00\x01")
    tables = string_tables(1, 1, 1000)
    with pytest.raises(ValueError, match="outside its string table"):
        walk.digest_groups(array("q", [-1, 0]), offsets, keys, events, None, 1000, *tables)


def test_a_key_twice_in_one_delta_names_the_group(impl_kind: str) -> None:
    from streamrep.errors import StateCorruptionError

    walk: ModuleType = core_module("treewalk", impl_kind)
    offsets, keys, events = array("q", [0, 1, 3]), array("q", [4, 9, 9]), array("q", [5, 6, 7])
    with pytest.raises(StateCorruptionError, match="group index 1 has key 9 twice in its delta") as caught:
        walk.StateWalk(array("q", [-1, 0]), offsets, keys, events)
    assert caught.value.groups == (1,) and caught.value.key == 9  # type: ignore[attr-defined]


def test_sparse_keys_walk_in_key_order(impl_kind: str) -> None:
    """Keys anywhere in int64 (more distinct keys than the first hash table
    holds) come out of a walk sorted by key, with their events."""
    walk: ModuleType = core_module("treewalk", impl_kind)
    rng = random.Random(7)
    keys = rng.sample(range(1, 1 << 62), 3000)
    offsets = array("q", [0, 2000, 3000])
    events = array("q", range(3000))
    walker = walk.StateWalk(array("q", [-1, 0]), offsets, array("q", keys), events)
    groups, out_keys, out_events = walker.next_states(10_000)
    assert list(groups) == [0] * 2000 + [1] * 3000
    assert list(out_keys) == sorted(keys[:2000]) + sorted(keys)
    event_of = dict(zip(keys, range(3000)))
    assert list(out_events) == [event_of[k] for k in out_keys]


def test_string_interner_numbers_strings_as_they_first_arrive(impl_kind: str) -> None:
    walk: ModuleType = core_module("treewalk", impl_kind)
    interner = walk.StringInterner()
    rng = random.Random(3)
    words = [f"@user{rng.randrange(5000)}:example.org" for _ in range(20_000)] + ["", "é"]
    expected: dict[str, int] = {}
    got: list[int] = []
    for lo in range(0, len(words), 7000):
        column = pa.array(words[lo:lo + 7000], pa.large_string())
        got += list(interner.intern(column.buffers()[1], column.buffers()[2]))
        for w in words[lo:lo + 7000]:
            expected.setdefault(w, len(expected))
    assert got == [expected[w] for w in words]
    assert len(interner) == len(expected)
    offsets, data = interner.table()
    table = pa.Array.from_buffers(pa.large_string(), len(expected), [None, pa.py_buffer(offsets),
                                                                     pa.py_buffer(data)])
    assert table.to_pylist() == list(expected)
