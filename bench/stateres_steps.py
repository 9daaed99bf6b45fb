"""Where a cold state resolution's time goes, step by step, in turns with the reference.

``PYTHONPATH=src:tests:bench "$STREAMREP_REFERENCE_PYTHON" bench/stateres_steps.py SHAPE VERSION``
(SHAPE ``2-forks`` or ``8-forks``, VERSION ``10`` or ``12``; the cases of
test_bench_stateres.py) runs the reference's resolution and then streamrep's compiled
one with nothing kept from before, 17 times, and prints the median CPU time of each
step of streamrep's (the first two pairs left out). With ``--again`` streamrep's
resolution runs twice after each of the reference's and the second is timed: the same
work with the room's data still in the processor's caches.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import defaultdict
from typing import Any, Callable

import test_bench_stateres as cases

from streamrep.matrix.stateres import v2

#: The steps of ``resolve_v2`` timed (module functions of v2), and the source's.
STEPS = ("_held_difference", "_load", "reverse_topological_power_order", "_iterative_auth_checks",
         "mainline_order")


def _timed(spent: dict[str, float], label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.process_time() - start

    return timed


def main(shape: str, version_id: str, again: bool) -> None:
    room, version, sets, store, _ = cases._reference_input(shape, version_id)
    import synapse.state.v2 as reference_v2  # after the reference's events, as it imports them

    mine, source, my_sets, _ = cases.streamrep_input(shape, version_id, "compiled")
    my_version = cases.room_version(version_id)
    spent: dict[str, float] = defaultdict(float)
    for name in STEPS:
        setattr(v2, name, _timed(spent, name, getattr(v2, name)))
    source.conflicted_subgraph = _timed(spent, "conflicted_subgraph", source.conflicted_subgraph)
    index = source.index
    index.differing_events = _timed(spent, "differing_events", index.differing_events)
    v2.dict = _timed(spent, "result (copy of the first state)", dict)  # type: ignore[attr-defined]
    rows: dict[str, list[float]] = defaultdict(list)
    for pair in range(17):
        start = time.process_time()
        asyncio.run(reference_v2.resolve_events_with_store(cases._Clock(), room, version, sets, None, store))
        reference = time.process_time() - start
        if again:
            source.clear_derived()
            cases.resolve_state(mine, my_version, my_sets, source)
        source.clear_derived()
        spent.clear()
        start = time.process_time()
        cases.resolve_state(mine, my_version, my_sets, source)
        total = time.process_time() - start
        if pair < 2:
            continue
        rows["reference"].append(reference)
        rows["streamrep, whole resolution"].append(total)
        for label, seconds in spent.items():
            rows[label].append(seconds)
        rows["the rest"].append(total - sum(spent.values()))
    for label, values in rows.items():
        print(f"{label:40s} {statistics.median(values) * 1e3:8.3f} ms")
    ratios = [r / c for r, c in zip(rows["reference"], rows["streamrep, whole resolution"])]
    print(f"{'reference / streamrep (median of pairs)':40s} {statistics.median(ratios):8.1f} x")


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--again"]
    if len(arguments) != 2:
        raise SystemExit(__doc__)
    main(arguments[0], arguments[1], "--again" in sys.argv[1:])
