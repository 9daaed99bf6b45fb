"""Build the state resolution scenarios of tests/data/stateres_scenarios.json.

Plain Python with no streamrep import, so the reference oracle
(tests/support/stateres_oracle.py, run by the reference's own interpreter) builds
the very same graphs: the caller passes in how to make an event, how to pick its
auth events and how to resolve states.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Any, Callable

SCENARIOS = Path(__file__).resolve().parent.parent / "data" / "stateres_scenarios.json"

Key = tuple[str, str]
State = dict[Key, str]


def load() -> dict[str, Any]:
    """The scenario document."""
    with SCENARIOS.open() as f:
        return json.load(f)  # type: ignore[no-any-return]


def topological_order(edges: dict[str, set[str]]) -> list[str]:
    """Nodes with their prev nodes first; ties by node name."""
    waiting = {node: len(prevs) for node, prevs in edges.items()}
    children: dict[str, list[str]] = {node: [] for node in edges}
    for node, prevs in edges.items():
        for p in prevs:
            children[p].append(node)
    ready = [node for node, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        node = heapq.heappop(ready)
        out.append(node)
        for child in children[node]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    return out


def build_graph(
    doc: dict[str, Any],
    case: dict[str, Any],
    make_event: Callable[[dict[str, Any], list[str], list[str], int], str],
    auth_keys: Callable[[dict[str, Any]], set[Key]],
    resolve: Callable[[list[State]], State],
) -> tuple[dict[str, str], dict[str, State]]:
    """Create a graph case's events in order; return node -> event ID and the
    state after each node (values are event IDs)."""
    specs = {e["id"]: e for e in doc["initial_events"] + case["events"]}
    edges: dict[str, set[str]] = {node: set() for node in specs}
    for chain in [doc["initial_edges"]] + case["edges"]:
        for a, b in zip(chain, chain[1:]):
            edges[a].add(b)
    ids: dict[str, str] = {}
    after: dict[str, State] = {}
    for ts, node in enumerate(topological_order(edges)):
        spec = specs[node]
        prevs = sorted(edges[node])
        if not prevs:
            before: State = {}
        elif len(prevs) == 1:
            before = dict(after[prevs[0]])
        else:
            before = dict(resolve([after[p] for p in prevs]))
        auth = sorted(before[k] for k in auth_keys(spec) if k in before)
        event_id = make_event(spec, auth, [ids[p] for p in prevs], ts)
        ids[node] = event_id
        state = dict(before)
        if "state_key" in spec:
            state[(spec["type"], spec["state_key"])] = event_id
        after[node] = state
    return ids, after


def changed_at_end(case: dict[str, Any], ids: dict[str, str], after: dict[str, State],
                   keys_of: dict[str, Key]) -> dict[Key, str]:
    """The END state's keys that differ from START's, plus the expected keys."""
    expected_keys = {keys_of[n] for n in case["expected"]}
    start, end = after["START"], after["END"]
    return {k: v for k, v in end.items() if k in expected_keys or start.get(k) != v}
