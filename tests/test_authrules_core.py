"""The authorization rules core, compiled and pure: fixed cases, and the two
implementations agreeing on generated rooms (every answer, every rejection's reason
and detail, the power ordering and the iterative auth checks of state resolution)."""

from __future__ import annotations

import random
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from streamrep.matrix import auth
from streamrep.matrix.events import MatrixEvent
from streamrep.matrix.room_versions import ROOM_VERSIONS, room_version

from support import stateres_build as build
from support.auth_random import auth_case
from support.impls import IMPLEMENTATIONS, core_module
from support.stateres_random import forked_room

VERSIONS = sorted(ROOM_VERSIONS, key=int)
Key = tuple[str, str]


def rules(kind: str, version_id: str) -> Any:
    return core_module("authrules", kind).Rules(room_version(version_id),
                                                auth._third_party_invite_ok)


def room_events(case: dict[str, Any]) -> tuple[dict[str, MatrixEvent], dict[str, str], set[str]]:
    _, source, id_of = build.explicit_source(case)
    return dict(source.events), id_of, set(source.rejected)


def test_the_compiled_core_loaded() -> None:
    if "compiled" in IMPLEMENTATIONS:
        assert core_module("authrules", "compiled").__name__ == "streamrep._core.authrules"


@pytest.mark.parametrize("value, integers_only, expected", [
    (50, False, 50), (True, False, None), ("50", False, 50), (" -7 ", False, -7),
    ("50", True, None), (50.9, False, 50), (float("nan"), False, None), ("1_0", False, None),
    ("+ 5", False, None), ("9" * 41, False, None), (None, False, None), (2**80, True, 2**80),
])
def test_levels_are_read_as_the_rules_say(impl_kind: str, value: Any, integers_only: bool,
                                          expected: int | None) -> None:
    assert core_module("authrules", impl_kind).parse_level(value, integers_only) == expected


@pytest.mark.parametrize("value, expected", [
    ("@a:x", True), ("@:x", False), ("a:x", False), (5, False), ("@a" + "b" * 250 + ":x", True),
    ("@a" + "b" * 260 + ":x", False), ("@é" + "b" * 251 + ":x", False), ("@é" + "b" * 250 + ":x", True), ("@a:", True),
])
def test_user_ids_are_recognised(impl_kind: str, value: Any, expected: bool) -> None:
    assert core_module("authrules", impl_kind).is_user_id(value) is expected


def _states(events: dict[str, MatrixEvent], rnd: random.Random) -> list[dict[Key, MatrixEvent]]:
    """The room's last state events by key, and random sub- and mixed states of it."""
    latest: dict[Key, MatrixEvent] = {}
    every: list[MatrixEvent] = [e for e in events.values() if e.state_key is not None]
    for event in every:
        latest[event.key] = event
    out = [latest]
    for _ in range(3):
        state = {k: v for k, v in latest.items() if rnd.random() < 0.8}
        for event in rnd.sample(every, min(3, len(every))):
            state[event.key] = event
        out.append(state)
    return out


@pytest.mark.compiled_vs_pure
@pytest.mark.parametrize("version_id", VERSIONS)
def test_twins_agree_on_random_checks(version_id: str) -> None:
    compiled, pure = rules("compiled", version_id), rules("pure", version_id)
    compared = 0
    for seed in range(60):
        events, _, _ = room_events(auth_case(version_id, seed))
        rnd = random.Random(seed)
        users = sorted({e.sender for e in events.values()} | {"@nobody:x"})
        for state in _states(events, rnd):
            for event in events.values():
                assert compiled.auth_types(event) == pure.auth_types(event)
                if event.key == ("m.room.create", ""):
                    continue
                assert compiled.check(event, state) == pure.check(event, state), event
                compared += 1
            for user in users:
                assert compiled.user_level(user, state) == pure.user_level(user, state)
            for name in ("ban", "kick", "invite", "redact"):
                assert compiled.named_level(state, name, 50) == pure.named_level(state, name, 50)
            for etype, is_state in (("m.room.topic", True), ("m.room.message", False)):
                assert (compiled.send_level(etype, is_state, state)
                        == pure.send_level(etype, is_state, state))
    assert compared > 1000


