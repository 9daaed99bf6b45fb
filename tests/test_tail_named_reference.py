"""``streamrep tail --format named`` following a real reference homeserver
(matrix-synapse, run from its own venv, never imported) through a Redis of the
test's own, while a workload writes nine of its streams.

A raw subscriber captures every ``RDATA`` the homeserver publishes. Every row it
captured once tail was following must be printed by tail exactly once, as an object
keyed by the field names the reference's own row classes declare (asked of the
reference, not of streamrep's table), and tail prints nothing else.
"""

from __future__ import annotations

import json
import pathlib
import signal
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from support.processes import reap_processes, streamrep_process
from support.redis_capture import RawSubscriber
from support.redis_server import own_redis_server, unique_server_name, wait_subscribed
from support.reference import reference_fields
from support.reference_homeserver import running_homeserver
from support.reference_workload import STREAMS, NineStreams

pytestmark = pytest.mark.slow

#: One row: (stream, instance, token, row as JSON text with sorted keys).
Row = tuple[str, str, int, str]


class Capture(RawSubscriber):
    """Every message published on the channel, in order, by a raw subscriber."""

    def answered_from(self, since: int, timeout: float = 60) -> int:
        """The index after the homeserver's answer (its ``POSITION`` lines) to the
        first ``REPLICATE`` published after message *since*: from there on, a
        follower that sent it has heard every writer."""
        deadline = time.monotonic() + timeout
        while True:
            messages = self.messages[since:]
            if b"REPLICATE" in messages:
                at = messages.index(b"REPLICATE") + 1
                if any(m.startswith(b"POSITION events ") for m in messages[at:]):
                    break
            assert time.monotonic() < deadline, "the homeserver did not answer the follower's REPLICATE"
            time.sleep(0.05)
        time.sleep(0.5)  # the answer is one burst of POSITION lines
        messages = self.messages[since:]
        while at < len(messages) and messages[at].startswith(b"POSITION "):
            at += 1
        return since + at

    def rows(self, start: int) -> list[tuple[str, str, int, Any]]:
        """Every ``RDATA`` row from message *start* on, ``batch`` rows given the
        token of their fact."""
        rows: list[tuple[str, str, int, Any]] = []
        pending: dict[tuple[str, str], list[Any]] = {}
        for message in self.messages[start:]:
            if not message.startswith(b"RDATA "):
                continue
            _rdata, stream, instance, token, row_json = message.decode().split(" ", 4)
            waiting = pending.setdefault((stream, instance), [])
            waiting.append(json.loads(row_json))
            if token != "batch":
                rows.extend((stream, instance, int(token), row) for row in waiting)
                waiting.clear()
        return rows


def _named_by_the_reference(declared: dict[str, Any], stream: str, row: list[Any]) -> dict[str, Any]:
    """*row* keyed by the field names the reference declares for *stream*."""
    if stream == "events":
        kind, data = row
        return {"type": kind, "data": {name: value for (name, _t), value in zip(declared["events"][kind], data)}}
    fields = declared[stream]
    assert len(fields) == len(row), (stream, row)
    return {name: value for (name, _t), value in zip(fields, row)}


def _key(stream: str, instance: str, token: int, row: Any) -> Row:
    return (stream, instance, token, json.dumps(row, sort_keys=True))


def _printed(path: pathlib.Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_tail_names_every_row_of_nine_streams_of_a_reference_homeserver(tmp_path: pathlib.Path) -> None:
    declared = reference_fields()
    redis_server = own_redis_server()
    out, err = tmp_path / "tail.out", tmp_path / "tail.err"
    try:
        server = unique_server_name("named-ref")
        with running_homeserver(str(tmp_path / "hs"), redis_server.url, server) as hs:
            workload = NineStreams(hs)
            capture = Capture(redis_server.url, server)
            try:
                wait_subscribed(redis_server.url, server, 2)
                since = len(capture.messages)
                tail = streamrep_process(err, "tail", "--redis", redis_server.url, "--server-name", server,
                                         "--name", "named-ref", "--format", "named", out=out)
                start = capture.answered_from(since)
                for n in range(10):
                    workload.step(n)
                deadline = time.monotonic() + 60
                while True:
                    expected = Counter(_key(s, i, t, _named_by_the_reference(declared, s, r))
                                       for s, i, t, r in capture.rows(start))
                    printed = Counter(_key(p["stream"], p["instance"], p["token"], p["row"])
                                      for p in _printed(out))
                    if printed >= expected or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                time.sleep(1.0)  # anything more would show up now
                tail.send_signal(signal.SIGTERM)
                assert tail.wait(30) == 0, err.read_text()
            finally:
                capture.close()
        expected = Counter(_key(s, i, t, _named_by_the_reference(declared, s, r)) for s, i, t, r in capture.rows(start))
        lines = _printed(out)
        printed = Counter(_key(p["stream"], p["instance"], p["token"], p["row"]) for p in lines)
        assert not [p for p in lines if "unnamed" in p], err.read_text()[-2000:]
        assert printed == expected, (sorted((expected - printed).elements())[:5],
                                     sorted((printed - expected).elements())[:5])
        touched = {stream for stream, _i, _t, _r in expected}
        assert touched >= set(STREAMS), sorted(set(STREAMS) - touched)
        assert sum(expected.values()) >= 100
    finally:
        reap_processes()
        redis_server.stop()
