"""Matrix state resolution: v1 (room version 1), v2 (2-11), v2.1 (12).

:func:`resolve_state` picks the algorithm from the room version. The events come
from an :class:`EventSource`; :class:`InMemoryEventSource` holds them in memory
with an auth chain index over the compiled core.
"""

from __future__ import annotations

from typing import Sequence

from streamrep.matrix.events import StateKey
from streamrep.matrix.room_versions import RoomVersion, StateResAlgorithm
from streamrep.matrix.stateres.common import StateMap
from streamrep.matrix.stateres.source import EventSource, InMemoryEventSource
from streamrep.matrix.stateres.v1 import resolve_v1
from streamrep.matrix.stateres.v2 import resolve_v2

__all__ = ["StateMap", "EventSource", "InMemoryEventSource", "resolve_state"]


def resolve_state(room_id: str, version: RoomVersion, state_sets: Sequence[StateMap],
                  source: EventSource) -> dict[StateKey, str]:
    """Resolve *state_sets* (each a map of ``(type, state_key)`` to event ID) of
    *room_id* into one state, with the algorithm of *version*."""
    if not state_sets:
        return {}
    if version.state_res is StateResAlgorithm.V1:
        return resolve_v1(room_id, version, state_sets, source)
    return resolve_v2(room_id, version, state_sets, source)
