"""Cache invalidation from ``caches`` stream rows on a worker."""

from __future__ import annotations

import pytest

from streamrep.caches import CURRENT_STATE_CACHE_NAME, CacheRegistry, LruCache


def _registry() -> tuple[CacheRegistry, dict[str, LruCache[str]]]:
    caches = {
        "get_user_by_id": LruCache[str]("get_user_by_id"),
        "get_current_state_ids": LruCache[str]("get_current_state_ids"),
        "get_rooms_for_user": LruCache[str]("get_rooms_for_user"),
    }
    reg = CacheRegistry()
    reg.register("get_user_by_id", caches["get_user_by_id"])
    reg.register("get_current_state_ids", caches["get_current_state_ids"], depends_on_current_state=True)
    reg.register("get_rooms_for_user", caches["get_rooms_for_user"], depends_on_membership=True)
    caches["get_user_by_id"].set(("@bob:x",), "bob")
    caches["get_user_by_id"].set(("@amy:x",), "amy")
    caches["get_current_state_ids"].set(("!r:x",), "state r")
    caches["get_current_state_ids"].set(("!s:x",), "state s")
    caches["get_rooms_for_user"].set(("@bob:x",), "rooms of bob")
    caches["get_rooms_for_user"].set(("@amy:x",), "rooms of amy")
    return reg, caches


def test_row_invalidates_one_key() -> None:
    reg, caches = _registry()
    assert reg.handle_row(["get_user_by_id", ["@bob:x"], 1550574873251]) == 1
    assert ("@bob:x",) not in caches["get_user_by_id"]
    assert caches["get_user_by_id"].get(("@amy:x",)) == "amy"


def test_null_key_invalidates_whole_cache() -> None:
    reg, caches = _registry()
    reg.handle_row(["get_user_by_id", None, 1550574873252])
    assert len(caches["get_user_by_id"]) == 0
    assert len(caches["get_rooms_for_user"]) == 2


def test_current_state_name_expands_to_state_caches() -> None:
    reg, caches = _registry()
    assert reg.handle_row([CURRENT_STATE_CACHE_NAME, ["!r:x", "@bob:x"], 1]) == 2
    assert ("!r:x",) not in caches["get_current_state_ids"]
    assert caches["get_current_state_ids"].get(("!s:x",)) == "state s"
    assert ("@bob:x",) not in caches["get_rooms_for_user"]
    assert caches["get_rooms_for_user"].get(("@amy:x",)) == "rooms of amy"
    assert caches["get_user_by_id"].get(("@bob:x",)) == "bob"
    reg.handle_row([CURRENT_STATE_CACHE_NAME, None, 2])
    assert len(caches["get_current_state_ids"]) == 0 and len(caches["get_rooms_for_user"]) == 0
    assert len(caches["get_user_by_id"]) == 2


def test_unknown_cache_touches_nothing_and_bad_rows_are_refused() -> None:
    reg, _caches = _registry()
    assert reg.handle_row(["not_here", ["k"], 1]) == 0
    assert reg.handle_row({"cache_func": "get_user_by_id", "keys": ["@bob:x"]}) == 1
    for bad in (["only-name"], [1, ["k"], 0], ["get_user_by_id", "not-a-list", 0], "junk"):
        with pytest.raises(ValueError):
            reg.handle_row(bad)
    with pytest.raises(ValueError):
        reg.register(CURRENT_STATE_CACHE_NAME, LruCache[str]("x"))
    with pytest.raises(ValueError):
        reg.register("get_user_by_id", LruCache[str]("dup"))


def test_lru_cache_evicts_least_recently_used() -> None:
    cache = LruCache[int]("c", max_entries=2)
    cache.set(("a",), 1)
    cache.set(("b",), 2)
    assert cache.get(("a",)) == 1
    cache.set(("c",), 3)
    assert ("b",) not in cache and ("a",) in cache and ("c",) in cache
    assert cache.get_or_compute(("d",), lambda: 4) == 4 and len(cache) == 2


def test_replication_handler_invalidates_then_passes_facts_on() -> None:
    reg, caches = _registry()
    seen: list[tuple[str, int]] = []
    handler = reg.replication_handler(lambda stream, instance, token, rows: seen.append((stream, token)))
    handler("caches", "main", 7, [["get_user_by_id", ["@bob:x"], 1], ["get_user_by_id", ["@amy:x"], 1]])
    handler("events", "main", 8, [["$e", "!r", "m", None, None]])
    assert len(caches["get_user_by_id"]) == 0
    assert seen == [("caches", 7), ("events", 8)]
