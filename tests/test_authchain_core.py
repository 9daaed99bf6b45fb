"""The auth chain core, compiled and pure: fixed graphs, bad input, and agreement."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.impls import IMPLEMENTATIONS, core_module


def graph(impl_kind: str, edges: dict[int, list[int]]) -> Any:
    g = core_module("authchain", impl_kind).AuthGraph()
    for node, parents in edges.items():
        g.set_auth_events(node, parents)
    return g


# 0 create; 1 creator join; 2 power levels; 3 join rules; 4, 5 members; 6 ban by 1.
ROOM = {0: [], 1: [0], 2: [0, 1], 3: [0, 1, 2], 4: [0, 2, 3], 5: [0, 2, 3], 6: [0, 1, 2, 5]}


def test_the_compiled_core_loaded() -> None:
    if "compiled" in IMPLEMENTATIONS:
        assert type(core_module("authchain", "compiled").AuthGraph()).__module__ == \
            "streamrep._core.authchain"


def test_auth_chain(impl_kind: str) -> None:
    g = graph(impl_kind, ROOM)
    assert g.auth_chain([6]) == array("q", [0, 1, 2, 3, 5])
    assert g.auth_chain([4, 5]) == array("q", [0, 1, 2, 3])
    assert g.auth_chain([0]) == array("q")
    assert g.auth_chain([]) == array("q")
    assert g.auth_events(6) == array("q", [0, 1, 2, 5])
    assert g.node_count == 7


def test_auth_chain_difference(impl_kind: str) -> None:
    g = graph(impl_kind, ROOM)
    # {4} vs {6}: full chains {0,1,2,3,4} and {0,1,2,3,5,6}.
    assert g.auth_chain_difference([[4], [6]]) == array("q", [4, 5, 6])
    assert g.auth_chain_difference([[4, 6], [6, 4]]) == array("q")
    assert g.auth_chain_difference([[4], [5], [6]]) == array("q", [4, 5, 6])
    assert g.auth_chain_difference([[4]]) == array("q")
    assert g.auth_chain_difference([]) == array("q")


def test_common_events_count_as_in_every_set(impl_kind: str) -> None:
    g = graph(impl_kind, ROOM)
    for sets, common in (([[4], [6]], [5]), ([[6], []], [4]), ([[3], [1]], [2, 9])):
        assert g.auth_chain_difference(sets, common) == g.auth_chain_difference(
            [s + common for s in sets])
    # Everything reachable from the common events is in no difference.
    assert g.auth_chain_difference([[4], [6]], [6]) == array("q", [4])


def test_conflicted_subgraph(impl_kind: str) -> None:
    g = graph(impl_kind, ROOM)
    # Paths from 6 down to 2: 6 -> 2, 6 -> 5 -> 2, 6 -> 5 -> 3 -> 2.
    assert g.conflicted_subgraph([2, 6]) == array("q", [2, 3, 5, 6])
    assert g.conflicted_subgraph([1, 4]) == array("q", [1, 2, 3, 4])
    assert g.conflicted_subgraph([4]) == array("q", [4])


def test_events_never_described(impl_kind: str) -> None:
    g = graph(impl_kind, {1: [0]})
    assert g.auth_chain_difference([[1], [9]]) == array("q", [0, 1, 9])
    assert g.auth_chain([9]) == array("q")
    assert g.conflicted_subgraph([9, 1]) == array("q", [1, 9])


def test_replacing_auth_events(impl_kind: str) -> None:
    g = graph(impl_kind, {2: [0], 1: [0]})
    g.set_auth_events(2, [1])
    assert g.auth_chain([2]) == array("q", [0, 1])


def test_in_chain_of(impl_kind: str) -> None:
    g = graph(impl_kind, ROOM)
    # The full auth chain of 6: 6, its auth events 0, 1, 2, 5, and 5's 3.
    assert g.in_chain_of(range(7), {6}.__contains__, 100) == array("q", [0, 1, 2, 3, 5, 6])
    assert g.in_chain_of([4, 6], {4}.__contains__, 100) == array("q", [4])
    assert g.in_chain_of([0, 3], set().__contains__, 100) == array("q")
    # An event beyond the graph is asked about itself.
    assert g.in_chain_of([9, 0], {9}.__contains__, 100) == array("q", [9])
    assert g.in_chain_of([], {6}.__contains__, 0) == array("q")


def test_in_chain_of_asks_each_event_once_and_stops_at_its_limit(impl_kind: str) -> None:
    g = graph(impl_kind, ROOM)
    asked: list[int] = []

    def accepts(node: int) -> bool:
        asked.append(node)
        return node == 6

    assert g.in_chain_of(range(7), accepts, 7) == array("q", [0, 1, 2, 3, 5, 6])
    assert len(asked) == len(set(asked)) <= 7
    asked.clear()
    # Nothing is accepted: every event of the room is asked about before the answer.
    assert g.in_chain_of([0], set().__contains__, 7) == array("q")
    assert g.in_chain_of([0], set().__contains__, 6) is None


def test_in_chain_of_walks_only_to_state_events_citing_an_event(impl_kind: str) -> None:
    g = graph(impl_kind, ROOM)
    g.set_auth_events(7, [4], state=False)  # a message: nothing may cite it
    assert g.auth_chain([7]) == array("q", [0, 1, 2, 3, 4])
    assert g.in_chain_of([4], {7}.__contains__, 100) == array("q")
    g.set_auth_events(8, [4])
    assert g.in_chain_of([4], {8}.__contains__, 100) == array("q", [4])


def test_in_chain_of_follows_auth_events_as_now_recorded(impl_kind: str) -> None:
    g = graph(impl_kind, {1: [], 2: [0]})
    assert g.in_chain_of([0], {2}.__contains__, 100) == array("q", [0])
    g.set_auth_events(2, [1])
    assert g.in_chain_of([0], {2}.__contains__, 100) == array("q")
    assert g.in_chain_of([1], {2}.__contains__, 100) == array("q", [1])


def test_in_chain_of_ends_on_a_cycle(impl_kind: str) -> None:
    g = graph(impl_kind, {1: [2], 2: [1], 3: [2]})
    assert g.in_chain_of([1, 2], {3}.__contains__, 100) == array("q", [1, 2])
    assert g.in_chain_of([1, 2], set().__contains__, 100) == array("q")


def test_held_by_takes_the_events_a_state_maps_their_key_to(impl_kind: str) -> None:
    mod = core_module("authchain", impl_kind)
    ids = ["$create", "$join", "$pl", "$jr", "$a", "$b", "$ban", "$msg"]
    keys = [("c", ""), ("m", "@1"), ("pl", ""), ("jr", ""), ("m", "@a"), ("m", "@b"),
            ("m", "@b"), None]
    # 5 was banned (6); 7 is a message, asked of the fallback by its ID.
    state = {("c", ""): "$create", ("pl", ""): "$pl", ("m", "@a"): "$" + "a",
             ("m", "@b"): "$ban", ("jr", ""): "$jr"}
    asked: list[object] = []

    def otherwise(event_id: object) -> bool:
        asked.append(event_id)
        return event_id == "$msg"

    held = mod.HeldBy(ids, keys[:-1], state, {("jr", "")}, otherwise)
    assert [held(n) for n in range(8)] == [True, False, True, False, True, False, True, True]
    assert asked == ["$msg"]  # numbered past the keys: no key known
    g = graph(impl_kind, ROOM)
    # 6 (the ban, held) cites 5; 3 (hidden) is reached through 4 and 5.
    assert g.in_chain_of(range(7), held, 100) == array("q", [0, 1, 2, 3, 4, 5, 6])
    g2 = graph(impl_kind, {0: [], 1: [0], 3: [1]})
    alone = mod.HeldBy(ids, keys, {("jr", ""): "$jr"}, {("jr", "")}, otherwise)
    assert g2.in_chain_of([1], alone, 100) == array("q")


@pytest.mark.parametrize("bad", [-1, 2**31, 2**40])
def test_rejects_numbers_out_of_range(impl_kind: str, bad: int) -> None:
    g = graph(impl_kind, {})
    with pytest.raises(ValueError, match="outside"):
        g.set_auth_events(bad, [])
    with pytest.raises(ValueError, match="outside"):
        g.set_auth_events(0, [bad])
    with pytest.raises(ValueError, match="outside"):
        g.auth_chain_difference([[0], [bad]])


dags = st.integers(1, 40).flatmap(lambda n: st.lists(
    st.lists(st.integers(0, n - 1), max_size=4), min_size=n, max_size=n))


@pytest.mark.compiled_vs_pure
@settings(max_examples=150, deadline=None)
@given(dags, st.lists(st.lists(st.integers(0, 45), max_size=5), max_size=5),
       st.lists(st.integers(0, 45), max_size=6))
def test_compiled_and_pure_agree(parents: list[list[int]], sets: list[list[int]],
                                 roots: list[int]) -> None:
    # Keep it a DAG: an event's auth events come before it.
    edges = {i: [p for p in ps if p < i] for i, ps in enumerate(parents)}
    c, p = graph("compiled", edges), graph("pure", edges)
    assert c.node_count == p.node_count
    assert c.auth_chain(roots) == p.auth_chain(roots)
    assert c.auth_chain_difference(sets) == p.auth_chain_difference(sets)
    assert c.auth_chain_difference(sets, roots) == p.auth_chain_difference(sets, roots)
    assert c.conflicted_subgraph(roots) == p.conflicted_subgraph(roots)


@pytest.mark.compiled_vs_pure
@settings(max_examples=150, deadline=None)
@given(dags, st.lists(st.lists(st.integers(0, 45), max_size=5), min_size=2, max_size=4),
       st.lists(st.integers(0, 45), max_size=12), st.integers(0, 60))
def test_in_chain_of_leaves_the_difference_of_the_sets_with_common_events(
        parents: list[list[int]], sets: list[list[int]], common: list[int],
        limit: int) -> None:
    edges = {i: [p for p in ps if p < i] for i, ps in enumerate(parents)}
    c, p = graph("compiled", edges), graph("pure", edges)
    # Common events belong to no set of their own (an event has one key).
    sets = [[n for n in s if n not in common] for s in sets]
    alone = c.auth_chain_difference(sets)
    assert alone == p.auth_chain_difference(sets)
    inside = set(common).__contains__
    found = c.in_chain_of(alone, inside, limit)
    assert found == p.in_chain_of(alone, inside, limit)
    # The same common events, as a state that maps their keys to them.
    ids = [f"${n}" for n in range(46)]
    keys = [("k", str(n)) if n % 5 else None for n in range(46)]
    state = {("k", str(n)): f"${n}" for n in common if n % 5}
    unkeyed = {f"${n}" for n in common if not n % 5}.__contains__
    for mod, g in (("compiled", c), ("pure", p)):
        held = core_module("authchain", mod).HeldBy(ids, keys, state, (), unkeyed)
        assert g.in_chain_of(alone, held, limit) == found
    whole = c.in_chain_of(alone, inside, 10_000)
    assert whole is not None
    assert found is None or found == whole
    assert array("q", sorted(set(alone) - set(whole))) == c.auth_chain_difference(sets, common)
