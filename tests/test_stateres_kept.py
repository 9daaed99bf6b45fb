"""What a room's resolutions keep between them never changes a resolution's answer."""

from __future__ import annotations

from typing import Any

import pytest

from streamrep.matrix.room_versions import room_version
from streamrep.matrix.stateres import InMemoryEventSource, resolve_state
from streamrep.matrix.stateres.v2 import separate

from support import stateres_build as build
from support.stateres_random import forked_room


def _sets(case: dict[str, Any], id_of: dict[str, str]) -> list[dict[tuple[str, str], str]]:
    return [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]


def _fresh(source: InMemoryEventSource) -> InMemoryEventSource:
    return InMemoryEventSource(source.events.values(), source.rejected)


@pytest.mark.parametrize("version_id", ["6", "10", "12"])
def test_a_changed_rejection_is_seen_by_the_next_resolution(version_id: str) -> None:
    version = room_version(version_id)
    changed = 0
    for seed in range(8):
        case = forked_room(version_id, seed=seed, members=8, forks=3, per_fork=6)
        room, source, id_of = build.explicit_source(case)
        sets = _sets(case, id_of)
        before = resolve_state(room, version, sets, source)
        _, conflicted = separate(sets)
        for event_id in sorted(set().union(*conflicted.values())):
            event = source.events[event_id]
            source.add(event, rejected=not source.is_rejected(event_id))
            after = resolve_state(room, version, sets, source)
            assert after == resolve_state(room, version, sets, _fresh(source))
            changed += after != before
            source.add(event, rejected=not source.is_rejected(event_id))
            assert resolve_state(room, version, sets, source) == before
    # Flipping rejections changed some answers, so stale facts would have shown.
    assert changed


@pytest.mark.parametrize("version_id", ["10", "12"])
def test_auth_events_arriving_later_are_seen(version_id: str) -> None:
    version = room_version(version_id)
    for seed in range(6):
        case = forked_room(version_id, seed=seed, members=8, forks=2, per_fork=6)
        room, full, id_of = build.explicit_source(case)
        sets = _sets(case, id_of)
        expected = resolve_state(room, version, sets, full)
        # The same room with the power levels events held last.
        late = [e for e in full.events.values() if e.type == "m.room.power_levels"]
        source = InMemoryEventSource()
        for event in full.events.values():
            if event not in late:
                source.add(event, rejected=full.is_rejected(event.event_id))
        resolve_state(room, version, sets, source)
        for event in late:
            source.add(event, rejected=full.is_rejected(event.event_id))
        assert resolve_state(room, version, sets, source) == expected


def test_clear_derived_forgets_and_changes_nothing() -> None:
    version = room_version("10")
    case = forked_room("10", seed=3, members=8, forks=2, per_fork=6)
    room, source, id_of = build.explicit_source(case)
    sets = _sets(case, id_of)
    first = resolve_state(room, version, sets, source)
    assert source.derived_facts("10").sender_level
    source.clear_derived()
    assert not source.derived_facts("10").sender_level
    assert resolve_state(room, version, sets, source) == first
