"""``streamrep demo``: a hub, writers and workers, checked end to end."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from streamrep.demo.report import percentile
from streamrep.demo.verify import check_worker
from streamrep.demo.workload import Workload

DEMO_ARGS = ["--duration", "3", "--rate", "120", "--rooms", "4", "--workers", "2",
             "--catch-up-timeout", "60"]


def run_demo(tmp_path: pathlib.Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("STREAMREP_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "streamrep", "demo", *DEMO_ARGS, "--workdir",
         str(tmp_path / "demo"), *extra],
        capture_output=True, text=True, timeout=240, env=env)


def assert_passed(proc: subprocess.CompletedProcess[str], workers: int) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"exactly-once check passed: {workers} workers" in proc.stdout
    assert "facts: 0 lost, 0 duplicated" in proc.stdout
    # Every stream of the workload was written and appears in the tables.
    for stream in ("events", "backfill", "caches", "account_data", "receipts", "to_device"):
        assert stream in proc.stdout


def test_demo_on_sqlite(tmp_path: pathlib.Path) -> None:
    proc = run_demo(tmp_path)
    assert_passed(proc, 2)
    assert "writers writer1," in proc.stderr
    # Plain progress lines when stderr is not a terminal.
    assert "] writing: written" in proc.stderr
    received = (tmp_path / "demo" / "worker1.facts.jsonl").read_text().splitlines()
    assert len(received) > 50


def test_demo_survives_a_hub_killed_mid_run(tmp_path: pathlib.Path) -> None:
    proc = run_demo(tmp_path, "--restart-hub-after", "1.5")
    assert_passed(proc, 2)
    assert "killed the hub (SIGKILL); starting it again" in proc.stderr
    assert (tmp_path / "demo" / "hub-2.log").exists()


@pytest.mark.postgres
def test_demo_on_postgres_with_two_writers(tmp_path: pathlib.Path, pg_url: str) -> None:
    proc = run_demo(tmp_path, "--db", pg_url)
    assert_passed(proc, 2)
    assert "writers writer1, writer2," in proc.stderr
    # The second writer shared the multi-writer streams.
    assert (tmp_path / "demo" / "writer2.facts.jsonl").read_text().count("to_device") > 0


def test_check_counts_lost_duplicated_and_unexpected() -> None:
    in_db = {("events", "w1", 1), ("events", "w1", 2), ("receipts", "w1", 5)}
    committed = {("events", "w1", 1): 10.0, ("events", "w1", 2): 10.0,
                 ("receipts", "w1", 4): 10.0, ("receipts", "w1", 5): 10.0}
    good = check_worker(in_db, committed, [
        ("events", "w1", 1, 10.001), ("events", "w1", 2, 10.002),
        ("receipts", "w1", 4, 10.003),  # replaced by 5 since: committed, so fine
        ("receipts", "w1", 5, 10.004)])
    assert not good.lost and not good.duplicated and not good.unexpected
    assert [round(x, 3) for x in good.lag_ms] == [1.0, 2.0, 3.0, 4.0]
    bad = check_worker(in_db, committed, [
        ("events", "w1", 1, 10.0), ("events", "w1", 1, 10.0), ("events", "w2", 9, 10.0)])
    assert bad.lost == {("events", "w1", 2), ("receipts", "w1", 5)}
    assert bad.duplicated == {("events", "w1", 1): 2} and bad.duplicates == 1
    assert bad.unexpected == {("events", "w2", 9)}
    # A fact in the database when the run started, replaced since, was right to receive.
    earlier = check_worker(in_db, committed, [("receipts", "w1", 1, 9.0)],
                           there_before={("receipts", "w1", 1)})
    assert not earlier.unexpected and earlier.lag_ms == []


def test_workload_is_seeded_and_covers_every_kind() -> None:
    def ops(seed: int) -> list[tuple[str, list[str]]]:
        workload = Workload(seed, rooms=6)
        out = []
        for _ in range(1500):
            op = workload.next_op()
            out.append((op.label, [e["event_id"] for e in op.events]))
        return out

    first = ops(5)
    assert first == ops(5)
    assert first != ops(6)
    labels = {label for label, _ in first}
    assert labels >= {"create_room", "join_remote_room", "message", "fork", "join", "leave",
                      "invite", "state", "visibility", "redaction", "backfill",
                      "account_data", "receipt", "to_device", "cache_invalidation"}


def test_workload_forks_share_parents_and_merge() -> None:
    workload = Workload(3, rooms=2)
    for _ in range(2000):
        op = workload.next_op()
        if op.label == "fork":
            a, b = op.events
            assert a["prev_events"] == b["prev_events"] and a["depth"] == b["depth"]
            following = workload.next_op()
            while following.kind != "events" or following.events[0]["room_id"] != a["room_id"]:
                following = workload.next_op()
            assert set(following.events[0]["prev_events"]) == {a["event_id"], b["event_id"]}
            return
    pytest.fail("no fork in 2000 operations")


@pytest.mark.parametrize("version_id", ["10", "11"])
def test_workload_rooms_pass_the_matrix_rules(sqlite_url: str, version_id: str) -> None:
    """Through a store with the room rules (the default), the workload's events are
    neither rejected nor soft-failed, and each room's joined members are the
    workload's."""
    from streamrep.events import EventStore

    workload = Workload(4, rooms=3, room_version_id=version_id)
    store = EventStore(sqlite_url)
    labels = set()
    try:
        for _ in range(1200):
            op = workload.next_op()
            labels.add(op.label)
            if op.kind in ("events", "backfill"):
                result = store.persist_events(op.events, backfilled=op.kind == "backfill")
                assert result.rejected == {}, (op.label, dict(result.rejected))
        assert {"fork", "ban", "leave", "invite", "state", "backfill", "redaction"} <= labels
        assert store.db.fetchval("SELECT COUNT(*) FROM events WHERE soft_failed OR rejected") == 0
        assert store.db.fetchval("SELECT COUNT(*) FROM event_auth") > 0
        for room in workload.rooms:
            assert store.db.fetchval("SELECT room_version FROM rooms WHERE room_id = ?",
                                     (room.room_id,)) == version_id
            joined = {r[0] for r in store.db.fetchall(
                "SELECT state_key FROM current_state_events WHERE room_id = ? AND type = ?"
                " AND membership = ?", (room.room_id, "m.room.member", "join"))}
            assert joined == room.members
    finally:
        store.close()


