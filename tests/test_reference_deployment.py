"""The multi-process reference deployment and the truth tooling the follow tests rely on.

Main and two event persisters on PostgreSQL with a Redis of the test's own: rooms land
on both persisters, a raw subscriber hears ``RDATA`` of ``events`` from both, and
each persister's HTTP replication API serves exactly the rows the subscriber heard
from it. Restarting main alone, then every process, leaves a deployment that goes on
persisting on both writers.
"""

from __future__ import annotations

import pathlib
from collections import Counter

import pytest

from support.reference_deployment import PERSISTERS, Deployment, running_deployment
from support.replication_truth import Capture, Row

pytestmark = pytest.mark.slow


def _send_everywhere(deployment: Deployment, token: str, rooms: dict[str, list[str]], label: str) -> None:
    for writer, ids in rooms.items():
        for room_id in ids:
            for n in range(3):
                deployment.send_message(token, room_id, f"{label} {writer} {n}")


def _settled(deployment: Deployment, capture: Capture) -> int:
    """The last event persisted, once the capture heard it."""
    last, writer = deployment.events()[-1]
    capture.settle("events", writer, last)
    return last


def _check_served_equals_heard(deployment: Deployment, capture: Capture, after: int, upto: int,
                               heard: list[Row]) -> None:
    for writer in PERSISTERS:
        served = deployment.served_rows("events", writer, after, upto)
        mine = [(t, r) for s, i, t, r in heard if i == writer and after < t <= upto]
        assert served, f"{writer} served no row"
        assert Counter(served) == Counter(mine), (writer, sorted(set(served) ^ set(mine))[:5])


def test_a_deployment_of_two_persisters_publishes_and_serves_the_same_rows(tmp_path: pathlib.Path) -> None:
    with running_deployment(str(tmp_path / "deployment")) as deployment:
        capture = Capture(deployment.redis.url, deployment.server_name, ["events"])
        try:
            token = deployment.register("alice")
            before = max((so for so, _w in deployment.events()), default=0)
            rooms = deployment.rooms_on_every_writer(token, per_writer=2)
            _send_everywhere(deployment, token, rooms, "first")
            upto = _settled(deployment, capture)
            persisted = deployment.events()
            assert {w for so, w in persisted if so > before} == set(PERSISTERS)
            heard = [row for row in capture.rows if row[0] == "events"]
            assert {i for _s, i, _t, _r in heard} == set(PERSISTERS)
            # Every persisted event was heard once as an "ev" row of its own writer.
            ev = Counter((i, t) for _s, i, t, r in heard if r.startswith(b'["ev"'))
            assert ev == Counter((w, so) for so, w in persisted if so > before)
            _check_served_equals_heard(deployment, capture, before, upto, heard)
            # A range that starts and ends inside the workload serves only its part.
            tokens = sorted({t for _s, _i, t, _r in heard})
            middle = tokens[len(tokens) // 2]
            _check_served_equals_heard(deployment, capture, middle, upto, heard)

            deployment.restart(("main",))
            deployment.restart()
            _send_everywhere(deployment, token, rooms, "after restarts")
            last = _settled(deployment, capture)
            assert {w for so, w in deployment.events() if so > upto} == set(PERSISTERS)
            _check_served_equals_heard(deployment, capture, upto, last,
                                       [row for row in capture.rows if row[0] == "events"])
        finally:
            capture.close()
