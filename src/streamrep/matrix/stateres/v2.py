"""State resolution v2 (room versions 2 to 11) and v2.1 (room version 12).

The algorithm, as the specification defines it:

1. Split the state sets into the *unconflicted* state (keys every set maps to the
   same event) and the *conflicted* keys (all others, including keys some set lacks).
2. The *full conflicted set* is the conflicted events plus the *auth difference*
   (events in the full auth chain of some but not all sets); v2.1 adds the
   *conflicted state subgraph* (events on an auth path between two conflicted events).
3. *Power events* of the full conflicted set (power levels, join rules, create, and
   kicks/bans of another user), together with the full conflicted set's events in
   their auth chains, are put in *reverse topological power ordering*: Kahn's
   algorithm over auth edges, ties broken by the sender's power level (higher
   first), then ``origin_server_ts``, then event ID.
4. *Iterative auth checks* apply them in that order to a partial state: the
   unconflicted state in v2, the empty state in v2.1. An event goes in when it
   passes the authorization rules against its own auth events overlaid with the
   partial state's events for the keys it may cite; rejected events never go in.
5. The remaining events are put in *mainline ordering* - the resolved power levels
   event and its chain of power levels auth events form the mainline; each event
   sorts by the position of the closest mainline event in its own power levels
   ancestry, then ``origin_server_ts``, then event ID - and checked the same way.
6. The unconflicted state is applied over the result.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from streamrep.matrix import auth
from streamrep.matrix import powerlevels as pl
from streamrep.matrix.events import (
    CREATE,
    CREATE_KEY,
    JOIN_RULES,
    MEMBER,
    POWER_LEVELS,
    POWER_LEVELS_KEY,
    MatrixEvent,
    StateKey,
)
from streamrep.matrix.room_versions import RoomVersion, StateResAlgorithm
from streamrep.matrix.stateres.common import StateMap, load_events, passes_auth
from streamrep.matrix.stateres.source import EventSource

__all__ = ["resolve_v2", "separate", "is_power_event", "reverse_topological_power_order",
           "mainline_order"]


def separate(state_sets: Sequence[StateMap]) -> tuple[dict[StateKey, str],
                                                      dict[StateKey, set[str]]]:
    """Unconflicted state and the conflicted keys' events (v2's definition)."""
    keys: set[StateKey] = set()
    for state in state_sets:
        keys.update(state)
    unconflicted: dict[StateKey, str] = {}
    conflicted: dict[StateKey, set[str]] = {}
    for key in keys:
        values = {state.get(key) for state in state_sets}
        if len(values) == 1:
            only = values.pop()
            if only is not None:
                unconflicted[key] = only
        else:
            conflicted[key] = {v for v in values if v is not None}
    return unconflicted, conflicted


def is_power_event(event: MatrixEvent) -> bool:
    """Power levels, join rules, create, or a kick or ban of another user."""
    if event.state_key == "" and event.type in (POWER_LEVELS, JOIN_RULES, CREATE):
        return True
    if event.type == MEMBER and event.membership in ("leave", "ban"):
        return event.sender != event.state_key
    return False


def _auth_state(event: MatrixEvent, events: dict[str, MatrixEvent],
                source: EventSource, skip_rejected: bool) -> dict[StateKey, MatrixEvent]:
    state: dict[StateKey, MatrixEvent] = {}
    for aid in event.auth_ids:
        auth_event = events.get(aid) or source.get_event(aid)
        if auth_event is None or auth_event.state_key is None:
            continue
        if skip_rejected and source.is_rejected(aid):
            continue
        events.setdefault(aid, auth_event)
        state[auth_event.key] = auth_event
    return state


def _sender_level(event: MatrixEvent, version: RoomVersion, events: dict[str, MatrixEvent],
                  source: EventSource) -> int:
    """The sender's power level by the event's own auth events."""
    state = _auth_state(event, events, source, skip_rejected=False)
    if event.type != CREATE and CREATE_KEY not in state:
        return 0
    return pl.user_level(event.sender, state, version)


def reverse_topological_power_order(
    event_ids: Sequence[str] | set[str], full_conflicted: set[str], version: RoomVersion,
    events: dict[str, MatrixEvent], source: EventSource,
) -> list[str]:
    """*event_ids* and their auth ancestors within *full_conflicted*, auth events
    first, ties by (-sender power level, origin_server_ts, event ID)."""
    auth_edges: dict[str, list[str]] = {}
    stack = list(event_ids)
    while stack:
        eid = stack.pop()
        if eid in auth_edges:
            continue
        edges = [a for a in events[eid].auth_ids if a in full_conflicted and a in events]
        auth_edges[eid] = edges
        stack.extend(a for a in edges if a not in auth_edges)
    children: dict[str, list[str]] = {eid: [] for eid in auth_edges}
    waiting: dict[str, int] = {}
    for eid, edges in auth_edges.items():
        unique = set(edges)
        waiting[eid] = len(unique)
        for a in unique:
            children[a].append(eid)

    def order_key(eid: str) -> tuple[int, int, str]:
        event = events[eid]
        return (-_sender_level(event, version, events, source), event.origin_server_ts, eid)

    ready = [(order_key(e), e) for e, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, eid = heapq.heappop(ready)
        out.append(eid)
        for child in children[eid]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, (order_key(child), child))
    return out


def _power_levels_parent(event: MatrixEvent, events: dict[str, MatrixEvent],
                         source: EventSource) -> str | None:
    for aid in event.auth_ids:
        auth_event = events.get(aid) or source.get_event(aid)
        if auth_event is not None and auth_event.type == POWER_LEVELS and (
                auth_event.state_key == ""):
            events.setdefault(aid, auth_event)
            return aid
    return None


def mainline_order(event_ids: Sequence[str], power_levels_id: str | None,
                   events: dict[str, MatrixEvent], source: EventSource) -> list[str]:
    """*event_ids* by (mainline position, origin_server_ts, event ID)."""
    mainline: list[str] = []
    current = power_levels_id
    while current is not None:
        event = events.get(current) or source.get_event(current)
        if event is None:
            break
        events.setdefault(current, event)
        mainline.append(current)
        current = _power_levels_parent(event, events, source)
    position = {eid: i + 1 for i, eid in enumerate(reversed(mainline))}
    memo: dict[str, int] = {}

    def depth(eid: str) -> int:
        walked: list[str] = []
        found = 0
        current: str | None = eid
        while current is not None:
            if current in position:
                found = position[current]
                break
            if current in memo:
                found = memo[current]
                break
            walked.append(current)
            event = events.get(current) or source.get_event(current)
            if event is None:
                break
            current = _power_levels_parent(event, events, source)
        for w in walked:
            memo[w] = found
        return found

    def sort_key(eid: str) -> tuple[int, int, str]:
        return (depth(eid), events[eid].origin_server_ts, eid)

    return sorted(event_ids, key=sort_key)


def _iterative_auth_checks(order: Sequence[str], partial: dict[StateKey, str],
                           version: RoomVersion, events: dict[str, MatrixEvent],
                           source: EventSource) -> dict[StateKey, str]:
    for eid in order:
        event = events[eid]
        if event.state_key is None or source.is_rejected(eid):
            continue
        state = _auth_state(event, events, source, skip_rejected=True)
        for key in auth.auth_types_for_event(event, version):
            held = partial.get(key)
            if held is None or source.is_rejected(held):
                continue
            held_event = events.get(held) or source.get_event(held)
            if held_event is not None:
                events.setdefault(held, held_event)
                state[key] = held_event
        if passes_auth(event, version, state):
            partial[event.key] = eid
    return partial


def resolve_v2(room_id: str, version: RoomVersion, state_sets: Sequence[StateMap],
               source: EventSource) -> dict[StateKey, str]:
    """Resolve *state_sets* of *room_id* with v2, or v2.1 when *version* says so."""
    unconflicted, conflicted = separate(state_sets)
    if not conflicted:
        return unconflicted
    conflicted_ids: set[str] = set().union(*conflicted.values())
    full = set(conflicted_ids)
    full |= source.auth_chain_difference([set(s.values()) for s in state_sets])
    v21 = version.state_res is StateResAlgorithm.V2_1
    if v21:
        full |= source.conflicted_subgraph(conflicted_ids)
    events = load_events(room_id, full, source)
    full = set(events)
    power = [eid for eid in full if is_power_event(events[eid])]
    power_order = reverse_topological_power_order(power, full, version, events, source)
    partial: dict[StateKey, str] = {} if v21 else dict(unconflicted)
    partial = _iterative_auth_checks(power_order, partial, version, events, source)
    placed = set(power_order)
    others = [eid for eid in full if eid not in placed]
    others = mainline_order(others, partial.get(POWER_LEVELS_KEY), events, source)
    partial = _iterative_auth_checks(others, partial, version, events, source)
    partial.update(unconflicted)
    return partial
