"""History visibility on the room's DAG state: what persisting records, and the
view readers filter timelines through (the rule is
:func:`streamrep.matrix.visibility.may_see`).

When an event is persisted the store records the setting in the state before it
(``events.history_visibility``; for a change of the setting, the more permissive of
the old and new one) and, for a membership event, the membership event of the same
user it replaces in that state (``room_memberships.replaces_state``).

:class:`UserView` answers for one user and room: the setting and the user's
membership at an event come from the state after it (its state group, read through
the state group cache; for any event but the user's own membership events and
changes of the setting, the state before and after agree on both), those two
kinds are allowed when the state before or after them allows, and "joined at any
point after the event" compares the event's place with the user's latest join in
the room.
"""

from __future__ import annotations

from typing import Any, Sequence

from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.events.resolver import StateKey
from streamrep.events.state import StateGroupStore
from streamrep.lru import Lru
from streamrep.matrix.visibility import (
    DEFAULT_VISIBILITY,
    VISIBILITY_LEVELS,
    may_see,
    more_permissive,
    normalise_visibility,
)

__all__ = ["DEFAULT_VISIBILITY", "VISIBILITY_LEVELS", "HISTORY_VISIBILITY_KEY", "UserView",
           "more_permissive", "normalise_visibility"]

HISTORY_VISIBILITY_KEY: StateKey = ("m.room.history_visibility", "")
_MEMBER = "m.room.member"


class UserView:
    """Whether *user_id* may see events of *room_id* (see the module docstring);
    *settings* caches each ``m.room.history_visibility`` event's setting."""

    def __init__(self, txn: Transaction, room_id: str, user_id: str, states: StateGroupStore,
                 settings: Lru[str, str]) -> None:
        self._txn = txn
        self._user_id = user_id
        self._states = states
        self._settings = settings
        self._member_key: StateKey = (_MEMBER, user_id)
        row = txn.fetchone(
            "SELECT topological_ordering, stream_ordering FROM room_memberships"
            " WHERE room_id = ? AND user_id = ? AND membership = ? AND NOT outlier"
            " ORDER BY topological_ordering DESC, stream_ordering DESC LIMIT 1",
            (room_id, user_id, "join"))
        #: The place of the user's latest join in the room's topological order.
        self._latest_join = (int(row[0]), int(row[1])) if row is not None else None
        # Per state group: (setting, the user's membership event) in its state.
        self._at_group: dict[int, tuple[str, str | None]] = {}
        self._memberships: dict[str, str | None] = {}

    def allows(self, event: Any, group: int | None, replaces: str | None) -> bool:
        """Whether the user may see *event* (a ``StoredEvent``), whose state group is
        *group* and which, when it is a membership event of the user, replaced the
        membership event *replaces* in the state before it."""
        setting, member_event = self._at(group)
        joined_after = self._latest_join is not None and self._latest_join > (
            event.topological_ordering, event.stream_ordering)
        if event.type == HISTORY_VISIBILITY_KEY[0] and event.state_key == "":
            # The setting before it or after it, whichever allows more.
            before_or_after = event.history_visibility
            if before_or_after in VISIBILITY_LEVELS:
                setting = more_permissive(setting, before_or_after)
        if event.type == _MEMBER and event.state_key == self._user_id:
            return may_see(setting, event.membership, joined_after) or may_see(
                setting, self._membership_of(replaces), joined_after)
        return may_see(setting, self._membership_of(member_event), joined_after)

    def prepare(self, groups: Sequence[int | None], replaced: Sequence[str | None]) -> None:
        """Read at once what :meth:`allows` will ask of *groups* and *replaced*."""
        members = [r for r in replaced if r is not None]
        for group in groups:
            members_at = self._at(group)[1]
            if members_at is not None:
                members.append(members_at)
        wanted = [m for m in set(members) if m not in self._memberships]
        for chunk in chunks(wanted):
            params: list[Any] = []
            for event_id, membership in self._txn.fetchall(
                    "SELECT event_id, membership FROM events WHERE "
                    + in_list(self._txn, "event_id", chunk, params), params):
                self._memberships[event_id] = membership
        for m in wanted:
            self._memberships.setdefault(m, None)

    def _at(self, group: int | None) -> tuple[str, str | None]:
        if group is None:
            return DEFAULT_VISIBILITY, None
        found = self._at_group.get(group)
        if found is None:
            state = self._states.load(self._txn, group)[0]
            setting_event = state.get(HISTORY_VISIBILITY_KEY)
            setting = self._setting(setting_event) if setting_event else DEFAULT_VISIBILITY
            found = self._at_group[group] = (setting, state.get(self._member_key))
        return found

    def _setting(self, event_id: str) -> str:
        setting = self._settings.get(event_id)
        if setting is None:
            stored = self._txn.fetchval(
                "SELECT history_visibility FROM room_history_visibility WHERE event_id = ?",
                (event_id,))
            setting = stored if stored in VISIBILITY_LEVELS else DEFAULT_VISIBILITY
            self._settings.put(event_id, setting)
        return setting

    def _membership_of(self, event_id: str | None) -> str | None:
        if event_id is None:
            return None
        if event_id not in self._memberships:
            self._memberships[event_id] = self._txn.fetchval(
                "SELECT membership FROM events WHERE event_id = ?", (event_id,))
        return self._memberships[event_id]
