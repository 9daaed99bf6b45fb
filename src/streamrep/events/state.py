"""State groups: storing the state after each event as deltas, and reading it back.

Every non-outlier event points (``event_to_state_groups``) at the group holding
the room state after it. A group stores only the keys it changes over its prev
group (``state_group_edges``); after ``max_delta_hops`` hops a group is stored
as a full snapshot instead, which bounds the work of reading any group.
Full states are rebuilt by the ``state`` core's ``expand_groups`` and kept in
an in-memory LRU.
"""

from __future__ import annotations

from array import array
from math import isqrt
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.errors import StateCorruptionError
from streamrep.lru import Lru
from streamrep.events.resolver import StateKey

if TYPE_CHECKING:
    from streamrep._pure import state as _core_state
else:
    _core_state = _impl.load("state")

__all__ = ["GroupState", "StateGroupStore", "StateOverlay", "EMPTY_STATE", "mutable_copy",
           "settled", "whole"]

#: A full state, read-only: ``{(type, state_key): event_id}``.
GroupState = Mapping[StateKey, str]
EMPTY_STATE: GroupState = MappingProxyType({})


def mutable_copy(state: GroupState) -> dict[StateKey, str]:
    """A new dict holding *state*.

    ``MappingProxyType.copy()`` copies the dict behind it in one block, where
    ``dict(proxy)`` goes key by key through the mapping protocol: 20 times slower
    for a room of a thousand members."""
    if type(state) is MappingProxyType or type(state) is dict:
        return state.copy()
    if type(state) is StateOverlay:
        full = mutable_copy(state.base)
        full.update(state.changes)
        return full
    return dict(state)


class StateOverlay(Mapping[StateKey, str]):
    """The state of a group made by the batch being persisted: the batch's changes
    over the full state of a group from before it.

    A state event then costs a copy of its batch's few changes, not of the room's
    whole state (thousands of members); only the groups whose full state is
    wanted (the room's new current state) are made whole, once a batch, with
    :meth:`materialize`. Keys are never removed, so a change shadows the base.
    """

    __slots__ = ("base", "changes", "_size")

    def __init__(self, base: GroupState, changes: dict[StateKey, str], size: int) -> None:
        self.base = base
        self.changes = changes
        self._size = size

    @classmethod
    def over(cls, state: GroupState, key: StateKey, event_id: str) -> "StateOverlay":
        """*state* with *key* set to *event_id*."""
        size = len(state) + (key not in state)
        if type(state) is StateOverlay:
            changes = state.changes.copy()
            changes[key] = event_id
            return cls(state.base, changes, size)
        return cls(state, {key: event_id}, size)

    def materialize(self) -> GroupState:
        """The whole state, as a read-only mapping of its own."""
        return MappingProxyType(mutable_copy(self))

    def __getitem__(self, key: StateKey) -> str:
        value = self.changes.get(key)
        return self.base[key] if value is None else value

    def get(self, key: StateKey, default: str | None = None) -> str | None:  # type: ignore[override]
        value = self.changes.get(key)
        return self.base.get(key, default) if value is None else value

    def __contains__(self, key: object) -> bool:
        return key in self.changes or key in self.base

    def __iter__(self) -> Iterator[StateKey]:
        yield from self.base
        changes = self.changes
        base = self.base
        yield from (key for key in changes if key not in base)

    def __len__(self) -> int:
        return self._size


def _overlay_limit(base_size: int) -> int:
    """The most changes a room's current state keeps as an overlay over a base of
    *base_size* keys: the square root of the size (at least 32), so that each state
    event copies at most that many changes and making the state whole, once per
    that many changes, costs about as much per change."""
    return max(32, isqrt(base_size))


def settled(state: GroupState) -> GroupState:
    """*state* as a room's current state is kept from one batch to the next: an
    overlay with few changes over its base stays one (the next batch's state events
    add to those changes), a larger one is made whole. A room of thousands of
    members then costs a batch its changes, not a copy of the whole state."""
    if type(state) is StateOverlay and len(state.changes) > _overlay_limit(len(state.base)):
        return state.materialize()
    return state


def whole(state: GroupState) -> GroupState:
    """*state*, an overlay made whole (for work that reads every key: resolving
    states, comparing them, which go faster over a mapping of its own)."""
    return state.materialize() if type(state) is StateOverlay else state


# Longest chain walked before the tables are declared corrupt (a cycle).
_MAX_CHAIN = 100_000


