"""Writing a compression change set to a live database, safely and resumably.

The change set (``streamrep spark compress`` output: ``changes/`` and
``change_rows/``) is read a window of whole units (rooms, or shares of giant
ones) at a time, so memory stays bounded however large the set, and applied in
transactions of about ``batch_groups`` groups: small units are packed together
into one transaction, a unit larger than that gets transactions of its own.
Within a transaction the groups to restore come first (prev first), then the
rewrites, then the deletions (leaves first). Each transaction:

1. locks ``state_group_edges`` and ``event_to_state_groups`` against writers
   (PostgreSQL ``SHARE ROW EXCLUSIVE``, held for the transaction only; SQLite
   ``BEGIN IMMEDIATE``), so no group gains a child or a reference meanwhile;
2. reads the current prev, delta rows, children and references of its groups
   and sorts each group into: as read (apply it), already rewritten (a rerun:
   nothing to do), or changed since (skip it: its prev or rows differ, it
   gained a child, or, for a deletion, it is now referenced or needed);
3. rewrites (or deletes) the groups to apply;
4. recomputes the full state of every rewritten group by walking its chain in
   SQL and compares its digest with the one the job verified; a difference
   rolls the transaction back and stops. When the transaction held several
   units, they are first re-applied one transaction each, so every unit
   before the one that differs is committed and the error names its groups.

A group changed since the compress run is skipped on its own: the other groups
of its unit and the other units of its transaction are applied.

A compressed group's full state never changes, so every committed transaction
leaves the tables consistent: stopping at any point (even SIGKILL) and rerunning
is safe, and the rerun finds the committed groups already rewritten.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow.dataset as ds

from streamrep import _impl
from streamrep.db.url import POSTGRES, parse_database_url
from streamrep.errors import ConfigError, StateVerificationError

__all__ = ["ApplyReport", "apply_compression", "read_change_set"]

log = logging.getLogger("streamrep.state.compress")

#: Groups per transaction.
DEFAULT_BATCH_GROUPS = 1000

#: Changed groups read into memory at a time (whole units). A rewritten
#: snapshot carries its old full state, so one can take ten KB or more.
WINDOW_GROUPS = 20_000

#: A multiset of delta rows ``(type, state_key, event_id)``.
Rows = Counter[tuple[str, str, str]]


@dataclass
class ApplyReport:
    """What an apply run did."""

    rows_before: int = 0
    rows_after: int = 0
    rewritten: int = 0
    already_rewritten: int = 0
    deleted: int = 0
    already_deleted: int = 0
    restored: int = 0
    already_restored: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    verified: int = 0
    transactions: int = 0
    seconds: float = 0.0

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def merge(self, other: "ApplyReport") -> None:
        """Add the group counts of *other* (one committed transaction)."""
        for name in ("rewritten", "already_rewritten", "deleted", "already_deleted", "restored",
                     "already_restored", "verified"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for reason, count in other.skipped.items():
            self.skip(reason, count)

    def summary(self) -> str:
        skipped = sum(self.skipped.values())
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        return (
            f"state_groups_state {self.rows_before} -> {self.rows_after} rows; rewrote "
            f"{self.rewritten} groups ({self.already_rewritten} already), deleted {self.deleted} "
            f"({self.already_deleted} already), "
            + (f"restored {self.restored} ({self.already_restored} already), "
               if self.restored or self.already_restored else "")
            + f"skipped {skipped}"
            + (f" ({reasons})" if reasons else "")
            + f"; verified {self.verified} groups in {self.transactions} transactions, "
            f"{self.seconds:.2f}s"
        )


@dataclass
class Change:
    """One group of the change set."""

    group: int
    action: str  # "rewrite", "delete", or "restore" (undoing a deletion)
    room_id: str
    old_prev: int | None
    new_prev: int | None
    children: int
    digest: str | None
    group_event_id: str | None = None
    old_rows: Rows = field(default_factory=Counter)
    new_rows: Rows = field(default_factory=Counter)
    #: (row count, rows hash) of the delta before and after (see treewalk.rows_hash)
    old_held: tuple[int, int] = (0, 0)
    new_held: tuple[int, int] = (0, 0)


def _check_change_set(directory: str) -> None:
    for name in ("changes", "change_rows"):
        if not os.path.isdir(os.path.join(directory, name)):
            raise ConfigError(f"{directory} has no {name}/: give the output directory of "
                              "`streamrep spark compress`")
    if not os.path.exists(os.path.join(directory, "_SUCCESS")):
        raise ConfigError(f"{directory} is not a complete compression output (no _SUCCESS)")


def _read_changes(directory: str, units: tuple[int, int] | None = None,
                  old_rows: bool = True) -> dict[int, list[Change]]:
    """The changes of the units ``lo..hi`` (all with None) under *directory*, by
    unit; without *old_rows*, the rows each group loses are left out (their
    count and hash stand for them)."""
    where = None if units is None else (ds.field("unit") >= units[0]) & (ds.field("unit") <= units[1])
    changes = ds.dataset(os.path.join(directory, "changes"), format="parquet").to_table(filter=where)
    row_filter = where if old_rows else (
        ds.field("op") == "insert" if where is None else where & (ds.field("op") == "insert"))
    rows = ds.dataset(os.path.join(directory, "change_rows"), format="parquet").to_table(
        columns=["state_group", "op", "type", "state_key", "event_id"], filter=row_filter)
    by_group: dict[int, Change] = {}
    found: dict[int, list[Change]] = defaultdict(list)
    columns = {name: changes.column(name).to_pylist() for name in changes.column_names}
    for i, group in enumerate(columns["state_group"]):
        change = Change(group, columns["action"][i], columns["room_id"][i], columns["old_prev"][i],
                        columns["new_prev"][i], columns["children"][i], columns["state_digest"][i],
                        columns["group_event_id"][i],
                        old_held=(columns["old_rows"][i], columns["old_rows_hash"][i]),
                        new_held=(columns["new_rows"][i], columns["new_rows_hash"][i]))
        by_group[group] = change
        found[columns["unit"][i]].append(change)
    del columns, changes
    for group, op, t, s, e in zip(*(rows.column(c).to_pylist()
                                     for c in ("state_group", "op", "type", "state_key", "event_id"))):
        owner = by_group.get(group)
        if owner is None:
            raise ConfigError(f"{directory}: change_rows has rows of group {group}, which changes lacks")
        (owner.old_rows if op == "delete" else owner.new_rows)[(t, s, e)] += 1
    return dict(found)


def read_change_set(directory: str) -> dict[int, list[Change]]:
    """The whole change set under *directory*, by unit."""
    _check_change_set(directory)
    return _read_changes(directory)


def _unit_windows(directory: str, window_groups: int) -> list[tuple[int, int]]:
    """Unit ranges ``(lo, hi)`` of about *window_groups* changed groups each
    (whole units), in unit order."""
    units = ds.dataset(os.path.join(directory, "changes"), format="parquet").to_table(columns=["unit"])
    if units.num_rows == 0:
        return []
    ids, counts = np.unique(units.column("unit").to_numpy(), return_counts=True)
    windows: list[tuple[int, int]] = []
    lo, size = 0, 0
    for i, count in enumerate(counts.tolist()):
        size += count
        if size >= window_groups:
            windows.append((int(ids[lo]), int(ids[i])))
            lo, size = i + 1, 0
    if lo < len(ids):
        windows.append((int(ids[lo]), int(ids[-1])))
    return windows


class _Store:
    """The few statements apply needs, for PostgreSQL or SQLite."""

    def __init__(self, url: str) -> None:
        parsed = parse_database_url(url)
        self.postgres = parsed.engine == POSTGRES
        if self.postgres:
            import psycopg2

            self.conn: Any = psycopg2.connect(parsed.target)
            # Short index-driven statements: compiling them costs more than it saves.
            self.conn.cursor().execute("SET jit = off")
            self.conn.commit()
        else:
            self.conn = sqlite3.connect(parsed.target, isolation_level=None)

    def close(self) -> None:
        self.conn.close()

    def query(self, sql: str, groups: Sequence[int]) -> list[tuple[Any, ...]]:
        """Run *sql* whose ``{groups}`` stands for the list of *groups*."""
        cur = self.conn.cursor()
        if self.postgres:
            cur.execute(sql.format(groups="ANY(%s)"), (list(groups),))
        else:
            marks = ",".join("?" * len(groups)) or "NULL"
            cur.execute(sql.replace("= {groups}", f"IN ({marks})"), list(groups))
        return list(cur.fetchall())

    def delete(self, sql: str, groups: Sequence[int]) -> None:
        """Run a statement without results whose ``{groups}`` stands for *groups*."""
        cur = self.conn.cursor()
        if self.postgres:
            cur.execute(sql.format(groups="ANY(%s)"), (list(groups),))
        else:
            marks = ",".join("?" * len(groups))
            cur.execute(sql.replace("= {groups}", f"IN ({marks})"), list(groups))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        cur = self.conn.cursor()
        cur.execute(sql if self.postgres else sql.replace("%s", "?"), params)

    def insert(self, table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        cur = self.conn.cursor()
        if self.postgres:
            from psycopg2.extras import execute_values

            execute_values(cur, f"INSERT INTO {table} ({columns}) VALUES %s", rows, page_size=1000)
        else:
            marks = ",".join("?" * len(rows[0]))
            cur.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows)

    def begin(self) -> None:
        if self.postgres:
            self.execute("LOCK TABLE state_group_edges, event_to_state_groups IN SHARE ROW EXCLUSIVE MODE")
        else:
            self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.commit() if self.postgres else self.conn.execute("COMMIT")

    def rollback(self) -> None:
        self.conn.rollback() if self.postgres else self.conn.execute("ROLLBACK")

    def count_rows(self) -> int:
        cur = self.conn.cursor()
        cur.execute("SELECT count(*) FROM state_groups_state")
        value = int(cur.fetchone()[0])
        if self.postgres:
            self.conn.commit()
        return value


#: The groups on the chains of many groups, each once, with its prev group
#: (PostgreSQL). Walking distinct groups (UNION) rather than one chain per
#: group reads a room's shared ancestors once, and the prev of each comes from
#: a subquery so every step is an index lookup rather than a join the planner
#: may turn into a scan of the whole edges table per hop.
_POSTGRES_ANCESTORS = """
WITH RECURSIVE up(state_group, prev) AS (
    SELECT g, (SELECT min(e.prev_state_group) FROM state_group_edges e WHERE e.state_group = g)
    FROM unnest(%s::bigint[]) AS g
    UNION
    SELECT up.prev, (SELECT min(e.prev_state_group) FROM state_group_edges e WHERE e.state_group = up.prev)
    FROM up WHERE up.prev IS NOT NULL
)
SELECT state_group, prev FROM up
"""


def _walked_digests(store: _Store, groups: Sequence[int]) -> dict[int, str]:
    """The digest of each group's full state, walking the chains as the
    database holds them now: the groups on them and their delta rows are read
    once (interned as they come), then the tree walker core computes the
    digests holding one path's state at a time."""
    walk = _impl.load("treewalk")
    if not store.postgres:
        from streamrep.spark.verify import walk_state_sql

        return {g: walk.digest_state(walk_state_sql(store.conn, "sqlite", g)) for g in groups}
    cur = store.conn.cursor()
    cur.execute(_POSTGRES_ANCESTORS, (list(groups),))
    prev: dict[int, int | None] = dict(cur.fetchall())
    members = sorted(prev)
    index = {g: i for i, g in enumerate(members)}
    strings: list[dict[str, int]] = [{}, {}, {}]  # type, state_key, event_id -> ID
    rows: list[tuple[int, int, int, int]] = []
    for g, t, sk, e in store.query("SELECT state_group, type, state_key, event_id FROM "
                                   "state_groups_state WHERE state_group = {groups}", members):
        rows.append((index[g], strings[0].setdefault(t, len(strings[0])),
                     strings[1].setdefault(sk, len(strings[1])), strings[2].setdefault(e, len(strings[2]))))
    rows.sort()
    stride = max(1, len(strings[1]))
    offsets = np.searchsorted(np.fromiter((r[0] for r in rows), np.int64, len(rows)),
                              np.arange(len(members) + 1), side="left").astype(np.int64)
    keys = np.fromiter((r[1] * stride + r[2] for r in rows), np.int64, len(rows))
    events = np.fromiter((r[3] for r in rows), np.int64, len(rows))
    del rows
    parents = np.array([index[p] if p is not None and p in index else -1 for p in
                        (prev[g] for g in members)], dtype=np.int64)
    wanted = np.zeros(len(members), dtype=np.uint8)
    wanted[[index[g] for g in groups]] = 1
    tables = []
    for found in strings:
        import pyarrow as pa

        text = pa.array(list(found), pa.large_string())
        tables.append((text.buffers()[1] or pa.py_buffer(bytes(8)), text.buffers()[2] or b""))
    _, hexes = walk.digest_groups(parents, offsets, keys, events, wanted, stride, *tables)
    chosen = np.flatnonzero(wanted)
    return {members[i]: hexes[64 * n:64 * n + 64].decode("ascii") for n, i in enumerate(chosen.tolist())}


