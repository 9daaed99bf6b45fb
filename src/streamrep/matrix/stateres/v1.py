"""State resolution v1 (room version 1).

1. A key is *conflicted* when two state sets map it to different events; a key
   some sets lack takes the value of the sets that have it.
2. Conflicted events are ordered by depth (deepest first), then by the SHA-1 of the
   event ID. The auth state starts as the unconflicted events for the keys the
   conflicted events may cite.
3. The power levels key is resolved first, then join rules, then memberships: from
   the shallowest candidate upwards, each candidate must pass the authorization
   rules with the previous one in place; the first that fails stops the walk and
   the one before it wins. Each resolved key joins the auth state.
4. Every other key takes the deepest candidate that passes the authorization rules
   against the auth state (the shallowest when none does).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

from streamrep.matrix import auth
from streamrep.matrix.events import (
    JOIN_RULES,
    MEMBER,
    POWER_LEVELS_KEY,
    MatrixEvent,
    StateKey,
)
from streamrep.matrix.room_versions import RoomVersion
from streamrep.matrix.stateres.common import StateMap, load_events, passes_auth
from streamrep.matrix.stateres.source import EventSource

__all__ = ["resolve_v1", "separate_v1"]


def separate_v1(state_sets: Sequence[StateMap]) -> tuple[dict[StateKey, str],
                                                         dict[StateKey, set[str]]]:
    """Unconflicted state and conflicted keys' events (v1's definition)."""
    holders: dict[StateKey, set[str]] = {}
    for state in state_sets:
        for key, event_id in state.items():
            holders.setdefault(key, set()).add(event_id)
    unconflicted = {k: next(iter(v)) for k, v in holders.items() if len(v) == 1}
    conflicted = {k: v for k, v in holders.items() if len(v) > 1}
    return unconflicted, conflicted


def _ordered(events: list[MatrixEvent]) -> list[MatrixEvent]:
    return sorted(events, key=lambda e: (-e.depth,
                                         hashlib.sha1(e.event_id.encode()).hexdigest()))


def _resolve_auth_key(candidates: list[MatrixEvent], version: RoomVersion,
                      auth_state: dict[StateKey, MatrixEvent]) -> MatrixEvent:
    keys = set().union(*(auth.auth_types_for_event(e, version) for e in candidates))
    state = {k: auth_state[k] for k in keys if k in auth_state}
    upwards = list(reversed(_ordered(candidates)))
    previous = upwards[0]
    for event in upwards[1:]:
        state[previous.key] = previous
        if not passes_auth(event, version, state):
            return previous
        previous = event
    return previous


def _resolve_normal_key(candidates: list[MatrixEvent], version: RoomVersion,
                        auth_state: dict[StateKey, MatrixEvent]) -> MatrixEvent:
    ordered = _ordered(candidates)
    for event in ordered:
        if passes_auth(event, version, auth_state):
            return event
    return ordered[-1]


def resolve_v1(room_id: str, version: RoomVersion, state_sets: Sequence[StateMap],
               source: EventSource) -> dict[StateKey, str]:
    """Resolve *state_sets* of *room_id* with v1."""
    if len(state_sets) == 1:
        return dict(state_sets[0])
    unconflicted, conflicted_ids = separate_v1(state_sets)
    events = load_events(room_id, set().union(*conflicted_ids.values()), source)
    auth_ids: dict[StateKey, str] = {}
    for ids in conflicted_ids.values():
        for eid in ids:
            if eid in events:
                for key in auth.auth_types_for_event(events[eid], version):
                    if key in unconflicted:
                        auth_ids[key] = unconflicted[key]
    auth_events = load_events(room_id, set(auth_ids.values()), source)
    auth_state = {k: auth_events[v] for k, v in auth_ids.items() if v in auth_events}
    conflicted: dict[StateKey, list[MatrixEvent]] = {}
    result = dict(unconflicted)
    for key, ids in conflicted_ids.items():
        held = [events[e] for e in ids if e in events]
        if len(held) > 1:
            conflicted[key] = held
        elif held:
            result[key] = held[0].event_id
    resolved: dict[StateKey, MatrixEvent] = {}
    if POWER_LEVELS_KEY in conflicted:
        resolved[POWER_LEVELS_KEY] = _resolve_auth_key(conflicted[POWER_LEVELS_KEY], version,
                                                       auth_state)
    auth_state.update(resolved)
    for key, candidates in sorted(conflicted.items()):
        if key[0] == JOIN_RULES:
            resolved[key] = _resolve_auth_key(candidates, version, auth_state)
    auth_state.update(resolved)
    for key, candidates in sorted(conflicted.items()):
        if key[0] == MEMBER:
            resolved[key] = _resolve_auth_key(candidates, version, auth_state)
    auth_state.update(resolved)
    for key, candidates in sorted(conflicted.items()):
        if key not in resolved:
            resolved[key] = _resolve_normal_key(candidates, version, auth_state)
    for key, event in resolved.items():
        result[key] = event.event_id
    return result
