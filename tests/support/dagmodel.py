"""A brute-force model of the event store, recomputed from everything stored.

It knows nothing about batching tricks, caches or state groups: extremities come
from all stored edges, the state after an event from its prev_events' states
(recursively), and visibility from the rule in docs/events.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamrep.events.resolver import DepthOrderResolver

VIS_RANK = {"world_readable": 0, "shared": 1, "invited": 2, "joined": 3}


@dataclass
class ModelEvent:
    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str
    depth: int
    prev_events: list[str]
    content: dict[str, Any]
    outlier: bool = False
    rejected: bool = False
    soft_failed: bool = False
    stream: int = 0
    known_prevs: list[str] = field(default_factory=list)

    @property
    def counts(self) -> bool:
        return not (self.outlier or self.rejected or self.soft_failed)


class DagModel:
    def __init__(self) -> None:
        self.events: dict[str, ModelEvent] = {}
        self.resolver = DepthOrderResolver()
        self._state_cache: dict[str, dict[tuple[str, str], str]] = {}

    def persist(self, batch: list[ModelEvent], orderings: dict[str, int]) -> None:
        """Record a batch as the store persisted it (orderings from the store)."""
        non_outlier_before = {e for e, ev in self.events.items() if not ev.outlier}
        in_batch = {ev.event_id for ev in batch if not ev.outlier}
        for ev in batch:
            old = self.events.get(ev.event_id)
            if old is not None and (not old.outlier or ev.outlier):
                continue  # already stored: a repeat changes nothing
            assert ev.event_id in orderings, ev.event_id
            ev.stream = orderings[ev.event_id]
            ev.known_prevs = [p for p in ev.prev_events
                              if p in non_outlier_before or p in in_batch]
            self.events[ev.event_id] = ev
        self._state_cache.clear()

    def room_events(self, room_id: str) -> list[ModelEvent]:
        return [ev for ev in self.events.values() if ev.room_id == room_id]

    def forward(self, room_id: str) -> set[str]:
        counted = [ev for ev in self.room_events(room_id) if ev.counts]
        referenced = {p for ev in counted for p in ev.prev_events}
        return {ev.event_id for ev in counted} - referenced

    def backward(self, room_id: str) -> set[str]:
        non_outliers = [ev for ev in self.room_events(room_id) if not ev.outlier]
        ids = {ev.event_id for ev in non_outliers}
        return {p for ev in non_outliers for p in ev.prev_events} - ids

    def _orderings(self) -> dict[str, tuple[int, int]]:
        return {e: (ev.depth, ev.stream) for e, ev in self.events.items()}

    def _resolve(self, room_id: str, sets: list[dict[tuple[str, str], str]]) -> dict:
        if not sets:
            return {}
        if len(sets) == 1:
            return dict(sets[0])
        return self.resolver.resolve(room_id, sets, self._orderings())

    def state_before(self, event_id: str) -> dict[tuple[str, str], str]:
        ev = self.events[event_id]
        return self._resolve(ev.room_id, [self.state_after(p) for p in ev.known_prevs])

    def state_after(self, event_id: str) -> dict[tuple[str, str], str]:
        cached = self._state_cache.get(event_id)
        if cached is not None:
            return cached
        ev = self.events[event_id]
        state = self.state_before(event_id)
        if ev.state_key is not None and not ev.rejected:
            state[(ev.type, ev.state_key)] = ev.event_id
        self._state_cache[event_id] = state
        return state

    def current_state(self, room_id: str) -> dict[tuple[str, str], str]:
        return self._resolve(room_id, [self.state_after(f) for f in sorted(self.forward(room_id))])

    def visibility_at(self, event_id: str) -> str:
        before = self.state_before(event_id)
        vis_id = before.get(("m.room.history_visibility", ""))
        vis = self._vis_value(vis_id) if vis_id else "shared"
        ev = self.events[event_id]
        if (ev.type, ev.state_key) == ("m.room.history_visibility", "") and not ev.rejected:
            own = self._vis_value(event_id)
            vis = vis if VIS_RANK[vis] <= VIS_RANK[own] else own
        return vis

    def _vis_value(self, event_id: str) -> str:
        value = self.events[event_id].content.get("history_visibility")
        return value if value in VIS_RANK else "shared"

    def _membership(self, event_id: str | None) -> str | None:
        return None if event_id is None else self.events[event_id].content["membership"]

    def visible_timeline(self, room_id: str, user_id: str) -> list[str]:
        """Every event the user may see, newest first in topological order: the
        specification's rule on the state at each event (the state before and after
        the user's own membership events), "joined after" by the user's latest join
        in topological order."""
        joins = [(m.depth, m.stream) for m in self.room_events(room_id)
                 if m.type == "m.room.member" and m.state_key == user_id and not m.outlier
                 and not m.rejected and not m.soft_failed
                 and m.content["membership"] == "join"]
        latest_join = max(joins) if joins else None
        key = ("m.room.member", user_id)
        out = []
        for ev in self.room_events(room_id):
            if ev.outlier or ev.rejected or ev.soft_failed:
                continue
            vis = self.visibility_at(ev.event_id)
            joined_after = latest_join is not None and latest_join > (ev.depth, ev.stream)
            if ev.type == "m.room.member" and ev.state_key == user_id:
                memberships = [ev.content["membership"],
                               self._membership(self.state_before(ev.event_id).get(key))]
            else:
                memberships = [self._membership(self.state_after(ev.event_id).get(key))]
            if any(_may_see(vis, m, joined_after) for m in memberships):
                out.append(ev)
        out.sort(key=lambda e: (e.depth, e.stream), reverse=True)
        return [e.event_id for e in out]


def _may_see(setting: str, membership: str | None, joined_after: bool) -> bool:
    """The specification's rule, restated (unknown settings count as shared)."""
    if setting == "world_readable" or membership == "join":
        return True
    if setting == "invited":
        return membership == "invite"
    if setting == "joined":
        return False
    return joined_after
