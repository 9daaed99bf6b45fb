"""Errors of the Matrix room model: bad input, unknown room versions, rejections.

Plain Python. :class:`AuthRejection` is what the authorization rules raise; it
carries a :class:`RejectionReason` (a short stable code) and a one-line detail.
"""

from __future__ import annotations

import enum

from streamrep.errors import InvalidEventError, StreamrepError

__all__ = [
    "MatrixError",
    "UnknownRoomVersionError",
    "MalformedEventError",
    "RejectionReason",
    "AuthRejection",
    "StateResolutionError",
]


class MatrixError(StreamrepError):
    """Base class of the Matrix room model's errors."""


class UnknownRoomVersionError(MatrixError, InvalidEventError):
    """A room version identifier that streamrep does not implement."""


class MalformedEventError(MatrixError, InvalidEventError):
    """An event whose fields do not have the shape the room version requires."""


class StateResolutionError(MatrixError):
    """State resolution was asked about events it cannot see (wrong room, unknown)."""


class RejectionReason(str, enum.Enum):
    """Why the authorization rules reject an event (stored in ``rejections.reason``)."""

    MISSING_AUTH_EVENTS = "missing_auth_events"
    BAD_AUTH_EVENTS = "bad_auth_events"
    REJECTED_AUTH_EVENT = "rejected_auth_event"
    NO_CREATE_EVENT = "no_create_event"
    BAD_CREATE_EVENT = "bad_create_event"
    NOT_FEDERATED = "not_federated"
    BAD_ALIASES = "bad_aliases"
    NOT_IN_ROOM = "not_in_room"
    MEMBERSHIP_FORBIDDEN = "membership_forbidden"
    INSUFFICIENT_POWER = "insufficient_power"
    OTHERS_STATE = "others_state"
    BAD_POWER_LEVELS = "bad_power_levels"
    MALFORMED = "malformed"
    #: Room versions 3 on: the event ID is not the event's reference hash.
    BAD_EVENT_ID = "bad_event_id"
    #: The content hash the event carries is missing or not its content's.
    BAD_CONTENT_HASH = "bad_content_hash"


class AuthRejection(MatrixError):
    """The authorization rules reject the event.

    ``reason`` is a :class:`RejectionReason`; ``str(exc)`` is one line for people.
    """

    def __init__(self, reason: RejectionReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.reason, self.detail))
