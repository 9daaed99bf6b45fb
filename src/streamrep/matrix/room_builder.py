"""Building a Matrix room's events as a homeserver would (pure: no IO).

:class:`RoomBuilder` hands out events in the event store's input form (an
``event_id`` key beside the event's own fields), each with the ``prev_events``,
``depth`` and ``auth_events`` that the authorization rules of the room's version
expect, its content hash (``hashes.sha256``) and, from room version 3 on, the event
ID its reference hash gives; so everything it builds passes
``EventStore(..., verify_event_ids="strict")``. It keeps the state after every
event it made, so an event citing several prev events picks its auth events from
the state they lead to. Where prev events disagree on a key, the prev event listed
last wins: callers that fork on the keys auth events come from (power levels, join
rules, memberships) name the state to cite with ``state=``.

The demo's workload, the benchmarks and the tests build their rooms with it; see
``docs/events.md`` ("Building rooms").
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from streamrep.matrix import auth
from streamrep.matrix.eventformat import (content_hash, event_id_for, ids_are_hashes,
                                          reference_hash)
from streamrep.matrix.events import CREATE, StateKey, parse_event, room_id_for_create_event
from streamrep.matrix.room_versions import RoomVersion, room_version

__all__ = ["RoomBuilder"]


class RoomBuilder:
    """One room's events, starting with its create event (see the module docstring).

    ``room_id`` is ignored for versions whose room ID derives from the create event
    (12 on). Event IDs are the events' reference hashes from version 3 on, and
    ``$<n>:<creator's server>`` in versions 1 and 2; ``event_id`` (a function of a
    running number) replaces them with IDs of the caller's own, which then do not
    match the events' hashes.
    """

    def __init__(self, room_id: str, creator: str, version_id: str = "10", *,
                 event_id: Callable[[int], str] | None = None,
                 create_content: Mapping[str, Any] | None = None,
                 first_ts: int = 1_700_000_000_000) -> None:
        self.version: RoomVersion = room_version(version_id)
        self.creator = creator
        self.server = creator.partition(":")[2]
        self._event_id = event_id
        self._count = 0
        self._ts = first_ts
        #: event ID -> the state after it: ``{(type, state_key): event_id}`` (events
        #: that change no state share their prev event's)
        self.state_after: dict[str, Mapping[StateKey, str]] = {}
        self.depth_of: dict[str, int] = {}
        #: event ID -> its reference hash (unpadded Base64), which versions 1 and 2
        #: write beside each ID in ``prev_events`` and ``auth_events``
        self.reference_hashes: dict[str, str] = {}
        #: the events no later event names as a prev event (the room's tips)
        self.extremities: list[str] = []
        content: dict[str, Any] = {"room_version": version_id}
        if not self.version.implicit_room_creator:
            content["creator"] = creator
        content.update(create_content or {})
        self.room_id = room_id
        self.create = self.event(CREATE, creator, content, state_key="", prev=[])
        if self.version.room_id_from_create_event:
            self.room_id = room_id_for_create_event(self.create["event_id"])

    def _chosen_id(self) -> str | None:
        """The next event's ID when it is not derived from the event."""
        self._count += 1
        if self._event_id is not None:
            return self._event_id(self._count)
        if ids_are_hashes(self.version):
            return None
        return f"${self._count}:{self.server}"

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
        events of *state* (default: the state at *prev*), with its content hash
        and (unless *event_id* names one) its ID. *extra* fields join the event's
        own before it is hashed. With *advance* its prev events stop being
        extremities and it becomes one."""
        prev_events = list(self.extremities if prev is None else prev)
        if event_id is None:
            event_id = self._chosen_id()
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
        body["auth_events"] = self._auth_events(
            parse_event(event_id or "$probe", body, self.version), before)
        if self.version.event_ids_have_domain:
            body["prev_events"] = self._with_hashes(prev_events)
        event_id = self._seal(body, event_id)
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

    def _auth_events(self, probe: Any, before: Mapping[StateKey, str]) -> list[Any]:
        """The auth events *probe* (the event being built) cites from *before*, in
        the version's form."""
        cited = sorted(before[k] for k in auth.auth_types_for_event(probe, self.version)
                       if k in before)
        if self.version.room_id_from_create_event:
            # Version 12: the room ID names the create event; it is not listed.
            cited = [c for c in cited if c != before.get((CREATE, ""))]
        return self._with_hashes(cited) if self.version.event_ids_have_domain else cited

    def _with_hashes(self, event_ids: Sequence[str]) -> list[list[Any]]:
        """Versions 1 and 2: ``[event_id, {"sha256": reference hash}]`` pairs."""
        return [[e, {"sha256": self.reference_hashes[e]} if e in self.reference_hashes else {}]
                for e in event_ids]

    def _seal(self, body: dict[str, Any], event_id: str | None) -> str:
        """Add *body*'s content hash; return its ID (*event_id*, else derived)."""
        version = self.version
        hashed = body if event_id is None or ids_are_hashes(version) else {
            "event_id": event_id, **body}  # versions 1 and 2 hash the ID with the event
        body["hashes"] = {"sha256": content_hash(hashed, version)}
        if event_id is None:
            event_id = event_id_for(body, version)
            self.reference_hashes[event_id] = reference_hash(body, version)
        else:
            hashed["hashes"] = body["hashes"]
            self.reference_hashes[event_id] = reference_hash(hashed, version)
        return event_id

    def merge(self, event_ids: Sequence[str]) -> None:
        """Make *event_ids* (events of a fork) the extremities together."""
        self.extremities = list(event_ids)
