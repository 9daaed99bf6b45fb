"""The processes of the end-to-end replication benchmark (run by test_bench_replication.py).

``python bench/replication_roles.py worker HOST:PORT NAME ROWS OUT``: follows
``to_device`` from now on, records when each fact reached the handler, and writes
``{"rows", "first_ns", "last_ns", "facts": [[token, ns], ...]}`` to OUT once ROWS
rows arrived. Prints ``ready`` once connected.

``python bench/replication_roles.py writer HOST:PORT DB FACTS ROWS_PER_FACT RATE OUT``:
persists FACTS to-device facts of ROWS_PER_FACT rows (RATE rows/s, 0 = flat out;
several facts share a transaction: about 5 ms of the rate, or 10,000 rows flat out), announcing each when it commits, and writes ``{"commits": [[token, ns], ...]}``.
RATE -1: persists them all flat out first, then announces them all at once (a
writer coming back with a backlog), so that the workers time the relay alone.

With ``redis://HOST:PORT`` in place of ``HOST:PORT`` both replicate through Redis
pub/sub (channel ``bench.example``) instead of the hub, with up to
``STREAMREP_BENCH_REDIS_LINES`` (default 1) of the writer's lines a message.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import gevent
import orjson

from streamrep.cli._common import freeze_startup_heap


def _security() -> Any:
    """TLS towards the hub when the benchmark runs it with a certificate
    (``STREAMREP_BENCH_TLS_CA``: the CA to check it against)."""
    import os

    from streamrep.replication.security import PeerSecurity

    ca = os.environ.get("STREAMREP_BENCH_TLS_CA")
    return PeerSecurity.from_options(tls=True, ca=ca) if ca else PeerSecurity()


#: The deployment's name, which is the Redis channel.
SERVER_NAME = "bench.example"


def _link(connect: str, name: str, **roles: Any) -> Any:
    """The link to the hub at HOST:PORT, or through Redis at ``redis://...``."""
    from streamrep.replication import LinkSettings, open_link

    if connect.startswith("redis://"):
        import os

        lines = int(os.environ.get("STREAMREP_BENCH_REDIS_LINES", "1"))
        return open_link(LinkSettings(name, SERVER_NAME, redis_url=connect, redis_lines_per_message=lines),
                         **roles)
    host, port = connect.rsplit(":", 1)
    return open_link(LinkSettings(name, SERVER_NAME, hub=(host, int(port)), security=_security()), **roles)


def worker(connect: str, name: str, rows_wanted: int, out_path: str) -> None:

    facts: list[tuple[int, int]] = []
    state = {"rows": 0, "first": 0}
    done = gevent.event.Event()

    def handler(stream: str, instance: str, token: int, rows: list[Any]) -> None:
        now = time.time_ns()
        if not state["first"]:
            state["first"] = now
        facts.append((token, now))
        state["rows"] += len(rows)
        if state["rows"] >= rows_wanted:
            done.set()

    client = _link(connect, name, handler=handler, streams=["to_device"])
    client.start()
    if not client.wait_connected(30):
        raise SystemExit("worker could not connect")
    gevent.sleep(0.2)  # let REPLICATE's answer arrive before the writer starts
    freeze_startup_heap()  # as ``streamrep tail`` does
    print("ready", flush=True)
    done.wait()
    last = facts[-1][1]
    client.stop()
    with open(out_path, "wb") as fh:
        fh.write(orjson.dumps({"rows": state["rows"], "first_ns": state["first"], "last_ns": last,
                               "facts": facts}))


