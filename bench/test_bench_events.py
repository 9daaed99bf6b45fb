"""Event store throughput, compiled core vs pure twin side by side.

* ``test_extremity_core``: the extremity update of a 100-event batch (interned
  buffers prepared beforehand), events/s. Reference: about 139,000 events/s for
  the reference system's in-memory calculation; target 20x that.
  ``test_bench_reference.py`` times the reference's own calculation beside it.
* ``test_persist_*``: ``persist_events`` in batches of 100 on SQLite and
  PostgreSQL (a valid room version 10 history: create, join, power levels, join
  rules, then linear history with a member joining every 20 events, each event
  citing its auth events, IDs counting up; each round's events are built before it
  starts, untimed), events/s over 8 rounds, with the Matrix room rules (``rules-on``,
  the store's default) and without (``rules-off``: ``room_rules=None``) side by side,
  without the event ID check (``verify_event_ids="off"``);
  ``test_persist_*_verify``: rules on, over the same history with the IDs room
  version 10 gives (the events' reference hashes), the check on (``warn``, the
  default) and off; ``test_persist_*_verify_cost``: the same two side by side in
  one process, round by round, and the CPU time ``warn`` takes over ``off``;
  ``test_persist_*_pairing_control``: the same pairing with both stores ``off``,
  the ratios' spread when the two halves do the same work;
  ``test_persist_sqlite_growing_room``: the same over 100,000 events with the
  room rules, as the room grows to 5,000 members, with IDs counting up and with
  reference hashes.
* ``test_persist_sqlite_statements_alone``: the statements the ``rules-on``
  SQLite benchmark runs, recorded and run again by bare ``sqlite3`` (what SQLite
  alone spends on the same batches), events/s over 8 rounds.
* ``test_state_after_event_cached``: ``get_state_after_event`` from cache, lookups/s
  (the same history, room rules on).
* ``test_change_cache``: ``has_entity_changed`` over 1,000 rooms, calls/s.

Each rate goes to ``extra_info`` and is printed with ``-s``.
Run: ``python -m pytest bench/test_bench_events.py --benchmark-only -s``
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any, Iterator

import pytest

from support.forked_batches import core_buffers
from support.message_history import message_history
from support.impls import core_module

BATCH = 100


@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path}/bench.db"


@pytest.fixture
def pg_url() -> Iterator[str]:
    from support.postgres import fresh_schema_dsn, postgres_server_dsn

    with fresh_schema_dsn(postgres_server_dsn()) as url:
        yield url


def _report(benchmark: Any, name: str, count: int, impl_kind: str) -> None:
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    rate = count / benchmark.stats.stats.mean
    median_rate = count / benchmark.stats.stats.median
    benchmark.extra_info[name] = round(rate)
    benchmark.extra_info[f"{name}_median"] = round(median_rate)
    print(f"\n{benchmark.name}: {rate:,.0f} {name.replace('_', ' ')} (mean), "
          f"{median_rate:,.0f} (median) ({impl_kind})")


@pytest.fixture
def use_impl(impl_kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the event store's core modules at *impl_kind* for this benchmark."""
    import streamrep.events.dag as dag
    import streamrep.events.persist as persist
    import streamrep.events.room_state as room_state
    import streamrep.events.state as state
    import streamrep.events.store as store
    import streamrep.events.authorize as authorize
    import streamrep.events.plan as plan
    import streamrep.events.verify as verify
    import streamrep.events.writes as writes
    import streamrep.matrix.batchcheck as batchcheck
    import streamrep.matrix.eventformat as eventformat

    monkeypatch.setattr(dag, "_core_ext", core_module("extremities", impl_kind))
    for module in (dag, persist, room_state, authorize, plan, verify, writes):
        monkeypatch.setattr(module, "_batchrows", core_module("batchrows", impl_kind))
    monkeypatch.setattr(state, "_core_state", core_module("state", impl_kind))
    monkeypatch.setattr(store, "_core_changecache", core_module("changecache", impl_kind))
    monkeypatch.setattr(store, "parse_batch", core_module("eventrecord", impl_kind).parse_batch)
    monkeypatch.setattr(batchcheck, "_plaincheck", core_module("plaincheck", impl_kind))
    monkeypatch.setattr(eventformat, "_eventhash", core_module("eventhash", impl_kind))
    return impl_kind


def test_extremity_core(benchmark: Any, impl_kind: str) -> None:
    mod = core_module("extremities", impl_kind)
    batches = [core_buffers(seed, BATCH) for seed in range(50)]

    def run() -> None:
        for b in batches:
            mod.update_extremities(*b)

    benchmark(run)
    _report(benchmark, "events_per_s", BATCH * len(batches), impl_kind)


