"""The state a batch's events lead to: each event's state group and history
visibility, and the room's current state.

:class:`RoomStateAssigner` walks one room's share of a batch in topological order.
An event that changes nothing shares the group before it; a state event makes a
new group, stored as a delta over the prev group that needs the smallest one (a
full snapshot once the chain would exceed ``max_delta_hops``). Where prev events
disagree, the store's :class:`~streamrep.events.resolver.StateResolver` decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.events.batch import Batch
from streamrep.events.resolver import StateKey, StateResolver, conflicted_ids
from streamrep.events.state import (EMPTY_STATE, GroupState, StateGroupStore, StateOverlay,
                                    mutable_copy, settled, whole)
from streamrep.events.validation import EventRecord
from streamrep.events.visibility import DEFAULT_VISIBILITY, more_permissive
from streamrep.events.writes import Writes

__all__ = ["GroupRows", "HISTORY_VISIBILITY_KEY", "RoomStateAssigner", "current_state_of",
           "resolve_states"]

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
else:
    _batchrows = _impl.load("batchrows")

HISTORY_VISIBILITY_KEY: StateKey = ("m.room.history_visibility", "")

#: event_id -> (topological ordering, stream ordering), filled as conflicts need them
Orderings = dict[str, tuple[int, int]]


@dataclass
class GroupRows:
    """The rows a batch adds to the four state-group tables."""

    groups: list[tuple[int, str, str]] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    state: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    event_groups: list[tuple[str, int]] = field(default_factory=list)

    def queue(self, writes: Writes) -> None:
        """Queue the rows' inserts on *writes*."""
        writes.insert("state_groups", "id, room_id, event_id", self.groups)
        writes.insert("state_group_edges", "state_group, prev_state_group", self.edges)
        writes.insert("state_groups_state", "state_group, room_id, type, state_key, event_id",
                      self.state)
        writes.insert("event_to_state_groups", "event_id, state_group", self.event_groups)


