"""Choosing one state where an event's prev_events disagree.

:class:`StateResolver` is the plug-in point (``EventStore(url, resolver=...)``). The
event store's default is the Matrix state resolution of each room's version
(:class:`streamrep.matrix.rules.MatrixStateResolver`). :class:`DepthOrderResolver`
is the resolver of a store without room rules (``room_rules=None``, for DAG data
that is not a Matrix room): simple and deterministic, it checks no authorization
rules and no power levels.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

__all__ = ["StateKey", "StateMap", "StateResolver", "DepthOrderResolver", "conflicted_ids"]

StateKey = tuple[str, str]
StateMap = Mapping[StateKey, str]


class StateResolver(Protocol):
    """Merges several states of one room into one."""

    def resolve(
        self,
        room_id: str,
        state_sets: Sequence[StateMap],
        orderings: Mapping[str, tuple[int, int]],
    ) -> dict[StateKey, str]:
        """Return the merged state. ``orderings`` maps each conflicted event ID that
        is stored to its ``(topological_ordering, stream_ordering)``. The result must
        not depend on the order of ``state_sets``."""
        ...


def conflicted_ids(state_sets: Sequence[StateMap]) -> set[str]:
    """Event IDs of the keys on which the state sets disagree (or which some lack)."""
    out: set[str] = set()
    if len(state_sets) < 2:
        return out
    first = state_sets[0]
    keys: set[StateKey] = set()
    for state in state_sets:
        keys.update(state)
    for key in keys:
        value = first.get(key)
        if any(state.get(key) != value for state in state_sets[1:]):
            out.update(state[key] for state in state_sets if key in state)
    return out


class DepthOrderResolver:
    """The resolver of a store without room rules.

    Every key held by at least one state is kept. Where states name different
    events for a key, the event with the highest ``(topological_ordering,
    stream_ordering)`` wins; events that are not stored rank below stored ones,
    and remaining ties go to the greatest event ID.
    """

    def resolve(
        self,
        room_id: str,
        state_sets: Sequence[StateMap],
        orderings: Mapping[str, tuple[int, int]],
    ) -> dict[StateKey, str]:
        merged: dict[StateKey, str] = {}
        unknown = (-(2**63), -(2**63))
        for state in state_sets:
            for key, event_id in state.items():
                current = merged.get(key)
                if current is None or current == event_id:
                    merged[key] = event_id
                    continue
                if (orderings.get(event_id, unknown), event_id) > (
                        orderings.get(current, unknown), current):
                    merged[key] = event_id
        return merged
