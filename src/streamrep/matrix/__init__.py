"""The Matrix room model: room versions, authorization rules, state resolution.

Pure protocol logic, no I/O: the event store feeds it events and stores its answers.
"""

from streamrep.matrix.errors import (
    AuthRejection,
    MalformedEventError,
    RejectionReason,
    StateResolutionError,
    UnknownRoomVersionError,
)
from streamrep.matrix.events import MatrixEvent, parse_event
from streamrep.matrix.room_builder import RoomBuilder
from streamrep.matrix.room_versions import ROOM_VERSIONS, RoomVersion, StateResAlgorithm, room_version

__all__ = [
    "AuthRejection",
    "MalformedEventError",
    "RejectionReason",
    "StateResolutionError",
    "UnknownRoomVersionError",
    "MatrixEvent",
    "parse_event",
    "ROOM_VERSIONS",
    "RoomVersion",
    "StateResAlgorithm",
    "room_version",
    "RoomBuilder",
]
