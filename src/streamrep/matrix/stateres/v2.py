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

from typing import Callable, Container, Sequence

from streamrep.matrix import auth
from streamrep.matrix.errors import StateResolutionError
from streamrep.matrix.events import POWER_LEVELS_KEY, MatrixEvent, StateKey
from streamrep.matrix.room_versions import RoomVersion, StateResAlgorithm
from streamrep.matrix.stateres.common import StateMap, load_events
from streamrep.matrix.stateres.source import DerivedFacts, EventSource, InMemoryEventSource

__all__ = ["resolve_v2", "separate", "reverse_topological_power_order",
           "mainline_order"]


class _Split:
    """State sets split into conflicted keys and the rest, without copying the rest.

    ``base`` is the first state; every key outside ``differing`` is mapped by every
    state to ``base``'s event (the unconflicted state). An event ID names one key,
    so the work is set operations over event IDs (whose hashes strings cache):
    the events some state lacks name the differing keys.
    """

    def __init__(self, state_sets: Sequence[StateMap],
                 key_of: Callable[[str], StateKey | None],
                 found: tuple[set[StateKey], list[set[str]]] | None = None) -> None:
        first = state_sets[0]
        self.base = first
        self.state_sets = state_sets
        self.common: set[str] = set()
        #: The differing keys, and per state its events under them.
        self.differing: set[StateKey]
        self.per_set: list[set[str]]
        if found is not None:
            self.differing, self.per_set = found
            return
        self.differing = self._differing(state_sets, key_of)
        self.per_set = [
            {event_id for event_id in map(state.get, self.differing) if event_id is not None}
            for state in state_sets]

    @property
    def conflicted(self) -> dict[StateKey, set[str]]:
        """Each differing key's events (those the states map it to)."""
        return {key: {state[key] for state in self.state_sets if key in state}
                for key in self.differing}

    def _differing(self, state_sets: Sequence[StateMap],
                   key_of: Callable[[str], StateKey | None]) -> set[StateKey]:
        first = self.base
        first_ids = set(first.values())
        changed: set[str] = set()
        for state in state_sets[1:]:
            if state is not first:
                changed |= first_ids.symmetric_difference(state.values())
        self.common = first_ids - changed
        differing: set[StateKey] = set()
        unknown: set[str] = set()
        for event_id in changed:
            key = key_of(event_id)
            if key is None:
                unknown.add(event_id)
            else:
                differing.add(key)
        if unknown:
            # Events the source does not hold: find their keys in the states.
            for state in state_sets:
                differing.update(k for k, v in state.items() if v in unknown)
        return differing

    def unconflicted(self) -> dict[StateKey, str]:
        """The unconflicted state as a new dict."""
        out = dict(self.base)
        for key in self.differing:
            out.pop(key, None)
        return out


class _Partial:
    """The partial state of the iterative auth checks: resolved events over a base."""

    def __init__(self, split: _Split | None) -> None:
        self.resolved: dict[StateKey, str] = {}
        self.split = split

    def get(self, key: StateKey) -> str | None:
        found = self.resolved.get(key)
        if found is None and self.split is not None and key not in self.split.differing:
            found = self.split.base.get(key)
        return found

    def __setitem__(self, key: StateKey, event_id: str) -> None:
        self.resolved[key] = event_id


def separate(state_sets: Sequence[StateMap],
             key_of: Callable[[str], StateKey | None] = lambda _: None,
             ) -> tuple[dict[StateKey, str], dict[StateKey, set[str]]]:
    """Unconflicted state and the conflicted keys' events (v2's definition: a key
    is conflicted when the states map it to different events or some lack it)."""
    if not state_sets:
        return {}, {}
    split = _Split(state_sets, key_of)
    return split.unconflicted(), split.conflicted


class _Context:
    """The events one resolution reads, and what it derives from them once.

    Over an :class:`InMemoryEventSource` the derived facts are the source's, kept
    between resolutions; an event with an auth event not held is derived anew each time.
    """

    def __init__(self, version: RoomVersion, events: dict[str, MatrixEvent],
                 source: EventSource) -> None:
        self.version = version
        self.events = events
        self.source = source
        self._rejected: dict[str, bool] = {}
        #: Rejected event IDs, when the source holds them as a set.
        self.rejected_ids: set[str] | None = None
        facts = DerivedFacts()
        self.shared = isinstance(source, InMemoryEventSource)
        if isinstance(source, InMemoryEventSource):
            # Every event the source holds, read without copying.
            self.events = source.events
            self.rejected_ids = source.rejected
            facts = source.derived_facts(version.identifier)
        #: The senders' levels derived so far, by event ID (see
        #: :meth:`~streamrep._pure.authrules.Rules.sender_levels`).
        self.sender_levels = facts.sender_level
        self.rules = auth.rules_for(version)
        #: The power levels parents derived so far, by event ID (see
        #: :meth:`~streamrep._pure.authrules.Rules.mainline_order`).
        self.power_levels_parents = facts.power_levels_parent

    def get(self, event_id: str) -> MatrixEvent | None:
        event = self.events.get(event_id)
        if event is None:
            event = self.source.get_event(event_id)
            if event is not None:
                self.events[event_id] = event
        return event

    def rejected(self, event_id: str) -> bool:
        found = self._rejected.get(event_id)
        if found is None:
            found = self._rejected[event_id] = self.source.is_rejected(event_id)
        return found

    def is_rejected(self, event_id: str) -> bool:
        """True when the source holds the event as rejected."""
        if self.rejected_ids is not None:
            return event_id in self.rejected_ids
        return self.rejected(event_id)


