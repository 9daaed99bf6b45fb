"""The DAG shape of the extremity benchmarks: batches with forks and merges.

One shape, so streamrep's core and the reference implementation time the same work.
"""

from __future__ import annotations

import random
from array import array
from typing import Any

#: Current forward extremities the batch starts from: events ``0..N_FORWARD-1``.
N_FORWARD = 4


def forked_batch(seed: int, size: int = 100) -> list[tuple[int, list[int]]]:
    """*size* events numbered from ``N_FORWARD`` up, each ``(event, prev_events)``.

    Three events in four have one prev_event, the rest two (possibly the same one
    twice); each is drawn from the six events before it, so the batch forks and
    merges, and its first events build on the current extremities.
    """
    rng = random.Random(seed)
    events = []
    for own in range(N_FORWARD, N_FORWARD + size):
        k = rng.choice((1, 1, 1, 2))
        events.append((own, [rng.randrange(max(0, own - 6), own) for _ in range(k)]))
    return events


def core_buffers(seed: int, size: int = 100) -> tuple[Any, ...]:
    """``forked_batch(seed, size)`` as the arguments of the extremity core's
    ``update_extremities``: every event counted, the current extremities stored."""
    events = forked_batch(seed, size)
    offsets, prevs = array("q", [0]), array("q")
    for _, prev_events in events:
        prevs.extend(prev_events)
        offsets.append(len(prevs))
    id_flags = bytearray(N_FORWARD + size)
    for f in range(N_FORWARD):
        id_flags[f] = 1 | 4  # stored as a non-outlier, a forward extremity
    return (array("q", [own for own, _ in events]), bytes([3] * size), offsets, prevs,
            bytes(id_flags))
