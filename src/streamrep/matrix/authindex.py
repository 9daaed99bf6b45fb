"""A room's auth DAG keyed by event ID, over the compiled auth chain core.

:class:`AuthIndex` interns event IDs into dense integers once and keeps the edges
in :class:`streamrep._core.authchain.AuthGraph` (or its pure twin), so auth chain
questions walk integer arrays instead of loading events.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Container, Iterable, Mapping, Sequence, TypeVar

from streamrep import _impl

if TYPE_CHECKING:
    from streamrep._pure import authchain as _authchain
    from streamrep._pure import stateset as _stateset
else:
    _authchain = _impl.load("authchain")
    _stateset = _impl.load("stateset")

__all__ = ["AuthIndex"]

K = TypeVar("K")


class AuthIndex:
    """Auth edges of one room's events, by event ID."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}
        self._ids: list[str] = []
        #: Each event's state key by number (None: not state, or not described).
        self._keys: list[object] = []
        self._described: set[int] = set()
        self._graph = _authchain.AuthGraph()
        self._stateset = _stateset
        #: The numbers of the last split's first state, for the next split.
        self._memo = _stateset.NumberMemo()

    def __len__(self) -> int:
        return len(self._described)

    def __contains__(self, event_id: object) -> bool:
        number = self._numbers.get(event_id) if isinstance(event_id, str) else None
        return number is not None and number in self._described

    def _number(self, event_id: str) -> int:
        number = self._numbers.get(event_id)
        if number is None:
            number = len(self._ids)
            self._numbers[event_id] = number
            self._ids.append(event_id)
            self._keys.append(None)
        return number

    def add(self, event_id: str, auth_ids: Iterable[str], key: object = None) -> None:
        """Record *event_id*'s auth events and, for a state event (the only kind an
        event may cite), its *key* (``(type, state_key)``). Recording an event again
        changes nothing."""
        number = self._number(event_id)
        if number in self._described:
            return
        self._graph.set_auth_events(number, [self._number(a) for a in auth_ids],
                                    key is not None)
        self._keys[number] = key
        self._described.add(number)

    def _names(self, numbers: Iterable[int]) -> set[str]:
        ids = self._ids
        return {ids[n] for n in numbers}

    def _lookup(self, event_ids: Iterable[str]) -> list[int]:
        ids = list(event_ids)
        found = list(map(self._numbers.get, ids))
        if None in found:
            return [self._number(e) for e in ids]
        return found  # type: ignore[return-value]

    def auth_chain(self, event_ids: Iterable[str]) -> set[str]:
        """The auth chain of *event_ids* (every event reachable along auth edges)."""
        return self._names(self._graph.auth_chain(self._lookup(event_ids)))

    def auth_chain_difference(self, state_sets: Sequence[Iterable[str]],
                              common: Iterable[str] = (), *,
                              common_numbers: array[int] | None = None) -> set[str]:
        """Events in the full auth chain of some, but not all, of *state_sets*.

        *common* names events that are in every set (the unconflicted state): they
        are walked once, and the sets' walks stop at their auth chain.
        *common_numbers* gives more of them by number (see :meth:`split_state_sets`).
        """
        shared = array("q", self._lookup(common))
        if common_numbers is not None:
            shared = shared + common_numbers if shared else common_numbers
        return self._names(self._graph.auth_chain_difference(
            [self._lookup(s) for s in state_sets], shared))

    def auth_chain_difference_beside(self, state_sets: Sequence[Iterable[str]],
                                     state: Mapping[K, str], hidden: Container[K],
                                     limit: int) -> set[str] | None:
        """:meth:`auth_chain_difference` of *state_sets* each taken together with a
        common part that is never walked as a whole: the events *state* maps the keys
        outside *hidden* to. The difference of the sets alone, less the events in the
        common part's full auth chain, found from each of them by walking to the state
        events citing it until one the common part holds; None when that asks about
        more than *limit* events (then walking the common part costs less).

        Across the few events a merge's forks differ by, this looks at a few events;
        the common part (the unconflicted state: every member of the room) is numbered
        and walked only when it does not. A state event is asked about by its key;
        any other by the common part's events as a set, made when first needed."""
        candidates = self._graph.auth_chain_difference([self._lookup(s) for s in state_sets])
        if not candidates:
            return set()
        unkeyed: list[set[str]] = []

        def held_without_key(event_id: str) -> bool:
            if not unkeyed:
                unkeyed.append({v for k, v in state.items() if k not in hidden})
            return event_id in unkeyed[0]

        held = _authchain.HeldBy(self._ids, self._keys, state, hidden, held_without_key)
        inside = self._graph.in_chain_of(candidates, held, limit)
        if inside is None:
            return None
        return self._names(set(candidates).difference(inside))

    def clear_memo(self) -> None:
        """Forget the numbers :meth:`split_state_sets` kept from its last first state."""
        self._memo = self._stateset.NumberMemo()

    def split_state_sets(self, state_sets: Sequence[Mapping[K, str]]
                         ) -> tuple[set[K], array[int]]:
        """The keys *state_sets* disagree on (some maps them to another event than
        the first, or lacks them), and the numbers of the other keys' events (the
        unconflicted state), for :meth:`auth_chain_difference`."""
        differing, common, unknown = self._stateset.split_state_sets(
            state_sets, self._numbers, self._memo)
        if unknown:
            common.extend(self._number(e) for e in unknown)
        return differing, common

    def differing_events(self, state_sets: Sequence[Mapping[K, str]]
                         ) -> tuple[set[K], list[set[str]]]:
        """The keys *state_sets* disagree on (see :meth:`split_state_sets`), and per
        set the events it maps them to."""
        return self._stateset.differing_events(state_sets)

    def conflicted_subgraph(self, conflicted: Iterable[str]) -> set[str]:
        """Events on an auth path between two *conflicted* events, those included."""
        return self._names(self._graph.conflicted_subgraph(self._lookup(conflicted)))
