"""Synthetic state-group forests for the state reconstruction tests and benchmarks.

Rooms grow a chain of state groups: each group is a delta over the room's
previous group (new members, overrides of existing keys), with a snapshot (a new
root holding the full state) after at most ``max_hops`` hops, occasional forks
off a recent group, and a few groups with a wide fan-out of children.
"""

from __future__ import annotations

import os
import random
import sqlite3
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from streamrep.spark.tables import SCHEMAS

State = dict[tuple[str, str], str]


@dataclass
class Forest:
    """The four tables as column lists, plus the brute-force truth helpers."""

    groups: list[tuple[int, str, str]] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    state: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    event_to_state_groups: list[tuple[str, int]] = field(default_factory=list)

    def tables(self) -> dict[str, pa.Table]:
        rows = {
            "state_groups": self.groups,
            "state_group_edges": self.edges,
            "state_groups_state": self.state,
            "event_to_state_groups": self.event_to_state_groups,
        }
        out = {}
        for name, data in rows.items():
            schema = SCHEMAS[name]
            columns = list(zip(*data)) if data else [[] for _ in schema]
            out[name] = pa.table([pa.array(c, f.type) for c, f in zip(columns, schema)], schema=schema)
        return out

    def brute_force(self, groups: list[int] | None = None) -> dict[int, State]:
        """Every (or the given) group's full state by walking its chain."""
        prev = dict(self.edges)
        deltas: dict[int, State] = {}
        for g, _room, t, s, e in self.state:
            deltas.setdefault(g, {})[(t, s)] = e
        out = {}
        for g in groups if groups is not None else [g for g, _, _ in self.groups]:
            chain = [g]
            while chain[-1] in prev:
                chain.append(prev[chain[-1]])
            full: State = {}
            for c in reversed(chain):
                full.update(deltas.get(c, {}))
            out[g] = full
        return out

    def write_parquet(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        for name, table in self.tables().items():
            os.makedirs(os.path.join(directory, name), exist_ok=True)
            pq.write_table(table, os.path.join(directory, name, "part-0.parquet"))

    def write_csv(self, directory: str) -> None:
        """PostgreSQL ``COPY ... WITH CSV HEADER`` form: NULL unquoted empty, "" quoted."""
        os.makedirs(directory, exist_ok=True)
        rows = {
            "state_groups": self.groups,
            "state_group_edges": self.edges,
            "state_groups_state": self.state,
            "event_to_state_groups": self.event_to_state_groups,
        }
        for name, data in rows.items():
            with open(os.path.join(directory, f"{name}.csv"), "w", newline="") as f:
                f.write(",".join(SCHEMAS[name].names) + "\n")
                for row in data:
                    f.write(",".join(_copy_csv_field(v) for v in row) + "\n")


def _copy_csv_field(value: object) -> str:
    if value is None:
        return ""
    text = str(value)
    if text == "" or any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def make_forest(
    n_groups: int,
    seed: int = 0,
    rooms: int = 20,
    max_hops: int = 100,
    fork_share: float = 0.05,
    fan_out: int = 200,
    snapshot_share: float = 0.01,
    first_id: int = 1,
    initial_members: int = 0,
    member_pool: int | None = None,
) -> Forest:
    """A forest of about *n_groups* state groups over *rooms* rooms."""
    rng = random.Random(seed)
    forest = Forest()
    room_state: list[State] = [{} for _ in range(rooms)]
    room_recent: list[list[tuple[int, int]]] = [[] for _ in range(rooms)]  # (group, hops)
    members = [0] * rooms
    next_id = first_id
    next_event = 0

    def event() -> str:
        nonlocal next_event
        next_event += 1
        return f"$ev{next_event}:example.org"

    fanned = 0
    while len(forest.groups) < n_groups:
        r = rng.randrange(rooms)
        room = f"!room{r}:example.org"
        gid = next_id
        next_id += rng.randint(1, 3)  # group IDs are not dense
        creator_event = event()
        forest.groups.append((gid, room, creator_event))
        forest.event_to_state_groups.append((creator_event, gid))
        recent = room_recent[r]
        if not recent or (recent[-1][1] >= max_hops) or rng.random() < snapshot_share:
            # Snapshot: a root holding the room's full state.
            if not room_state[r]:
                room_state[r] = {("m.room.create", ""): event(), ("m.room.name", ""): event()}
                for m in range(initial_members):
                    room_state[r][("m.room.member", f"@u{m}:example.org")] = event()
                members[r] = initial_members
            for (t, s), e in room_state[r].items():
                forest.state.append((gid, room, t, s, e))
            room_recent[r] = [(gid, 0)]
            continue
        if fanned < fan_out and rng.random() < 0.002:
            # Wide fan-out: many siblings hanging off one group.
            parent, hops = recent[-1]
            for _ in range(min(fan_out - fanned, n_groups - len(forest.groups))):
                child = next_id
                next_id += 1
                forest.groups.append((child, room, event()))
                forest.edges.append((child, parent))
                forest.state.append((child, room, "m.room.member", f"@fan{child}:example.org", event()))
                fanned += 1
            forest.edges.append((gid, parent))
            forest.state.append((gid, room, "m.room.topic", "", event()))
            recent.append((gid, hops + 1))
            continue
        if rng.random() < fork_share and len(recent) > 2:
            parent, hops = recent[-rng.randint(2, min(5, len(recent)))]
        else:
            parent, hops = recent[-1]
        forest.edges.append((gid, parent))
        delta: State = {}
        for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
            if members[r] and rng.random() < 0.4:
                key = ("m.room.member", f"@u{rng.randrange(members[r])}:example.org")
            elif rng.random() < 0.1:
                key = (rng.choice(("m.room.name", "m.room.topic", "m.room.power_levels")), "")
            elif member_pool is not None and members[r] >= member_pool:
                key = ("m.room.member", f"@u{rng.randrange(member_pool)}:example.org")
            else:
                key = ("m.room.member", f"@u{members[r]}:example.org")
                members[r] += 1
            delta[key] = event()
        for (t, s), e in delta.items():
            forest.state.append((gid, room, t, s, e))
        room_state[r].update(delta)
        recent.append((gid, hops + 1))
        del recent[:-8]
    return forest


STATE_DDL = [
    "CREATE TABLE state_groups (id BIGINT PRIMARY KEY, room_id TEXT NOT NULL, event_id TEXT NOT NULL)",
    "CREATE TABLE state_group_edges (state_group BIGINT NOT NULL, prev_state_group BIGINT NOT NULL)",
    "CREATE TABLE state_groups_state (state_group BIGINT NOT NULL, room_id TEXT NOT NULL, "
    "type TEXT NOT NULL, state_key TEXT NOT NULL, event_id TEXT NOT NULL)",
    "CREATE TABLE event_to_state_groups (event_id TEXT NOT NULL PRIMARY KEY, state_group BIGINT NOT NULL)",
]


def corrupt_forest(forest: Forest, kind: str, *, at: int, missing_group: int) -> Forest:
    """A copy of *forest* broken one way: ``cycle`` (groups ``at`` and ``at + 1`` of the
    edges point at each other), ``missing`` (edge ``at`` points at *missing_group*) or
    ``dupkey`` (delta row ``at`` appears twice)."""
    groups, edges, state = list(forest.groups), list(forest.edges), list(forest.state)
    if kind == "cycle":
        a, b = edges[at][0], edges[at + 1][0]
        edges = [e for e in edges if e[0] not in (a, b)] + [(a, b), (b, a)]
    elif kind == "missing":
        edges[at] = (edges[at][0], missing_group)
    elif kind == "dupkey":
        state.append(state[at])
    else:
        raise ValueError(kind)
    return Forest(groups, edges, state, forest.event_to_state_groups)


def load_database(url: str, forest: Forest) -> None:
    """Create the four state tables at *url* and fill them with *forest*."""
    rows = {
        "state_groups": forest.groups, "state_group_edges": forest.edges,
        "state_groups_state": forest.state, "event_to_state_groups": forest.event_to_state_groups,
    }
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        for ddl in STATE_DDL:
            conn.execute(ddl)
        for table, data in rows.items():
            marks = ",".join("?" * len(SCHEMAS[table]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", data)
        conn.commit()
        conn.close()
        return
    import io

    import psycopg2

    from streamrep.db.green import suspended_wait_callback

    # psycopg2 refuses COPY while a wait callback (set by any open Database) is installed.
    with suspended_wait_callback():
        conn = psycopg2.connect(url)
        with conn, conn.cursor() as cur:
            for ddl in STATE_DDL:
                cur.execute(ddl)
            for table, data in rows.items():
                buf = io.StringIO()
                for row in data:
                    buf.write("\t".join(str(v) for v in row) + "\n")
                buf.seek(0)
                cur.copy_expert(f"COPY {table} FROM STDIN", buf)
        conn.close()
