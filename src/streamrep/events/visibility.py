"""History visibility: computed once per event when it is persisted.

Each non-outlier event stores the room's ``m.room.history_visibility`` at the
event (the state before it; for a visibility change itself the more permissive
of the old and new setting). Whether a user may see the event then depends only
on that value, the user's membership at the event and whether the user is in the
room now, which :data:`VISIBLE_TO_USER_SQL` checks inside the reading queries.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEFAULT_VISIBILITY",
    "VISIBILITY_LEVELS",
    "more_permissive",
    "normalise_visibility",
    "visible_to_user",
    "VISIBLE_TO_USER_SQL",
]

#: Most permissive first.
VISIBILITY_LEVELS = ("world_readable", "shared", "invited", "joined")
#: The setting of a room without an ``m.room.history_visibility`` event.
DEFAULT_VISIBILITY = "shared"

_RANK = {v: i for i, v in enumerate(VISIBILITY_LEVELS)}


def normalise_visibility(content: Any) -> str:
    """The setting named by an ``m.room.history_visibility`` event's content;
    unknown values count as the strictest, ``joined``."""
    value = content.get("history_visibility") if isinstance(content, dict) else None
    return value if value in _RANK else "joined"


def more_permissive(a: str, b: str) -> str:
    return a if _RANK[a] <= _RANK[b] else b


def visible_to_user(visibility: str, membership_at_event: str | None,
                    currently_joined: bool, own_membership_event: bool) -> bool:
    """The visibility rule, in Python (the SQL below is the same rule)."""
    if visibility == "world_readable" or own_membership_event:
        return True
    if membership_at_event == "join":
        return True
    if visibility == "invited":
        return membership_at_event == "invite"
    if visibility == "shared":
        return currently_joined
    return False


# The user's membership at an event: their latest non-outlier membership event in
# the room at or before the event in topological order. Parameters: user_id.
MEMBERSHIP_AT_EVENT_SQL = (
    "(SELECT m.membership FROM room_memberships m"
    " WHERE m.room_id = e.room_id AND m.user_id = ? AND NOT m.outlier"
    " AND (m.topological_ordering < e.topological_ordering"
    "  OR (m.topological_ordering = e.topological_ordering"
    "      AND m.stream_ordering <= e.stream_ordering))"
    " ORDER BY m.topological_ordering DESC, m.stream_ordering DESC LIMIT 1)"
)

# Applied to a derived table carrying ``mem`` (MEMBERSHIP_AT_EVENT_SQL) beside the
# event's columns. Parameters: user_id (own membership event), currently_joined (0/1).
VISIBLE_TO_USER_SQL = (
    "(x.history_visibility = 'world_readable'"
    " OR (x.type = 'm.room.member' AND x.state_key = ?)"
    " OR x.mem = 'join'"
    " OR (x.history_visibility = 'invited' AND x.mem = 'invite')"
    " OR (x.history_visibility = 'shared' AND ? = 1))"
)
