"""Resolve state resolution scenarios with the reference implementation.

Run by the reference's own interpreter (never imported by streamrep or its tests):

    /work/refvenv/bin/python tests/support/stateres_oracle.py < cases.json

With the argument ``auth``, stdin is ``{"auth": [case, ...]}`` and stdout maps each
case's name to ``"accepted"``/``"rejected"``: the reference's authorization rules for
the case's last event against its auth events.

Otherwise stdin is ``{"initial_events", "initial_edges", "graphs": [...], "explicit": [...]}`` in
the format of tests/data/stateres_scenarios.json. stdout: ``{"graphs": {name:
[[type, state_key, node], ...]}, "explicit": {name: [[type, state_key, node], ...]}}``
- the END state's changed keys for graphs, the resolved state for explicit cases,
with event IDs mapped back to node names.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stateres_scenarios as sc  # noqa: E402
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS  # noqa: E402
from synapse.event_auth import auth_types_for_event  # noqa: E402
from synapse.events import make_event_from_dict  # noqa: E402
from synapse.state import v1 as state_v1  # noqa: E402
from synapse.state import v2 as state_v2  # noqa: E402
from synapse.storage.databases.main.event_federation import StateDifference  # noqa: E402

ROOM = "!room:example.com"


class Clock:
    async def sleep(self, _duration: Any) -> None:
        return None


class MemoryStore:
    """The reference's resolver interface over a dict of events."""

    def __init__(self, events: dict[str, Any]) -> None:
        self.events = events

    async def get_events(self, event_ids: Any, allow_rejected: bool = False) -> dict[str, Any]:
        return {e: self.events[e] for e in event_ids if e in self.events}

    def _chain(self, roots: Any) -> set[str]:
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            e = stack.pop()
            if e in seen:
                continue
            seen.add(e)
            if e in self.events:
                stack.extend(self.events[e].auth_event_ids())
        return seen

    async def get_auth_chain_difference(self, room_id: str, state_sets: Any,
                                        conflicted_state: Any = None,
                                        additional_backwards_reachable_conflicted_events: Any = None
                                        ) -> StateDifference:
        chains = [self._chain(s) for s in state_sets]
        diff = set().union(*chains) - set.intersection(*chains)
        subgraph = None
        if conflicted_state is not None:
            extra = additional_backwards_reachable_conflicted_events or set()
            backwards = self._chain(set(conflicted_state) | set(extra))
            children: dict[str, set[str]] = {}
            for e in backwards:
                for a in self.events[e].auth_event_ids() if e in self.events else ():
                    children.setdefault(a, set()).add(e)
            forwards: set[str] = set()
            stack = list(conflicted_state)
            while stack:
                e = stack.pop()
                if e in forwards:
                    continue
                forwards.add(e)
                stack.extend(children.get(e, ()))
            subgraph = backwards & forwards
        return StateDifference(auth_difference=diff, conflicted_subgraph=subgraph)


def resolve(version: Any, state_sets: list[dict[Any, str]], events: dict[str, Any]) -> dict:
    store = MemoryStore(events)
    if version.state_res == 1:
        async def factory(ids: Any) -> dict[str, Any]:
            return {e: events[e] for e in ids if e in events}
        coro = state_v1.resolve_events_with_store(ROOM, version, state_sets, None, factory)
    else:
        room = next(iter(events.values())).room_id
        coro = state_v2.resolve_events_with_store(Clock(), room, version, state_sets, None, store)
    return dict(asyncio.run(coro))


def run_graph(doc: dict[str, Any], case: dict[str, Any]) -> list[list[str]]:
    version = KNOWN_ROOM_VERSIONS[case.get("room_version", "2")]
    events: dict[str, Any] = {}
    node_of: dict[str, str] = {}

    def make(spec: dict[str, Any], auth: list[str], prevs: list[str], ts: int) -> str:
        event_id = f"${spec['id']}:example.com"
        d = {"event_id": event_id, "room_id": ROOM, "type": spec["type"],
             "sender": spec["sender"], "content": spec["content"], "depth": ts + 1,
             "origin_server_ts": ts, "auth_events": [[a, {}] for a in auth],
             "prev_events": [[p, {}] for p in prevs], "hashes": {}, "signatures": {}}
        if "state_key" in spec:
            d["state_key"] = spec["state_key"]
        events[event_id] = make_event_from_dict(d, version)
        node_of[event_id] = spec["id"]
        return event_id

    def auth_keys(spec: dict[str, Any]) -> set[Any]:
        # The reference's selection reads only these fields.
        probe = SimpleNamespace(type=spec["type"], sender=spec["sender"],
                                state_key=spec.get("state_key"), content=spec["content"],
                                membership=spec["content"].get("membership"))
        return set(auth_types_for_event(KNOWN_ROOM_VERSIONS["6"], probe))

    ids, after = sc.build_graph(doc, case, make, auth_keys,
                                lambda sets: resolve(version, sets, events))
    keys_of = {n: (s["type"], s.get("state_key", "")) for s in doc["initial_events"] +
               case["events"] for n in [s["id"]]}
    changed = sc.changed_at_end(case, ids, after, keys_of)
    return sorted([k[0], k[1], node_of[v]] for k, v in changed.items())


