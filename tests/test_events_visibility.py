"""History visibility as the specification states it (Client-Server API, "Room History
Visibility"), evaluated on the room's DAG state at each event, restated as cases over
forked DAGs and checked through ``paginate_back`` and the sync answers, on SQLite and
PostgreSQL (``db_url``).

The rule: ``world_readable`` allows; a user joined at the event is allowed; under
``shared``, a user who joined at any point after the event is allowed; under
``invited``, a user invited at the event is allowed; a user's own membership events
and changes of the setting are allowed when the state before or after them allows;
an unknown setting counts as ``shared``."""

from __future__ import annotations

from typing import Any

import pytest

from streamrep import EventStore
from streamrep.matrix.room_builder import RoomBuilder

ANN, BOB, CAT, DAN, EVE = (f"@{n}:v.org" for n in ("ann", "bob", "cat", "dan", "eve"))


class Room:
    """A version 10 room built event by event, persisted as it goes, with names for
    the events."""

    def __init__(self, store: EventStore, setting: str, room_id: str = "!vis:v.org") -> None:
        self.store = store
        self.r = RoomBuilder(room_id, ANN, "10")
        self.ids: dict[str, str] = {}
        self._persist("create", self.r.create)
        self.state("ann", "m.room.member", {"membership": "join"}, ANN)
        self.state("power", "m.room.power_levels", {"users": {ANN: 100}, "invite": 0}, "")
        self.state("rules", "m.room.join_rules", {"join_rule": "public"}, "")
        self.state("hv", "m.room.history_visibility", {"history_visibility": setting}, "")

    @property
    def room_id(self) -> str:
        return self.r.room_id

    def _persist(self, name: str, event: dict[str, Any]) -> str:
        result = self.store.persist_events([event])
        assert result.rejected == {}, (name, result.rejected)
        self.ids[name] = event["event_id"]
        return event["event_id"]

    def msg(self, name: str, sender: str = ANN, prev: list[str] | None = None,
            advance: bool = True) -> str:
        return self._persist(name, self.r.event(
            "m.room.message", sender, {"msgtype": "m.text", "body": name},
            prev=self._ids(prev), advance=advance))

    def member(self, name: str, user: str, membership: str, sender: str | None = None,
               prev: list[str] | None = None, advance: bool = True) -> str:
        return self._persist(name, self.r.event(
            "m.room.member", sender or user, {"membership": membership}, state_key=user,
            prev=self._ids(prev), advance=advance))

    def state(self, name: str, etype: str, content: dict[str, Any], state_key: str,
              sender: str = ANN) -> str:
        return self._persist(name, self.r.event(etype, sender, content, state_key=state_key))

    def merge(self, *names: str) -> None:
        self.r.merge(self._ids(list(names)) or [])

    def _ids(self, names: list[str] | None) -> list[str] | None:
        return None if names is None else [self.ids[n] for n in names]

    def seen_by(self, user: str) -> set[str]:
        """The names of the events *user* gets back paginating from the room's end,
        checked against what sync gives them."""
        back = {self._name(e.event_id) for e in _paginate_all(self.store, self.room_id, user)}
        synced = {self._name(e.event_id) for e in self.store.get_new_events_for_user(
            user, "s0", limit=1000).events if e.room_id == self.room_id}
        membership = self.store.get_current_state(self.room_id).get(("m.room.member", user))
        if membership is not None and self.store.get_event(membership).membership == "join":
            assert synced == back, (user, synced ^ back)
        else:
            assert synced <= back, (user, synced - back)  # sync covers rooms they are in
        return back

    def _name(self, event_id: str) -> str:
        return next(n for n, e in self.ids.items() if e == event_id)


def _paginate_all(store: EventStore, room_id: str, user: str) -> list[Any]:
    out: list[Any] = []
    token = None
    while True:
        page, token = store.paginate_back(room_id, user, token, limit=3)
        out.extend(page)
        if token is None:
            return out


#: The room's first events: shared (the default) until "hv" sets the room's setting,
#: which is seen under the more permissive of shared and the new one.
SETUP = {"create", "ann", "power", "rules", "hv"}


@pytest.fixture
def store(db_url: str) -> Any:
    s = EventStore(db_url, verify_event_ids="strict")
    yield s
    s.close()