def _chunks(items: list[Change], size: int) -> Iterable[list[Change]]:
    for lo in range(0, len(items), size):
        yield items[lo:lo + size]


def _leaves_first(deletes: list[Change]) -> list[Change]:
    """Deletions ordered so a group comes before the group it has as prev."""
    by_group = {c.group: c for c in deletes}
    depth: dict[int, int] = {}
    for c in deletes:
        chain, g = [], c.group
        while g in by_group and g not in depth:
            chain.append(g)
            prev = by_group[g].old_prev
            if prev is None:
                break
            g = prev
        base = depth.get(g, -1) if g not in chain else -1
        for h in reversed(chain):
            base += 1
            depth[h] = base
    return sorted(deletes, key=lambda c: -depth[c.group])


def _undone(change: Change) -> Change:
    """The change that puts *change*'s group back as it was read."""
    if change.action == "delete":
        return Change(change.group, "restore", change.room_id, None, change.old_prev, 0, None,
                      change.group_event_id, Counter(), change.old_rows, (0, 0), change.old_held)
    return Change(change.group, "rewrite", change.room_id, change.new_prev, change.old_prev,
                  change.children, change.digest, change.group_event_id, change.new_rows, change.old_rows,
                  change.new_held, change.old_held)


def _phases(changes: list[Change]) -> list[list[Change]]:
    """One unit's changes as the steps to apply in order: restores (prev
    first), rewrites, deletions (leaves first)."""
    rewrites = [c for c in changes if c.action == "rewrite"]
    deletes = _leaves_first([c for c in changes if c.action == "delete"])
    # Restored groups come back prev first, before the groups that had them as
    # prev are rewritten back.
    by_group = {c.group: c for c in changes}
    restores = [by_group[c.group] for c in _leaves_first(
        [Change(c.group, c.action, c.room_id, c.new_prev, None, 0, None)
         for c in changes if c.action == "restore"])[::-1]]
    return [restores, rewrites, deletes]


