"""History visibility against a real reference homeserver.

A reference homeserver (matrix-synapse, its own venv, never imported) runs a seeded
workload (``support/visibility_workload.py``): 8 users in rooms of versions 10, 11
and 12, the history visibility switched among its four settings, invites accepted
late or declined, joins, leaves, kicks, bans, unbans and rejoins, and concurrent
bursts that fork the DAG. Its events, read from its database in the order it
persisted them, go into an ``EventStore`` as the deployment's own history (under
``verify_event_ids="strict"``: every ID and content hash the reference computed must
match). Then, for every user and every event of every room, ``paginate_back`` must
agree with the specification's rule applied to the reference's own DAG state at the
event, and for the users in a room at the end with the reference's ``/messages``.
"""

from __future__ import annotations

import pathlib
from typing import Any
from urllib.parse import quote

from streamrep import EventStore
from streamrep.matrix.visibility import may_see, more_permissive, normalise_visibility
from support.redis_server import own_redis_server, unique_server_name
from support.reference_homeserver import Homeserver, running_homeserver
from support.visibility_workload import StoredHistory, Workload, read_history

HV = ("m.room.history_visibility", "")
STEPS = 90


def _membership(history: StoredHistory, event_id: str | None) -> str | None:
    if event_id is None:
        return None
    membership = history.bodies[event_id].get("content", {}).get("membership")
    return membership if isinstance(membership, str) else None


def _setting(history: StoredHistory, state: dict[tuple[str, str], str]) -> str:
    event_id = state.get(HV)
    return "shared" if event_id is None else normalise_visibility(
        history.bodies[event_id].get("content"))


def expected_visible(history: StoredHistory, user: str) -> set[str]:
    """The rule on the reference's state: after each event, and before it (the state
    after its prev event) for the user's own memberships and changes of the setting."""
    joins = [history.places[e] for e, body in history.bodies.items()
             if body.get("type") == "m.room.member" and body.get("state_key") == user
             and _membership(history, e) == "join"]
    latest_join = max(joins, default=None)
    key = ("m.room.member", user)
    out = set()
    for event_id, body in history.bodies.items():
        after = history.state_after[event_id]
        prevs = history.prevs[event_id]
        before = history.state_after.get(prevs[0], {}) if len(prevs) == 1 else None
        setting = _setting(history, after)
        if (body.get("type"), body.get("state_key")) == HV and before is not None:
            setting = more_permissive(setting, _setting(history, before))
        joined_after = latest_join is not None and latest_join > history.places[event_id]
        memberships = [_membership(history, after.get(key))]
        if body.get("type") == "m.room.member" and body.get("state_key") == user:
            memberships.append(_membership(history, before.get(key)) if before else None)
        if any(may_see(setting, m, joined_after) for m in memberships):
            out.add(event_id)
    return out


def _paginate(store: EventStore, room_id: str, user: str) -> set[str]:
    seen: set[str] = set()
    token = None
    while True:
        page, token = store.paginate_back(room_id, user, token, limit=50)
        seen.update(e.event_id for e in page)
        if token is None:
            return seen


def _reference_messages(hs: Homeserver, token: str, room_id: str) -> set[str]:
    seen: set[str] = set()
    start = ""
    while True:
        answer: dict[str, Any] = hs.request(
            "GET", f"/_matrix/client/v3/rooms/{quote(room_id)}/messages?dir=b&limit=100"
            + (f"&from={quote(start)}" if start else ""), None, token)
        seen.update(e["event_id"] for e in answer.get("chunk", []))
        if not answer.get("chunk") or "end" not in answer:
            return seen
        start = answer["end"]


def test_paginate_back_follows_the_rule_on_the_references_dag_state(
        tmp_path: pathlib.Path) -> None:
    redis_server = own_redis_server()
    try:
        with running_homeserver(str(tmp_path / "hs"), redis_server.url,
                                unique_server_name("vis")) as hs:
            workload = Workload(hs, seed=31)
            plays = [(workload.create_room("10", True), True),
                     (workload.create_room("11", False), False),
                     (workload.create_room("12", True), True)]
            for step in range(STEPS):
                for play, public in plays:
                    workload.step(play, step, public)
            histories = [read_history(hs.database, play.room_id) for play, _ in plays]
            reference_seen = {(play.room_id, user): _reference_messages(hs, token, play.room_id)
                              for play, _ in plays for user, token in workload.tokens.items()
                              if user in play.joined}
        _compare(tmp_path, workload, histories, reference_seen)
    finally:
        redis_server.stop()


def _compare(tmp_path: pathlib.Path, workload: Workload, histories: list[StoredHistory],
             reference_seen: dict[tuple[str, str], set[str]]) -> None:
    store = EventStore(f"sqlite:///{tmp_path}/store.db", verify_event_ids="strict")
    try:
        for history in histories:
            for i in range(0, len(history.events), 20):
                result = store.persist_events(history.events[i:i + 20])
                assert result.rejected == {}, result.rejected
        forks = sum(1 for h in histories for prevs in h.prevs.values() if len(prevs) > 1)
        assert forks > 0, "the workload did not fork the DAG"
        total = sum(len(h.events) for h in histories)
        assert total > 150
        assert not any(e.soft_failed for h in histories
                       for e in store.get_events([i for i, _ in h.events]).values())
        cases = disagreements = 0
        for history in histories:
            for user in workload.tokens:
                expected = expected_visible(history, user)
                seen = _paginate(store, history.room_id, user)
                cases += len(history.events)
                wrong = seen ^ expected
                disagreements += len(wrong)
                assert not wrong, (history.version, user, sorted(wrong)[:5])
                reference = reference_seen.get((history.room_id, user))
                if reference is not None:
                    # Users in the room at the end: the reference's own answer agrees.
                    assert reference == seen, (history.version, user, reference ^ seen)
        assert cases >= 8 * 150 and disagreements == 0
    finally:
        store.close()