RULES = ("rules-off", "rules-on")


def _persist_bench(benchmark: Any, url: str, impl_kind: str, rules: str,
                   verify: str = "off", hash_ids: bool = False) -> None:
    from streamrep import EventStore

    store = (EventStore(url, verify_event_ids=verify) if rules == "rules-on"
             else EventStore(url, room_rules=None, verify_event_ids=verify))
    source = message_history("!bench:x", hash_ids)
    batches_per_round = 30

    def next_round() -> tuple[tuple[list[list[dict[str, Any]]]], dict[str, Any]]:
        # Built before the round starts: making the events is not persisting them.
        made = [[next(source) for _ in range(BATCH)] for _ in range(batches_per_round)]
        # Nor is the cyclic collector's walk over them: a worker's events arrive a
        # batch at a time and do not pile up in the oldest generation as these would.
        gc.collect()
        return (made,), {}

    def run(batches: list[list[dict[str, Any]]]) -> None:
        for batch in batches:
            if store.persist_events(batch).rejected:
                raise AssertionError("the benchmark's room broke the room rules")

    try:
        benchmark.pedantic(run, setup=next_round, rounds=8, iterations=1, warmup_rounds=1)
        _report(benchmark, "events_per_s", BATCH * batches_per_round,
                f"{impl_kind}, {rules}, verify {verify}{', hash IDs' if hash_ids else ''}")
        if verify != "off":
            assert store.unverified_events == {}
    finally:
        store.close()


@pytest.mark.parametrize("rules", list(RULES))
def test_persist_sqlite(benchmark: Any, use_impl: str, sqlite_url: str, rules: str) -> None:
    _persist_bench(benchmark, sqlite_url, use_impl, rules)


@pytest.mark.postgres
@pytest.mark.parametrize("rules", list(RULES))
def test_persist_postgres(benchmark: Any, use_impl: str, pg_url: str, rules: str) -> None:
    _persist_bench(benchmark, pg_url, use_impl, rules)


@pytest.mark.parametrize("verify", ["off", "warn"])
def test_persist_sqlite_verify(benchmark: Any, use_impl: str, sqlite_url: str,
                               verify: str) -> None:
    """The rules-on benchmark over events with the IDs room version 10 gives them
    (reference hashes), with the ID and content hash check (``warn``, the default)
    and without: the check's cost is the ratio of the two rows."""
    _persist_bench(benchmark, sqlite_url, use_impl, "rules-on", verify, hash_ids=True)


@pytest.mark.postgres
@pytest.mark.parametrize("verify", ["off", "warn"])
def test_persist_postgres_verify(benchmark: Any, use_impl: str, pg_url: str,
                                 verify: str) -> None:
    _persist_bench(benchmark, pg_url, use_impl, "rules-on", verify, hash_ids=True)


def _timed(spent: list[float], function: Any) -> Any:
    """*function*, adding the CPU time of each call to ``spent[0]``."""

    def timed(*args: Any) -> Any:
        start = time.process_time()
        try:
            return function(*args)
        finally:
            spent[0] += time.process_time() - start

    return timed


