"""A room's current state after a batch: the resolution of the states at its new
forward extremities, written to ``current_state_events`` with one
``current_state_delta_stream`` row per changed key (the ``state`` rows of the
``events`` stream)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from streamrep.db.inlists import chunks, in_list
from streamrep.events.batch import Batch
from streamrep.events.resolver import StateKey
from streamrep.events.room_state import current_state_of
from streamrep.events.state import GroupState

__all__ = ["update_current_state"]


def update_current_state(batch: Batch, room_id: str, batch_memberships: dict[str, str]) -> None:
    """Queue the room's current-state changes the batch makes (the room's forward
    extremities moved); *batch_memberships* holds the membership of the batch's
    membership events."""
    txn, out = batch.txn, batch.out
    new_state = current_state_of(txn, batch.states, batch.resolver, room_id,
                                 out.forward[room_id], out.event_groups, out.new_groups,
                                 batch.orderings)
    old_state = batch.caches.current_state.get(room_id)
    if old_state is None:
        old_state = MappingProxyType({
            (t, sk): e for t, sk, e in txn.fetchall(
                "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
                (room_id,))})
    out.current_state[room_id] = new_state
    if new_state is old_state:
        return
    candidates = _keys_changed_since(batch, old_state, room_id)
    if candidates is None:  # not a descendant of the old state: compare them whole
        candidates = set(old_state) | set(new_state)
    changed = sorted(k for k in candidates if old_state.get(k) != new_state.get(k))
    if changed:
        _write_changes(batch, room_id, changed, old_state, new_state,
                       _memberships(batch, changed, new_state, batch_memberships))


def _keys_changed_since(batch: Batch, old_state: GroupState,
                        room_id: str) -> set[StateKey] | None:
    """The keys that may differ between *old_state* and the room's new current state,
    from the deltas of the groups this batch made, or None when the new state does
    not descend from the old one through them.

    Saves comparing two whole room states (thousands of members) per batch."""
    out = batch.out
    forward = out.forward[room_id]
    if len(forward) != 1:
        return None
    group = out.event_groups.get(next(iter(forward)))
    keys: set[StateKey] = set()
    while group is not None and group in out.group_parents:
        parent, delta_keys = out.group_parents[group]
        keys.update(delta_keys)
        group = parent
    if group is None:
        return None
    cached = out.new_groups.get(group) or batch.states.group_cache.get(group)
    if cached is None or cached[0] is not old_state:
        return None
    return keys


def _memberships(batch: Batch, changed: list[StateKey], new_state: GroupState,
                 batch_memberships: dict[str, str]) -> dict[str, str]:
    """The membership of each membership event the *changed* keys now name."""
    memberships: dict[str, str] = {}
    member_ids = []
    for k in changed:
        if k[0] == "m.room.member" and k in new_state:
            event_id = new_state[k]
            if event_id in batch_memberships:
                memberships[event_id] = batch_memberships[event_id]
            else:
                member_ids.append(event_id)
    txn = batch.txn
    for chunk in chunks(member_ids):
        params: list[Any] = []
        for event_id, membership in txn.fetchall(
                "SELECT event_id, membership FROM events WHERE "
                + in_list(txn, "event_id", chunk, params), params):
            memberships[event_id] = membership
    return memberships


def _write_changes(batch: Batch, room_id: str, changed: list[StateKey], old_state: GroupState,
                   new_state: GroupState, memberships: dict[str, str]) -> None:
    out = batch.out
    # A backfill can move extremities too; its state rows still need a live position.
    stream_id = out.max_stream if out.max_stream > 0 else batch.allocator.next_live(batch.txn)
    out.max_live = max(out.max_live, stream_id)
    users = out.current_state_changes.setdefault(room_id, set())
    current_rows = []
    delta_rows = []
    writes = batch.writes
    writes.delete_rows("current_state_events", "room_id, type, state_key",
                       [(room_id, etype, state_key) for etype, state_key in changed])
    for etype, state_key in changed:
        new_id = new_state.get((etype, state_key))
        if new_id is not None:
            current_rows.append((new_id, room_id, etype, state_key, memberships.get(new_id)))
        delta_rows.append((stream_id, room_id, etype, state_key, new_id,
                           old_state.get((etype, state_key))))
        if etype == "m.room.member":
            users.add(state_key)
    writes.insert("current_state_events", "event_id, room_id, type, state_key, membership",
                  current_rows)
    writes.insert("current_state_delta_stream", "stream_id, room_id, type, state_key, event_id,"
                  " prev_event_id", delta_rows)
