"""Worker-side named caches and their invalidation from the ``caches`` stream.

A writer that changes data other processes may have cached appends a row
``[cache_name, key, invalidation_ts]`` to the ``caches`` stream. Every worker
looks the name up in its :class:`CacheRegistry` and drops that key (a JSON array
of the cached function's arguments) or, when the key is null, the whole cache.

One special name, :data:`CURRENT_STATE_CACHE_NAME` (``cs_cache_fake``), stands
for every cache that depends on a room's current state: its key is
``[room_id, user_id, ...]`` (the room and the members whose membership changed).
It invalidates the room key of every cache registered with
``depends_on_current_state=True`` and the user key of every cache registered with
``depends_on_membership=True``; a null key clears all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Protocol, Sequence, TypeVar

from streamrep.lru import Lru

__all__ = [
    "CURRENT_STATE_CACHE_NAME",
    "InvalidatableCache",
    "LruCache",
    "CacheRegistry",
]

#: The name that expands to every cache depending on a room's current state.
CURRENT_STATE_CACHE_NAME = "cs_cache_fake"

V = TypeVar("V")


class InvalidatableCache(Protocol):
    """What the registry needs from a cache."""

    def invalidate(self, key: tuple[Any, ...]) -> None: ...

    def invalidate_all(self) -> None: ...


def _freeze(value: Any) -> Hashable:
    """Turn JSON-decoded keys (lists) into hashable tuples."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value  # type: ignore[no-any-return]


class LruCache(Lru[tuple[Any, ...], V]):
    """A bounded least-recently-used cache keyed by argument tuples, which the
    registry can invalidate (:class:`streamrep.lru.Lru` with the invalidation
    protocol).

    ``get_or_compute(key, compute)`` is the usual entry point; invalidation
    drops one key or everything.
    """

    __slots__ = ("invalidations",)

    def __init__(self, name: str, max_entries: int = 10_000) -> None:
        super().__init__(name, max_entries)
        self.invalidations = 0

    def set(self, key: tuple[Any, ...], value: V) -> None:
        """Store *value* under *key*, evicting the least recently used entry if full."""
        self.put(key, value)

    def get_or_compute(self, key: tuple[Any, ...], compute: Callable[[], V]) -> V:
        """The cached value for *key*, computing and storing it on a miss."""
        if key in self:
            return self.get(key)  # type: ignore[return-value]
        value = compute()
        self.put(key, value)
        return value

    def invalidate(self, key: tuple[Any, ...]) -> None:
        self.invalidations += 1
        self.pop(key)

    def invalidate_all(self) -> None:
        self.invalidations += 1
        self.clear()


@dataclass
class _Registration:
    cache: InvalidatableCache
    depends_on_current_state: bool
    depends_on_membership: bool


class CacheRegistry:
    """The named caches of one process, invalidated by ``caches`` stream rows."""

    def __init__(self) -> None:
        self._caches: dict[str, _Registration] = {}

    def register(
        self,
        name: str,
        cache: InvalidatableCache,
        *,
        depends_on_current_state: bool = False,
        depends_on_membership: bool = False,
    ) -> None:
        """Register *cache* under *name* (the cached function's name).

        ``depends_on_current_state``: keyed by ``(room_id,)`` and stale when the
        room's current state changes. ``depends_on_membership``: keyed by
        ``(user_id,)`` and stale when that user's membership changes.
        """
        if name == CURRENT_STATE_CACHE_NAME:
            raise ValueError(f"{CURRENT_STATE_CACHE_NAME!r} is reserved")
        if name in self._caches:
            raise ValueError(f"a cache named {name!r} is already registered")
        self._caches[name] = _Registration(cache, depends_on_current_state, depends_on_membership)

    def names(self) -> list[str]:
        """Names of the registered caches."""
        return sorted(self._caches)

    def get(self, name: str) -> InvalidatableCache | None:
        reg = self._caches.get(name)
        return reg.cache if reg else None

    def invalidate(self, name: str, key: Sequence[Any] | None) -> int:
        """Invalidate *key* of cache *name* (all of it when *key* is None).

        Returns how many caches were touched: unknown names touch none (a writer may
        invalidate caches this process does not have).
        """
        if name == CURRENT_STATE_CACHE_NAME:
            return self._invalidate_current_state(key)
        reg = self._caches.get(name)
        if reg is None:
            return 0
        if key is None:
            reg.cache.invalidate_all()
        else:
            reg.cache.invalidate(tuple(_freeze(k) for k in key))
        return 1

    def _invalidate_current_state(self, key: Sequence[Any] | None) -> int:
        touched = 0
        if key is None:
            for reg in self._caches.values():
                if reg.depends_on_current_state or reg.depends_on_membership:
                    reg.cache.invalidate_all()
                    touched += 1
            return touched
        if not key:
            return 0
        room_id, members = key[0], key[1:]
        for reg in self._caches.values():
            if reg.depends_on_current_state:
                reg.cache.invalidate((room_id,))
                touched += 1
            if reg.depends_on_membership:
                for user_id in members:
                    reg.cache.invalidate((user_id,))
                touched += 1
        return touched

    def handle_row(self, row: Any) -> int:
        """Apply one ``caches`` stream row: ``[cache_name, key_or_null, ts]``.

        Rows may also be dicts with ``cache_func`` and ``keys``. Raises
        :class:`ValueError` for a row of neither shape.
        """
        if isinstance(row, dict):
            name, key = row.get("cache_func"), row.get("keys")
        elif isinstance(row, (list, tuple)) and len(row) >= 2:
            name, key = row[0], row[1]
        else:
            raise ValueError(f"not a caches stream row: {row!r}")
        if not isinstance(name, str) or not (key is None or isinstance(key, (list, tuple))):
            raise ValueError(f"not a caches stream row: {row!r}")
        return self.invalidate(name, key)

    def handle_rows(self, rows: Iterable[Any]) -> int:
        """Apply several ``caches`` rows; returns the number of caches touched."""
        return sum(self.handle_row(row) for row in rows)

    def replication_handler(
        self, then: Callable[[str, str, int, list[Any]], None] | None = None
    ) -> Callable[[str, str, int, list[Any]], None]:
        """A replication link's handler (:func:`streamrep.replication.open_link`) that applies
        ``caches`` facts to this registry, then passes every fact to *then*."""
        from streamrep.streams.builtin import CACHES

        caches_stream = CACHES.name

        def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
            if stream == caches_stream:
                self.handle_rows(rows)
            if then is not None:
                then(stream, instance, token, rows)

        return handler
