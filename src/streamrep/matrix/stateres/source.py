"""What state resolution needs to know about a room's events."""

from __future__ import annotations

from typing import Collection, Iterable, Mapping, Protocol, Sequence

from streamrep.matrix.events import StateKey

from streamrep.matrix.authindex import AuthIndex
from streamrep.matrix.events import MatrixEvent

__all__ = ["EventSource", "InMemoryEventSource", "DerivedFacts"]


class EventSource(Protocol):
    """The events of one room, as state resolution reads them."""

    def get_event(self, event_id: str) -> MatrixEvent | None:
        """The event, or None when it is not held."""
        ...

    def is_rejected(self, event_id: str) -> bool:
        """True when the event was rejected by the authorization rules."""
        ...

    def auth_chain_difference(self, state_sets: Sequence[Collection[str]],
                              common: Collection[str] = ()) -> set[str]:
        """Events in the full auth chain of some, but not all, of the state sets,
        each set taken together with the *common* events."""
        ...

    def conflicted_subgraph(self, conflicted: Collection[str]) -> set[str]:
        """Events on an auth path between two conflicted events, those included."""
        ...


class DerivedFacts:
    """What state resolution derives from a held event and its held auth events, kept
    between a room's resolutions (by event ID; one per room version).

    Only facts whose auth events are all held are kept; the source forgets them all
    when a held event is replaced or its rejection changes.
    """

    __slots__ = ("sender_level", "power_levels_parent")

    def __init__(self) -> None:
        #: The sender's power level by the event's auth events.
        self.sender_level: dict[str, int] = {}
        #: The power levels event among its auth events, if any.
        self.power_levels_parent: dict[str, str | None] = {}


class InMemoryEventSource:
    """An :class:`EventSource` over events held in memory."""

    def __init__(self, events: Iterable[MatrixEvent] = (),
                 rejected: Iterable[str] = ()) -> None:
        self.events: dict[str, MatrixEvent] = {}
        self.rejected: set[str] = set(rejected)
        self.index = AuthIndex()
        self._facts: dict[str, DerivedFacts] = {}
        for event in events:
            self.add(event, rejected=event.event_id in self.rejected)

    def add(self, event: MatrixEvent, rejected: bool = False) -> None:
        """Hold *event* (and remember it was rejected, when it was)."""
        event_id = event.event_id
        if self._facts and (event_id in self.events or (event_id in self.rejected) != rejected):
            self._facts.clear()
        self.events[event_id] = event
        self.index.add(event_id, event.auth_ids,
                       event.key if event.state_key is not None else None)
        if rejected:
            self.rejected.add(event_id)
        else:
            self.rejected.discard(event_id)

    def clear_derived(self) -> None:
        """Forget what resolutions kept (derived facts, the numbers of the last first
        state's events); the next resolution derives them again."""
        self._facts.clear()
        self.index.clear_memo()

    def derived_facts(self, room_version: str) -> DerivedFacts:
        """The facts state resolution keeps about these events in *room_version*."""
        found = self._facts.get(room_version)
        if found is None:
            found = self._facts[room_version] = DerivedFacts()
        return found

    def get_event(self, event_id: str) -> MatrixEvent | None:
        return self.events.get(event_id)

    def is_rejected(self, event_id: str) -> bool:
        return event_id in self.rejected

    def auth_chain_difference(self, state_sets: Sequence[Collection[str]],
                              common: Collection[str] = ()) -> set[str]:
        return self.index.auth_chain_difference(state_sets, common)

    def conflicted_subgraph(self, conflicted: Collection[str]) -> set[str]:
        return self.index.conflicted_subgraph(conflicted)

    def as_mapping(self) -> Mapping[str, MatrixEvent]:
        """The held events by ID."""
        return self.events
