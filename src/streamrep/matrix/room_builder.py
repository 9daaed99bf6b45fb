"""Building a Matrix room's events as a client-side server would (pure: no IO).

:class:`RoomBuilder` hands out events in the event store's input form (an
``event_id`` key beside the event's own fields), each with the ``prev_events``,
``depth`` and ``auth_events`` that the authorization rules of the room's version
expect. It keeps the state after every event it made, so an event citing several
prev events picks its auth events from the state they lead to. Where prev events
disagree on a key, the prev event listed last wins: callers that fork on the keys
auth events come from (power levels, join rules, memberships) name the state to
cite with ``state=``.

The demo's workload, the benchmarks and the tests build their rooms with it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from streamrep.matrix import auth
from streamrep.matrix.events import CREATE, StateKey, parse_event, room_id_for_create_event
from streamrep.matrix.room_versions import RoomVersion, room_version

__all__ = ["RoomBuilder"]


class RoomBuilder:
    """One room's events, starting with its create event (see the module docstring).

    ``room_id`` is ignored for versions whose room ID derives from the create event
    (12 on); ``event_id`` turns a running number into an event ID (by default
    ``$<n>``, or ``$<n>:<creator's server>`` where event IDs carry a server name).
    """

    def __init__(self, room_id: str, creator: str, version_id: str = "10", *,
                 event_id: Callable[[int], str] | None = None,
                 create_content: Mapping[str, Any] | None = None,
                 first_ts: int = 1_700_000_000_000) -> None:
        self.version: RoomVersion = room_version(version_id)
        self.creator = creator
        server = creator.partition(":")[2]
        if event_id is None:
            def event_id(n: int) -> str:
                return f"${n}:{server}" if self.version.event_ids_have_domain else f"${n}"
        self._event_id = event_id
        self._count = 0
        self._ts = first_ts
        #: event ID -> the state after it: ``{(type, state_key): event_id}`` (events
        #: that change no state share their prev event's)
        self.state_after: dict[str, Mapping[StateKey, str]] = {}
        self.depth_of: dict[str, int] = {}
        #: the events no later event names as a prev event (the room's tips)
        self.extremities: list[str] = []
        content: dict[str, Any] = {"room_version": version_id}
        if not self.version.implicit_room_creator:
            content["creator"] = creator
        content.update(create_content or {})
        first_id = self._next_id()
        self.room_id = (room_id_for_create_event(first_id)
                        if self.version.room_id_from_create_event else room_id)
        self.create = self.event(CREATE, creator, content, state_key="", prev=[],
                                 event_id=first_id)

    def _next_id(self) -> str:
        self._count += 1
        return self._event_id(self._count)

    def state(self, prev: Sequence[str] | None = None) -> Mapping[StateKey, str]:
        """The state at *prev* (default: the room's extremities), merged as the
        module docstring says. Not to be modified (it may be an event's own)."""
        prevs = self.extremities if prev is None else prev
        if len(prevs) == 1:
            return self.state_after[prevs[0]]
        merged: dict[StateKey, str] = {}
        for p in prevs:
            merged.update(self.state_after[p])
        return merged

    def event(self, etype: str, sender: str, content: Mapping[str, Any], *,
              state_key: str | None = None, prev: Sequence[str] | None = None,
              event_id: str | None = None, state: Mapping[StateKey, str] | None = None,
              advance: bool = True, **extra: Any) -> dict[str, Any]:
        """The next event: on *prev* (default: the extremities), citing the auth
        events of *state* (default: the state at *prev*). With *advance* its prev
        events stop being extremities and it becomes one."""
        prev_events = list(self.extremities if prev is None else prev)
        event_id = event_id or self._next_id()
        at_prev = self.state(prev_events)
        before = at_prev if state is None else state
        self._ts += 1
        body: dict[str, Any] = {
            "room_id": self.room_id, "type": etype, "sender": sender,
            "content": dict(content), "prev_events": prev_events,
            "depth": max((self.depth_of[p] for p in prev_events if p in self.depth_of),
                         default=0) + 1,
            "origin_server_ts": self._ts,
        }
        if state_key is not None:
            body["state_key"] = state_key
        body.update(extra)
        if etype == CREATE and state_key == "" and self.version.room_id_from_create_event:
            del body["room_id"]  # the create event's ID defines it
        probe = parse_event(event_id, body, self.version)
        cited = sorted(before[k] for k in auth.auth_types_for_event(probe, self.version)
                       if k in before)
        if self.version.room_id_from_create_event:
            # Version 12: the room ID names the create event; it is not listed.
            cited = [c for c in cited if c != before.get((CREATE, ""))]
        body["auth_events"] = ([[c, {}] for c in cited] if self.version.event_ids_have_domain
                               else cited)
        if self.version.event_ids_have_domain:
            body["prev_events"] = [[p, {}] for p in prev_events]
        if state_key is not None:
            changed = dict(at_prev)
            changed[(etype, state_key)] = event_id
            self.state_after[event_id] = changed
        else:
            self.state_after[event_id] = at_prev
        self.depth_of[event_id] = body["depth"]
        if advance:
            self.extremities = [e for e in self.extremities if e not in prev_events]
            self.extremities.append(event_id)
        return {"event_id": event_id, **body}

    def merge(self, event_ids: Sequence[str]) -> None:
        """Make *event_ids* (events of a fork) the extremities together."""
        self.extremities = list(event_ids)