def reverse_topological_power_order(event_ids: Sequence[str] | set[str],
                                    full_conflicted: set[str], ctx: _Context) -> list[str]:
    """*event_ids* and their auth ancestors within *full_conflicted*, auth events
    first (Kahn's algorithm), ties by (-sender power level, origin_server_ts, event ID)."""
    return ctx.rules.power_order(event_ids, full_conflicted, ctx.events, ctx.sender_levels,
                                 None if ctx.shared else ctx.get)


def mainline_order(event_ids: Sequence[str], power_levels_id: str | None,
                   ctx: _Context) -> list[str]:
    """*event_ids* by (mainline position, origin_server_ts, event ID)."""
    return ctx.rules.mainline_order(event_ids, power_levels_id, ctx.events,
                                    ctx.power_levels_parents, None if ctx.shared else ctx.get)


def _iterative_auth_checks(order: Sequence[str], partial: _Partial, ctx: _Context) -> None:
    events = ctx.events
    rejected: Container[str] = _Rejected(ctx)
    if ctx.rejected_ids is not None:
        rejected = ctx.rejected_ids
    split = partial.split
    version = ctx.version
    ctx.rules.check_in_order(
        order, events, partial.resolved, split.base if split is not None else None,
        split.differing if split is not None else frozenset(), rejected,
        lambda event: auth.create_allowed(event, version),  # type: ignore[arg-type]
        None if ctx.shared else ctx.get)


class _Rejected:
    """A source's rejections as a container of event IDs."""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx

    def __contains__(self, event_id: object) -> bool:
        return isinstance(event_id, str) and self.ctx.is_rejected(event_id)


def _load(room_id: str, event_ids: set[str], source: EventSource
          ) -> tuple[dict[str, MatrixEvent], set[str], list[str]]:
    """The held events among *event_ids* (an event of another room is an error), their
    IDs, and those of the power events among them."""
    if not isinstance(source, InMemoryEventSource):
        events = load_events(room_id, event_ids, source)  # refuses other rooms' events
        held, power, _ = auth.held_events(events, events, room_id)
        return events, held, power
    # One pass over the source's own events, in the core: from here on every step
    # reads them one at a time.
    full, power, foreign = auth.held_events(source.events, event_ids, room_id)
    if foreign is not None:
        raise StateResolutionError(f"event {foreign} belongs to room "
                                   f"{source.events[foreign].room_id}, not {room_id}")
    return source.events, full, power


def _held_difference(source: InMemoryEventSource, split: _Split,
                     state_sets: Sequence[StateMap]) -> set[str]:
    """The auth difference of the split's sets over the source's auth index: the
    sets' conflicted events' chains, less what the unconflicted state's chain holds
    (asked of the few events concerned, by walking down to the state events citing
    them); by numbering and walking the unconflicted state when that asks about more
    than a quarter as many events as it holds."""
    index = source.index
    found = index.auth_chain_difference_beside(
        split.per_set, split.base, split.differing, max(256, len(split.base) // 4))
    if found is None:
        _, common_numbers = index.split_state_sets(state_sets)
        found = index.auth_chain_difference(split.per_set, common_numbers=common_numbers)
    return found


def resolve_v2(room_id: str, version: RoomVersion, state_sets: Sequence[StateMap],
               source: EventSource) -> dict[StateKey, str]:
    """Resolve *state_sets* of *room_id* with v2, or v2.1 when *version* says so."""
    if not state_sets:
        return {}

    def key_of(event_id: str) -> StateKey | None:
        event = source.get_event(event_id)
        return event.key if event is not None and event.state_key is not None else None

    if isinstance(source, InMemoryEventSource):
        # The compiled core compares the sets.
        split = _Split(state_sets, key_of, source.index.differing_events(state_sets))
    else:
        split = _Split(state_sets, key_of)
    if not split.differing:
        return dict(split.base)
    conflicted_ids: set[str] = set().union(*split.per_set)
    full = set(conflicted_ids)
    # The unconflicted events are in every set: pass them once.
    per_set = split.per_set
    if isinstance(source, InMemoryEventSource):
        full |= _held_difference(source, split, state_sets)
    else:
        full |= source.auth_chain_difference(per_set, split.common)
    v21 = version.state_res is StateResAlgorithm.V2_1
    if v21:
        full |= source.conflicted_subgraph(conflicted_ids)
    events, full, power = _load(room_id, full, source)
    ctx = _Context(version, events, source)
    power_order = reverse_topological_power_order(power, full, ctx)
    # v2 starts from the unconflicted state, v2.1 from nothing.
    partial = _Partial(None if v21 else split)
    _iterative_auth_checks(power_order, partial, ctx)
    placed = set(power_order)
    others = [eid for eid in full if eid not in placed]
    others = mainline_order(others, partial.get(POWER_LEVELS_KEY), ctx)
    _iterative_auth_checks(others, partial, ctx)
    # The unconflicted state is applied over the result: of the resolved events,
    # those under the differing keys, and under keys no state has.
    result = dict(split.base)
    resolved = partial.resolved
    for key in split.differing:
        event_id = resolved.pop(key, None)
        if event_id is None:
            result.pop(key, None)
        else:
            result[key] = event_id
    for key, event_id in resolved.items():
        result.setdefault(key, event_id)
    return result
