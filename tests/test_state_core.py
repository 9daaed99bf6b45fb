"""The state core: expanding state-group deltas, over both implementations.

Every answer is checked against a brute-force walk of each group's prev chain,
and Hypothesis feeds the same batches to the compiled core and its pure twin.
"""

from __future__ import annotations

import random
from array import array
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep import _impl
from streamrep.errors import StateCorruptionError
from support.impls import IMPLEMENTATIONS, core_module

Batch = tuple[list[int], list[int], list[list[tuple[int, int]]]]


@pytest.fixture
def state(impl_kind: str) -> ModuleType:
    return core_module("state", impl_kind)


def csr(deltas: list[list[tuple[int, int]]]) -> tuple[array[int], array[int], array[int]]:
    offsets, keys, events = array("q", [0]), array("q"), array("q")
    for rows in deltas:
        keys.extend(k for k, _ in rows)
        events.extend(e for _, e in rows)
        offsets.append(len(keys))
    return offsets, keys, events


def run(mod: ModuleType, batch: Batch, wanted: list[bool] | None = None) -> list[tuple[int, int, int]]:
    groups, prevs, deltas = batch
    offsets, keys, events = csr(deltas)
    flags = None if wanted is None else bytes(int(w) for w in wanted)
    og, ok, oe = mod.expand_groups(
        array("q", groups), array("q", prevs), offsets, keys, events, flags
    )
    assert isinstance(og, array) and og.typecode == "q"
    assert len(og) == len(ok) == len(oe)
    return list(zip(og, ok, oe))


def brute_force(batch: Batch, wanted: list[bool] | None = None) -> list[tuple[int, int, int]]:
    groups, prevs, deltas = batch
    by_id = {g: i for i, g in enumerate(groups)}
    out = []
    for i, g in enumerate(groups):
        if wanted is not None and not wanted[i]:
            continue
        chain = []
        j = i
        while True:
            chain.append(j)
            if prevs[j] == -1:
                break
            j = by_id[prevs[j]]
        full: dict[int, int] = {}
        for j in reversed(chain):
            full.update(deltas[j])
        out.extend((g, k, e) for k, e in sorted(full.items()))
    return out


def random_forest(rng: random.Random, n: int, keys: int = 12, max_delta: int = 4,
                  root_share: float = 0.1) -> Batch:
    """Groups with random parents among earlier ones, listed in shuffled order."""
    ids = rng.sample(range(1, 10 * n + 10), n)
    prevs = []
    deltas = []
    for i in range(n):
        if i == 0 or rng.random() < root_share:
            prevs.append(-1)
        else:
            prevs.append(ids[rng.randrange(i)])
        ks = rng.sample(range(keys), rng.randint(0, min(max_delta, keys)))
        deltas.append([(k, rng.randrange(1000)) for k in ks])
    order = list(range(n))
    rng.shuffle(order)
    return [ids[i] for i in order], [prevs[i] for i in order], [deltas[i] for i in order]


# --- fixed cases -------------------------------------------------------------


def test_chain_later_deltas_override(state: ModuleType) -> None:
    batch: Batch = (
        [7, 3, 5],
        [5, -1, 3],
        [[(1, 70)], [(1, 30), (2, 31)], [(3, 50), (2, 51)]],
    )
    assert run(state, batch) == [
        (7, 1, 70), (7, 2, 51), (7, 3, 50),
        (3, 1, 30), (3, 2, 31),
        (5, 1, 30), (5, 2, 51), (5, 3, 50),
    ]
    assert run(state, batch, [False, False, True]) == [(5, 1, 30), (5, 2, 51), (5, 3, 50)]
    assert run(state, batch, [False, False, False]) == []


def test_empty_batch_and_empty_states(state: ModuleType) -> None:
    assert run(state, ([], [], [])) == []
    # A group whose whole chain has no rows has an empty state: no output rows.
    assert run(state, ([1, 2], [-1, 1], [[], []])) == []


def test_deep_chain_and_wide_fan_out(state: ModuleType) -> None:
    rng = random.Random(5)
    n = 400
    groups = list(range(1, n + 1))
    prevs = [-1] + list(range(1, 200)) + [200] * 200  # a 200-hop chain, then 200 children
    deltas = [[(rng.randrange(50), g)] for g in groups]
    batch: Batch = (groups, prevs, deltas)
    assert run(state, batch) == brute_force(batch)


def test_accepts_read_only_and_foreign_buffers(state: ModuleType) -> None:
    batch = random_forest(random.Random(1), 60)
    groups, prevs, deltas = batch
    offsets, keys, events = csr(deltas)

    def arrow(values: Any) -> Any:
        return pa.array(list(values), pa.int64()).buffers()[1]

    og, ok, oe = state.expand_groups(
        arrow(groups), memoryview(bytes(array("q", prevs))), arrow(offsets),
        arrow(keys), memoryview(array("q", events)).toreadonly(), None,
    )
    assert list(zip(og, ok, oe)) == brute_force(batch)


@pytest.mark.parametrize(
    "args, error",
    [
        (([1], [-1, 2], [0, 0], [], []), ValueError),
        (([1], [-1], [0], [], []), ValueError),
        (([1], [-1], [0, 1], [5], []), ValueError),
        (([1], [-1], [0, 2], [5], [6]), ValueError),
        (([1, 2], [-1, 1], [0, 1, 0], [5], [6]), ValueError),
    ],
)
def test_malformed_buffers(state: ModuleType, args: tuple[list[int], ...], error: type) -> None:
    with pytest.raises(error):
        state.expand_groups(*(array("q", a) for a in args), None)


