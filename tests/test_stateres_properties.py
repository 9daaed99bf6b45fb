"""Properties of state resolution over random forked rooms, and the reference's view."""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep.matrix import auth
from streamrep.matrix.authindex import AuthIndex
from streamrep.matrix.errors import AuthRejection, StateResolutionError
from streamrep.matrix.room_versions import ROOM_VERSIONS, StateResAlgorithm, room_version
from streamrep.matrix.stateres import InMemoryEventSource, resolve_state, v2

from support import stateres_build as build
from support.stateres_random import forked_room
from support.stateres_reference import run_oracle

VERSIONS = sorted(ROOM_VERSIONS, key=int)
cases = st.builds(forked_room, st.sampled_from(VERSIONS), st.integers(0, 10**6),
                  members=st.integers(3, 8), forks=st.integers(2, 4),
                  per_fork=st.integers(1, 8))


@settings(max_examples=60, deadline=None)
@given(cases, st.randoms(use_true_random=False))
def test_order_of_state_sets_does_not_matter(case: dict[str, Any], rnd: Any) -> None:
    shuffled = list(case["state_sets"])
    rnd.shuffle(shuffled)
    assert build.explicit_state(dict(case, state_sets=shuffled)) == build.explicit_state(case)


@settings(max_examples=40, deadline=None)
@given(cases)
def test_a_single_state_resolves_to_itself(case: dict[str, Any]) -> None:
    one = case["state_sets"][:1]
    assert build.as_rows(build.explicit_state(dict(case, state_sets=one))) == sorted(one[0])
    twice = one * 2
    assert build.as_rows(build.explicit_state(dict(case, state_sets=twice))) == sorted(one[0])


@settings(max_examples=60, deadline=None)
@given(cases)
def test_resolved_events_pass_auth_and_rejected_never_win(case: dict[str, Any]) -> None:
    room, source, id_of = build.explicit_source(case)
    version = room_version(case["room_version"])
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    resolved = resolve_state(room, version, sets, source)
    events = build.events_by_id(source)
    unconflicted = set.intersection(*(set(s.items()) for s in sets))
    for key, event_id in resolved.items():
        if (key, event_id) in unconflicted:
            continue
        assert key == events[event_id].key
        if version.state_res is not StateResAlgorithm.V1:
            assert not source.is_rejected(event_id), (key, event_id)
            # Not rejected means it passed the rules against its own auth events.
            auth.authorize(events[event_id], version, events, source.rejected)


@settings(max_examples=80, deadline=None)
@given(cases)
def test_the_unconflicted_state_asked_about_or_walked_gives_one_answer(
        case: dict[str, Any]) -> None:
    # The auth difference asks about the few events concerned whether the
    # unconflicted state's chain holds them; past its limit it numbers and walks the
    # whole unconflicted state instead. Both find the same events, and resolve alike.
    room, source, id_of = build.explicit_source(case)
    version = room_version(case["room_version"])
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    split = v2._Split(sets, lambda _: None, source.index.differing_events(sets))
    # The core's split agrees with the split by lookups that sources without an
    # index get.
    by_lookups = v2._Split(sets, lambda _: None)
    assert (split.differing, split.per_set) == (by_lookups.differing, by_lookups.per_set)
    asked = source.index.auth_chain_difference_beside(
        split.per_set, split.base, split.differing, 10_000)
    _, numbers = source.index.split_state_sets(sets)
    assert asked == source.index.auth_chain_difference(split.per_set, common_numbers=numbers)
    resolved = resolve_state(room, version, sets, source)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AuthIndex, "auth_chain_difference_beside", lambda *args: None)
        source.clear_derived()
        assert resolve_state(room, version, sets, source) == resolved


def test_events_of_another_room_are_refused() -> None:
    case = forked_room("10", 7, forks=2, per_fork=3)
    room, source, id_of = build.explicit_source(case)
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    assert len({frozenset(s.items()) for s in sets}) > 1, "the room must have a conflict to resolve"
    with pytest.raises(StateResolutionError, match="belongs to room"):
        resolve_state("!elsewhere:example.org", room_version("10"), sets, source)


def test_a_source_of_two_rooms_resolves_each_and_refuses_mixing() -> None:
    case = forked_room("10", 7, forks=2, per_fork=3)
    room, source, id_of = build.explicit_source(case)
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    alone = resolve_state(room, room_version("10"), sets, source)
    # The same events again under other IDs, in another room, held by the same source.
    other = "!other:example.org"
    for event in list(source.events.values()):
        source.add(dataclasses.replace(event, event_id=event.event_id + "-b", room_id=other))
    source.clear_derived()
    assert resolve_state(room, room_version("10"), sets, source) == alone
    conflicted = next(k for k in sets[0] if sets[0][k] != sets[1].get(k))
    foreign = sets[1][conflicted] + "-b"
    mixed = [sets[0], {**sets[1], conflicted: foreign}]
    with pytest.raises(StateResolutionError,
                       match=re.escape(f"event {foreign} belongs to room {other}, not {room}")):
        resolve_state(room, room_version("10"), mixed, source)


def test_empty_input_resolves_to_empty_state() -> None:
    assert resolve_state("!r:x", room_version("12"), [], InMemoryEventSource()) == {}


def test_rejections_are_typed() -> None:
    case = forked_room("11", 3, forks=3, per_fork=8)
    room, source, _ = build.explicit_source(case)
    events = build.events_by_id(source)
    seen = 0
    for spec in case["events"]:
        if spec.get("rejected"):
            event = events[build.event_id_for(spec["id"], "11")]
            with pytest.raises(AuthRejection) as info:
                auth.authorize(event, room_version("11"), events, source.rejected)
            assert info.value.reason.value
            seen += 1
    assert seen > 0


def test_reference_agrees_on_random_forked_rooms() -> None:
    generated = [forked_room(v, seed, members=6, forks=forks, per_fork=7)
                 for v, seed, forks in itertools.product(
                     ["1", "2", "6", "8", "10", "11", "12"], range(6), [2, 3])]
    answers = run_oracle({"explicit": generated})
    for case in generated:
        mine = build.as_rows(build.explicit_state(case))
        assert answers["explicit"][case["name"]] == mine, case["name"]
