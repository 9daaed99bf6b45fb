"""Reading power levels: a user's level, the level an action or event type needs.

Before room version 10, values may be numeric strings (``"50"``) or floats, and are
read as integers; from version 10 the authorization rules admit only JSON integers
into a power levels event (see :mod:`streamrep.matrix.auth`). Reading is lenient in
every version; a value that cannot be read as an integer counts as absent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from streamrep.matrix.events import CREATE, CREATE_KEY, POWER_LEVELS_KEY, MatrixEvent, StateKey
from streamrep.matrix.room_versions import RoomVersion

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
CREATOR_POWER_LEVEL = 2**53

_INT_STRING = re.compile(r"\s*[+-]?[0-9]+\s*\Z")
_MAX_DIGITS = 40


def parse_level(value: object, integers_only: bool = False) -> int | None:
    """*value* as a power level, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if integers_only:
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return int(value)
    if isinstance(value, str) and len(value) <= _MAX_DIGITS and _INT_STRING.match(value):
        return int(value)
    return None


def creators(create: MatrixEvent, version: RoomVersion) -> frozenset[str]:
    """The room's creators: the create event's sender (``content.creator`` before
    version 11), plus ``additional_creators`` from version 12."""
    if version.implicit_room_creator:
        found = {create.sender}
    else:
        creator = create.content.get("creator")
        found = {creator} if isinstance(creator, str) else set()
    if version.creator_power:
        extra = create.content.get("additional_creators")
        if isinstance(extra, list):
            found.update(x for x in extra if isinstance(x, str))
    return frozenset(found)


def is_creator(user_id: str, create: MatrixEvent, version: RoomVersion) -> bool:
    """True when *user_id* is one of the room's creators (:func:`creators`, without
    building the set)."""
    if version.implicit_room_creator:
        if user_id == create.sender:
            return True
    elif user_id == create.content.get("creator"):
        return True
    if version.creator_power:
        extra = create.content.get("additional_creators")
        # A JSON value other than a string never equals a user ID.
        return isinstance(extra, list) and user_id in extra
    return False


def _content(state: Mapping[StateKey, MatrixEvent]) -> Mapping[str, Any] | None:
    event = state.get(POWER_LEVELS_KEY)
    return event.content if event is not None else None


def user_level(user_id: str, state: Mapping[StateKey, MatrixEvent], version: RoomVersion) -> int:
    """*user_id*'s power level in *state* (which must hold the create event)."""
    create = state.get(CREATE_KEY)
    if version.creator_power and create is not None and is_creator(user_id, create, version):
        return CREATOR_POWER_LEVEL
    content = _content(state)
    if content is not None:
        users = content.get("users")
        if (type(users) is dict or isinstance(users, Mapping)) and user_id in users:
            level = parse_level(users[user_id])
            if level is not None:
                return level
        level = parse_level(content.get("users_default"))
        return level if level is not None else 0
    if create is not None and create.type == CREATE and is_creator(user_id, create, version):
        return 100
    return 0


def named_level(state: Mapping[StateKey, MatrixEvent], name: str, default: int,
                version: RoomVersion) -> int:
    """The level ``content[name]`` of the power levels in *state* (``ban``, ``kick``...)."""
    content = _content(state)
    if content is None:
        return default
    level = parse_level(content.get(name))
    return level if level is not None else default


def send_level(event_type: str, is_state: bool, state: Mapping[StateKey, MatrixEvent],
               version: RoomVersion) -> int:
    """The level needed to send an event of *event_type*.

    Without a power levels event, state events need 50 and other events 0, as the
    reference implementation reads the rules.
    """
    content = _content(state) or {}
    events = content.get("events")
    if (type(events) is dict or isinstance(events, Mapping)) and event_type in events:
        level = parse_level(events[event_type])
        if level is not None:
            return level
    if is_state:
        level = parse_level(content.get("state_default"))
        return level if level is not None else 50
    level = parse_level(content.get("events_default"))
    return level if level is not None else 0