#: A transaction: its steps in order, and the units whose changes it holds.
Transaction = tuple[list[list[Change]], list[list[list[Change]]]]


def _transactions(units: dict[int, list[Change]], batch_groups: int) -> Iterable[Transaction]:
    """Pack whole units into transactions of at most *batch_groups* groups; a
    larger unit is cut into transactions of its own, one step at a time."""
    pending: list[list[list[Change]]] = []
    size = 0

    def packed() -> Transaction:
        steps = [[c for phases in pending for c in phases[i]] for i in range(3)]
        return [step for step in steps if step], list(pending)

    for unit in sorted(units):
        changes = units[unit]
        phases = _phases(changes)
        if pending and size + len(changes) > batch_groups:
            yield packed()
            pending, size = [], 0
        if len(changes) <= batch_groups:
            pending.append(phases)
            size += len(changes)
            continue
        for phase in phases:
            for chunk in _chunks(phase, batch_groups):
                yield [chunk], [[chunk]]
    if pending:
        yield packed()


def apply_compression(
    db_url: str, changes_dir: str, batch_groups: int = DEFAULT_BATCH_GROUPS, verify: bool = True,
    after_transaction: Callable[[int], None] | None = None, undo: bool = False,
    progress: Callable[[ApplyReport], None] | None = None,
) -> ApplyReport:
    """Apply the change set in *changes_dir* to the database at *db_url*.

    Returns what was done; raises StateVerificationError (after rolling back
    the transaction) when a rewritten group's walked state differs from the
    state the job verified. *after_transaction* is called with the number of
    committed transactions after each commit (progress reporting). With
    *undo*, the change set is applied backwards: rewritten groups get their
    old prev and rows back and deleted groups are restored, with the same
    checks, transactions and verification. *progress* is called with the
    report so far after each commit.
    """
    _check_change_set(changes_dir)
    windows = _unit_windows(changes_dir, max(WINDOW_GROUPS, batch_groups))
    clock = time.perf_counter()
    store = _Store(db_url)
    report = ApplyReport()

    def run(steps: list[list[Change]], listed: set[int], unlisted: dict[int, int] | None) -> None:
        _apply_transaction(store, steps, listed, unlisted, report, verify)
        report.transactions += 1
        if after_transaction is not None:
            after_transaction(report.transactions)
        if progress is not None:
            progress(report)

    try:
        report.rows_before = store.count_rows()
        for window in windows:
            units = _read_changes(changes_dir, window, old_rows=undo)
            if undo:
                units = {unit: [_undone(c) for c in changes] for unit, changes in units.items()}
            # Expected children: a group keeps its unchanged children; the
            # change set says which changed groups point at it before and after.
            # Units are disjoint (a split tree's shared root is never changed),
            # so the window's sets serve every unit in it.
            listed = {c.group for changes in units.values() for c in changes}
            unlisted: dict[int, int] | None = None
            if not undo:
                old_listed_children: Counter[int] = Counter(
                    c.old_prev for changes in units.values() for c in changes if c.old_prev is not None)
                unlisted = {c.group: c.children - old_listed_children[c.group]
                            for changes in units.values() for c in changes}
            for steps, members in _transactions(units, batch_groups):
                try:
                    run(steps, listed, unlisted)
                except StateVerificationError:
                    if len(members) == 1:
                        raise
                    # Commit the units that verify, one transaction each, and
                    # stop at the first that does not.
                    for phases in members:
                        run([step for step in phases if step], listed, unlisted)
            del units
        report.rows_after = store.count_rows()
    finally:
        store.close()
    report.seconds = time.perf_counter() - clock
    return report


