"""Room history visibility: whether a user may see an event (Client-Server API,
"Room History Visibility"), evaluated on the room's state at the event.

The event store supplies, for a user and an event, the setting and the user's
membership in the state at the event, and whether the user joined the room at any
point after it; :func:`may_see` applies the rule:

* ``world_readable``: allowed;
* the user's membership at the event is ``join``: allowed;
* ``shared``: allowed when the user joined at any point after the event;
* ``invited``: allowed when the user's membership at the event is ``invite``;
* ``joined``: only members at the event.

A user's own membership events and changes of the setting are allowed when the
state before or after them allows (the caller asks with each); a setting streamrep
does not know counts as ``shared``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VISIBILITY_LEVELS", "DEFAULT_VISIBILITY", "normalise_visibility",
           "more_permissive", "may_see"]

#: Most permissive first.
VISIBILITY_LEVELS = ("world_readable", "shared", "invited", "joined")
#: The setting of a room without an ``m.room.history_visibility`` event, and of one
#: whose event names a value not listed above.
DEFAULT_VISIBILITY = "shared"

_RANK = {v: i for i, v in enumerate(VISIBILITY_LEVELS)}


def normalise_visibility(content: Any) -> str:
    """The setting an ``m.room.history_visibility`` event's content names (unknown
    values count as ``shared``)."""
    value = content.get("history_visibility") if isinstance(content, dict) else None
    return value if value in _RANK else DEFAULT_VISIBILITY


def more_permissive(a: str, b: str) -> str:
    """The more permissive of two settings."""
    return a if _RANK[a] <= _RANK[b] else b


def may_see(setting: str, membership: str | None, joined_after: bool) -> bool:
    """The rule (see the module docstring) for one user and one event: *setting* and
    *membership* in the state at the event, *joined_after* whether the user joined
    the room at any point after it."""
    if setting == "world_readable" or membership == "join":
        return True
    if setting == "invited":
        return membership == "invite"
    if setting == "joined":
        return False
    return joined_after  # shared, or a setting streamrep does not know
