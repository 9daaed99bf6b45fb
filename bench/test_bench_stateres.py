"""State resolution of a conflicted merge in a room of 10,000 members.

The room (``support.stateres_random.forked_room``): 10,000 members joined on one
linear base, then 2 or 8 forks of power levels changes, kicks, bans, join rule
changes, leaves, joins and topics; the forks' states are resolved into one. Each
case reports the number of conflicted events it resolves.

Rows, side by side in one run:

* ``streamrep-compiled`` / ``streamrep-pure`` - :func:`streamrep.matrix.stateres.
  resolve_state` with the compiled core or its pure twin; the room's auth index is
  built once beforehand (a store keeps it up to date as events arrive), and each
  resolution finds what the previous one kept (the facts derived from each event
  and its auth events, the numbers of the first state's events);
* ``streamrep-compiled-cold`` - the same with nothing kept: each round starts after
  :meth:`~streamrep.matrix.stateres.InMemoryEventSource.clear_derived`;
* ``reference`` - the reference implementation's own v2 resolver
  (``synapse.state.v2.resolve_events_with_store``) over an in-memory store that
  answers its auth chain questions by walking the events' auth edges. Present only
  when the reference is importable, e.g. in its own virtualenv with streamrep's
  source on the path::

``test_resolve_cold_in_turns`` times the reference and ``streamrep-compiled-cold``
in turns, one resolution each, and reports the median over the pairs of reference /
cold. The rows above are each timed in a block of their own, at moments when a
machine shared with other work may be slower or faster (cold resolution, bound by
memory, most of all); a pair meets the machine in one state. Each cold resolution
then follows the reference's, which leaves the room's state out of the processor's
caches, as other work does before a server's resolution.

      PYTHONPATH=src:tests /work/refvenv/bin/python -m pytest bench/test_bench_stateres.py \\
          --benchmark-only -k "resolve or core" --benchmark-timer=time.process_time

Every row's answer is checked equal to the others' before anything is timed.
Run in the development environment (no reference row):
``python -m pytest bench/test_bench_stateres.py --benchmark-only``
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import statistics
import time
from typing import Any

import pytest

from streamrep.matrix.room_versions import room_version
from streamrep.matrix.stateres import InMemoryEventSource, resolve_state
from streamrep.matrix.stateres.v2 import separate

from support import stateres_build as build
from support.impls import IMPLEMENTATIONS
from support.stateres_random import forked_room

MEMBERS = 10_000
#: (forks, events per fork)
SHAPES = {"2-forks": (2, 150), "8-forks": (8, 60)}
VERSIONS = ("10", "12")


@functools.lru_cache(maxsize=None)
def room_case(shape: str, version_id: str) -> dict[str, Any]:
    forks, per_fork = SHAPES[shape]
    return forked_room(version_id, seed=1, members=MEMBERS, forks=forks, per_fork=per_fork,
                       staff_levels=(100, 50), topic_level=0, keep_rejected=0.0)


@functools.lru_cache(maxsize=None)
def streamrep_input(shape: str, version_id: str, kind: str) -> tuple[Any, ...]:
    from streamrep import _impl
    from streamrep.matrix import authindex

    case = room_case(shape, version_id)
    # Build the auth index on the implementation under test.
    load = _impl.load_compiled if kind == "compiled" else _impl.load_pure
    saved = authindex._authchain, authindex._stateset
    authindex._authchain, authindex._stateset = load("authchain"), load("stateset")
    try:
        room, held, id_of = build.explicit_source(case)
        source = InMemoryEventSource(held.events.values(), held.rejected)
    finally:
        authindex._authchain, authindex._stateset = saved
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    return room, source, sets, {v: k for k, v in id_of.items()}


def _by_node(state: Any, node_of: dict[str, str]) -> dict[tuple[str, str], str]:
    return {k: node_of[v] for k, v in state.items()}


@pytest.mark.parametrize("version_id", VERSIONS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_resolve_streamrep(benchmark: Any, kind: str, shape: str, version_id: str) -> None:
    room, source, sets, node_of = streamrep_input(shape, version_id, kind)
    version = room_version(version_id)
    _, conflicted = separate(sets)
    benchmark.group = f"stateres {shape} v{version_id}"
    benchmark.name = f"streamrep-{kind}"
    benchmark.extra_info["conflicted_events"] = sum(len(v) for v in conflicted.values())
    result = benchmark(resolve_state, room, version, sets, source)
    if "compiled" in IMPLEMENTATIONS and kind == "pure":
        other = streamrep_input(shape, version_id, "compiled")
        assert _by_node(result, node_of) == _by_node(
            resolve_state(other[0], version, other[2], other[1]), other[3])


@pytest.mark.parametrize("version_id", VERSIONS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_resolve_streamrep_cold(benchmark: Any, shape: str, version_id: str) -> None:
    """The compiled core with nothing kept from the previous resolution."""
    room, source, sets, _ = streamrep_input(shape, version_id, IMPLEMENTATIONS[0])
    version = room_version(version_id)
    benchmark.group = f"stateres {shape} v{version_id}"
    benchmark.name = f"streamrep-{IMPLEMENTATIONS[0]}-cold"
    expected = resolve_state(room, version, sets, source)

    def forget() -> tuple[tuple[Any, ...], dict[str, Any]]:
        source.clear_derived()
        return (room, version, sets, source), {}

    result = benchmark.pedantic(resolve_state, setup=forget, rounds=30, warmup_rounds=2)
    assert result == expected


# --- the reference implementation -------------------------------------------------


def _reference_input(shape: str, version_id: str) -> tuple[Any, ...]:
    rv = pytest.importorskip("synapse.api.room_versions",
                             reason="the reference implementation is not installed")
    events_mod = pytest.importorskip("synapse.events")
    federation = pytest.importorskip("synapse.storage.databases.main.event_federation")
    version = rv.KNOWN_ROOM_VERSIONS[version_id]
    case = room_case(shape, version_id)
    events: dict[str, Any] = {}
    id_of: dict[str, str] = {}
    room = "!room:example.org"
    for n, spec in enumerate(case["events"]):
        d = {"type": spec["type"], "sender": spec["sender"], "content": spec["content"],
             "depth": spec["depth"], "origin_server_ts": spec["ts"],
             "auth_events": [id_of[a] for a in spec["auth"]],
             "prev_events": [id_of[p] for p in spec["prev"]], "hashes": {"sha256": ""},
             "signatures": {}}
        if "state_key" in spec:
            d["state_key"] = spec["state_key"]
        is_create = spec["type"] == "m.room.create"
        if not (is_create and version.msc4291_room_ids_as_hashes):
            d["room_id"] = room
        event = events_mod.make_event_from_dict(
            d, version, rejected_reason="auth" if spec.get("rejected") else None)
        if is_create:
            room = event.room_id
        events[event.event_id] = event
        id_of[spec["id"]] = event.event_id
    sets = [{(t, k): id_of[n] for t, k, n in s} for s in case["state_sets"]]
    store = _MemoryStore(events, federation.StateDifference)
    return room, version, sets, store, {v: k for k, v in id_of.items()}


class _MemoryStore:
    """The reference resolver's store interface over events in memory."""

    def __init__(self, events: dict[str, Any], difference: Any) -> None:
        self.events = events
        self.difference = difference

    async def get_events(self, event_ids: Any, allow_rejected: bool = False) -> dict[str, Any]:
        return {e: self.events[e] for e in event_ids if e in self.events}

    def _chain(self, roots: Any) -> set[str]:
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            e = stack.pop()
            if e not in seen:
                seen.add(e)
                stack.extend(self.events[e].auth_event_ids())
        return seen

    async def get_auth_chain_difference(self, room_id: str, state_sets: Any,
                                        conflicted_state: Any = None,
                                        additional_backwards_reachable_conflicted_events: Any
                                        = None) -> Any:
        chains = [self._chain(s) for s in state_sets]
        diff = set().union(*chains) - set.intersection(*chains)
        subgraph = None
        if conflicted_state is not None:
            extra = additional_backwards_reachable_conflicted_events or set()
            backwards = self._chain(set(conflicted_state) | set(extra))
            children: dict[str, set[str]] = {}
            for e in backwards:
                for a in self.events[e].auth_event_ids():
                    children.setdefault(a, set()).add(e)
            forwards: set[str] = set()
            stack = list(conflicted_state)
            while stack:
                e = stack.pop()
                if e not in forwards:
                    forwards.add(e)
                    stack.extend(children.get(e, ()))
            subgraph = backwards & forwards
        return self.difference(auth_difference=diff, conflicted_subgraph=subgraph)