def _verify_cost_bench(benchmark: Any, urls: tuple[str, str], impl_kind: str,
                       database_cpu: Any = None, second: str = "warn") -> None:
    """Two stores over the same history (rules on, IDs that are reference hashes),
    one with the check ``off``, one with ``warn``. Each of 16 rounds persists 30
    batches of 100 into each, in turns (which goes first alternates), and takes the
    CPU time of each half (``time.process_time``). The check's cost is the median
    over the rounds of warn / off: each ``warn`` half is paired with the ``off`` half
    that persisted the same events just before or after it, so the room's growth and
    the machine's moods cancel out. *database_cpu*, where the database is a server of
    its own: ``url -> CPU seconds its sessions have used so far``, to report the cost
    of persisting as a whole (this process and the database's sessions serving it),
    summed over the rounds (the kernel counts a process's CPU in 10 ms ticks). The
    check's own CPU time (the store's ``check_early`` and ``verify_planned``, which
    only ``warn`` calls) is reported beside, per event and against ``off``'s CPU time
    per event: this process's, and with *database_cpu* also with its sessions'.
    *second* ``"off"`` makes the ``warn`` store a second ``off`` one: the ratios of
    two stores doing the same work, how far this pairing strays by itself."""
    import streamrep.events.store as store_module
    from streamrep import EventStore

    modes = ("off", "warn")
    stores = {"off": EventStore(urls[0], verify_event_ids="off"),
              "warn": EventStore(urls[1], verify_event_ids=second)}
    url_of = dict(zip(modes, urls))
    sources = {mode: message_history("!bench:x", hash_ids=True) for mode in stores}
    ratios: list[float] = []
    whole = {mode: 0.0 for mode in modes}  # this process + the database, every round
    wall = {mode: 0.0 for mode in modes}  # elapsed, every round

    def next_round() -> tuple[tuple[dict[str, list[list[dict[str, Any]]]]], dict[str, Any]]:
        return ({mode: [[next(sources[mode]) for _ in range(BATCH)] for _ in range(30)]
                 for mode in stores},), {}

    def run(batches: dict[str, list[list[dict[str, Any]]]]) -> None:
        spent: dict[str, float] = {}
        order = ("off", "warn") if len(ratios) % 2 else ("warn", "off")
        for mode in order:
            served = database_cpu(url_of[mode]) if database_cpu else 0.0
            start, clock = time.process_time(), time.perf_counter()
            for batch in batches[mode]:
                stores[mode].persist_events(batch)
            spent[mode] = time.process_time() - start
            elapsed = time.perf_counter() - clock
            served = (database_cpu(url_of[mode]) if database_cpu else 0.0) - served
            if ratios:  # not the warm-up round
                whole[mode] += spent[mode] + served
                wall[mode] += elapsed
        ratios.append(spent["warn"] / spent["off"])
        if len(ratios) == 1:  # the warm-up round
            checking[0] = 0.0
        else:
            off_cpu[0] += spent["off"]

    checking = [0.0]
    off_cpu = [0.0]
    saved = store_module.check_early, store_module.verify_planned
    store_module.check_early = _timed(checking, saved[0])
    store_module.verify_planned = _timed(checking, saved[1])
    try:
        benchmark.pedantic(run, setup=next_round, rounds=16, iterations=1, warmup_rounds=1)
        assert stores["warn"].unverified_events == {}
        if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
            return
        ratios.pop(0)  # the warm-up round
        _report_pairs(benchmark, f"{second} / off", ratios, wall,
                      whole if database_cpu is not None else None, impl_kind)
        if second == "warn":
            _report_check(benchmark, checking[0], off_cpu[0], len(ratios) * 30 * BATCH,
                          whole["off"] if database_cpu is not None else None, impl_kind)
    finally:
        store_module.check_early, store_module.verify_planned = saved
        for store in stores.values():
            store.close()


def _report_pairs(benchmark: Any, label: str, ratios: list[float], wall: dict[str, float],
                  whole: dict[str, float] | None, impl_kind: str) -> None:
    """Print and record what the paired rounds of :func:`_verify_cost_bench` found."""
    ratios = sorted(ratios)
    median = statistics.median(ratios)
    quarter = len(ratios) // 4
    benchmark.extra_info["warn_over_off_cpu"] = round(median, 3)
    print(f"\n{benchmark.name}: {label} CPU time, median of {len(ratios)} rounds "
          f"{median:.3f} (quartiles {ratios[quarter]:.3f} to {ratios[-1 - quarter]:.3f}) "
          f"({impl_kind})")
    benchmark.extra_info["warn_over_off_elapsed"] = round(wall["warn"] / wall["off"], 3)
    print(f"{benchmark.name}: {label} elapsed time, {len(ratios)} rounds summed: "
          f"{wall['warn'] / wall['off']:.3f} ({impl_kind})")
    if whole is not None:
        overall = whole["warn"] / whole["off"]
        benchmark.extra_info["warn_over_off_cpu_with_database"] = round(overall, 3)
        print(f"{benchmark.name}: {label} CPU time of this process and the database's "
              f"sessions, {len(ratios)} rounds summed: {overall:.3f} "
              f"({whole['warn']:.2f} s / {whole['off']:.2f} s) ({impl_kind})")