def _apply_transaction(store: _Store, steps: list[list[Change]], listed: set[int],
                       unlisted_children: dict[int, int] | None, report: ApplyReport,
                       verify: bool) -> None:
    """Apply *steps* in one transaction, verify every rewritten group, commit."""
    done = ApplyReport()
    store.begin()
    try:
        rewritten: list[Change] = []
        for batch in steps:
            rewritten += _apply_step(store, batch, listed, unlisted_children, done)
        if verify and rewritten:
            digests = _walked_digests(store, [c.group for c in rewritten])
            bad = [c.group for c in rewritten if digests[c.group] != c.digest]
            if bad:
                raise StateVerificationError(
                    f"after rewriting, {len(bad)} state groups walk to a different full state than "
                    f"the compress job verified: {', '.join(str(g) for g in bad[:20])}; the "
                    "transaction was rolled back", tuple(bad))
            done.verified += len(rewritten)
        store.commit()
    except BaseException:
        store.rollback()
        raise
    report.merge(done)


@dataclass
class _Held:
    """What the database holds now for the groups of one step."""

    prevs: dict[int, list[int]]
    rows: dict[int, tuple[int, int]]  # (row count, rows hash) of each group's delta
    children: dict[int, list[int]]
    exists: set[int]
    referenced: set[int]

    def matches(self, group: int, prev: int | None, rows: tuple[int, int]) -> bool:
        """Whether *group* has exactly *prev* and a delta of that count and hash."""
        return (self.prevs.get(group, []) == ([] if prev is None else [prev])
                and self.rows.get(group, (0, 0)) == (rows[0], rows[1]))


