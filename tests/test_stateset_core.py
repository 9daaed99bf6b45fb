"""The state set split core, compiled and pure: fixed cases, orders, and agreement."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.impls import IMPLEMENTATIONS, core_module

NUMBERS = {"$c": 0, "$pl": 1, "$a": 2, "$b": 3, "$b2": 4, "$t": 5}


def split(impl_kind: str, states: list[Any], numbers: Any = None) -> Any:
    return core_module("stateset", impl_kind).split_state_sets(
        states, NUMBERS if numbers is None else numbers)


def expected(states: list[dict[Any, str]], numbers: dict[str, int]) -> Any:
    """The definition, spelled out: a key differs unless every set maps it alike."""
    keys = set().union(*states) if states else set()
    differing = {k for k in keys if len({s.get(k) for s in states}) > 1}
    base = states[0] if states else {}
    kept = [v for k, v in base.items() if k not in differing]
    return (differing, array("q", [numbers[v] for v in kept if v in numbers]),
            [v for v in kept if v not in numbers])


def test_the_compiled_core_loaded() -> None:
    if "compiled" in IMPLEMENTATIONS:
        assert core_module("stateset", "compiled").__name__ == "streamrep._core.stateset"


def test_changed_added_and_missing_keys(impl_kind: str) -> None:
    base = {("c", ""): "$c", ("pl", ""): "$pl", ("m", "a"): "$a", ("m", "b"): "$b"}
    changed = {**base, ("m", "b"): "$b2"}
    assert split(impl_kind, [base, changed]) == ({("m", "b")}, array("q", [0, 1, 2]), [])
    grown = {**base, ("t", ""): "$t"}
    assert split(impl_kind, [base, grown]) == ({("t", "")}, array("q", [0, 1, 2, 3]), [])
    assert split(impl_kind, [grown, base]) == ({("t", "")}, array("q", [0, 1, 2, 3]), [])
    shrunk = {k: v for k, v in base.items() if k != ("m", "a")}
    assert split(impl_kind, [base, shrunk, base]) == ({("m", "a")}, array("q", [0, 1, 3]), [])


def test_one_set_or_the_same_set(impl_kind: str) -> None:
    base = {("c", ""): "$c", ("m", "a"): "$a"}
    assert split(impl_kind, [base]) == (set(), array("q", [0, 2]), [])
    assert split(impl_kind, [base, base, dict(base)]) == (set(), array("q", [0, 2]), [])
    assert split(impl_kind, []) == (set(), array("q"), [])


def test_another_order_and_equal_copies(impl_kind: str) -> None:
    base = {("c", ""): "$c", ("pl", ""): "$pl", ("m", "a"): "$a", ("m", "b"): "$b"}
    # Equal keys and values that are other objects, in another order.
    other = {(str("m"), "".join(["b"])): "".join(["$b", "2"]), ("m", "a"): "$" + "a",
             ("pl", ""): "$pl", ("c", ""): "$c"}
    assert split(impl_kind, [base, other]) == ({("m", "b")}, array("q", [0, 1, 2]), [])


def test_a_memo_remembers_numbers_not_events(impl_kind: str) -> None:
    mod = core_module("stateset", impl_kind)
    memo = mod.NumberMemo()
    base = {("c", ""): "$c", ("m", "a"): "$a", ("m", "b"): "$b"}
    assert mod.split_state_sets([base], NUMBERS, memo) == (set(), array("q", [0, 2, 3]), [])
    # The same positions, other events: each is looked up again.
    other = {("c", ""): "$c", ("m", "a"): "$b2", ("m", "b"): "$new"}
    assert mod.split_state_sets([other], NUMBERS, memo) == (set(), array("q", [0, 4]), ["$new"])
    assert mod.split_state_sets([base, other], NUMBERS, memo) == (
        {("m", "a"), ("m", "b")}, array("q", [0]), [])


def test_unnumbered_events_and_mappings(impl_kind: str) -> None:
    from types import MappingProxyType

    base = {("c", ""): "$c", ("x", ""): "$new", ("m", "a"): "$a"}
    assert split(impl_kind, [MappingProxyType(base), base], MappingProxyType(NUMBERS)) == (
        set(), array("q", [0, 2]), ["$new"])


def events_of(states: list[Any], differing: set[Any]) -> list[set[str]]:
    """What each set maps the differing keys to, by the definition."""
    return [{s[k] for k in differing if k in s} for s in states]


def test_differing_events_set_by_set(impl_kind: str) -> None:
    mod = core_module("stateset", impl_kind)
    base = {("c", ""): "$c", ("pl", ""): "$pl", ("m", "a"): "$a", ("m", "b"): "$b"}
    changed = {**base, ("m", "b"): "$b2"}
    grown = {**base, ("t", ""): "$t"}
    shrunk = {k: v for k, v in base.items() if k != ("m", "a")}
    assert mod.differing_events([base, changed, base]) == (
        {("m", "b")}, [{"$b"}, {"$b2"}, {"$b"}])
    # A key one set changes, another lacks, a third adds.
    assert mod.differing_events([base, shrunk, changed, grown]) == (
        {("m", "a"), ("m", "b"), ("t", "")},
        [{"$a", "$b"}, {"$b"}, {"$a", "$b2"}, {"$a", "$b", "$t"}])
    # Off the aligned walk: another order, copies of the values.
    reordered = dict(reversed(list({**changed, ("m", "a"): "$" + "a2"}.items())))
    assert mod.differing_events([base, reordered, grown]) == (
        {("m", "a"), ("m", "b"), ("t", "")},
        [{"$a", "$b"}, {"$a2", "$b2"}, {"$a", "$b", "$t"}])
    assert mod.differing_events([base]) == (set(), [set()])
    assert mod.differing_events([]) == (set(), [])


def test_differing_events_over_a_first_set_with_removed_entries(impl_kind: str) -> None:
    # A dict keeps a removed entry's slot until it is resized: the first set's
    # flagged entries are found again by their slot, not by their position.
    mod = core_module("stateset", impl_kind)
    base = {("m", f"@{n}"): f"${n}" for n in range(40)}
    for n in range(0, 40, 3):
        del base[("m", f"@{n}")]
    base[("t", "")] = "$t"
    other = dict(base)
    changed = [k for i, k in enumerate(base) if i % 5 == 1]
    for k in changed:
        other[k] = base[k] + "/2"
    lacked = [k for k in base if k not in changed][-2]  # late: the walk stays aligned
    del other[lacked]
    differing = {*changed, lacked}
    assert mod.differing_events([base, other]) == (
        differing, [{base[k] for k in differing}, {other[k] for k in changed}])
    assert mod.differing_events([other, base]) == (
        differing, [{other[k] for k in changed}, {base[k] for k in differing}])


MEMOS: dict[str, Any] = {}

keys = st.sampled_from([("c", ""), ("pl", ""), ("jr", "")] + [("m", f"@u{n}") for n in range(6)])
states = st.lists(st.dictionaries(keys, st.integers(0, 2)), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(states, st.randoms(use_true_random=False), st.booleans())
def test_agrees_with_the_definition(raw: list[dict[Any, int]], rnd: Any,
                                    shuffle: bool) -> None:
    # An event ID names one key: "$<key>/<variant>".
    sets = [{k: f"${k[0]}{k[1]}/{v}" for k, v in s.items()} for s in raw]
    if shuffle:
        sets = [dict(rnd.sample(list(s.items()), len(s))) for s in sets]
    numbers = {f"${k[0]}{k[1]}/{v}": n for n, (k, v) in enumerate(
        (k, v) for k in [("c", ""), ("pl", ""), ("jr", "")] for v in range(2))}
    want = expected(sets, numbers)
    for kind in IMPLEMENTATIONS:
        assert split(kind, sets, numbers) == want
        # Without numbers, the differing keys alone.
        assert core_module("stateset", kind).split_state_sets(sets, None) == (
            want[0], array("q"), [])
        assert core_module("stateset", kind).differing_events(sets) == (
            want[0], events_of(sets, want[0]))
        # One memo serves every split over the same numbers, whatever the sets.
        memo = MEMOS.setdefault(kind, core_module("stateset", kind).NumberMemo())
        for _ in range(2):
            assert core_module("stateset", kind).split_state_sets(sets, numbers, memo) == want