def _power_events(events: dict[str, MatrixEvent]) -> list[str]:
    return [eid for eid, e in events.items()
            if e.key in {("m.room.power_levels", ""), ("m.room.join_rules", ""),
                         ("m.room.create", "")}
            or (e.type == "m.room.member" and e.membership in ("leave", "ban")
                and e.sender != e.state_key)]


@pytest.mark.compiled_vs_pure
@pytest.mark.parametrize("version_id", VERSIONS)
def test_twins_agree_on_ordering_and_iterative_checks(version_id: str) -> None:
    compiled, pure = rules("compiled", version_id), rules("pure", version_id)
    for seed in range(25):
        case = forked_room(version_id, seed, members=8, forks=3, per_fork=8)
        events, id_of, rejected = room_events(case)
        rnd = random.Random(seed)
        full = {e for e in events if rnd.random() < 0.7}
        power = [e for e in _power_events(events) if e in full]
        memos: list[dict[str, int]] = [{}, {}]
        orders = [r.power_order(power, full, events, memo)
                  for r, memo in zip((compiled, pure), memos)]
        assert orders[0] == orders[1]
        assert memos[0] == memos[1]
        ids = list(events)
        assert (compiled.sender_levels(ids, events, {}) == pure.sender_levels(ids, events, {}))
        levels = [e for e in ids if events[e].key == ("m.room.power_levels", "")]
        parents: list[dict[str, str | None]] = [{}, {}]
        for top in levels[-2:] + [None]:
            sample = rnd.sample(ids, len(ids) // 2)
            assert (compiled.mainline_order(sample, top, events, parents[0])
                    == pure.mainline_order(sample, top, events, parents[1]))
        assert parents[0] == parents[1]
        base: dict[Key, str] = {(t, k): id_of[n] for t, k, n in case["state_sets"][0]}
        hidden = {k for k in base if rnd.random() < 0.3}
        order = rnd.sample(ids, len(ids))
        checked = [e for e in order if events[e].state_key is not None and e not in rejected]
        results: list[dict[Key, str]] = []
        # Messages and rejected events in the order are passed over.
        for r, given in ((compiled, order), (pure, order), (pure, checked)):
            resolved: dict[Key, str] = {}
            r.check_in_order(given, events, resolved, base if seed % 2 else None, hidden,
                             rejected, lambda event: auth.create_allowed(
                                 event, room_version(version_id)))
            results.append(resolved)
        assert results[0] == results[1] == results[2]


class _PlainEvent:
    """An event of another class than ``MatrixEvent``: fields in an instance dict."""

    def __init__(self, event: MatrixEvent) -> None:
        for name in MatrixEvent.__slots__:
            setattr(self, name, getattr(event, name))


def _with_keys(events: dict[str, MatrixEvent], variant: str) -> dict[str, MatrixEvent]:
    """The room's events with the power ordering's keys made unusual: every timestamp
    equal (the event IDs break the ties), levels beyond 64 bits, timestamps beyond them."""
    if variant == "equal timestamps":
        return {eid: replace(e, origin_server_ts=1) for eid, e in events.items()}
    if variant == "levels beyond 64 bits":
        return {eid: replace(e, content={**e.content, "users": {
                    u: 2**70 + level for u, level in e.content.get("users", {}).items()}})
                if e.key == ("m.room.power_levels", "") else e for eid, e in events.items()}
    return {eid: replace(e, origin_server_ts=2**64 + e.origin_server_ts)
            for eid, e in events.items()}


@pytest.mark.compiled_vs_pure
@pytest.mark.parametrize("variant", ["equal timestamps", "levels beyond 64 bits",
                                     "timestamps beyond 64 bits"])
def test_twins_order_alike_whatever_the_keys(variant: str) -> None:
    compiled, pure = rules("compiled", "10"), rules("pure", "10")
    beyond = 0
    for seed in range(12):
        events, _, _ = room_events(forked_room("10", seed, members=8, forks=3, per_fork=8))
        events = _with_keys(events, variant)
        full, power = set(events), _power_events(events)
        levels = pure.sender_levels(list(events), events, {})
        beyond += sum(1 for level in levels.values() if level >= 2**63)
        orders = [r.power_order(power, full, events, {}) for r in (compiled, pure)]
        assert orders[0] == orders[1]
        assert set(power) <= set(orders[0]) and len(set(orders[0])) == len(orders[0])
        top = max((e for e in events if events[e].key == ("m.room.power_levels", "")),
                  key=lambda e: events[e].depth)
        mainlines = [r.mainline_order(list(events), top, events, {}) for r in (compiled, pure)]
        assert mainlines[0] == mainlines[1] and sorted(mainlines[0]) == sorted(events)
    assert (beyond > 0) == (variant == "levels beyond 64 bits")


def test_events_of_any_class_are_read_alike(impl_kind: str) -> None:
    checker = rules(impl_kind, "10")
    for seed in range(30):
        events, _, _ = room_events(auth_case("10", seed))
        plain = {eid: _PlainEvent(e) for eid, e in events.items()}
        for state in _states(events, random.Random(seed)):
            plain_state = {k: plain[e.event_id] for k, e in state.items()}
            for eid, event in events.items():
                if event.key == ("m.room.create", ""):
                    continue
                assert checker.auth_types(plain[eid]) == checker.auth_types(event)
                assert checker.check(plain[eid], plain_state) == checker.check(event, state)


def test_held_events_are_found_alike_and_left_unchanged(impl_kind: str) -> None:
    core = core_module("authrules", impl_kind)
    case = forked_room("12", 3, forks=3, per_fork=6)
    events, _, _ = room_events(case)
    before = {eid: {name: getattr(e, name) for name in MatrixEvent.__slots__}
              for eid, e in events.items()}
    order = sorted(events)
    room_id = events[order[0]].room_id
    checker = rules(impl_kind, "12")
    levels = checker.sender_levels(order, events, {})
    plain = {eid: _PlainEvent(e) for eid, e in events.items()}
    power = [eid for eid in order if _is_power(events[eid])]
    assert power and len(power) < len(order)
    # IDs held and not, any mapping, events of any class, nothing at all.
    for held, ids, expected in [
            (events, [*order, "$not-held", "$also-not"], (set(order), power, None)),
            (events, iter(order), (set(order), power, None)),
            (MappingProxyType(events), order, (set(order), power, None)),
            (plain, order, (set(order), power, None)),
            (events, (), (set(), [], None)), ({}, order, (set(), [], None))]:
        assert core.held_events(held, ids, room_id) == expected
    # An event of another room stops the pass there.
    third = order[2]
    assert core.held_events(events, order, "!elsewhere:x") == (set(), [], order[0])
    assert core.held_events({**events, third: replace(events[third], room_id="!other:x")},
                            order, room_id) == (
        set(order[:2]), [e for e in power if e in order[:2]], third)
    assert {eid: {name: getattr(e, name) for name in MatrixEvent.__slots__}
            for eid, e in events.items()} == before
    assert sorted(events) == order
    assert checker.sender_levels(order, events, {}) == levels


def _is_power(event: MatrixEvent) -> bool:
    """Power levels, join rules, create, or a kick or ban of another user (the
    specification's definition, written out here as the check of both twins)."""
    if event.state_key == "" and event.type in (
            "m.room.power_levels", "m.room.join_rules", "m.room.create"):
        return True
    return (event.type == "m.room.member" and event.membership in ("leave", "ban")
            and event.sender != event.state_key)