#: Each group's delta row count and rows hash (``treewalk.rows_hash``), in SQL.
_POSTGRES_ROWS_HASH = """
SELECT state_group, count(*), sum(('x' || encode(substring(sha256(
    int4send(octet_length(type)) || convert_to(type, 'UTF8')
    || int4send(octet_length(state_key)) || convert_to(state_key, 'UTF8')
    || int4send(octet_length(event_id)) || convert_to(event_id, 'UTF8')) from 1 for 8), 'hex'))::bit(64)::bigint)
FROM state_groups_state WHERE state_group = {groups} GROUP BY state_group
"""


def _signed64(value: int) -> int:
    value %= 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value


def _rows_hashes(store: _Store, groups: list[int]) -> dict[int, tuple[int, int]]:
    """(count, rows hash) of the delta rows of *groups*, without holding the rows."""
    if store.postgres:
        return {g: (int(count), _signed64(int(total)))
                for g, count, total in store.query(_POSTGRES_ROWS_HASH, groups)}
    rows_hash = _impl.load("treewalk").rows_hash
    by_group: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
    for g, t, s, e in store.query("SELECT state_group, type, state_key, event_id FROM "
                                  "state_groups_state WHERE state_group = {groups}", groups):
        by_group[g].append((t, s, e))
    return {g: (len(rows), rows_hash(rows)) for g, rows in by_group.items()}


def _read_held(store: _Store, batch: list[Change]) -> _Held:
    groups = [c.group for c in batch]
    prevs: dict[int, list[int]] = defaultdict(list)
    for g, p in store.query("SELECT state_group, prev_state_group FROM state_group_edges "
                            "WHERE state_group = {groups}", groups):
        prevs[g].append(p)
    rows = _rows_hashes(store, groups)
    children: dict[int, list[int]] = defaultdict(list)
    for c, p in store.query("SELECT state_group, prev_state_group FROM state_group_edges "
                            "WHERE prev_state_group = {groups}", groups):
        children[p].append(c)
    targets = sorted(set(groups) | {c.new_prev for c in batch if c.new_prev is not None})
    exists = {g for (g,) in store.query("SELECT id FROM state_groups WHERE id = {groups}", targets)}
    referenced: set[int] = set()
    if any(c.action == "delete" for c in batch):
        referenced = {g for (g,) in store.query(
            "SELECT DISTINCT state_group FROM event_to_state_groups WHERE state_group = {groups}", groups)}
    return _Held(prevs, rows, children, exists, referenced)


