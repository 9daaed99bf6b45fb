"""A writer whose gap cannot be fetched holds back only its own facts.

A follower filling gaps from the reference's HTTP replication API (``HttpSource``,
against local listeners that answer as the reference does) with two writers:
``master`` writes ``receipts``, ``persister1`` writes ``events``. While
``persister1`` is down its writer is stalled at what was handed on, said once and
counted, its later facts are not handed on, and ``master``'s facts go on; once it
answers, the background fill hands on what it held back and it resumes, every
fact exactly once and in order, and ``after_read`` only ever saw what was taken.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

import gevent
import pytest

from streamrep.replication.follower import Stall, StreamFollower
from streamrep.replication.metrics import ReplicationMetrics
from streamrep.replication.protocol import WriterKey
from streamrep.replication.sources.http import HttpSource
from support.replication import wait_until
from support.repl_http import FakeWriter

EVENTS = ("events", "persister1")
RECEIPTS = ("receipts", "master")


def _event(token: int) -> list[Any]:
    return ["ev", [f"$e{token}", "!room:example.com", "m.room.message", "", None, None, None, False, 0]]


def _receipt(token: int) -> list[Any]:
    return ["!room:example.com", "m.read", f"@u{token}:example.com", f"$e{token}", None, {}]


class Run:
    """A follower over both writers, recording what it hands on and what
    ``after_read`` sees."""

    def __init__(self, master: FakeWriter, persister: FakeWriter, **options: Any) -> None:
        self.source = HttpSource({"master": master.address, "persister1": persister.address}, secret="s3cret",
                                 attempts=2, backoff_base=0.01, backoff_max=0.02, timeout=2.0)
        self.taken: list[tuple[str, str, int]] = []
        self.saved: list[dict[WriterKey, int]] = []
        self.stalls: list[Stall] = []
        self.resumed: list[Stall] = []
        self.inside = 0
        self.overlap = 0
        options.setdefault("start_from", {"events": 0, "receipts": 0})
        self.follower = StreamFollower(
            self.handler, self.source, after_read=self.after_read,
            on_stall=self.stalls.append, on_resume=self.resumed.append, retry_base=0.02, retry_max=0.05,
            **options)

    def handler(self, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        self.inside += 1
        self.overlap = max(self.overlap, self.inside)
        try:
            gevent.sleep(0)  # a handler that yields (a database, say) lets others run
            self.taken.append((stream, instance, token))
        finally:
            self.inside -= 1

    def after_read(self, follower: StreamFollower) -> None:
        positions = follower.taken_positions()
        self.saved.append(positions)
        for key, token in positions.items():
            if key not in (EVENTS, RECEIPTS):
                continue
            handed = [t for s, i, t in self.taken if (s, i) == key]
            assert token == (handed[-1] if handed else 0), (key, token, handed[-3:])

    def tokens(self, key: WriterKey) -> list[int]:
        return [t for s, i, t in self.taken if (s, i) == key]

    def close(self) -> None:
        self.follower.stop_retrying()
        self.source.close()


@pytest.fixture
def writers() -> Iterator[tuple[FakeWriter, FakeWriter]]:
    master = FakeWriter("master", secret="s3cret", page=4).start()
    persister = FakeWriter("persister1", secret="s3cret", page=4)  # down until started
    try:
        yield master, persister
    finally:
        master.stop()
        persister.stop()


def test_a_writer_down_holds_back_only_its_own_facts(writers: tuple[FakeWriter, FakeWriter],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    master, persister = writers
    for token in range(1, 11):
        persister.add("events", token, _event(token))
        master.add("receipts", token, _receipt(token))
    run = Run(master, persister)
    follower = run.follower
    metrics = ReplicationMetrics(stalled=follower.stalled_seconds, stalls=lambda: follower.stalls)
    try:
        with caplog.at_level(logging.INFO, logger="streamrep.replication.follower"):
            follower.on_position("events", "persister1", 10, 10)  # a gap of 10 facts, writer down
            follower.on_position("receipts", "master", 10, 10)
            assert run.tokens(EVENTS) == [] and run.tokens(RECEIPTS) == list(range(1, 11))
            assert [(s.stream, s.instance, s.position, s.upto) for s in run.stalls] == [
                ("events", "persister1", 0, 10)]
            assert "connection refused" in run.stalls[0].problem
            # The other writer goes on; the stalled one's new facts are not handed on.
            for token in (11, 12):
                master.add("receipts", token, _receipt(token))
                persister.add("events", token, _event(token))
                follower.on_rdata("receipts", "master", token, _receipt(token))
                follower.on_rdata("events", "persister1", token, _event(token))
            assert run.tokens(RECEIPTS) == list(range(1, 13)) and run.tokens(EVENTS) == []
            assert follower.taken_positions()[EVENTS] == 0
            wait_until(lambda: follower.stalled[EVENTS].attempts >= 3)
            assert metrics.registry.get_sample_value(
                "streamrep_replication_stalled_seconds", {"stream": "events", "instance": "persister1"}) > 0
            persister.start()
            wait_until(lambda: run.resumed != [])
        # Everything it held back, once, in order; then it follows the bus again.
        assert run.tokens(EVENTS) == list(range(1, 13))
        assert follower.stalled == {} and follower.taken_positions()[EVENTS] == 12
        follower.on_rdata("events", "persister1", 12, _event(12))  # a replay
        follower.on_rdata("events", "persister1", 13, _event(13))
        assert run.tokens(EVENTS) == list(range(1, 14))
        held_back = [r for r in caplog.records if "holding back events/persister1" in r.getMessage()]
        assert len(held_back) == 1, "said once, however many attempts"
        assert metrics.registry.get_sample_value("streamrep_replication_stalls_total",
                                                 {"stream": "events", "instance": "persister1"}) == 1
        assert metrics.registry.get_sample_value("streamrep_replication_stalled_seconds",
                                                 {"stream": "events", "instance": "persister1"}) is None
        assert run.overlap == 1, "a handler ran while another was running"
        assert len(run.taken) == len(set(run.taken))
    finally:
        run.close()


def test_facts_that_arrive_during_the_background_fill_are_covered(
        writers: tuple[FakeWriter, FakeWriter]) -> None:
    """The bus goes on while the background fill hands on what was held back: the
    fill goes on up to the newest fact before the writer resumes."""
    master, persister = writers
    for token in range(1, 21):
        persister.add("events", token, _event(token))
    run = Run(master, persister)
    follower = run.follower
    fed: list[gevent.Greenlet] = []

    def meanwhile(token: int) -> None:
        persister.add("events", token, _event(token))
        follower.on_rdata("events", "persister1", token, _event(token))
        master.add("receipts", token, _receipt(token))
        follower.on_rdata("receipts", "master", token, _receipt(token))

    original = run.handler

    def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
        original(stream, instance, token, rows)
        if (stream, token) in (("events", 5), ("events", 21)):
            fed.append(gevent.spawn(meanwhile, token + 16))  # 21, then 37

    follower.handler = handler
    try:
        follower.on_position("receipts", "master", 0, 0)
        follower.on_position("events", "persister1", 20, 20)
        assert run.stalls and run.tokens(EVENTS) == []
        persister.start()
        wait_until(lambda: run.resumed != [] and all(g.dead for g in fed))
        assert run.tokens(EVENTS) == list(range(1, 22)) + [37]
        assert run.tokens(RECEIPTS) == [21, 37]
        assert run.overlap == 1 and len(run.resumed) == 1
    finally:
        run.close()


def test_a_refused_secret_stalls_the_writer_and_is_named(writers: tuple[FakeWriter, FakeWriter]) -> None:
    master, persister = writers
    master.add("receipts", 1, _receipt(1))
    persister.start()
    persister.secret = "another"
    persister.add("events", 1, _event(1))
    run = Run(master, persister)
    try:
        run.follower.on_position("events", "persister1", 1, 1)
        run.follower.on_position("receipts", "master", 1, 1)
        assert run.stalls[0].refused and run.follower.refusal is not None
        assert "worker_replication_secret" in run.follower.refusal
        assert run.tokens(RECEIPTS) == [1] and run.tokens(EVENTS) == []
        persister.secret = "s3cret"  # the writer's secret fixed: it answers again
        wait_until(lambda: run.resumed != [])
        assert run.tokens(EVENTS) == [1] and run.follower.refusal is None
    finally:
        run.close()


def test_a_stream_the_writer_does_not_serve_is_an_unfilled_gap(writers: tuple[FakeWriter, FakeWriter]) -> None:
    master, _persister = writers
    gaps: list[tuple[str, str, int, int]] = []
    run = Run(master, _persister, on_gap=lambda *gap: gaps.append(gap), start_from={"un_partial_stated_room": 0})
    try:
        run.follower.on_position("un_partial_stated_room", "master", 7, 7)
        assert gaps == [("un_partial_stated_room", "master", 0, 7)] and run.stalls == []
        assert run.follower.unfilled[("un_partial_stated_room", "master")] == 1
        assert run.follower.taken_positions()[("un_partial_stated_room", "master")] == 7
    finally:
        run.close()


def test_a_follower_held_while_stalled_stops_retrying_and_keeps_its_place(
        writers: tuple[FakeWriter, FakeWriter]) -> None:
    master, persister = writers
    persister.add("events", 3, _event(3))
    run = Run(master, persister)
    try:
        run.follower.on_position("events", "persister1", 3, 3)
        run.follower.hold()
        run.follower.stop_retrying()
        persister.start()
        gevent.sleep(0.2)
        assert run.tokens(EVENTS) == [] and run.follower.taken_positions()[EVENTS] == 0
        run.follower.release()  # a link started again: the fill is retried
        wait_until(lambda: run.resumed != [])
        assert run.tokens(EVENTS) == [3]
    finally:
        run.close()
