"""Synapse-shaped state tables of big rooms, generated (shared by the big-room
bench and the memory test).

A big room starts from a snapshot of ``members`` joined members (plus its
create, power levels, join rules, name and history visibility). Every later
state event (a join, a leave, a rejoin, a profile change, a power-level change)
makes one state group with a one-row delta over the room's latest group, as
Synapse persists them; about ``fork_rate`` of them hang off a group a few steps
back instead. As in Synapse, a group whose prev chain already holds
``snapshot_interval`` deltas is stored as a snapshot of the room's whole state
instead. ``small_rooms`` adds rooms of 20 to 60 members and 40 groups.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from streamrep.spark.tables import SCHEMAS

__all__ = ["Shape", "generate", "write_parquet"]


@dataclass(frozen=True)
class Shape:
    """What to generate."""

    members: int = 100_000
    groups: int = 10_000
    big_rooms: int = 1
    small_rooms: int = 0
    fork_rate: float = 0.02
    snapshot_interval: int = 100
    seed: int = 1


def _event_id(n: int) -> str:
    # Room versions 4+ use 43 characters of URL-safe base64 of a hash.
    return "$" + base64.urlsafe_b64encode(hashlib.sha256(n.to_bytes(8, "big")).digest()).decode()[:43]


class _Room:
    """One room's state and recent groups while generating."""

    def __init__(self, room_id: str, members: int, events: Iterator[int]) -> None:
        self.room_id = room_id
        self.state: dict[tuple[str, str], str] = {}
        for key in (("m.room.create", ""), ("m.room.power_levels", ""), ("m.room.join_rules", ""),
                    ("m.room.name", ""), ("m.room.history_visibility", "")):
            self.state[key] = _event_id(next(events))
        for m in range(members):
            self.state[("m.room.member", f"@user{m}:example.org")] = _event_id(next(events))
        self.joined = members
        self.left: list[int] = []
        self.recent: list[tuple[int, int]] = []  # (group, deltas since its snapshot)


def generate(shape: Shape) -> Iterator[tuple[str, list[tuple[object, ...]]]]:
    """``(table, rows)`` pieces of the four tables, rooms interleaved as they
    would be in a live deployment's group IDs."""
    rng = random.Random(shape.seed)
    counter = iter(range(1, 1 << 62))
    rooms = [(_Room(f"!big{r}:example.org", shape.members, counter), shape.groups)
             for r in range(shape.big_rooms)]
    rooms += [(_Room(f"!small{r}:example.org", rng.randint(20, 60), counter), 40)
              for r in range(shape.small_rooms)]
    remaining = [groups for _, groups in rooms]
    live = [i for i in range(len(rooms))]
    next_group = 1
    while live:
        pick = rng.choice(live)
        room = rooms[pick][0]
        remaining[pick] -= 1
        if remaining[pick] == 0:
            live.remove(pick)
        gid = next_group
        next_group += 1
        event = _event_id(next(counter))
        yield "state_groups", [(gid, room.room_id, event)]
        yield "event_to_state_groups", [(event, gid)]
        if not room.recent:
            yield "state_groups_state", [(gid, room.room_id, t, s, e) for (t, s), e in room.state.items()]
            room.recent = [(gid, 0)]
            continue
        parent, hops = room.recent[-1]
        if len(room.recent) > 2 and rng.random() < shape.fork_rate:
            parent, hops = room.recent[-rng.randint(2, min(5, len(room.recent)))]
        key = _next_change(room, rng)
        room.state[key] = event
        if hops >= shape.snapshot_interval:
            yield "state_groups_state", [(gid, room.room_id, t, s, e) for (t, s), e in room.state.items()]
            room.recent.append((gid, 0))
        else:
            yield "state_group_edges", [(gid, parent)]
            yield "state_groups_state", [(gid, room.room_id, key[0], key[1], event)]
            room.recent.append((gid, hops + 1))
        del room.recent[:-8]


def _next_change(room: _Room, rng: random.Random) -> tuple[str, str]:
    """The key of the room's next state event: mostly memberships."""
    roll = rng.random()
    if roll < 0.02:
        return ("m.room.power_levels", "")
    if roll < 0.35:  # a new member joins
        room.joined += 1
        return ("m.room.member", f"@user{room.joined - 1}:example.org")
    if roll < 0.55 and room.left:  # a rejoin
        return ("m.room.member", f"@user{room.left.pop(rng.randrange(len(room.left)))}:example.org")
    member = rng.randrange(room.joined)
    if roll < 0.8:  # a leave: the member's key now holds the leave event
        room.left.append(member)
    return ("m.room.member", f"@user{member}:example.org")  # or a profile change


def write_parquet(shape: Shape, directory: str, batch_rows: int = 500_000) -> dict[str, int]:
    """The tables as one Parquet file each under *directory*; row counts."""
    os.makedirs(directory, exist_ok=True)
    writers = {name: pq.ParquetWriter(os.path.join(directory, f"{name}.parquet"), schema,
                                      compression="zstd") for name, schema in SCHEMAS.items()}
    pending: dict[str, list[tuple[object, ...]]] = {name: [] for name in SCHEMAS}
    counts = {name: 0 for name in SCHEMAS}

    def flush(name: str) -> None:
        rows = pending[name]
        if rows:
            columns = list(zip(*rows))
            writers[name].write_table(pa.table(
                [pa.array(c, f.type) for c, f in zip(columns, SCHEMAS[name])], schema=SCHEMAS[name]))
            counts[name] += len(rows)
            pending[name] = []

    for name, rows in generate(shape):
        pending[name].extend(rows)
        if len(pending[name]) >= batch_rows:
            flush(name)
    for name in SCHEMAS:
        flush(name)
        writers[name].close()
    return counts