def _report_check(benchmark: Any, checking: float, off_cpu: float, events: int,
                  off_whole: float | None, impl_kind: str) -> None:
    """Print and record the check's own CPU time (*checking* seconds over *events*)
    against ``off``'s: this process's (*off_cpu*), and with the database's sessions
    (*off_whole*) where they are counted."""
    own = checking / off_cpu
    benchmark.extra_info["check_cpu_us_per_event"] = round(checking / events * 1e6, 3)
    benchmark.extra_info["check_over_off_cpu"] = round(own, 3)
    print(f"{benchmark.name}: the check's own CPU time {checking / events * 1e6:.2f} µs "
          f"an event, {own:.3f} of off's {off_cpu / events * 1e6:.1f} µs ({impl_kind})")
    if off_whole is not None:
        share = checking / off_whole
        benchmark.extra_info["check_over_off_cpu_with_database"] = round(share, 3)
        print(f"{benchmark.name}: the check's own CPU time, {share:.3f} of off's CPU time "
              f"with the database's sessions ({off_whole / events * 1e6:.1f} µs an event) "
              f"({impl_kind})")


def test_persist_sqlite_verify_cost(benchmark: Any, use_impl: str, tmp_path: Any) -> None:
    _verify_cost_bench(benchmark, (f"sqlite:///{tmp_path}/off.db",
                                   f"sqlite:///{tmp_path}/warn.db"), use_impl)


def _postgres_sessions_cpu(server_dsn: str) -> Any:
    """``url -> CPU seconds`` of the PostgreSQL sessions serving a URL of
    ``fresh_schema_dsn`` (its application_name), read from /proc; one connection of
    its own asks for their process IDs."""
    from urllib.parse import parse_qs, urlsplit

    import psycopg2
    from support.processes import cpu_seconds

    monitor = psycopg2.connect(server_dsn)
    monitor.autocommit = True

    def cpu(url: str) -> float:
        name = parse_qs(urlsplit(url).query)["application_name"][0]
        with monitor.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                        (name,))
            return cpu_seconds([pid for (pid,) in cur.fetchall()])

    cpu.close = monitor.close  # type: ignore[attr-defined]
    return cpu


@pytest.mark.postgres
def test_persist_postgres_verify_cost(benchmark: Any, use_impl: str) -> None:
    _postgres_pairs(benchmark, use_impl, "warn")


def _postgres_pairs(benchmark: Any, use_impl: str, second: str) -> None:
    """:func:`_verify_cost_bench` over two fresh schemas of the test server."""
    from support.postgres import fresh_schema_dsn, postgres_server_dsn

    server = postgres_server_dsn()
    sessions_cpu = _postgres_sessions_cpu(server)
    try:
        with fresh_schema_dsn(server) as first, fresh_schema_dsn(server) as then:
            _verify_cost_bench(benchmark, (first, then), use_impl, sessions_cpu, second)
    finally:
        sessions_cpu.close()


def test_persist_sqlite_pairing_control(benchmark: Any, use_impl: str, tmp_path: Any) -> None:
    """``verify_cost``'s pairing with both stores ``off``: how far its ratios stray
    when the two halves do the same work."""
    _verify_cost_bench(benchmark, (f"sqlite:///{tmp_path}/off.db",
                                   f"sqlite:///{tmp_path}/off2.db"), use_impl, second="off")


@pytest.mark.postgres
def test_persist_postgres_pairing_control(benchmark: Any, use_impl: str) -> None:
    """The same on PostgreSQL."""
    _postgres_pairs(benchmark, use_impl, "off")


@pytest.mark.parametrize("ids", ["counting", "hashes"])
def test_persist_sqlite_growing_room(benchmark: Any, use_impl: str, sqlite_url: str,
                                     ids: str) -> None:
    """100,000 events into one room (a join every 20 events: 5,000 members at the
    end), in batches of 100: the rate over the whole run and per 10,000 events, to
    show how persisting keeps up as the room's state and the tables grow; with IDs
    that count up, or with the reference hashes room versions 3 on give (random
    keys to the B-trees that hold event IDs)."""
    from streamrep import EventStore

    store = EventStore(sqlite_url, verify_event_ids="off")
    source = message_history("!growing:x", hash_ids=ids == "hashes")
    windows = [[[next(source) for _ in range(BATCH)] for _ in range(100)] for _ in range(10)]
    rates: list[int] = []

    def run() -> None:
        for batches in windows:
            window_start = time.perf_counter()
            for batch in batches:
                store.persist_events(batch)
            rates.append(round(100 * BATCH / (time.perf_counter() - window_start)))

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
        benchmark.extra_info["events_per_s_each_10k"] = rates
        _report(benchmark, "events_per_s", 100_000, f"{use_impl}, IDs {ids}")
        print(f"{benchmark.name}: per 10,000 events {rates}")
    finally:
        store.close()