def writer(connect: str, db: str, fact_count: int, rows_per_fact: int, rate: float, out_path: str) -> None:
    from streamrep.db import open_database
    from streamrep.streams import Streams

    instance = "benchwriter"
    backlog = rate < 0  # persist every fact first, then announce them all
    database = open_database(db)
    streams = Streams(database, instance, {"to_device": [instance]})
    positions = lambda: [("to_device", instance, streams.current_token("to_device", instance))]  # noqa: E731
    client = _link(connect, instance, writer_positions=positions)
    commits: list[tuple[int, int]] = []
    # The rows of the fact being committed, exactly as the stream reads them back
    # (``[entity]``, the recipient, ordered by user then device): the writer
    # announces what it wrote without reading it again.
    pending: dict[int, list[tuple[int, bytes]]] = {}

    held: list[tuple[str, str, list[tuple[int, bytes]]]] = []

    def on_advance(stream: str, inst: str, visible: list[int], position: int) -> None:
        committed = time.time_ns()
        rows = [row for token in visible for row in pending.pop(token)]
        if backlog:
            held.append((stream, inst, rows))
            return
        client.announce(stream, inst, rows)
        commits.extend((token, committed) for token in visible)

    streams.add_listener(on_advance)
    client.start()
    if not client.wait_connected(30):
        raise SystemExit("writer could not connect")
    freeze_startup_heap()  # as ``streamrep write`` does
    users = sorted(f"@u{j}:bench" for j in range(rows_per_fact))
    user_heads = [b'["%s' % u.encode() for u in users]
    id_gen = streams.generator("to_device")
    insert = ("INSERT INTO device_inbox (stream_id, instance_name, user_id, device_id, message_json)"
              " VALUES (?, ?, ?, ?, ?)")
    start = time.monotonic()
    done = 0
    while done < fact_count:
        # Several facts per transaction (each its own stream ID): at a set rate
        # about 5 ms of it; flat out about 10,000 rows, as a busy writer batches
        # (fewer commits: the writer's SQLite time is what limits this bench).
        per_txn = int(rate * 0.005) if rate > 0 else 10_000
        batch = min(fact_count - done, max(1, per_txn // rows_per_fact))
        with id_gen.get_next_mult(batch) as stream_ids:
            devices = [(stream_id, f"D{done + offset}") for offset, stream_id in enumerate(stream_ids)]
            for stream_id, device in devices:
                tail = b'"]'
                pending[stream_id] = [(stream_id, head + tail) for head in user_heads]
            # Rows in the order of device_inbox's (user_id, device_id, stream_id) index:
            # SQLite then fills its pages in turn instead of revisiting 1,000 places in
            # it once per fact (about a third less time per row here).
            params = [(stream_id, instance, u, device, '{"n":0}')
                      for u in users for stream_id, device in devices]
            with database.transaction("bench_to_device") as txn:
                txn.executemany(insert, params)
        done += batch
        if rate > 0:
            delay = start + done * rows_per_fact / rate - time.monotonic()
            gevent.sleep(max(delay, 0))
        else:
            gevent.sleep(0)
    elapsed = time.monotonic() - start
    if backlog:
        # Everything is committed: announce it all at once, as a writer does that
        # comes back with a backlog; what the workers see is the relay alone.
        announced = time.time_ns()
        for stream, inst, rows in held:
            client.announce(stream, inst, rows)
            commits.extend((row[0], announced) for row in rows[:1])
    client.flush(60)
    client.stop()
    streams.close()
    database.close()
    with open(out_path, "wb") as fh:
        fh.write(orjson.dumps({"commits": commits, "persist_seconds": elapsed}))


if __name__ == "__main__":
    import signal

    if any(arg.startswith("redis://") for arg in sys.argv):
        from streamrep.cli._common import use_cooperative_sockets

        use_cooperative_sockets()  # redis-py's sockets, as the command-line tools do

    import gevent.event  # noqa: F401
    import gevent.util

    # `kill -USR1` prints every greenlet's stack, to see where a process waits.
    gevent.signal_handler(signal.SIGUSR1, lambda: gevent.util.print_run_info(file=sys.stderr))

    role, *args = sys.argv[1:]
    if role == "worker":
        worker(args[0], args[1], int(args[2]), args[3])
    elif role == "writer":
        writer(args[0], args[1], int(args[2]), int(args[3]), float(args[4]), args[5])
    else:
        raise SystemExit(f"unknown role {role}")
