"""The room rules a store checks each batch with.

:class:`RoomRules` is the plug-in point (``EventStore(url, room_rules=...)``), as
:class:`~streamrep.events.resolver.StateResolver` is for resolution. The event
store's default is the Matrix rules of each room's version
(:class:`streamrep.matrix.rules.MatrixRoomRules`); ``room_rules=None`` checks
nothing. The rules do no I/O: the store hands them each room as stored and a
reader of the rooms' current state (:mod:`~streamrep.events.authorize`), and writes
the :class:`Verdict` they return.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Protocol

from streamrep.events.resolver import StateResolver
from streamrep.matrix.verdict import NO_VERDICT, Rejection, StateReader, Verdict

__all__ = ["RoomRules", "Verdict", "Rejection", "StateReader", "NO_VERDICT"]


class RoomRules(Protocol):
    """Decides, before a batch is written, which of its events are rejected or
    soft-failed, over rooms it holds in memory."""

    @property
    def resolver(self) -> StateResolver:
        """The resolver of conflicting states that goes with these rules (the
        store's default resolver)."""
        ...

    def holds(self, room_id: str) -> bool:
        """Whether the room is held (checks and resolutions need it held)."""
        ...

    def hold(self, room_id: str, version_id: str | None,
             state_events: Iterable[tuple[str, bytes, bool, bool]]) -> None:
        """Hold a room as stored: the version its ``rooms`` row names (None when it
        has none) and its state events, ``(event_id, json, rejected, redacted)``
        (the JSON as received: the rules prune redacted events themselves)."""
        ...

    def redact(self, event_ids: Collection[str]) -> None:
        """Events among *event_ids* that a held room holds were redacted (a batch
        that committed marked them): hold them pruned from now on."""
        ...

    def check(self, records_by_room: Mapping[str, list[Any]],
              current: StateReader | None) -> Verdict:
        """The verdict on a batch's records (validated, by room, each room held):
        against their auth events and, with *current* (live events received from
        another server), against the rooms' current state; an event that passes the
        first and fails the second is soft-failed. Records are not modified."""
        ...

    def forget(self, room_id: str | None = None) -> None:
        """Drop a held room (every room when None): its stored form changed
        elsewhere, or a batch failed."""
        ...

    def trim(self) -> None:
        """Drop rooms beyond the rules' bound (called between batches)."""
        ...