class StateGroupStore:
    """Reads, caches and writes state groups (one per process, single writer)."""

    def __init__(self, max_delta_hops: int = 100, cache_size: int = 20_000,
                 max_cached_state_entries: int = 5_000_000) -> None:
        if max_delta_hops < 1:
            raise ValueError("max_delta_hops must be at least 1")
        self.max_delta_hops = max_delta_hops
        # group -> (full state, hops from the snapshot it is stored over); bounded by
        # the total number of state entries too, as large rooms have large states.
        self.group_cache: Lru[int, tuple[GroupState, int]] = Lru(
            "state_group", cache_size, max_cached_state_entries, lambda v: len(v[0]) + 1)
        self.event_group_cache: Lru[str, int] = Lru("event_to_state_group", cache_size * 5)
        self._next_group: int | None = None

    def clear(self) -> None:
        """Forget every cached group and event mapping."""
        self.group_cache.clear()
        self.event_group_cache.clear()

    # -- reading --------------------------------------------------------------------

    def groups_for_events(self, txn: Transaction, event_ids: Iterable[str]) -> dict[str, int]:
        """The state group of each of *event_ids* that has one."""
        out: dict[str, int] = {}
        missing: list[str] = []
        for event_id in event_ids:
            group = self.event_group_cache.get(event_id)
            if group is None:
                missing.append(event_id)
            else:
                out[event_id] = group
        for chunk in chunks(missing):
            event_params: list[object] = []
            for event_id, group in txn.fetchall(
                "SELECT event_id, state_group FROM event_to_state_groups WHERE "
                + in_list(txn, "event_id", chunk, event_params), event_params):
                out[event_id] = int(group)
                self.event_group_cache.put(event_id, int(group))
        return out

    def load(self, txn: Transaction, group: int) -> tuple[GroupState, int]:
        """The full state of *group* and its hop count; raises
        :class:`StateCorruptionError` when the tables cannot describe it."""
        cached = self.group_cache.get(group)
        if cached is not None:
            return cached
        # The whole chain in one query (recursive CTE), then cut at the first group
        # whose state is cached. A cycle shows up as a repeated group.
        walked = [int(g) for (g,) in txn.fetchall(
            "WITH RECURSIVE chain(sg, hop) AS (SELECT CAST(? AS BIGINT), 0 UNION ALL"
            " SELECT e.prev_state_group, chain.hop + 1 FROM state_group_edges e"
            " JOIN chain ON e.state_group = chain.sg WHERE chain.hop < ?)"
            " SELECT sg FROM chain ORDER BY hop", (group, _MAX_CHAIN))]
        chain: list[int] = []
        parents: list[int] = []
        seen: set[int] = set()
        for g in walked:
            if g in seen:
                raise StateCorruptionError(f"state group chain of {group} has a cycle at {g}")
            seen.add(g)
            if chain:
                parents.append(g)
            chain.append(g)
            if len(chain) > 1 and g in self.group_cache:
                break
        else:
            parents.append(-1)
        # Rows of every group on the chain whose state is not cached.
        base_state: GroupState | None = None
        base_hops = 0
        if parents[-1] != -1:
            base_state, base_hops = self.group_cache.get(chain[-1]) or (EMPTY_STATE, 0)
            chain_to_read = chain[:-1]
        else:
            chain_to_read = chain
        rows: dict[int, list[tuple[str, str, str]]] = {g: [] for g in chain_to_read}
        for group_chunk in chunks(chain_to_read):
            params: list[object] = []
            for sg, etype, state_key, event_id in txn.fetchall(
                "SELECT state_group, type, state_key, event_id FROM state_groups_state WHERE "
                + in_list(txn, "state_group", group_chunk, params, cast="bigint"), params):
                rows[int(sg)].append((etype, state_key, event_id))
        if parents[-1] == -1 and not txn.fetchval(
                "SELECT 1 FROM state_groups WHERE id = ?", (chain[-1],)):
            raise StateCorruptionError(f"state group {chain[-1]} is not stored")
        state = self._expand(chain_to_read, rows, base_state)
        hops = base_hops + len(chain_to_read) - (0 if parents[-1] != -1 else 1)
        result: tuple[GroupState, int] = (MappingProxyType(state), hops)
        self.group_cache.put(group, result)
        return result

    @staticmethod
    def _expand(chain: list[int], rows: dict[int, list[tuple[str, str, str]]],
                base: GroupState | None) -> dict[StateKey, str]:
        """Apply the deltas of *chain* (newest first) over *base* with the state core."""
        key_ids: dict[StateKey, int] = {}
        keys: list[StateKey] = []
        event_ids: dict[str, int] = {}
        events: list[str] = []

        def intern_key(key: StateKey) -> int:
            k = key_ids.get(key)
            if k is None:
                k = key_ids[key] = len(keys)
                keys.append(key)
            return k

        def intern_event(event_id: str) -> int:
            e = event_ids.get(event_id)
            if e is None:
                e = event_ids[event_id] = len(events)
                events.append(event_id)
            return e

        ordered = list(reversed(chain))  # root (or the cached base) first
        group_ids = array("q")
        prev_ids = array("q")
        offsets = array("q", [0])
        delta_keys = array("q")
        delta_events = array("q")
        if base is not None:
            # The cached base enters as a pseudo-root holding its full state.
            group_ids.append(-2)
            prev_ids.append(-1)
            for key, event_id in base.items():
                delta_keys.append(intern_key(key))
                delta_events.append(intern_event(event_id))
            offsets.append(len(delta_keys))
        for idx, group in enumerate(ordered):
            group_ids.append(group)
            prev_ids.append(ordered[idx - 1] if idx else (-2 if base is not None else -1))
            for etype, state_key, event_id in rows[group]:
                delta_keys.append(intern_key((etype, state_key)))
                delta_events.append(intern_event(event_id))
            offsets.append(len(delta_keys))
        wanted = bytearray(len(group_ids))
        wanted[-1] = 1
        _, out_keys, out_events = _core_state.expand_groups(
            group_ids, prev_ids, offsets, delta_keys, delta_events, wanted)
        return {keys[k]: events[e] for k, e in zip(out_keys, out_events)}

    # -- writing --------------------------------------------------------------------

    def next_group_id(self, txn: Transaction) -> int:
        """A new state group ID (this process is the only writer of state groups)."""
        if self._next_group is None:
            self._next_group = int(txn.fetchval("SELECT MAX(id) FROM state_groups", (), 0)) + 1
        group = self._next_group
        self._next_group += 1
        return group

    def reset_allocator(self) -> None:
        """Re-read the next group ID from the database (after a rolled-back write)."""
        self._next_group = None
