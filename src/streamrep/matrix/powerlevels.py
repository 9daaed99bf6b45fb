"""Reading power levels: a user's level, the level an action or event type needs.

Before room version 10, values may be numeric strings (``"50"``) or floats, and are
read as integers; from version 10 the authorization rules admit only JSON integers
into a power levels event (see :mod:`streamrep.matrix.auth`). Reading is lenient in
every version; a value that cannot be read as an integer counts as absent. The
readers are those of the authorization rules' core module (``authrules``), so the
rules and their callers read levels one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from streamrep import _impl
from streamrep.matrix.auth import rules_for
from streamrep.matrix.events import MatrixEvent, StateKey
from streamrep.matrix.room_versions import RoomVersion

if TYPE_CHECKING:
    from streamrep._pure import authrules as _authrules
else:
    _authrules = _impl.load("authrules")

__all__ = [
    "CREATOR_POWER_LEVEL",
    "parse_level",
    "creators",
    "is_creator",
    "user_level",
    "named_level",
    "send_level",
]

#: Version 12 creators' level: above every level canonical JSON can express.
CREATOR_POWER_LEVEL: int = _authrules.CREATOR_POWER_LEVEL

#: *value* as a power level, or None when it is not one.
parse_level = _authrules.parse_level


def creators(create: MatrixEvent, version: RoomVersion) -> frozenset[str]:
    """The room's creators: the create event's sender (``content.creator`` before
    version 11), plus ``additional_creators`` from version 12."""
    return rules_for(version).creators(create)


def is_creator(user_id: str, create: MatrixEvent, version: RoomVersion) -> bool:
    """True when *user_id* is one of the room's creators (:func:`creators`, without
    building the set)."""
    return rules_for(version).is_creator(user_id, create)


def user_level(user_id: str, state: Mapping[StateKey, MatrixEvent], version: RoomVersion) -> int:
    """*user_id*'s power level in *state* (which must hold the create event)."""
    return rules_for(version).user_level(user_id, state)


def named_level(state: Mapping[StateKey, MatrixEvent], name: str, default: int,
                version: RoomVersion) -> int:
    """The level ``content[name]`` of the power levels in *state* (``ban``, ``kick``...)."""
    return rules_for(version).named_level(state, name, default)


def send_level(event_type: str, is_state: bool, state: Mapping[StateKey, MatrixEvent],
               version: RoomVersion) -> int:
    """The level needed to send an event of *event_type*.

    Without a power levels event, state events need 50 and other events 0, as the
    reference implementation reads the rules.
    """
    return rules_for(version).send_level(event_type, is_state, state)
