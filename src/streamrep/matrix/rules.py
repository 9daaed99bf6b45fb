"""The Matrix room rules as the event store uses them (pure: the store feeds them
what it read and writes what they decide).

:class:`MatrixRoomRules` holds, per room, a :class:`~streamrep.matrix.roommodel.RoomModel`
(the room version and every stored state event, with an auth chain index), bounded
by ``max_rooms``. For each batch it decides, before anything is written, which
events are rejected or soft-failed (:mod:`~streamrep.matrix.batchcheck`), and returns
that as a :class:`~streamrep.matrix.verdict.Verdict` with the rows of its tables.
:class:`MatrixStateResolver` resolves conflicting states with the algorithm of the
room's version over the same in-memory rooms.

It satisfies the event store's :class:`streamrep.events.rules.RoomRules` protocol.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Collection, Iterable, Mapping, Sequence

from streamrep.matrix.batchcheck import BatchCheck, CurrentState
from streamrep.matrix.errors import MatrixError
from streamrep.matrix.events import StateKey
from streamrep.matrix.room_versions import DEFAULT_ROOM_VERSION, room_version
from streamrep.matrix.roommodel import RoomModel
from streamrep.matrix.stateres import resolve_state
from streamrep.matrix.verdict import StateReader, Verdict

__all__ = ["MatrixRoomRules", "MatrixStateResolver"]


class MatrixRoomRules:
    """The Matrix authorization rules and state resolution of each room's version,
    over rooms held in memory (see the module docstring)."""

    def __init__(self, max_rooms: int = 256) -> None:
        self._rooms: OrderedDict[str, RoomModel] = OrderedDict()
        self._max_rooms = max_rooms
        self.resolver = MatrixStateResolver(self)

    # --- the rooms held ----------------------------------------------------------

    def holds(self, room_id: str) -> bool:
        """Whether the room's model is held (else :meth:`hold` it first)."""
        return room_id in self._rooms

    def hold(self, room_id: str, version_id: str | None,
             state_events: Iterable[tuple[str, bytes, bool, bool]]) -> None:
        """Hold the room as stored: its ``rooms`` row's version (None when it has
        none) and its state events as ``(event_id, json, rejected, redacted)``."""
        self._rooms[room_id] = RoomModel.from_stored(room_id, version_id, state_events)

    def redact(self, event_ids: Collection[str]) -> None:
        """Hold the held ones of *event_ids* pruned (they were redacted)."""
        for model in self._rooms.values():
            for event_id in event_ids:
                model.redact(event_id)

    def model(self, room_id: str) -> RoomModel:
        """The held room's model; :class:`MatrixError` when it is not held."""
        model = self._rooms.get(room_id)
        if model is None:
            raise MatrixError(f"room {room_id} is not held by the room rules: hold it first")
        self._rooms.move_to_end(room_id)
        return model

    def forget(self, room_id: str | None = None) -> None:
        """Drop the held room (all rooms when None): after a failed batch, or when
        another process wrote the room."""
        if room_id is None:
            self._rooms.clear()
        else:
            self._rooms.pop(room_id, None)

    def trim(self) -> None:
        """Drop the least recently used rooms beyond ``max_rooms`` (between batches:
        a batch's rooms stay held while it is persisted)."""
        while len(self._rooms) > self._max_rooms:
            self._rooms.popitem(last=False)

    # --- a batch -----------------------------------------------------------------

    def check(self, records_by_room: Mapping[str, list[Any]],
              current: StateReader | None) -> Verdict:
        """Check a batch's records, room by room (each room held), against their
        auth events and, with *current* (None for backfilled events), the rooms'
        current state; the records are not modified."""
        check = BatchCheck()
        for room_id, records in records_by_room.items():
            model = self.model(room_id)
            check.check_room(model, records,
                             CurrentState(current, model) if current is not None else None)
        return check.verdict()


class MatrixStateResolver:
    """The event store's :class:`~streamrep.events.resolver.StateResolver` with the
    Matrix algorithm of each room's version, over the rules' held rooms."""

    def __init__(self, rules: MatrixRoomRules) -> None:
        self._rules = rules

    def resolve(self, room_id: str, state_sets: Sequence[Mapping[StateKey, str]],
                orderings: Mapping[str, tuple[int, int]]) -> dict[StateKey, str]:
        model = self._rules.model(room_id)
        version = model.version or room_version(DEFAULT_ROOM_VERSION)
        return resolve_state(room_id, version, state_sets, model.source)
