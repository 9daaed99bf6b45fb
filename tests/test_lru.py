"""The event store's bounded LRU, by count and by weight."""

from __future__ import annotations

import pytest

from streamrep.lru import Lru


def test_evicts_least_recently_used_by_count():
    cache: Lru[str, int] = Lru("t", 2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # refreshes a
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert (cache.hits, cache.misses) == (3, 0)
    assert cache.get("b") is None and cache.misses == 1


def test_evicts_by_weight_but_keeps_the_newest():
    cache: Lru[str, list[int]] = Lru("t", 100, max_weight=5, weigh=len)
    cache.put("a", [1, 2])
    cache.put("b", [1, 2])
    assert cache.weight == 4
    cache.put("c", [1, 2])
    assert "a" not in cache and cache.weight == 4
    cache.put("huge", list(range(10)))  # alone over the bound, still cached
    assert len(cache) == 1 and cache.weight == 10
    cache.pop("huge")
    assert cache.weight == 0
    cache.put("x", [1])
    cache.put("x", [1, 2, 3])
    assert cache.weight == 3
    cache.clear()
    assert cache.weight == 0 and len(cache) == 0


def test_rejects_bad_size():
    with pytest.raises(ValueError):
        Lru("t", 0)


def test_put_many_and_pop_many_match_one_at_a_time():
    for weigh in (None, len):
        one: Lru[str, list[int]] = Lru("one", 3, max_weight=6 if weigh else None, weigh=weigh)
        many: Lru[str, list[int]] = Lru("many", 3, max_weight=6 if weigh else None, weigh=weigh)
        for cache in (one, many):
            cache.put("a", [1])
            cache.put("b", [1, 2])
        items = [("c", [1]), ("a", [1, 2]), ("d", [1]), ("e", [1, 2])]
        for key, value in items:
            one.put(key, value)
        many.put_many(items)
        assert list(one._data.items()) == list(many._data.items())
        assert one.weight == many.weight
        for key in ("a", "e", "zz"):
            one.pop(key)
        many.pop_many(["a", "e", "zz"])
        assert list(one._data.items()) == list(many._data.items())
        assert one.weight == many.weight


@pytest.mark.parametrize("overlapping", [False, True])
def test_put_many_of_a_mapping_matches_one_at_a_time(overlapping):
    """A mapping's items go in in its order, whether or not some keys are cached
    already (then each of those moves to its place in the mapping's order)."""
    for weigh in (None, len):
        one: Lru[str, list[int]] = Lru("one", 4, max_weight=9 if weigh else None, weigh=weigh)
        many: Lru[str, list[int]] = Lru("many", 4, max_weight=9 if weigh else None, weigh=weigh)
        for cache in (one, many):
            cache.put("a", [1])
            cache.put("b", [1, 2])
        new = {"c": [1], "a": [1, 2, 3], "d": [1]} if overlapping else {"c": [1], "d": [2]}
        for key, value in new.items():
            one.put(key, value)
        many.put_many(new)
        assert list(one._data.items()) == list(many._data.items())
        assert one.weight == many.weight
        many.pop_many({"x", "y"})  # none cached
        many.pop_many(["zz"])
        assert list(one._data.items()) == list(many._data.items())
        one.pop("c")
        many.pop_many({"c", "x"})
        assert list(one._data.items()) == list(many._data.items())
        assert one.weight == many.weight