class RoomStateAssigner:
    """Gives each non-outlier event of one room's share of a batch the group of the
    state after it (in ``out.event_groups``, new groups in ``out.new_groups``, rows
    in *rows*) and works out each event's history visibility."""

    def __init__(self, batch: Batch, room_id: str, rows: GroupRows) -> None:
        self.txn = batch.txn
        self.room_id = room_id
        self.states = batch.states
        self.resolver = batch.resolver
        self.orderings = batch.orderings
        self.visibility_cache = batch.caches.visibility
        self.out = batch.out
        self.rows = rows
        #: event -> its history visibility
        self.visibility: dict[str, str] = {}
        # Groups of the prev events stored before this batch.
        self._outside_groups: dict[str, int] = {}
        # Setting per m.room.history_visibility event, looked up once a batch.
        self._setting_of: dict[str, str] = {}
        # Visibility at each group already met (the state a group holds never
        # changes), so the run of messages after a state event costs a lookup each.
        self._visibility_at_group: dict[int, str] = {}

    def assign(self, records: list[EventRecord]) -> dict[str, str]:
        """Assign the groups of *records* (in topological order); return each
        non-outlier event's history visibility."""
        non_outliers = [r for r in records if not r.outlier]
        if not non_outliers:
            return self.visibility
        batch_ids = {r.event_id for r in non_outliers}
        outside = sorted({p for r in non_outliers for p in r.prev_events if p not in batch_ids})
        if outside:
            self._outside_groups = self.states.groups_for_events(self.txn, outside)
        # The usual event shares its prev event's group (batchrows.share_groups); the
        # others take the general case, which also learns the visibility at the groups
        # they read, so the run of messages after a state event is usual again.
        share_groups = _batchrows.share_groups
        event_groups = self.out.event_groups
        i, count = 0, len(non_outliers)
        while True:
            i = share_groups(non_outliers, i, event_groups, self._outside_groups,
                             self._visibility_at_group, self.visibility, self.rows.event_groups)
            if i == count:
                return self.visibility
            self._assign_one(non_outliers[i])
            i += 1

    def _assign_one(self, record: EventRecord) -> None:
        """The general case: find the state before *record*, and share its group or
        make a new one."""
        prev_groups = self._prev_groups(record.prev_events)
        before, base_group = self._state_before(prev_groups)
        changes_state = record.is_state and not record.rejected
        key: StateKey = (record.type, record.state_key or "")
        if changes_state and record.membership is not None:
            replaced = before.get(key)
            if replaced is not None:
                self.out.replaces_state[record.event_id] = replaced
        setting = self._visibility_in(before)
        if base_group is not None and base_group not in self._visibility_at_group:
            self._visibility_at_group[base_group] = setting
        if changes_state and key == HISTORY_VISIBILITY_KEY:
            setting = more_permissive(setting, self.out.visibility_values[record.event_id])
        self.visibility[record.event_id] = setting

        if base_group is not None and (not changes_state or before.get(key) == record.event_id):
            self.out.event_groups[record.event_id] = base_group
            self.rows.event_groups.append((record.event_id, base_group))
            return
        after: GroupState
        if len(prev_groups) == 1 and changes_state:
            after = StateOverlay.over(before, key, record.event_id)
        else:
            full = mutable_copy(before)
            if changes_state:
                full[key] = record.event_id
            after = MappingProxyType(full)
        one_new_key = (key, record.event_id) if len(prev_groups) == 1 and changes_state else None
        self._new_group(record.event_id, after, prev_groups, one_new_key)

    def _group_state(self, group: int) -> tuple[GroupState, int]:
        return self.out.new_groups.get(group) or self.states.load(self.txn, group)

    def _prev_groups(self, prev_events: list[str]) -> list[int]:
        """The distinct groups of *prev_events*, in their order."""
        prev_groups: list[int] = []
        for p in prev_events:
            g = self.out.event_groups.get(p)
            if g is None:
                g = self._outside_groups.get(p)
            if g is not None and g not in prev_groups:
                prev_groups.append(g)
        return prev_groups

    def _state_before(self, prev_groups: list[int]) -> tuple[GroupState, int | None]:
        """The state before an event with *prev_groups*, and the group that holds it
        (None when no group does: no prev state, or a resolution none of them equals)."""
        if not prev_groups:
            return EMPTY_STATE, None
        if len(prev_groups) == 1:
            return self._group_state(prev_groups[0])[0], prev_groups[0]
        ordered = sorted(prev_groups)
        sets = [whole(self._group_state(g)[0]) for g in ordered]
        resolved = resolve_states(self.txn, self.resolver, self.room_id, sets, self.orderings)
        base_group = next((g for g, s in zip(ordered, sets) if s == resolved), None)
        if base_group is None:
            return MappingProxyType(resolved), None
        return self._group_state(base_group)[0], base_group

    def _visibility_in(self, state: GroupState) -> str:
        """The history visibility *state* sets."""
        event_id = state.get(HISTORY_VISIBILITY_KEY)
        if not event_id:
            return DEFAULT_VISIBILITY
        setting = self._setting_of.get(event_id)
        if setting is None:
            setting = self.out.visibility_values.get(event_id) or \
                self.visibility_cache.get(event_id)
            if setting is None:
                setting = str(self.txn.fetchval(
                    "SELECT history_visibility FROM room_history_visibility WHERE event_id = ?",
                    (event_id,), "joined"))
                self.visibility_cache.put(event_id, setting)
            self._setting_of[event_id] = setting
        return setting

    def _new_group(self, event_id: str, after: GroupState, prev_groups: list[int],
                   one_new_key: tuple[StateKey, str] | None) -> None:
        """Store *after* as a new group for *event_id*: a delta over the prev group
        that needs the smallest one, or a snapshot."""
        group = self.states.next_group_id(self.txn)
        best = self._smallest_delta(after, prev_groups, one_new_key)
        written: GroupState | dict[StateKey, str]
        if best is None:  # a snapshot: the group's whole state is written anyway
            if type(after) is StateOverlay:
                after = after.materialize()
            written, hops = after, 0
            # Stored whole, but still its prev group's state and one key: saying so
            # spares the current state update comparing two whole room states.
            self.out.group_parents[group] = (
                (prev_groups[0], (one_new_key[0],)) if one_new_key is not None else (None, ()))
        else:
            parent, hops, written = best
            self.rows.edges.append((group, parent))
            self.out.group_parents[group] = (parent, tuple(written))
        room_id = self.room_id
        self.rows.groups.append((group, room_id, event_id))
        self.rows.state.extend((group, room_id, t, sk, e) for (t, sk), e in written.items())
        self.out.new_groups[group] = (after, hops)
        self.out.event_groups[event_id] = group
        self.rows.event_groups.append((event_id, group))
        # Known now, so the run of events after this one is the usual case from its
        # first (no query: *after* sets what its prev state or this event sets).
        self._visibility_at_group[group] = self._visibility_in(after)

    def _smallest_delta(self, after: GroupState, prev_groups: list[int],
                        one_new_key: tuple[StateKey, str] | None,
                        ) -> tuple[int, int, dict[StateKey, str]] | None:
        """``(prev group, hops, delta)`` for the prev group whose delta to *after* is
        smallest without its chain exceeding ``max_delta_hops``; None for none.

        With *one_new_key* (one prev group, whose state is *after* but that key), the
        delta is that key, found without walking the whole state."""
        max_hops = self.states.max_delta_hops
        if one_new_key is not None:
            hops = self._group_state(prev_groups[0])[1] + 1
            return (prev_groups[0], hops, dict([one_new_key])) if hops <= max_hops else None
        best: tuple[int, int, dict[StateKey, str]] | None = None
        for g in prev_groups:
            g_state, g_hops = self._group_state(g)
            g_state = whole(g_state)
            if g_hops + 1 > max_hops or any(k not in after for k in g_state):
                continue
            candidate = {k: v for k, v in after.items() if g_state.get(k) != v}
            if best is None or len(candidate) < len(best[2]):
                best = (g, g_hops + 1, candidate)
        return best