def test_persist_sqlite_statements_alone(benchmark: Any, tmp_path: Any,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQL of the ``rules-on`` persist benchmark without the store: every
    statement (and its parameters) the store runs for 8 rounds of 30 batches is
    recorded, then the same transactions are run by bare ``sqlite3`` on a copy of
    the database as it was before them, in rounds of 30 batches, checkpointed as
    the store's database is (a thread after commits). What persisting the same
    batches costs SQLite alone, the floor of the persist rates."""
    import shutil
    import sqlite3

    from streamrep import EventStore
    from streamrep.db.checkpoint import WalCheckpointer
    from streamrep.db.pool import SAFETY_CHECKPOINT_PAGES
    from streamrep.db.transaction import Transaction

    url = f"sqlite:///{tmp_path}/bench.db"
    source = message_history("!bench:x")
    with EventStore(url, verify_event_ids="off") as store:
        for _ in range(30):
            store.persist_events([next(source) for _ in range(BATCH)])
    shutil.copy(tmp_path / "bench.db", tmp_path / "replay.db")
    recorded: list[list[tuple[str, str, Any]]] = []
    execute, executemany = Transaction.execute, Transaction.executemany

    def record_execute(txn: Transaction, sql: str, params: Any = ()) -> None:
        recorded[-1].append(("execute", sql, tuple(params)))
        execute(txn, sql, params)

    def record_executemany(txn: Transaction, sql: str, rows: Any) -> None:
        rows = list(rows)
        recorded[-1].append(("executemany", sql, rows))
        executemany(txn, sql, rows)

    with EventStore(url, verify_event_ids="off") as store:
        monkeypatch.setattr(Transaction, "execute", record_execute)
        monkeypatch.setattr(Transaction, "executemany", record_executemany)
        for _ in range(8 * 30):
            recorded.append([])
            store.persist_events([next(source) for _ in range(BATCH)])
        monkeypatch.undo()
    conn = sqlite3.connect(tmp_path / "replay.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    # Checkpointed as the store's connection is: by a thread after commits, SQLite's
    # own checkpoint (and its fsync inside a COMMIT) only as a bound.
    conn.execute(f"PRAGMA wal_autocheckpoint={SAFETY_CHECKPOINT_PAGES}")
    checkpointer = WalCheckpointer(str(tmp_path / "replay.db"), busy_timeout_ms=5000)
    rounds = iter([recorded[i:i + 30] for i in range(0, len(recorded), 30)])

    def next_round() -> tuple[tuple[list[list[tuple[str, str, Any]]]], dict[str, Any]]:
        return (next(rounds),), {}

    def run(transactions: list[list[tuple[str, str, Any]]]) -> None:
        for statements in transactions:
            conn.execute("BEGIN IMMEDIATE")
            for kind, sql, params in statements:
                if kind == "execute":
                    conn.execute(sql, params).fetchall()
                else:
                    conn.executemany(sql, params)
            conn.execute("COMMIT")
            checkpointer.nudge()

    try:
        benchmark.pedantic(run, setup=next_round, rounds=8, iterations=1)
        _report(benchmark, "events_per_s", BATCH * 30, "bare sqlite3, rules-on statements")
    finally:
        checkpointer.close()
        conn.close()


def test_state_after_event_cached(benchmark: Any, use_impl: str, sqlite_url: str) -> None:
    from streamrep import EventStore

    store = EventStore(sqlite_url, verify_event_ids="off")
    source = message_history("!state:x")
    ids = []
    for _ in range(10):
        batch = [next(source) for _ in range(BATCH)]
        store.persist_events(batch)
        ids.extend(e["event_id"] for e in batch)
    for event_id in ids:
        store.get_state_after_event(event_id)  # warm the cache

    def run() -> None:
        get = store.get_state_after_event
        for event_id in ids:
            get(event_id)

    try:
        benchmark(run)
        _report(benchmark, "lookups_per_s", len(ids), use_impl)
    finally:
        store.close()


def test_change_cache(benchmark: Any, impl_kind: str) -> None:
    mod = core_module("changecache", impl_kind)
    cache = mod.StreamChangeCache("rooms", 0, max_size=100_000)
    rng = random.Random(7)
    rooms = [f"!room{n}:example.org" for n in range(1000)]
    for pos in range(1, 50_001):
        cache.entity_has_changed(rng.choice(rooms), pos)
    probes = [(rng.choice(rooms), rng.randrange(40_000, 50_000)) for _ in range(10_000)]

    def run() -> None:
        changed = cache.has_entity_changed
        for room, pos in probes:
            changed(room, pos)

    benchmark(run)
    _report(benchmark, "calls_per_s", len(probes), impl_kind)
