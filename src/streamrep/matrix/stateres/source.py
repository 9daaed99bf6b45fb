"""What state resolution needs to know about a room's events."""

from __future__ import annotations

from typing import Collection, Iterable, Mapping, Protocol, Sequence

from streamrep.matrix.authindex import AuthIndex
from streamrep.matrix.events import MatrixEvent

__all__ = ["EventSource", "InMemoryEventSource"]


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


class InMemoryEventSource:
    """An :class:`EventSource` over events held in memory."""

    def __init__(self, events: Iterable[MatrixEvent] = (),
                 rejected: Iterable[str] = ()) -> None:
        self.events: dict[str, MatrixEvent] = {}
        self.rejected: set[str] = set(rejected)
        self.index = AuthIndex()
        for event in events:
            self.add(event)

    def add(self, event: MatrixEvent, rejected: bool = False) -> None:
        """Hold *event* (and remember it was rejected, when it was)."""
        self.events[event.event_id] = event
        self.index.add(event.event_id, event.auth_ids)
        if rejected:
            self.rejected.add(event.event_id)
        else:
            self.rejected.discard(event.event_id)

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
