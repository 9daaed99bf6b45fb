"""What the room rules decide about a batch of events: a value the event store
writes as it is (see :class:`streamrep.events.rules.RoomRules`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, NamedTuple, Protocol, Sequence

from streamrep.matrix.events import StateKey

__all__ = ["Rejection", "Verdict", "NO_VERDICT", "StateReader"]


class Rejection(NamedTuple):
    """Why an event was rejected: a :class:`~streamrep.matrix.errors.RejectionReason`
    value (or ``"flagged"`` for an event persisted with the rejected flag) and one
    line."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Verdict:
    """The room rules' decisions about a batch's events.

    ``rejected`` and ``soft_failed`` are flags the store sets on the events (events
    persisted with the ``rejected`` flag are among ``rejected``, as ``"flagged"``);
    the rest are rows for the rules' tables: the auth events of each state event
    (``(event_id, auth_id, room_id)``) and the version of each room the batch
    creates (``(room_id, version)``)."""

    rejected: Mapping[str, Rejection] = field(default_factory=dict)
    soft_failed: frozenset[str] = frozenset()
    auth_rows: Sequence[tuple[str, str, str]] = ()
    room_versions: Sequence[tuple[str, str]] = ()

    @property
    def flagged(self) -> bool:
        """Whether any event is rejected or soft-failed."""
        return bool(self.rejected or self.soft_failed)


#: The verdict of a batch that nothing checked.
NO_VERDICT = Verdict()


class StateReader(Protocol):
    """A room's current state as the rules read it: the event store answers from
    its cache or its tables; the rules never see which."""

    def read(self, room_id: str, keys: Collection[StateKey]) -> Mapping[StateKey, str]:
        """The current state's event for each of *keys* that the room's current
        state holds (keys it does not hold are left out)."""
        ...

