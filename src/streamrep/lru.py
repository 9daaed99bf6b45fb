"""The one bounded least-recently-used mapping: the event store's caches and the
worker-side named caches (:class:`streamrep.caches.LruCache`) are built on it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Callable, Generic, Hashable, Iterable, TypeVar

__all__ = ["Lru"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """Bounded mapping; ``get`` refreshes an entry, ``put`` evicts the oldest.

    With ``weigh``, the bound is on the total weight of the values (e.g. the number
    of keys of cached states) as well as on the number of entries.
    """

    __slots__ = ("name", "max_entries", "max_weight", "_weigh", "_weight", "_data", "hits",
                 "misses")

    def __init__(self, name: str, max_entries: int, max_weight: int | None = None,
                 weigh: Callable[[V], int] | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.name = name
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh if max_weight is not None else None
        self._weight = 0
        self._data: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def weight(self) -> int:
        """Total weight of the cached values (0 without ``weigh``)."""
        return self._weight

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: K) -> bool:
        return key in self._data

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of *key* (now the most recently used), or *default*."""
        data = self._data
        try:
            value = data[key]
        except KeyError:
            self.misses += 1
            return default
        data.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: K, value: V) -> None:
        """Store *value* under *key*, evicting the least recently used entries
        beyond the bounds."""
        data = self._data
        weigh = self._weigh
        if weigh is not None:
            old = data.get(key)
            if old is not None:
                self._weight -= weigh(old)
            self._weight += weigh(value)
        data[key] = value
        data.move_to_end(key)
        while len(data) > self.max_entries or (
                weigh is not None and self.max_weight is not None
                and self._weight > self.max_weight and len(data) > 1):
            _, evicted = data.popitem(last=False)
            if weigh is not None:
                self._weight -= weigh(evicted)

    def put_many(self, items: Iterable[tuple[K, V]] | Mapping[K, V]) -> None:
        """``put`` each ``(key, value)`` in turn (one eviction pass at the end); a
        mapping puts its items in its order, with one ``update`` (and, when some keys
        were cached already, a pass moving its keys to the recent end)."""
        if self._weigh is not None:
            for key, value in (items.items() if isinstance(items, Mapping) else items):
                self.put(key, value)
            return
        data = self._data
        if type(items) is dict or isinstance(items, Mapping):
            before = len(data)
            data.update(items)
            if len(data) - before != len(items):
                # Some were cached: ``update`` left them where they were.
                move_to_end = data.move_to_end
                for key in items:
                    move_to_end(key)
        else:
            move_to_end = data.move_to_end
            for key, value in (items.items() if isinstance(items, Mapping) else items):
                data[key] = value
                move_to_end(key)
        excess = len(data) - self.max_entries
        for _ in range(excess):
            data.popitem(last=False)

    def pop_many(self, keys: Iterable[K]) -> None:
        """``pop`` each of *keys* (a collection none of whose keys is cached costs
        one ``isdisjoint``)."""
        data = self._data
        if isinstance(keys, Collection) and data.keys().isdisjoint(keys):
            return
        if self._weigh is not None:
            for key in keys:
                self.pop(key)
            return
        pop = data.pop
        for key in keys:
            pop(key, None)

    def pop(self, key: K) -> None:
        """Drop *key* if present."""
        value = self._data.pop(key, None)
        if value is not None and self._weigh is not None:
            self._weight -= self._weigh(value)

    def clear(self) -> None:
        """Drop every entry."""
        self._data.clear()
        self._weight = 0
