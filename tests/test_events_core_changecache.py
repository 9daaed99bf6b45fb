"""The stream change cache core: behaviour on both implementations, compiled == pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from support.impls import IMPLEMENTATIONS, core_module


def test_answers_from_memory(impl_kind):
    mod = core_module("changecache", impl_kind)
    cache = mod.StreamChangeCache("rooms", 10)
    cache.entity_has_changed("!a", 12)
    cache.entity_has_changed("!b", 15)
    assert cache.current_position == 15
    assert cache.has_entity_changed("!a", 11)
    assert not cache.has_entity_changed("!a", 12)
    assert not cache.has_entity_changed("!c", 11)
    assert cache.has_entity_changed("!c", 9)  # older than the cache knows
    assert cache.get_entities_changed(["!a", "!b", "!c"], 12) == {"!b"}
    assert cache.get_entities_changed(["!a", "!c"], 5) == {"!a", "!c"}
    assert cache.get_all_entities_changed(10) == ["!a", "!b"]
    assert cache.get_all_entities_changed(9) is None
    assert cache.get_max_pos_of_last_change("!b") == 15
    assert cache.get_max_pos_of_last_change("!z") == 10
    cache.entity_has_changed("!a", 20)
    assert cache.get_all_entities_changed(10) == ["!b", "!a"]


def test_eviction_raises_earliest_known(impl_kind):
    mod = core_module("changecache", impl_kind)
    cache = mod.StreamChangeCache("users", 0, max_size=3)
    for pos, who in enumerate(["a", "b", "c", "d", "e"], start=1):
        cache.entity_has_changed(who, pos)
    assert len(cache) == 3
    assert cache.earliest_known_position == 2
    assert cache.has_entity_changed("a", 1)  # unknown territory: safe answer
    assert not cache.has_entity_changed("a", 2)
    assert cache.get_all_entities_changed(2) == ["c", "d", "e"]


def test_rejects_bad_size(impl_kind):
    mod = core_module("changecache", impl_kind)
    with pytest.raises(ValueError):
        mod.StreamChangeCache("x", 0, max_size=0)


ops = st.lists(
    st.tuples(st.sampled_from("abcdefg"), st.integers(-5, 400)), max_size=200)


@settings(max_examples=100, deadline=None)
@given(ops, st.integers(1, 6), st.lists(st.integers(-10, 410), min_size=1, max_size=10))
def test_compiled_and_pure_agree_and_are_safe(changes, max_size, probes):
    outs = []
    for kind in IMPLEMENTATIONS:
        mod = core_module("changecache", kind)
        cache = mod.StreamChangeCache("x", 0, max_size=max_size)
        truth: dict[str, int] = {}
        for entity, pos in changes:
            cache.entity_has_changed(entity, pos)
            if pos > 0:
                truth[entity] = max(truth.get(entity, pos), pos)
        answers = []
        for probe in probes:
            for entity in "abcdefgh":
                changed = cache.has_entity_changed(entity, probe)
                # Never claim "unchanged" when the entity did change after probe.
                if truth.get(entity, -(10**9)) > probe:
                    assert changed
                answers.append(changed)
            everything = cache.get_all_entities_changed(probe)
            if everything is not None:
                assert set(everything) == {e for e, p in truth.items() if p > probe}
            answers.append(everything)
            answers.append(sorted(cache.get_entities_changed(list("abcdefgh"), probe)))
        answers.append((cache.earliest_known_position, cache.current_position, len(cache)))
        outs.append(repr(answers))
    assert len(set(outs)) == 1