def test_a_message_concurrent_with_a_leave_follows_the_state_at_it(store: EventStore) -> None:
    room = Room(store, "joined")
    room.member("bob", BOB, "join")
    room.msg("before")
    # A fork: Bob leaves on one branch, Ann writes on the other. In the state at
    # Ann's message Bob is still joined, whatever the depth order says.
    room.member("bob_leaves", BOB, "leave", prev=["before"], advance=False)
    room.msg("concurrent", prev=["before"], advance=False)
    room.merge("bob_leaves", "concurrent")
    room.msg("after")
    # (The room was shared, the default, until its setting arrived: Bob joined after.)
    assert room.seen_by(BOB) == SETUP | {"bob", "before", "bob_leaves", "concurrent"}


def test_a_message_concurrent_with_a_join_does_not_leak(store: EventStore) -> None:
    room = Room(store, "joined")
    room.msg("before")
    room.member("cat", CAT, "join", prev=["before"], advance=False)
    room.msg("concurrent", prev=["before"], advance=False)
    room.merge("cat", "concurrent")
    room.msg("after")
    assert room.seen_by(CAT) == SETUP | {"cat", "after"}


def test_shared_history_is_seen_by_who_joined_later_then_left_or_was_banned(
        store: EventStore) -> None:
    room = Room(store, "shared")
    room.msg("old")
    room.member("dan", DAN, "join")
    room.msg("with_dan")
    room.member("dan_leaves", DAN, "leave")
    room.msg("without_dan")
    room.member("eve", EVE, "join")
    room.member("eve_banned", EVE, "ban", sender=ANN)
    room.msg("after_ban")
    everything_before = SETUP | {"old", "dan", "with_dan"}
    assert room.seen_by(DAN) == everything_before | {"dan_leaves"}
    assert room.seen_by(EVE) == everything_before | {"dan_leaves", "without_dan", "eve",
                                                     "eve_banned"}
    # Never joined: nothing but what world_readable would give (nothing here).
    assert room.seen_by(CAT) == set()


def test_invited_history_from_the_invite_on(store: EventStore) -> None:
    room = Room(store, "invited")
    room.msg("before_invite")
    room.member("invite_cat", CAT, "invite", sender=ANN)
    room.msg("while_invited")
    room.member("cat_declines", CAT, "leave")
    room.msg("after_decline")
    # The invite is hers and allowed by the state after it; so is her leave, by the
    # state before it (invited). Messages only while invited.
    assert room.seen_by(CAT) == {"invite_cat", "while_invited", "cat_declines"}


@pytest.mark.parametrize("setting, sees_invite", [("joined", False), ("invited", True),
                                                  ("shared", False),
                                                  ("world_readable", True)])
def test_own_membership_events_need_the_state_before_or_after_to_allow(
        store: EventStore, setting: str, sees_invite: bool) -> None:
    room = Room(store, setting)
    room.member("invite_bob", BOB, "invite", sender=ANN)
    seen = room.seen_by(BOB)
    assert ("invite_bob" in seen) is sees_invite
    room.member("bob_joins", BOB, "join")
    seen = room.seen_by(BOB)
    # His join is allowed by the state after it; under shared and world_readable the
    # whole history, the invite included, now is too.
    assert "bob_joins" in seen
    assert ("invite_bob" in seen) is (setting != "joined")


def test_an_unknown_setting_counts_as_shared(store: EventStore) -> None:
    room = Room(store, "members_and_friends")
    room.msg("old")
    room.member("bob", BOB, "join")
    assert room.seen_by(BOB) == SETUP | {"old", "bob"}
    assert store.get_event(room.ids["old"]).history_visibility == "shared"


def test_a_change_of_setting_is_seen_under_the_more_permissive_one(store: EventStore) -> None:
    room = Room(store, "joined")
    room.msg("members_only")
    room.state("opened", "m.room.history_visibility", {"history_visibility": "world_readable"},
               "")
    room.msg("public")
    room.state("closed", "m.room.history_visibility", {"history_visibility": "joined"}, "")
    room.msg("members_only_again")
    assert room.seen_by(CAT) == {"opened", "public", "closed"}
