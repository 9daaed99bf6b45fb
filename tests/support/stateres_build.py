"""streamrep's side of the state resolution scenarios: events, sources, resolution."""

from __future__ import annotations

from typing import Any

from streamrep.matrix import auth
from streamrep.matrix.events import MatrixEvent, parse_event
from streamrep.matrix.room_versions import room_version
from streamrep.matrix.stateres import InMemoryEventSource, resolve_state

from support import stateres_scenarios as sc

ROOM = "!room:example.com"
V6 = room_version("6")


def event_id_for(node: str, version_id: str) -> str:
    """The event ID a scenario node gets in a room of *version_id*."""
    return f"${node}:example.com" if room_version(version_id).event_ids_have_domain else f"${node}"


def graph_state(doc: dict[str, Any], case: dict[str, Any]) -> dict[tuple[str, str], str]:
    """The END state's changed keys of a graph case, by node name."""
    version_id = case.get("room_version", "2")
    version = room_version(version_id)
    source = InMemoryEventSource()
    node_of: dict[str, str] = {}

    def make(spec: dict[str, Any], auth_ids: list[str], prevs: list[str], ts: int) -> str:
        event_id = event_id_for(spec["id"], version_id)
        fields = {"room_id": ROOM, "type": spec["type"], "sender": spec["sender"],
                  "content": spec["content"], "depth": ts + 1, "origin_server_ts": ts,
                  "auth_events": auth_ids, "prev_events": prevs}
        if "state_key" in spec:
            fields["state_key"] = spec["state_key"]
        source.add(parse_event(event_id, fields, version))
        node_of[event_id] = spec["id"]
        return event_id

    def auth_keys(spec: dict[str, Any]) -> set[tuple[str, str]]:
        fields = {"room_id": ROOM, "type": spec["type"], "sender": spec["sender"],
                  "content": spec["content"]}
        if "state_key" in spec:
            fields["state_key"] = spec["state_key"]
        return auth.auth_types_for_event(parse_event("$probe", fields, V6), V6)

    ids, after = sc.build_graph(doc, case, make, auth_keys,
                                lambda sets: resolve_state(ROOM, version, sets, source))
    keys_of = {s["id"]: (s["type"], s.get("state_key", ""))
               for s in doc["initial_events"] + case["events"]}
    changed = sc.changed_at_end(case, ids, after, keys_of)
    return {k: node_of[v] for k, v in changed.items()}


def explicit_source(case: dict[str, Any]) -> tuple[str, InMemoryEventSource, dict[str, str]]:
    """Room ID, the events of an explicit case, and node -> event ID."""
    version_id = case["room_version"]
    version = room_version(version_id)
    source = InMemoryEventSource()
    id_of: dict[str, str] = {}
    room = ROOM
    for n, spec in enumerate(case["events"]):
        event_id = event_id_for(spec["id"], version_id)
        is_create = spec["type"] == "m.room.create" and spec.get("state_key") == ""
        fields: dict[str, Any] = {
            "type": spec["type"], "sender": spec["sender"], "content": spec["content"],
            "depth": spec.get("depth", n + 1), "origin_server_ts": spec.get("ts", n + 1),
            "auth_events": [id_of[a] for a in spec["auth"]],
            "prev_events": [id_of[p] for p in spec["prev"]]}
        if "state_key" in spec:
            fields["state_key"] = spec["state_key"]
        if "redacts" in spec:
            fields["redacts"] = spec["redacts"]
        if not (is_create and version.room_id_from_create_event):
            fields["room_id"] = room
        event = parse_event(event_id, fields, version)
        if is_create:
            room = event.room_id
        source.add(event, rejected=bool(spec.get("rejected")))
        id_of[spec["id"]] = event_id
    return room, source, id_of


def explicit_state(case: dict[str, Any]) -> dict[tuple[str, str], str]:
    """The resolution of an explicit case, by node name."""
    room, source, id_of = explicit_source(case)
    node_of = {v: k for k, v in id_of.items()}
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    out = resolve_state(room, room_version(case["room_version"]), sets, source)
    return {k: node_of[v] for k, v in out.items()}


def as_rows(state: dict[tuple[str, str], str]) -> list[list[str]]:
    """A state by node name in the oracle's row form."""
    return sorted([k[0], k[1], v] for k, v in state.items())


def events_by_id(source: InMemoryEventSource) -> dict[str, MatrixEvent]:
    """The events a source holds."""
    return dict(source.as_mapping())
