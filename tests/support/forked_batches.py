"""The DAG shape of the extremity benchmarks: batches with forks and merges.

One shape, so streamrep's core and the reference implementation time the same work.
"""

from __future__ import annotations

import random

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