def run_explicit(case: dict[str, Any]) -> list[list[str]]:
    version = KNOWN_ROOM_VERSIONS[case["room_version"]]
    events: dict[str, Any] = {}
    id_of: dict[str, str] = {}
    room = ROOM
    for n, spec in enumerate(case["events"]):
        d = {"type": spec["type"], "sender": spec["sender"], "content": spec["content"],
             "depth": spec.get("depth", n + 1), "origin_server_ts": spec.get("ts", n + 1),
             "auth_events": [id_of[a] for a in spec["auth"]],
             "prev_events": [id_of[p] for p in spec["prev"]], "hashes": {"sha256": ""},
             "signatures": {}}
        if "state_key" in spec:
            d["state_key"] = spec["state_key"]
        if "redacts" in spec:
            d["redacts"] = spec["redacts"]
        is_create = spec["type"] == "m.room.create" and spec.get("state_key") == ""
        if version.msc4291_room_ids_as_hashes:
            if not is_create:
                d["room_id"] = room
        else:
            d["room_id"] = room
        if version.event_format == 1:
            d["event_id"] = f"${spec['id']}:example.com"
            d["auth_events"] = [[a, {}] for a in d["auth_events"]]
            d["prev_events"] = [[p, {}] for p in d["prev_events"]]
        event = make_event_from_dict(d, version, rejected_reason=spec.get("rejected"))
        if is_create and version.msc4291_room_ids_as_hashes:
            room = event.room_id
        events[event.event_id] = event
        id_of[spec["id"]] = event.event_id
    node_of = {v: k for k, v in id_of.items()}
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    out = resolve(version, sets, events)
    return sorted([k[0], k[1], node_of[v]] for k, v in out.items())


def main() -> None:
    doc = json.load(sys.stdin)
    result: dict[str, Any] = {"graphs": {}, "explicit": {}}
    for case in doc.get("graphs", []):
        result["graphs"][case["name"]] = run_graph(doc, case)
    for case in doc.get("explicit", []):
        try:
            result["explicit"][case["name"]] = run_explicit(case)
        except Exception as exc:  # reported, so the caller can tell a crash from an answer
            result["explicit"][case["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
    json.dump(result, sys.stdout)




class _EventStore:
    def __init__(self, events: dict[str, Any]) -> None:
        self.events = events

    async def get_events(self, event_ids: Any, **_kwargs: Any) -> dict[str, Any]:
        return {e: self.events[e] for e in event_ids if e in self.events}


def run_auth(case: dict[str, Any]) -> str:
    """"accepted" or "rejected" for the last event of an explicit case."""
    from synapse.api.errors import AuthError, SynapseError
    from synapse.event_auth import (
        check_state_dependent_auth_rules,
        check_state_independent_auth_rules,
    )

    version = KNOWN_ROOM_VERSIONS[case["room_version"]]
    events: dict[str, Any] = {}
    id_of: dict[str, str] = {}
    room = ROOM
    last = None
    for n, spec in enumerate(case["events"]):
        d = {"type": spec["type"], "sender": spec["sender"], "content": spec["content"],
             "depth": spec.get("depth", n + 1), "origin_server_ts": spec.get("ts", n + 1),
             "auth_events": [id_of[a] for a in spec["auth"]],
             "prev_events": [id_of[p] for p in spec["prev"]], "hashes": {"sha256": ""},
             "signatures": {}}
        if "state_key" in spec:
            d["state_key"] = spec["state_key"]
        if "redacts" in spec:
            d["redacts"] = spec["redacts"]
        is_create = spec["type"] == "m.room.create" and spec.get("state_key") == ""
        if not (is_create and version.msc4291_room_ids_as_hashes):
            d["room_id"] = room
        if version.event_format == 1:
            d["event_id"] = f"${spec['id']}:example.com"
            d["auth_events"] = [[a, {}] for a in d["auth_events"]]
            d["prev_events"] = [[p, {}] for p in d["prev_events"]]
        last = make_event_from_dict(d, version)
        if is_create and version.msc4291_room_ids_as_hashes:
            room = last.room_id
        events[last.event_id] = last
        id_of[spec["id"]] = last.event_id
    assert last is not None
    try:
        asyncio.run(check_state_independent_auth_rules(_EventStore(events), last))
        check_state_dependent_auth_rules(
            last, [events[a] for a in last.auth_event_ids() if a in events])
    except (AuthError, SynapseError):
        return "rejected"
    except (KeyError, ValueError, TypeError, AssertionError, RuntimeError) as exc:
        return f"error {type(exc).__name__}: {exc}"
    return "accepted"


def main_auth() -> None:
    doc = json.load(sys.stdin)
    json.dump({c["name"]: run_auth(c) for c in doc["auth"]}, sys.stdout)


if __name__ == "__main__":
    main_auth() if sys.argv[1:] == ["auth"] else main()
