"""Splitting state sets into conflicted keys and the unconflicted state (pure twin).

Same API and results as the compiled ``streamrep._core.stateset``.

:func:`split_state_sets` compares the state sets that a state resolution merges
(each a dict of ``(type, state_key)`` to event ID) and answers:

* the *differing* keys: those that some set maps to another event than the first
  set, or lacks while another has it (the conflicted keys of state resolution v2);
* the numbers of the unconflicted events (the first set's events under every other
  key) in *numbers*, an event ID to number map such as an auth index keeps, and the
  unconflicted events *numbers* does not know, in the first set's order.

:func:`differing_events` answers the differing keys too, and with them what each set
maps them to: the conflicted events, set by set, which is what state resolution
walks from.

The compiled core walks each set alongside the first one in insertion order, so sets
copied from one another and then changed compare entry by entry without hashing;
sets in another order are compared by lookups, with the same result.
"""

from __future__ import annotations

from array import array
from typing import Hashable, Mapping, Sequence, TypeVar

__all__ = ["NumberMemo", "differing_events", "split_state_sets"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)


class NumberMemo:
    """Numbers of the first set's event IDs kept between splits (the compiled core
    keeps them by position; the twin looks every ID up)."""


def split_state_sets(states: Sequence[Mapping[K, V]], numbers: Mapping[V, int] | None,
                     memo: NumberMemo | None = None,
                     ) -> tuple[set[K], array[int], list[V]]:
    """``(differing keys, numbers of unconflicted events, unconflicted events without
    a number)`` of *states* (see the module doc). *memo* keeps what one split learns
    about the first set's numbers for the next, when given. *numbers* None: the
    differing keys alone (no numbers, none without)."""
    if not states:
        return set(), array("q"), []
    base = states[0]
    differing: set[K] = set()
    missing = object()
    for state in states[1:]:
        if state is base:
            continue
        matched = 0
        for key, value in state.items():
            held = base.get(key, missing)
            if held is missing:
                differing.add(key)
                continue
            matched += 1
            if held != value:
                differing.add(key)
        if matched < len(base):
            differing.update(key for key in base if key not in state)
    common = array("q")
    unknown: list[V] = []
    if numbers is None:
        return differing, common, unknown
    for key, value in base.items():
        if key in differing:
            continue
        number = numbers.get(value)
        if number is None:
            unknown.append(value)
        else:
            common.append(number)
    return differing, common, unknown


def differing_events(states: Sequence[Mapping[K, V]]) -> tuple[set[K], list[set[V]]]:
    """``(differing keys, per set the events it maps them to)`` of *states* (see the
    module doc); a set lacking a differing key adds nothing for it."""
    differing, _, _ = split_state_sets(states, None)
    return differing, [{state[key] for key in differing if key in state} for state in states]