def test_workload_refuses_room_versions_it_cannot_build() -> None:
    with pytest.raises(ValueError, match="versions 3 to 11"):
        Workload(1, rooms=1, room_version_id="12")


def test_percentile() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 50) != percentile([], 50)  # NaN


def test_worker_sync_check_catches_a_change_cache_that_missed_a_room(sqlite_url: str) -> None:
    from streamrep.catalogue import known_streams
    from streamrep.config import load_config
    from streamrep.db import Database
    from streamrep.demo.streams import demo_streams
    from streamrep.demo.worker import DemoWorker
    from streamrep.events import EventStore

    writers = {s: ["writer1"] for s in ("events", "backfill", "caches", "account_data",
                                        "to_device", "receipts")}
    config = load_config(None, {"server_name": "t.example", "database": sqlite_url,
                                "instance_map": {"writer1": {}}, "stream_writers": writers},
                         streams=known_streams())
    db = Database.open(sqlite_url)
    streams = demo_streams(db, "writer1", config.stream_writers)
    store = EventStore(db, streams=streams)
    worker = DemoWorker(config, "w1", seed=1)
    follower = worker.client.follower
    assert follower is not None
    workload = Workload(2, rooms=1)
    room = workload.rooms[0]

    def persist_and_deliver(ops: int) -> int:
        before = int(streams.current_token("events", "writer1"))
        for _ in range(ops):
            op = workload.next_op()
            if op.kind == "events":
                store.persist_events(op.events)
        upto = int(streams.current_token("events", "writer1"))
        rows, _ = streams.get_updates_since("events", "writer1", before, upto, 10_000)
        for i, (token, row) in enumerate(rows):
            last = i + 1 == len(rows) or rows[i + 1][0] != token
            follower.on_rdata("events", "writer1", token if last else None, row)
        return upto

    position = persist_and_deliver(40)
    assert worker.sync_once(user=room.creator, since=0)
    assert worker.sync_mismatches == 0

    # A worker that moves its position without applying the rows (a bug) answers
    # "nothing changed" for the room: the check must say so.
    message = workload._op_message(room)
    store.persist_events(message.events)
    newer = int(streams.current_token("events", "writer1"))
    assert newer > position
    follower.positions[("events", "writer1")] = newer
    worker.store.advance_position(newer)
    assert not worker.sync_once(user=room.creator, since=position)
    assert worker.sync_mismatches == 1
    assert "change cache gave 0 events, database 1" in worker.mismatch_examples[0]
    streams.close()
    worker.source.streams.close()
    worker.store.close()
    db.close()
