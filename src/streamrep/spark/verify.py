"""``--verify N``: recompute N random groups the slow, obvious way and compare.

For a database the state of each sampled group comes from one recursive SQL
query walking its prev chain; for file input, from a plain Python walk over the
edges and the sampled chains' delta rows. Any difference raises
:class:`~streamrep.errors.StateVerificationError`.
"""

from __future__ import annotations

import os
import random
import sqlite3
from typing import Iterable, Sequence

import numpy as np
import pyarrow.dataset as ds

from streamrep import _impl
from streamrep.db.url import POSTGRES, parse_database_url
from streamrep.errors import StateCorruptionError, StateVerificationError
from streamrep.spark.options import ReconstructOptions, Source
from streamrep.spark.tables import read_table

__all__ = [
    "State",
    "sample_groups",
    "walk_states_files",
    "walk_state_sql",
    "walk_states_db",
    "read_output_states",
    "verify_output",
]

State = dict[tuple[str, str], str]

#: The state of one group by walking its chain in SQL; later (closer) deltas win.
POSTGRES_WALK = """
WITH RECURSIVE chain(state_group, hops) AS (
    SELECT %(group)s::bigint, 0
    UNION ALL
    SELECT e.prev_state_group, c.hops + 1
    FROM state_group_edges e JOIN chain c ON e.state_group = c.state_group
    WHERE c.hops < %(limit)s
)
SELECT DISTINCT ON (s.type, s.state_key) s.type, s.state_key, s.event_id
FROM state_groups_state s JOIN chain c ON s.state_group = c.state_group
ORDER BY s.type, s.state_key, c.hops
"""

SQLITE_WALK = """
WITH RECURSIVE chain(state_group, hops) AS (
    SELECT ?, 0
    UNION ALL
    SELECT e.prev_state_group, c.hops + 1
    FROM state_group_edges e JOIN chain c ON e.state_group = c.state_group
    WHERE c.hops < ?
)
SELECT s.type, s.state_key, s.event_id, c.hops
FROM state_groups_state s JOIN chain c ON s.state_group = c.state_group
ORDER BY c.hops DESC
"""

#: Longest chain the SQL walk follows (a cycle would otherwise never end).
MAX_HOPS = 100_000


def sample_groups(wanted: Sequence[int] | np.ndarray, count: int, seed: int) -> list[int]:
    """Up to *count* distinct groups of *wanted*, chosen reproducibly from *seed*."""
    population = sorted({int(g) for g in wanted})
    return sorted(random.Random(seed).sample(population, min(count, len(population))))


def walk_states_files(input_dir: str, groups: Iterable[int]) -> dict[int, State]:
    """Full states of *groups* by walking prev chains in plain Python."""
    edges = read_table(input_dir, "state_group_edges")
    prev = dict(zip(edges.column("state_group").to_pylist(), edges.column("prev_state_group").to_pylist()))
    chains: dict[int, list[int]] = {}
    for group in groups:
        chain = [group]
        while prev.get(chain[-1]) is not None:
            chain.append(prev[chain[-1]])
            if len(chain) > MAX_HOPS:
                raise StateCorruptionError(f"state group {group} has a prev chain longer than {MAX_HOPS}")
        chains[group] = chain
    needed = sorted({g for chain in chains.values() for g in chain})
    rows = read_table(
        input_dir, "state_groups_state", ["state_group", "type", "state_key", "event_id"],
        filter=ds.field("state_group").isin(needed),
    )
    deltas: dict[int, State] = {}
    for g, t, s, e in zip(*(rows.column(c).to_pylist() for c in rows.column_names)):
        deltas.setdefault(g, {})[(t, s)] = e
    states = {}
    for group, chain in chains.items():
        full: State = {}
        for g in reversed(chain):
            full.update(deltas.get(g, {}))
        states[group] = full
    return states


def walk_state_sql(conn: object, engine: str, group: int) -> State:
    """The full state of *group* from one recursive query on an open connection."""
    if engine == POSTGRES:
        with conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(POSTGRES_WALK, {"group": group, "limit": MAX_HOPS})
            return {(t, s): e for t, s, e in cur.fetchall()}
    state: State = {}
    for t, s, e, _ in conn.execute(SQLITE_WALK, (group, MAX_HOPS)):  # type: ignore[attr-defined]
        state[(t, s)] = e
    return state


def walk_states_db(url: str, groups: Iterable[int]) -> dict[int, State]:
    """Full states of *groups*, one recursive SQL query per group."""
    parsed = parse_database_url(url)
    if parsed.engine == POSTGRES:
        import psycopg2

        conn = psycopg2.connect(parsed.target)
    else:
        conn = sqlite3.connect(parsed.target)
    try:
        return {g: walk_state_sql(conn, parsed.engine, g) for g in groups}
    finally:
        conn.close()


def read_output_states(output: str, groups: Sequence[int], digest: bool) -> dict[int, object]:
    """What the job wrote for *groups*: a state per group, or its digest."""
    dataset = ds.dataset(output, format="parquet", exclude_invalid_files=True)
    table = dataset.to_table(filter=ds.field("state_group").isin(list(groups)))
    found: dict[int, object] = {}
    if digest:
        for g, d in zip(table.column("state_group").to_pylist(), table.column("state_digest").to_pylist()):
            if g in found:
                raise StateVerificationError(f"state group {g} has more than one digest row", (g,))
            found[g] = d
        return found
    for g, t, s, e in zip(*(table.column(c).to_pylist() for c in ("state_group", "type", "state_key", "event_id"))):
        state = found.setdefault(g, {})
        assert isinstance(state, dict)
        if (t, s) in state:
            raise StateVerificationError(f"state group {g} has ({t!r}, {s!r}) twice in the output", (g,))
        state[(t, s)] = e
    return found


def verify_output(source: Source, options: ReconstructOptions, wanted: Sequence[int] | np.ndarray) -> int:
    """Compare ``options.verify`` random wanted groups against a chain walk.

    Returns how many groups were checked; raises StateVerificationError naming
    every group that differs.
    """
    if not os.path.isdir(options.output):
        raise StateVerificationError(f"no output at {options.output} to verify")
    groups = sample_groups(wanted, options.verify, options.seed)
    if source.input_dir is not None:
        expected = walk_states_files(source.input_dir, groups)
    else:
        assert source.db_url is not None
        expected = walk_states_db(source.db_url, groups)
    got = read_output_states(options.output, groups, options.digest)
    digest_of = _impl.load("treewalk").digest_state
    bad = []
    for g in groups:
        want: object = expected[g]
        if options.digest:
            want = digest_of(expected[g])
        elif not expected[g]:
            want = None  # an empty state has no rows
        if got.get(g) != want:
            bad.append(g)
    if bad:
        shown = ", ".join(str(g) for g in bad[:20])
        raise StateVerificationError(
            f"{len(bad)} of {len(groups)} verified state groups differ from a walk of their "
            f"chain: {shown}", tuple(bad)
        )
    return len(groups)