def _sort_step(batch: list[Change], held: _Held, listed: set[int],
               unlisted_children: dict[int, int] | None, report: ApplyReport
               ) -> tuple[list[Change], list[Change], list[Change]]:
    """The changes of *batch* to rewrite, delete and restore; the others are
    counted in *report* as done already or skipped, with why."""

    def gained_a_child(c: Change) -> bool:
        # Children not managed by the change set beyond those it had.
        if unlisted_children is None:
            return False
        unmanaged = [x for x in held.children.get(c.group, []) if x not in listed]
        return len(unmanaged) > unlisted_children.get(c.group, 0)

    to_rewrite: list[Change] = []
    to_delete: list[Change] = []
    to_restore: list[Change] = []
    coming_back: set[int] = set()
    for c in batch:
        if c.action == "restore":
            if c.group in held.exists:
                report.already_restored += 1
            elif c.new_prev is not None and c.new_prev not in held.exists | coming_back:
                report.skip("prev group no longer exists")
            else:
                to_restore.append(c)
                coming_back.add(c.group)
        elif c.action == "rewrite":
            if c.group not in held.exists:
                report.skip("group no longer exists")
            elif c.new_prev is not None and c.new_prev not in held.exists:
                report.skip("new prev group no longer exists")
            elif held.matches(c.group, c.old_prev, c.old_held):
                if gained_a_child(c):
                    report.skip("gained a child")
                else:
                    to_rewrite.append(c)
            elif held.matches(c.group, c.new_prev, c.new_held):
                report.already_rewritten += 1
            else:
                report.skip("changed since compress")
        elif c.group not in held.exists:
            report.already_deleted += 1
        elif not held.matches(c.group, c.old_prev, c.old_held):
            report.skip("changed since compress")
        elif c.group in held.referenced:
            report.skip("now referenced by an event")
        else:
            to_delete.append(c)
    return to_rewrite, _without_needed(to_delete, held.children, report), to_restore


def _without_needed(to_delete: list[Change], children: dict[int, list[int]],
                    report: ApplyReport) -> list[Change]:
    """*to_delete* less the groups a staying group needs: a group may go only if
    all its children go with it."""
    deleting = {c.group for c in to_delete}
    while True:
        blocked = {c.group for c in to_delete
                   if any(x not in deleting for x in children.get(c.group, []))}
        if not blocked:
            return to_delete
        report.skip("needed by a group that stays", len(blocked))
        to_delete = [c for c in to_delete if c.group not in blocked]
        deleting -= blocked


def _apply_step(store: _Store, batch: list[Change], listed: set[int], unlisted_children: dict[int, int] | None,
                report: ApplyReport) -> list[Change]:
    """Check and write one step of a transaction; returns the groups it rewrote."""
    held = _read_held(store, batch)
    to_rewrite, to_delete, to_restore = _sort_step(batch, held, listed, unlisted_children, report)
    touched = [c.group for c in to_rewrite] + [c.group for c in to_delete]
    if touched:
        store.delete("DELETE FROM state_groups_state WHERE state_group = {groups}", touched)
        store.delete("DELETE FROM state_group_edges WHERE state_group = {groups}", touched)
    if to_delete:
        store.delete("DELETE FROM state_groups WHERE id = {groups}", [c.group for c in to_delete])
    store.insert("state_groups", "id, room_id, event_id",
                 [(c.group, c.room_id, c.group_event_id) for c in to_restore])
    store.insert("state_group_edges", "state_group, prev_state_group",
                 [(c.group, c.new_prev) for c in to_rewrite + to_restore if c.new_prev is not None])
    store.insert("state_groups_state", "state_group, room_id, type, state_key, event_id",
                 [(c.group, c.room_id, t, s, e) for c in to_rewrite + to_restore
                  for (t, s, e), n in c.new_rows.items() for _ in range(n)])
    report.rewritten += len(to_rewrite)
    report.deleted += len(to_delete)
    report.restored += len(to_restore)
    return to_rewrite