def resolve_states(txn: Transaction, resolver: StateResolver, room_id: str,
                   sets: list[GroupState], orderings: Orderings) -> dict[StateKey, str]:
    """*sets* merged by *resolver*, with the orderings of the conflicted events
    (read into *orderings* where missing)."""
    sets = [whole(s) for s in sets]
    conflicted = conflicted_ids(sets)
    wanted = [e for e in conflicted if e not in orderings]
    for chunk in chunks(wanted):
        params: list[Any] = []
        for event_id, topo, stream in txn.fetchall(
            "SELECT event_id, topological_ordering, stream_ordering FROM events"
            " WHERE " + in_list(txn, "event_id", chunk, params), params):
            orderings[event_id] = (int(topo), int(stream))
    return resolver.resolve(room_id, sets, {e: orderings[e] for e in conflicted if e in orderings})


def current_state_of(txn: Transaction, states: StateGroupStore, resolver: StateResolver,
                     room_id: str, extremities: Iterable[str],
                     known_groups: dict[str, int], known_states: dict[int, tuple[GroupState, int]],
                     orderings: Orderings) -> GroupState:
    """The room state at *extremities*, resolved where they disagree."""
    ext = sorted(extremities)
    missing = [e for e in ext if e not in known_groups]
    groups = known_groups
    if missing:
        groups = {**known_groups, **states.groups_for_events(txn, missing)}
    group_ids = sorted({groups[e] for e in ext if e in groups})
    if not group_ids:
        return EMPTY_STATE
    sets = [known_states[g][0] if g in known_states else states.load(txn, g)[0]
            for g in group_ids]
    if len(sets) == 1:
        # The room's current state, kept (and cached) as the group's state and the
        # base of the next batch's overlays: whole once its overlay has many changes.
        state = settled(sets[0])
        if state is not sets[0] and group_ids[0] in known_states:
            known_states[group_ids[0]] = (state, known_states[group_ids[0]][1])
        return state
    return MappingProxyType(resolve_states(txn, resolver, room_id, sets, orderings))