def test_wrong_buffer_types(state: ModuleType) -> None:
    with pytest.raises(TypeError):
        state.expand_groups(array("i", [1]), array("q", [-1]), array("q", [0, 0]),
                            array("q"), array("q"), None)
    with pytest.raises(TypeError):
        state.expand_groups([1], array("q", [-1]), array("q", [0, 0]), array("q"), array("q"))
    with pytest.raises(ValueError):
        state.expand_groups(array("q", [1]), array("q", [-1]), array("q", [0, 0]),
                            array("q"), array("q"), b"\x01\x01")


# --- corruption --------------------------------------------------------------


def corruption(state: ModuleType, batch: Batch) -> StateCorruptionError:
    with pytest.raises(StateCorruptionError) as info:
        run(state, batch)
    return info.value


def test_cycle_is_named(state: ModuleType) -> None:
    exc = corruption(state, ([1, 2, 3, 4], [-1, 4, 2, 3], [[], [], [], []]))
    assert set(exc.groups) == {2, 3, 4}  # type: ignore[attr-defined]
    assert "cycle" in str(exc) and "2" in str(exc) and "4" in str(exc)


def test_self_loop_is_a_cycle(state: ModuleType) -> None:
    exc = corruption(state, ([1, 2], [-1, 2], [[], []]))
    assert exc.groups == (2,)  # type: ignore[attr-defined]


def test_group_hanging_below_a_cycle(state: ModuleType) -> None:
    # 5 is not on the cycle but only reaches it: the cycle itself is named.
    exc = corruption(state, ([5, 6, 7], [6, 7, 6], [[], [], []]))
    assert set(exc.groups) == {6, 7}  # type: ignore[attr-defined]


def test_missing_prev_is_named(state: ModuleType) -> None:
    exc = corruption(state, ([1, 2, 3], [-1, 99, 1], [[], [], []]))
    assert exc.groups == (2,)  # type: ignore[attr-defined]
    assert "2 (prev 99)" in str(exc)


def test_duplicate_key_in_delta_is_named(state: ModuleType) -> None:
    exc = corruption(state, ([1, 2], [-1, 1], [[(4, 1)], [(3, 1), (4, 2), (3, 9)]]))
    assert exc.groups == (2,)  # type: ignore[attr-defined]
    assert exc.key == 3  # type: ignore[attr-defined]


def test_group_listed_twice(state: ModuleType) -> None:
    exc = corruption(state, ([1, 2, 1], [-1, 1, -1], [[], [], []]))
    assert exc.groups == (1,)  # type: ignore[attr-defined]


def test_many_missing_prevs_are_summarised(state: ModuleType) -> None:
    n = 30
    exc = corruption(state, (list(range(1, n + 1)), [1000 + i for i in range(n)], [[]] * n))
    assert len(exc.groups) == n  # type: ignore[attr-defined]
    assert "and 20 more" in str(exc)


# --- compiled == pure == brute force -------------------------------------------


@st.composite
def batches(draw: st.DrawFn) -> tuple[Batch, list[bool]]:
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(0, 60))
    rng = random.Random(seed)
    batch = random_forest(rng, n, keys=draw(st.integers(1, 20)),
                          max_delta=draw(st.integers(0, 6)),
                          root_share=draw(st.sampled_from([0.0, 0.05, 0.3])))
    wanted = [draw(st.booleans()) for _ in range(n)]
    return batch, wanted


@st.composite
def corrupt_batches(draw: st.DrawFn) -> Batch:
    (groups, prevs, deltas), _ = draw(batches())
    if not groups:
        groups, prevs, deltas = [1], [-1], [[]]
    n = len(groups)
    kind = draw(st.sampled_from(["cycle", "missing", "dupkey", "dupgroup"]))
    i = draw(st.integers(0, n - 1))
    prevs = list(prevs)
    deltas = [list(d) for d in deltas]
    groups = list(groups)
    if kind == "cycle":
        # Point i at one of its own descendants (or itself).
        j = draw(st.integers(0, n - 1))
        by_id = {g: k for k, g in enumerate(groups)}
        k = j
        while prevs[k] != -1 and k != i:
            k = by_id[prevs[k]]
        prevs[i] = groups[j] if k == i else groups[i]
    elif kind == "missing":
        prevs[i] = max(groups) + 1
    elif kind == "dupkey":
        deltas[i] = deltas[i] + [(7, 1), (7, 2)] if all(k != 7 for k, _ in deltas[i]) else deltas[i] + deltas[i][:1]
    else:
        groups.append(groups[i])
        prevs.append(-1)
        deltas.append([])
    return groups, prevs, deltas


@settings(max_examples=150, deadline=None)
@given(batches())
def test_implementations_agree_with_brute_force(case: tuple[Batch, list[bool]]) -> None:
    batch, wanted = case
    expected = brute_force(batch, wanted)
    for kind in IMPLEMENTATIONS:
        assert run(core_module("state", kind), batch, wanted) == expected, kind


@settings(max_examples=150, deadline=None)
@given(corrupt_batches())
def test_implementations_raise_the_same_corruption(batch: Batch) -> None:
    messages = set()
    for kind in IMPLEMENTATIONS:
        with pytest.raises(StateCorruptionError) as info:
            run(core_module("state", kind), batch)
        messages.add((str(info.value), info.value.groups))  # type: ignore[attr-defined]
    assert len(messages) == 1, messages


def test_large_random_forest(state: ModuleType) -> None:
    batch = random_forest(random.Random(11), 3000, keys=200, max_delta=8, root_share=0.01)
    wanted = [i % 3 != 0 for i in range(3000)]
    assert run(state, batch, wanted) == brute_force(batch, wanted)


def test_compiled_core_is_in_use() -> None:
    if not _impl.NO_EXTENSIONS:
        assert _impl.is_compiled(_impl.load("state"))
