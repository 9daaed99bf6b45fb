"""Writer leases: a second process with a writer's instance name is refused, naming
the holder; a crashed writer's lease expires; a writer that lost its lease stops."""

from __future__ import annotations

import os
import socket
import time
from typing import Iterator

import gevent
import pytest

from streamrep.db import Database
from streamrep.errors import WriterLeaseHeldError, WriterLeaseLostError
from streamrep.idgen import BackingTable, WriterLease, make_id_generator


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database.open(db_url)
    yield database
    database.close()


def test_a_second_holder_is_refused_with_one_line_naming_the_first(db: Database) -> None:
    first = WriterLease(db, "writer1", ["caches", "receipts"], ttl=30)
    first.acquire()
    try:
        second = WriterLease(db, "writer1", ["receipts"], ttl=30)
        with pytest.raises(WriterLeaseHeldError) as caught:
            second.acquire()
        message = str(caught.value)
        assert "\n" not in message
        assert f"host {socket.gethostname()} pid {os.getpid()}" in message
        assert "writer writer1 is already running" in message and "receipts (" in message
        assert " since 20" in message and "expires in " in message
        # Another instance, or this instance on a stream it did not take, is free.
        with WriterLease(db, "writer2", ["receipts"], ttl=30):
            pass
        with WriterLease(db, "writer1", ["to_device"], ttl=30):
            pass
        # All or nothing: refused on receipts, so to_device was not kept either.
        both = WriterLease(db, "writer1", ["to_device", "receipts"], ttl=30)
        with pytest.raises(WriterLeaseHeldError):
            both.acquire()
        with WriterLease(db, "writer1", ["to_device"], ttl=30):
            pass
    finally:
        first.release()
    # Released on a clean stop: the next process takes it at once.
    with WriterLease(db, "writer1", ["caches", "receipts"], ttl=30) as again:
        assert again.held
    assert db.fetchval("SELECT COUNT(*) FROM writer_leases") == 0


def test_a_crashed_holders_lease_expires_and_the_old_holder_stops(db: Database) -> None:
    lost: list[WriterLeaseLostError] = []
    crashed = WriterLease(db, "writer1", ["caches"], ttl=1.5, on_lost=lost.append)
    crashed.acquire()
    assert crashed._renewer is not None
    crashed._renewer.kill()  # as if the process froze: no more renewals
    crashed._renewer = None
    with pytest.raises(WriterLeaseHeldError):
        WriterLease(db, "writer1", ["caches"], ttl=1.5).acquire()
    gevent.sleep(1.7)
    successor = WriterLease(db, "writer1", ["caches"], ttl=30)
    successor.acquire()
    try:
        # The frozen one cannot tell it expired until it checks or renews.
        with pytest.raises(WriterLeaseLostError, match="not renewed within"):
            crashed.check()
        with pytest.raises(WriterLeaseLostError, match="another process took over"):
            crashed.renew()
        successor.check()
    finally:
        successor.release()


def test_renewal_keeps_the_lease_and_a_lost_lease_refuses_stream_ids(db: Database) -> None:
    db.execute("CREATE TABLE notes (stream_id BIGINT NOT NULL, instance_name TEXT)")
    gen = make_id_generator(db, "notes", "writer1", ["writer1"], [BackingTable("notes")])
    lost: list[WriterLeaseLostError] = []
    lease = WriterLease(db, "writer1", ["notes"], ttl=1.5, on_lost=lost.append)
    lease.acquire()
    lease.guard([gen])
    try:
        gevent.sleep(2.0)  # longer than the ttl: renewed meanwhile
        assert lease.held and not lost
        with gen.get_next() as stream_id:
            assert stream_id == 1
        # Another process takes over (the row rewritten as if ours had expired).
        db.execute("UPDATE writer_leases SET token = 'other', holder = 'host x pid 1'")
        deadline = time.monotonic() + 3
        while not lost and time.monotonic() < deadline:
            gevent.sleep(0.05)
        assert lost and "took over" in str(lost[0])
        with pytest.raises(WriterLeaseLostError):
            with gen.get_next():
                pass
        assert gen.in_flight == 0
        # A write already under way when the lease went is rolled back, not committed.
        with pytest.raises(WriterLeaseLostError):
            db.execute("INSERT INTO notes (stream_id, instance_name) VALUES (2, 'writer1')")
        assert db.fetchval("SELECT COUNT(*) FROM notes WHERE stream_id = 2") == 0
    finally:
        lease.release()