class _Clock:
    async def sleep(self, _duration: Any) -> None:
        return None


@pytest.mark.parametrize("version_id", VERSIONS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_resolve_reference(benchmark: Any, shape: str, version_id: str) -> None:
    room, version, sets, store, node_of = _reference_input(shape, version_id)
    v2 = pytest.importorskip("synapse.state.v2")

    def run() -> Any:
        return asyncio.run(v2.resolve_events_with_store(_Clock(), room, version, sets, None,
                                                        store))

    mine = streamrep_input(shape, version_id, IMPLEMENTATIONS[0])
    expected = _by_node(resolve_state(mine[0], room_version(version_id), mine[2], mine[1]),
                        mine[3])
    assert _by_node(dict(run()), node_of) == expected
    benchmark.group = f"stateres {shape} v{version_id}"
    benchmark.name = "reference"
    benchmark(run)


@pytest.mark.parametrize("version_id", VERSIONS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_resolve_cold_in_turns(benchmark: Any, shape: str, version_id: str) -> None:
    """The reference and the compiled core with nothing kept, in turns: the median of
    reference / cold over the pairs (CPU time of this process)."""
    room, version, sets, store, node_of = _reference_input(shape, version_id)
    v2 = pytest.importorskip("synapse.state.v2")
    mine, source, my_sets, my_node_of = streamrep_input(shape, version_id, IMPLEMENTATIONS[0])
    my_version = room_version(version_id)
    pairs: list[tuple[float, float]] = []

    def reference() -> Any:
        return asyncio.run(v2.resolve_events_with_store(_Clock(), room, version, sets, None,
                                                        store))

    def pair() -> tuple[Any, Any]:
        start = time.process_time()
        theirs = reference()
        middle = time.process_time()
        source.clear_derived()
        cold_start = time.process_time()
        ours = resolve_state(mine, my_version, my_sets, source)
        pairs.append((middle - start, time.process_time() - cold_start))
        return theirs, ours

    theirs, ours = pair()
    assert _by_node(dict(theirs), node_of) == _by_node(ours, my_node_of)
    pairs.clear()
    benchmark.group = f"stateres in turns {shape} v{version_id}"
    benchmark.name = f"reference then streamrep-{IMPLEMENTATIONS[0]}-cold"
    benchmark.pedantic(pair, rounds=15, iterations=1)
    if benchmark.stats is None:  # --benchmark-disable: one pair, nothing to compare
        return
    ratios = [ref / cold for ref, cold in pairs]
    ratio = statistics.median(ratios)
    benchmark.extra_info["reference_over_cold"] = round(ratio, 1)
    print(f"\nstateres {shape} v{version_id}, in turns ({len(pairs)} pairs): reference "
          f"{statistics.median(r for r, _ in pairs) * 1e3:.2f} ms, "
          f"streamrep-{IMPLEMENTATIONS[0]}-cold {statistics.median(c for _, c in pairs) * 1e3:.3f} "
          f"ms (medians); reference / cold, median of the pairs {ratio:.1f}x "
          f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.1f} to "
          f"{statistics.quantiles(ratios, n=4)[2]:.1f})")


# --- the auth chain core alone ----------------------------------------------------


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_auth_chain_difference_core(benchmark: Any, kind: str) -> None:
    """The auth difference of the 8-fork merge, unconflicted events passed once."""
    room, source, sets, _ = streamrep_input("8-forks", "10", kind)
    _, conflicted = separate(sets)
    per_set = [{s[k] for k in conflicted if k in s} for s in sets]
    common = set(sets[0].values()) - set().union(*conflicted.values())
    benchmark.group = "auth chain difference, 10,000 members, 8 forks"
    benchmark.name = f"core-{kind}"
    found = benchmark(source.auth_chain_difference, per_set, common)
    assert found == source.index.auth_chain_difference(per_set, common)
    assert found == source.index.auth_chain_difference([s | common for s in per_set])


# --- persisting with and without the room rules -------------------------------------


def _matrix_history(room: str) -> Any:
    """A version 10 room: create, join, power levels, join rules, then messages from
    the creator and, one event in 20, a new member joining; each cites its auth events."""
    alice = "@a:x"
    setup = [
        ("create", "m.room.create", "", {"creator": alice, "room_version": "10"}, []),
        ("alice", "m.room.member", alice, {"membership": "join"}, ["create"]),
        ("power", "m.room.power_levels", "", {"users": {alice: 100}}, ["create", "alice"]),
        ("rules", "m.room.join_rules", "", {"join_rule": "public"},
         ["create", "alice", "power"]),
    ]
    prev = None
    for n, (name, etype, sk, content, auth_names) in enumerate(setup, start=1):
        eid = f"${room}-{name}"
        yield {"event_id": eid, "room_id": room, "type": etype, "state_key": sk,
               "sender": alice, "depth": n, "prev_events": [prev] if prev else [],
               "auth_events": [f"${room}-{a}" for a in auth_names], "content": content}
        prev = eid
    base = [f"${room}-create", f"${room}-power"]
    for n in itertools.count(len(setup) + 1):
        eid = f"${room}-{n}"
        event = {"event_id": eid, "room_id": room, "depth": n, "prev_events": [prev]}
        if n % 20 == 0:
            user = f"@u{n}:x"
            event.update(type="m.room.member", state_key=user, sender=user,
                         content={"membership": "join"},
                         auth_events=base + [f"${room}-rules"])
        else:
            event.update(type="m.room.message", sender=alice,
                         content={"body": f"message {n}", "msgtype": "m.text"},
                         auth_events=base + [f"${room}-alice"])
        yield event
        prev = eid


@pytest.mark.parametrize("rules", ["rules-off", "rules-on"])
def test_persist_matrix_history_sqlite(benchmark: Any, tmp_path: Any, rules: str) -> None:
    from streamrep import EventStore
    from streamrep.matrix.rules import MatrixRoomRules as RoomRules

    store = EventStore(f"sqlite:///{tmp_path}/bench.db",
                       room_rules=RoomRules() if rules == "rules-on" else None)
    source = _matrix_history("!bench:x")
    batch, per_round = 100, 30

    def next_round() -> tuple[tuple[list[list[dict[str, Any]]]], dict[str, Any]]:
        return ([[next(source) for _ in range(batch)] for _ in range(per_round)],), {}

    def run(batches: list[list[dict[str, Any]]]) -> None:
        for events in batches:
            assert not store.persist_events(events).rejected

    benchmark.group = "persist 100-event batches, SQLite"
    benchmark.name = rules
    try:
        benchmark.pedantic(run, setup=next_round, rounds=6, iterations=1, warmup_rounds=1)
        if benchmark.stats is not None:
            benchmark.extra_info["events_per_s"] = round(
                batch * per_round / benchmark.stats.stats.mean)
    finally:
        store.close()
